"""Repeated cross-validation (``n_repeats``): folds, validation, variance, results."""
import warnings

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.crossval import check_cv
from mlem_neuro.simulation import simulate_epochs

FAST = dict(max_steps=100, patience=20, n_permutations=5, verbose="ERROR")


@pytest.fixture(scope="module")
def small():
    return simulate_epochs(n_trials=40, n_channels=8, n_times=5, sfreq=50.0, tmin=-0.02,
                           random_state=0)


def _partitions(folds, n):
    """Every block of folds holds each stimulus out exactly once."""
    held = np.concatenate([te for _, te in folds])
    return np.array_equal(np.sort(held), np.arange(n))


def test_each_repetition_is_a_new_partition():
    rng = np.random.default_rng(0)
    folds = check_cv(4, 30, rng, n_repeats=3)
    assert len(folds) == 12
    blocks = [folds[4 * r:4 * (r + 1)] for r in range(3)]
    for block in blocks:
        assert _partitions(block, 30)
        for train, test in block:
            assert np.intersect1d(train, test).size == 0
            assert len(train) + len(test) == 30
    # new random folds each time: the held-out sets of two repetitions differ
    tests = [{tuple(te) for _, te in block} for block in blocks]
    assert tests[0] != tests[1] and tests[1] != tests[2]


def test_repetitions_keep_groups_together():
    groups = np.repeat(np.arange(10), 3)
    folds = check_cv(5, 30, np.random.default_rng(1), groups=groups, n_repeats=2)
    assert len(folds) == 10
    for train, test in folds:
        assert not set(groups[train]) & set(groups[test])
    assert _partitions(folds[:5], 30) and _partitions(folds[5:], 30)
    assert {tuple(te) for _, te in folds[:5]} != {tuple(te) for _, te in folds[5:]}


@pytest.mark.parametrize("kw, err, match", [
    (dict(n_repeats=0), ValueError, "n_repeats must be .auto. or an int >= 1"),
    (dict(n_repeats=2.5), TypeError, "n_repeats must be .auto. or an int"),
    (dict(n_repeats=True), TypeError, "n_repeats must be .auto. or an int"),
    (dict(n_repeats=2, cv=None), ValueError, "repeats an int cv"),
    (dict(n_repeats=2, cv=[(np.arange(3, 40), np.arange(3))]), ValueError,
     "repeats an int cv"),
])
def test_bad_n_repeats_is_refused(small, kw, err, match):
    data, table, times = small
    with pytest.raises(err, match=match):
        mlem_neuro.mlem_array(data, table, times=times, **kw)
    with pytest.raises(err, match=match):
        MLEMOptions(**kw)


def test_results_hold_every_fold_and_round_trip(small, tmp_path):
    data, table, times = small
    res = mlem_neuro.mlem_array(data, table, times=times, cv=4, n_repeats=3, random_state=0,
                                **FAST)
    assert res.n_folds == 12
    assert res.fold_importance.shape[0] == 12
    assert res.settings["n_repeats"] == 3
    assert len(res.settings["fold_test_indices"]) == 12
    np.testing.assert_allclose(res.importance, res.fold_importance.mean(axis=0))
    res.save(tmp_path / "rep.npz")
    back = mlem_neuro.read_result(tmp_path / "rep.npz")
    assert back.settings["n_repeats"] == 3
    np.testing.assert_array_equal(back.fold_importance, res.fold_importance)


def test_repeats_with_permutation_tests(small):
    data, table, times = small
    res = mlem_neuro.mlem_array(data, table, times=times, cv=4, n_repeats=2, n_null=4,
                                random_state=0, **FAST)
    assert res.pvalues.shape == (len(times), len(res.tests))
    floor = np.array([1 / (1 + res.settings["n_null_used"][t]) for t in res.tests])
    assert np.all((res.pvalues >= floor - 1e-12) & (res.pvalues <= 1))
    assert floor[res.tests.index("score")] == 1 / 5


@pytest.mark.filterwarnings("ignore:every held-out pair")
def test_repeats_reduce_the_spread_due_to_the_split(small):
    """The same data analysed with different seeds (so different folds): importance varies
    less between seeds with 4 repetitions.  Measured on three datasets (8 seeds each): the
    mean standard deviation over seeds fell to 0.46-0.55 of its value with one repetition
    (1/sqrt(4) = 0.5 if the folds were the only noise)."""
    data, table, times = small
    sd = {}
    for rep in (1, 4):
        imps = np.stack([mlem_neuro.mlem_array(data, table, times=times, random_state=s,
                                               n_repeats=rep, **FAST).importance
                         for s in range(8)])
        sd[rep] = imps.std(axis=0, ddof=1).mean()
    assert sd[4] < 0.7 * sd[1]


def test_searchlight_and_cli_take_n_repeats(tmp_path):
    import nibabel as nib

    rng = np.random.default_rng(0)
    shape, n = (4, 4, 4), 24
    imgs = nib.Nifti1Image(rng.standard_normal(shape + (n,)).astype(np.float32), np.eye(4))
    mask = nib.Nifti1Image(np.ones(shape, np.int8), np.eye(4))
    table = pd.DataFrame({"a": np.tile(["x", "y"], n // 2), "b": np.repeat(["u", "v"], n // 2)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = mlem_neuro.mlem_roi(imgs, table, mask, cv=3, n_repeats=2, random_state=0,
                                  **FAST)
    assert res.n_folds == 6

    import mne

    from mlem_neuro.cli import main

    data, table, times = simulate_epochs(n_trials=30, n_channels=4, n_times=3, sfreq=10.0,
                                         tmin=0.0, random_state=0)
    info = mne.create_info([f"EEG{k}" for k in range(4)], 10.0, "eeg")
    epochs = mne.EpochsArray(data * 1e-6, info, tmin=0.0, metadata=table, verbose="ERROR")
    epochs.save(tmp_path / "x-epo.fif", verbose="ERROR")
    assert main(["epochs", str(tmp_path / "x-epo.fif"), "--features", ",".join(table.columns),
                 "--cv", "3", "--n-repeats", "2", "--max-steps", "20", "--n-permutations", "1",
                 "--out", str(tmp_path / "out")]) == 0
    back = mlem_neuro.read_result(tmp_path / "out" / "mlem.npz")
    assert back.settings["n_repeats"] == 2 and back.n_folds == 6
    assert main(["epochs", str(tmp_path / "x-epo.fif"), "--cv", "0", "--n-repeats", "2",
                 "--out", str(tmp_path / "bad")]) == 2


# ---------------------------------------------------------------- bounds on n_repeats
def test_n_repeats_above_the_maximum_is_refused_before_any_work(small, capsys):
    """n_repeats=10**7 used to be accepted and draw folds for minutes (4.2 s per 10**5
    repeats of 40 stimuli): the registry refuses it, naming the value and the bound, in
    the options, the drivers and the command line alike."""
    from mlem_neuro.cli import main
    from mlem_neuro.core.constants import MAX_REPEATS

    match = f"n_repeats must be at most {MAX_REPEATS}; got {10**7}"
    data, table, times = small
    with pytest.raises(ValueError, match=match):
        MLEMOptions(n_repeats=10**7)
    with pytest.raises(ValueError, match=match):
        mlem_neuro.mlem_array(data, table, times=times, n_repeats=10**7, **FAST)
    with pytest.raises(ValueError, match=match):
        check_cv(2, 40, np.random.default_rng(0), n_repeats=10**7)
    assert len(check_cv(2, 40, np.random.default_rng(0), n_repeats=MAX_REPEATS)) == 2000
    with pytest.raises(SystemExit):
        main(["epochs", "x-epo.fif", "--n-repeats", str(10**7), "--out", "o"])
    assert f"must be at most {MAX_REPEATS}; got {10**7}" in capsys.readouterr().err


@pytest.mark.parametrize("n_units, cv, grouped", [
    (6, 2, False), (7, 2, False), (9, 3, False), (8, 2, False),
    (2, 2, True), (5, 2, True), (7, 3, True)])
def test_n_distinct_splits_counts_what_the_splitter_draws(n_units, cv, grouped):
    """The count is that of the distinct splits random draws reach (stimuli: array_split
    of a permutation; groups: shuffled GroupKFold), and of the listed partitions."""
    from mlem_neuro.crossval import _group_kfold, _partitions, _split_key, n_distinct_splits

    rng = np.random.default_rng(0)
    if grouped:
        groups = np.repeat(np.arange(n_units), 3)
        draws = [list(_group_kfold(cv, groups, rng, True)) for _ in range(1000)]
    else:
        from mlem_neuro.core.stimuli.pairs import kfold_stimuli
        draws = [kfold_stimuli(n_units, cv, rng) for _ in range(3000)]
    count = n_distinct_splits(n_units, cv)
    assert len({_split_key(split) for split in draws}) == count
    q, r = divmod(n_units, cv)
    parts = list(_partitions(tuple(range(n_units)), (q + 1,) * r + (q,) * (cv - r)))
    assert len(parts) == len({frozenset(map(frozenset, p)) for p in parts}) == count
    assert n_distinct_splits(2, 2) == 1 and n_distinct_splits(4, 2) == 3
    assert n_distinct_splits(10**5, 2) == float("inf")        # never a cap, and fast


def _blocks(folds, cv):
    return [{tuple(te) for _, te in folds[k:k + cv]} for k in range(0, len(folds), cv)]


def test_two_runs_auto_runs_their_one_split_once(small):
    """2 runs as groups, cv=2, "auto": one split exists; it used to be repeated 50 times
    (100 folds, the spread shrinking as if they were independent)."""
    data, table, times = small
    runs = np.repeat([0, 1], 20)
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # "auto" caps quietly
        notes = {}
        folds = check_cv(2, 40, np.random.default_rng(0), groups=runs, n_repeats="auto",
                         notes=notes)
    assert len(folds) == 2
    assert notes == {"n_repeats_capped": "only 1 distinct split of 2 groups into 2 folds"}
    res = mlem_neuro.mlem_array(data, table, times=times, groups=runs, cv=2,
                                n_repeats="auto", random_state=0, **FAST)
    assert res.n_folds == 2 and res.settings["n_repeats_used"] == 1
    assert res.settings["n_repeats"] == "auto"
    assert res.settings["n_repeats_capped"] == ("only 1 distinct split of 2 groups into 2 "
                                                "folds")
    # not capped: no such key
    res = mlem_neuro.mlem_array(data, table, times=times, cv=4, n_repeats=2, random_state=0,
                                **FAST)
    assert "n_repeats_capped" not in res.settings


def test_an_int_above_the_distinct_splits_is_capped_with_a_warning():
    groups = np.repeat(np.arange(4), 5)           # 4 groups into 2 folds: 3 splits
    with pytest.warns(UserWarning, match=r"n_repeats=5: only 3 distinct splits of 4 groups "
                                         r"into 2 folds, so 3 repeat\(s\) are run"):
        folds = check_cv(2, 20, np.random.default_rng(0), groups=groups, n_repeats=5)
    assert len(folds) == 6
    assert len({frozenset(b) for b in _blocks(folds, 2)}) == 3      # each split once
    for block in _blocks(folds, 2):
        assert sorted(i for te in block for i in te) == list(range(20))


def test_few_splits_are_drawn_without_replacement():
    """8 stimuli into 2 folds have 35 splits: 30 repeats are 30 distinct splits (30 random
    draws of 35 repeat some almost surely), and 50 are capped at the 35."""
    for seed in range(3):
        folds = check_cv(2, 8, np.random.default_rng(seed), n_repeats=30)
        assert len(folds) == 60 and len({frozenset(b) for b in _blocks(folds, 2)}) == 30
    with pytest.warns(UserWarning, match="only 35 distinct splits of 8 stimuli"):
        folds = check_cv(2, 8, np.random.default_rng(0), n_repeats=50)
    assert len({frozenset(b) for b in _blocks(folds, 2)}) == 35 == len(folds) // 2
    # many splits: random draws, still distinct
    folds = check_cv(2, 12, np.random.default_rng(0), n_repeats=200)   # of 462
    assert len({frozenset(b) for b in _blocks(folds, 2)}) == 200


def test_the_cap_counts_only_usable_splits():
    """Splits with an unusable fold are not drawn: with stimuli 0 and 1 never held out
    together, 20 of the 35 splits of 8 stimuli remain."""
    def usable(train, test):
        return not {0, 1} <= set(test.tolist())

    notes = {}
    with pytest.warns(UserWarning, match="only 20 of the 35 distinct splits of 8 stimuli"):
        folds = check_cv(2, 8, np.random.default_rng(0), n_repeats=30, usable=usable,
                         notes=notes)
    assert len(folds) == 40 and all(usable(tr, te) for tr, te in folds)
    assert notes["n_repeats_capped"].startswith("only 20 of the 35")


def test_the_interaction_test_draws_the_same_capped_folds(small, monkeypatch):
    """The test of interactions draws its folds again (mlem_neuro/interaction.py): the
    same capped split as the analysis, not 50 copies of it."""
    from mlem_neuro.core.scoring import fastnull

    seen, original = [], fastnull.interaction_scores

    def recording(null_source, table, options, folds, *args, **kw):
        seen.append(folds)
        return original(null_source, table, options, folds, *args, **kw)

    monkeypatch.setattr(fastnull, "interaction_scores", recording)
    data, table, times = small
    runs = np.repeat([0, 1], 20)
    res = mlem_neuro.mlem_array(data[:, :, :2], table, times=times[:2], groups=runs, cv=2,
                                n_repeats="auto", n_null=2, random_state=0, **FAST)
    assert "interactions" in res.tests and len(seen) == 1 and len(seen[0]) == 2
    assert [te.tolist() for _, te in seen[0]] == res.settings["fold_test_indices"]


# ------------------------------------------------------------- the folds the tests read
def test_auto_tests_read_at_most_the_reference_folds_in_whole_repeats():
    from mlem_neuro.core.constants import AUTO_TEST_FOLDS
    from mlem_neuro.crossval import tested_folds

    assert tested_folds("auto", 2, 100) == AUTO_TEST_FOLDS == 20
    assert tested_folds("auto", 3, 99) == 18               # whole repeats of cv=3
    assert tested_folds("auto", 2, 12) == 12               # fewer folds: all of them
    assert tested_folds(50, 2, 100) == 100                 # an int n_repeats: every fold
    assert tested_folds("auto", None, 5) == 5              # a splitter / explicit folds


def test_the_tests_read_the_first_folds_and_the_estimates_every_fold(monkeypatch):
    """n_repeats="auto" on a small design gives 100 folds: the scores and importances are
    means over all of them, the tests' observed and null statistics (score, features,
    interactions) over the first 20, whose null models alone are fitted."""
    import mlem_neuro.interaction as interaction
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.inference import run_analysis

    rng = np.random.default_rng(4)
    n = 40
    table = pd.DataFrame({"a": np.repeat([0, 1], n // 2), "b": np.tile([0, 1], n // 2)})
    X = rng.normal(size=(2, n, 6)) + 0.8 * rng.normal(size=(2, 6))[table["a"]][None]
    seen = {}
    real = interaction.interaction_test

    def spy(*args, folds=None, **kwargs):
        seen["folds"] = folds
        return real(*args, folds=folds, **kwargs)

    monkeypatch.setattr(interaction, "interaction_test", spy)
    opts = MLEMOptions(n_null=9, random_state=0, feature_test="importance", max_steps=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_analysis(DenseRDMSource(X, "euclidean"), table, opts)
    k = out.n_test_folds
    assert len(out.folds) == 100 and k == 20
    assert out.fold_null.shape[0] == k and not np.isnan(out.fold_null).any()
    np.testing.assert_allclose(out.tests["score"][0], out.score[:k].mean(axis=0))
    for f, name in enumerate(out.feature_names):
        np.testing.assert_allclose(out.tests[name][0], out.importance[:k, :, f].mean(axis=0))
    assert not np.allclose(out.score[:k].mean(axis=0), out.score.mean(axis=0))
    assert len(seen["folds"]) == k
    for (tr, te), (tr2, te2) in zip(seen["folds"], out.folds[:k]):
        assert np.array_equal(tr, tr2) and np.array_equal(te, te2)
    # an explicit n_repeats: the tests read every fold
    opts = MLEMOptions(n_null=3, random_state=0, feature_test="importance", max_steps=30,
                       n_repeats=3, interactions=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_analysis(DenseRDMSource(X, "euclidean"), table, opts)
    assert out.n_test_folds == len(out.folds) == 6 and out.fold_null.shape[0] == 6
