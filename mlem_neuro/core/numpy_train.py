"""The training loop of grouped designs on the CPU in numpy, with the gradient by hand.

With categorical features a training step works on ``(models × distinct rows)`` arrays of
a few numbers per model, so on the CPU its cost is mostly fixed: dozens of small torch
operations, the autograd graph and its backward pass.  Analyses spend most of their
training time in that fixed cost: a stack runs as long as its slowest model (the
time-resolved design of ``benchmarks/bench_train_loops.py``: median 156 steps, 99th
percentile 724).  This module runs the same steps in numpy: the metric
``W`` from the parameters, the term weights, the predictions, the grouped soft Spearman
(:class:`~mlem_neuro.core.tied._SoftSpearmanPAV`'s forward and backward), the gradient
back to the parameters by hand, AdamW without weight decay and the stopping rule of
:mod:`mlem_neuro.core.engine`.  Measured by that benchmark: 2.3x faster on the
time-resolved analysis, 1.9x on a searchlight, 1.3x with thousands of null models.

The numbers are those of the torch loop up to float32 rounding (the parameters and the
metric are float32 as there; predictions and soft ranks float64):
``tests/test_numpy_train.py`` compares the two loops. Gradient, for ``W = W0 / ‖W0‖_F``
and the term weights ``w_t = W[k_t, l_t]``, ``q = P w``: ``∂/∂W0 = (G − W ⟨G, W⟩) / ‖W0‖``
with ``G`` the gradient scattered to ``(k_t, l_t)``; ``spd``: ``W0 = L Lᵀ``,
``∂/∂L = (G0 + G0ᵀ) L``, strict lower part to ``A``, diagonal times ``sigmoid``
(softplus); ``diagonal``: ``W0 = diag(softplus(a))``; ``none``: ``W0 = (A + Aᵀ) / 2``.
"""
from __future__ import annotations

import types

import numpy as np
import torch

from . import tied
from .constants import ADAM_BETA1 as _BETA1
from .constants import ADAM_BETA2 as _BETA2
from .constants import ADAM_EPS as _ADAM_EPS
from .metric import init_params, make_W

_Q_EPS = 1e-12


def available(data, dev):
    """Whether :func:`train` can run ``data``'s steps (grouped designs, CPU, scipy's
    pool-adjacent-violators and the fused soft Spearman)."""
    return (dev.type == "cpu" and data.grouped and tied.USE_FUSED
            and tied._scipy_pav() is not None)


def _softplus(x):
    # torch's softplus (beta 1, threshold 20): x itself above 20
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0)))).astype(x.dtype)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)


def _metric(A, constraint):
    """``(W, W0 norm, L)`` of parameters ``A (M, m, m)`` (as :func:`metric.make_W`)."""
    m = A.shape[-1]
    diag = np.arange(m)
    if constraint == "spd":
        L = np.tril(A, -1)
        L[:, diag, diag] = _softplus(A[:, diag, diag])
        W0 = L @ L.transpose(0, 2, 1)
    elif constraint == "diagonal":
        L = None
        W0 = np.zeros_like(A)
        W0[:, diag, diag] = _softplus(A[:, diag, diag])
    else:
        L = None
        W0 = 0.5 * (A + A.transpose(0, 2, 1))
    norm = np.sqrt((W0 * W0).sum(axis=(1, 2)))[:, None, None]
    return W0 / np.maximum(norm, 1e-12), norm, L


def value_and_grad(A, constraint, k, l, P, counts, targets, strength):
    """Soft Spearman ``(M,)`` (float64) of models ``A`` on a grouped batch and its gradient
    ``(M, m, m)`` with respect to ``A`` (``A``'s dtype).

    ``P (U, T)``: term rows of the groups; ``counts``: ``(U,)`` or ``(M, U)``;
    ``targets (M, U)``: sums of standardised target ranks.
    """
    W, norm, L = _metric(A, constraint)
    q = W[:, k, l].astype(np.float64) @ P.T
    if constraint == "none":
        root = np.sqrt(np.abs(q) + _Q_EPS)
        pred = q / root
        dpred = (0.5 * np.abs(q) + _Q_EPS) / (root * root * root)
    else:
        pred = np.sqrt(np.maximum(q, _Q_EPS))
        dpred = np.where(q >= _Q_EPS, 0.5 / pred, 0.0)
    ctx = types.SimpleNamespace()
    rho = tied._SoftSpearmanPAV.forward(ctx, torch.from_numpy(pred), torch.from_numpy(counts),
                                        torch.from_numpy(targets), strength).numpy()
    g_pred = tied._SoftSpearmanPAV.backward(
        ctx, torch.ones(len(rho), dtype=torch.float64))[0].numpy()
    g_w = ((g_pred * dpred) @ P).astype(A.dtype)
    G = np.zeros_like(A)
    G[:, k, l] = g_w
    G0 = (G - W * (G * W).sum(axis=(1, 2))[:, None, None]) / np.maximum(norm, 1e-12)
    m = A.shape[-1]
    diag = np.arange(m)
    grad = np.zeros_like(A)
    if constraint == "spd":
        gL = (G0 + G0.transpose(0, 2, 1)) @ L
        grad = np.tril(gL, -1)
        grad[:, diag, diag] = gL[:, diag, diag] * _sigmoid(A[:, diag, diag])
    elif constraint == "diagonal":
        grad[:, diag, diag] = G0[:, diag, diag] * _sigmoid(A[:, diag, diag])
    else:
        grad = 0.5 * (G0 + G0.transpose(0, 2, 1))
    return rho, grad


def train(data, m, fit_kw, dev, dtype, history=True):
    """:func:`mlem_neuro.core.engine._train` for grouped designs on the CPU (see the
    module); returns the same :class:`~mlem_neuro.core.engine.StackFit`."""
    from .constants import SOFT_RANK_STRENGTH
    from .stackfit import StackFit

    constraint = fit_kw["constraint"]
    A = init_params(data.M, m, constraint, dev, dtype).numpy()
    M, f = A.shape[0], A.dtype.type
    mom, vel = np.zeros_like(A), np.zeros_like(A)
    best = np.full(M, -np.inf, dtype=A.dtype)
    ref = best.copy()
    best_A = A.copy()
    since = np.zeros(M, dtype=np.int64)
    n_iter = np.zeros(M, dtype=np.int64)
    rows = []
    patience, tol, lr = fit_kw["patience"], fit_kw["tol"], fit_kw["lr"]
    idx = np.arange(M)
    for step in range(fit_kw["max_steps"]):
        data.next_batch(torch.from_numpy(idx))
        P, counts, targets = data.numpy_batch()
        rho, grad = value_and_grad(A[idx], constraint, data.k, data.l, P, counts, targets,
                                   SOFT_RANK_STRENGTH)
        r = rho.astype(A.dtype)
        # the stopping rule (engine._EarlyStopping), before the update
        better = r > best[idx]
        won = idx[better]
        best_A[won] = A[won]
        best[won] = r[better]
        improved = r > ref[idx] + tol
        ref[idx[improved]] = r[improved]
        since[idx] = np.where(improved, 0, since[idx] + 1)
        n_iter[idx] += 1
        if history:
            row = np.full(M, np.nan, dtype=A.dtype)
            row[idx] = r
            rows.append(row)
        keep = since[idx] < patience
        # AdamW without weight decay on the minimised -rho (engine._MaskedAdamW)
        g = -grad
        t = step + 1
        mm = mom[idx] * f(_BETA1) + f(1 - _BETA1) * g
        vv = vel[idx] * f(_BETA2) + f(1 - _BETA2) * g * g
        mom[idx], vel[idx] = mm, vv
        denom = np.sqrt(vv) / f((1 - _BETA2 ** t) ** 0.5) + f(_ADAM_EPS)
        A[idx] = A[idx] - f(lr / (1 - _BETA1 ** t)) * mm / denom
        if not keep.all():
            idx = idx[keep]
            data.drop(torch.from_numpy(keep))
        if len(idx) == 0:
            break
    with torch.no_grad():
        W = make_W(torch.from_numpy(best_A), constraint)
    return StackFit(W=W.double().numpy(), n_iter=n_iter, converged=since >= patience,
                    history=np.stack(rows, axis=1).astype(np.float64) if history else None,
                    best_score=best.astype(np.float64), batch_size=int(data.b),
                    full_batch=bool(data.full))

