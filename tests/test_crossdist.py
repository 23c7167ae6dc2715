"""Cross-validated squared distances (Euclidean, crossnobis) between items: equal to the
definition computed by brute force, unbiased on simulated data (the true squared distance,
0 for identical items), batched over models and spheres."""
import itertools

import numpy as np
import pytest
import scipy.sparse as sp

from mlem_neuro.core.rdms.crossdist import (
    crossnobis_membership,
    crossval_sq_distances,
    crossval_sq_distances_membership,
    default_partitions,
    noise_whitener,
    partition_means,
    shrinkage_covariance,
)
from mlem_neuro.core.stimuli.pairs import pair_indices


def brute_force(Y, items, parts, P=None):
    """The definition, one model, one pair and one (k, l) at a time."""
    M, _, U = Y.shape
    labels = list(dict.fromkeys(items))
    K = sorted(set(parts))
    out = np.zeros((M, len(labels) * (len(labels) - 1) // 2))
    for m in range(M):
        mean = {(it, k): Y[m, (items == it) & (parts == k)].mean(0) for it in labels
                for k in K}
        Pm = np.eye(U) if P is None else P[m]
        for p, (a, b) in enumerate(itertools.combinations(labels, 2)):
            terms = [(mean[a, k] - mean[b, k]) @ Pm @ (mean[a, l] - mean[b, l])
                     for k in K for l in K if k != l]
            out[m, p] = np.mean(terms) / U
    return out


def simulate(n_models, mu, n_trials, noise_cov=None, seed=0):
    """Trials (n_models, n_items * n_trials, U) of items with true patterns ``mu``
    (n_items, U), the same in every model, independent Gaussian noise per model."""
    rng = np.random.default_rng(seed)
    n_items, U = mu.shape
    items = np.repeat(np.arange(n_items), n_trials)
    rng.shuffle(items)
    noise = rng.standard_normal((n_models, len(items), U))
    if noise_cov is not None:
        noise = noise @ np.linalg.cholesky(noise_cov).T
    return mu[items][None] + noise, items


def test_equal_to_the_definition():
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((3, 30, 5))
    items = np.array(list("abcde") * 6)
    parts = default_partitions(items, 3, random_state=0)
    np.testing.assert_allclose(crossval_sq_distances(Y, items, parts),
                               brute_force(Y, items, parts), rtol=1e-10, atol=1e-12)
    cov = np.stack([np.cov(rng.standard_normal((5, 40))) for _ in range(3)])
    P = np.linalg.inv(cov)
    np.testing.assert_allclose(crossval_sq_distances(Y, items, parts, noise=cov),
                               brute_force(Y, items, parts, P), rtol=1e-8, atol=1e-10)
    # unequal trial numbers per cell, explicit partitions (e.g. runs)
    keep = np.ones(30, bool)
    keep[[0, 7, 13]] = False
    np.testing.assert_allclose(
        crossval_sq_distances(Y[:, keep], items[keep], parts[keep]),
        brute_force(Y[:, keep], items[keep], parts[keep]), rtol=1e-10, atol=1e-12)


def test_unbiased_euclidean_and_zero_for_identical_items():
    """4,000 models (independent noise, same truth) as replicates: the mean estimate is
    the true squared distance / n_units within 4 standard errors; identical items give
    0; the plain squared distance of item means is biased (by 2 sigma² / trials = 0.33)."""
    rng = np.random.default_rng(1)
    mu = rng.standard_normal((4, 10))
    mu[1] = mu[0]                                        # items 0 and 1 identical
    Y, items = simulate(4000, mu, n_trials=6)
    d2 = crossval_sq_distances(Y, items, random_state=0)
    i, j = pair_indices(4)
    labels = list(dict.fromkeys(items))
    truth = ((mu[labels][i] - mu[labels][j]) ** 2).mean(1)
    se = d2.std(0, ddof=1) / np.sqrt(len(d2))
    assert np.all(np.abs(d2.mean(0) - truth) < 4 * se)
    same = [p for p, (a, b) in enumerate(zip(i, j)) if {labels[a], labels[b]} == {0, 1}][0]
    assert truth[same] == 0 and abs(d2[:, same].mean()) < 4 * se[same]
    assert (d2[:, same] < 0).mean() > 0.3            # single estimates are signed
    means = np.stack([Y[:, items == k].mean(1) for k in labels], axis=1)
    plain = ((means[:, i] - means[:, j]) ** 2).mean(-1)
    assert np.all(plain.mean(0) - truth > 10 * se)   # what cross-validation removes


def test_unbiased_crossnobis():
    """Correlated noise: with the true covariance the mean crossnobis estimate is
    Δᵀ Σ⁻¹ Δ / n_units (within 4 standard errors); with a Ledoit-Wolf covariance
    estimated from the residuals identical items still give 0 on average, and distinct
    items a value correlated with the truth (shrinkage biases the precision, so not
    equal to it)."""
    rng = np.random.default_rng(2)
    U = 8
    A = rng.standard_normal((U, U))
    cov = A @ A.T / U + 0.2 * np.eye(U)
    mu = rng.standard_normal((5, U))
    mu[3] = mu[4]
    Y, items = simulate(3000, mu, n_trials=8, noise_cov=cov, seed=3)
    labels = list(dict.fromkeys(items))
    i, j = pair_indices(5)
    delta = mu[labels][i] - mu[labels][j]
    truth = np.einsum("pu,uv,pv->p", delta, np.linalg.inv(cov), delta) / U
    d2 = crossval_sq_distances(Y, items, noise=cov, random_state=0)
    se = d2.std(0, ddof=1) / np.sqrt(len(d2))
    assert np.all(np.abs(d2.mean(0) - truth) < 4 * se)
    est = crossval_sq_distances(Y, items, noise="ledoit-wolf", random_state=0)
    se = est.std(0, ddof=1) / np.sqrt(len(est))
    same = truth == 0
    assert same.sum() == 1 and abs(est[:, same].mean()) < 4 * se[same].item()
    assert np.corrcoef(est.mean(0), truth)[0, 1] > 0.9        # measured 0.946


def test_membership_equals_dense_per_sphere():
    rng = np.random.default_rng(4)
    X = rng.standard_normal((24, 30))
    items = np.repeat(np.arange(6), 4)
    A = sp.random(7, 30, density=0.3, random_state=5, format="csr")
    A.data[:] = 1.0
    A[0, 0] = 1.0
    parts = default_partitions(items, 2, random_state=1)
    got = crossval_sq_distances_membership(X, A, items, parts, block_bytes=2000)
    for s in range(7):
        cols = A[s].indices
        want = crossval_sq_distances(X[None][..., cols], items, parts)[0]
        np.testing.assert_allclose(got[s], want, rtol=1e-10, atol=1e-12)


def test_crossnobis_membership_equals_dense_per_sphere():
    """Spheres of 1 to 55 voxels (sizes that share padded groups and sizes that do not;
    45 and 55 voxels: more than the 40 trials), unsorted voxel indices: each sphere
    equals the dense crossnobis of its voxels, for Ledoit-Wolf and a fixed shrinkage
    (Cholesky factors, or the trials x trials systems beyond 40 voxels), and without
    shrinkage on the spheres of full-rank residuals (the symmetric whitener), whatever
    the chunking (measured: relative differences below 7e-15)."""
    rng = np.random.default_rng(7)
    X = rng.standard_normal((40, 60)) @ rng.standard_normal((60, 60)) / 8
    items = np.repeat(np.arange(5), 8)
    parts = default_partitions(items, 4, random_state=0)
    sizes = [1, 2, 5, 9, 13, 14, 20, 31, 33, 40, 3, 1, 45, 55]
    voxels = [rng.choice(60, size, replace=False) for size in sizes]
    A = sp.csr_matrix((np.ones(sum(sizes)), np.concatenate(voxels),
                       np.r_[0, np.cumsum(sizes)]), shape=(len(sizes), 60))
    # no shrinkage: full-rank residuals (<= 14 voxels, 20 residual dof) through the
    # symmetric whitener, and the spheres of 45 and 55 voxels, whose singular covariance
    # sends them from the trials x trials systems back to it (floored eigenvalues: values
    # near 1e8, still equal to the dense function's to 1e-14 as measured)
    few = [s for s, size in enumerate(sizes) if size <= 14 or size > 40]
    for shrinkage, rows in (("ledoit-wolf", range(len(sizes))), (0.3, range(len(sizes))),
                            (0.0, few)):
        sub = A[list(rows)]
        got = crossnobis_membership(X, sub, items, parts, shrinkage=shrinkage)
        chunked = crossnobis_membership(X, sub, items, parts, shrinkage=shrinkage,
                                        chunk_bytes=1)           # one sphere per chunk
        np.testing.assert_allclose(chunked, got, rtol=1e-12, atol=1e-14)
        for k, s in enumerate(rows):
            want = crossval_sq_distances(X[None][..., voxels[s]], items, parts,
                                         noise=shrinkage)[0]
            np.testing.assert_allclose(got[k], want, rtol=1e-10, atol=1e-12)
    # default partitions: half the rarest item's trials, as the dense function
    np.testing.assert_allclose(
        crossnobis_membership(X, A, items, random_state=3)[4],
        crossval_sq_distances(X[None][..., voxels[4]], items, noise="ledoit-wolf",
                              random_state=3)[0], rtol=1e-10, atol=1e-12)


def test_crossnobis_membership_unbiased_for_identical_items():
    """400 disjoint spheres of 6 voxels are 400 independent datasets (noise correlated
    within each sphere): identical items get 0 on average (within 4 standard errors;
    measured +1.0 se, and +1.9, +0.7 with seeds 9, 10), other pairs values that follow
    the true Mahalanobis distance (correlation measured 0.963; 0.998, 0.997), and plain
    item means would be biased."""
    rng = np.random.default_rng(8)
    S, p, n_items, r = 400, 6, 5, 8
    B = rng.standard_normal((p, p))
    cov = B @ B.T / p + 0.2 * np.eye(p)
    mu = rng.standard_normal((n_items, p))
    mu[3] = mu[4]
    items = np.repeat(np.arange(n_items), r)
    noise = rng.standard_normal((len(items), S, p)) @ np.linalg.cholesky(cov).T
    X = (mu[items][:, None, :] + noise).reshape(len(items), S * p)
    A = sp.csr_matrix(np.kron(np.eye(S), np.ones(p)))
    d2 = crossnobis_membership(X, A, items, random_state=0)        # 4 parts of 2 trials
    i, j = pair_indices(n_items)
    delta = mu[i] - mu[j]
    truth = np.einsum("pu,uv,pv->p", delta, np.linalg.inv(cov), delta) / p
    se = d2.std(0, ddof=1) / np.sqrt(S)
    same = np.flatnonzero(truth == 0)
    assert len(same) == 1 and abs(d2[:, same].mean()) < 4 * se[same].item()
    assert (d2[:, same] < 0).mean() > 0.3
    assert np.corrcoef(d2.mean(0), truth)[0, 1] > 0.9
    means = np.stack([X[items == k] for k in range(n_items)]).mean(1)
    plain = ((means[i] - means[j]) ** 2).reshape(len(i), S, p).mean(-1)
    assert plain[same].mean() > 10 * (plain[same].std() / np.sqrt(S))


def test_crossnobis_membership_errors():
    X = np.zeros((16, 4))
    items = np.repeat(np.arange(4), 4)
    A = sp.csr_matrix(np.array([[1, 1, 0, 0], [0, 0, 0, 0]]))
    with pytest.raises(ValueError, match="row 1 of the membership has no voxel"):
        crossnobis_membership(X, A, items)
    with pytest.raises(ValueError, match="voxel columns"):
        crossnobis_membership(X[:, :3], A, items)
    with pytest.raises(ValueError, match="shrinkage must be"):
        crossnobis_membership(X, A[:1], items, shrinkage=1.5)
    with pytest.raises(ValueError, match="single trial"):
        crossnobis_membership(X, A[:1], items, np.tile(np.arange(4), 4))


def test_ledoit_wolf_is_sklearns():
    from sklearn.covariance import ledoit_wolf

    rng = np.random.default_rng(6)
    R = rng.standard_normal((3, 20, 6)) @ rng.standard_normal((6, 6))
    cov, lam = shrinkage_covariance(R)
    for m in range(3):
        ref, ref_lam = ledoit_wolf(R[m], assume_centered=True)
        np.testing.assert_allclose(cov[m].numpy(), ref, rtol=1e-10)
        assert abs(lam[m].item() - ref_lam) < 1e-10
    cov, lam = shrinkage_covariance(R, 0.5)
    S = R[0].T @ R[0] / 20
    np.testing.assert_allclose(cov[0].numpy(), 0.5 * S + 0.5 * np.trace(S) / 6 * np.eye(6))
    W = noise_whitener(cov).numpy()
    np.testing.assert_allclose(W[0] @ cov[0].numpy() @ W[0], np.eye(6), atol=1e-10)


def test_partitions_and_errors():
    items = np.array([0, 1, 2] * 5 + [0])
    parts = default_partitions(items, random_state=0)    # 5 parts: the rarest item's count
    assert set(parts) == set(range(5))
    for k in range(3):
        assert np.bincount(parts[items == k]).min() >= 1
    with pytest.raises(ValueError, match="from 2 to the smallest number"):
        default_partitions(items, 6)
    with pytest.raises(ValueError, match="from 2 to the smallest number"):
        default_partitions(np.array([0, 0, 1]))
    Y = np.zeros((1, 16, 2))
    with pytest.raises(ValueError, match="no trial in partition 1"):
        partition_means(Y, items, (np.arange(16) >= 14).astype(int) * (items == 2))
    with pytest.raises(ValueError, match="single partition"):
        partition_means(Y, items, np.zeros(16))
    with pytest.raises(ValueError, match="shape"):
        crossval_sq_distances(Y, items, parts, noise=np.eye(3))
