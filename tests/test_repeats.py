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
    assert np.all((res.pvalues >= 1 / 5) & (res.pvalues <= 1))


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
