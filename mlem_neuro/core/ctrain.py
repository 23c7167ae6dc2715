"""Grouped training in C: each model trained to its own stop.

With categorical features and full batches (every training pair each step), a model's
steps depend on that model alone: its grouped predictions, counts and target sums; so do
they with the grid of numeric distances, whose mini-batches are unions of fixed blocks of
pairs drawn at random, the same blocks for every model at a step
(:class:`~mlem_neuro.core.quantise.GridBlocks`): the C loop draws every step's blocks
first, from the same stream.  The
numpy loop (:mod:`mlem_neuro.core.numpy_train`) still steps a stack of models together,
so each step pays dozens of small array operations over ``(models × rows)`` arrays; the
C loop of ``_ctrain.c`` runs the same steps one model at a time (the metric and AdamW in
float32, the predictions and the grouped soft Spearman in float64, the same stopping
rule).  ``tests/test_ctrain.py`` compares it with the numpy loop: the same numbers up to
float32 rounding.  ``benchmarks/bench_train_loops.py`` measures the loops side by side.

The library is compiled when the package is installed (an optional extension: where no
C compiler is found the install goes on without it and the numpy loop is used).  Set
``MLEM_NEURO_NO_C=1`` (or :data:`USE_C` to ``False``) to use the numpy loop.
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import threading

import numpy as np
import torch

#: whether grouped full-batch training on the CPU uses the compiled loop when it is built.
USE_C = os.environ.get("MLEM_NEURO_NO_C", "") in ("", "0")

_CONSTRAINTS = {"spd": 0, "diagonal": 1, "none": 2}
_MAX_FEATURES = 64
_LIB = None
_LOADED = False


_LIB_LOCK = threading.Lock()


def _library():
    """The compiled library (ctypes), or ``None`` when it is not built.

    Loaded once, under a lock: chunks running in threads (joblib's threading backend, a
    dask worker) all see the library once it is loaded, never a half-loaded state that
    would send a chunk to the numpy loop."""
    global _LIB, _LOADED
    if _LOADED:
        return _LIB
    with _LIB_LOCK:
        if not _LOADED:
            _LIB = _load()
            _LOADED = True
    return _LIB


def _load():
    try:
        spec = importlib.util.find_spec("mlem_neuro.core._ctrain")
        if spec is None or not spec.origin:
            return None
        lib = ctypes.CDLL(spec.origin)
    except (ImportError, OSError):
        return None
    f = lib.mlem_train_grouped
    p = ctypes.c_void_p
    f.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, p, p, p, p,
                  ctypes.c_int, p, ctypes.c_int, ctypes.c_double, ctypes.c_double,
                  ctypes.c_double, ctypes.c_int64, ctypes.c_int64, p, p, p, p, p]
    f.restype = ctypes.c_int
    b = lib.mlem_train_blocks
    b.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, p, p, p,
                  ctypes.c_int, ctypes.c_int, p, p, p, p, p, ctypes.c_int, ctypes.c_double,
                  ctypes.c_double, ctypes.c_double, ctypes.c_int64, ctypes.c_int64, p, p, p,
                  p, p]
    b.restype = ctypes.c_int
    pk = lib.mlem_packed_keys
    pk.argtypes = [ctypes.c_int64, ctypes.c_int64, p, ctypes.c_int, p]
    pk.restype = ctypes.c_int
    fk = lib.mlem_feature_keys
    fk.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, p, p, p, p, ctypes.c_int, p,
                   p]
    fk.restype = ctypes.c_int
    ss = lib.mlem_sorted_scores
    ss.argtypes = [ctypes.c_int64, ctypes.c_int64, p, p, ctypes.c_int, p, ctypes.c_int64, p,
                   p, p]
    ss.restype = ctypes.c_int
    rw = lib.mlem_rank_walk
    rw.argtypes = [ctypes.c_int64, ctypes.c_int64, p, p, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_int, p, ctypes.c_int, p, p]
    rw.restype = ctypes.c_int
    cd = lib.mlem_condensed
    cd.argtypes = [ctypes.c_int64, ctypes.c_int64, p, p]
    cd.restype = ctypes.c_int
    sr = lib.mlem_subset_ranks
    sr.argtypes = [ctypes.c_int64, ctypes.c_int64, p, p, p, ctypes.c_int64, ctypes.c_int64, p,
                   ctypes.c_int64, ctypes.c_int64, p]
    sr.restype = ctypes.c_int
    bt = lib.mlem_block_tables
    bt.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, p, p, p, p,
                   p, p]
    bt.restype = ctypes.c_int
    g = lib.mlem_value_and_grad
    g.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int, p, p, p, p,
                  ctypes.c_int, p, ctypes.c_int, ctypes.c_double, p, p, p]
    g.restype = ctypes.c_int
    return lib


def built():
    """Whether the compiled training loop is installed."""
    return _library() is not None


def available(data, m, dev, dtype):
    """Whether :func:`train` runs ``data``'s steps: grouped full batches, or the grid's
    mini-batches of blocks, on the CPU in float32, the library built and :data:`USE_C`
    set."""
    return (USE_C and dev.type == "cpu" and dtype == torch.float32 and data.grouped
            and (data.full or getattr(data, "blocks", None) is not None)
            and 1 <= m <= _MAX_FEATURES and built())


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def value_and_grad(A, constraint, k, l, P, counts, targets, strength):
    """:func:`mlem_neuro.core.numpy_train.value_and_grad` computed by the compiled loop's
    step (for tests): soft Spearman ``(M,)`` and gradient ``(M, m, m)`` (float32)."""
    A = np.ascontiguousarray(A, dtype=np.float32)
    M, m = A.shape[0], A.shape[-1]
    P = np.ascontiguousarray(P, dtype=np.float64)
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    targets = np.ascontiguousarray(np.broadcast_to(targets, (M, P.shape[0])), dtype=np.float64)
    k = np.ascontiguousarray(k, dtype=np.int64)
    l = np.ascontiguousarray(l, dtype=np.int64)
    rho = np.empty(M)
    grad = np.empty_like(A)
    status = _library().mlem_value_and_grad(
        M, m, P.shape[1], P.shape[0], _ptr(k), _ptr(l), _ptr(P), _ptr(counts),
        int(counts.ndim == 2), _ptr(targets), _CONSTRAINTS[constraint], float(strength),
        _ptr(A), _ptr(rho), _ptr(grad))
    if status != 0:
        raise MemoryError("the compiled training loop could not allocate its workspace")
    return rho, grad


def _train_full(data, M, m, k, l, common):
    P, counts, targets = data.numpy_batch()
    P = np.ascontiguousarray(P, dtype=np.float64)
    counts = np.ascontiguousarray(counts, dtype=np.float64)
    targets = np.ascontiguousarray(targets, dtype=np.float64)
    U, T = P.shape
    if targets.shape != (M, U) or counts.shape not in ((U,), (M, U)):
        raise RuntimeError(f"ctrain: unexpected batch shapes {P.shape}, {counts.shape}, "
                           f"{targets.shape} for {M} models")
    return _library().mlem_train_grouped(M, m, T, U, _ptr(k), _ptr(l), _ptr(P), _ptr(counts),
                                         int(counts.ndim == 2), _ptr(targets), *common)


def _train_blocks(data, M, m, k, l, max_steps, n_iter, common):
    """The grid's mini-batches of blocks (:class:`~mlem_neuro.core.quantise.GridBlocks`):
    every step's blocks are drawn before training, from the stream the numpy loop draws
    them from; the stream is then left where the numpy loop leaves it (one draw per step
    of the longest-training model)."""
    bt = data.blocks
    grid = bt.blocks
    P = np.ascontiguousarray(data.P_uniq.numpy(), dtype=np.float64)
    U, T = P.shape
    C = np.ascontiguousarray(grid.C.cpu().numpy(), dtype=np.float64)
    Tb = np.ascontiguousarray(bt.T.cpu().numpy().transpose(0, 2, 1), dtype=np.float64)
    S1 = np.ascontiguousarray(bt.S1.cpu().numpy(), dtype=np.float64)
    S2 = np.ascontiguousarray(bt.S2.cpu().numpy(), dtype=np.float64)
    K = C.shape[1]
    if C.shape[0] != U or Tb.shape != (M, K, U) or S1.shape != (M, K):
        raise RuntimeError(f"ctrain: unexpected block tables {C.shape}, {Tb.shape}, "
                           f"{S1.shape} for {M} models and {U} groups")
    rng = bt.rng
    state = rng.bit_generator.state
    draws = np.ascontiguousarray(grid.draw_blocks(rng, max_steps), dtype=np.int64)
    status = _library().mlem_train_blocks(M, m, T, U, _ptr(k), _ptr(l), _ptr(P), K,
                                          int(grid.k), _ptr(C), _ptr(Tb), _ptr(S1),
                                          _ptr(S2), _ptr(draws), *common)
    rng.bit_generator.state = state
    grid.draw_blocks(rng, int(n_iter.max()))
    return status


def train(data, m, fit_kw, dev, dtype, history=True):
    """:func:`mlem_neuro.core.engine._train` for grouped full batches on the CPU, in C;
    returns the same :class:`~mlem_neuro.core.engine.StackFit`."""
    from .constants import SOFT_RANK_STRENGTH
    from .metric import init_params, make_W
    from .stackfit import StackFit

    constraint = fit_kw["constraint"]
    M = int(data.M)
    A = np.ascontiguousarray(init_params(M, m, constraint, dev, dtype).numpy(),
                             dtype=np.float32)
    n_iter = np.zeros(M, dtype=np.int64)
    converged = np.zeros(M, dtype=np.uint8)
    best = np.full(M, -np.inf)
    max_steps = int(fit_kw["max_steps"])
    hist = np.empty((M, max_steps), dtype=np.float32) if history else None
    if M:
        k = np.ascontiguousarray(np.asarray(data.k), dtype=np.int64)
        l = np.ascontiguousarray(np.asarray(data.l), dtype=np.int64)
        common = (_CONSTRAINTS[constraint], float(SOFT_RANK_STRENGTH), float(fit_kw["lr"]),
                  float(fit_kw["tol"]), int(fit_kw["patience"]), max_steps, _ptr(A),
                  _ptr(n_iter), _ptr(converged), _ptr(best), _ptr(hist) if history else None)
        if data.full:
            status = _train_full(data, M, m, k, l, common)
        else:
            status = _train_blocks(data, M, m, k, l, max_steps, n_iter, common)
        if status != 0:
            raise MemoryError("the compiled training loop could not allocate its workspace")
    with torch.no_grad():
        W = make_W(torch.from_numpy(A), constraint)
    if history:
        hist = hist[:, :int(n_iter.max()) if M else 0].astype(np.float64)
    return StackFit(W=W.double().numpy(), n_iter=n_iter, converged=converged.astype(bool),
                    history=hist, best_score=best, batch_size=int(data.b),
                    full_batch=bool(data.full))


def sorted_scores(q, tz, tz_div):
    """Spearman of the rows of ``q (R, n)`` (float64, C-contiguous numpy) against the
    standardised target ranks ``tz (R // tz_div, n)`` (row ``r`` against ``tz[r //
    tz_div]``), for rows without ties; ``None`` when the library is not built or ``q``
    holds a value that is not finite.

    Returns ``(rho (R,), redo (R,) bool)``: ``redo`` marks the rows whose score the caller
    must compute another way (ties, whose ranks are averaged, or values too close for the
    packed keys).  The sort is numpy's, of integer keys that pack each value's order with
    its index (``_ctrain.c``: ``mlem_packed_keys``, ``mlem_sorted_scores``).
    """
    lib = _library() if USE_C else None
    packed = None if lib is None else _packed_keys(lib, q)
    if packed is None:
        return None
    return _finish(lib, q, *packed, tz, tz_div)


def _packed_keys(lib, x):
    """``(keys, bits)``: each value of the rows of ``x`` (float64, C-contiguous numpy) as
    an integer key of its order with its index in the low ``bits`` bits
    (``mlem_packed_keys``), or ``None`` when a value is not finite."""
    R, n = x.shape
    bits = max(int(n - 1).bit_length(), 1)
    keys = np.empty((R, n), dtype=np.int64)
    if lib.mlem_packed_keys(R, n, _ptr(x), bits, _ptr(keys)):
        return None
    return keys, bits


def feature_scores(A, B, Wff, d):
    """Predictions of feature importance and their packed keys, computed together:
    ``q[m, r] = A[m] + d[r] * (2 B[m] + Wff[m] d[r])`` for ``A, B (M, n)``, ``Wff (M,)``
    and the permuted distances ``d (R, n)`` (float64, C-contiguous numpy).  Returns the
    function that scores them (``tz (M, n)`` → ``(rho (M * R,), redo)``, as
    :func:`sorted_scores`) and ``q (M * R, n)``, or ``None`` (library not built, or a
    value not finite)."""
    lib = _library() if USE_C else None
    if lib is None:
        return None
    (M, n), R = A.shape, d.shape[0]
    bits = max(int(n - 1).bit_length(), 1)
    q = np.empty((M * R, n))
    keys = np.empty((M * R, n), dtype=np.int64)
    if lib.mlem_feature_keys(M, R, n, _ptr(A), _ptr(B), _ptr(Wff), _ptr(d), bits, _ptr(q),
                             _ptr(keys)):
        return None
    return (lambda tz: _finish(lib, q, keys, bits, tz, R)), q


def _finish(lib, q, keys, bits, tz, tz_div):
    """Sort the packed keys and score the rows (:func:`sorted_scores`)."""
    R, n = q.shape
    keys.sort(axis=-1)
    c = np.arange(1, n + 1, dtype=np.float64)
    c -= c.mean()
    c /= max(np.linalg.norm(c), 1e-12)
    rho = np.empty(R)
    flags = np.empty(R, dtype=np.uint8)
    lib.mlem_sorted_scores(R, n, _ptr(q), _ptr(keys), bits, _ptr(tz), int(tz_div), _ptr(c),
                           _ptr(rho), _ptr(flags))
    return rho, flags != 0


def rank_walk(D, labels, J, U):
    """Rank sums of sets of pairs within each set, from one sort of each row of ``D (R,
    P)`` (float64, C-contiguous numpy) for all sets.  The sets come in ``C`` channels of
    up to ``J`` sets that share no pair: ``labels (C, P)`` holds ``j * U + g`` for a pair of
    the channel's ``j``-th set in distance row ``g < U``, or ``J * U`` for a pair in none
    (:func:`mlem_neuro.core.fastnull._walk_plan`).  The sort is numpy's, of integer keys
    packing each value's order with its index (:func:`sorted_scores`); one compiled pass
    walks each sorted row for every channel.

    Returns ``(rsum (C, R, J * U) float64, redo (R,) bool)``: per channel, row and label,
    the exact sum (of integers) of the ranks of its pairs within their set, for the rows
    not marked ``redo``; a row marked (tied values, whose ranks are averaged, or values
    too close for the packed keys) is the caller's to rank another way.  ``None`` when the
    library is not built or ``D`` holds a value that is not finite.
    """
    lib = _library() if USE_C else None
    packed = None if lib is None else _packed_keys(lib, D)
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
    if lib.mlem_rank_walk(R, P, _ptr(D), _ptr(keys), bits, C, int(J), int(U), _ptr(lab),
                          int(narrow), _ptr(out), _ptr(flags)):
        raise MemoryError("the compiled rank walk could not allocate its sums")
    return out, flags != 0


def condensed(G):
    """Squared distances ``(M, n (n - 1) / 2)`` of every pair ``i < j`` (pair order of
    :func:`~mlem_neuro.core.pairs.pair_indices`) from Gram matrices ``G (M, n, n)``
    (float64, C-contiguous numpy): ``(G_ii + G_jj) - 2 G_ij``, bit for bit as
    :func:`~mlem_neuro.core.neural.rdm_all_pairs` computes it; ``None`` when the library
    is not built."""
    lib = _library() if USE_C else None
    if lib is None:
        return None
    M, n, _ = G.shape
    out = np.empty((M, n * (n - 1) // 2))
    if lib.mlem_condensed(M, n, _ptr(G), _ptr(out)):
        raise MemoryError("the compiled pair distances could not allocate their workspace")
    return out


def subset_ranks(pos, first, last, cols, out):
    """Average ranks of the column subsets ``cols (R, P)`` (int64) of every row, from the
    rows' sorted positions ``pos (M, N)`` and tie groups ``first``, ``last`` (int32, or
    ``None`` without ties; :class:`~mlem_neuro.core.spearman.SubsetRanks`), written into
    ``out (M, R, P)`` (a float64 numpy array or view whose last axis is contiguous);
    ``False`` when the library is not built."""
    lib = _library() if USE_C else None
    if lib is None:
        return False
    M, N = pos.shape
    R, P = cols.shape
    assert out.shape == (M, R, P) and out.strides[2] == 8
    if lib.mlem_subset_ranks(M, N, _ptr(pos), None if first is None else _ptr(first),
                             None if last is None else _ptr(last), R, P, _ptr(cols),
                             out.strides[0] // 8, out.strides[1] // 8, _ptr(out)):
        raise MemoryError("the compiled subset ranks could not allocate their counts")
    return True


def block_tables(key, block, ranks, n_keys, K):
    """The grid's per-block target tables of ``ranks (M, P)`` (float64 numpy): ``T (M,
    n_keys)``, ``S1`` and ``S2 (M, K)``, the sums of the ranks per key (cell and block)
    and of the ranks and squared ranks per block, added pair by pair in order as
    :class:`~mlem_neuro.core.quantise._BlockTargets` does in torch; ``None`` when the
    library is not built."""
    lib = _library() if USE_C else None
    if lib is None:
        return None
    M, P = ranks.shape
    key, block = (np.ascontiguousarray(a, dtype=np.int64) for a in (key, block))
    ranks = np.ascontiguousarray(ranks, dtype=np.float64)
    T, S1, S2 = np.zeros((M, n_keys)), np.zeros((M, K)), np.zeros((M, K))
    lib.mlem_block_tables(M, P, n_keys, K, _ptr(key), _ptr(block), _ptr(ranks), _ptr(T),
                          _ptr(S1), _ptr(S2))
    return T, S1, S2
