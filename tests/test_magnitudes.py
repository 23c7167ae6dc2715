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


def _distances(table, kinds=None, held_out=None):
    from mlem_neuro.core.stimuli.features import FeatureSpace

    enc = FeatureSpace(kinds=kinds).fit(table).transform(
        table if held_out is None else held_out)
    i, j = np.triu_indices(enc.n_stimuli, k=1)
    return enc.pair_distances(i, j)


@pytest.mark.parametrize("column, kinds", [
    (np.int64(10**17) + np.arange(20), None),            # floats of these are 16 apart
    (np.uint64(10**19) + np.arange(20, dtype=np.uint64), None),
    (pd.Series(np.int64(-2**62) + np.arange(20), dtype="Int64"), None),
    (pd.Series([10**30 + k for k in range(20)], dtype=object), {"x": "numeric"}),
])
def test_integer_features_beyond_float_precision_keep_their_gaps(column, kinds):
    """The minimum is subtracted in integer arithmetic before the values become floats,
    so the distances are those of 0..19, bit for bit (the same floats from there on)."""
    ref = _distances(pd.DataFrame({"x": np.arange(20)}))
    got = _distances(pd.DataFrame({"x": column}), kinds)
    assert len(np.unique(got)) == 19
    np.testing.assert_array_equal(got, ref)
    # held-out stimuli outside the training range, through the same exact subtraction
    train = pd.DataFrame({"x": np.int64(10**17) + np.arange(0, 20, 2)})
    test = pd.DataFrame({"x": np.int64(10**17) + np.arange(-3, 25)})
    ref = _distances(pd.DataFrame({"x": np.arange(0, 20, 2)}),
                     held_out=pd.DataFrame({"x": np.arange(-3, 25)}))
    np.testing.assert_array_equal(_distances(train, held_out=test), ref)


def test_integers_merged_by_the_float_conversion_warn():
    """Beyond a range of 2**53 distinct integers become one float: said, not silent."""
    table = pd.DataFrame({"x": np.array([0, 1, 2**60, 2**60 + 1], dtype=np.int64)})
    with pytest.warns(UserWarning, match=r"'x' holds integers spanning .* 4 distinct "
                                         r"values became 3 floats"):
        _distances(table)


def test_subnormal_features_give_the_distances_of_ordinary_ones():
    """1e-320 needed a prescaling factor of 2**1062, which overflowed to inf (every
    distance NaN, then 0); the exponent is applied instead.  Integers times 1e-320 are
    exact subnormals and their range is 16, so the distances are multiples of 1/16, on the
    distance grid: equal bit for bit to those of the integers."""
    ints = np.array([0, 16, 3, 7, 11, 5, 16, 0, 9])
    ref = _distances(pd.DataFrame({"x": ints.astype(float)}))
    with pytest.warns(UserWarning, match="subnormal numbers"):
        got = _distances(pd.DataFrame({"x": ints * 1e-320}))
    np.testing.assert_array_equal(got, ref)
    assert got.max() == 1 and len(np.unique(got)) == 12   # not all 0, as they were
