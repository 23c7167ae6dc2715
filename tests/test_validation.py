"""Input validation of :class:`mlem_neuro.MLEM`, and the inputs it must accept.

Bad input must fail early with a ValueError / TypeError that says what is wrong; good input
of every supported kind (pandas dtypes, one feature, missing values, groups, kind overrides)
must fit and be encoded as documented in :mod:`mlem_neuro.core.stimuli.features`.
"""
import re
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.exceptions import NotFittedError

from mlem_neuro import MLEM
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.simulation import simulate_representations
from mlem_neuro.utils import check_device

FAST = dict(max_steps=20, batch_size="full")
PANDAS_MAJOR = int(pd.__version__.split(".")[0])
N = 24


@pytest.fixture(scope="module")
def sim():
    """24 stimuli, 2 binary features, 10 units."""
    X, y, _ = simulate_representations(n_stimuli=N, n_features=2, n_units=10, noise=0.1,
                                       random_state=0)
    return X, y


@pytest.fixture(scope="module")
def fitted(sim):
    X, y = sim
    return MLEM(random_state=0, **FAST).fit(X, y)


def _numeric_table(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"a": rng.uniform(size=n), "b": rng.uniform(size=n)})


def _neural(codes, n_units=8, noise=0.3, seed=0):
    """Neural data whose geometry follows ``codes`` (n, k), plus Gaussian noise."""
    rng = np.random.default_rng(seed)
    codes = np.asarray(codes, dtype=float).reshape(len(codes), -1)
    proj = rng.standard_normal((codes.shape[1], n_units))
    return 3.0 * codes @ proj + noise * rng.standard_normal((len(codes), n_units))


def _pair_distances(est, y):
    i, j = pair_indices(len(y))
    return est.feature_space_.transform(y).pair_distances(i, j), i, j


# --------------------------------------------------------------------------- bad input
class TestBadInput:
    def test_row_count_mismatch(self, sim):
        X, y = sim
        with pytest.raises(ValueError, match=r"X has 24 stimuli.*y has 20 rows"):
            MLEM(**FAST).fit(X, y.iloc[:20])

    def test_row_count_mismatch_at_score(self, fitted, sim):
        X, y = sim
        with pytest.raises(ValueError, match=r"X has 23 stimuli.*y has 24 rows"):
            fitted.score(X[:23], y)

    @pytest.mark.parametrize("n", [1, 2])
    def test_fewer_than_three_stimuli(self, n):
        X = np.arange(n * 3, dtype=float).reshape(n, 3)
        y = pd.DataFrame({"a": np.arange(n, dtype=float)})
        with pytest.raises(ValueError, match=f"at least 3 stimuli.*got {n}"):
            MLEM(**FAST).fit(X, y)

    def test_fewer_than_three_stimuli_precomputed(self):
        X = np.array([[0.0, 1.0], [1.0, 0.0]])
        with pytest.raises(ValueError, match="at least 3 stimuli"):
            MLEM(distance="precomputed", **FAST).fit(X, pd.DataFrame({"a": [0.0, 1.0]}))

    def test_single_stimulus_precomputed(self):
        with pytest.raises(ValueError, match="at least 3 stimuli"):
            MLEM(distance="precomputed", **FAST).fit(np.zeros((1, 1)),
                                                     pd.DataFrame({"a": [0.0]}))

    def test_zero_features(self, sim):
        X, _ = sim
        with pytest.raises(ValueError, match="no feature columns"):
            MLEM(**FAST).fit(X, pd.DataFrame(index=range(N)))

    @pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
    def test_non_finite_X(self, sim, bad):
        X, y = sim
        X = X.copy()
        X[3, 2] = bad
        X[5, 0] = bad
        with pytest.raises(ValueError, match="X holds 2 NaN or infinite values"):
            MLEM(**FAST).fit(X, y)

    def test_non_numeric_X(self, sim):
        _, y = sim
        X = np.full((N, 3), "a", dtype=object)
        with pytest.raises(TypeError, match="X must be a numeric array"):
            MLEM(**FAST).fit(X, y)

    @pytest.mark.parametrize("shape", [(N,), (N, 4, 2)])
    def test_X_not_2d(self, sim, shape):
        _, y = sim
        X = np.random.default_rng(0).standard_normal(shape)
        with pytest.raises(ValueError, match=r"X must be 2-D.*got shape " + re.escape(str(shape))):
            MLEM(**FAST).fit(X, y)

    @pytest.mark.parametrize("column", [
        pytest.param(np.full(N, 3.0), id="numeric"),
        pytest.param(np.array(["x"] * N, dtype=object), id="object"),
        pytest.param(pd.Categorical(["x"] * N, categories=["x", "z"]), id="categorical"),
    ])
    def test_constant_feature(self, sim, column):
        X, _ = sim
        y = _numeric_table().assign(const=column)
        with pytest.raises(ValueError, match="feature 'const' is constant"):
            MLEM(**FAST).fit(X, y)

    @pytest.mark.parametrize("column", [
        pytest.param(np.full(N, np.nan), id="float"),
        pytest.param(np.array([None] * N, dtype=object), id="object"),
    ])
    def test_all_nan_feature(self, sim, column):
        X, _ = sim
        y = _numeric_table().assign(gone=column)
        with pytest.raises(ValueError, match=r"feature 'gone' is missing \(NaN\) for every"):
            MLEM(**FAST).fit(X, y)

    def test_infinite_feature(self, sim):
        X, _ = sim
        y = _numeric_table()
        y.loc[4, "a"] = np.inf
        with pytest.raises(ValueError, match="feature 'a' holds infinite values"):
            MLEM(**FAST).fit(X, y)

    @pytest.mark.parametrize("param, value, match", [
        ("constraint", "foo", r"constraint must be one of \['spd', 'diagonal', 'none'\]"),
        ("distance", "foo", r"distance must be one of \['euclidean', 'correlation'"),
        ("batch_size", "foo", r"batch_size must be 'auto', 'full' or an int >= 2; got 'foo'"),
        ("batch_size", 1, r"batch_size must be 'auto', 'full' or an int >= 2 \(pairs per step\)"),
        ("device", "tpu", r"device must be 'cpu', 'cuda'.*got 'tpu'"),
        ("device", "mps", r"device must be 'cpu' or 'cuda'; got 'mps'"),
        ("max_steps", 0, r"max_steps must be an int >= 1; got 0"),
        ("n_permutations", 0, r"n_permutations must be an int >= 1; got 0"),
        ("lr", -0.1, r"lr must be a finite number > 0"),
        ("verbose", "chatty", r"verbose must be one of"),
    ])
    def test_unknown_option_value(self, sim, param, value, match):
        X, y = sim
        with pytest.raises(ValueError, match=match):
            MLEM(**{**FAST, param: value}).fit(X, y)

    @pytest.mark.parametrize("param, value, match", [
        ("interactions", "yes", "interactions must be True or False"),
        ("max_steps", 2.5, "max_steps must be an int"),
        ("batch_size", 64.0, "batch_size must be 'auto', 'full' or an int"),
        ("device", 0, "device must be a str or torch.device"),
    ])
    def test_wrong_option_type(self, sim, param, value, match):
        X, y = sim
        with pytest.raises(TypeError, match=match):
            MLEM(**{**FAST, param: value}).fit(X, y)

    def test_unknown_importance_level(self, fitted, sim):
        X, y = sim
        with pytest.raises(ValueError, match=r"level must be one of \['term', 'feature'\]; "
                           "got 'foo'"):
            fitted.permutation_importance(X, y, level="foo")

    def test_importance_bad_n_permutations(self, fitted, sim):
        X, y = sim
        with pytest.raises(ValueError, match="n_permutations must be an int >= 1"):
            fitted.permutation_importance(X, y, n_permutations=0)

    def test_feature_kinds_unknown_column(self, sim):
        X, y = sim
        with pytest.raises(ValueError, match=r"'zzz' is not a feature of this table; "
                           r"features are \['f0', 'f1'\]"):
            MLEM(feature_kinds={"zzz": "categorical"}, **FAST).fit(X, y)

    def test_feature_kinds_unknown_kind(self, sim):
        X, _ = sim
        with pytest.raises(ValueError, match=r"feature_kinds\['a'\] must be one of "
                           r"\['categorical', 'ordinal', 'numeric'\]; got 'nominal'"):
            MLEM(feature_kinds={"a": "nominal"}, **FAST).fit(X, _numeric_table())

    def test_feature_groups_unknown_column(self, sim):
        X, _ = sim
        with pytest.raises(ValueError, match=r"feature_groups name columns \['zzz'\]"):
            MLEM(feature_groups={"pos": ["a", "zzz"]}, **FAST).fit(X, _numeric_table())

    def test_missing_distance_unknown_feature(self, sim):
        X, _ = sim
        with pytest.raises(ValueError, match="'zzz' is not a feature of this table"):
            MLEM(missing_distance={"zzz": 1.0}, **FAST).fit(X, _numeric_table())

    def test_missing_distance_negative(self, sim):
        X, _ = sim
        with pytest.raises(ValueError, match="missing_distance must be a finite number >= 0"):
            MLEM(missing_distance=-1.0, **FAST).fit(X, _numeric_table())

    def test_numeric_kind_on_strings(self, sim):
        X, y = sim
        with pytest.raises(ValueError, match="feature 'f0' was declared numeric"):
            MLEM(feature_kinds={"f0": "numeric"}, **FAST).fit(X, y.astype(object))

    def test_precomputed_not_square(self, sim):
        _, y = sim
        X = np.ones((N, N - 1))
        with pytest.raises(ValueError, match=r"must be a square.*got shape \(24, 23\)"):
            MLEM(distance="precomputed", **FAST).fit(X, y)

    def test_precomputed_asymmetric(self, sim):
        X, y = sim
        D = np.linalg.norm(X[:, None] - X[None], axis=-1)
        MLEM(distance="precomputed", **FAST).fit(D, y)      # symmetric: accepted
        D[0, 5] += 0.5
        with pytest.raises(ValueError, match=r"not symmetric \(X != X.T\)"):
            MLEM(distance="precomputed", **FAST).fit(D, y)

    def test_precomputed_nan_off_diagonal(self, sim):
        X, y = sim
        D = np.linalg.norm(X[:, None] - X[None], axis=-1)
        np.fill_diagonal(D, np.nan)                          # diagonal ignored
        MLEM(distance="precomputed", **FAST).fit(D, y)
        D[1, 2] = D[2, 1] = np.nan
        with pytest.raises(ValueError, match="holds NaN or infinite values off its diagonal"):
            MLEM(distance="precomputed", **FAST).fit(D, y)

    @pytest.mark.parametrize("method", ["score", "permutation_importance"])
    def test_not_fitted(self, sim, method):
        X, y = sim
        with pytest.raises(NotFittedError, match=r"not fitted yet; call fit\(X, y\) before"):
            getattr(MLEM(**FAST), method)(X, y)

    def test_predict_rdm_not_fitted(self, sim):
        with pytest.raises(NotFittedError, match="not fitted yet"):
            MLEM(**FAST).predict_rdm(sim[1])

    def test_group_name_clashing_with_column(self, sim):
        X, _ = sim
        y = _numeric_table().assign(x=np.linspace(0, 1, N))
        with pytest.raises(ValueError, match="'x'"):
            MLEM(feature_groups={"x": ["a", "b"]}, **FAST).fit(X, y)

    def test_feature_kinds_with_integer_column_names(self):
        y = pd.DataFrame({0: np.arange(N) % 4, 1: np.linspace(0, 1, N)})
        X = _neural(np.eye(4)[y[0]])
        est = MLEM(feature_kinds={0: "categorical"}, missing_distance={1: 0.5},
                   **FAST).fit(X, y)
        assert est.feature_space_.kinds_ == {"0": "categorical", "1": "numeric"}


# --------------------------------------------------------------------- loses nothing
def test_inputs_not_modified():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((N, 6))
    y = pd.DataFrame({
        "num": np.where(np.arange(N) % 7 == 0, np.nan, rng.uniform(size=N)),
        "word": pd.array(np.tile(["ab", "cd", None], N // 3), dtype="string"),
        "cat": pd.Categorical(np.tile(["lo", "mid", "hi"], N // 3),
                              categories=["lo", "mid", "hi"], ordered=True),
        "flag": np.tile([True, False], N // 2),
        "x": rng.uniform(size=N), "y": rng.uniform(size=N),
    }, index=pd.Index(np.arange(100, 100 + N), name="stim"))
    X0, y0 = X.copy(), y.copy(deep=True)
    est = MLEM(feature_groups={"pos": ["x", "y"]}, missing_distance={"num": 0.5},
               random_state=0, **FAST).fit(X, y)
    est.score(X, y)
    est.permutation_importance(X, y, n_permutations=2, random_state=0)
    est.permutation_importance(X, y, n_permutations=2, random_state=0, level="feature")
    est.predict_rdm(y)
    np.testing.assert_array_equal(X, X0)
    pd.testing.assert_frame_equal(y, y0)
    assert list(est.feature_names_in_) == ["num", "word", "cat", "flag", "pos"]


def test_series_and_1d_inputs_not_modified():
    rng = np.random.default_rng(2)
    f = rng.uniform(size=N)
    X = _neural(f)
    s = pd.Series(f.copy(), name="load", index=np.arange(N)[::-1] + 100)
    X0, s0, f0 = X.copy(), s.copy(), f.copy()
    for y in (s, f):
        est = MLEM(**FAST).fit(X, y)
        est.score(X, y)
        est.permutation_importance(X, y, n_permutations=2, random_state=0)
    np.testing.assert_array_equal(X, X0)
    np.testing.assert_array_equal(f, f0)
    pd.testing.assert_series_equal(s, s0)


# ---------------------------------------------------------------------- column dtypes
_LEVELS = np.tile(["lo", "mid", "hi"], N // 3)
_CODES = np.tile([0, 1, 2], N // 3)


def _column(kind):
    if kind == "string":
        return pd.array(_LEVELS, dtype="string")
    if kind == "str":
        return pd.array(_LEVELS, dtype="str")
    if kind == "object":
        return np.array(_LEVELS, dtype=object)
    if kind == "bool":
        return _CODES == 1
    if kind == "int":
        return np.arange(N) % 5
    if kind == "float":
        return np.linspace(-2.0, 3.0, N) ** 2
    if kind == "categorical":
        return pd.Categorical(_LEVELS, categories=["lo", "mid", "hi"])
    if kind == "ordered":
        return pd.Categorical(_LEVELS, categories=["lo", "mid", "hi"], ordered=True)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind, expected_kind", [
    ("string", "categorical"),
    pytest.param("str", "categorical", marks=pytest.mark.skipif(
        PANDAS_MAJOR < 3, reason="dtype='str' is the pandas >= 3 string dtype")),
    ("object", "categorical"),
    ("bool", "categorical"),
    ("categorical", "categorical"),
    ("int", "numeric"),
    ("float", "numeric"),
    ("ordered", "ordinal"),
])
def test_column_dtypes(kind, expected_kind):
    col = _column(kind)
    y = pd.DataFrame({"f": col})
    if expected_kind == "categorical":
        codes = pd.factorize(pd.Series(col))[0]
        embed = np.eye(codes.max() + 1)[codes]
        i, j = pair_indices(N)
        expected = (codes[i] != codes[j]).astype(float)
    elif expected_kind == "ordinal":
        embed = _CODES / 2.0
        i, j = pair_indices(N)
        expected = np.abs(_CODES[i] - _CODES[j]) / 2.0
    else:
        v = np.asarray(col, dtype=float)
        v = (v - v.min()) / (v.max() - v.min())
        embed = v
        i, j = pair_indices(N)
        expected = np.abs(v[i] - v[j])
    X = _neural(embed)
    est = MLEM(**FAST).fit(X, y)
    assert est.feature_space_.kinds_ == {"f": expected_kind}
    D, _, _ = _pair_distances(est, y)
    np.testing.assert_allclose(D[:, 0], expected, atol=1e-12)
    assert est.score(X, y) > 0.5


def test_mixed_dtypes_one_table():
    y = pd.DataFrame({k: _column(k) for k in ("string", "object", "bool", "int", "float",
                                              "ordered")})
    X = _neural(np.column_stack([_CODES, np.arange(N) % 5]))
    est = MLEM(random_state=0, **FAST).fit(X, y)
    assert est.feature_space_.kinds_ == {"string": "categorical", "object": "categorical",
                                         "bool": "categorical", "int": "numeric",
                                         "float": "numeric", "ordered": "ordinal"}
    assert est.W_.shape == (6, 6)
    assert len(est.terms_) == 6 + 15
    imp = est.permutation_importance(X, y, n_permutations=2, level="term", random_state=0)
    assert list(imp.index) == est.terms_
    assert np.isfinite(imp["importance"]).all()


# ------------------------------------------------------------------------ one feature
@pytest.mark.parametrize("form, name", [
    ("frame", "load"), ("array", "f0"), ("series", "load"), ("series_unnamed", "f0"),
    ("column_array", "f0"),
])
def test_single_feature(form, name):
    rng = np.random.default_rng(3)
    f = rng.uniform(size=N)
    X = _neural(f)
    y = {"frame": pd.DataFrame({"load": f}), "array": f, "series": pd.Series(f, name="load"),
         "series_unnamed": pd.Series(f), "column_array": f[:, None]}[form]
    est = MLEM(**FAST).fit(X, y)
    assert list(est.feature_names_in_) == [name]
    assert est.terms_ == [name]
    np.testing.assert_allclose(est.W_, [[1.0]], atol=1e-6)
    assert est.score(X, y) > 0.6
    for level in ("term", "feature"):
        imp = est.permutation_importance(X, y, n_permutations=3, random_state=0, level=level)
        assert list(imp.index) == [name]
        assert imp["importance"].iloc[0] > 0.3
        assert imp.attrs["baseline_score"] == pytest.approx(est.score(X, y))


def test_n_permutations_one(sim):
    X, y = sim
    est = MLEM(n_permutations=1, random_state=0, **FAST).fit(X, y)
    for level, rows in (("term", 3), ("feature", 2)):
        imp = est.permutation_importance(X, y, level=level, random_state=0)
        assert imp.attrs["n_permutations"] == 1
        assert imp.shape == (rows, 3)
        assert (imp["importance_perm_std"] == 0).all()
        assert np.isfinite(imp["importance"]).all()
    # an explicit argument overrides the estimator's default
    imp = MLEM(n_permutations=5, **FAST).fit(X, y).permutation_importance(
        X, y, n_permutations=1, random_state=0)
    assert imp.attrs["n_permutations"] == 1


# ----------------------------------------------------------------------- missing values
def _table_with_missing():
    rng = np.random.default_rng(4)
    a = rng.uniform(size=N)
    a[[0, 5]] = np.nan
    b = np.tile(["u", "v", "w"], N // 3).astype(object)
    b[3] = None
    return pd.DataFrame({"a": a, "b": b})


def test_missing_values_default_distance_zero():
    y = _table_with_missing()
    X = _neural(np.nan_to_num(y["a"].to_numpy()))
    est = MLEM(**FAST).fit(X, y)
    D, i, j = _pair_distances(est, y)
    miss_a = np.isin(i, [0, 5]) | np.isin(j, [0, 5])
    miss_b = (i == 3) | (j == 3)
    assert (D[miss_a, 0] == 0).all()
    assert (D[miss_b, 1] == 0).all()
    a = y["a"].to_numpy()
    ok = ~miss_a
    rng_a = np.nanmax(a) - np.nanmin(a)
    np.testing.assert_allclose(D[ok, 0], np.abs(a[i[ok]] - a[j[ok]]) / rng_a, atol=1e-12)
    assert np.isfinite(est.W_).all() and np.isfinite(est.score(X, y))


@pytest.mark.parametrize("override", [{"a": 0.7}, 0.7])
def test_missing_distance_override(override):
    y = _table_with_missing()
    X = _neural(np.nan_to_num(y["a"].to_numpy()))
    base = MLEM(**FAST).fit(X, y)
    est = MLEM(missing_distance=override, **FAST).fit(X, y)
    D0, i, j = _pair_distances(base, y)
    D, _, _ = _pair_distances(est, y)
    miss_a = np.isin(i, [0, 5]) | np.isin(j, [0, 5])
    miss_b = (i == 3) | (j == 3)
    np.testing.assert_allclose(D[miss_a, 0], 0.7)
    np.testing.assert_array_equal(D[~miss_a, 0], D0[~miss_a, 0])
    # the dict only touches "a"; a scalar applies to every feature
    np.testing.assert_allclose(D[miss_b, 1], 0.7 if override == 0.7 else 0.0)
    np.testing.assert_array_equal(D[~miss_b, 1], D0[~miss_b, 1])
    assert np.isfinite(est.score(X, y))


# ------------------------------------------------------------ groups and kind overrides
def test_feature_groups_euclidean_of_scaled_columns():
    rng = np.random.default_rng(5)
    x, yy = rng.uniform(0, 10, N), rng.uniform(-3, 1, N)
    c = np.tile(["p", "q"], N // 2)
    table = pd.DataFrame({"x": x, "c": c, "y": yy})
    X = _neural(np.column_stack([x / 10, yy / 4]))
    est = MLEM(feature_groups={"pos": ["x", "y"]}, random_state=0, **FAST).fit(X, table)
    assert list(est.feature_names_in_) == ["pos", "c"]
    assert est.feature_space_.kinds_ == {"pos": "numeric", "c": "categorical"}
    assert est.W_.shape == (2, 2)
    assert est.terms_ == ["pos", "c", "pos:c"]
    D, i, j = _pair_distances(est, table)
    xs = (x - x.min()) / (x.max() - x.min())
    ys = (yy - yy.min()) / (yy.max() - yy.min())
    expected = np.hypot(xs[i] - xs[j], ys[i] - ys[j])
    np.testing.assert_allclose(D[:, 0], expected, atol=1e-12)
    np.testing.assert_array_equal(D[:, 1], (c[i] != c[j]).astype(float))
    assert est.score(X, table) > 0.5


def test_feature_kinds_categorical_integer_column():
    code = np.arange(N) % 4
    table = pd.DataFrame({"code": code})
    X = _neural(np.eye(4)[code])
    numeric = MLEM(**FAST).fit(X, table)
    cat = MLEM(feature_kinds={"code": "categorical"}, **FAST).fit(X, table)
    assert numeric.feature_space_.kinds_ == {"code": "numeric"}
    assert cat.feature_space_.kinds_ == {"code": "categorical"}
    Dn, i, j = _pair_distances(numeric, table)
    Dc, _, _ = _pair_distances(cat, table)
    np.testing.assert_allclose(Dn[:, 0], np.abs(code[i] - code[j]) / 3.0)
    np.testing.assert_array_equal(Dc[:, 0], (code[i] != code[j]).astype(float))
    # one-hot neural codes: the indicator distance explains them, the numeric one does not
    assert cat.score(X, table) > 0.6
    assert cat.score(X, table) > numeric.score(X, table) + 0.2


def test_feature_kinds_ordinal_on_strings():
    """Strings declared ordinal take their levels in sorted order, and a warning names
    that order (alphabetical: 'high' < 'low' < 'medium', '10' < '2' would be silently
    wrong); an ordered Categorical or a numeric column sets the order without one."""
    table = pd.DataFrame({"size": np.tile(["a", "c", "b", "d"], N // 4)})
    X = _neural(np.tile([0, 2, 1, 3], N // 4))
    with pytest.warns(UserWarning, match=r"'size' is declared ordinal.*sorted order "
                                         r"\['a', 'b', 'c', 'd'\].*ordered=True"):
        est = MLEM(feature_kinds={"size": "ordinal"}, **FAST).fit(X, table)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for col in (pd.Categorical(table["size"], categories=list("abcd"), ordered=True),
                    np.tile([0, 2, 1, 3], N // 4)):
            MLEM(feature_kinds={"size": "ordinal"}, **FAST).fit(X, pd.DataFrame({"size": col}))
    D, i, j = _pair_distances(est, table)
    rank = np.tile([0, 2, 1, 3], N // 4)
    np.testing.assert_allclose(D[:, 0], np.abs(rank[i] - rank[j]) / 3.0)


# ---------------------------------------------------- no interactions, diagonal metric
@pytest.mark.parametrize("constraint, interactions", [
    ("spd", False), ("none", False), ("diagonal", True), ("diagonal", False),
])
def test_no_interactions_diagonal_W(constraint, interactions):
    X, y, _ = simulate_representations(n_stimuli=30, n_features=3, n_units=12, noise=0.1,
                                       random_state=1)
    est = MLEM(constraint=constraint, interactions=interactions, random_state=0,
               **FAST).fit(X, y)
    m = 3
    assert est.terms_ == ["f0", "f1", "f2"]
    assert est.W_.shape == (m, m)
    off = est.W_[~np.eye(m, dtype=bool)]
    np.testing.assert_array_equal(off, 0.0)
    assert np.linalg.norm(est.W_) == pytest.approx(1.0)
    if constraint == "diagonal":
        assert (np.diag(est.W_) > 0).all()
    for level in ("term", "feature"):
        imp = est.permutation_importance(X, y, n_permutations=2, random_state=0, level=level)
        assert list(imp.index) == ["f0", "f1", "f2"]
        assert (imp["kind"] == "feature").all()


def test_interactions_give_term_rows(sim):
    X, y = sim
    est = MLEM(random_state=0, **FAST).fit(X, y)
    with pytest.warns(UserWarning, match="not identifiable"):    # two binary features
        imp = est.permutation_importance(X, y, n_permutations=2, level="term",
                                         random_state=0)
    assert list(imp.index) == ["f0", "f1", "f0:f1"]
    assert list(imp["kind"]) == ["feature", "feature", "interaction"]
    assert imp.index.name == "term"
    feat = est.permutation_importance(X, y, n_permutations=2, random_state=0, level="feature")
    assert list(feat.index) == ["f0", "f1"]


# ------------------------------------------------------------------- reproducibility
@pytest.fixture(scope="module")
def sim30():
    X, y, _ = simulate_representations(n_stimuli=30, n_features=3, n_units=12, noise=0.3,
                                       random_state=2)
    return X, y


@pytest.mark.parametrize("batch_size", ["full", 64])
def test_fit_reproducible(sim30, batch_size):
    X, y = sim30
    kw = dict(max_steps=30, batch_size=batch_size)
    a = MLEM(random_state=0, **kw).fit(X, y)
    b = MLEM(random_state=0, **kw).fit(X, y)
    assert a.batch_size_ == (435 if batch_size == "full" else 64)
    np.testing.assert_allclose(a.W_, b.W_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(a.history_, b.history_, rtol=0, atol=1e-12)
    assert a.n_iter_ == b.n_iter_
    if batch_size == 64:
        # mini-batches: another seed samples other pairs, hence another path
        c = MLEM(random_state=1, **kw).fit(X, y)
        assert not np.allclose(a.W_, c.W_, atol=1e-6)
        assert not np.allclose(a.history_, c.history_)


def test_fit_reproducible_from_generator(sim30):
    X, y = sim30
    kw = dict(max_steps=30, batch_size=64)
    a = MLEM(random_state=np.random.default_rng(7), **kw).fit(X, y)
    b = MLEM(random_state=np.random.default_rng(7), **kw).fit(X, y)
    np.testing.assert_allclose(a.W_, b.W_, rtol=0, atol=1e-12)


@pytest.mark.parametrize("level", ["term", "feature"])
def test_importance_reproducible(sim30, level):
    X, y = sim30
    est = MLEM(random_state=0, max_steps=30, batch_size=64).fit(X, y)
    a = est.permutation_importance(X, y, n_permutations=3, random_state=0, level=level)
    b = est.permutation_importance(X, y, n_permutations=3, random_state=0, level=level)
    pd.testing.assert_frame_equal(a, b)
    c = est.permutation_importance(X, y, n_permutations=3, random_state=1, level=level)
    assert not np.allclose(a["importance"], c["importance"])
    assert c.attrs["baseline_score"] == a.attrs["baseline_score"]


def test_estimator_random_state_seeds_default_importance(sim30):
    X, y = sim30
    est = MLEM(random_state=0, **FAST).fit(X, y)
    a = est.permutation_importance(X, y, n_permutations=3)
    b = est.permutation_importance(X, y, n_permutations=3)
    pd.testing.assert_frame_equal(a, b)


# ---------------------------------------------------------------------------- devices
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_check_device_cuda_without_gpu(sim):
    with pytest.raises(ValueError, match="device='cuda' was requested but torch sees no CUDA"):
        check_device("cuda")
    with pytest.raises(ValueError, match="no CUDA GPU"):
        check_device("cuda:0")
    X, y = sim
    with pytest.raises(ValueError, match="no CUDA GPU"):
        MLEM(device="cuda", **FAST).fit(X, y)


def test_check_device_cpu():
    assert check_device("cpu") == torch.device("cpu")
    assert check_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
class TestCuda:
    def test_fit_matches_cpu(self):
        X, y, _ = simulate_representations(n_stimuli=40, n_features=3, n_units=16,
                                           noise=0.2, random_state=0)
        kw = dict(max_steps=50, batch_size="full", random_state=0)
        cpu = MLEM(device="cpu", **kw).fit(X, y)
        gpu = MLEM(device="cuda", **kw).fit(X, y)
        assert isinstance(gpu.W_, np.ndarray)
        np.testing.assert_allclose(gpu.W_, cpu.W_, atol=0.05)
        assert gpu.score(X, y) == pytest.approx(cpu.score(X, y), abs=0.01)

    def test_importance_on_cuda(self):
        X, y, _ = simulate_representations(n_stimuli=40, n_features=3, n_units=16,
                                           noise=0.2, random_state=0)
        est = MLEM(device="cuda", max_steps=30, batch_size="full", random_state=0).fit(X, y)
        for level, rows in (("term", 6), ("feature", 3)):
            imp = est.permutation_importance(X, y, n_permutations=2, random_state=0,
                                             level=level)
            assert imp.shape == (rows, 3)
            assert np.isfinite(imp["importance"]).all()


def test_numbers_stored_as_text_warn_that_they_are_categorical():
    """A column of numbers stored as text (a CSV column with a stray string, metadata
    built from strings) is compared as categorical (equal or not), silently losing the
    numeric distance; with 3 or more values a warning says so.  Two values are alike
    either way, and a declared kind (or real numbers) gives no warning."""
    level = np.tile([1, 2, 10], N // 3 + 1)[:N]
    X = _neural(level)
    text = pd.DataFrame({"load": level.astype(str)})
    with pytest.warns(UserWarning, match=r"'load' holds numbers stored as text.*"
                                         r"categorical.*pd.to_numeric.*feature_kinds"):
        MLEM(**FAST).fit(X, text)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        MLEM(feature_kinds={"load": "categorical"}, **FAST).fit(X, text)
        MLEM(**FAST).fit(X, pd.DataFrame({"load": level}))
        MLEM(**FAST).fit(X, pd.DataFrame({"load": (level > 1).astype(int).astype(str)}))
        MLEM(**FAST).fit(X, pd.DataFrame({"load": np.where(level > 1, "hi", "lo")}))
