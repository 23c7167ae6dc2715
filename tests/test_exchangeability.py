"""Nulls that respect the design: relabelling within groups (runs), whole groups (items),
and tests that cannot move reported as not testable."""
import warnings

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.core.scoring.nulls import exchange_units, null_design, null_permutations
from mlem_neuro.core.stimuli.features import FeatureSpace


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
    with pytest.warns(UserWarning, match=r"'half'.*not testable"):
        res = mlem_neuro.mlem_array(data, table, groups=run, cv=2, n_repeats=1, n_null=5,
                                    max_steps=20,
                                    interactions=False, random_state=0)
    k = res.tests.index("half")
    assert np.isnan(res.pvalues[:, k]).all() and np.isnan(res.pvalues_fwe[:, k]).all()
    assert not np.isnan(res.pvalues[:, res.tests.index("cond")]).any()
    assert "nested" in res.settings["untestable_tests"]["half"]
    assert "nested" in res.untestable_tests["half"] and "not testable: ['half']" in repr(res)
    frame = res.to_data_frame()
    assert frame.loc[frame.term == "half", "test_note"].str.contains("nested").all()
    assert (frame.loc[frame.term == "cond", "test_note"] == "").all()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        marginal = mlem_neuro.mlem_array(data, table, groups=run, cv=2, n_repeats=1, n_null=5,
                                         max_steps=20, interactions=False,
                                         null="marginal", random_state=0)
    assert not any("not testable" in str(w.message) for w in caught)
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
    mlem_neuro.mlem_array(data, table[["cond"]], groups=run, cv=2, n_repeats=1, n_null=4,
                          max_steps=10,
                          random_state=0, verbose="ERROR")
    # the tests' relabellings, then more for the main effect alone (MAIN_EFFECT_NULLS)
    assert len(seen) == 2 and seen[0].shape[1] == 4
    for perms in seen:
        assert (run[perms] == run).all()


def _centred_runs(seed, n_runs=16, C=10, T=3):
    """Two blocks per run (one per condition), each run's patterns centred: the two
    patterns of a run are opposite, so same-run pairs (all differing in ``cond``) are
    farther apart than pairs of different runs.  No condition is encoded."""
    rng = np.random.default_rng(seed)
    cond = np.concatenate([rng.permutation(2) for _ in range(n_runs)])
    run = np.repeat(np.arange(n_runs), 2)
    X = rng.standard_normal((2 * n_runs, C, T))
    for r in range(n_runs):
        X[run == r] -= X[run == r].mean(axis=0)
    return X, pd.DataFrame({"cond": cond.astype(bool)}), run


def test_pairs_between_runs_keep_run_structure_out_of_the_importance():
    """Ground truth: ``cond`` is not encoded.  On every held-out pair its importance is
    biased upwards by the runs; on pairs between runs it is not.

    Measured over seeds 0-19 (cv=4, n_repeats=1): every pair 0.086-0.307 (mean 0.18), pairs between
    runs mean 0.019, sd 0.069.  Seeds 0-9 here: means 0.18 and 0.03; bounds 0.12 and 0.08
    (the seeds are fixed, so only float order moves them, by about 1e-3).
    """
    every, between = [], []
    for seed in range(10):
        X, table, run = _centred_runs(seed)
        kw = dict(groups=run, cv=4, n_repeats=1, random_state=seed, verbose="ERROR")
        a = mlem_neuro.mlem_array(X, table, held_out_pairs="all", **kw)
        b = mlem_neuro.mlem_array(X, table, **kw)              # "auto": between runs
        assert a.settings["held_out_pairs_used"] == "all"
        assert b.settings["held_out_pairs_used"] == "between_groups"
        every.append(a.importance.mean())
        between.append(b.importance.mean())
    assert np.mean(every) > 0.12
    assert abs(np.mean(between)) < 0.08


def test_held_out_pairs_auto_keeps_every_pair_for_items_and_single_group_folds():
    X, table, run = _centred_runs(0, n_runs=6)
    table["side"] = np.arange(len(table)) % 3 == 0
    X = np.concatenate([X, X[:, ::-1]])
    table, run = pd.concat([table, table], ignore_index=True), np.r_[run, run]
    kw = dict(max_steps=10, random_state=0, verbose="ERROR")
    # leave-one-run-out: a held-out fold holds one run, so no pair between runs
    one = mlem_neuro.mlem_array(X, table, groups=run, cv=6, n_repeats=1, **kw)
    assert one.settings["held_out_pairs_used"] == "all"
    with pytest.raises(ValueError, match="two groups or more in every held-out fold"):
        mlem_neuro.mlem_array(X, table, groups=run, cv=6, n_repeats=1,
                              held_out_pairs="between_groups",
                              **kw)
    with pytest.raises(ValueError, match="pass groups"):
        mlem_neuro.mlem_array(X, table, held_out_pairs="between_groups", **kw)
    # groups of one feature row each (items): every pair
    item = table["cond"].astype(str) + table["side"].astype(str)    # one feature row each
    res = mlem_neuro.mlem_array(X, table, groups=item.to_numpy(), cv=2, n_repeats=1, **kw)
    assert res.settings["held_out_pairs_used"] == "all"


def test_between_group_scores_are_spearman_over_those_pairs_only(monkeypatch):
    """The held-out score with pairs between runs is the Spearman correlation of the
    fold's predictions and distances over exactly those pairs."""
    from scipy.stats import spearmanr

    from mlem_neuro.core.stimuli.pairs import pair_indices

    X, table, run = _centred_runs(3, n_runs=8)
    X = X + 0.1 * np.random.default_rng(0).standard_normal(X.shape)    # no tied distances
    res = mlem_neuro.mlem_array(X, table, groups=run, cv=4, n_repeats=1, max_steps=30,
                                random_state=0,
                                interactions=False, scale=False, verbose="ERROR")
    assert res.settings["held_out_pairs_used"] == "between_groups"
    for f, test in enumerate(res.settings["fold_test_indices"]):
        test = np.asarray(test)
        i, j = pair_indices(len(test))
        keep = run[test][i] != run[test][j]
        d = table["cond"].to_numpy()[test]
        pred = (d[i] != d[j]).astype(float)[keep]       # one feature: W is a scalar
        for t in range(X.shape[2]):
            Y = X[test, :, t]
            target = np.linalg.norm(Y[i] - Y[j], axis=1)[keep]
            assert res.fold_score[f, t] == pytest.approx(spearmanr(pred, target)[0],
                                                         abs=1e-9)


def test_group_labels_of_any_type_give_the_same_relabellings():
    table, run = _block_design()
    enc, kinds = _encode(table[["cond"]])
    ints = null_permutations(enc, kinds, 5, np.random.default_rng(0), groups=run)
    text = null_permutations(enc, kinds, 5, np.random.default_rng(0),
                             groups=np.array([f"run-{r:02d}" for r in run], dtype=object))
    np.testing.assert_array_equal(ints, text)


def test_analyses_with_tests_project_their_run_time_from_the_first_chunk(monkeypatch):

    table, run = _block_design()
    data = np.random.default_rng(0).standard_normal((len(table), 6, 3))
    kw = dict(groups=run, cv=2, n_repeats=1, max_steps=10, chunk_size=1, random_state=0)
    monkeypatch.setattr(mlem_neuro.core.jobs, "LONG_RUN_SECONDS", 0.0)
    with pytest.warns(UserWarning, match=r"the first of 6 chunks took .* about .* min"):
        tested = mlem_neuro.mlem_array(data, table[["cond"]], n_null=3, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)        # no tests: no projection
        plain = mlem_neuro.mlem_array(data, table[["cond"]], **kw)
    np.testing.assert_array_equal(tested.importance, plain.importance)


def test_the_interaction_null_keeps_one_intercept_per_run(monkeypatch):
    """With runs as groups, the run indicators are among the null's main effects, so the
    rotated residuals are free of whatever the runs share (exact under per-run centring:
    see interaction.py); with items as groups they are not added."""
    from mlem_neuro import interaction as additivity

    seen = []
    real = additivity.residual_basis
    monkeypatch.setattr(additivity, "residual_basis", lambda X: seen.append(X) or real(X))
    table, run = _block_design()
    table["side"] = np.tile([True, False], len(table) // 2)
    data = np.random.default_rng(0).standard_normal((len(table), 6, 2))
    res = mlem_neuro.mlem_array(data, table[["cond", "side"]], groups=run, cv=2, n_repeats=1,
                                n_null=3,
                                max_steps=10, random_state=0, verbose="ERROR")
    assert "interactions" in res.tests
    X = seen[-1]
    indicators = (run[:, None] == np.unique(run)[None]).astype(float)
    residual = indicators - X @ np.linalg.lstsq(X, indicators, rcond=None)[0]
    assert np.abs(residual).max() < 1e-10
    without = mlem_neuro.mlem_array(data, table[["cond", "side"]], cv=2, n_repeats=1, n_null=3,
                                    max_steps=10, random_state=0, verbose="ERROR")
    assert "interactions" in without.tests
    assert seen[-1].shape[1] == X.shape[1] - (len(np.unique(run)) - 1)


def test_command_line_takes_null_feature_test_and_held_out_pairs(tmp_path):
    mne = pytest.importorskip("mne")
    from mlem_neuro.cli import main

    table, run = _block_design()
    table["run"] = run
    data = np.random.default_rng(0).standard_normal((len(table), 4, 3)) * 1e-6
    info = mne.create_info(4, 100.0, "eeg")
    mne.EpochsArray(data, info, metadata=table, verbose=False).save(
        tmp_path / "x-epo.fif", verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["epochs", str(tmp_path / "x-epo.fif"), "--features", "cond,half",
                     "--groups", "run", "--cv", "2", "--n-null", "3", "--null", "marginal",
                     "--feature-test", "importance", "--held-out-pairs", "all",
                     "--max-steps", "5", "--no-interactions",
                     "--out", str(tmp_path / "o")]) == 0
    res = mlem_neuro.read_result(tmp_path / "o" / "mlem.npz")
    assert res.settings["null"] == "marginal"
    assert res.settings["feature_test"] == "importance"
    assert res.settings["feature_test_used"] == "importance"
    assert res.settings["held_out_pairs_used"] == "all"
    assert not np.isnan(res.pvalues).any()          # marginal: the nested 'half' moves
