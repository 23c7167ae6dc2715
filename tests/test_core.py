"""Unit tests of the core building blocks against independent references."""
import numpy as np
import pandas as pd
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import rankdata as sp_rankdata
from scipy.stats import spearmanr

from mlem_neuro.core.ranks.spearman import (
    pearson,
    rankdata,
    soft_spearman,
    spearman,
    standardize,
)
from mlem_neuro.core.rdms.neural import NeuralTargets, rdm_from_rows
from mlem_neuro.core.runtime import Runtime
from mlem_neuro.core.scoring.importance import term_importance
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.stimuli.pairs import (
    kfold_stimuli,
    linear_to_pair,
    n_pairs,
    pair_indices,
    sample_pairs,
)
from mlem_neuro.core.training.metric import (
    make_W,
    predict,
    term_index,
    term_matrix,
    term_names,
)


# ----------------------------------------------------------------------------- pairs
@pytest.mark.parametrize("n", [3, 7, 128, 1001])
def test_linear_to_pair_inverts_pair_indices(n):
    i, j = pair_indices(n)
    assert len(i) == n_pairs(n) == n * (n - 1) // 2
    assert np.all(i < j)
    ii, jj = linear_to_pair(np.arange(len(i)), n)
    np.testing.assert_array_equal(ii, i)
    np.testing.assert_array_equal(jj, j)


def test_sample_pairs_distinct_and_in_range():
    rng = np.random.default_rng(0)
    for total, size in [(100, 10), (100, 90), (10**7, 5000), (50, 50)]:
        s = sample_pairs(rng, total, size)
        assert len(s) == size and len(np.unique(s)) == size
        assert s.min() >= 0 and s.max() < total


def test_kfold_partitions_stimuli():
    folds = kfold_stimuli(23, 5, np.random.default_rng(0))
    tests = np.concatenate([te for _, te in folds])
    np.testing.assert_array_equal(np.sort(tests), np.arange(23))
    for tr, te in folds:
        assert not set(tr) & set(te)
    with pytest.raises(ValueError, match="folds"):
        kfold_stimuli(10, 5, np.random.default_rng(0))


# ------------------------------------------------------------------------- spearman
def test_rankdata_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=(4, 300)).astype(float)     # many ties
    r = rankdata(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(r, np.stack([sp_rankdata(row) for row in x]))


@pytest.mark.parametrize("case", ["continuous", "ties", "signs and zeros", "near ties",
                                  "not finite", "long rows"])
def test_rankdata_by_packed_keys_is_exact(case):
    """The packed-key sort of float64 rows gives scipy's average ranks in every case: ties
    and signed zeros averaged, values one ulp apart (in the bits the key drops) and rows
    with infinities or NaN sorted again exactly."""
    from mlem_neuro.core.ranks.spearman import _packed_order, sort_with_ties

    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 3000))
    if case == "ties":
        x = np.round(x, 1)
    elif case == "signs and zeros":
        x = np.round(x, 0) * 1e-300
        x[:, :40] = -0.0
        x[:, 40:80] = 0.0
    elif case == "near ties":
        x[:, 1::2] = np.nextafter(x[:, ::2], np.inf)         # pairs 1 ulp apart
        x[:, ::2], x[:, 1::2] = x[:, 1::2].copy(), x[:, ::2].copy()
    elif case == "not finite":
        x[0, 5], x[1, 7], x[2, 9] = np.inf, -np.inf, 1e308
    elif case == "long rows":
        x = rng.standard_normal((2, 70000)) * 1e3
    r = rankdata(torch.as_tensor(x)).numpy()
    np.testing.assert_array_equal(r, np.stack([sp_rankdata(row) for row in x]))
    order, s, tied = sort_with_ties(torch.as_tensor(x))
    assert (np.diff(s.numpy(), axis=1) >= 0).all()
    np.testing.assert_array_equal(s.numpy(), np.take_along_axis(x, order.numpy(), 1))
    if case == "near ties":
        # the packed keys alone cannot separate them: the exact re-sort did
        o = _packed_order(x)
        assert (np.diff(np.take_along_axis(x, o, 1), axis=1) < 0).any()


@pytest.mark.parametrize("compiled", [True, False])
def test_importance_score_equals_scipy_spearman_with_and_without_ties(watch_compiled, compiled):
    """The held-out score of importance (fixed standardised ranks in sorted order for
    rows without ties, average ranks otherwise), broadcast over permutations: by the
    compiled keys and scores (rows with ties or values one ulp apart recomputed) and
    without them."""
    from mlem_neuro.core.scoring.importance import _score

    calls = watch_compiled("sorted_scores", compiled)
    rng = np.random.default_rng(1)
    target = rng.standard_normal((3, 400))
    q = rng.standard_normal((3, 5, 400))
    q[0, 1] = np.round(q[0, 1], 1)                            # a row with ties
    q[1, 2, 1::2] = np.nextafter(q[1, 2, ::2], -np.inf)       # values 1 ulp apart
    tz = standardize(rankdata(torch.as_tensor(target)))
    rho = _score(torch.as_tensor(q), tz[:, None, :], compiled).numpy()
    ref = np.array([[spearmanr(q[a, b], target[a])[0] for b in range(5)] for a in range(3)])
    np.testing.assert_allclose(rho, ref, atol=1e-12)
    np.testing.assert_allclose(_score(torch.as_tensor(q[0, 1]), tz[0], compiled).numpy(), ref[0, 1],
                               atol=1e-12)
    np.testing.assert_allclose(_score(torch.as_tensor(q[2]), tz[2], compiled).numpy(), ref[2],
                               atol=1e-12)
    assert all((out is not None) is compiled for out in calls) and len(calls) == 3
    q[2, 0, 3] = np.inf                                       # not finite: the other path
    rho = _score(torch.as_tensor(q), tz[:, None, :], compiled).numpy()
    np.testing.assert_allclose(rho[:2], ref[:2], atol=1e-12)


def test_exact_spearman_matches_scipy():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 4, 500).astype(float)
    b = a + rng.normal(size=500)
    ours = spearman(torch.as_tensor(a)[None], torch.as_tensor(b)[None]).item()
    assert ours == pytest.approx(spearmanr(a, b)[0], abs=1e-10)


def _realistic_batch(rng, size, m=8, noise=0.3):
    D = rng.integers(0, 2, (size, m)).astype(np.float32)
    A = rng.standard_normal((m, m))
    W = A @ A.T
    W /= np.linalg.norm(W)
    pred = np.sqrt(np.einsum("pa,ab,pb->p", D, W, D))
    target = np.exp(3 * (pred + noise * pred.std() * rng.standard_normal(size)))
    return torch.as_tensor(pred, dtype=torch.float32), torch.as_tensor(target)


@pytest.mark.parametrize("size", [4096, 20000])
def test_soft_spearman_is_a_rank_correlation(size):
    """Soft ρ tracks exact ρ (within 0.02), not Pearson, on realistic batches."""
    rng = np.random.default_rng(size)
    for _ in range(3):
        pred, target = _realistic_batch(rng, size)
        tz = standardize(rankdata(target.double())).float()
        soft = soft_spearman(pred[None], tz[None]).item()
        exact = spearman(pred[None].double(), target[None]).item()
        pear = pearson(pred[None].double(), target[None]).item()
        assert abs(soft - exact) < 0.02
        # the target is a strongly convex transform: Pearson is far from Spearman here,
        # so staying close to exact ρ rules out the "soft Spearman = Pearson" failure.
        assert abs(pear - exact) > 0.05
        assert abs(soft - exact) < abs(pear - exact) / 5


def test_raw_torchsort_collapses_to_pearson():
    """The pitfall the rescaling avoids: raw soft ranks of values in [0, √m] are affine."""
    import torchsort

    rng = np.random.default_rng(3)
    pred, target = _realistic_batch(rng, 10000)
    raw = torchsort.soft_rank(pred[None], regularization_strength=1.0)
    # one pooled block: soft ranks are an affine function of the values → Pearson
    assert pearson(raw.double(), pred[None].double()).item() > 0.9999


def test_soft_spearman_has_useful_gradient():
    rng = np.random.default_rng(4)
    pred, target = _realistic_batch(rng, 4096)
    tz = standardize(rankdata(target.double())).float()
    p = pred.clone().requires_grad_(True)
    soft_spearman(p[None], tz[None]).sum().backward()
    g = p.grad
    assert torch.isfinite(g).all()
    assert (g != 0).float().mean() > 0.5          # most pairs receive gradient


# --------------------------------------------------------------------------- metric
@pytest.mark.parametrize("constraint", ["spd", "diagonal", "none"])
def test_make_W_properties(constraint):
    torch.manual_seed(0)
    A = torch.randn(5, 4, 4, dtype=torch.float64)
    W = make_W(A, constraint)
    np.testing.assert_allclose(torch.linalg.matrix_norm(W).numpy(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(W.numpy(), W.transpose(-1, -2).numpy())
    eig = torch.linalg.eigvalsh(W)
    if constraint in ("spd", "diagonal"):
        assert (eig > 0).all()
    if constraint == "diagonal":
        off = W - torch.diag_embed(W.diagonal(dim1=-2, dim2=-1))
        assert off.abs().max() == 0
    if constraint == "none":
        assert (eig < 0).any()                       # random symmetric A: indefinite W


def test_term_form_equals_quadratic_form():
    """Σ_t w_t P_t with P_kl = 2 d_k d_l reproduces dᵀ W d (the reported W is the used W)."""
    rng = np.random.default_rng(0)
    m = 5
    D = torch.as_tensor(rng.random((50, m)))
    W = make_W(torch.as_tensor(rng.standard_normal((2, m, m))), "spd")
    k, l = term_index(m)
    q_terms = W[:, k, l] @ term_matrix(D, k, l).T
    q_quad = torch.einsum("pa,Mab,pb->Mp", D, W, D)
    np.testing.assert_allclose(q_terms.numpy(), q_quad.numpy(), rtol=1e-12)
    assert len(k) == m * (m + 1) // 2
    assert term_names(["a", "b", "c"]) == ["a", "b", "c", "a:b", "a:c", "b:c"]
    assert term_names(["a", "b"], interactions=False) == ["a", "b"]


def test_predict_is_monotone_for_indefinite_W():
    q = torch.linspace(-3, 3, 101, dtype=torch.float64)
    p = predict(q, "none")
    assert torch.all(p[1:] > p[:-1])
    assert torch.all(torch.isfinite(predict(torch.zeros(3), "spd")))


# -------------------------------------------------------------------------- neural
@pytest.mark.parametrize("metric", ["euclidean", "correlation", "cosine"])
def test_gram_rdm_matches_scipy(metric):
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((3, 20, 7)) + 5.0     # offset: tests the centring
    i, j = pair_indices(20)
    got = rdm_from_rows(torch.as_tensor(Y), i, j, metric).numpy()
    ref = np.stack([pdist(y, metric=metric) for y in Y])
    np.testing.assert_allclose(got, ref, rtol=1e-8, atol=1e-10)


def test_neural_targets_gather_path_matches_gram(monkeypatch):
    from mlem_neuro.core.rdms import neural

    rng = np.random.default_rng(1)
    Y = rng.standard_normal((2, 15, 4))
    i, j = pair_indices(15)
    lin = np.arange(len(i))
    full = NeuralTargets.from_data(Y, "euclidean", "cpu").take(lin, i, j)
    monkeypatch.setattr(neural, "MAX_FULL_ELEMENTS", 0)
    rows = NeuralTargets.from_data(Y, "euclidean", "cpu")
    assert rows.full is None
    np.testing.assert_allclose(rows.take(lin, i, j).numpy(), full.numpy(), rtol=1e-10)


# ------------------------------------------------------------------------ features
def test_feature_distances_by_kind():
    table = pd.DataFrame({
        "word": ["dog", "cat", "dog", None],
        "size": [0.0, 10.0, 5.0, 2.5],
        "level": pd.Categorical(["lo", "hi", "mid", "lo"], categories=["lo", "mid", "hi"],
                                ordered=True),
        "flag": [True, False, True, True],
    })
    fs = FeatureSpace().fit(table)
    assert fs.kinds_ == {"word": "categorical", "size": "numeric", "level": "ordinal",
                         "flag": "categorical"}
    i, j = pair_indices(4)
    D = fs.transform(table).pair_distances(i, j)
    pairs = list(zip(i, j))
    col = {name: D[:, k] for k, name in enumerate(fs.feature_names_)}
    expect_word = [1, 0, 0, 1, 0, 0]          # pairs with the missing row (3) → 0
    np.testing.assert_array_equal(col["word"], expect_word)
    np.testing.assert_allclose(col["size"], [abs(table["size"][a] - table["size"][b]) / 10
                                             for a, b in pairs])
    codes = {"lo": 0, "mid": 1, "hi": 2}
    np.testing.assert_allclose(col["level"], [abs(codes[table["level"][a]] -
                                                  codes[table["level"][b]]) / 2
                                              for a, b in pairs])
    np.testing.assert_array_equal(col["flag"], [1, 0, 0, 1, 1, 0])


def test_numeric_scaling_is_fitted_on_training_stimuli():
    train = pd.DataFrame({"x": [0.0, 2.0, 4.0]})
    test = pd.DataFrame({"x": [0.0, 8.0, 4.0]})
    fs = FeatureSpace().fit(train)
    D = fs.transform(test).pair_distances(*pair_indices(3))
    np.testing.assert_allclose(D[:, 0], [2.0, 1.0, 1.0])     # scale 1/4 from training


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_equal_level_gaps_give_equal_distances(dtype):
    """Pairs one level apart tie exactly (ordinal codes, integer numeric levels, grouped
    columns): scaling each value before the difference gave 1/3 for levels (0, 1) and
    0.33333333333333337 for (1, 2), so exact Spearman ranked tied pairs apart by rounding
    (measured: held-out score off by up to 0.08 against scipy on the exact distances, one
    4-level ordinal feature, heteroscedastic responses, 20 seeds)."""
    from mlem_neuro.core.stimuli.features import FeatureSpace

    L = 10
    table = pd.DataFrame({
        "o": pd.Categorical(np.arange(L), categories=list(range(L)), ordered=True),
        "x": np.arange(L, dtype=float) + 3.0,
        "gx": np.arange(L, dtype=float), "gy": 2.0 * np.arange(L)})
    enc = FeatureSpace(groups={"g": ["gx", "gy"]}).fit_transform(table)
    i, j = pair_indices(L)
    D = enc.to_torch("cpu", dtype).pair_distances(torch.as_tensor(i),
                                                  torch.as_tensor(j)).double().numpy()
    gap = j - i
    for f in range(3):
        for g in range(1, L):
            assert len(np.unique(D[gap == g, f])) == 1, (enc.names[f], g)
    np.testing.assert_allclose(D[:, 0], gap / (L - 1), rtol=1e-6)
    np.testing.assert_allclose(D[:, 2], np.hypot(gap, gap) / (L - 1), rtol=1e-6)


@pytest.mark.parametrize("step, offset", [(0.1, 0.0), (0.1, 10.0), (0.3, 0.7), (0.01, 1.0)])
def test_decimal_level_gaps_give_equal_distances(step, offset):
    """Numeric levels written in decimals (0.1, 0.2, ...) tie at equal gaps: their float
    differences differ in the last bits (0.3 - 0.2 != 0.2 - 0.1), which ranked pairs apart
    (measured: held-out score off by up to 0.064 from scipy on the exact gaps, levels
    0.1-0.4, heteroscedastic responses, 20 seeds)."""
    from mlem_neuro.core.stimuli.features import FeatureSpace

    L = 12
    x = offset + step * np.arange(L)
    table = pd.DataFrame({"x": x, "gx": x, "gy": x[::-1].copy()})
    enc = FeatureSpace(groups={"g": ["gx", "gy"]}).fit_transform(table)
    i, j = pair_indices(L)
    D = enc.pair_distances(i, j)
    gap = j - i
    for f in range(2):
        for g in range(1, L):
            assert len(np.unique(D[gap == g, f])) == 1, (enc.names[f], g)
    np.testing.assert_allclose(D[:, 0], gap / (L - 1), rtol=1e-9)


@pytest.mark.parametrize("kind", ["ordinal", "decimal"])
def test_score_ties_equal_level_gaps(kind):
    """The estimator's score equals scipy's on the exact (tied) distances."""
    from mlem_neuro import MLEM

    rng = np.random.default_rng(3)
    lev = np.repeat(np.arange(4), 10)
    F = pd.DataFrame({"o": pd.Categorical(lev, categories=[0, 1, 2, 3], ordered=True)
                      if kind == "ordinal" else 0.1 + 0.1 * lev})
    X = np.column_stack([lev + 0.0, rng.normal(size=(40, 2)) * (0.2 + 0.6 * lev[:, None])])
    est = MLEM(max_steps=5).fit(X, F)
    i, j = pair_indices(40)
    expected = spearmanr(np.abs(lev[i] - lev[j]), pdist(X)).statistic
    assert est.score(X, F) == pytest.approx(expected, abs=1e-12)


def test_unseen_category_differs_from_all_levels():
    fs = FeatureSpace().fit(pd.DataFrame({"c": ["a", "b", "a"]}))
    D = fs.transform(pd.DataFrame({"c": ["a", "z", "z"]})).pair_distances(*pair_indices(3))
    np.testing.assert_array_equal(D[:, 0], [1, 1, 0])


# ---------------------------------------------------------------------- importance
def test_term_importance_matches_explicit_permutation():
    """The batched shortcut equals permuting a term column and rescoring from scratch."""
    rng = np.random.default_rng(0)
    m, P = 3, 200
    D = torch.as_tensor(rng.random((P, m)))
    W = make_W(torch.as_tensor(rng.standard_normal((2, m, m))), "spd")
    target = torch.as_tensor(rng.random((2, P)))
    k, l = term_index(m)
    drops, base = term_importance(W, D, target, k, l, 3, np.random.default_rng(5))
    # redo by hand with the same permutations
    rng2 = np.random.default_rng(5)
    Pt = term_matrix(D, k, l)
    for t in range(len(k)):
        perms = [rng2.permutation(P) for _ in range(3)]
        for r, perm in enumerate(perms):
            Pp = Pt.clone()
            Pp[:, t] = Pt[perm, t]
            for M in range(2):
                q = (W[M, k, l] * Pp).sum(1)
                s = spearmanr(q.numpy(), target[M].numpy())[0]
                assert drops[M, t, r].item() == pytest.approx(base[M].item() - s, abs=1e-10)


# --------------------------------------------------------------------------- utils
def test_verbose_decorator_sets_level_for_the_call_only():
    import logging

    from mlem_neuro.utils import logger, set_log_level, verbose

    @verbose
    def work(verbose=None):
        return logger.level

    set_log_level("WARNING")
    assert work(verbose="DEBUG") == logging.DEBUG
    assert work(verbose=True) == logging.INFO
    assert work() == logging.WARNING
    assert logger.level == logging.WARNING
    with pytest.raises(ValueError, match="verbose"):
        work(verbose="chatty")


def test_batch_size_selection_from_group_counts_equals_per_pair():
    """Grouped term rows give the same correlations, hence the same batch size."""
    from mlem_neuro.core.ranks.grouped import distinct_rows
    from mlem_neuro.core.stimuli.features import FeatureSpace
    from mlem_neuro.core.training.batch_size import correlation_spread, select_batch_size
    from mlem_neuro.core.training.engine import PairTerms
    from mlem_neuro.core.training.metric import term_index
    rng = np.random.default_rng(0)
    table = pd.DataFrame({f: rng.choice(list("abc"), 150) for f in "xyzw"})
    enc = FeatureSpace().fit_transform(table)
    k, l = term_index(4)
    terms = PairTerms(enc.to_torch("cpu", torch.float32), 150, k, l)
    groups = distinct_rows(terms.all)
    assert groups is not None and groups[0].shape[0] <= 16
    for size in (500, 4000):
        a = correlation_spread(terms.take, 150, size, np.random.default_rng(1))
        b = correlation_spread(terms.take, 150, size, np.random.default_rng(1), groups=groups)
        assert a > 0.005
        assert abs(a - b) < 1e-9
    assert (select_batch_size(terms.take, 150, np.random.default_rng(2))
            == select_batch_size(terms.take, 150, np.random.default_rng(2), groups=groups))


@pytest.mark.parametrize("level", ["term", "feature"])
def test_grouped_importance_equals_explicit_permutations(level, monkeypatch):
    """Categorical designs are scored by groups of identical pairs; the drops equal those of
    permuting and rescoring every pair explicitly (scipy's tie-aware Spearman)."""
    import mlem_neuro.core.scoring.importance as importance
    from mlem_neuro.core.scoring.importance import feature_importance
    rng = np.random.default_rng(3)
    n, K = 60, 3
    table = pd.DataFrame({"a": rng.choice(list("xy"), n), "b": rng.choice(list("pqr"), n),
                          "c": rng.integers(0, 3, n)})
    enc = FeatureSpace(kinds={"c": "ordinal"}).fit_transform(table)
    i, j = pair_indices(n)
    W = make_W(torch.as_tensor(rng.standard_normal((2, 3, 3))), "spd")
    D = torch.as_tensor(enc.pair_distances(i, j))
    target = torch.as_tensor(rng.random((2, len(i)))) + (D @ torch.rand(3, 2).double()).T
    k, l = term_index(3)
    enc_t = enc.to_torch("cpu", torch.float64)
    calls = []
    real = importance.distinct_rows
    monkeypatch.setattr(importance, "distinct_rows",
                        lambda *P: calls.append(1) or real(*P))
    if level == "term":
        drops, base = term_importance(W, D, target, k, l, K, np.random.default_rng(7))
    else:
        drops, base = feature_importance(W, enc_t, i, j, target, K, np.random.default_rng(7))
    assert calls and real(D) is not None                    # the grouped path ran
    # explicit reference; predictions rounded so that identical pairs tie exactly
    rng2 = np.random.default_rng(7)
    Pt = term_matrix(D, k, l)

    def rho(q, M):
        return spearmanr(np.round(q.numpy(), 10), target[M].numpy())[0]

    for M in range(2):
        assert base[M].item() == pytest.approx(rho((W[M, k, l] * Pt).sum(1), M), abs=1e-12)
    for t in range(drops.shape[1]):
        if level == "term":
            perms = [rng2.permutation(len(i)) for _ in range(K)]
        else:
            perms = [rng2.permutation(n) for _ in range(K)]
        for r, perm in enumerate(perms):
            if level == "term":
                Pp = Pt.clone()
                Pp[:, t] = Pt[perm, t]
            else:
                Dp = D.clone()
                Dp[:, t] = enc_t.feature_distance(t, torch.as_tensor(i), torch.as_tensor(j),
                                                  perm=torch.as_tensor(perm)).double()
                Pp = term_matrix(Dp, k, l)
            for M in range(2):
                expected = base[M].item() - rho((W[M, k, l] * Pp).sum(1), M)
                assert drops[M, t, r].item() == pytest.approx(expected, abs=1e-12)
    assert drops.abs().max() > 0.01


def test_per_pair_feature_importance_compiled_and_not_equal_explicit_permutations(
        monkeypatch, watch_compiled):
    """Numeric designs are scored pair by pair: the predictions and their packed keys in
    one compiled pass, or in torch; both give the drops of permuting a feature's values
    and rescoring every pair with scipy (ties included: feature "c" repeats its values)."""
    from mlem_neuro.core import kernels
    from mlem_neuro.core.scoring import importance

    rng = np.random.default_rng(4)
    n, K = 50, 3
    table = pd.DataFrame({"a": rng.random(n), "b": rng.random(n),
                          "c": np.round(rng.random(n), 1)})
    enc_t = FeatureSpace().fit_transform(table).to_torch("cpu", torch.float64)
    i, j = pair_indices(n)
    W = make_W(torch.as_tensor(rng.standard_normal((2, 3, 3))), "spd").double()
    target = torch.as_tensor(rng.random((2, len(i))))
    used = watch_compiled("feature_scores")
    out = {}
    for compiled in ([True, False] if kernels.built() else [False]):
        used.clear()
        out[compiled] = importance.feature_importance(W, enc_t, i, j, target, K,
                                                      np.random.default_rng(7),
                                                      runtime=Runtime(compiled=compiled))
        assert len(used) == 3 and all((u is not None) is compiled for u in used)
    drops, base = out[False]
    if True in out:
        np.testing.assert_allclose(out[True][0], drops, atol=1e-12)
        np.testing.assert_allclose(out[True][1], base, atol=1e-12)
    ti, tj = torch.as_tensor(i), torch.as_tensor(j)
    D = enc_t.pair_distances(ti, tj).double()
    rng2 = np.random.default_rng(7)
    for f in range(3):
        for r in range(K):
            Dp = D.clone()
            Dp[:, f] = enc_t.feature_distance(
                f, ti, tj, perm=torch.as_tensor(rng2.permutation(n))).double()
            for M in range(2):
                q = np.einsum("pa,ab,pb->p", Dp.numpy(), W[M].numpy(), Dp.numpy())
                expected = base[M].item() - spearmanr(np.round(q, 10), target[M])[0]
                assert drops[M, f, r].item() == pytest.approx(expected, abs=1e-12)
    assert drops.abs().max() > 0.01
