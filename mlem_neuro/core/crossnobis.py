"""Cross-validated distances between items, from the trials of independent partitions.

The Euclidean distance between two items' mean patterns is inflated by noise: with ``r``
trials per item and noise variance ``σ²`` per unit, ``E‖x̄_i − x̄_j‖² = ‖μ_i − μ_j‖² +
2 p σ² / r``, so identical items are not at distance 0 and items with fewer trials look
farther apart.  Splitting each item's trials into ``K`` independent partitions and
multiplying the difference measured in one partition by the difference measured in
another removes the noise term, whose products have mean 0 across independent
partitions::

    d²(i, j) = 1 / (K (K − 1)) Σ_{p ≠ q} (x̄_ip − x̄_jp) · (x̄_iq − x̄_jq)

whose expected value is the true squared distance ``‖μ_i − μ_j‖²`` (it can be negative).
Whitening the patterns first by the noise covariance ``Σ`` (estimated from the residuals
of the trials around their item-and-partition means, shrunk towards a multiple of the
identity by Ledoit & Wolf's rule) gives the cross-validated Mahalanobis distance,
"crossnobis", whose expected value is ``(μ_i − μ_j)ᵀ Σ̂⁻¹ (μ_i − μ_j)`` (0 for identical
items, exactly, under Gaussian noise: the residuals that give ``Σ̂`` are then independent
of the partition means).

Everything is computed for all models (time points) at once, with batched matrix
products: the cross-partition sum is ``‖Σ_p Δ_p‖² − Σ_p ‖Δ_p‖²``, both from Gram matrices
of the item means.
"""
from __future__ import annotations

import numpy as np
import torch

from .pairs import pair_indices

__all__ = ["CROSSVALIDATED", "crossvalidated_distances", "default_partitions"]

#: distances computed from trial partitions (not from one pattern per stimulus).
CROSSVALIDATED = ("crossnobis", "cv_euclidean")
#: most partitions :func:`default_partitions` deals an item's trials into.
MAX_PARTITIONS = 8


def default_partitions(items, n_partitions=None):
    """Partition label ``(n_trials,)`` of each trial: each item's trials are dealt in turn
    to partitions ``0 .. K − 1`` (in trial order), so that every item is in every partition.

    ``K`` is ``n_partitions`` or, by default, the fewest trials of any item (at most
    :data:`MAX_PARTITIONS`).
    """
    items = np.asarray(items)
    labels, inverse, counts = np.unique(items, return_inverse=True, return_counts=True)
    fewest = int(counts.min())
    if fewest < 2:
        lonely = labels[np.argmin(counts)]
        raise ValueError(f"cross-validated distances need at least 2 trials of every item; "
                         f"item {lonely!r} has {fewest}. Drop it, or use a plain distance "
                         "(e.g. distance='euclidean' on the item means).")
    K = min(fewest, MAX_PARTITIONS) if n_partitions is None else int(n_partitions)
    if not 2 <= K <= fewest:
        raise ValueError(f"n_partitions must be between 2 and the fewest trials of an item "
                         f"({fewest}); got {K}.")
    out = np.empty(len(items), dtype=np.int64)
    for k in range(len(labels)):
        where = np.flatnonzero(inverse == k)
        out[where] = np.arange(len(where)) % K
    return out


def _ledoit_wolf(R):
    """Shrunk covariance ``(M, p, p)`` of residuals ``R (M, n, p)`` (rows: observations,
    already centred), and the shrinkage ``(M,)`` used (Ledoit & Wolf, 2004)."""
    M, n, p = R.shape
    S = R.transpose(1, 2) @ R / n
    mu = torch.diagonal(S, dim1=-2, dim2=-1).sum(-1) / p
    eye = torch.eye(p, dtype=R.dtype, device=R.device)
    d2 = ((S - mu[:, None, None] * eye) ** 2).sum(dim=(-2, -1))
    sq = (R * R).sum(-1)                                         # ‖r_k‖²
    rSr = ((R @ S) * R).sum(-1)
    b2 = (sq * sq - 2.0 * rSr + (S * S).sum(dim=(-2, -1))[:, None]).sum(-1) / n ** 2
    shrink = torch.where(d2 > 0, torch.minimum(b2, d2) / d2.clamp_min(1e-300),
                         torch.ones_like(d2))
    return (shrink[:, None, None] * mu[:, None, None] * eye
            + (1.0 - shrink[:, None, None]) * S), shrink


def _whitener(cov):
    """``Σ^{-1/2}`` ``(M, p, p)`` of symmetric positive definite ``cov``."""
    vals, vecs = torch.linalg.eigh(cov)
    vals = vals.clamp_min(vals[..., -1:] * 1e-12)
    return (vecs * vals.rsqrt()[..., None, :]) @ vecs.transpose(-1, -2)


def crossvalidated_distances(Y, items, partitions=None, *, noise_normalize=True,
                             device="cpu"):
    """Cross-validated squared distances between items, for every model.

    Parameters
    ----------
    Y : array (n_models, n_trials, n_units)
        Trial patterns of each model (e.g. one time point per model).
    items : array-like (n_trials,)
        The item (stimulus) of each trial.
    partitions : array-like (n_trials,) | None
        Independent partitions of the trials (runs, sessions); every item needs trials in
        at least 2 partitions, and each pair of items is compared over the partitions
        that hold both.  ``None``: :func:`default_partitions` (with crossnobis, half as
        many partitions, so that each item has at least 2 trials in each).
    noise_normalize : bool
        Whiten by the shrunk noise covariance of each model (crossnobis); ``False``:
        cross-validated Euclidean distances.
    device : str
        Torch device of the computation.

    Returns
    -------
    labels : ndarray (n_items,)
        The items, sorted (the order of the distances' stimuli).
    d2 : ndarray (n_models, n_pairs)
        Squared distances of the item pairs in
        :func:`~mlem_neuro.core.pairs.pair_indices` order.
    """
    Y = torch.as_tensor(np.asarray(Y, dtype=np.float64), device=device)
    if Y.ndim != 3:
        raise ValueError(f"Y must be (n_models, n_trials, n_units); got shape "
                         f"{tuple(Y.shape)}.")
    M, n, p = Y.shape
    items = np.asarray(items)
    if items.shape != (n,):
        raise ValueError(f"items must have one label per trial ({n}); got shape "
                         f"{items.shape}.")
    if partitions is None:
        # crossnobis also needs trials around each item x partition mean: 2 per cell
        fewest = int(np.unique(items, return_counts=True)[1].min()) if n else 0
        K = max(2, min(fewest // 2, MAX_PARTITIONS)) if noise_normalize and fewest >= 4 \
            else None
        parts = default_partitions(items, K)
    else:
        parts = np.asarray(partitions)
    if parts.shape != (n,):
        raise ValueError(f"partitions must have one label per trial ({n}); got shape "
                         f"{parts.shape}.")
    labels, item_idx = np.unique(items, return_inverse=True)
    part_labels, part_idx = np.unique(parts, return_inverse=True)
    I, K = len(labels), len(part_labels)
    cell = item_idx * K + part_idx
    counts = np.bincount(cell, minlength=I * K).reshape(I, K)
    present = counts > 0
    short = np.flatnonzero(present.sum(axis=1) < 2)
    if short.size:
        raise ValueError(f"item {labels[short[0]]!r} has trials in fewer than 2 partitions: "
                         "cross-validated distances compare partitions; give every item "
                         "trials in at least 2 of them.")
    cell_t = torch.as_tensor(cell, device=device)
    sums = torch.zeros(M, I * K, p, dtype=Y.dtype, device=device).index_add_(1, cell_t, Y)
    cnt = torch.as_tensor(np.maximum(counts.reshape(-1), 1), dtype=Y.dtype, device=device)
    means = sums / cnt[None, :, None]                            # (M, I*K, p)
    if noise_normalize:
        resid = Y - means[:, cell_t]
        dof = n - int(present.sum())
        if dof < 1:
            raise ValueError("crossnobis estimates the noise from trials around their item "
                             "and partition means, and every item x partition has a single "
                             "trial; use distance='cv_euclidean', or fewer partitions.")
        cov, _ = _ledoit_wolf(resid * np.sqrt(n / dof))
        means = means @ _whitener(cov)
    means = means.reshape(M, I, K, p).permute(0, 2, 1, 3)       # (M, K, I, p)
    i, j = pair_indices(I)
    if present.all():
        d2 = _complete(means, i, j)
    else:
        d2 = _incomplete(means, torch.as_tensor(present.T, dtype=Y.dtype, device=device),
                         i, j, labels)
    return labels, d2.cpu().numpy()


def _pair_sq(G, i, j):
    """``G_ii + G_jj − 2 G_ij`` ``(M, P)`` of Gram matrices ``G (M, I, I)``."""
    diag = torch.diagonal(G, dim1=-2, dim2=-1)
    it = torch.as_tensor(i, device=G.device)
    jt = torch.as_tensor(j, device=G.device)
    return diag[:, it] + diag[:, jt] - 2.0 * G[:, it, jt]


def _complete(means, i, j):
    """Every item in every partition: ``(‖Σ_p Δ_p‖² − Σ_p ‖Δ_p‖²) / (K (K − 1))`` from
    Gram matrices of the item means ``(M, K, I, p)``."""
    K = means.shape[1]
    S = means.sum(dim=1)
    total = _pair_sq(S @ S.transpose(-1, -2), i, j)
    own = sum(_pair_sq(means[:, k] @ means[:, k].transpose(-1, -2), i, j) for k in range(K))
    return (total - own) / (K * (K - 1.0))


#: item pairs per block of :func:`_incomplete` (bounds its ``(M, pairs, p)`` arrays).
PAIR_BLOCK = 4096


def _incomplete(means, pres, i, j, labels):
    """Some items miss some partitions: each pair over the partitions that hold both."""
    M, K, I, p = means.shape
    it_all = torch.as_tensor(i, device=means.device)
    jt_all = torch.as_tensor(j, device=means.device)
    both_all = pres[:, it_all] * pres[:, jt_all]                  # (K, P)
    n_both = both_all.sum(0)
    if bool((n_both < 2).any()):
        bad = int(torch.nonzero(n_both < 2)[0, 0])
        raise ValueError(f"items {labels[i[bad]]!r} and {labels[j[bad]]!r} share fewer than "
                         "2 partitions: their cross-validated distance is undefined.")
    out = torch.empty(M, len(i), dtype=means.dtype, device=means.device)
    for lo in range(0, len(i), PAIR_BLOCK):
        sl = slice(lo, lo + PAIR_BLOCK)
        it, jt, both = it_all[sl], jt_all[sl], both_all[:, sl]
        total = torch.zeros(M, len(it), p, dtype=means.dtype, device=means.device)
        own = torch.zeros(M, len(it), dtype=means.dtype, device=means.device)
        for k in range(K):
            diff = (means[:, k, it] - means[:, k, jt]) * both[k][None, :, None]
            total += diff
            own += (diff * diff).sum(-1)
        out[:, sl] = ((total * total).sum(-1) - own) / (n_both[sl] * (n_both[sl] - 1.0))
    return out
