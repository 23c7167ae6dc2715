"""RDM sources: where the neural distances of a stack of models come from.

:func:`mlem_neuro.crossval.run_cv` never sees neural data, only an *RDM source*: an
object that knows how many models (time points, spheres, regions...) and stimuli it
holds, can hand out a picklable source of some of its models (one chunk of work, sent to a
joblib worker), and computes the neural RDMs of all its models for any subset of the
stimuli (the training or the held-out stimuli of a fold).  :class:`RDMSource` states this
contract; two sources implement it:

* :class:`DenseRDMSource`: data ``Y`` ``(n_models, n_stimuli, n_units)``, every model
  with its own units (time-resolved MEG/EEG, a few ROIs cut out beforehand); distances
  from batched Gram products (:mod:`mlem_neuro.core.rdms.neural`);
* :class:`SphereRDMSource`: one data matrix ``X`` ``(n_stimuli, n_units)`` and a sparse
  0/1 membership ``A`` ``(n_models, n_units)`` saying which units each model holds
  (searchlight spheres, atlas regions); distances of every model from sparse products,
  with no loop over models.

Both take the neural distance by name; each distance is one class of
:mod:`mlem_neuro.core.rdms.distances`, used by both sources.  Two more serve distances computed
elsewhere: :class:`CondensedRDMSource` (one condensed RDM per model) and
:class:`RankedRDMSource`, which serves the ranks of those distances within any subset of
the stimuli and says so with ``ranked = True`` (training then takes them as ranks; a
source without that attribute is ranked by training as usual).

Adding an adapter
-----------------
Data of a new layout need one new class, in one file, with the four members of
:class:`RDMSource`; nothing else in the package changes.  Many layouts need no class at
all: a cortical-surface searchlight is a :class:`SphereRDMSource` whose membership rows
are geodesic discs of vertices, a source-space searchlight one whose rows are
neighbourhoods of source points, a time-resolved searchlight a :class:`DenseRDMSource`.
A source of RDMs computed elsewhere (e.g. cross-validated distances), as a minimal
example:

>>> import numpy as np, torch
>>> from mlem_neuro.core.stimuli.pairs import pair_indices
>>> class PrecomputedRDMSource:
...     '''Square RDMs ``(n_models, n_stimuli, n_stimuli)`` computed elsewhere.'''
...     def __init__(self, rdms):
...         self.rdms = np.asarray(rdms, dtype=np.float64)
...     @property
...     def n_models(self):
...         return self.rdms.shape[0]
...     @property
...     def n_stimuli(self):
...         return self.rdms.shape[1]
...     def subset(self, models):
...         return PrecomputedRDMSource(self.rdms[models])
...     def rdm(self, stimuli, device="cpu"):
...         s = np.asarray(stimuli)
...         i, j = pair_indices(len(s))
...         return torch.as_tensor(self.rdms[:, s[i], s[j]], device=device)
>>> d = np.abs(np.subtract.outer(np.arange(6.0), np.arange(6.0)))
>>> source = PrecomputedRDMSource(np.stack([d, d ** 2]))
>>> isinstance(source, RDMSource)
True
>>> source.subset([1]).rdm([0, 2, 5])
tensor([[ 4., 25.,  9.]], dtype=torch.float64)

Such a source goes straight to :func:`~mlem_neuro.crossval.run_cv`.  Keep ``subset``
cheap and its result small (it is pickled once per chunk of models), and return the
distances in :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import scipy.sparse as sp
import torch

from ..constants import SPHERE_BLOCK_BYTES as BLOCK_BYTES  # noqa: F401  (tuning constants, defined there once)
from ..stimuli.pairs import pair_indices
from ..utils import renamed
from .distances import get_distance
from .neural import rdm_all_pairs

__all__ = ["BLOCK_BYTES", "CondensedRDMSource", "DenseRDMSource", "RDMSource",
           "SphereRDMSource"]


@runtime_checkable
class RDMSource(Protocol):
    """The neural RDMs of ``n_models`` models over the same ``n_stimuli`` stimuli.

    Attributes
    ----------
    n_models : int
        Number of models (time points, spheres, regions...).
    n_stimuli : int
        Number of stimuli (rows of the feature table).
    """

    @property
    def n_models(self) -> int: ...

    @property
    def n_stimuli(self) -> int: ...

    def subset(self, models) -> RDMSource:
        """The source of ``models`` only (a slice or integer indices), in that order.

        It must be picklable (it is sent to a joblib worker) and should hold only what
        those models need.
        """

    def rdm(self, stimuli, device="cpu") -> torch.Tensor:
        """Distances between ``stimuli`` (integer indices) for every model.

        Returns
        -------
        rdm : torch.Tensor, float64, ``(n_models, n_pairs)`` on ``device``
            Pairs of ``stimuli`` in :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order:
            column ``k`` is the pair ``(stimuli[i[k]], stimuli[j[k]])``.
        """


class _MetricAlias:
    """``.metric``: the former name of ``.distance`` (one release, a FutureWarning)."""

    @property
    def metric(self):
        from ..utils import warn_user

        warn_user(f"{type(self).__name__}.metric is renamed .distance ('metric' means W); "
                  ".metric will be removed in a future release.", FutureWarning)
        return self.distance


class DenseRDMSource(_MetricAlias):
    """Distances of ``M`` models with dense data ``Y`` ``(M, n_stimuli, n_units)``.

    Parameters
    ----------
    Y : ndarray, shape (n_models, n_stimuli, n_units)
        Each model's stimulus × unit data (e.g. one time point per model).
    distance : str
        Neural distance, a name of :data:`mlem_neuro.core.rdms.distances.REGISTRY`.
    metric : str | None
        Former name of ``distance`` (deprecated; a FutureWarning; both names: a TypeError).
    compiled : bool
        Whether its distances may be read off the Gram matrices by the compiled kernel
        (the runtime's :attr:`~mlem_neuro.core.runtime.Runtime.compiled`, which
        :meth:`with_runtime` sets; the same numbers either way).
    """

    #: it holds the response patterns, whose residuals the test of interactions permutes
    supports_interaction_test = True

    @renamed(metric="distance")
    def __init__(self, Y, distance="euclidean", *, metric=None, compiled=True):
        get_distance(distance)
        self.Y = Y
        self.distance = distance
        self.compiled = bool(compiled)

    @property
    def n_models(self):
        return self.Y.shape[0]

    @property
    def n_stimuli(self):
        return self.Y.shape[1]

    def subset(self, models):
        """The source of ``models`` only."""
        return DenseRDMSource(self.Y[models], self.distance, compiled=self.compiled)

    def with_runtime(self, runtime):
        """This source with the compiled kernels of ``runtime`` (a
        :class:`~mlem_neuro.core.runtime.Runtime`): what :func:`~mlem_neuro.crossval.run_cv`
        runs (a source may offer this method; the others are used as they are)."""
        return DenseRDMSource(self.Y, self.distance, compiled=runtime.compiled)

    def rdm(self, stimuli, device="cpu"):
        """Distances ``(n_models, n_pairs)`` between ``stimuli`` (see :class:`RDMSource`)."""
        Y = torch.as_tensor(np.ascontiguousarray(self.Y[:, stimuli]), device=device)
        return rdm_all_pairs(Y, self.distance, self.compiled)


class SphereRDMSource(_MetricAlias):
    """Neural RDMs of many spheres (or regions) at once, from a sparse membership product.

    For stimuli ``i, j`` and sphere ``s`` the squared Euclidean distance is

    ``D²[s, (i, j)] = Σ_v A[s, v] (x_iv − x_jv)² = (A @ ((X[i] − X[j])²)ᵀ)[s]``

    so one sparse × dense product gives every sphere's distances for a block of pairs, with
    no loop over spheres; pairs are processed in blocks of at most :data:`BLOCK_BYTES` of
    per-pair products, so memory is bounded by the output ``(S, n_pairs)``.  This form was
    chosen over the Gram form ``A @ (x_i ∘ x_j)`` (same number of operations) and a padded
    gather + batched ``bmm`` of per-sphere Gram matrices after measuring (5,000 spheres of
    30 voxels, 77 stimuli = 2,926 pairs, 2 CPU cores): difference form 0.74 s, Gram form
    0.98 s, padded ``bmm`` 1.01 s, torch CSR product 1.69 s; it is also free of the
    cancellation of ``‖x_i‖² + ‖x_j‖² − 2 x_i·x_j`` and gives bit-identical rows whichever
    subset of spheres is computed (so results do not depend on chunking).

    ``"correlation"`` and ``"cosine"`` (``1 − r`` of the sphere's patterns, as for dense
    data) use the Gram form, with per-sphere sums ``A @ x`` and ``A @ x²`` for centring
    and norms.  Each distance's sparse form lives with it
    (:meth:`mlem_neuro.core.rdms.distances.NeuralDistance.membership_sq`).

    Parameters
    ----------
    X : ndarray (n_stimuli, n_voxels)
    A : scipy.sparse matrix (n_models, n_voxels)
        0/1 membership.
    distance : {"euclidean", "correlation", "cosine"}
        Neural distance.
    metric : str | None
        Former name of ``distance`` (deprecated; a FutureWarning; both names: a TypeError).
    """

    #: it holds the response patterns, whose residuals the test of interactions permutes
    supports_interaction_test = True

    @renamed(metric="distance")
    def __init__(self, X, A, distance="euclidean", *, metric=None):
        get_distance(distance, where=" for searchlight and ROI analyses")
        self.X = np.asarray(X, dtype=np.float64)
        self.A = sp.csr_matrix(A, dtype=np.float64)
        self.A.sort_indices()
        if self.A.shape[1] != self.X.shape[1]:
            raise ValueError(f"membership has {self.A.shape[1]} voxel columns but the data "
                             f"have {self.X.shape[1]} voxels")
        self.distance = distance

    @property
    def n_models(self):
        return self.A.shape[0]

    @property
    def n_stimuli(self):
        return self.X.shape[0]

    @property
    def sizes(self):
        """Voxels per sphere ``(n_models,)``."""
        return np.diff(self.A.indptr)

    def subset(self, models):
        """The source of ``models`` only, keeping just the voxels they touch."""
        A = self.A[models]
        touched = np.unique(A.indices)
        A = sp.csr_matrix((A.data, np.searchsorted(touched, A.indices), A.indptr),
                          shape=(A.shape[0], len(touched)))
        return SphereRDMSource(self.X[:, touched], A, self.distance)

    def rdm(self, stimuli, device="cpu"):
        """Distances ``(n_models, n_pairs)`` (torch float64 on ``device``) between
        ``stimuli``, pairs in :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order."""
        dist = get_distance(self.distance)
        stimuli = np.asarray(stimuli)
        XT = np.ascontiguousarray(self.X[stimuli].T)          # (V, n)
        i, j = pair_indices(len(stimuli))
        sizes = self.sizes
        stats = dist.membership_stats(self.A, XT, sizes)
        out = np.empty((self.n_models, len(i)))
        step = max(1, int(BLOCK_BYTES // (8 * max(XT.shape[0], 1))))
        for s in range(0, len(i), step):
            out[:, s:s + step] = dist.membership_sq(self.A, XT, i[s:s + step],
                                                      j[s:s + step], sizes, stats)
        return torch.as_tensor(dist.finish(out), dtype=torch.float64, device=device)

    def check_patterns(self):
        """Raise when the metric is undefined for some model (e.g. a constant pattern for
        ``correlation`` / ``cosine``)."""
        dist = get_distance(self.distance)
        bad = dist.membership_undefined(self.A, np.ascontiguousarray(self.X.T),
                                          self.sizes)
        if bad is not None and bad.any():
            raise ValueError(
                f"distance={self.distance!r} is undefined for {int(bad.sum())} of "
                f"{self.n_models} spheres/regions: their pattern is constant across their "
                f"voxels in some image (e.g. one-voxel spheres; smallest size "
                f"{int(self.sizes.min())} voxel(s)). Increase radius, restrict the "
                "centres, or use distance='euclidean'.")


class CondensedRDMSource:
    """Distances of ``M`` models computed elsewhere, one condensed RDM per model.

    Parameters
    ----------
    d : ndarray, shape (n_models, n_pairs)
        Distances of every pair of the ``n`` stimuli, in
        :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order (``n_pairs = n (n − 1) / 2``;
        e.g. the cross-validated distances of :mod:`mlem_neuro.core.rdms.crossdist`, which
        can be negative).
    """

    def __init__(self, d):
        d = np.asarray(d, dtype=np.float64)
        if d.ndim != 2:
            raise ValueError(f"d must be (n_models, n_pairs); got shape {d.shape}.")
        n = int(round((1 + np.sqrt(1 + 8 * d.shape[1])) / 2))
        if n * (n - 1) // 2 != d.shape[1] or n < 2:
            raise ValueError(f"{d.shape[1]} is not a number of pairs n (n - 1) / 2.")
        if not np.isfinite(d).all():
            raise ValueError("the distances hold NaN or infinite values.")
        self.d, self._n = d, n

    @property
    def n_models(self):
        return self.d.shape[0]

    @property
    def n_stimuli(self):
        return self._n

    def subset(self, models):
        """The source of ``models`` only."""
        return CondensedRDMSource(self.d[models])

    def rdm(self, stimuli, device="cpu"):
        """Distances ``(n_models, n_pairs)`` between ``stimuli`` (see :class:`RDMSource`)."""
        return torch.as_tensor(self.d[:, _condensed_columns(stimuli, self._n)], device=device)


def with_runtime(source, runtime):
    """``source`` as an analysis on ``runtime`` (a :class:`~mlem_neuro.core.runtime.Runtime`)
    reads it: its ``with_runtime(runtime)`` when it has one (the compiled kernels of its
    distances on or off), else itself."""
    method = getattr(source, "with_runtime", None)
    return source if method is None else method(runtime)


def _condensed_columns(stimuli, n):
    """Columns of a condensed RDM of ``n`` stimuli holding the pairs of ``stimuli`` (in
    :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order)."""
    s = np.asarray(stimuli)
    i, j = pair_indices(len(s))
    a, b = s[i], s[j]
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return lo * n - lo * (lo + 1) // 2 + (hi - lo - 1)


class RankedRDMSource:
    """The ranks of distances computed elsewhere, within any subset of the stimuli.

    ``rdm(stimuli)`` gives each model's average ranks (1-based) of the distances between
    ``stimuli``: what :func:`~mlem_neuro.core.ranks.spearman.rankdata` of
    ``CondensedRDMSource(d).rdm(stimuli)`` gives, from one sort per model for all subsets
    (:class:`~mlem_neuro.core.ranks.spearman.SubsetRanks`; its subsets share that sort).  MLEM
    sees neural distances only through their ranks, so an analysis of this source equals
    one of ``CondensedRDMSource(d)``; ``ranked = True`` tells training that the targets are
    ranks already.  Used where many cross-validated fits read the same RDMs (the test of
    interactions).

    Parameters
    ----------
    d : ndarray, shape (n_models, n_pairs)
        As :class:`CondensedRDMSource`.
    compiled : bool
        Whether the ranks are read by the compiled kernel (the runtime's
        :attr:`~mlem_neuro.core.runtime.Runtime.compiled`).
    """

    ranked = True

    def __init__(self, d, _ranker=None, *, compiled=True):
        from ..ranks.spearman import SubsetRanks

        if _ranker is None:
            d = CondensedRDMSource(d).d
            _ranker = SubsetRanks(torch.as_tensor(d), compiled=compiled)
            _ranker._compiled()            # its subsets share the compiled loop's arrays
        self._ranker = _ranker
        P = _ranker.n_columns
        self._n = int(round((1 + np.sqrt(1 + 8 * P)) / 2))

    @property
    def n_models(self):
        return self._ranker.n_rows

    @property
    def n_stimuli(self):
        return self._n

    def subset(self, models):
        """The source of ``models`` only (their rows of the shared sort)."""
        return RankedRDMSource(None, self._ranker.rows(models))

    def rdm(self, stimuli, device="cpu"):
        """Average ranks ``(n_models, n_pairs)`` of the distances between ``stimuli``
        (distinct stimuli: a repeated one would repeat pairs, which the count cannot
        rank)."""
        if len(np.unique(stimuli)) != len(stimuli):
            raise ValueError("RankedRDMSource.rdm needs distinct stimuli; got repeats in "
                             f"{np.asarray(stimuli).tolist()}.")
        cols = torch.as_tensor(_condensed_columns(stimuli, self._n))
        return self._ranker.ranks_of_subsets(cols[None])[:, 0].to(device)
