"""Cross-validated squared distances between items (cross-validated Euclidean, crossnobis).

The squared Euclidean distance between two single-trial (or trial-averaged) patterns is
biased upwards by the noise: ``E‖(μ_i + e_i) − (μ_j + e_j)‖² = ‖μ_i − μ_j‖² + E‖e_i − e_j‖²``.
Splitting the trials of every item into ``K`` independent partitions and multiplying the
difference of one partition by that of *another* removes the bias: with
``a_k = ȳ_i^(k) − ȳ_j^(k)`` (means over item ``i``'s and ``j``'s trials of partition ``k``),

``d²_ij = 1 / (K (K − 1)) Σ_{k ≠ l} a_kᵀ P a_l / n_units``

has expectation ``(μ_i − μ_j)ᵀ P (μ_i − μ_j) / n_units`` whenever the noise of different
partitions is independent, for any fixed ``P``: ``P = I`` gives the cross-validated
squared Euclidean distance, ``P`` = the inverse noise covariance the crossnobis distance
(Walther et al., 2016).  Identical items get 0 in expectation (single estimates may be
negative).

Everything is computed for a stack of ``M`` models at once (time points, spheres), from
``Σ_{k ≠ l} a_kᵀ a_l = ‖Σ_k a_k‖² − Σ_k ‖a_k‖²``: one batched Gram product of the
partitions' summed patterns and one of each partition's patterns, for every model of a
chunk (no Python loop over models; chunks bound memory).  Searchlight spheres get the
cross-validated Euclidean distance from one sparse membership product per block of pairs
(:func:`crossval_sq_distances_membership`).  The noise covariance for crossnobis is
estimated per model from the residuals of the trials about the mean of their item in
their partition, shrunk towards a multiple of the identity (Ledoit–Wolf, batched:
:func:`shrinkage_covariance`); for spheres and regions, :func:`crossnobis_membership`
gathers the voxels of spheres of similar size into padded blocks and whitens each
sphere by its own covariance (one batched factorisation per chunk, of voxels × voxels
covariances or, for spheres of more voxels than trials, trials × trials systems).

The analyses use them with ``items`` and ``distance="cv_euclidean"`` or
``"crossnobis"``.
"""
from __future__ import annotations

import numbers

import numpy as np
import torch

from ..constants import CROSSDIST_CHUNK_BYTES as CHUNK_BYTES  # noqa: F401  (tuning constants, defined there once)
from ..stimuli.pairs import pair_indices

__all__ = ["crossnobis_membership", "crossval_sq_distances",
           "crossval_sq_distances_membership", "default_partitions", "noise_whitener",
           "partition_means", "shrinkage_covariance"]


def _codes(labels, name):
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"{name} must hold one label per trial; got shape {labels.shape}.")
    uniq, codes = np.unique(labels, return_inverse=True)
    return codes.astype(np.intp), len(uniq)


def _item_codes(items):
    """Item of each trial → codes in the order of first appearance (as
    :class:`mlem_neuro.items.Items`)."""
    import pandas as pd

    codes, uniques = pd.factorize(pd.Series(np.asarray(items, dtype=object)), sort=False)
    if (codes < 0).any():
        raise ValueError("items holds missing labels (NaN/None): give every trial an item.")
    return np.asarray(codes, dtype=np.intp), len(uniques)


def default_partitions(items, n_partitions=None, random_state=None):
    """Split the trials of every item into ``n_partitions`` parts of (nearly) equal size.

    Parameters
    ----------
    items : array-like (n_trials,)
        The item of each trial.
    n_partitions : int | None
        Parts per item; default: the smallest number of trials of an item (one trial per
        part for that item).  At least 2, and at most that smallest number.
    random_state : None | int | Generator
        Shuffles the trials of each item before they are dealt to the parts.

    Returns
    -------
    partitions : ndarray (n_trials,)
        The part (0 to ``n_partitions - 1``) of each trial.
    """
    codes, n_items = _item_codes(items)
    counts = np.bincount(codes, minlength=n_items)
    k_max = int(counts.min())
    K = k_max if n_partitions is None else n_partitions
    if not isinstance(K, numbers.Integral) or not 2 <= K <= k_max:
        raise ValueError(f"n_partitions must be an int from 2 to the smallest number of "
                         f"trials of an item ({k_max}); got {K!r}. Cross-validated "
                         "distances need at least 2 trials of every item.")
    rng = np.random.default_rng(random_state)
    parts = np.empty(len(codes), dtype=np.intp)
    for k in range(n_items):
        rows = rng.permutation(np.flatnonzero(codes == k))
        parts[rows] = np.arange(len(rows)) % K
    return parts


def partition_means(Y, items, partitions):
    """Mean pattern of every item in every partition, for a stack of models.

    Parameters
    ----------
    Y : array (n_models, n_trials, n_units)
    items : array-like (n_trials,)
        The item of each trial (items in the order of their first trial).
    partitions : array-like (n_trials,)
        The partition of each trial (run, fold...): every item needs trials in every
        partition.

    Returns
    -------
    means : torch.Tensor (n_partitions, n_models, n_items, n_units), float64
    """
    Y = torch.as_tensor(np.asarray(Y, dtype=np.float64))
    item, n_items = _item_codes(items)
    part, K = _codes(partitions, "partitions")
    if len(item) != Y.shape[1] or len(part) != Y.shape[1]:
        raise ValueError(f"items and partitions need one label per trial ({Y.shape[1]}); "
                         f"got {len(item)} and {len(part)}.")
    if K < 2:
        raise ValueError("partitions holds a single partition; cross-validated distances "
                         "need at least 2 (e.g. runs, or default_partitions(items)).")
    cell = part * n_items + item
    counts = np.bincount(cell, minlength=K * n_items)
    if (counts == 0).any():
        k, i = divmod(int(np.flatnonzero(counts == 0)[0]), n_items)
        raise ValueError(f"item {i} (in the order of first trials) has no trial in "
                         f"partition {k}: every item needs trials in every partition.")
    means = _cell_means(Y, cell, counts)                       # (M, K * n_items, U)
    return means.reshape(Y.shape[0], K, n_items, Y.shape[2]).transpose(0, 1)


def _cell_means(Y, cell, counts):
    """Means of the trials (axis 1 of ``Y``) of every cell, all models at once."""
    sums = Y.new_zeros((Y.shape[0], len(counts), Y.shape[2]))
    sums.index_add_(1, torch.as_tensor(cell), Y)
    return sums / torch.as_tensor(np.maximum(counts, 1), dtype=Y.dtype)[:, None]


def _sq_from_gram(G, i, j):
    d = G.diagonal(dim1=-2, dim2=-1)
    return d[..., i] + d[..., j] - 2.0 * G[..., i, j]


def shrinkage_covariance(R, shrinkage="ledoit-wolf"):
    """Noise covariance of each model, shrunk towards a multiple of the identity.

    Parameters
    ----------
    R : array | Tensor (n_models, n_samples, n_units)
        Residuals (already centred, e.g. trials minus their item's mean).
    shrinkage : "ledoit-wolf" | float
        ``"ledoit-wolf"``: the Ledoit–Wolf shrinkage of each model (as
        :func:`sklearn.covariance.ledoit_wolf` with ``assume_centered=True``); a float in
        [0, 1] shrinks every model by that amount.

    Returns
    -------
    cov : torch.Tensor (n_models, n_units, n_units)
    shrinkage : torch.Tensor (n_models,)
        The shrinkage used for each model.
    """
    R = torch.as_tensor(np.asarray(R, dtype=np.float64))
    return _shrunk(R.transpose(1, 2) @ R / R.shape[1], R, shrinkage)[:2]


def _ledoit_wolf(trace, fro2, beta_, n, p, shrinkage):
    """Shrinkage ``lam`` and mean eigenvalue ``mu`` of each model from ``trace(S)``,
    ``‖S‖²_F``, ``Σ_k ‖r_k‖⁴`` (residual rows ``r_k``), ``n`` samples and ``p`` units."""
    mu = trace / p                                                  # (M,)
    if isinstance(shrinkage, str):
        if shrinkage != "ledoit-wolf":
            raise ValueError(f"shrinkage must be 'ledoit-wolf' or a float in [0, 1]; got "
                             f"{shrinkage!r}.")
        beta = (beta_ / n - fro2) / (p * n)
        delta = (fro2 - 2.0 * mu * mu * p + p * mu * mu) / p        # ‖S − μI‖²_F / p
        beta = torch.minimum(beta, delta)
        lam = torch.where(delta > 0, beta / torch.where(delta > 0, delta, 1.0),
                          torch.zeros_like(delta))
    else:
        lam = float(shrinkage)
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"shrinkage must be 'ledoit-wolf' or a float in [0, 1]; got "
                             f"{shrinkage!r}.")
        lam = torch.full(mu.shape, lam, dtype=torch.float64)
    return lam, mu


def _shrunk(S, R, shrinkage, n_units=None):
    """The shrunk covariances of :func:`shrinkage_covariance` from the sample covariances
    ``S (M, q, q)`` of the residuals ``R (M, n, q)``.  ``n_units (M,)``: models whose
    last ``q − n_units`` columns of ``R`` are zero padding get statistics of their
    ``n_units`` real units and ``cov`` block-diagonal, with the padding's diagonal set to
    the mean eigenvalue of the real block (so the whitener's floor is unchanged).
    Returns ``cov, lam, mu`` (``mu``: the mean eigenvalue of ``S``'s real block)."""
    M, n, q = R.shape
    p = torch.full((M,), float(q), dtype=torch.float64) if n_units is None else \
        torch.as_tensor(n_units, dtype=torch.float64)
    row_sq = (R * R).sum(-1)                                        # (M, n)
    lam, mu = _ledoit_wolf(S.diagonal(dim1=-2, dim2=-1).sum(-1),
                           torch.linalg.vector_norm(S, dim=(-2, -1)) ** 2,
                           (row_sq * row_sq).sum(-1), n, p, shrinkage)
    cov = S * (1.0 - lam)[:, None, None]
    diag = cov.diagonal(dim1=-2, dim2=-1)
    diag += (lam * mu)[:, None]
    if n_units is not None:
        pad = torch.arange(q)[None, :] >= torch.as_tensor(n_units)[:, None]   # (M, q)
        diag.copy_(torch.where(pad, mu[:, None], diag))
    return cov, lam, mu


def noise_whitener(cov, eps=1e-10):
    """``cov^{-1/2}`` of each model (symmetric; eigenvalues below ``eps`` times the
    largest are treated as ``eps`` times the largest).

    Parameters
    ----------
    cov : Tensor (n_models, n_units, n_units)
    eps : float

    Returns
    -------
    Tensor (n_models, n_units, n_units)
    """
    vals, vecs = torch.linalg.eigh(torch.as_tensor(cov, dtype=torch.float64))
    floor = eps * vals[..., -1:].clamp_min(0.0)
    inv_sqrt = vals.clamp_min(0.0).maximum(floor).clamp_min(1e-300).rsqrt()
    return (vecs * inv_sqrt[..., None, :]) @ vecs.transpose(-1, -2)


def _residuals(Y, item, n_items, part):
    """Trials minus the mean of their (item, partition) cell, per model.

    Within-cell residuals are independent of the cell means (Gaussian noise), so a
    covariance estimated from them keeps the crossnobis distance unbiased (0 for
    identical items); residuals about each item's overall mean are not (they contain the
    partitions' deviations, measured: a bias of 15 standard errors in the test)."""
    cell = part * n_items + item
    n_cells = int(cell.max()) + 1
    counts = np.bincount(cell, minlength=n_cells)
    if len(cell) - (counts > 0).sum() < 1:
        raise ValueError("every (item, partition) cell holds a single trial: no residual "
                         "is left to estimate the noise covariance; use fewer partitions "
                         "(e.g. default_partitions(items, 2)) or pass noise covariances.")
    return Y - _cell_means(Y, cell, counts)[:, torch.as_tensor(cell)]


def crossval_sq_distances(Y, items, partitions=None, *, noise=None, random_state=None):
    """Cross-validated squared distances between items, for every model at once.

    Parameters
    ----------
    Y : array (n_models, n_trials, n_units)
        Each model's trials × units data (e.g. one time point per model).
    items : array-like (n_trials,)
        The item of each trial; pairs are between items, in
        :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order over the items in the order of
        their first trial.
    partitions : array-like (n_trials,) | None
        Independent partitions of the trials (runs, sessions...); every item needs
        trials in each.  ``None``: :func:`default_partitions` (``random_state`` seeds it)
        with one part per trial of the rarest item, or, when the noise covariance is
        estimated, half as many (at least 2), so that cells keep residuals.
    noise : None | "ledoit-wolf" | float | array (n_models, n_units, n_units)
        ``None``: cross-validated squared Euclidean distance.  Otherwise crossnobis: the
        patterns are whitened by the noise covariance of each model, estimated from the
        residuals of the trials about the mean of their (item, partition) cell and shrunk
        (``"ledoit-wolf"`` or a fixed shrinkage in [0, 1], see
        :func:`shrinkage_covariance`), or given as covariances (one per model, or one
        for all).
    random_state : None | int | Generator
        Seeds the default partitions.

    Returns
    -------
    d2 : ndarray (n_models, n_pairs)
        ``1 / (K (K − 1)) Σ_{k ≠ l} a_kᵀ P a_l / n_units`` (see the module); unbiased for
        ``(μ_i − μ_j)ᵀ P (μ_i − μ_j) / n_units``; may be negative.
    """
    Y = np.asarray(Y, dtype=np.float64)
    if Y.ndim != 3:
        raise ValueError(f"Y must be 3-D (n_models, n_trials, n_units); got shape {Y.shape}.")
    item, n_items = _item_codes(items)
    estimate = isinstance(noise, (str, numbers.Real))
    if partitions is None:
        K = None
        if estimate:
            K = max(2, int(np.bincount(item).min()) // 2)
        partitions = default_partitions(items, K, random_state=random_state)
    part, K = _codes(partitions, "partitions")
    M, n, U = Y.shape
    i, j = pair_indices(n_items)
    out = np.empty((M, len(i)))
    per_model = 8 * (K + 2) * n_items * max(U, n_items) + 8 * n * U
    if noise is not None:
        per_model += 8 * (n * U + 3 * U * U)
    step = max(1, int(CHUNK_BYTES // per_model))
    for s in range(0, M, step):
        y = torch.as_tensor(Y[s:s + step])
        if noise is not None:
            y = y @ _whitener(y, item, n_items, part, noise, slice(s, s + step))
        pm = partition_means(y, item, part)                    # (K, m, n_items, U)
        total = pm.sum(0)
        G_sum = total @ total.transpose(-1, -2)
        G_each = (pm @ pm.transpose(-1, -2)).sum(0)
        d2 = (_sq_from_gram(G_sum, i, j) - _sq_from_gram(G_each, i, j)) / (K * (K - 1))
        out[s:s + step] = (d2 / U).numpy()
    return out


def _whitener(y, item, n_items, part, noise, models):
    if isinstance(noise, (str, numbers.Real)):
        cov, _ = shrinkage_covariance(_residuals(y, item, n_items, part), noise)
    else:
        cov = torch.as_tensor(np.asarray(noise, dtype=np.float64))
        if cov.ndim == 2:
            cov = cov.expand(y.shape[0], -1, -1)
        else:
            cov = cov[models]
        if cov.shape != (y.shape[0], y.shape[2], y.shape[2]):
            raise ValueError(f"noise covariances must have shape (n_models, n_units, "
                             f"n_units) or (n_units, n_units); got {tuple(cov.shape)}.")
    return noise_whitener(cov)


def crossval_sq_distances_membership(X, A, items, partitions=None, *, random_state=None,
                                     block_bytes=64 * 2**20):
    """Cross-validated squared Euclidean distances of many spheres (regions) at once.

    For items ``i, j`` and sphere ``s``:
    ``d²[s, (i, j)] = (A @ c_ij)[s] / (K (K − 1)) / |s|`` with, per voxel,
    ``c_ij = (Σ_k a_k)² − Σ_k a_k²`` and ``a_k = x̄_i^(k) − x̄_j^(k)``: one sparse product per
    block of pairs, no loop over spheres.

    Parameters
    ----------
    X : array (n_trials, n_voxels)
    A : scipy.sparse matrix (n_models, n_voxels)
        0/1 membership of the voxels in each sphere / region.
    items, partitions, random_state
        As in :func:`crossval_sq_distances`.
    block_bytes : int
        Memory of one block of per-pair, per-voxel products.

    Returns
    -------
    d2 : ndarray (n_models, n_pairs)
    """
    import scipy.sparse as sp

    X = np.asarray(X, dtype=np.float64)
    A = sp.csr_matrix(A, dtype=np.float64)
    if A.shape[1] != X.shape[1]:
        raise ValueError(f"membership has {A.shape[1]} voxel columns but X has "
                         f"{X.shape[1]} voxels.")
    item, n_items = _item_codes(items)
    if partitions is None:
        partitions = default_partitions(items, random_state=random_state)
    pm = partition_means(X[None], item, partitions)[:, 0].numpy()   # (K, n_items, V)
    K = pm.shape[0]
    total = pm.sum(0).T                                               # (V, n_items)
    each = np.ascontiguousarray(pm.transpose(2, 0, 1))                # (V, K, n_items)
    i, j = pair_indices(n_items)
    sizes = np.diff(A.indptr).astype(float)
    out = np.empty((A.shape[0], len(i)))
    step = max(1, int(block_bytes // (8 * (K + 1) * max(X.shape[1], 1))))
    for s in range(0, len(i), step):
        a, b = i[s:s + step], j[s:s + step]
        d_sum = total[:, a] - total[:, b]
        d_each = each[:, :, a] - each[:, :, b]
        c = d_sum * d_sum - (d_each * d_each).sum(1)
        out[:, s:s + step] = A @ c
    return out / (K * (K - 1)) / np.where(sizes > 0, sizes, 1.0)[:, None]


def _whiten(cov, lam, mu, p, P):
    """``Z (M, q, c)`` with ``Zᵀ Z = Pᵀ cov⁻¹ P`` for each model: Cholesky factors where
    the shrinkage bounds the condition number of ``cov`` below 1e8 (then no eigenvalue
    reaches the floor of :func:`noise_whitener`, and the products equal those of its
    symmetric whitener), that whitener elsewhere (little or no shrinkage)."""
    p = torch.as_tensor(p, dtype=torch.float64)
    # cov's eigenvalues lie in [lam mu, mu (p (1 − lam) + lam)]
    safe = (mu > 0) & (lam >= 1e-8 * (p * (1.0 - lam) + lam))
    L, info = torch.linalg.cholesky_ex(cov)
    safe &= info == 0
    Z = torch.linalg.solve_triangular(L, P, upper=False)
    if not bool(safe.all()):
        rest = ~safe
        Z[rest] = noise_whitener(cov[rest]) @ P[rest]
    return Z


def _gram_primal(res, P, n, p, shrinkage):
    """``Pᵀ cov⁻¹ P (m, c, c)`` of each sphere from its residuals ``res (m, q, n)`` and
    means ``P (m, q, c)`` (rows beyond ``p`` zero padding), through ``q × q`` covariances."""
    cov, lam, mu = _shrunk(res @ res.transpose(1, 2) / n, res.transpose(1, 2), shrinkage,
                           n_units=p)
    Z = _whiten(cov, lam, mu, p, P)
    return Z.transpose(1, 2) @ Z


def _gram_dual(res, P, n, p, shrinkage):
    """As :func:`_gram_primal` through ``n × n`` systems, for spheres of more voxels than
    trials: with ``cov = (1 − λ) RᵀR / n + c I`` (``c = λ μ``), Woodbury's identity gives
    ``Pᵀ cov⁻¹ P = (PᵀP − (RP)ᵀ (t I + RRᵀ)⁻¹ RP) / c`` with ``t = n c / (1 − λ)``; the
    Ledoit-Wolf statistics come from ``RRᵀ`` too.  Spheres with too little shrinkage for
    that (a condition number above 1e8) go through :func:`_gram_primal`."""
    H = res.transpose(1, 2) @ res                                      # (m, n, n) = R Rᵀ
    h = H.diagonal(dim1=-2, dim2=-1)
    pt = torch.as_tensor(p, dtype=torch.float64)
    lam, mu = _ledoit_wolf(h.sum(-1) / n, torch.linalg.vector_norm(H, dim=(-2, -1)) ** 2
                           / (n * n), (h * h).sum(-1), n, pt, shrinkage)
    c = lam * mu
    t = n * c / (1.0 - lam).clamp_min(1e-12)
    A = H.clone()
    A.diagonal(dim1=-2, dim2=-1).add_(t[:, None])
    L, info = torch.linalg.cholesky_ex(A)
    safe = (mu > 0) & (lam >= 1e-8 * (pt * (1.0 - lam) + lam)) & (info == 0)
    Y = torch.linalg.solve_triangular(L, res.transpose(1, 2) @ P, upper=False)
    scale = torch.where(safe, c, torch.ones_like(c))[:, None, None]
    M = (P.transpose(1, 2) @ P - Y.transpose(1, 2) @ Y) / scale
    if not bool(safe.all()):
        rest = ~safe
        M[rest] = _gram_primal(res[rest], P[rest], n, p[rest.numpy()], shrinkage)
    return M


def _size_groups(sizes, slack=0.1, min_pad=8):
    """Sphere sizes → groups ``(q, rows)``: the rows whose size is at most ``q``, padded
    to ``q`` (at most ``min_pad`` units or a fraction ``slack`` more than the smallest of
    the group), so that a few groups cover any number of distinct sizes."""
    order = np.argsort(sizes, kind="stable")
    sorted_sizes = sizes[order]
    groups, start = [], 0
    while start < len(order):
        limit = max(sorted_sizes[start] + min_pad, int(sorted_sizes[start] * (1 + slack)))
        stop = int(np.searchsorted(sorted_sizes, limit, side="right"))
        groups.append((int(sorted_sizes[stop - 1]), order[start:stop]))
        start = stop
    return groups


def crossnobis_membership(X, A, items, partitions=None, *, shrinkage="ledoit-wolf",
                          random_state=None, chunk_bytes=CHUNK_BYTES):
    """Crossnobis squared distances between items for many spheres (regions) at once.

    Each sphere ``s`` (row of ``A``) is :func:`crossval_sq_distances` with
    ``noise=shrinkage`` on its voxels: the residuals of the trials about the mean of their
    (item, partition) cell, restricted to the sphere, give its noise covariance (shrunk,
    see :func:`shrinkage_covariance`), which whitens the partition means of the items
    before the cross-partition products, divided by the sphere's number of voxels.

    Spheres are batched without a loop over spheres: grouped by size (sizes within 10 %
    or 8 voxels of each other share a group, padded with zero voxels that the covariance
    keeps apart), each group's voxels gathered into ``(spheres, voxels, trials)`` blocks
    and processed in chunks of at most ``chunk_bytes``.  Spheres of at most as many
    voxels as trials are whitened through their ``voxels × voxels`` covariance (Cholesky
    factors, or the symmetric whitener of :func:`noise_whitener` where the shrinkage is
    too small to bound its condition number), larger ones (regions) through
    ``trials × trials`` systems (Woodbury's identity), so that a region of thousands of
    voxels costs no more than its trials.

    Parameters
    ----------
    X : array (n_trials, n_voxels)
    A : scipy.sparse matrix (n_models, n_voxels)
        0/1 membership of the voxels in each sphere / region (every row needs a voxel).
    items, partitions, random_state
        As in :func:`crossval_sq_distances` (default partitions: half as many parts as
        the rarest item has trials, at least 2, so that cells keep residuals).
    shrinkage : "ledoit-wolf" | float
        As in :func:`shrinkage_covariance`.
    chunk_bytes : int
        Memory of one chunk of spheres (covariances, whiteners, whitened means).

    Returns
    -------
    d2 : ndarray (n_models, n_pairs)
    """
    import scipy.sparse as sp

    X = np.asarray(X, dtype=np.float64)
    A = sp.csr_matrix(A, dtype=np.float64)
    if X.ndim != 2 or A.shape[1] != X.shape[1]:
        raise ValueError(f"X must be (n_trials, n_voxels) with the {A.shape[1]} voxel "
                         f"columns of the membership; got shape {X.shape}.")
    if isinstance(shrinkage, str) and shrinkage != "ledoit-wolf" or \
            not isinstance(shrinkage, str) and not (
                isinstance(shrinkage, numbers.Real) and not isinstance(shrinkage, bool)
                and 0.0 <= shrinkage <= 1.0):
        raise ValueError(f"shrinkage must be 'ledoit-wolf' or a float in [0, 1]; got "
                         f"{shrinkage!r}.")
    sizes = np.diff(A.indptr)
    if (sizes == 0).any():
        raise ValueError(f"row {int(np.flatnonzero(sizes == 0)[0])} of the membership has "
                         "no voxel: every sphere / region needs at least one.")
    item, n_items = _item_codes(items)
    if partitions is None:
        K = max(2, int(np.bincount(item).min()) // 2)
        partitions = default_partitions(items, K, random_state=random_state)
    part, K = _codes(partitions, "partitions")
    Xt = torch.as_tensor(X)[None]
    pm = partition_means(Xt, item, part)[:, 0]                        # (K, n_items, V)
    R = _residuals(Xt, item, n_items, part)[0]                        # (n, V)
    n, V = X.shape
    # voxel-major tables with a zero row at index V for the padding
    R_T = torch.cat([R.T, R.new_zeros((1, n))])                       # (V + 1, n)
    P_T = torch.cat([pm.permute(2, 0, 1).reshape(V, K * n_items),
                     pm.new_zeros((1, K * n_items))])                 # (V + 1, K n_items)
    i, j = pair_indices(n_items)
    out = np.empty((A.shape[0], len(i)))
    for q, rows in _size_groups(sizes):
        c = K * n_items
        per_sphere = 8 * (n * q + q * c + 2 * c * c
                          + (4 * n * n + 2 * n * c if q > n else 5 * q * q + q * c))
        step = max(1, int(chunk_bytes // per_sphere))
        for s in range(0, len(rows), step):
            r = rows[s:s + step]
            p = sizes[r]
            real = np.arange(q)[None, :] < p[:, None]                     # (m, q)
            idx = np.full((len(r), q), V, dtype=np.intp)
            idx[real] = A.indices[(A.indptr[r][:, None] + np.arange(q))[real]]
            idx = torch.as_tensor(idx)
            res, P = R_T[idx], P_T[idx]                                   # (m, q, n), (m, q, c)
            if q > n:
                M = _gram_dual(res, P, n, p, shrinkage)
            else:
                M = _gram_primal(res, P, n, p, shrinkage)
            M = M.reshape(len(r), K, n_items, K, n_items)
            G_sum = M.sum((1, 3))
            G_each = M.diagonal(dim1=1, dim2=3).sum(-1)
            d2 = (_sq_from_gram(G_sum, i, j) - _sq_from_gram(G_each, i, j)) / (K * (K - 1))
            out[r] = (d2 / torch.as_tensor(p, dtype=torch.float64)[:, None]).numpy()
    return out
