"""The torch backend: the training loop that trains any design on any device.

All models of a stack step together in one tensor program: each step computes every
active model's soft Spearman on the step's batch (the batch object's
``soft_spearman``), autograd gives the gradient, and AdamW without weight decay (torch's
defaults; :class:`_MaskedAdamW`) updates the rows of the models still training.
Per-model early stopping is done by masking (:class:`_EarlyStopping`): a stopped model
leaves the active index set, so its parameters are held and later steps cost only what
the models still training need, never a Python loop over models.

It is the backend of per-pair designs (numeric features without the grid, mini-batches of
pairs) and of every design on a GPU; :mod:`~mlem_neuro.core.training.compiled` trains
grouped designs on the CPU with the same numbers to float32 rounding, and
:mod:`~mlem_neuro.core.training.reference` is the training written for clarity that both
are tested against (``tests/test_backends.py``).  The batch object (``data``) is the
engine's (``_StepTargets`` or :class:`~mlem_neuro.core.training.engine.GroupedTargets`),
read through its public interface only.
"""
from __future__ import annotations

import torch

from ..constants import ADAM_BETA1 as _BETA1
from ..constants import ADAM_BETA2 as _BETA2
from ..constants import ADAM_EPS as _ADAM_EPS
from .metric import init_params, make_W, term_weights
from .stackfit import StackFit

#: the name results record for this backend (with the device's type, e.g. ``"torch (cuda)"``)
NAME = "torch ({device})"


class _MaskedAdamW:
    """AdamW (weight_decay=0, torch's defaults) stepping only the rows of active models."""

    def __init__(self, A, lr):
        self.lr = lr
        self.m = torch.zeros_like(A)
        self.v = torch.zeros_like(A)

    def step(self, A, idx, grad, t):
        """Update ``A[idx]`` in place; every active model has taken ``t`` steps."""
        mm = self.m[idx].mul_(_BETA1).add_(grad, alpha=1 - _BETA1)
        vv = self.v[idx].mul_(_BETA2).addcmul_(grad, grad, value=1 - _BETA2)
        self.m[idx], self.v[idx] = mm, vv
        denom = (vv.sqrt() / (1 - _BETA2 ** t) ** 0.5).add_(_ADAM_EPS)
        A[idx] = A[idx] - (self.lr / (1 - _BETA1 ** t)) * mm / denom


class _EarlyStopping:
    """Best state, steps since the last improvement and history of every model.

    Two scores per model: ``best``, the highest training score seen, whose state
    ``best_A`` is kept and restored; and ``ref``, the score of the last step that improved
    on ``ref`` by more than ``tol``, which resets the patience counter.  Improvements
    smaller than ``tol`` thus move the kept state without postponing the stop.
    """

    def __init__(self, A, patience, tol, history=True):
        M = A.shape[0]
        self.keep_history = history
        self.patience, self.tol = patience, tol
        self.best = torch.full((M,), -float("inf"), device=A.device, dtype=A.dtype)
        self.ref = self.best.clone()
        self.best_A = A.clone()
        self.since = torch.zeros(M, dtype=torch.long, device=A.device)
        self.n_iter = torch.zeros(M, dtype=torch.long, device=A.device)
        self.history = []

    def update(self, A, idx, r):
        """Record scores ``r`` of the active models (before their update); return keep."""
        better = r > self.best[idx]
        won = idx[better]
        self.best_A[won] = A[won]                  # the state that scored r (a copy)
        self.best[won] = r[better]
        improved = r > self.ref[idx] + self.tol
        self.ref[idx[improved]] = r[improved]
        self.since[idx] = torch.where(improved, torch.zeros_like(r, dtype=torch.long),
                                      self.since[idx] + 1)
        self.n_iter[idx] += 1
        if self.keep_history:
            row = torch.full_like(self.best, float("nan"))
            row[idx] = r
            self.history.append(row)
        return self.since[idx] < self.patience


def train(data, m, fit_kw, dev, dtype, history=True):
    """Train ``data.M`` models of ``m`` features on the batches of ``data`` (a batch object
    of :mod:`~mlem_neuro.core.training.engine`) with ``fit_kw`` (the options' training
    keywords, the step rule resolved); return a
    :class:`~mlem_neuro.core.training.stackfit.StackFit`."""
    constraint = fit_kw["constraint"]
    A = init_params(data.M, m, constraint, dev, dtype)
    adam = _MaskedAdamW(A, fit_kw["lr"])
    stop = _EarlyStopping(A, fit_kw["patience"], fit_kw["tol"], history)
    idx = torch.arange(data.M, device=dev)            # models still training
    for step in range(fit_kw["max_steps"]):
        data.next_batch(idx)
        A_act = A[idx].requires_grad_(True)
        rho = data.soft_spearman(term_weights(make_W(A_act, constraint), data.k, data.l),
                                 constraint)
        (-rho.sum()).backward()
        with torch.no_grad():
            keep = stop.update(A, idx, rho.detach())
            adam.step(A, idx, A_act.grad, step + 1)
            if not bool(keep.all()):
                idx = idx[keep]                   # stopped models leave the computation
                data.drop(keep)
        if len(idx) == 0:
            break
    with torch.no_grad():
        W = make_W(stop.best_A, constraint)
    return StackFit(W=W.cpu().double().numpy(), n_iter=stop.n_iter.cpu().numpy(),
                    converged=(stop.since >= fit_kw["patience"]).cpu().numpy(),
                    history=(torch.stack(stop.history, dim=1).cpu().double().numpy()
                             if history else None),
                    best_score=stop.best.cpu().double().numpy(), batch_size=int(data.b),
                    full_batch=bool(data.full),
                    backend=NAME.format(device=torch.device(dev).type),
                    lr=fit_kw["lr"], patience=fit_kw["patience"])
