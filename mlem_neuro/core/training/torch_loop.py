"""The torch backend: the training loop that trains any design on any device.

All models of a stack step together in one tensor program: each step computes every
model's soft Spearman on the step's batch (the batch object's ``soft_spearman``),
autograd gives the gradient, and AdamW without weight decay (torch's defaults) updates
the models still training.  The state of the models in the computation (parameters,
AdamW's moments, the stopping rule's scores and counters, the best state) is held row by
row (:class:`_Rows`); every update is masked by whether a row still trains, so a step reads
nothing back to the host.

Per-model early stopping: a model whose patience has run out is held (masked) until the
next check, where the host reads which rows still train and the stopped ones leave the
computation (:meth:`_Rows.subset`, ``data.drop``), so later steps cost only what the
models still training need.  The check comes every step on the CPU (a read there costs
nothing) and every :data:`~mlem_neuro.core.constants.GPU_CHECK_EVERY` steps on a GPU,
where each read waits for the device; the fits are the same either way (a held row is
not changed; ``tests/test_engine.py`` checks it).

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
from ..constants import GPU_CHECK_EVERY
from . import graphs
from .metric import init_params, make_W, term_weights
from .stackfit import StackFit

#: the name results record for this backend (with the device's type, e.g. ``"torch (cuda)"``)
NAME = "torch ({device})"


def check_every(dev):
    """Steps between the host's checks of which models still train: 1 on the CPU,
    :data:`GPU_CHECK_EVERY` on a GPU."""
    return 1 if torch.device(dev).type == "cpu" else max(1, int(GPU_CHECK_EVERY))


class _Rows:
    """The models in the computation, one row each: parameters ``A``, AdamW's moments
    ``m, v``, and the stopping rule's state.

    Two scores per model: ``best``, the highest training score seen, whose state
    ``best_A`` is kept and restored; and ``ref``, the score of the last step that improved
    on ``ref`` by more than ``tol``, which resets the patience counter ``since``.
    Improvements smaller than ``tol`` thus move the kept state without postponing the
    stop.  A row trains while ``since < patience``; a row that has stopped is held: no
    update changes it.
    """

    FIELDS = ("A", "m", "v", "best", "ref", "since", "n_iter", "best_A")

    def __init__(self, idx, patience, tol, **state):
        self.idx, self.patience, self.tol = idx, patience, tol
        for name in self.FIELDS:
            setattr(self, name, state[name])

    @classmethod
    def start(cls, A, patience, tol):
        M = A.shape[0]
        best = torch.full((M,), -float("inf"), device=A.device, dtype=A.dtype)
        zeros = torch.zeros(M, dtype=torch.long, device=A.device)
        return cls(torch.arange(M, device=A.device), patience, tol, A=A,
                   m=torch.zeros_like(A), v=torch.zeros_like(A), best=best,
                   ref=best.clone(), since=zeros, n_iter=zeros.clone(), best_A=A.clone())

    def __len__(self):
        return self.idx.shape[0]

    def training(self):
        """Whether each row still trains (a device tensor; reading it is a host sync)."""
        return self.since < self.patience

    def record(self, r):
        """Record the scores ``r`` of the rows (before their update), held rows
        excepted; return the mask of the rows that trained this step."""
        live = self.training()
        better = live & (r > self.best)
        self.best_A = torch.where(better[:, None, None], self.A, self.best_A)
        self.best = torch.where(better, r, self.best)
        improved = live & (r > self.ref + self.tol)
        self.ref = torch.where(improved, r, self.ref)
        self.since = torch.where(improved, torch.zeros_like(self.since),
                                 self.since + live.long())
        self.n_iter = self.n_iter + live.long()
        return live

    def update(self, rho, grad, lr, t):
        """One step: record the scores ``rho`` (:meth:`record`), then AdamW
        (:meth:`adam`) at step count ``t``; return the mask of the rows that trained."""
        live = self.record(rho)
        self.adam(grad, live, lr, t)
        return live

    def adam(self, grad, live, lr, t):
        """AdamW (weight_decay=0) on the rows that trained this step, ``t`` steps in
        (an int, or a 0-dim device tensor in a captured step), ``grad`` the gradient of
        the loss (minus the scores)."""
        mask = live[:, None, None]
        m = (self.m * _BETA1).add_(grad, alpha=1 - _BETA1)
        v = (self.v * _BETA2).addcmul_(grad, grad, value=1 - _BETA2)
        denom = (v.sqrt() / (1 - _BETA2 ** t) ** 0.5).add_(_ADAM_EPS)
        A = self.A - (lr / (1 - _BETA1 ** t)) * m / denom
        self.m = torch.where(mask, m, self.m)
        self.v = torch.where(mask, v, self.v)
        self.A = torch.where(mask, A, self.A)

    def subset(self, keep):
        """The rows ``keep`` (a boolean mask) only."""
        return _Rows(self.idx[keep], self.patience, self.tol,
                     **{name: getattr(self, name)[keep] for name in self.FIELDS})


class _Records:
    """Every model's final state, filled from the rows as they leave the computation,
    and the history of training scores (NaN where a model was not training)."""

    def __init__(self, rows, history):
        self.best_A = rows.best_A.clone()
        self.best = rows.best.clone()
        self.since = rows.since.clone()
        self.n_iter = rows.n_iter.clone()
        self.history = [] if history else None

    def step(self, rows, r, live):
        if self.history is not None:
            row = torch.full_like(self.best, float("nan"))
            row[rows.idx] = torch.where(live, r, torch.full_like(r, float("nan")))
            self.history.append(row)

    def store(self, rows):
        for name in ("best_A", "best", "since", "n_iter"):
            getattr(self, name)[rows.idx] = getattr(rows, name)


def _scores_and_grads(data, A, constraint, kt, lt):
    """Every row's soft Spearman on this batch and its gradient with respect to ``A``."""
    A = A.detach().requires_grad_(True)
    rho = data.soft_spearman(term_weights(make_W(A, constraint), kt, lt), constraint)
    (grad,) = torch.autograd.grad(-rho.sum(), A)
    return rho.detach(), grad


def train(data, m, fit_kw, dev, dtype, history=True):
    """Train ``data.M`` models of ``m`` features on the batches of ``data`` (a batch object
    of :mod:`~mlem_neuro.core.training.engine`) with ``fit_kw`` (the options' training
    keywords, the step rule resolved); return a
    :class:`~mlem_neuro.core.training.stackfit.StackFit`."""
    constraint, lr = fit_kw["constraint"], fit_kw["lr"]
    # the term indices on the device once (not copied from the host at every step)
    kt = torch.as_tensor(data.k, device=dev)
    lt = torch.as_tensor(data.l, device=dev)
    rows = _Rows.start(init_params(data.M, m, constraint, dev, dtype), fit_kw["patience"],
                       fit_kw["tol"])
    records = _Records(rows, history)
    every = check_every(dev)
    runner = graphs.runner(data, lambda A: _scores_and_grads(data, A, constraint, kt, lt),
                           lr, dev)
    step = 0
    while step < fit_kw["max_steps"] and len(rows):
        n = min(every, fit_kw["max_steps"] - step)
        if runner is not None and runner.failed is None:
            runner.run(rows, records, step, n)
        else:
            for s in range(step, step + n):
                data.next_batch(rows.idx)
                rho, grad = _scores_and_grads(data, rows.A, constraint, kt, lt)
                with torch.no_grad():
                    live = rows.update(rho, grad, lr, s + 1)
                    records.step(rows, rho, live)
        step += n
        keep = rows.training()
        if not bool(keep.all()):                       # the host's check
            records.store(rows)
            rows = rows.subset(keep)                   # stopped models leave
            data.drop(keep)
    records.store(rows)
    if runner is not None:
        runner.report()
    with torch.no_grad():
        W = make_W(records.best_A, constraint)
    hist = None
    if history:
        hist = (torch.stack(records.history, dim=1) if records.history
                else torch.zeros(data.M, 0, dtype=dtype))
        hist = hist.cpu().double().numpy()
    return StackFit(W=W.cpu().double().numpy(), n_iter=records.n_iter.cpu().numpy(),
                    converged=(records.since >= fit_kw["patience"]).cpu().numpy(),
                    history=hist, best_score=records.best.cpu().double().numpy(),
                    batch_size=int(data.b), full_batch=bool(data.full),
                    backend=NAME.format(device=torch.device(dev).type),
                    lr=lr, patience=fit_kw["patience"])
