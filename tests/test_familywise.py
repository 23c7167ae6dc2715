"""Family-wise error over models *and* tests: ``familywise_over_tests`` and the results'
``pvalues_fwe_tests`` / ``significant(corrected=...)``.

The rate it gives on pure-noise analyses is measured by ``validation/calib_familywise.py``
(the method page quotes it); here: the function on hand-made arrays, against the closed
testing procedure it shortcuts, and on simulated p-values whose truth is known.
"""
import itertools

import numpy as np
import pytest

from mlem_neuro import read_result
from mlem_neuro.results import BrainMapResult, TimeCourseResult
from mlem_neuro.stats import familywise_over_tests


def _holm(p):
    """Textbook Holm adjusted p-values of a vector (ties in index order)."""
    order = np.argsort(p, kind="stable")
    k = len(p)
    adj = np.maximum.accumulate((k - np.arange(k)) * p[order])
    out = np.empty(k)
    out[order] = np.minimum(1.0, adj)
    return out


def _closure(p):
    """Closed testing by brute force: (t, m) is rejected at level alpha when every set
    I of (test, model) hypotheses containing it has j * min over I of p <= alpha, j the
    number of tests in I.  The adjusted p-value is the largest such local p-value."""
    M, k = p.shape
    pairs = [(m, t) for t in range(k) for m in range(M) if not np.isnan(p[m, t])]
    out = np.full(p.shape, np.nan)
    for m, t in pairs:
        rest = [q for q in pairs if q != (m, t)]
        worst = 0.0
        for n in range(len(rest) + 1):
            for extra in itertools.combinations(rest, n):
                members = [(m, t), *extra]
                j = len({u for _, u in members})
                worst = max(worst, min(1.0, j * min(p[a, b] for a, b in members)))
        out[m, t] = worst
    return out


# -------------------------------------------------------------------- the function
def test_one_model_is_holm():
    p = np.array([[0.01, 0.04, 0.03]])
    np.testing.assert_allclose(familywise_over_tests(p), [[0.03, 0.06, 0.06]])
    rng = np.random.default_rng(0)
    for _ in range(50):
        row = rng.uniform(0, 0.2, 5)
        np.testing.assert_allclose(familywise_over_tests(row[None])[0], _holm(row))


def test_step_down_order():
    # test 1 is significant at every model: it leaves the count for the others
    p = np.array([[0.01, 0.02, 0.50],
                  [0.04, 0.01, 0.20]])
    np.testing.assert_allclose(familywise_over_tests(p), [[0.03, 0.06, 0.50],
                                                          [0.08, 0.03, 0.20]])
    # every test with a model far from significance: Bonferroni over the tests
    p = np.array([[0.01, 0.02, 0.004],
                  [0.90, 0.70, 0.800]])
    np.testing.assert_allclose(familywise_over_tests(p), np.minimum(1, 3 * p))


@pytest.mark.parametrize("seed", range(30))
def test_equals_closed_testing(seed):
    rng = np.random.default_rng(seed)
    M, k = rng.integers(1, 4), rng.integers(1, 4)
    p = rng.integers(1, 21, (M, k)) / 20.0                   # ties, as with n_null = 19
    if seed % 3 == 0:
        p[:, 0] = rng.integers(1, 3, M) / 100                # one test significant everywhere
    if seed % 5 == 1 and M > 1:
        p[0, -1] = np.nan                                    # a model without a statistic
    np.testing.assert_allclose(familywise_over_tests(p), _closure(p), equal_nan=True)


def test_bounds_and_monotone():
    rng = np.random.default_rng(1)
    for _ in range(100):
        p = rng.uniform(0, 0.3, (6, 4)) ** rng.uniform(0.5, 3, 4)
        adj = familywise_over_tests(p)
        assert np.all(adj >= p - 1e-15) and np.all(adj <= 1)
        # the order of the models within a test is kept
        for t in range(4):
            o = np.argsort(p[:, t])
            assert np.all(np.diff(adj[o, t]) >= -1e-15)
        # smaller p-values never give larger corrected ones
        lower = p * rng.uniform(0.2, 1, p.shape)
        assert np.all(familywise_over_tests(lower) <= adj + 1e-15)
        # the columns' order does not matter
        perm = rng.permutation(4)
        np.testing.assert_allclose(familywise_over_tests(p[:, perm]), adj[:, perm])


def test_single_test_is_pvalues_fwe():
    p = np.array([[0.01], [0.3], [1.0], [0.05]])
    np.testing.assert_array_equal(familywise_over_tests(p), p)


def test_nan_columns_stay_nan_and_do_not_count():
    p = np.array([[0.01, np.nan, 0.02, 0.6],
                  [0.50, np.nan, 0.70, 0.9]])
    adj = familywise_over_tests(p)
    assert np.isnan(adj[:, 1]).all()
    np.testing.assert_allclose(adj[:, [0, 2, 3]], familywise_over_tests(p[:, [0, 2, 3]]))
    np.testing.assert_allclose(adj[0, 0], 0.03)                   # k = 3, not 4
    # a NaN model in a testable column stays NaN, its column still counts
    p[1, 2] = np.nan
    adj = familywise_over_tests(p)
    assert np.isnan(adj[1, 2]) and np.isclose(adj[0, 0], 0.03)
    assert np.isnan(familywise_over_tests(np.full((3, 2), np.nan))).all()


def test_bad_input():
    with pytest.raises(ValueError, match="shape"):
        familywise_over_tests([0.1, 0.2])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        familywise_over_tests([[0.1, 1.2]])


def _min_ranked(p):
    """Holm over the tests ranked by their *smallest* p-value (not valid per model)."""
    k = p.shape[1]
    P = p.min(axis=0)
    order = np.argsort(P, kind="stable")
    out, prior = np.empty_like(p), 0.0
    for r, t in enumerate(order):
        out[:, t] = np.minimum(1, np.maximum(prior, (k - r) * p[:, t]))
        prior = max(prior, (k - r) * P[t])
    return out


def test_known_truth_family_wise_rate():
    """Test A has a real effect at model 0 and none at model 1; test B none anywhere.
    Valid per-test corrected p-values (A's null model uniform; B's two models share one
    uniform value, so that B's smallest is uniform too), independent tests: the rate of
    any false positive stays at alpha, where ranking the tests by their smallest p-value
    would reach 1 - (1 - alpha / 2)(1 - alpha) = 0.074."""
    rng = np.random.default_rng(3)
    n, alpha = 20000, 0.05
    false = np.zeros(n, bool)
    false_min = np.zeros(n, bool)
    for i in range(n):
        u = rng.uniform(size=2)
        p = np.array([[0.001, u[1]], [u[0], u[1]]])          # models x tests (A, B)
        null = np.array([[False, True], [True, True]])
        false[i] = (familywise_over_tests(p)[null] < alpha).any()
        false_min[i] = (_min_ranked(p)[null] < alpha).any()
    se = np.sqrt(alpha * (1 - alpha) / n)
    assert false.mean() <= alpha + 3 * se
    assert false_min.mean() > alpha + 5 * se


# ---------------------------------------------------------------------- the results
def _timecourse(p_fwe, n_null=99, seed=0):
    rng = np.random.default_rng(seed)
    M = len(p_fwe)
    p = np.minimum(p_fwe, rng.uniform(0, 1, p_fwe.shape))
    return TimeCourseResult(
        rng.standard_normal((2, M, 3)), rng.uniform(-1, 1, (2, M)),
        rng.standard_normal((2, M, 2, 2)), rng.integers(1, 99, (2, M)),
        ["a", "b", "a:b"], ["a", "b"], settings={"cv": 2, "n_null": n_null},
        times=np.linspace(0, 0.4, M), tests=["score", "a", "b", "interactions"],
        pvalues=p, pvalues_fwe=p_fwe)


P_FWE = np.array([[0.01, 0.02, 0.30, 0.9],
                  [0.04, 0.60, 0.01, 0.8],
                  [0.50, 0.70, 0.90, 1.0],
                  [0.02, 0.03, 0.20, 0.7],
                  [0.30, 0.10, 0.04, 0.6]])


def test_result_property_and_significant():
    res = _timecourse(P_FWE)
    adj = familywise_over_tests(P_FWE)
    np.testing.assert_array_equal(res.pvalues_fwe_tests, adj)
    for k, test in enumerate(res.tests):
        np.testing.assert_array_equal(res.significant(test, corrected="all"),
                                      adj[:, k] < 0.05)
        np.testing.assert_array_equal(res.significant(test, corrected="models"),
                                      P_FWE[:, k] < 0.05)
        np.testing.assert_array_equal(res.significant(test), res.significant(test, 0.05,
                                                                              True))
        np.testing.assert_array_equal(res.significant(test, corrected=False),
                                      res.pvalues[:, k] < 0.05)
    # 4 tests: the score's 0.01 becomes 0.04, its 0.04 0.16
    assert res.significant("score", corrected="all").tolist() == [True, False, False,
                                                                   False, False]
    assert np.flatnonzero(res.significant("b", corrected="models")).tolist() == [1, 4]
    assert np.flatnonzero(res.significant("b", corrected="all")).tolist() == [1]
    assert not res.significant("a", corrected="all").any()


@pytest.mark.parametrize("bad", ["tests", "ALL", None, 1, 0.05, "fwe"])
def test_bad_corrected_values(bad):
    res = _timecourse(P_FWE)
    with pytest.raises(ValueError, match="corrected must be False.*'models'.*'all'"):
        res.significant("score", corrected=bad)


def test_plots_take_corrected():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = _timecourse(P_FWE)
    fig = res.plot(show=False, corrected="all")
    lines = [len(ax.lines) for ax in fig.axes]
    fig_models = res.plot(show=False, corrected="models")
    # fewer marks with the stricter correction
    assert sum(lines) < sum(len(ax.lines) for ax in fig_models.axes)
    with pytest.raises(ValueError, match="corrected must be"):
        res.plot(show=False, corrected="tests")
    plt.close("all")


def test_frame_columns():
    res = _timecourse(P_FWE)
    df = res.to_data_frame()
    cols = list(df.columns)
    assert cols[cols.index("pvalue_fwe") + 1] == "pvalue_fwe_tests"
    adj = familywise_over_tests(P_FWE)
    a = df[df["term"] == "a"]
    np.testing.assert_array_equal(a["pvalue_fwe_tests"], adj[:, 1])
    np.testing.assert_array_equal(a["score_pvalue_fwe_tests"], adj[:, 0])
    np.testing.assert_array_equal(a["interactions_pvalue_fwe_tests"], adj[:, 3])
    assert df[df["term"] == "a:b"]["pvalue_fwe_tests"].isna().all()


def test_round_trip_keeps_the_property(tmp_path):
    res = _timecourse(P_FWE)
    back = read_result(res.save(tmp_path / "sub-01_mlem.npz"))
    np.testing.assert_array_equal(back.pvalues_fwe_tests, res.pvalues_fwe_tests)
    np.testing.assert_array_equal(back.significant("a", corrected="all"),
                                  res.significant("a", corrected="all"))
    # computed, not stored: the file holds no such entry
    with np.load(tmp_path / "sub-01_mlem.npz") as f:
        assert not any("fwe_tests" in name for name in f.files)


def test_brainmap_significance_img(tmp_path):
    rng = np.random.default_rng(0)
    ijk = np.argwhere(rng.random((4, 5, 3)) < 0.5)
    M = len(ijk)
    p_fwe = rng.uniform(0, 0.2, (M, 3))
    res = BrainMapResult(rng.standard_normal((2, M, 3)), rng.uniform(-1, 1, (2, M)),
                         rng.standard_normal((2, M, 2, 2)), rng.integers(1, 9, (2, M)),
                         ["a", "b", "a:b"], ["a", "b"], {"cv": 2, "n_null": 999},
                         affine=np.eye(4), shape=(4, 5, 3), voxel_indices=ijk,
                         tests=["score", "a", "b"], pvalues=p_fwe, pvalues_fwe=p_fwe)
    back = read_result(res.save(tmp_path / "map.npz"))
    for r in (res, back):
        img = np.asarray(r.significance_img("a", corrected="all").dataobj)
        expect = familywise_over_tests(p_fwe)[:, 1] < 0.05
        assert img.sum() == expect.sum()
        assert img.sum() <= np.asarray(r.significance_img("a").dataobj).sum()


def test_no_tests_no_property():
    res = TimeCourseResult(np.zeros((1, 2, 1)), np.zeros((1, 2)), np.zeros((1, 2, 1, 1)),
                           np.ones((1, 2)), ["a"], ["a"])
    assert res.pvalues_fwe_tests is None
    with pytest.raises(ValueError, match="n_null > 0"):
        res.significant("a", corrected="all")


def test_warning_when_no_model_can_pass_over_tests():
    import warnings

    # 4 tests, 49 nulls: corrected over tests nothing goes below 4 / 50 = 0.08
    res = _timecourse(P_FWE, n_null=49)
    with pytest.warns(UserWarning, match=r"4 tests.*4/50.*n_null >= 80"):
        res.significant("score", corrected="all")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res.significant("score", corrected="models")              # 1 / 50 < 0.05
        _timecourse(P_FWE, n_null=99).significant("score", corrected="all")   # 0.04
    # a test that was not run does not count
    p = P_FWE.copy()
    p[:, 3] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _timecourse(p, n_null=69).significant("a", corrected="all")          # 3 / 70
    with pytest.warns(UserWarning, match="3 tests"):
        _timecourse(p, n_null=69).significant("a", alpha=0.04, corrected="all")


@pytest.mark.parametrize("corrected", [False, True, "all"])
def test_significant_on_an_untestable_test_warns_and_stays_a_mask(corrected):
    """A test that could not be run (its p-values all NaN, e.g. a feature nested in
    another): significant() says so, naming the test and why, and still returns a boolean
    mask (all False) that plotting code can index with."""
    import warnings

    p = P_FWE.copy()
    p[:, 1] = np.nan
    res = _timecourse(p)
    res.settings["untestable_tests"] = {"a": "it is nested in 'b'"}
    with pytest.warns(UserWarning, match=r"the test of 'a' could not be run: it is nested "
                                         r"in 'b': its p-values are all NaN"):
        mask = res.significant("a", corrected=corrected)
    assert mask.dtype == bool and not mask.any()
    with warnings.catch_warnings():       # a test that was run: no warning
        warnings.simplefilter("error")
        res.significant("b", corrected=corrected)
