"""Undefined Spearman correlations are reported as NaN with a warning, never as a
measured 0, and never count in the max-statistic nulls."""
import numpy as np
import pandas as pd
import pytest

import mlem_neuro


@pytest.fixture
def design():
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": rng.integers(0, 2, 30).astype(bool),
                          "b": pd.Categorical(rng.integers(0, 3, 30).astype(str))})
    data = rng.standard_normal((30, 5, 4))
    data[:, :, 1] = 0.0                       # a flat time point
    data[:, :, 2] = data[0, :, 2]             # identical trials at another
    return data, table


def test_flat_or_identical_patterns_give_nan_with_a_warning(design):
    data, table = design
    with pytest.warns(UserWarning, match=r"2 of 4 time points \(index \[1, 2\]\).*NaN"):
        res = mlem_neuro.mlem_array(data, table, cv=3, n_repeats=1, n_null=19, max_steps=20,
                                    random_state=0)
    assert np.isnan(res.score[[1, 2]]).all() and np.isfinite(res.score[[0, 3]]).all()
    assert np.isnan(res.importance[[1, 2]]).all()
    assert np.isnan(res.pvalues[[1, 2]]).all() and np.isnan(res.pvalues_fwe[[1, 2]]).all()
    assert np.isfinite(res.pvalues[[0, 3]]).all()


def test_undefined_models_do_not_enter_the_max_statistic(design, monkeypatch):
    """The FWE p-values of the defined models are those of an analysis of them alone (the
    same relabellings): a NaN must never count as 'not reaching' the observed value."""
    data, table = design
    kw = dict(cv=3, n_repeats=1, n_null=19, max_steps=20, scale=False, random_state=0,
              verbose="ERROR")
    with pytest.warns(UserWarning):
        res = mlem_neuro.mlem_array(data, table, **kw)
    alone = mlem_neuro.mlem_array(data[:, :, [0, 3]], table, **kw)
    np.testing.assert_allclose(res.pvalues_fwe[[0, 3]], alone.pvalues_fwe)
    np.testing.assert_allclose(res.score[[0, 3]], alone.score)


def test_estimator_scores_of_constant_distances_are_nan_and_fitting_them_is_refused():
    from mlem_neuro import MLEM

    rng = np.random.default_rng(0)
    y = pd.DataFrame({"a": rng.integers(0, 2, 20).astype(bool)})
    R = np.abs(rng.standard_normal((20, 20)))
    R = R + R.T
    np.fill_diagonal(R, 0)
    const = np.ones((20, 20))
    np.fill_diagonal(const, 0)
    est = MLEM(distance="precomputed", max_steps=10, random_state=0).fit(R, y)
    assert np.isfinite(est.score(R, y))
    with pytest.warns(UserWarning, match="score is NaN"):
        assert np.isnan(est.score(const, y))
    with pytest.warns(UserWarning, match="permutation importance is NaN"):
        assert est.permutation_importance(const, y, n_permutations=2)["importance"].isna().all()
    with pytest.raises(ValueError, match="nothing to fit"):
        MLEM(distance="precomputed", max_steps=10).fit(const, y)
    with pytest.raises(ValueError, match="nothing to fit"):
        MLEM(max_steps=10).fit(np.tile(rng.standard_normal(4), (20, 1)), y)


def test_held_out_stimuli_identical_in_every_feature_score_nan_with_a_warning():
    """Identical held-out stimuli: every predicted distance is equal, so the Spearman is
    undefined (NaN with the package's warning), not a measured 0."""
    from mlem_neuro import MLEM

    rng = np.random.default_rng(0)
    y = pd.DataFrame({"a": rng.standard_normal(40), "b": rng.integers(0, 3, 40) > 0})
    X = np.c_[y["a"], y["b"]] + 0.3 * rng.standard_normal((40, 2))
    est = MLEM(max_steps=30, random_state=0).fit(X, y)
    same = pd.DataFrame({"a": [0.5] * 10, "b": [True] * 10})
    X_new = rng.standard_normal((10, 2))
    with pytest.warns(UserWarning, match="same predicted distance.*Spearman correlation is "
                                         "undefined, so the score is NaN"):
        assert np.isnan(est.score(X_new, same))
    with pytest.warns(UserWarning, match="permutation importance is NaN"):
        imp = est.permutation_importance(X_new, same, n_permutations=2)
    assert imp["importance"].isna().all() and np.isnan(imp.attrs["baseline_score"])
    # stimuli that differ in a feature the model weighs: defined (no warning)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert np.isfinite(est.score(X_new, same.assign(a=rng.standard_normal(10))))
