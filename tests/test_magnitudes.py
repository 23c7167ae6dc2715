"""Extreme magnitudes of features and data neither overflow nor underflow: they are
rescaled by an exact power of two, so the analysis is that of ordinary magnitudes."""
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro import MLEM


@pytest.fixture
def design():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, 40)
    a = rng.integers(0, 2, 40).astype(bool)
    X = rng.standard_normal((40, 6))
    X[:, 0] += 3 * x
    X[:, 1] += 2 * a
    return X, x, a


@pytest.mark.parametrize("scale", [2.0 ** 600, 2.0 ** -600, 1e200, 1e-170])
def test_neural_data_of_extreme_magnitude_give_the_ordinary_results(design, scale):
    X, x, a = design
    y = pd.DataFrame({"x": x, "a": a})
    kw = dict(cv=2, n_repeats=1, max_steps=30, random_state=0, verbose="ERROR")
    ref = mlem_neuro.mlem_array(X[:, :, None], y, **kw)
    res = mlem_neuro.mlem_array(X[:, :, None] * scale, y, **kw)
    assert np.isfinite(res.score).all()
    np.testing.assert_allclose(res.score, ref.score, atol=1e-12)
    est = MLEM(max_steps=30, random_state=0).fit(X[:30] * scale, y.iloc[:30])
    ref_est = MLEM(max_steps=30, random_state=0).fit(X[:30], y.iloc[:30])
    assert est.score(X[30:] * scale, y.iloc[30:]) == pytest.approx(
        ref_est.score(X[30:], y.iloc[30:]), abs=1e-12)


def test_numeric_features_of_extreme_range_keep_finite_distances(design):
    X, x, a = design
    ref = MLEM(max_steps=30, random_state=0).fit(X, pd.DataFrame({"x": x, "a": a}))
    # a power of two: exact, so the very same fit
    huge = MLEM(max_steps=30, random_state=0).fit(X, pd.DataFrame({"x": x * 2.0 ** 900,
                                                                    "a": a}))
    np.testing.assert_allclose(huge.W_, ref.W_, atol=1e-12)
    with pytest.warns(UserWarning, match="subnormal numbers"):
        tiny = MLEM(max_steps=30, random_state=0).fit(X, pd.DataFrame({"x": x * 1e-320,
                                                                        "a": a}))
    assert np.isfinite(tiny.W_).all() and np.isfinite(tiny.score(X, pd.DataFrame(
        {"x": x * 1e-320, "a": a})))
