"""Permutation importance for stacks of fitted models, scored with exact Spearman.

Term level (the MLEM paper's appendix): the model is rewritten over the terms
``P_kk = d_k²`` and ``P_kl = 2 d_k d_l`` so that ``dᵀ W d = Σ_t w_t P_t``.  A term's
importance is the mean drop of the exact Spearman correlation when its column is permuted
across the evaluated pairs.

Feature level: a feature's values are permuted across *stimuli*, every pair distance of that
feature is recomputed, and the drop measures the feature's total effect (its own term and its
interactions together).

Only the order of ``dᵀ W d`` matters for Spearman (the distance is a monotone function of
it), so scores are computed on the quadratic form directly, in float64.
"""
from __future__ import annotations

import numpy as np
import torch

from .metric import term_matrix, term_weights
from .neural import CHUNK_BYTES
from .spearman import rankdata, standardize
from .tied import distinct_rows, grouped_spearman


def _score(q, tz):
    """Exact Spearman of ``q (..., P)`` against standardised target ranks ``tz``."""
    return (standardize(rankdata(q)) * tz).sum(dim=-1)


def _model_chunks(M, per_model_elems):
    step = max(1, int(CHUNK_BYTES // (8 * max(per_model_elems, 1))))
    return [slice(s, s + step) for s in range(0, M, step)]


def baseline_scores(W, D, target, k, l):
    """Exact Spearman ``(M,)`` of each model on pairs with feature distances ``D``."""
    W = torch.as_tensor(W, dtype=torch.float64, device=D.device)
    q = term_weights(W, k, l) @ term_matrix(D.double(), k, l).T
    return _score(q, standardize(rankdata(target.double())))


def _grouped_drops(base, q_groups, key, counts, tz, P):
    """Score drops ``(M, K)`` for predictions given per group of pairs.

    ``q_groups (M, G)``: prediction of each group; ``key (K, P)``: group of each pair under
    each permutation; ``counts (K, G)``: pairs per group.
    """
    M, G = q_groups.shape
    K = key.shape[0]
    drops = torch.empty(M, K, dtype=torch.float64, device=tz.device)
    for c in _model_chunks(M, K * P * 2):
        Mc = tz[c].shape[0]
        sums = torch.zeros(Mc, K, G, dtype=torch.float64, device=tz.device).scatter_add_(
            2, key.expand(Mc, K, P), tz[c, None, :].expand(Mc, K, P))
        score = grouped_spearman(q_groups[c, None, :].expand(Mc, K, G), counts[None], sums, P)
        drops[c] = base[c, None] - score
    return drops


def _grouping(rows, col, values, P):
    """Groups of pairs by (row group, new value of column ``col``).

    ``rows = (uniq, uid)`` groups the pairs; ``values (K, P)`` is the permuted column.
    Returns the distinct modified rows ``(C, width)``, the index ``(G,)`` of each group's row
    among them (groups whose modified rows are equal share one, so their predictions tie
    exactly), the group key ``(K, P)`` of each pair and the counts ``(K, G)``; ``None`` when
    there would be too many groups to be worth it.
    """
    uniq, uid = rows
    vals, vinv = torch.unique(values, return_inverse=True)
    U, V = uniq.shape[0], len(vals)
    if 2 * U * V > P:
        return None
    modified = uniq[:, None, :].repeat(1, V, 1)
    modified[:, :, col] = vals[None, :]
    canon, index = torch.unique(modified.reshape(U * V, -1), dim=0, return_inverse=True)
    key = uid[None, :] * V + vinv
    counts = torch.zeros(key.shape[0], U * V, dtype=torch.float64, device=key.device)
    counts.scatter_add_(1, key, torch.ones_like(key, dtype=torch.float64))
    return canon, index, key, counts


def _base(q_rows, rows, tz):
    """Baseline scores and per-group target sums from per-group predictions."""
    uniq, uid = rows
    M, P = tz.shape
    counts = torch.bincount(uid, minlength=uniq.shape[0])
    sums = torch.zeros(M, uniq.shape[0], dtype=torch.float64, device=tz.device)
    sums.scatter_add_(1, uid.expand(M, P), tz)
    return grouped_spearman(q_rows, counts, sums, P)


def term_importance(W, D, target, k, l, n_permutations, rng):
    """Score drops ``(M, n_terms, n_permutations)`` and baselines ``(M,)``.

    Parameters
    ----------
    W : (M, m, m) array or tensor
    D : tensor (P, m)
        Feature distances of the evaluated pairs.
    target : tensor (M, P)
        Neural distances of the evaluated pairs.

    When the term rows take few distinct values (categorical features), pairs are scored by
    group (:func:`~mlem_neuro.core.tied.grouped_spearman`): same scores, no sort of every
    permuted pair.
    """
    dev = D.device
    W = torch.as_tensor(W, dtype=torch.float64, device=dev)
    Pt = term_matrix(D.double(), k, l)
    w = term_weights(W, k, l)                                   # (M, T)
    q = w @ Pt.T                                                # (M, P)
    tz = standardize(rankdata(target.to(dev).double()))
    rows = distinct_rows(Pt)
    if rows is not None:
        q_rows = w @ rows[0].T                                  # (M, U)
        base = _base(q_rows, rows, tz)
    else:
        base = _score(q, tz)
    M, P = q.shape
    T, K = Pt.shape[1], n_permutations
    drops = torch.empty(M, T, K, dtype=torch.float64, device=dev)
    chunks = _model_chunks(M, K * P * 3)
    for t in range(T):
        perms = torch.as_tensor(np.stack([rng.permutation(P) for _ in range(K)]), device=dev)
        new = Pt[perms, t]                                      # (K, P)
        grouping = None if rows is None else _grouping(rows, t, new, P)
        if grouping is not None:
            canon, index, key, counts = grouping
            q_groups = (w @ canon.T)[:, index]                  # (M, G)
            drops[:, t] = _grouped_drops(base, q_groups, key, counts, tz, P)
            continue
        delta = new - Pt[None, :, t]                            # (K, P)
        for c in chunks:
            qp = q[c, None, :] + w[c, t, None, None] * delta[None]
            drops[c, t] = base[c, None] - _score(qp, tz[c, None, :])
    return drops, base


def feature_importance(W, enc_t, i, j, target, n_permutations, rng):
    """Score drops ``(M, m, n_permutations)`` when one feature is permuted across stimuli."""
    dev = enc_t.values.device
    W = torch.as_tensor(W, dtype=torch.float64, device=dev)
    i = torch.as_tensor(i, device=dev)
    j = torch.as_tensor(j, device=dev)
    m = W.shape[-1]
    D = torch.stack([enc_t.feature_distance(f, i, j) for f in range(m)], dim=-1).double()
    WD = torch.einsum("pa,Mka->Mkp", D, W)                    # (W d)_k per model and pair
    q = (WD * D.T[None]).sum(1)                                 # (M, P)
    tz = standardize(rankdata(target.to(dev).double()))
    rows = distinct_rows(D)
    if rows is not None:
        q_rows = torch.einsum("ua,Mab,ub->Mu", rows[0], W, rows[0])   # (M, U)
        base = _base(q_rows, rows, tz)
    else:
        base = _score(q, tz)
    M, P = q.shape
    K = n_permutations
    n = enc_t.values.shape[0]
    drops = torch.empty(M, m, K, dtype=torch.float64, device=dev)
    chunks = _model_chunks(M, K * P * 3)
    for f in range(m):
        perms = torch.as_tensor(np.stack([rng.permutation(n) for _ in range(K)]), device=dev)
        d_new = torch.stack([enc_t.feature_distance(f, i, j, perm=perms[r])
                             for r in range(K)]).double()       # (K, P)
        grouping = None if rows is None else _grouping(rows, f, d_new, P)
        if grouping is not None:
            canon, index, key, counts = grouping
            q_groups = torch.einsum("ca,Mab,cb->Mc", canon, W, canon)[:, index]
            drops[:, f] = _grouped_drops(base, q_groups, key, counts, tz, P)
            continue
        delta = d_new - D[None, :, f]                           # (K, P)
        for c in chunks:
            qp = (q[c, None] + 2.0 * delta[None] * WD[c, f, None]
                  + W[c, f, f, None, None] * delta[None] ** 2)
            drops[c, f] = base[c, None] - _score(qp, tz[c, None, :])
    return drops, base
