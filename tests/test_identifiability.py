"""Feature-level importance is the default; term-level interactions warn when they cannot
be identified; spreads have one meaning each (folds vs permutations)."""
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

import mlem_neuro
from mlem_neuro import MLEM
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.stimuli.features import FeatureSpace

FAST = dict(max_steps=40, random_state=0)


# ------------------------------------------------------------------- the family
def test_binary_family_ranks_pairs_alike():
    """The reason for the warning: with 0/1 feature distances, diag(w) + λ w wᵀ gives
    the same ranking of pairs for every λ >= 0 (and a different one for numeric
    distances)."""
    rng = np.random.default_rng(0)
    w = rng.uniform(0.2, 1.0, 4)
    D = rng.integers(0, 2, (500, 4)).astype(float)
    q0 = np.einsum("pa,ab,pb->p", D, np.diag(w), D)
    for lam in (0.5, 3.0, 20.0):
        q = np.einsum("pa,ab,pb->p", D, np.diag(w) + lam * np.outer(w, w), D)
        assert spearmanr(q0, q)[0] == pytest.approx(1.0)
    Dn = rng.uniform(0, 1, (500, 4))
    q0 = np.einsum("pa,ab,pb->p", Dn, np.diag(w), Dn)
    q = np.einsum("pa,ab,pb->p", Dn, np.diag(w) + 3.0 * np.outer(w, w), Dn)
    assert spearmanr(q0, q)[0] < 0.99


def test_two_valued_features():
    n = 30
    rng = np.random.default_rng(0)
    table = pd.DataFrame({
        "binary": rng.choice(["a", "b"], n),
        "three_levels": rng.choice(["x", "y", "z"], n),        # indicator: still 0/1
        "two_numbers": rng.choice([1.0, 4.0], n),
        "graded": rng.choice([0.0, 1.0, 2.0], n),               # distances 0, 0.5, 1
        "continuous": rng.normal(size=n),
    })
    enc = FeatureSpace().fit_transform(table)
    assert enc.two_valued().tolist() == [True, True, True, False, False]
    # a missing value adds its own distance (0.5 here) next to 0 and 1
    with_nan = table[["binary"]].astype(object)
    with_nan.iloc[0, 0] = np.nan
    enc = FeatureSpace(missing_distance=0.5).fit_transform(with_nan)
    assert enc.two_valued().tolist() == [False]
    enc = FeatureSpace(missing_distance=1.0).fit_transform(with_nan)
    assert enc.two_valued().tolist() == [True]


# ----------------------------------------------------------------- the defaults
def test_feature_level_is_the_default_everywhere():
    import inspect

    assert MLEMOptions().level == "feature"
    for fn in (mlem_neuro.mlem_array, mlem_neuro.mlem_epochs, mlem_neuro.mlem_searchlight,
               mlem_neuro.mlem_roi, MLEM.permutation_importance):
        assert inspect.signature(fn).parameters["level"].default == "feature", fn


def _categorical(n=40, seed=0):
    rng = np.random.default_rng(seed)
    y = pd.DataFrame({"a": rng.choice(["p", "q"], n), "b": rng.choice(["u", "v", "w"], n)})
    codes = np.column_stack([(y["a"] == "p"), (y["b"] == "u"), (y["b"] == "v")]).astype(float)
    X = codes @ rng.normal(size=(3, 12)) + 0.3 * rng.normal(size=(n, 12))
    return X, y


def test_analysis_default_reports_features_without_warning():
    X, y = _categorical()
    data = np.repeat(X[:, :, None], 2, axis=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = mlem_neuro.mlem_array(data, y, cv=2, n_repeats=1, n_permutations=2, **FAST)
    assert res.terms == ["a", "b"]
    assert res.settings["level"] == "feature"


def test_term_level_warns_once_when_not_identifiable():
    X, y = _categorical()
    data = np.repeat(X[:, :, None], 2, axis=2)
    with pytest.warns(UserWarning, match="not identifiable") as rec:
        res = mlem_neuro.mlem_array(data, y, cv=2, n_repeats=1, n_permutations=2, level="term",
                                    **FAST)
    assert len([w for w in rec if "not identifiable" in str(w.message)]) == 1
    assert rec[0].filename == __file__                    # points at the caller
    assert res.terms == ["a", "b", "a:b"]
    # no interactions modelled, or a graded feature: no warning
    y2 = y.assign(c=np.linspace(0, 1, len(y)))
    for kw, table in ((dict(interactions=False), y), ({}, y2)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            mlem_neuro.mlem_array(data, table, cv=2, n_repeats=1, n_permutations=2, level="term",
                                  **kw, **FAST)


def test_estimator_term_level_warns():
    X, y = _categorical()
    est = MLEM(**FAST).fit(X, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        feat = est.permutation_importance(X, y, n_permutations=3)
    assert list(feat.index) == ["a", "b"]
    with pytest.warns(UserWarning, match="not identifiable") as rec:
        est.permutation_importance(X, y, n_permutations=3, level="term")
    assert rec[0].filename == __file__


def test_warning_points_at_the_caller_from_every_entry_point():
    """The same warning from the searchlight (no private driver in between) and from the
    cross-validation driver itself names this file, not a frame inside the package."""
    nib = pytest.importorskip("nibabel")
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.crossval import run_cv

    X, y = _categorical()
    img = nib.Nifti1Image(np.repeat(X.T.reshape(3, 2, 2, -1), 1, axis=0), np.eye(4))
    mask = nib.Nifti1Image(np.ones((3, 2, 2), "int8"), np.eye(4))
    with pytest.warns(UserWarning, match="not identifiable") as rec:
        mlem_neuro.mlem_searchlight(img, y, mask, radius=1.0, cv=2, n_repeats=1, n_permutations=1,
                                    level="term", **FAST)
    assert [w.filename for w in rec if "identifiable" in str(w.message)] == [__file__]
    with pytest.warns(UserWarning, match="not identifiable") as rec:
        run_cv(DenseRDMSource(X[None]), y, MLEMOptions(cv=2, n_repeats=1, level="term",
                                                       n_permutations=1,
                                                       **FAST))
    assert rec[0].filename == __file__


# -------------------------------------------------------------------- spreads
def test_permutation_spread_is_named_as_such():
    X, y = _categorical()
    est = MLEM(**FAST).fit(X, y)
    imp = est.permutation_importance(X, y, n_permutations=4, random_state=0)
    assert list(imp.columns) == ["importance", "importance_perm_std", "kind"]
    assert (imp["importance_perm_std"] > 0).all()
    one = est.permutation_importance(X, y, n_permutations=1, random_state=0)
    assert (one["importance_perm_std"] == 0).all()


def test_fold_spread_renamed_with_deprecated_alias():
    X, y = _categorical()
    data = np.repeat(X[:, :, None], 3, axis=2)
    res = mlem_neuro.mlem_array(data, y, cv=3, n_repeats=1, n_permutations=2, **FAST)
    np.testing.assert_allclose(res.importance_fold_std, res.fold_importance.std(0, ddof=1))
    with pytest.warns(FutureWarning, match="importance_fold_std"):
        old = res.importance_std
    np.testing.assert_array_equal(old, res.importance_fold_std)
    frame = res.to_data_frame()
    assert "importance_fold_std" in frame and "importance_std" not in frame
