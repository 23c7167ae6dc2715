"""The compiled training loop of grouped designs on the CPU: the torch-facing side of the
numba kernels of :mod:`mlem_neuro.core.kernels.training`.

With categorical features and full batches (every training pair each step), or the grid
of numeric distances in mini-batches of blocks
(:class:`~mlem_neuro.core.training.quantise.GridBlocks`), each model's steps depend on that
model alone: :func:`train` runs each model to its own stop in the kernels (the metric
``W`` from the parameters and AdamW in float32, the predictions and the grouped soft
Spearman in float64, the gradient by hand and the stopping rule of
:mod:`mlem_neuro.core.training.torch_loop`; the kernels' module says how).  This module says
which designs it trains (:func:`available`), turns a design's batches (torch tensors) into
the kernels' numpy arrays, draws the grid's blocks from the torch loop's stream, gives the
stack its threads (:func:`threads_for`) and returns a
:class:`~mlem_neuro.core.training.stackfit.StackFit`.  ``tests/test_compiled.py`` compares
it with torch's autograd, ``tests/test_backends.py`` with the reference backend.

The kernels are compiled by numba on first use and cached on disk
(:mod:`mlem_neuro.core.kernels._numba`).  An analysis whose runtime has them off
(:attr:`~mlem_neuro.core.runtime.Runtime.compiled`: ``MLEM_NEURO_NO_COMPILED`` set to a true
word, ``1``, ``true``, ``yes``, ``on``, when the analysis started, or
``Runtime(compiled=False)``) trains with torch instead: the batch objects carry the switch
(``data.compiled``).
"""
from __future__ import annotations

import functools
import threading
import warnings

import numpy as np
import torch

from ..constants import (
    ADAM_BETA1,
    ADAM_BETA2,
    COMPILED_MAX_FEATURES,
    COMPILED_PARALLEL_MODELS,
    SOFT_RANK_STRENGTH,
)
from ..kernels import _numba
from ..kernels._numba import _f64, numba
from ..kernels.training import CONSTRAINT_CODES, _train_models, _train_models_parallel

#: the name results record for this backend
NAME = "compiled loop (numba)"
#: the most features the compiled loop trains
MAX_FEATURES = COMPILED_MAX_FEATURES
#: models from which a stack may train on several threads
PARALLEL_MODELS = COMPILED_PARALLEL_MODELS


def available(data, m, dev, dtype):
    """Whether :func:`train` runs ``data``'s steps: grouped full batches, or the grid's
    mini-batches of blocks, on the CPU in float32, with 1 to :data:`MAX_FEATURES`
    features and the compiled kernels on (``data.compiled``, the runtime's switch
    :attr:`~mlem_neuro.core.runtime.Runtime.compiled`, and numba installed; without
    numba: a warning, once)."""
    applies = (dev.type == "cpu" and dtype == torch.float32 and data.grouped
               and (data.full or data.block_tables() is not None)
               and 1 <= m <= MAX_FEATURES)
    if applies and numba is None:
        _warn_no_numba()
    return _numba.on(data.compiled) and applies


@functools.lru_cache(maxsize=None)
def _warn_no_numba():
    warnings.warn("numba is not installed: the CPU trains categorical designs with torch "
                  "(several times slower; the same models). Install numba (a dependency "
                  "of mlem_neuro) for the compiled loop.", RuntimeWarning, stacklevel=4)


def threads_for(M, allowed=1):
    """Threads the compiled loop trains ``M`` models with: the ``allowed`` threads (the
    analysis's :attr:`~mlem_neuro.core.runtime.Runtime.compiled_threads`: the worker's
    cores, capped by ``MLEM_NEURO_NUM_THREADS``; one outside an analysis), at most one per
    model, and one outside the main thread (numba's thread pool is not entered from two
    threads at once: joblib's threading backend and dask run chunks in threads) or for
    fewer than :data:`~mlem_neuro.core.constants.COMPILED_PARALLEL_MODELS` models."""
    if (numba is None or threading.current_thread() is not threading.main_thread()
            or M < PARALLEL_MODELS):
        return 1
    return max(1, min(int(allowed), numba.config.NUMBA_NUM_THREADS, M))


def _run(allowed, *args):
    """:func:`~mlem_neuro.core.kernels.training._train_models` (``args``), on
    :func:`threads_for` threads (``allowed``: the runtime's)."""
    M = args[0].shape[0]
    threads = threads_for(M, allowed)
    if threads == 1:
        return _train_models(*args)
    old = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        # several chunks a thread: models stop at different steps
        _train_models_parallel(min(M, 4 * threads), *args)
    finally:
        numba.set_num_threads(old)


def _sparse_rows(P):
    """The term rows ``P (U, T)`` as sparse rows (their nonzero terms, in term order):
    with categorical features most terms of a row are 0 (a pair differs in few features),
    and skipping them leaves every sum unchanged (adding ``0 * x`` is exact for finite
    ``x``).  Returns ``(dense, rowptr, col, val)``."""
    nz = P != 0.0
    rowptr = np.zeros(P.shape[0] + 1, dtype=np.int64)
    np.cumsum(nz.sum(axis=1), out=rowptr[1:])
    rows, col = np.nonzero(nz)
    return (bool(nz.all()), rowptr.astype(np.uint64), col.astype(np.uint64),
            P[rows, col].astype(np.float64))


def _corrections(lr, max_steps):
    """AdamW's bias corrections of each step, float32 of float64 values: ``(sqrt(1 −
    β2^t), lr / (1 − β1^t))``."""
    t = np.arange(1, max(max_steps, 1) + 1, dtype=np.float64)
    corr = np.stack([np.sqrt(1.0 - ADAM_BETA2 ** t), lr / (1.0 - ADAM_BETA1 ** t)], axis=1)
    return np.ascontiguousarray(corr[:max_steps], dtype=np.float32)


_NO_BLOCKS = (np.zeros((1, 1), np.int64), np.zeros((1, 1)), np.zeros((1, 1, 1)),
              np.zeros((1, 1)), np.zeros((1, 1)))



def value_and_grad(A, constraint, k, l, P, counts, targets, strength):
    """The first step of :func:`train` (for tests): soft Spearman ``(M,)`` and gradient
    ``(M, m, m)`` (float32) of models ``A`` on a grouped batch: ``P (U, T)`` term rows,
    ``counts (U,)`` or ``(M, U)``, ``targets (M, U)``."""
    A = np.array(A, dtype=np.float32, order="C")
    M = A.shape[0]
    P = _f64(P)
    U = P.shape[0]
    counts = _f64(counts).reshape(-1, U)
    targets = _f64(np.broadcast_to(targets, (M, U)))
    k = np.ascontiguousarray(k, dtype=np.int64)
    l = np.ascontiguousarray(l, dtype=np.int64)
    rho = np.empty(M)
    grad = np.empty_like(A)
    dense, rowptr, col, val = _sparse_rows(P)
    _train_models(A, k, l, dense, P, rowptr, col, val, counts, targets, False, *_NO_BLOCKS,
                  CONSTRAINT_CODES[constraint], float(strength), 0.0, 1, _corrections(1e-3, 1),
                  np.zeros(M, np.int64), np.zeros(M, np.bool_), np.zeros(M),
                  np.zeros((1, 1), np.float32), False, rho, grad)
    return rho, grad


def train(data, m, fit_kw, dev, dtype, history=True):
    """The training of grouped designs on the CPU, compiled (the backend interface of
    :mod:`~mlem_neuro.core.training.backends`); returns the
    :class:`~mlem_neuro.core.training.stackfit.StackFit` the torch loop returns."""
    from .metric import init_params, make_W
    from .stackfit import StackFit

    constraint = fit_kw["constraint"]
    M = int(data.M)
    A = np.ascontiguousarray(init_params(M, m, constraint, dev, dtype).numpy(),
                             dtype=np.float32)
    n_iter = np.zeros(M, dtype=np.int64)
    converged = np.zeros(M, dtype=np.bool_)
    best = np.full(M, -np.inf)
    max_steps = int(fit_kw["max_steps"])
    hist = np.empty((M, max_steps) if history else (1, 1), dtype=np.float32)
    if M:
        k = np.ascontiguousarray(np.asarray(data.k), dtype=np.int64)
        l = np.ascontiguousarray(np.asarray(data.l), dtype=np.int64)
        corr = _corrections(float(fit_kw["lr"]), max_steps)
        allowed = fit_kw.get("threads", 1)         # the runtime's (engine._train)
        common = (CONSTRAINT_CODES[constraint], float(SOFT_RANK_STRENGTH),
                  float(fit_kw["tol"]), int(fit_kw["patience"]), corr, n_iter, converged,
                  best, hist, bool(history), np.zeros(0), np.zeros((0, m, m), np.float32))
        if data.full:
            P, counts, targets = data.numpy_batch()
            P, targets = _f64(P), _f64(targets)
            U = P.shape[0]
            counts = _f64(counts).reshape(-1, U)
            if targets.shape != (M, U) or counts.shape[0] not in (1, M):
                raise RuntimeError(f"compiled: unexpected batch shapes {P.shape}, "
                                   f"{counts.shape}, {targets.shape} for {M} models")
            dense, rowptr, col, val = _sparse_rows(P)
            _run(allowed, A, k, l, dense, P, rowptr, col, val, counts, targets, False,
                 *_NO_BLOCKS, *common)
        else:
            _train_blocks(data, A, k, l, max_steps, n_iter, common, allowed)
    with torch.no_grad():
        W = make_W(torch.from_numpy(A), constraint)
    if history:
        hist = hist[:, :int(n_iter.max()) if M else 0].astype(np.float64)
    return StackFit(W=W.double().numpy(), n_iter=n_iter, converged=converged,
                    history=hist if history else None, best_score=best,
                    batch_size=int(data.b), full_batch=bool(data.full), backend=NAME,
                    lr=fit_kw["lr"], patience=fit_kw["patience"])


def _train_blocks(data, A, k, l, max_steps, n_iter, common, allowed=1):
    """The grid's mini-batches of blocks (:class:`~mlem_neuro.core.training.quantise.GridBlocks`):
    every step's blocks are drawn before training, from the stream the torch loop draws
    them from; the stream is then left where that loop leaves it (one draw per step of
    the longest-training model); ``allowed``: the runtime's threads (:func:`threads_for`)."""
    P, bt = data.block_tables()
    grid = bt.blocks
    M = A.shape[0]
    P = _f64(P)
    U = P.shape[0]
    Cb = _f64(grid.C.cpu().numpy())
    Tb = _f64(bt.T.cpu().numpy().transpose(0, 2, 1))
    S1 = _f64(bt.S1.cpu().numpy())
    S2 = _f64(bt.S2.cpu().numpy())
    K = Cb.shape[1]
    if Cb.shape[0] != U or Tb.shape != (M, K, U) or S1.shape != (M, K) or K > 64:
        raise RuntimeError(f"compiled: unexpected block tables {Cb.shape}, {Tb.shape}, "
                           f"{S1.shape} for {M} models and {U} groups")
    rng = bt.rng
    state = rng.bit_generator.state
    draws = np.ascontiguousarray(grid.draw_blocks(rng, max_steps), dtype=np.int64)
    dense, rowptr, col, val = _sparse_rows(P)
    _run(allowed, A, k, l, dense, P, rowptr, col, val, np.zeros((1, U)), np.zeros((1, U)),
         True, draws, Cb, Tb, S1, S2, *common)
    rng.bit_generator.state = state
    grid.draw_blocks(rng, int(n_iter.max()))


