"""Cross-validated distances (crossnobis, cross-validated Euclidean): unbiased, batched."""
import numpy as np
import pytest
import torch

from mlem_neuro.core import crossnobis
from mlem_neuro.core.crossnobis import crossvalidated_distances, default_partitions
from mlem_neuro.core.pairs import pair_indices


def _trials(rng, mu, r, noise=1.0, scales=None):
    """Trials ``(1, I * r, p)`` of items with means ``mu (I, p)``, ``r`` trials each."""
    I, p = mu.shape
    eps = rng.standard_normal((I * r, p)) * noise
    if scales is not None:
        eps = eps * scales
    return (np.repeat(mu, r, axis=0) + eps)[None], np.repeat(np.arange(I), r)


def _true_sq(mu, metric=None):
    i, j = pair_indices(len(mu))
    diff = mu[i] - mu[j]
    if metric is None:
        return (diff ** 2).sum(-1)
    return np.einsum("kp,pq,kq->k", diff, metric, diff)


@pytest.fixture(scope="module")
def means():
    rng = np.random.default_rng(0)
    mu = rng.standard_normal((5, 10))
    mu[1] = mu[0]                                    # two identical items
    return mu


def test_cross_validated_euclidean_is_unbiased(means):
    """Mean over 400 datasets within 4 standard errors of the true squared distance, for
    every pair (including 0 for identical items), while the plain distance of the item
    means is inflated by 2 p σ² / r = 3.3 on every pair."""
    rng = np.random.default_rng(1)
    r = 6
    est, plain = [], []
    for _ in range(400):
        Y, items = _trials(rng, means, r)
        est.append(crossvalidated_distances(Y, items, noise_normalize=False)[1][0])
        m = Y[0].reshape(len(means), r, -1).mean(axis=1)
        plain.append(_true_sq(m))
    est, plain = np.array(est), np.array(plain)
    truth = _true_sq(means)
    se = est.std(axis=0, ddof=1) / np.sqrt(len(est))
    assert np.all(np.abs(est.mean(axis=0) - truth) < 4 * se)
    assert np.all(plain.mean(axis=0) - truth > 2.5)          # the bias it removes
    assert est[:, 0].min() < 0 < est[:, 0].max()             # identical items: around 0


def test_crossnobis_is_unbiased_given_its_noise_covariance(means):
    """Noise with unequal unit variances.  Given the shrunk covariance ``Σ̂`` it whitens
    with, crossnobis estimates ``(μ_i − μ_j)ᵀ Σ̂⁻¹ (μ_i − μ_j)`` without bias (``Σ̂`` comes
    from residuals independent of the partition means): the mean difference over 300
    datasets is within 4 standard errors of 0 on every pair, and the identical items are
    at 0.  Against the true ``Σ`` the shrinkage (0.15 here) shortens the distances
    (measured: 77-90 % of the true Mahalanobis distances)."""
    rng = np.random.default_rng(2)
    scales = np.linspace(0.5, 2.0, means.shape[1])
    r, (i, j) = 40, pair_indices(len(means))
    err, est = [], []
    for _ in range(300):
        Y, items = _trials(rng, means, r, scales=scales)
        d2 = crossvalidated_distances(Y, items)[1][0]
        parts = default_partitions(items, 8)                 # what the default used
        cell = items * 8 + parts
        cm = np.stack([Y[0, cell == c].mean(axis=0) for c in range(cell.max() + 1)])
        resid = Y[0] - cm[cell]
        dof = len(items) - len(cm)
        cov, _ = crossnobis._ledoit_wolf(torch.as_tensor(resid[None] * np.sqrt(len(items)
                                                                               / dof)))
        prec = np.linalg.inv(cov[0].numpy())
        diff = means[i] - means[j]
        err.append(d2 - np.einsum("kp,pq,kq->k", diff, prec, diff))
        est.append(d2)
    err, est = np.array(err), np.array(est)
    se = err.std(axis=0, ddof=1) / np.sqrt(len(err))
    assert np.all(np.abs(err.mean(axis=0)) < 4 * se)
    assert abs(est[:, 0].mean()) < 4 * est[:, 0].std(ddof=1) / np.sqrt(len(est))


def test_models_are_batched_and_the_incomplete_path_agrees(means):
    rng = np.random.default_rng(3)
    Y = np.concatenate([_trials(rng, means * s, 4)[0] for s in (1.0, 0.5, 2.0)])
    items = np.repeat(np.arange(len(means)), 4)
    for nn in (False, True):
        labels, d2 = crossvalidated_distances(Y, items, noise_normalize=nn)
        assert d2.shape == (3, len(pair_indices(len(means))[0]))
        one = np.stack([crossvalidated_distances(Y[m:m + 1], items, noise_normalize=nn)[1][0]
                        for m in range(3)])
        np.testing.assert_allclose(d2, one, rtol=1e-10, atol=1e-10)
    # the general path (items missing from partitions) equals the Gram path when none is
    means_t = torch.as_tensor(rng.standard_normal((2, 3, 5, 4)))
    i, j = pair_indices(5)
    full = crossnobis._complete(means_t, i, j)
    general = crossnobis._incomplete(means_t, torch.ones(3, 5, dtype=torch.float64), i, j,
                                     np.arange(5))
    torch.testing.assert_close(full, general)


def test_items_missing_from_a_partition_use_the_partitions_they_share():
    rng = np.random.default_rng(4)
    mu = rng.standard_normal((3, 6))
    Y, items = _trials(rng, mu, 6)
    parts = np.tile(np.arange(3), 6)                 # 2 trials of each item per partition
    keep = ~((items == 2) & (parts == 0))            # item 2 misses partition 0
    labels, d2 = crossvalidated_distances(Y[:, keep], items[keep], parts[keep],
                                          noise_normalize=False)
    # pair (0, 1) still uses all 3 partitions: same as without the dropped trials
    _, ref = crossvalidated_distances(Y, items, parts, noise_normalize=False)
    assert d2[0, 0] == pytest.approx(ref[0, 0])
    # pairs with item 2: partitions 1 and 2 only, by hand
    m = {(it, k): Y[0, (items == it) & (parts == k)].mean(axis=0)
         for it in range(3) for k in range(3)}
    by_hand = (m[0, 1] - m[2, 1]) @ (m[0, 2] - m[2, 2])
    assert d2[0, 1] == pytest.approx(by_hand)


def test_default_partitions_put_every_item_in_every_partition():
    items = np.array(["a"] * 5 + ["b"] * 3 + ["c"] * 12)
    parts = default_partitions(items)
    assert set(parts) == {0, 1, 2}                              # fewest trials: 3
    for it in "abc":
        assert set(parts[items == it]) == {0, 1, 2}
    assert len(set(default_partitions(np.repeat(np.arange(3), 20)))) == \
        crossnobis.MAX_PARTITIONS


@pytest.mark.parametrize("kw, match", [
    (dict(items=np.array([0, 0, 1])), "at least 2 trials of every item"),
    (dict(items=np.array([0, 0, 1, 1]), partitions=np.array([0, 0, 1, 1])),
     "fewer than 2 partitions"),
    (dict(items=np.array([0, 1])), "one label per trial"),
    (dict(items=np.array([0, 0, 1, 1]), partitions=np.array([0, 1])),
     "partitions must have one label per trial"),
])
def test_bad_items_or_partitions_are_refused(kw, match):
    n = 3 if kw["items"].tolist() == [0, 0, 1] else 4
    with pytest.raises(ValueError, match=match):
        crossvalidated_distances(np.zeros((1, n, 2)), noise_normalize=False, **kw)


def test_crossnobis_needs_repeated_trials_per_cell():
    Y = np.random.default_rng(0).standard_normal((1, 4, 3))
    with pytest.raises(ValueError, match="single trial"):
        crossvalidated_distances(Y, [0, 0, 1, 1], [0, 1, 0, 1])
    with pytest.raises(ValueError, match="n_models, n_trials, n_units"):
        crossvalidated_distances(Y[0], [0, 0, 1, 1])


def test_condensed_source_serves_any_subset_of_stimuli():
    from mlem_neuro.core.sources import CondensedRDMSource, RDMSource

    rng = np.random.default_rng(5)
    X = rng.standard_normal((3, 7, 4))
    full = np.stack([np.linalg.norm(x[:, None] - x[None], axis=-1) for x in X])
    i, j = pair_indices(7)
    source = CondensedRDMSource(full[:, i, j])
    assert isinstance(source, RDMSource) and source.n_stimuli == 7 and source.n_models == 3
    stim = np.array([5, 1, 3])
    a, b = pair_indices(3)
    np.testing.assert_array_equal(source.subset([0, 2]).rdm(stim).numpy(),
                                  full[[0, 2]][:, stim[a], stim[b]])
    for bad, match in ((np.zeros((2, 4)), "number of pairs"), (np.zeros(3), "n_models"),
                       (np.full((1, 3), np.nan), "NaN")):
        with pytest.raises(ValueError, match=match):
            CondensedRDMSource(bad)
