"""The training kernels of grouped designs, in numba: each model of a stack trained to
its own stop, one model at a time (or chunks of models on numba's threads).

With categorical features and full batches (every training pair each step) a model's
steps depend on that model alone: its grouped predictions, counts and target sums; so do
they with the grid of numeric distances, whose mini-batches are unions of fixed blocks of
pairs drawn at random, the same blocks for every model at a step
(:class:`~mlem_neuro.core.training.quantise.GridBlocks`): every step's blocks are drawn
first, from the same stream.  :func:`_train_models` runs each model to its own stop: the
metric ``W`` from the parameters and AdamW in float32, the predictions and the grouped
soft Spearman in float64 (a weighted pool-adjacent-violators,
:class:`~mlem_neuro.core.ranks.grouped._SoftSpearmanPAV`'s forward and backward), the
gradient by hand and the stopping rule of :mod:`mlem_neuro.core.training.torch_loop`.
Gradient, for ``W = W0 / ‖W0‖_F`` and the term weights ``w_t = W[k_t, l_t]``, ``q = P
w``: ``∂/∂W0 = (G − W ⟨G, W⟩) / ‖W0‖`` with ``G`` the gradient scattered to ``(k_t,
l_t)``; ``spd``: ``W0 = L Lᵀ``, ``∂/∂L = (G0 + G0ᵀ) L``, strict lower part to ``A``,
diagonal times ``sigmoid`` (softplus); ``diagonal``: ``W0 = diag(softplus(a))``;
``none``: ``W0 = (A + Aᵀ) / 2``.  ``tests/test_compiled.py`` compares it with torch's
autograd, ``tests/test_backends.py`` with the reference backend.

The step's parts are helpers inlined by numba (``inline="always"``, in numba's IR, before
compiling), so the step compiles as one function.  Each array a helper takes still costs
numba two atomic reference counts per call (inlining binds it to a new variable), which
adds up with few groups (a step of 8 groups takes about 0.6 µs): the helpers take three
workspaces whole, ``F`` (float64 rows of the groups), ``I`` (int64 rows) and ``mats``
(the float32 ``m x m`` matrices), and index their rows by the constants below.  Measured
(one thread, the same arguments, alternating): with each row a separate argument a step
of 8 groups was 10 % slower than the step written out in one function; with the
workspaces, within 2 %, and so for 16 and 256 groups.

Part of the bottom layer (:mod:`mlem_neuro.core.kernels`): numpy arrays in and out, no
import of the package but its constants.  The torch-facing side (which designs it
trains, the arrays it is given, the threads) is
:mod:`mlem_neuro.core.training.compiled`.
"""
from __future__ import annotations

import numpy as np

from ..constants import (
    ADAM_BETA1,
    ADAM_BETA2,
    ADAM_EPS,
    BLOCK_VAR_EPS,
    COMPILED_COUNT_CACHE,
    NORM_EPS,
    PREDICT_EPS,
)
from ._numba import _inline, _jit, _kernel, prange

CONSTRAINT_CODES = {"spd": 0, "diagonal": 1, "none": 2}
_SPD, _DIAGONAL, _NONE = CONSTRAINT_CODES.values()
_EPS = NORM_EPS
_Q_EPS = PREDICT_EPS
_F0 = np.float32(0.0)
_F_HALF = np.float32(0.5)
_F_TWENTY = np.float32(20.0)            # torch's softplus threshold (x itself above it)
_F_NORM_EPS = np.float32(NORM_EPS)
_B1 = np.float32(ADAM_BETA1)
_B2 = np.float32(ADAM_BETA2)
_ONE_B1 = np.float32(1.0 - ADAM_BETA1)
_ONE_B2 = np.float32(1.0 - ADAM_BETA2)
_ADAM_EPS = np.float32(ADAM_EPS)
_ONE = np.uint64(1)


@_inline
def _softplus(x):
    # torch's softplus (beta 1, threshold 20), in float32
    if x > _F_TWENTY:
        return x
    return np.log1p(np.exp(min(x, _F_TWENTY)))


@_inline
def _sigmoid(x):
    return np.float32(1.0 / (1.0 + np.exp(-np.float64(x))))


# rows of the float64 workspace (U + 1 columns each)
(_XHAT, _S, _CS, _Y, _V, _WV, _T, _RC, _GR, _GS, _GP, _CC, _TC, _KEY, _PRED,
 _DPRED) = range(16)
_N_FLOAT_ROWS = 16
# rows of the int64 workspace (U + 1 columns each)
_ORDER, _BSTART, _PIDX, _POS, _OFULL = range(5)
_N_INT_ROWS = 5
# matrices of the float32 workspace (m x m each): the parameters, AdamW's moments, the
# Cholesky factor, W, its gradient, W0's gradient and the parameters' gradient
(_CUR, _MOM, _VEL, _L, _W, _G, _G0, _GRAD) = range(8)
_N_MATRICES = 8


@_jit
def _block_batch(i, step, new_model, draws, Cb, Tb, S1, S2, cached, counts_all, done, total,
                 part, out, F, I):
    """The batch of model ``i`` at a step on the grid's blocks: compact counts
    (``F[_CC]``) and standardised target sums (``F[_TC]``) of the present groups
    (``quantise._BlockTargets.draw``, then the groups with a positive count, listed in
    ``I[_PIDX]``, ``I[_POS]``).  A group's sum over the drawn blocks is taken over the
    fewer of the drawn blocks and the blocks left out (then subtracted from its total over
    all blocks).  The step's counts are computed by the first model to reach it and kept
    when ``cached``.  Returns ``(b, present groups)``."""
    U, K = Cb.shape
    nb = draws.shape[1]
    row = step if cached else 0
    if not cached or not done[step]:
        for u in range(U):
            acc = 0.0
            for j in range(nb):
                acc += Cb[u, draws[step, j]]
            counts_all[row, u] = acc
        if cached:
            done[step] = 1
    if new_model:
        for u in range(U):
            total[u] = 0.0
        for r in range(K):
            for u in range(U):
                total[u] += Tb[i, r, u]
    b = 0.0
    for u in range(U):
        b += counts_all[row, u]
    s1 = 0.0
    s2 = 0.0
    for j in range(nb):
        s1 += S1[i, draws[step, j]]
        s2 += S2[i, draws[step, j]]
    mean = s1 / b
    var = s2 - b * mean * mean
    norm = np.sqrt(var if var > BLOCK_VAR_EPS else BLOCK_VAR_EPS)
    Up = 0
    for u in range(U):
        if counts_all[row, u] > 0.0:
            I[_PIDX, Up] = u
            I[_POS, u] = Up
            Up += 1
        else:
            I[_POS, u] = -1
    use_out = 2 * nb > K
    n_sel = nb
    if use_out:
        mask = np.uint64(0)
        for j in range(nb):
            mask |= _ONE << np.uint64(draws[step, j])
        n_sel = 0
        for r in range(K):
            if not ((mask >> np.uint64(r)) & _ONE):
                out[n_sel] = r
                n_sel += 1
    for u in range(U):
        part[u] = 0.0
    for r in range(n_sel):
        blk = out[r] if use_out else draws[step, r]
        for u in range(U):
            part[u] += Tb[i, blk, u]
    inv_norm = 1.0 / norm
    for j in range(Up):
        g = I[_PIDX, j]
        tt = total[g] - part[g] if use_out else part[g]
        F[_CC, j] = counts_all[row, g]
        F[_TC, j] = (tt - counts_all[row, g] * mean) * inv_norm
    return b, Up


# ------------------------------------------------------ the parts of a step (inlined)

@_inline
def _metric(constraint, mats):
    """The metric ``mats[_W]`` of the parameters ``mats[_CUR]`` (float32,
    Frobenius-normalised; ``mats[_L]`` its Cholesky factor with ``spd``); returns the norm
    of ``W0`` (at least the norm epsilon), by which ``W0`` was divided."""
    m = mats.shape[1]
    if constraint == _SPD:
        for a in range(m):
            for e in range(m):
                if e < a:
                    mats[_L, a, e] = mats[_CUR, a, e]
                elif e == a:
                    mats[_L, a, e] = _softplus(mats[_CUR, a, a])
                else:
                    mats[_L, a, e] = _F0
        for a in range(m):
            for e in range(m):
                acc = _F0
                for r in range(min(a, e) + 1):
                    acc += mats[_L, a, r] * mats[_L, e, r]
                mats[_W, a, e] = acc
    elif constraint == _DIAGONAL:
        for a in range(m):
            for e in range(m):
                mats[_W, a, e] = _F0
            mats[_W, a, a] = _softplus(mats[_CUR, a, a])
    else:
        for a in range(m):
            for e in range(m):
                mats[_W, a, e] = _F_HALF * (mats[_CUR, a, e] + mats[_CUR, e, a])
    ss32 = _F0
    for a in range(m):
        for e in range(m):
            ss32 += mats[_W, a, e] * mats[_W, a, e]
    norm = np.sqrt(ss32)
    dnorm = norm if norm > _F_NORM_EPS else _F_NORM_EPS
    for a in range(m):
        for e in range(m):
            mats[_W, a, e] /= dnorm
    return dnorm


@_inline
def _predict(constraint, mats, k, l, tw, dense, P, rowptr, col, val, Up, F, I):
    """Predictions ``F[_PRED]`` of the ``Up`` present groups (rows ``I[_PIDX]``; sparse
    rows: the same sums) and their derivatives by the term sums, ``F[_DPRED]``."""
    T = k.shape[0]
    for t in range(T):
        tw[t] = np.float64(mats[_W, k[t], l[t]])
    for u in range(Up):
        q = 0.0
        row = I[_PIDX, u]
        if dense:
            for t in range(T):
                q += tw[t] * P[row, t]
        else:
            for e in range(rowptr[row], rowptr[row + 1]):
                q += tw[col[e]] * val[e]
        if constraint == _NONE:
            aq = abs(q)
            root = np.sqrt(aq + _Q_EPS)
            F[_PRED, u] = q / root
            F[_DPRED, u] = (0.5 * aq + _Q_EPS) / (root * root * root)
        else:
            pr = np.sqrt(q if q > _Q_EPS else _Q_EPS)
            F[_PRED, u] = pr
            F[_DPRED, u] = 0.5 / pr if q >= _Q_EPS else 0.0


@_inline
def _standardise(Up, b, F):
    """The predictions standardised over the batch's pairs (``F[_CC]`` counts) into
    ``F[_XHAT]``; returns ``1 / sigma``."""
    mean = 0.0
    for u in range(Up):
        mean += F[_PRED, u] * F[_CC, u]
    mean /= b
    ss = 0.0
    for u in range(Up):
        x = F[_PRED, u] - mean
        F[_XHAT, u] = x
        ss += x * x * F[_CC, u]
    sigma = np.sqrt(ss if ss > _EPS * _EPS else _EPS * _EPS)
    inv_sigma = 1.0 / sigma
    for u in range(Up):
        F[_XHAT, u] *= inv_sigma
    return inv_sigma


@_inline
def _order(U, Up, F, I):
    """``I[_ORDER]``: the present groups by decreasing ``F[_XHAT]``, by insertion sort
    from the model's previous order (``I[_OFULL]``, of all groups, updated): predictions
    move little between steps, so the order is nearly sorted."""
    j = 0
    for a in range(U):
        cc = I[_POS, I[_OFULL, a]]
        if cc >= 0:
            I[_ORDER, j] = cc
            F[_KEY, j] = F[_XHAT, cc]
            j += 1
    for a in range(1, Up):
        cur_o = I[_ORDER, a]
        kc = F[_KEY, a]
        j = a
        while j > 0 and F[_KEY, j - 1] < kc:
            I[_ORDER, j] = I[_ORDER, j - 1]
            F[_KEY, j] = F[_KEY, j - 1]
            j -= 1
        I[_ORDER, j] = cur_o
        F[_KEY, j] = kc
    j = 0
    for a in range(U):
        if I[_POS, I[_OFULL, a]] >= 0:
            I[_OFULL, a] = I[_PIDX, I[_ORDER, j]]
            j += 1


@_inline
def _soft_ranks(Up, b, kappa, F, I):
    """The soft ranks of the sorted groups (a weighted pool-adjacent-violators),
    centred and normalised into ``F[_RC]``, and the soft Spearman with the target sums
    ``F[_TC]``.  Returns ``(rho, 1 / norm of the ranks, blocks of the pool, sum of the
    targets)``."""
    start = 0.0
    tsum_all = 0.0
    for a in range(Up):
        o = I[_ORDER, a]
        ca = F[_CC, o]
        F[_S, a] = kappa * F[_XHAT, o]
        F[_CS, a] = ca
        F[_Y, a] = F[_S, a] - (b - start - (ca - 1.0) / 2.0)
        F[_T, a] = F[_TC, o]
        tsum_all += F[_T, a]
        start += ca
    # weighted pool-adjacent-violators, non-increasing, of F[_Y] with weights F[_CS]: blocks
    # hold their weighted sums and weights, compared by cross-multiplication (weights
    # are positive), so no merge divides
    nb = 0
    for a in range(Up):
        F[_V, nb] = F[_CS, a] * F[_Y, a]
        F[_WV, nb] = F[_CS, a]
        I[_BSTART, nb] = a
        nb += 1
        while nb > 1 and F[_V, nb - 2] * F[_WV, nb - 1] < F[_V, nb - 1] * F[_WV, nb - 2]:
            F[_V, nb - 2] += F[_V, nb - 1]
            F[_WV, nb - 2] += F[_WV, nb - 1]
            nb -= 1
    for a in range(nb):
        F[_V, a] /= F[_WV, a]
    I[_BSTART, nb] = Up
    rsum = 0.0
    for jb in range(nb):
        for a in range(I[_BSTART, jb], I[_BSTART, jb + 1]):
            F[_RC, a] = F[_S, a] - F[_V, jb]              # sorted soft ranks
            rsum += F[_RC, a] * F[_CS, a]
    nr = 0.0
    for a in range(Up):
        F[_RC, a] -= rsum / b
        nr += F[_CS, a] * F[_RC, a] * F[_RC, a]
    nr = np.sqrt(nr if nr > _EPS * _EPS else _EPS * _EPS)
    rho = 0.0
    inv_nr = 1.0 / nr
    for a in range(Up):
        F[_RC, a] *= inv_nr
        rho += F[_RC, a] * F[_T, a]
    return rho, inv_nr, nb, tsum_all


@_inline
def _backward(Up, nb, b, rho, kappa, inv_nr, inv_sigma, tsum_all, F, I):
    """The soft Spearman's gradient back to the predictions, into ``F[_GP]``."""
    for a in range(Up):
        F[_GR, a] = (F[_T, a] - F[_CS, a] * (tsum_all / b)
                     - F[_CS, a] * F[_RC, a] * rho) * inv_nr
    for jb in range(nb):
        gsum = 0.0
        csum = 0.0
        for a in range(I[_BSTART, jb], I[_BSTART, jb + 1]):
            gsum += F[_GR, a]
            csum += F[_CS, a]
        for a in range(I[_BSTART, jb], I[_BSTART, jb + 1]):
            F[_GS, I[_ORDER, a]] = (F[_GR, a] - F[_CS, a] * (gsum / csum)) * kappa
    gsum = 0.0
    gdot = 0.0
    for u in range(Up):
        gsum += F[_GS, u]
        gdot += F[_GS, u] * F[_XHAT, u]
    for u in range(Up):
        F[_GP, u] = (F[_GS, u] - F[_CC, u] * (gsum / b)
                     - F[_CC, u] * F[_XHAT, u] * gdot) * inv_sigma


@_inline
def _param_grad(constraint, dnorm, mats, k, l, tw, dense, P, rowptr, col, val, Up, F, I):
    """The gradient back from the predictions (``F[_GP]``) to the term weights, ``W0``
    (``mats[_G0]``) and the parameters, into ``mats[_GRAD]``."""
    m = mats.shape[1]
    T = k.shape[0]
    for a in range(m):
        for e in range(m):
            mats[_G, a, e] = _F0
    for t in range(T):
        tw[t] = 0.0
    for u in range(Up):
        g = F[_GP, u] * F[_DPRED, u]
        row = I[_PIDX, u]
        if dense:
            for t in range(T):
                tw[t] += g * P[row, t]
        else:
            for e in range(rowptr[row], rowptr[row + 1]):
                tw[col[e]] += g * val[e]
    for t in range(T):
        mats[_G, k[t], l[t]] = np.float32(tw[t])
    gdotw = _F0
    for a in range(m):
        for e in range(m):
            gdotw += mats[_G, a, e] * mats[_W, a, e]
    for a in range(m):
        for e in range(m):
            mats[_G0, a, e] = (mats[_G, a, e] - mats[_W, a, e] * gdotw) / dnorm
    for a in range(m):
        for e in range(m):
            mats[_GRAD, a, e] = _F0
    if constraint == _SPD:
        for a in range(m):
            for e in range(a + 1):
                acc = _F0
                for r in range(m):
                    acc += (mats[_G0, a, r] + mats[_G0, r, a]) * mats[_L, r, e]
                mats[_GRAD, a, e] = acc * _sigmoid(mats[_CUR, a, a]) if a == e else acc
    elif constraint == _DIAGONAL:
        for a in range(m):
            mats[_GRAD, a, a] = mats[_G0, a, a] * _sigmoid(mats[_CUR, a, a])
    else:
        for a in range(m):
            for e in range(m):
                mats[_GRAD, a, e] = _F_HALF * (mats[_G0, a, e] + mats[_G0, e, a])


@_inline
def _adamw(mats, bc2, step_size):
    """One AdamW step of the parameters ``mats[_CUR]`` (float32, ascending the soft
    Spearman) with the step's bias corrections."""
    m = mats.shape[1]
    for a in range(m):
        for e in range(m):
            g32 = -mats[_GRAD, a, e]
            mats[_MOM, a, e] = mats[_MOM, a, e] * _B1 + _ONE_B1 * g32
            mats[_VEL, a, e] = mats[_VEL, a, e] * _B2 + _ONE_B2 * g32 * g32
            denom = np.sqrt(mats[_VEL, a, e]) / bc2 + _ADAM_EPS
            mats[_CUR, a, e] = mats[_CUR, a, e] - step_size * mats[_MOM, a, e] / denom


# --------------------------------------------------------------------------- the loop

@_jit
def _train_models(A, k, l, dense, P, rowptr, col, val, counts, targets, use_blocks, draws,
                  Cb, Tb, S1, S2, constraint, strength, tol, patience, corr, n_iter,
                  converged, best_score, history, keep_history, first_rho, first_grad):
    """Train the models of ``A (M, m, m)`` (float32; the start, overwritten by the best
    state seen), each to its own stop.  Full batches: ``counts (1 or M, U)``, ``targets
    (M, U)``; blocks (``use_blocks``): ``draws (max_steps, nb)``, ``Cb (U, K)``, ``Tb (M,
    K, U)``, ``S1``, ``S2 (M, K)``.  ``corr (max_steps, 2)``: AdamW's bias corrections.
    ``first_rho (M,)`` and ``first_grad (M, m, m)`` (or empty) get each model's first
    soft Spearman and gradient (for tests).

    One step, in order: the metric ``W`` (float32, :func:`_metric`), the predictions of
    the present groups (:func:`_predict`), their soft Spearman (standardise, sort from
    the previous order, a weighted pool-adjacent-violators, centre and normalise the soft
    ranks: :func:`_standardise`, :func:`_order`, :func:`_soft_ranks`) and its gradient
    back to the parameters (:func:`_backward`, :func:`_param_grad`), the stopping rule
    and AdamW (:func:`_adamw`); the parts are inlined (the module's docstring)."""
    M, m = A.shape[0], A.shape[1]
    T = k.shape[0]
    U = rowptr.shape[0] - 1
    max_steps = corr.shape[0]
    keep_first = first_rho.shape[0] > 0
    # the workspaces, passed whole to the step's parts (rows taken once per stack: a
    # view taken or an array passed in the loop costs numba reference counts per step)
    mats = np.zeros((_N_MATRICES, m, m), np.float32)
    cur, mom, vel, grad = mats[_CUR], mats[_MOM], mats[_VEL], mats[_GRAD]
    F = np.zeros((_N_FLOAT_ROWS, U + 1))
    I = np.zeros((_N_INT_ROWS, U + 1), np.int64)
    tw = np.zeros(T + 1)
    ftol = np.float32(tol)
    if use_blocks:
        cached = max_steps * U <= COMPILED_COUNT_CACHE   # the steps' counts, kept
        counts_all = np.zeros((max_steps if cached else 1, U))
        done = np.zeros(max_steps if cached else 1, np.uint8)
        total = np.zeros(U)
        part = np.zeros(U)
        out = np.zeros(Cb.shape[1] + 1, np.int64)
    for i in range(M):
        b = 0.0
        Up = U
        if not use_blocks:                           # full batch: every group, each step
            ci = i if counts.shape[0] > 1 else 0
            for u in range(U):
                F[_CC, u] = counts[ci, u]
                F[_TC, u] = targets[i, u]
                b += counts[ci, u]
                I[_PIDX, u] = u
                I[_POS, u] = u
        for u in range(U):
            I[_OFULL, u] = u                       # a model's first sort: group order
        for a in range(m):
            for e in range(m):
                cur[a, e] = A[i, a, e]
                mom[a, e] = _F0
                vel[a, e] = _F0
        best = np.float32(-np.inf)
        ref = np.float32(-np.inf)
        since = 0
        n = 0
        for step in range(max_steps):
            if use_blocks:
                b, Up = _block_batch(i, step, step == 0, draws, Cb, Tb, S1, S2, cached,
                                     counts_all, done, total, part, out, F, I)
            dnorm = _metric(constraint, mats)
            _predict(constraint, mats, k, l, tw, dense, P, rowptr, col, val, Up, F, I)
            # -- soft Spearman of the predictions (F[_CC] counts, F[_TC] target sums)
            inv_sigma = _standardise(Up, b, F)
            kappa = np.sqrt(b) * b / np.sqrt(12.0) / strength
            _order(U, Up, F, I)
            rho, inv_nr, nb, tsum_all = _soft_ranks(Up, b, kappa, F, I)
            # -- backward: to the predictions, the term weights, W0 and the parameters
            _backward(Up, nb, b, rho, kappa, inv_nr, inv_sigma, tsum_all, F, I)
            _param_grad(constraint, dnorm, mats, k, l, tw, dense, P, rowptr, col, val, Up,
                        F, I)
            if keep_first and step == 0:
                first_rho[i] = rho
                for a in range(m):
                    for e in range(m):
                        first_grad[i, a, e] = grad[a, e]
            # -- the stopping rule (torch_loop._EarlyStopping) and AdamW
            rf = np.float32(rho)
            if rf > best:
                for a in range(m):
                    for e in range(m):
                        A[i, a, e] = cur[a, e]
                best = rf
            if rf > ref + ftol:
                ref = rf
                since = 0
            else:
                since += 1
            n += 1
            if keep_history:
                history[i, step] = rf
            _adamw(mats, corr[step, 0], corr[step, 1])
            if since >= patience:
                break
        if keep_history:
            for step in range(n, max_steps):
                history[i, step] = np.float32(np.nan)
        n_iter[i] = n
        converged[i] = since >= patience
        best_score[i] = np.float64(best)


@_kernel(nogil=True, error_model="numpy", parallel=True)
def _train_models_parallel(n_chunks, A, k, l, dense, P, rowptr, col, val, counts, targets,
                           use_blocks, draws, Cb, Tb, S1, S2, constraint, strength, tol,
                           patience, corr, n_iter, converged, best_score, history,
                           keep_history, first_rho, first_grad):
    """:func:`_train_models` on ``n_chunks`` chunks of the models, in parallel (numba's
    ``prange``): each model's steps depend on that model alone, so the fits are those of
    one thread, bit for bit."""
    M = A.shape[0]
    for c in prange(n_chunks):
        s = c * M // n_chunks
        e = (c + 1) * M // n_chunks
        # the per-model arrays are cut to the chunk; shared (or placeholder) ones are not
        _train_models(A[s:e], k, l, dense, P, rowptr, col, val, _rows(counts, s, e, M),
                      _rows(targets, s, e, M), use_blocks, draws, Cb, _rows(Tb, s, e, M),
                      _rows(S1, s, e, M), _rows(S2, s, e, M), constraint, strength, tol,
                      patience, corr, n_iter[s:e], converged[s:e], best_score[s:e],
                      _rows(history, s, e, M) if keep_history else history, keep_history,
                      _rows(first_rho, s, e, M), _rows(first_grad, s, e, M))


@_inline
def _rows(x, s, e, M):
    """Rows ``s:e`` of a per-model array (``M`` rows), else all of ``x``."""
    return x[s:e] if x.shape[0] == M else x[0:x.shape[0]]

