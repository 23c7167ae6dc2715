"""The plain RSA baseline (Mantel / partial Mantel) behaves as a Mantel test should."""
import numpy as np
import pandas as pd
import pytest
from scipy.spatial.distance import pdist
from scipy.stats import pearsonr, rankdata, spearmanr

from mlem_neuro.rsa import mantel_tests, model_rdm


def _data(seed, amplitude, correlated=False):
    rng = np.random.default_rng(seed)
    A = rng.permutation(np.repeat([0, 1], 24))
    B = (np.where(rng.uniform(size=48) < 0.8, A, rng.integers(0, 2, 48)) if correlated
         else rng.permutation(np.repeat([0, 1], 24)))
    X = rng.standard_normal((48, 20)) + amplitude * A[:, None] * rng.standard_normal(20)
    return X, pd.DataFrame({"A": np.where(A, "a1", "a0"), "B": np.where(B, "b1", "b0")})


def test_rho_is_spearman_of_the_neural_and_model_rdms():
    X, table = _data(0, 1.0)
    out = mantel_tests(X, table, n_permutations=99, random_state=0)
    for name in table:
        ref = spearmanr(pdist(X), model_rdm(table[name]))[0]
        assert abs(out.loc[name, "rho"] - ref) < 1e-12
    assert out.loc["A", "p"] == 0.01                  # the smallest p with 99 permutations


def test_partial_mantel_does_not_credit_a_feature_that_only_tracks_the_encoded_one():
    """B copies A on 80 % of stimuli and is not encoded: Mantel finds it, partial Mantel
    (A removed) mostly does not (ground truth; 20 datasets, p < 0.05 counts).  Measured
    over five blocks of 20 seeds: Mantel 20 of 20 in each, partial Mantel 0-5 (4 for
    seeds 0-19; it is somewhat liberal, about 0.13 in validation/why_mlem.py)."""
    plain = partial = 0
    for seed in range(20):
        X, table = _data(seed, 1.0, correlated=True)
        out = mantel_tests(X, table, n_permutations=99, random_state=seed)
        plain += out.loc["B", "p"] < 0.05
        partial += out.loc["B", "p_partial"] < 0.05
    assert plain >= 15 and partial <= 8


# ------------------------------------------------ undefined statistics, inputs, memory
def _reference(X, table, rdms, n_null, seed):
    """Mantel and partial Mantel p-values computed directly: Spearman of each permuted
    neural RDM (the permutations mantel_tests draws) with each model RDM ``rdms[name]``,
    and of their residuals on the other model RDMs' ranks (least squares with an
    intercept)."""
    rng = np.random.default_rng(seed)
    n = len(X)
    perms = [np.arange(n)] + [rng.permutation(n) for _ in range(n_null)]
    ranks = {k: rankdata(v) for k, v in rdms.items()}
    out = {}
    for name, m in ranks.items():
        others = np.column_stack([np.ones_like(m)] + [v for k, v in ranks.items()
                                                      if k != name])

        def residual(y, others=others):
            return y - others @ np.linalg.lstsq(others, y, rcond=None)[0]

        rho = [spearmanr(pdist(X[p]), m)[0] for p in perms]
        rho_res = [pearsonr(residual(rankdata(pdist(X[p]))), residual(m))[0] for p in perms]
        out[name] = (rho[0], np.mean(np.array(rho) >= rho[0] - 1e-12),
                     np.mean(np.array(rho_res) >= rho_res[0] - 1e-12))
    return out


def test_p_values_are_those_of_the_direct_computation_with_a_missing_value():
    """A NaN in the numeric feature ``x`` (stimulus 3): its pairs are at distance 0 (the
    package's missing distance), and every p-value, ``a``'s partial one included, is the
    direct computation's.  (The NaN used to turn every residual into NaN: ``a``'s
    partial p fell to the smallest possible, 0.01.)"""
    rng = np.random.default_rng(1)
    n = 16
    table = pd.DataFrame({"a": np.tile(["u", "v"], n // 2), "b": np.repeat(list("pqrs"), 4),
                          "x": rng.standard_normal(n)})
    table.loc[3, "x"] = np.nan
    X = rng.standard_normal((n, 6))
    x = table["x"].to_numpy()
    dx = pdist(np.nan_to_num(x)[:, None], "cityblock")
    i, j = np.triu_indices(n, 1)
    dx[(i == 3) | (j == 3)] = 0
    rdms = {"a": pdist((table["a"] == "u").to_numpy(float)[:, None], "cityblock"),
            "b": pdist(np.repeat([0.0, 1, 2, 3], 4)[:, None], lambda u, v: float(u[0] != v[0])),
            "x": dx}
    np.testing.assert_array_equal(model_rdm(table["x"]), dx)
    out = mantel_tests(X, table, n_null=49, random_state=7)
    ref = _reference(X, table, rdms, 49, 7)
    for name, (rho, p, p_partial) in ref.items():
        assert abs(out.loc[name, "rho"] - rho) < 1e-12
        assert out.loc[name, "p"] == pytest.approx(p, abs=1e-12)
        assert out.loc[name, "p_partial"] == pytest.approx(p_partial, abs=1e-12)
    assert out.loc["a", "p_partial"] > 0.1            # noise: not the smallest p (0.02)


def test_undefined_correlations_are_nan_with_a_warning():
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile([0, 1], 8), "x": rng.standard_normal(16)})
    X = rng.standard_normal((16, 4))
    # identical patterns: the neural RDM is constant (was p = 0.01 for every feature)
    with pytest.warns(UserWarning, match="neural RDM is constant"):
        out = mantel_tests(np.ones((16, 4)), table, n_null=99, random_state=0)
    assert out.isna().all().all() and list(out.index) == ["a", "x"]
    # a feature with one level: its model RDM is constant; the others are tested as if
    # it were absent (a constant RDM is removed with the intercept)
    with pytest.warns(UserWarning, match=r"\['c'\] have a constant model RDM"):
        out = mantel_tests(X, table.assign(c="same"), n_null=99, random_state=0)
    assert out.loc["c"].isna().all()
    pd.testing.assert_frame_equal(out.loc[["a", "x"]],
                                  mantel_tests(X, table, n_null=99, random_state=0))
    # a feature missing for every stimulus: distance 0 for every pair, the same
    with pytest.warns(UserWarning, match=r"\['x'\] have a constant model RDM"):
        assert mantel_tests(X, table.assign(x=np.nan), 99, 0).loc["x"].isna().all()


def test_partial_test_of_a_feature_the_others_determine_is_nan():
    """``b`` is ``a``'s complement (the same model RDM): removing either leaves nothing
    of the other, so both partial tests are undefined (they used to be about 0.4,
    rounding noise); the plain Mantel tests stay, and ``x``'s partial test is the one
    without the copy."""
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile([0, 1], 12), "x": rng.standard_normal(24)})
    X = rng.standard_normal((24, 4)) + table[["a"]].to_numpy()
    with pytest.warns(UserWarning, match=r"determine those of \['a', 'b'\]"):
        out = mantel_tests(X, table.assign(b=1 - table["a"]), n_null=99, random_state=0)
    alone = mantel_tests(X, table, n_null=99, random_state=0)
    assert np.isnan(out.loc[["a", "b"], "p_partial"]).all()
    assert out.loc["a", "p"] == out.loc["b", "p"] == alone.loc["a", "p"] == 0.01
    assert out.loc["x", "p_partial"] == alone.loc["x", "p_partial"]


def test_partial_test_is_nan_when_the_others_explain_the_neural_rdm():
    """The pattern is the numeric feature ``x`` itself: once ``x``'s model RDM is removed
    nothing of the neural RDM is left, so ``a``'s partial correlation is undefined."""
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile([0, 1], 10), "x": rng.standard_normal(20)})
    with pytest.warns(UserWarning, match=r"explain the neural RDM's ranks entirely in "
                                         r"the partial tests of \['a'\]"):
        out = mantel_tests(table[["x"]].to_numpy(), table, n_null=99, random_state=0)
    assert np.isnan(out.loc["a", "p_partial"])
    assert out.loc["x", "rho"] == pytest.approx(1.0) and out.loc["x", "p"] == 0.01


@pytest.mark.parametrize("X, table, match", [
    (np.ones((6, 2, 3)), pd.DataFrame({"a": np.arange(6)}), r"X must be 2-D .* \(6, 2, 3\)"),
    (np.ones((6, 2)), pd.DataFrame({"a": np.arange(5)}), "X has 6 stimuli .* table has 5"),
    (np.ones((2, 2)), pd.DataFrame({"a": [0, 1]}), r"at least 3 stimuli .*; got 2"),
    (np.where(np.eye(6, 2) > 0, np.nan, 1.0), pd.DataFrame({"a": np.arange(6)}),
     "X holds 2 NaN or infinite values"),
    (np.ones((6, 2)) * 1j, pd.DataFrame({"a": np.arange(6)}), "Complex data not supported"),
    (np.ones((6, 2)), pd.DataFrame({"a": [0, 1, 2, 3, 4, np.inf]}), "infinite values"),
])
def test_inputs_are_checked_before_the_test(X, table, match):
    with pytest.raises(ValueError, match=match):
        mantel_tests(X, table, n_null=9, random_state=0)


def test_memory_does_not_grow_with_the_null_count(monkeypatch):
    """The permuted neural RDMs are never held together (they were: ``(n_null + 1) x
    n_pairs`` floats, 36 GB for 3,000 stimuli and 999 nulls), and what is held is checked
    against the budget before it is allocated."""
    import tracemalloc

    from mlem_neuro.core.memory import ENV_VAR

    X, table = _data(0, 1.0)
    peaks = []
    for n_null in (9, 399):
        tracemalloc.start()
        mantel_tests(X, table, n_null=n_null, random_state=0)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 1.5 * peaks[0]           # 400 x 1,128 pairs x 8 B = 3.6 MB more before
    monkeypatch.setenv(ENV_VAR, "20KB")
    with pytest.raises(MemoryError, match="Mantel tests of 48 stimuli and 2 features"):
        mantel_tests(X, table, n_null=9, random_state=0)
