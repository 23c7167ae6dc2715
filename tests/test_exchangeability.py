"""Nulls that respect the design: relabelling within groups (runs), whole groups (items),
and tests that cannot move reported as not testable."""
import warnings

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.core.features import FeatureSpace
from mlem_neuro.core.nulls import exchange_units, null_design, null_permutations


def _block_design(n_runs=4, n_cond=6):
    """One block per condition per run, conditions in a random order in each run."""
    rng = np.random.default_rng(1)
    cond = np.concatenate([rng.permutation(n_cond) for _ in range(n_runs)])
    run = np.repeat(np.arange(n_runs), n_cond)
    table = pd.DataFrame({"cond": pd.Categorical([f"c{c}" for c in cond]),
                          "half": cond < n_cond // 2})
    return table, run


def _encode(table):
    space = FeatureSpace().fit(table)
    return space.transform(table), space.kinds_


def test_nulls_relabel_within_runs_and_within_the_other_features():
    table, run = _block_design()
    table["side"] = np.tile([True, False], len(table) // 2)
    enc, kinds = _encode(table[["half", "side"]])
    perms = null_permutations(enc, kinds, 30, np.random.default_rng(0), groups=run)
    assert perms.shape == (3, 30, len(table))
    for t in range(3):
        for p in perms[t]:
            assert sorted(p) == list(range(len(table)))        # a permutation
            np.testing.assert_array_equal(run[p], run)          # within its run
    # a feature's null also keeps the other feature (conditional)
    for p in perms[1]:
        np.testing.assert_array_equal(table["side"].to_numpy()[p], table["side"])
    # and the relabellings do move stimuli (not the identity)
    assert (perms != np.arange(len(table))).any(axis=-1).all()


def test_without_groups_the_nulls_cross_runs():
    table, run = _block_design()
    enc, kinds = _encode(table[["half"]])
    perms = null_permutations(enc, kinds, 20, np.random.default_rng(0))
    assert any((run[p] != run).any() for p in perms[0])


def test_groups_of_one_feature_row_are_items_exchanged_whole():
    rng = np.random.default_rng(0)
    item_a, item_b = rng.permutation(np.arange(12) % 2), rng.permutation(np.arange(12) // 6)
    sizes = np.array([2, 3] * 6)
    item = np.repeat(np.arange(12), sizes)
    table = pd.DataFrame({"a": item_a[item].astype(bool), "b": item_b[item].astype(bool)})
    enc, kinds = _encode(table)
    assert exchange_units(enc, item) == "whole"
    perms = null_permutations(enc, kinds, 25, np.random.default_rng(1), groups=item)
    for t in range(3):
        for p in perms[t]:
            assert sorted(p) == list(range(len(item)))
            # the trials of an item go, in order, to the trials of one item of its size
            for u in range(12):
                members = np.flatnonzero(item == u)
                target = item[p[members]]
                assert len(set(target)) == 1
                assert np.all(np.diff(p[members]) == 1)
    # feature a's null keeps b at the item level; it moves some items
    for p in perms[1]:
        np.testing.assert_array_equal(table["b"].to_numpy()[p], table["b"])
    assert any((item[p] != item).any() for p in perms[1])


def test_nested_feature_is_not_testable_and_the_marginal_null_is():
    table, run = _block_design()
    enc, kinds = _encode(table)
    design = null_design(enc, kinds, run)
    assert design.mode == "within"
    assert set(design.untestable) == {"half"}
    assert "determined by the other features ['cond']" in design.untestable["half"]
    assert null_design(enc, kinds, run, null="marginal").untestable == {}


def test_a_feature_constant_within_every_group_is_not_testable_within_groups():
    rng = np.random.default_rng(0)
    session = np.repeat(np.arange(6), 8)
    table = pd.DataFrame({"drug": (session % 2).astype(bool),
                          "word": rng.permutation(np.arange(48) % 2).astype(bool)})
    enc, kinds = _encode(table)
    design = null_design(enc, kinds, session)
    assert set(design.untestable) == {"drug"}
    assert "constant within every group" in design.untestable["drug"]


def test_analysis_reports_an_untestable_test_as_nan_with_a_warning():
    table, run = _block_design()
    rng = np.random.default_rng(0)
    data = rng.standard_normal((len(table), 6, 2))
    with pytest.warns(UserWarning, match="permutation test of 'half' is not testable"):
        res = mlem_neuro.mlem_array(data, table, groups=run, cv=2, n_null=5, max_steps=20,
                                    interactions=False, random_state=0)
    k = res.tests.index("half")
    assert np.isnan(res.pvalues[:, k]).all() and np.isnan(res.pvalues_fwe[:, k]).all()
    assert not np.isnan(res.pvalues[:, res.tests.index("cond")]).any()
    assert "nested" in res.settings["untestable_tests"]["half"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        marginal = mlem_neuro.mlem_array(data, table, groups=run, cv=2, n_null=5,
                                         max_steps=20, interactions=False,
                                         null="marginal", random_state=0)
    assert not np.isnan(marginal.pvalues).any()
    assert marginal.settings["null"] == "marginal"


def test_analysis_nulls_stay_within_runs(monkeypatch):
    """The relabellings an analysis draws (every test) keep each stimulus in its run."""
    from mlem_neuro import crossval

    seen = []
    real = crossval.null_permutations

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out)
        return out

    monkeypatch.setattr(crossval, "null_permutations", spy)
    table, run = _block_design()
    data = np.random.default_rng(0).standard_normal((len(table), 6, 2))
    mlem_neuro.mlem_array(data, table[["cond"]], groups=run, cv=2, n_null=4, max_steps=10,
                          random_state=0, verbose="ERROR")
    (perms,) = seen
    assert (run[perms] == run).all()
