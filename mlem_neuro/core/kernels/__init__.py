"""The compiled CPU kernels (numba): the bottom layer of the package.

Numbers in, numbers out: each kernel takes and fills numpy arrays and imports nothing of
the package but :mod:`mlem_neuro.core.constants`; the layers above (ranks, distances,
stimuli, scoring, training) call them.  By what they compute:

* :mod:`~mlem_neuro.core.kernels.training`: grouped training, each model of a stack to its
  own stop (the torch-facing side is :mod:`mlem_neuro.core.training.compiled`);
* :mod:`~mlem_neuro.core.kernels.sorted_keys`: exact Spearman scores of importance
  predictions (:func:`sorted_scores`, :func:`feature_scores`) and the fast null's rank
  sums (:func:`rank_walk`), from one sort of packed integer keys;
* :mod:`~mlem_neuro.core.kernels.ranks`: average ranks of many column subsets
  (:func:`subset_ranks`);
* :mod:`~mlem_neuro.core.kernels.distances`: pair distances off Gram matrices
  (:func:`condensed`);
* :mod:`~mlem_neuro.core.kernels.grid`: the grid's per-block target tables
  (:func:`block_tables`);
* :mod:`~mlem_neuro.core.kernels._numba`: numba itself: the import, whether it is
  installed (:func:`built`), the name of the switch ``MLEM_NEURO_NO_COMPILED`` and the
  disk cache.

Each wrapper here takes ``compiled=``, the switch of the analysis that calls it
(:attr:`mlem_neuro.core.runtime.Runtime.compiled`, which
:meth:`~mlem_neuro.core.runtime.Runtime.resolve` reads from ``MLEM_NEURO_NO_COMPILED``
once per analysis), and returns
``None`` (``False`` for :func:`subset_ranks`) when it is off or numba is not installed:
the caller then computes the same numbers in torch or numpy.  Call them through
this package (``kernels.sorted_scores(...)``): a test that watches one replaces it here.
"""
from ._numba import NO_COMPILED_VAR, built, env_flag, fallback_cache_dir, numba_version
from .distances import condensed
from .grid import block_tables
from .ranks import subset_ranks
from .sorted_keys import feature_scores, rank_walk, sorted_scores

__all__ = ["NO_COMPILED_VAR", "block_tables", "built", "condensed", "env_flag",
           "fallback_cache_dir", "feature_scores", "numba_version", "rank_walk",
           "sorted_scores", "subset_ranks"]
