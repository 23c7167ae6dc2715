"""The reference backend: MLEM's training written for clarity, not speed.

Every other backend is tested against this one (``tests/test_backends.py``).  It is what
the method says, with public building blocks only:

* each model has its own parameter tensor ``A (m, m)`` and its own
  :class:`torch.optim.AdamW` (weight decay 0, the package's betas and eps);
* a step maps ``A`` to the metric ``W`` (:func:`~mlem_neuro.core.training.metric.make_W`), predicts
  every pair of the step's batch, ``sqrt(dᵀ W d)`` (a signed root when ``W`` is
  unconstrained), and scores the predictions with a soft Spearman: predictions
  standardised and scaled to the spread of the ranks ``1..n``, :func:`torchsort.soft_rank`
  (l2, the package's strength), standardised and correlated with the standardised exact
  ranks of the neural distances; autograd gives the gradient;
* pairs that share their feature distances (categorical designs) are trained as the pairs
  themselves: each group of identical pairs is expanded back to its pairs (equal
  predictions get equal soft ranks, so the group's target sum is spread evenly over its
  pairs);
* the stopping rule: a model keeps the state of its best training score; it stops when its
  score has not risen by more than ``tol`` above the last such rise for ``patience`` steps.

The batches come from the same stream as the other backends' (the engine's batch object,
read through its public methods: ``next_batch``, ``model_batch``, ``drop``), so
mini-batch fits are comparable step by step.  One model at a time, one step at a time:
slow; meant for tests and for reading.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torchsort

from ..constants import ADAM_BETA1, ADAM_BETA2, ADAM_EPS, SOFT_RANK_STRENGTH
from .metric import init_params, make_W, predict
from .stackfit import StackFit

#: the name results record for this backend
NAME = "reference (torch autograd, torchsort.soft_rank, AdamW)"
#: groups with fewer pairs than this in a model's batch are absent from it (the batch
#: objects keep absent groups with a vanishing weight instead of dropping them)
_ABSENT = 0.5


def soft_spearman(pred, target_z, strength=SOFT_RANK_STRENGTH):
    """Soft Spearman of predictions ``pred (n,)`` with standardised target ranks
    ``target_z (n,)`` (centred, unit norm)."""
    n = pred.shape[0]
    x = pred - pred.mean()
    x = x / x.norm().clamp_min(1e-12) * (math.sqrt(n) * n / math.sqrt(12.0))
    r = torchsort.soft_rank(x[None], regularization_strength=strength)[0]
    r = r - r.mean()
    r = r / r.norm().clamp_min(1e-12)
    return (r * target_z.to(r.dtype)).sum()


def _model_batch(data, j):
    """Term rows ``(n, T)`` and standardised target ranks ``(n,)`` of the pairs of the
    ``j``-th active model's current batch (groups of identical pairs expanded to their
    pairs)."""
    P, counts, sums = data.model_batch(j)
    if counts is None:                             # per pair: each row one pair
        return P.double(), sums.double()
    counts = counts.double()
    present = counts > _ABSENT
    reps = torch.round(counts[present]).long()
    per_pair = (sums.double()[present] / counts[present])
    return (P.double()[present].repeat_interleave(reps, dim=0),
            per_pair.repeat_interleave(reps))


def train(data, m, fit_kw, dev, dtype, history=True):
    """Train ``data.M`` models of ``m`` features (the backend interface of
    :mod:`~mlem_neuro.core.training.backends`) and return a
    :class:`~mlem_neuro.core.training.stackfit.StackFit`."""
    constraint, patience, tol = fit_kw["constraint"], fit_kw["patience"], fit_kw["tol"]
    M = int(data.M)
    start = init_params(M, m, constraint, dev, dtype)
    params = [start[i].clone().requires_grad_(True) for i in range(M)]
    optims = [torch.optim.AdamW([p], lr=fit_kw["lr"], betas=(ADAM_BETA1, ADAM_BETA2),
                                eps=ADAM_EPS, weight_decay=0.0, foreach=False)
              for p in params]
    best_A = start.clone()
    best = np.full(M, -np.inf)
    ref = np.full(M, -np.inf)
    since = np.zeros(M, dtype=np.int64)
    n_iter = np.zeros(M, dtype=np.int64)
    hist = []
    k = torch.as_tensor(np.asarray(data.k), device=dev)
    l = torch.as_tensor(np.asarray(data.l), device=dev)
    active = list(range(M))
    for _ in range(fit_kw["max_steps"]):
        if not active:
            break
        data.next_batch(torch.as_tensor(active, device=dev))
        row = np.full(M, np.nan)
        keep = []
        for j, i in enumerate(active):
            P, target = _model_batch(data, j)
            W = make_W(params[i][None], constraint)[0]
            pred = predict(P @ W[k, l].double(), constraint)
            rho = soft_spearman(pred, target)
            score = float(rho.detach().to(dtype))      # as the training dtype records it
            if score > best[i]:
                best[i] = score
                best_A[i] = params[i].detach()
            if score > ref[i] + tol:
                ref[i], since[i] = score, 0
            else:
                since[i] += 1
            n_iter[i] += 1
            row[i] = score
            optims[i].zero_grad()
            (-rho).backward()
            optims[i].step()
            keep.append(since[i] < patience)
        hist.append(row)
        still = torch.as_tensor(keep, device=dev)
        if not bool(still.all()):
            data.drop(still)
        active = [i for i, kept in zip(active, keep) if kept]
    with torch.no_grad():
        W = make_W(best_A, constraint)
    return StackFit(W=W.cpu().double().numpy(), n_iter=n_iter, converged=since >= patience,
                    history=np.stack(hist, axis=1) if history and hist else
                    (np.zeros((M, 0)) if history else None),
                    best_score=best, batch_size=int(data.b), full_batch=bool(data.full),
                    backend=NAME, lr=fit_kw["lr"], patience=fit_kw["patience"])
