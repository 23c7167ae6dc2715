"""The training engine: fit a stack of ``M`` independent MLEM models in one tensor program.

All models share the stimuli, hence the pair feature distances; each has its own neural
distances (one row of an ``(M, n_pairs)`` block) and its own parameters ``A[m]``.  One step
computes every model's soft Spearman at once; per-model early stopping is done by masking:
a stopped model leaves the active index set, so its parameters are held and later steps cost
only what the models still training need, never a Python loop over models.  The update is
AdamW without weight decay (torch's defaults), applied to the active rows.

When the pairs' term rows take few distinct values (categorical designs), soft ranks are
computed on groups of identical pairs (:mod:`mlem_neuro.core.tied`), and mini-batch target
ranks come from one sort of all pairs per model (:class:`~mlem_neuro.core.spearman.
SubsetRanks`): no step sorts the batch.  Both give the same numbers as the per-pair path.
"""
from __future__ import annotations

from dataclasses import dataclass
import numbers

import numpy as np
import torch

from ..utils import check_device, check_random_state, logger
from .batch_size import select_batch_size
from .metric import (CONSTRAINTS, init_params, make_W, predict, term_index, term_matrix,
                     term_weights)
from .pairs import linear_to_pair, n_pairs, pair_indices, sample_pairs
from . import tied
from .spearman import (SOFT_RANK_STRENGTH, SubsetRanks, rankdata, soft_spearman,
                       standardize)


@dataclass
class StackFit:
    """What :func:`fit_stack` returns (numpy arrays on the CPU).

    Attributes
    ----------
    W : ndarray (M, m, m)
        Frobenius-normalised metric of each model (the best state seen in training).
    n_iter : ndarray of int (M,)
        Training steps each model ran.
    converged : ndarray of bool (M,)
        Whether the model stopped early (no improvement for ``patience`` steps).
    history : ndarray (M, n_steps)
        Training soft Spearman at each step (NaN once a model has stopped).
    best_score : ndarray (M,)
        Best training soft Spearman (the state kept in ``W``).
    batch_size : int
        Pairs per step.
    full_batch : bool
        Whether every step used all pairs (deterministic full-batch training).
    """

    W: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray
    history: np.ndarray
    best_score: np.ndarray
    batch_size: int
    full_batch: bool


#: elements (n_pairs * n_terms) up to which the pair term matrix is built once and gathered.
MAX_TERM_ELEMENTS = 5 * 10**7
#: elements (models * pairs) up to which target ranks come from one global sort per model.
MAX_RANKER_ELEMENTS = 2 * 10**7


class PairTerms:
    """Term matrices ``P`` (rows: pairs, columns: terms) of the training pairs.

    Built once for all pairs when it fits in memory (mini-batches then gather rows),
    otherwise computed per batch from the encoded features.
    """

    def __init__(self, enc_t, n, k, l):
        self.enc_t, self.n, self.k, self.l = enc_t, n, k, l
        self.all = None
        if n_pairs(n) * len(k) <= MAX_TERM_ELEMENTS:
            i, j = pair_indices(n)
            self.all = self._compute(i, j)

    def _compute(self, i, j):
        D = self.enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j))
        return term_matrix(D, self.k, self.l)

    def take(self, lin, i=None, j=None):
        """Rows for linear pair indices ``lin`` (``i, j`` computed when not given)."""
        if self.all is not None:
            return self.all[torch.as_tensor(lin, device=self.all.device)]
        if i is None:
            i, j = linear_to_pair(lin, self.n)
        return self._compute(i, j)


_BETA1, _BETA2, _ADAM_EPS = 0.9, 0.999, 1e-8


def resolve_batch_size(batch_size, terms, n, rng, groups=None):
    total = n_pairs(n)
    if isinstance(batch_size, str):
        if batch_size == "auto":
            return select_batch_size(terms.take, n, rng, groups=groups)
        if batch_size == "full":
            return total
        raise ValueError(f"batch_size must be 'auto', 'full' or an int >= 2; got "
                         f"{batch_size!r}")
    if isinstance(batch_size, (numbers.Integral, np.integer)) and not isinstance(batch_size,
                                                                                  bool):
        if batch_size < 2:
            raise ValueError(f"batch_size must be >= 2 pairs; got {batch_size}")
        return min(int(batch_size), total)
    raise TypeError(f"batch_size must be 'auto', 'full' or an int; got {batch_size!r}")


def fit_stack(enc, targets, *, constraint="spd", interactions=True, max_steps=1000,
              patience=50, lr=0.1, tol=1e-4, batch_size="auto", random_state=None,
              device="cpu", dtype=torch.float32):
    """Fit ``M`` MLEM models sharing stimuli and features.

    Parameters
    ----------
    enc : EncodedFeatures
        Encoded features of the ``n`` training stimuli.
    targets : NeuralTargets
        Neural distances of the ``M`` models on the same stimuli.
    constraint, interactions, max_steps, patience, lr, tol, batch_size, random_state, device
        As in :class:`mlem_neuro.MLEM`.

    Returns
    -------
    StackFit
    """
    dev = check_device(device)
    rng = check_random_state(random_state)
    if constraint not in CONSTRAINTS:
        raise ValueError(f"constraint must be one of {list(CONSTRAINTS)}; got {constraint!r}")
    n, m, M = enc.n_stimuli, enc.n_features, targets.n_models
    total = n_pairs(n)
    k, l = term_index(m, interactions and constraint != "diagonal")
    terms = PairTerms(enc.to_torch(dev, dtype), n, k, l)
    # few distinct term rows (categorical designs): work on groups of identical pairs
    groups = tied.distinct_rows(terms.all) if terms.all is not None else None
    b = resolve_batch_size(batch_size, terms, n, rng, groups)
    full = b >= total
    if full:
        i, j = pair_indices(n)
        if groups is None:
            Pt = terms.take(np.arange(total), i, j)

    # Grouped path: soft ranks over groups of pairs with identical term rows.
    if groups is not None:
        P_uniq, uid = groups
        P_uniq = P_uniq.double()
        n_groups = P_uniq.shape[0]
    # Exact within-batch target ranks from one sort per model (mini-batches).
    # (worth it while the pairs are at most ~8 batches: O(M P) per step vs O(M b log b))
    ranker = None
    if (not full and targets.full is not None and M * total <= MAX_RANKER_ELEMENTS
            and total <= 8 * b):
        ranker = SubsetRanks(targets.full.to(dev), None if groups is None else uid)
        ranker_rows = torch.arange(M, device=dev)    # ranker row of each active model
    if full:
        tz_all = standardize(rankdata(targets.take(np.arange(total), i, j).to(dev)))
        if groups is not None:
            counts = torch.bincount(uid, minlength=n_groups)
            t_active = torch.zeros(M, n_groups, dtype=torch.float64, device=dev).scatter_add_(
                1, uid.expand(M, total), tz_all.double())
        else:
            t_active = tz_all.to(dtype)           # rows follow the models still training

    A = init_params(M, m, constraint, dev, dtype)
    adam_m = torch.zeros_like(A)                 # AdamW moments (no weight decay)
    adam_v = torch.zeros_like(A)
    best = torch.full((M,), -float("inf"), device=dev, dtype=dtype)
    best_A = A.clone()
    since = torch.zeros(M, dtype=torch.long, device=dev)
    n_iter = torch.zeros(M, dtype=torch.long, device=dev)
    idx = torch.arange(M, device=dev)            # models still training
    history = []
    logger.debug("fit_stack: %d models, %d stimuli, %d features, %d terms, %s batches of %d "
                 "pairs, %s", M, n, m, len(k), "full" if full else "mini", b,
                 f"{n_groups} distinct term rows" if groups is not None else "expanded")
    for step in range(max_steps):
        if not full:
            lin = sample_pairs(rng, total, b)
            lin_t = torch.as_tensor(lin, device=dev)
            if groups is not None:
                u = uid[lin_t]
                counts = torch.bincount(u, minlength=n_groups)
            if ranker is not None and groups is not None:
                t_active = ranker.group_sums(lin_t, counts)[ranker_rows]
                tz = None
            elif ranker is not None:
                tz = standardize(ranker.ranks(lin_t)[ranker_rows])
            else:
                i, j = (None, None) if targets.full is not None else linear_to_pair(lin, n)
                tz = standardize(rankdata(targets.take(lin, i, j, models=idx).to(dev)))
            if groups is None:
                Pt = terms.take(lin)
                t_active = tz.to(dtype)
            elif tz is not None:
                t_active = torch.zeros(len(idx), n_groups, dtype=torch.float64,
                                       device=dev).scatter_add_(1, u.expand(len(idx), b), tz)
        A_act = A[idx].requires_grad_(True)
        tw = term_weights(make_W(A_act, constraint), k, l)
        if groups is not None:
            present = counts > 0
            if bool(present.all()):
                q = tw.double() @ P_uniq.T
                rho = tied.grouped_soft_spearman(predict(q, constraint), counts, t_active,
                                                 SOFT_RANK_STRENGTH)
            else:
                q = tw.double() @ P_uniq[present].T
                rho = tied.grouped_soft_spearman(predict(q, constraint), counts[present],
                                                 t_active[:, present], SOFT_RANK_STRENGTH)
            rho = rho.to(dtype)
        else:
            rho = soft_spearman(predict(tw @ Pt.T, constraint), t_active)
        (-rho.sum()).backward()
        with torch.no_grad():
            r = rho.detach()
            improved = r > best[idx] + tol
            won = idx[improved]
            best_A[won] = A[won]                  # the state that scored r (a copy)
            best[won] = r[improved]
            since[idx] = torch.where(improved, torch.zeros_like(r, dtype=torch.long),
                                     since[idx] + 1)
            n_iter[idx] += 1
            row = torch.full((M,), float("nan"), device=dev, dtype=dtype)
            row[idx] = r
            history.append(row)
            # AdamW step (weight_decay=0, torch's defaults) on the active models only;
            # every active model has taken the same number of steps.
            g = A_act.grad
            t = step + 1
            mm = adam_m[idx].mul_(_BETA1).add_(g, alpha=1 - _BETA1)
            vv = adam_v[idx].mul_(_BETA2).addcmul_(g, g, value=1 - _BETA2)
            adam_m[idx], adam_v[idx] = mm, vv
            denom = (vv.sqrt() / (1 - _BETA2 ** t) ** 0.5).add_(_ADAM_EPS)
            A[idx] = A_act.detach() - (lr / (1 - _BETA1 ** t)) * mm / denom
            keep = since[idx] < patience
            if not bool(keep.all()):
                idx = idx[keep]                   # stopped models leave the computation
                if full:
                    t_active = t_active[keep]
                if ranker is not None:
                    # stopped rows are dropped from the ranker in bulk, not at every stop
                    ranker_rows = ranker_rows[keep]
                    if len(ranker_rows) < 0.75 * ranker.n_rows:
                        ranker.keep(ranker_rows)
                        ranker_rows = torch.arange(len(ranker_rows), device=dev)
        if len(idx) == 0:
            break
    with torch.no_grad():
        W = make_W(best_A, constraint)
    converged = (since >= patience).cpu().numpy()
    out = StackFit(W=W.cpu().double().numpy(), n_iter=n_iter.cpu().numpy(),
                   converged=converged,
                   history=torch.stack(history, dim=1).cpu().double().numpy(),
                   best_score=best.cpu().double().numpy(), batch_size=int(b),
                   full_batch=bool(full))
    return out
