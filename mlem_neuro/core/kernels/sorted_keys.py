"""Kernels that sort rows by packed integer keys and walk the sorted rows: the exact
Spearman scores of importance predictions (:func:`sorted_scores`, :func:`feature_scores`)
and the fast null's rank sums of sets of pairs (:func:`rank_walk`).

Each value of a row becomes a 64-bit integer key whose order is the value's order, with
the value's index in its row packed into the low bits; numpy sorts the keys (a
vectorised integer sort) and one compiled pass walks each sorted row.  Rows whose order
the keys cannot settle (tied values, or values that differ only in the dropped bits) are
flagged for the caller to rank another way.

Part of the bottom layer (:mod:`mlem_neuro.core.kernels`): numpy arrays in and out, no
import of the package but its constants.  Each wrapper returns ``None`` when the compiled
kernels are off: its ``compiled`` argument (the runtime's switch,
:attr:`~mlem_neuro.core.runtime.Runtime.compiled`) is false or numba is not installed
(:func:`~mlem_neuro.core.kernels._numba.on`).
"""
from __future__ import annotations

import numpy as np

from . import _numba
from ._numba import _f64, _inline, _jit

_TOP = np.uint64(1) << np.uint64(63)
_ONE = np.uint64(1)
_INT64_MIN = np.int64(-(2 ** 63))


@_jit
def _packed_keys_kernel(x, bits, keys):
    """Each value of ``x (R, n)`` as a 64-bit key whose signed order is the value's order,
    with its low ``bits`` bits replaced by the value's index in its row.  Returns 1 (and
    stops) at a value that is not finite, else 0."""
    R, n = x.shape
    low = (_ONE << np.uint64(bits)) - _ONE
    ux = x.view(np.uint64)
    uk = keys.view(np.uint64)
    for r in range(R):
        for i in range(n):
            if not np.isfinite(x[r, i]):
                return 1
            u = ux[r, i]
            u = ~u if (u & _TOP) else (u | _TOP)           # unsigned order = value order
            u = (u & ~low) | np.uint64(i)
            uk[r, i] = u ^ _TOP                            # signed order = unsigned order
    return 0


@_jit
def _feature_keys_kernel(A, B, Wff, d, bits, q, keys):
    """``q[m, r, p] = A[m, p] + d[r, p] (2 B[m, p] + Wff[m] d[r, p])`` and its packed keys
    (rows ``m * R + r``).  Returns 1 at a value that is not finite, else 0."""
    M, n = A.shape
    R = d.shape[0]
    low = (_ONE << np.uint64(bits)) - _ONE
    uk = keys.view(np.uint64)
    uq = q.view(np.uint64)
    for m in range(M):
        w = Wff[m]
        for r in range(R):
            row = m * R + r
            for i in range(n):
                x = A[m, i] + d[r, i] * (2.0 * B[m, i] + w * d[r, i])
                if not np.isfinite(x):
                    return 1
                q[row, i] = x
                u = uq[row, i]
                u = ~u if (u & _TOP) else (u | _TOP)
                u = (u & ~low) | np.uint64(i)
                uk[row, i] = u ^ _TOP
    return 0


@_inline
def _order_flag(x, prev):
    """Of a sorted row's value ``x`` after ``prev``: 1 when out of order (values that
    differ only in the packed keys' dropped bits), 2 when equal (ranks to average)."""
    if x < prev:
        return 1
    if x == prev:
        return 2
    return 0


@_jit
def _sorted_scores_kernel(q, keys, bits, tz, tz_div, c, rho, flags):
    """After each row of keys is sorted: ``rho[r] = Σ_pos c[pos] tz[r // tz_div][order]``;
    ``flags[r]`` bit 1: the row is not in order (values that differ only in the dropped
    bits), bit 2: it holds equal values (ranks to average)."""
    R, n = q.shape
    mask = (1 << bits) - 1
    for r in range(R):
        t = tz[r // tz_div]
        acc = 0.0
        prev = -np.inf
        flag = 0
        for p in range(n):
            idx = keys[r, p] & mask
            x = q[r, idx]
            flag |= _order_flag(x, prev)
            prev = x
            acc += c[p] * t[idx]
        rho[r] = acc
        flags[r] = flag


def _packed_keys(x):
    """``(keys, bits)``: each value of the rows of ``x`` (float64, C-contiguous) as an
    integer key of its order with its index in the low ``bits`` bits, or ``None`` when a
    value is not finite."""
    R, n = x.shape
    bits = max(int(n - 1).bit_length(), 1)
    keys = np.empty((R, n), dtype=np.int64)
    if _packed_keys_kernel(x, bits, keys):
        return None
    return keys, bits


def sorted_scores(q, tz, tz_div, *, compiled):
    """Spearman of the rows of ``q (R, n)`` (float64, C-contiguous numpy) against the
    standardised target ranks ``tz (R // tz_div, n)`` (row ``r`` against ``tz[r //
    tz_div]``), for rows without ties; ``None`` when the kernels are off or ``q``
    holds a value that is not finite.

    Returns ``(rho (R,), redo (R,) bool)``: ``redo`` marks the rows whose score the caller
    must compute another way (ties, whose ranks are averaged, or values too close for the
    packed keys).  The sort is numpy's, of integer keys that pack each value's order with
    its index.
    """
    packed = _packed_keys(q) if _numba.on(compiled) else None
    if packed is None:
        return None
    return _finish(q, *packed, tz, tz_div)


def feature_scores(A, B, Wff, d, *, compiled):
    """Predictions of feature importance and their packed keys, computed together:
    ``q[m, r] = A[m] + d[r] * (2 B[m] + Wff[m] d[r])`` for ``A, B (M, n)``, ``Wff (M,)``
    and the permuted distances ``d (R, n)`` (float64, C-contiguous numpy).  Returns the
    function that scores them (``tz (M, n)`` → ``(rho (M * R,), redo)``, as
    :func:`sorted_scores`) and ``q (M * R, n)``, or ``None`` (the kernels off,
    or a value not finite)."""
    if not _numba.on(compiled):
        return None
    (M, n), R = A.shape, d.shape[0]
    bits = max(int(n - 1).bit_length(), 1)
    q = np.empty((M * R, n))
    keys = np.empty((M * R, n), dtype=np.int64)
    if _feature_keys_kernel(A, B, np.ascontiguousarray(Wff, dtype=np.float64), d, bits, q,
                            keys):
        return None
    return (lambda tz: _finish(q, keys, bits, tz, R)), q


def _finish(q, keys, bits, tz, tz_div):
    """Sort the packed keys and score the rows (:func:`sorted_scores`)."""
    R, n = q.shape
    keys.sort(axis=-1)
    c = np.arange(1, n + 1, dtype=np.float64)
    c -= c.mean()
    c /= max(np.linalg.norm(c), 1e-12)
    rho = np.empty(R)
    flags = np.empty(R, dtype=np.uint8)
    _sorted_scores_kernel(q, keys, bits, _f64(tz), int(tz_div), c, rho, flags)
    return rho, flags != 0



# ------------------------------------------------------------- rank sums of the null

@_jit
def _rank_walk_kernel(x, keys, bits, J, U, labels, rsum, flags):
    """Rank sums of sets of pairs from one sort per row (keys sorted): per channel, row and
    label ``j * U + g`` the sum of the ranks of the set's pairs within their set; a pair
    labelled ``J * U`` is in none of the channel's sets (it adds to a spare)."""
    R, P = x.shape
    C = labels.shape[1]
    mask = (1 << bits) - 1
    Lb = J * U
    V = Lb + 1
    count = np.zeros((C, J + 1), np.int64)
    acc = np.zeros((C, V))
    set_of = np.empty(V, np.int64)
    for code in range(V):
        set_of[code] = code // (U if U > 0 else 1)
    for r in range(R):
        prev_hi = _INT64_MIN
        prev_idx = 0
        flag = 0
        count[:] = 0
        acc[:] = 0.0
        for p in range(P):
            kp = keys[r, p]
            idx = kp & mask
            hi = kp >> bits
            if hi == prev_hi:        # same kept bits: only the values can tell the order
                flag |= _order_flag(x[r, idx], x[r, prev_idx])
            prev_hi = hi
            prev_idx = idx
            for c in range(C):
                code = np.int64(labels[idx, c])
                s = set_of[code]
                count[c, s] += 1
                acc[c, code] += np.float64(count[c, s])
        for c in range(C):
            for e in range(Lb):
                rsum[c, r, e] = acc[c, e]
        flags[r] = flag


def rank_walk(D, labels, J, U, *, compiled):
    """Rank sums of sets of pairs within each set, from one sort of each row of ``D (R,
    P)`` (float64, C-contiguous numpy) for all sets.  The sets come in ``C`` channels of
    up to ``J`` sets that share no pair: ``labels (C, P)`` holds ``j * U + g`` for a pair of
    the channel's ``j``-th set in distance row ``g < U``, or ``J * U`` for a pair in none
    (:func:`mlem_neuro.core.scoring.fastnull._walk_plan`).  The sort is numpy's, of integer keys
    packing each value's order with its index (:func:`sorted_scores`); one compiled pass
    walks each sorted row for every channel.

    Returns ``(rsum (C, R, J * U) float64, redo (R,) bool)``: per channel, row and label,
    the exact sum (of integers) of the ranks of its pairs within their set, for the rows
    not marked ``redo``; a row marked (tied values, whose ranks are averaged, or values
    too close for the packed keys) is the caller's to rank another way.  ``None`` when
    the kernels are off or ``D`` holds a value that is not finite.
    """
    packed = _packed_keys(D) if _numba.on(compiled) else None
    if packed is None:
        return None
    keys, bits = packed
    R, P = D.shape
    keys.sort(axis=-1)
    narrow = J * U < 256                  # one byte a label: all labels stay in the cache
    lab = np.ascontiguousarray(np.asarray(labels).T,
                               dtype=np.uint8 if narrow else np.int32)     # (P, C)
    C = lab.shape[1]
    out = np.empty((C, R, J * U))
    flags = np.empty(R, dtype=np.uint8)
    _rank_walk_kernel(D, keys, bits, int(J), int(U), lab, out, flags)
    return out, flags != 0

