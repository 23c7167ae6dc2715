"""Neural distances for stacks of ``M`` models sharing the same stimuli.

Data come as ``Y`` of shape ``(M, n_stimuli, n_units)`` (``M`` time points, spheres, ... or
``M = 1``).  Every supported metric (:mod:`mlem_neuro.core.rdms.distances`) is a squared
Euclidean distance between preprocessed rows, so all of them come from Gram products
``Y Yᵀ`` (one batched matmul per chunk of models) rather than from ``(pairs × units)``
differences.  When the full ``(M, n_pairs)`` block would not fit in memory the distances of
a batch of pairs are computed from the rows instead (:class:`NeuralTargets`).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from .. import kernels
from ..constants import MAX_FULL_ELEMENTS  # noqa: F401  (tuning constants, defined there once)
from ..constants import NEURAL_CHUNK_BYTES as CHUNK_BYTES
from ..runtime import Runtime
from .distances import METRICS, get_distance

__all__ = ["CHUNK_BYTES", "MAX_FULL_ELEMENTS", "METRICS", "NeuralTargets", "preprocess_rows",
           "rdm_all_pairs", "rdm_from_rows", "rdm_gather"]


def _metric(metric):
    return get_distance(metric, extra=("precomputed",))


def preprocess_rows(Y, metric):
    """Rows whose squared Euclidean distances give ``metric`` (float64)."""
    return _metric(metric).preprocess(Y)


def rdm_from_rows(Y, i, j, metric):
    """Distances ``(M, n_pairs)`` for pairs ``(i, j)`` from Gram products, chunked over M."""
    M, n, _ = Y.shape
    metric = _metric(metric)
    Z = metric.preprocess(Y)
    i = torch.as_tensor(i, device=Z.device)
    j = torch.as_tensor(j, device=Z.device)
    step = max(1, int(CHUNK_BYTES // (8 * n * n)))
    out = []
    for s in range(0, M, step):
        z = Z[s:s + step]
        G = z @ z.transpose(-1, -2)
        sq = G.diagonal(dim1=-2, dim2=-1)
        out.append(metric.finish(sq[:, i] + sq[:, j] - 2.0 * G[:, i, j]))
    return torch.cat(out, dim=0)


def rdm_all_pairs(Y, metric, compiled=True):
    """:func:`rdm_from_rows` for every pair ``i < j`` in
    :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order, bit for bit.

    The same Gram products and the same elementwise operations, but each block of rows of
    the Gram matrix is turned into distances in place and its upper triangle read off in
    order, instead of gathering ``sq[i]``, ``sq[j]`` and ``G[i, j]`` with two index arrays
    of every pair (measured, Gram products included: 2.0 s instead of 4.1 s for 10 models
    of 2,560 stimuli; no index arrays are held).  On the CPU, with the compiled kernels on,
    one compiled pass reads the pairs off the Gram matrices
    (:func:`~mlem_neuro.core.kernels.condensed`: the same operations in the same
    order; ``compiled``: the runtime's switch of the compiled kernels).
    """
    M, n, _ = Y.shape
    metric = _metric(metric)
    Z = metric.preprocess(Y)
    P = n * (n - 1) // 2
    out = torch.empty(M, P, dtype=torch.float64, device=Z.device)
    step = max(1, int(CHUNK_BYTES // (8 * n * n)))
    col = torch.arange(n, device=Z.device)
    for s in range(0, M, step):
        z = Z[s:s + step]
        G = z @ z.transpose(-1, -2)
        if G.device.type == "cpu":
            # the same operations in one compiled pass (None: the library is not built)
            d2 = kernels.condensed(np.ascontiguousarray(G.numpy()), compiled=compiled)
            if d2 is not None:
                out[s:s + step] = torch.from_numpy(d2)
                del G
                continue
        sq = G.diagonal(dim1=-2, dim2=-1)
        rows = max(1, int(CHUNK_BYTES // 16 // (8 * n * z.shape[0])))
        start = 0
        for r in range(0, n - 1, rows):
            r1 = min(r + rows, n - 1)
            # columns r + 1.. hold every pair of these rows
            block = sq[:, r:r1, None] + sq[:, None, r + 1:] - 2.0 * G[:, r:r1, r + 1:]
            keep = col[None, r + 1:] > torch.arange(r, r1, device=Z.device)[:, None]
            vals = block[:, keep]
            out[s:s + step, start:start + vals.shape[1]] = vals
            start += vals.shape[1]
        del G
    return metric.finish(out)


def rdm_gather(Z, i, j, metric):
    """Distances for a batch of pairs from preprocessed rows ``Z`` (no Gram), chunked."""
    M, n, u = Z.shape
    metric = _metric(metric)
    step = max(1, int(CHUNK_BYTES // (8 * M * u)))
    out = []
    for s in range(0, len(i), step):
        diff = Z[:, i[s:s + step]] - Z[:, j[s:s + step]]
        out.append(metric.finish((diff * diff).sum(-1)))
    return torch.cat(out, dim=1)


def _read_only_tensor(Y, device):
    """``Y`` as a tensor without copying; the data are only read (every metric's
    :meth:`~mlem_neuro.core.rdms.distances.NeuralDistance.preprocess` returns new rows or leaves
    them untouched), so a read-only array (e.g. a pandas view) needs no copy."""
    if torch.is_tensor(Y):
        return Y.to(device)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(np.asarray(Y), device=device)


class NeuralTargets:
    """Neural distances of a stack of models, served for all pairs or for batches of pairs.

    Build with :meth:`from_data` (``Y``: ``(M, n, units)``) or :meth:`from_rdm` (an ``(M,
    n_pairs)`` block of precomputed distances in :func:`~mlem_neuro.core.stimuli.pairs.pair_indices`
    order).
    """

    def __init__(self, n_stimuli, full=None, rows=None, metric=None, ranked=False):
        self.n_stimuli = n_stimuli
        self.full = full
        self.rows = rows
        self.metric = metric
        self.ranked = ranked

    @property
    def n_models(self):
        return (self.full if self.full is not None else self.rows).shape[0]

    @classmethod
    def from_data(cls, Y, metric, device, runtime=None):
        """The targets of data ``Y (M, n, units)``: every pair's distance when they fit a
        32nd of the memory budget, else the rows (``runtime``: the
        :class:`~mlem_neuro.core.runtime.Runtime`, its budget and compiled kernels;
        ``None``: ``Runtime()``)."""
        runtime = Runtime() if runtime is None else runtime
        Y = _read_only_tensor(Y, device)
        M, n, _ = Y.shape
        n_p = n * (n - 1) // 2
        # float64 (M, n_pairs) blocks: a few copies live at once during training
        if M * n_p <= min(MAX_FULL_ELEMENTS, runtime.memory_bytes // 32):
            return cls(n, full=rdm_all_pairs(Y, metric, runtime.compiled), metric=metric)
        return cls(n, rows=preprocess_rows(Y, metric), metric=metric)

    @classmethod
    def from_rdm(cls, rdm, n_stimuli, device, ranked=False):
        """``ranked``: each row of ``rdm`` holds its own average ranks (:func:`~mlem_neuro.
        core.spearman.rankdata` of the distances), so training takes them as they are
        (training sees the distances only through their ranks)."""
        full = torch.as_tensor(np.asarray(rdm) if not torch.is_tensor(rdm) else rdm,
                               device=device, dtype=torch.float64)
        return cls(n_stimuli, full=full[None] if full.ndim == 1 else full, ranked=ranked)

    def take(self, lin, i, j, models=None):
        """Distances ``(M, len(lin))`` for linear pair indices ``lin`` = pairs ``(i, j)``.

        ``models`` (index tensor) restricts the rows to those models.
        """
        if self.full is not None:
            lin = torch.as_tensor(lin, device=self.full.device)
            if models is None:
                return self.full[:, lin]
            return self.full[models[:, None], lin[None, :]]
        dev = self.rows.device
        rows = self.rows if models is None else self.rows.index_select(0, models)
        return rdm_gather(rows, torch.as_tensor(i, device=dev), torch.as_tensor(j, device=dev),
                          self.metric)
