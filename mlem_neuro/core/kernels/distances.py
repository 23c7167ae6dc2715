"""Kernel of pair distances: the squared distances of every pair of stimuli read off Gram
matrices in one pass (:func:`condensed`).

Part of the bottom layer (:mod:`mlem_neuro.core.kernels`): numpy arrays in and out, no
import of the package but its constants.
"""
from __future__ import annotations

import numpy as np

from . import _numba
from ._numba import _jit


@_jit
def _condensed_kernel(G, out):
    M, n = G.shape[0], G.shape[1]
    sq = np.empty(n)
    for m in range(M):
        g = G[m]
        o = out[m]
        for i in range(n):
            sq[i] = g[i, i]
        p = 0
        for i in range(n - 1):
            si = sq[i]
            row = g[i, i + 1:]
            rest = sq[i + 1:]
            dst = o[p:p + n - 1 - i]
            for j in range(n - 1 - i):
                dst[j] = (si + rest[j]) - 2.0 * row[j]
            p += n - 1 - i


def condensed(G, *, compiled):
    """Squared distances ``(M, n (n - 1) / 2)`` of every pair ``i < j`` (pair order of
    :func:`~mlem_neuro.core.stimuli.pairs.pair_indices`) from Gram matrices ``G (M, n, n)``
    (float64, C-contiguous numpy): ``(G_ii + G_jj) - 2 G_ij``, bit for bit as
    :func:`~mlem_neuro.core.rdms.neural.rdm_all_pairs` computes it; ``None`` when
    the kernels are off (``compiled``: the runtime's switch, :func:`~._numba.on`)."""
    if not _numba.on(compiled):
        return None
    M, n, _ = G.shape
    out = np.empty((M, n * (n - 1) // 2))
    _condensed_kernel(G, out)
    return out

