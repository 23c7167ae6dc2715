"""Kernel of average ranks of many column subsets of sorted rows at once
(:func:`subset_ranks`: the null rows of the permutation tests), by counting over each
row's sorted positions instead of sorting each subset.

Part of the bottom layer (:mod:`mlem_neuro.core.kernels`): numpy arrays in and out, no
import of the package but its constants.
"""
from __future__ import annotations

import numpy as np

from . import _numba
from ._numba import _jit


@_jit
def _subset_ranks_kernel(pos, first, last, ties, cols, out):
    M, N = pos.shape
    R, P = cols.shape
    cnt = np.zeros(max(N, 1), np.int32)
    for m in range(M):
        pm = pos[m]
        for r in range(R):
            cnt[:] = 0
            for p in range(P):
                cnt[pm[cols[r, p]]] = 1
            run = 0
            for q in range(N):
                run += cnt[q]
                cnt[q] = run
            if not ties:
                for p in range(P):
                    out[m, r, p] = np.float64(cnt[pm[cols[r, p]]])
            else:
                for p in range(P):
                    q = pm[cols[r, p]]
                    f = first[m, q]
                    before = cnt[f - 1] if f > 0 else 0
                    upto = cnt[last[m, q]]
                    out[m, r, p] = np.float64(before) + np.float64(upto - before + 1) / 2


def subset_ranks(pos, first, last, cols, out, *, compiled):
    """Average ranks of the column subsets ``cols (R, P)`` (int64) of every row, from the
    rows' sorted positions ``pos (M, N)`` and tie groups ``first``, ``last`` (int32, or
    ``None`` without ties; :class:`~mlem_neuro.core.ranks.spearman.SubsetRanks`), written into
    ``out (M, R, P)`` (a float64 numpy array or view); ``False`` when
    the kernels are off (``compiled``: the runtime's switch, :func:`~._numba.on`)."""
    if not _numba.on(compiled):
        return False
    M, N = pos.shape
    assert out.shape == (M, cols.shape[0], cols.shape[1])
    ties = first is not None
    dummy = np.zeros((1, 1), np.int32)
    _subset_ranks_kernel(pos, first if ties else dummy, last if ties else dummy, ties,
                         cols, out)
    return True

