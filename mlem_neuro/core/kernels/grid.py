"""Kernel of the grid of numeric distances: the per-block target tables of the ranks
(:func:`block_tables`), summed pair by pair in one pass.

Part of the bottom layer (:mod:`mlem_neuro.core.kernels`): numpy arrays in and out, no
import of the package but its constants.
"""
from __future__ import annotations

import numpy as np

from . import _numba
from ._numba import _f64, _jit


@_jit
def _block_tables_kernel(key, block, ranks, T, S1, S2):
    M, P = ranks.shape
    for m in range(M):
        for p in range(P):
            v = ranks[m, p]
            T[m, key[p]] += v
            S1[m, block[p]] += v
            S2[m, block[p]] += v * v


def block_tables(key, block, ranks, n_keys, K, *, compiled):
    """The grid's per-block target tables of ``ranks (M, P)`` (float64 numpy): ``T (M,
    n_keys)``, ``S1`` and ``S2 (M, K)``, the sums of the ranks per key (cell and block)
    and of the ranks and squared ranks per block, added pair by pair in order as
    :class:`~mlem_neuro.core.training.quantise._BlockTargets` does in torch; ``None`` when
    the kernels are off (``compiled``: the runtime's switch, :func:`~._numba.on`)."""
    if not _numba.on(compiled):
        return None
    M, P = ranks.shape
    key, block = (np.ascontiguousarray(a, dtype=np.int64) for a in (key, block))
    ranks = _f64(ranks)
    T, S1, S2 = np.zeros((M, n_keys)), np.zeros((M, K)), np.zeros((M, K))
    _block_tables_kernel(key, block, ranks, T, S1, S2)
    return T, S1, S2

