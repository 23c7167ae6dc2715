"""Design diagnostics (:mod:`mlem_neuro.core.stimuli.design`): nested, duplicate, correlated and
within-group-constant features are found before fitting, a balanced design gives no
finding, and the warnings name the features and what the design does to the tests."""
import itertools
import warnings

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from mlem_neuro.core.scoring.nulls import null_design
from mlem_neuro.core.stimuli.design import (
    CORRELATION_THRESHOLD,
    FINDING_KINDS,
    MAX_PAIRS,
    DesignFinding,
    design_message,
    diagnose_design,
    pair_distance_correlations,
    warn_design,
)
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.stimuli.pairs import n_pairs, pair_indices

CATEGORIES = ["face", "cat", "dog", "house", "chair", "shoe", "car", "tree"]
ANIMATE = ["face", "cat", "dog"]


def _diagnose(table, groups=None, **kwargs):
    space = FeatureSpace().fit(table)
    return diagnose_design(table, space, groups, **kwargs)


def _objects(seed=0, per=6):
    """8 categories x ``per`` stimuli, animacy determined by category, a numeric size
    drawn independently."""
    rng = np.random.default_rng(seed)
    category = np.repeat(CATEGORIES, per)
    return pd.DataFrame({
        "category": category,
        "animacy": np.where(np.isin(category, ANIMATE), "animate", "inanimate"),
        "size": rng.uniform(0, 1, len(category))})


def _untestable(table, groups=None):
    """The tests the analysis's nulls (:func:`mlem_neuro.core.scoring.nulls.null_design`) cannot
    move."""
    space = FeatureSpace().fit(table)
    return set(null_design(space.transform(table), space.kinds_, groups).untestable)


# ------------------------------------------------------------------------- nested
def test_nested_feature_names_the_feature_that_determines_it():
    table = _objects()
    findings = _diagnose(table)
    assert [f.kind for f in findings] == ["nested"]
    f = findings[0]
    assert isinstance(f, DesignFinding)
    assert f.features == ("animacy", "category") and f.value == 8
    assert f.message == ("'animacy' is determined by 'category' (each of the 8 levels of "
                         "'category' holds one value of 'animacy')")
    # the analysis's own null agrees: that test cannot move
    assert _untestable(table) == {"animacy"}


def test_nested_in_a_combination_names_an_irreducible_set():
    """c = a XOR b: neither a nor b alone fixes c, together they do (and each of the
    three is so determined by the two others); d, independent, is not named."""
    rows = list(itertools.product([0, 1], [0, 1], ["x", "y", "z"])) * 2
    table = pd.DataFrame(rows, columns=["a", "b", "d"]).astype({"a": bool, "b": bool})
    table["c"] = table["a"] ^ table["b"]
    findings = _diagnose(table)
    assert [f.kind for f in findings] == ["nested"] * 3
    by_feature = {f.features[0]: f for f in findings}
    assert set(by_feature) == {"a", "b", "c"}
    assert by_feature["c"].features == ("c", "a", "b") and by_feature["c"].value == 4
    assert by_feature["c"].message == ("'c' is determined by the combination of 'a', 'b' "
                                       "(each of their 4 combinations holds one value of "
                                       "'c')")
    assert _untestable(table) == {"a", "b", "c"}


def test_nested_in_a_numeric_feature_uses_the_null_bins():
    """A numeric feature defines strata by quantile bins (as the null does): a label
    that is a function of those bins is nested, one that is not, is not."""
    x = np.linspace(0, 1, 50)
    table = pd.DataFrame({"x": x, "high": np.where(x > 0.5, "yes", "no")})
    findings = _diagnose(table)
    # the 5 bins are [0, .2), ..., [.8, 1]: "high" splits the third bin, so it can move
    # (a little: they are correlated, r = 0.72, which is reported)
    assert [(f.kind, f.features) for f in findings] == [("correlated", ("x", "high"))]
    assert _untestable(table) == set()
    table["top"] = np.where(x >= 0.8, "yes", "no")       # the last bin: fixed by x's bins
    nested = [f for f in _diagnose(table) if f.kind == "nested"]
    assert [f.features for f in nested] == [("top", "x")]
    assert "each of the 5 quantile bins of 'x'" in nested[0].message
    assert "top" in _untestable(table)


# ---------------------------------------------------------------------- duplicates
@pytest.mark.parametrize("copy", ["renamed", "relabelled"])
def test_duplicate_feature(copy):
    table = _objects()
    table["kind"] = (table["category"] if copy == "renamed"
                     else table["category"].map({c: f"k{k}" for k, c in
                                                 enumerate(CATEGORIES)}))
    findings = _diagnose(table)
    assert [f.kind for f in findings] == ["duplicate", "nested"]
    dup, nested = findings
    assert dup.features == ("kind", "category") and dup.value == pytest.approx(1.0)
    assert dup.message.startswith("'kind' duplicates 'category' (")
    # animacy is named as nested in category once, not again in its copy
    assert nested.features == ("animacy", "category")
    assert _untestable(table) == {"animacy", "category", "kind"}


def test_duplicate_numeric_features_and_partitions_of_mixed_kinds():
    """A numeric feature and an affine copy have the same scaled distances; a level code
    stored as numbers (few values: the null uses them exactly) and its categorical
    labels determine each other."""
    rng = np.random.default_rng(1)
    x = rng.uniform(size=30)
    level = np.arange(30) % 3
    table = pd.DataFrame({"x": x, "x_ms": 1000 * x + 250, "level": level.astype(float),
                          "label": np.array(["lo", "mid", "hi"])[level]})
    findings = _diagnose(table)
    assert sorted((f.kind, f.features) for f in findings) == [
        ("duplicate", ("label", "level")), ("duplicate", ("x_ms", "x"))]
    how = {f.features[0]: f.message for f in findings}
    assert how["x_ms"].endswith("(same distance for every pair)")
    assert how["label"].endswith("(each determines the other: the same partition of the "
                                 "stimuli)")


# --------------------------------------------------------------------- correlated
def _related(n=40, lo=0.5, seed=0):
    """Word pairs: half related; association strength FAS > 0 for every related pair
    (uniform on [lo, 1]), 0 for unrelated ones; a frequency drawn independently."""
    rng = np.random.default_rng(seed)
    relatedness = np.repeat(["related", "unrelated"], n // 2)
    return pd.DataFrame({
        "relatedness": relatedness,
        "FAS": np.where(relatedness == "related", rng.uniform(lo, 1, n), 0.0),
        "frequency": rng.uniform(size=n)})


def test_correlated_features_above_threshold_and_independent_ones_below():
    table = _related()
    i, j = pair_indices(len(table))
    d = FeatureSpace().fit_transform(table).pair_distances(i, j)
    full = spearmanr(d).statistic
    findings = _diagnose(table)
    assert [f.kind for f in findings] == ["correlated"]
    f = findings[0]
    assert f.features == ("relatedness", "FAS")
    assert f.value == pytest.approx(full[0, 1], abs=1e-12)
    assert f.value >= CORRELATION_THRESHOLD
    assert f.message == (f"'relatedness' and 'FAS' are correlated (Spearman r = "
                         f"{full[0, 1]:.2f} over pair distances; threshold "
                         f"{CORRELATION_THRESHOLD:g})")
    # the independent frequency stays below the threshold with both
    assert max(abs(full[0, 2]), abs(full[1, 2])) < CORRELATION_THRESHOLD
    # the threshold is a parameter: above the pair's correlation, nothing is found
    assert _diagnose(table, threshold=min(1.0, full[0, 1] + 0.01)) == []


def test_correlation_subsampling_is_deterministic_and_matches_all_pairs():
    """Up to max_pairs pairs every pair is used (scipy's Spearman over all pairs); above,
    a fixed draw: the same result at every call, close to the full value."""
    table = _related(n=200, lo=0.3)
    enc = FeatureSpace().fit_transform(table)
    i, j = pair_indices(len(table))
    full = spearmanr(enc.pair_distances(i, j)).statistic
    corr, d = pair_distance_correlations(enc)
    assert n_pairs(200) <= MAX_PAIRS and len(d) == n_pairs(200)
    np.testing.assert_allclose(corr, full, atol=1e-12)
    sub, d_sub = pair_distance_correlations(enc, max_pairs=2000)
    again, _ = pair_distance_correlations(enc, max_pairs=2000)
    assert len(d_sub) == 2000 and len(np.unique(d_sub, axis=0)) > 1000
    np.testing.assert_array_equal(sub, again)
    # measured over 200 seeds of 2,000 of these 19,900 pairs: the subsampled correlations
    # differ from the full ones by sd 0.006-0.020, at most 0.073
    np.testing.assert_allclose(sub, full, atol=0.1)
    assert not np.array_equal(sub, pair_distance_correlations(enc, 2000, seed=1)[0])
    # the findings of a subsampled diagnosis are those of the full one here
    full_findings = _diagnose(table)
    sub_findings = _diagnose(table, max_pairs=2000)
    assert [(f.kind, f.features) for f in sub_findings] == [
        (f.kind, f.features) for f in full_findings]


# ------------------------------------------------------------------ groups (runs)
def test_feature_constant_within_groups():
    """Runs 0-3 in session s1, 4-7 in s2: a within-run null cannot move the session."""
    rng = np.random.default_rng(0)
    runs = np.repeat(np.arange(8), 6)
    table = pd.DataFrame({"condition": np.tile(["a", "b", "c"], 16),
                          "session": np.where(runs < 4, "s1", "s2"),
                          "rt": rng.uniform(0.3, 0.9, 48)})
    findings = _diagnose(table, groups=runs)
    assert [(f.kind, f.features, f.value) for f in findings] == [
        ("constant_within_groups", ("session",), 8.0)]
    assert findings[0].message == "'session' is constant within each of the 8 groups"
    assert _diagnose(table) == []                       # without groups nothing to say
    assert _untestable(table, runs) == {"session"}
    # groups that each hold one feature row (the trials of an item) are exchanged
    # whole: the design is that of the items, and nothing is constant "within" them
    items = pd.DataFrame({"condition": np.tile(["a", "b"], 6),
                          "strength": np.linspace(0.1, 0.9, 12)}).loc[np.repeat(
                              np.arange(12), 4)].reset_index(drop=True)
    assert _diagnose(items, groups=np.repeat(np.arange(12), 4)) == []
    assert _untestable(items, np.repeat(np.arange(12), 4)) == set()


def test_groups_with_other_features_can_nest_a_feature():
    """'block' equals 'condition' in run 0 and is its opposite in run 1: neither is
    constant within runs nor fixed by the other, but within runs each fixes the other,
    so that the within-run nulls of both cannot move."""
    runs = np.repeat([0, 1], 8)
    condition = np.tile(["a", "b"], 8)
    table = pd.DataFrame({"condition": condition,
                          "block": np.where((runs == 0) == (condition == "a"), "x", "y"),
                          "hand": np.tile(["l", "l", "r", "r"], 4)})
    assert _diagnose(table) == []
    nested = _diagnose(table, groups=runs)
    assert [(f.kind, f.features) for f in nested] == [
        ("nested", ("condition", "block")), ("nested", ("block", "condition"))]
    assert nested[1].message == ("'block' is determined by the combination of "
                                 "'condition', the groups (each of their 4 combinations "
                                 "holds one value of 'block')")
    assert _untestable(table, runs) == {"condition", "block"}


# ------------------------------------------------------------------ no false alarm
def test_balanced_factorial_design_gives_no_finding():
    """2 x 3 x 4 factorial (categorical, ordinal, numeric), every cell twice."""
    size = pd.CategoricalDtype(["small", "medium", "large"], ordered=True)
    rows = list(itertools.product(["word", "image"], size.categories,
                                  [0.1, 0.4, 0.6, 1.0])) * 2
    table = pd.DataFrame(rows, columns=["modality", "size", "contrast"])
    table["size"] = table["size"].astype(size)
    assert FeatureSpace().fit(table).kinds_ == {"modality": "categorical",
                                                "size": "ordinal", "contrast": "numeric"}
    assert _diagnose(table) == []
    runs = np.tile(np.arange(2), 24)                   # every run holds every cell
    assert _diagnose(table, groups=runs) == []
    assert _untestable(table, runs) == set()


# ----------------------------------------------------------------------- warnings
def _all_findings():
    """One finding of each kind."""
    table = _objects().drop(columns="size")
    table["kind"] = table["category"].str.upper()
    related = _related(n=48).drop(columns="frequency")
    alternate = np.ravel(np.c_[np.arange(24), np.arange(24, 48)])
    table = pd.concat([table, related.iloc[alternate].reset_index(drop=True)], axis=1)
    runs = np.repeat(np.arange(8), 6)
    sessions = pd.DataFrame({"condition": np.tile(["a", "b", "c"], 16),
                             "session": np.where(runs < 4, "s1", "s2")})
    findings = _diagnose(table) + _diagnose(sessions, groups=runs)
    assert [f.kind for f in findings] == list(FINDING_KINDS)
    return findings


def test_warnings_name_both_features_and_what_breaks():
    findings = _all_findings()
    with pytest.warns(UserWarning) as record:
        messages = warn_design(findings, n_null=99)
    assert [str(w.message) for w in record] == messages
    assert len(messages) == len(findings)
    assert {w.filename for w in record} == {__file__}        # the caller's line
    with pytest.warns(UserWarning) as deeper:
        warn_design(findings[:1], n_null=99, stacklevel=1)
    assert deeper[0].filename.endswith("design.py")
    dup, nested, corr, const = messages
    assert dup == ("design: 'kind' duplicates 'category' (same distance for every pair): "
                   "neither conditional test can move given the other: the p-values of "
                   "'kind' and 'category' are NaN (not testable); drop one of them.")
    assert nested == ("design: 'animacy' is determined by 'category' (each of the 8 levels "
                      "of 'category' holds one value of 'animacy'): the conditional test "
                      "of 'animacy' cannot move given 'category': its p-values are NaN "
                      "(not testable); ask the marginal question with null='marginal', or "
                      "drop one feature.")
    assert corr.startswith("design: 'relatedness' and 'FAS' are correlated (Spearman r = ")
    assert "each one's conditional test loses power given the other" in corr
    assert "null='marginal'" in corr
    assert const.startswith("design: 'session' is constant within each of the 8 groups: "
                            "the within-group null cannot move it: its p-values are NaN")
    for f, text in zip(findings, messages):
        assert all(repr(name) in text for name in f.features)
        assert text == design_message(f, 99)


def test_warnings_without_tests_speak_of_importance():
    findings = _all_findings()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        messages = warn_design(findings, n_null=0)
    assert len(record) == len(findings)
    assert all(issubclass(w.category, UserWarning) for w in record)
    dup, nested, corr, const = messages
    assert "importance splits between 'kind' and 'category'" in dup
    assert nested.endswith("its importance and that of 'category' share what they have "
                           "in common: read 'animacy' as what it adds to 'category'.")
    assert "importance is shared between 'relatedness' and 'FAS'" in corr
    assert "importance cannot be told from differences between groups" in const
    assert not [m for m in messages if "p-values" in m]
    for f, text in zip(findings, messages):
        assert all(repr(name) in text for name in f.features)


def test_no_finding_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_design([], n_null=99) == []


# ------------------------------------------------------------------------- errors
def test_errors():
    table = _objects()
    with pytest.raises(ValueError, match="fitted FeatureSpace"):
        diagnose_design(table, FeatureSpace())
    space = FeatureSpace().fit(table)
    with pytest.raises(ValueError, match=r"one label per stimulus \(48\)"):
        diagnose_design(table, space, groups=np.arange(5))
    with pytest.raises(ValueError, match="threshold must be in"):
        diagnose_design(table, space, threshold=1.5)


def test_the_estimator_warns_about_a_duplicated_feature_as_the_analyses_do():
    """MLEM.fit runs the analyses' design diagnostics: a copied feature (whose importance
    splits between the copies) is warned with the analyses' message, at the user's line."""
    from mlem_neuro import MLEM

    rng = np.random.default_rng(0)
    y = pd.DataFrame({"a": rng.standard_normal(40), "b": rng.integers(0, 3, 40) > 0})
    X = np.c_[y["a"], y["b"]] + 0.3 * rng.standard_normal((40, 2))
    y2 = y.assign(a2=y["a"])
    space = FeatureSpace().fit(y2)
    expected = [design_message(f, 0) for f in diagnose_design(y2, space)]
    assert len(expected) == 1 and "'a2' duplicates 'a'" in expected[0]
    with pytest.warns(UserWarning) as record:
        MLEM(max_steps=5, random_state=0).fit(X, y2)
    design = [w for w in record if str(w.message).startswith("design:")]
    assert [str(w.message) for w in design] == expected
    assert design[0].filename == __file__
    with warnings.catch_warnings():                       # no copy: no warning
        warnings.simplefilter("error", UserWarning)
        MLEM(max_steps=5, random_state=0).fit(X, y)
