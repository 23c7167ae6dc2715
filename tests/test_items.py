"""``items=``: the trials of each item are averaged before every analysis (mlem_array,
mlem_epochs, mlem_searchlight, mlem_roi, the CLI): equal to averaging by hand, folds over
items, the effect recovered where single trials hide it, and clear errors."""
import mne
import nibabel as nib
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.items import Items, check_items
from mlem_neuro.simulation import simulate_item_trials
from mlem_neuro.time_resolved import _scale_channels

FAST = dict(cv=3, n_repeats=1, max_steps=100, n_permutations=2)
AFFINE = np.diag([3.0, 3.0, 3.0, 1.0])


def by_hand(data, labels):
    """Items in the order of their first trial, and each item's mean trial."""
    order = list(dict.fromkeys(labels))
    return order, np.stack([data[np.asarray(labels) == k].mean(axis=0) for k in order])


def assert_same_fit(a, b):
    for name in ("fold_importance", "fold_score", "fold_weights"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert a.terms == b.terms


@pytest.fixture(scope="module")
def trials():
    """24 items (2 conditions) x 4 trials, 8 units, 6 time points; a second feature
    ("size", per item) that is not encoded."""
    data, table = simulate_item_trials(n_items=24, n_trials=4, n_units=8, n_times=6,
                                       amplitude=0.8, random_state=0)
    size = {f"i{k:02d}": k % 3 for k in range(24)}
    table["size"] = table["item"].map(size)
    return data, table


# -------------------------------------------------------------- equal to by hand
def test_array_items_equal_averaging_by_hand(trials):
    data, table = trials
    res = mlem_neuro.mlem_array(data, table, items="item", random_state=0, **FAST)
    # channels are scaled over trials, then the items averaged
    order, mean = by_hand(_scale_channels(data), table["item"])
    first = table.drop_duplicates("item").set_index("item").loc[order]
    ref = mlem_neuro.mlem_array(mean, first.reset_index(drop=True), scale=False,
                                random_state=0, **FAST)
    assert_same_fit(res, ref)
    res_raw = mlem_neuro.mlem_array(data, table, items="item", scale=False, random_state=0,
                                    **FAST)
    ref_raw = mlem_neuro.mlem_array(by_hand(data, table["item"])[1],
                                    first.reset_index(drop=True), scale=False,
                                    random_state=0, **FAST)
    assert_same_fit(res_raw, ref_raw)
    assert res.terms == ["condition", "size"]          # the items column is no feature
    s = res.settings
    assert s["items"] == "item" and s["n_items"] == 24 and s["n_trials"] == 96
    assert s["item_labels"] == order and s["trials_per_item"] == [4] * 24
    # an array of labels gives the same analysis (items column then given apart)
    res2 = mlem_neuro.mlem_array(data, table.drop(columns="item"), items=table["item"],
                                 random_state=0, **FAST)
    assert_same_fit(res2, res)
    assert res2.settings["items"] is None and res2.settings["n_items"] == 24


def test_folds_are_over_items_and_groups_reduce_per_item(trials):
    data, table = trials
    # each item in exactly one held-out fold (fold indices index items)
    res = mlem_neuro.mlem_array(data, table, items="item", random_state=1, **FAST)
    held = np.concatenate(res.settings["fold_test_indices"])
    assert sorted(held.tolist()) == list(range(24))
    # groups per trial, constant within items (block = item number // 6): reduced to
    # one per item, and the folds keep each block's items together
    block = table["item"].str[1:].astype(int).to_numpy() // 6
    res = mlem_neuro.mlem_array(data, table, items="item", groups=block, random_state=1,
                                **FAST)
    item_block = np.array([int(k[1:]) // 6 for k in res.settings["item_labels"]])
    folds = [item_block[np.asarray(te)] for te in res.settings["fold_test_indices"]]
    assert res.settings["n_groups"] == 4
    for k, held in enumerate(folds):
        others = np.concatenate([f for j, f in enumerate(folds) if j != k])
        assert not set(held) & set(others)


def test_epochs_items_from_metadata_equal_averaging_by_hand(trials):
    data, table = trials
    info = mne.create_info([f"EEG{k}" for k in range(8)], 100.0, "eeg")
    epochs = mne.EpochsArray(data * 1e-6, info, metadata=table, verbose=False)
    # the items column is in the metadata but not among the features
    res = mlem_neuro.mlem_epochs(epochs, features=["condition", "size"], items="item",
                                 scale=False, random_state=0, **FAST)
    order, mean = by_hand(epochs.get_data(), table["item"])
    first = table.drop_duplicates("item").set_index("item").loc[order].reset_index()
    ref = mlem_neuro.mlem_epochs(mne.EpochsArray(mean, info, metadata=first, verbose=False),
                                 features=["condition", "size"], scale=False,
                                 random_state=0, **FAST)
    assert_same_fit(res, ref)
    assert res.settings["n_epochs"] == 96 and res.settings["n_items"] == 24
    # features=None: every metadata column but the items column is a feature
    res = mlem_neuro.mlem_epochs(epochs, items="item", random_state=0, **FAST)
    assert res.terms == ["condition", "size"]


def _images(data):
    """(n, 8 units, 6 times) → n images of 4 x 4 x 3 voxels (units x times)."""
    n = len(data)
    vol = np.concatenate([data, data[:, ::-1] * 0.5], axis=1).reshape(n, 4, 4, 6)[..., :3]
    return nib.Nifti1Image(np.moveaxis(vol, 0, -1).astype(np.float64), AFFINE)


def test_searchlight_and_roi_items_equal_averaging_by_hand(trials):
    data, table = trials
    imgs = _images(data)
    mask = nib.Nifti1Image(np.ones((4, 4, 3), np.int8), AFFINE)
    order, mean = by_hand(data, table["item"])
    first = table.drop_duplicates("item").set_index("item").loc[order].reset_index()
    kw = dict(radius=4.0, random_state=0, **FAST)
    res = mlem_neuro.mlem_searchlight(imgs, table, mask, items="item", **kw)
    ref = mlem_neuro.mlem_searchlight(_images(mean), first.drop(columns="item"), mask, **kw)
    np.testing.assert_allclose(res.fold_score, ref.fold_score, atol=1e-12)
    np.testing.assert_allclose(res.fold_importance, ref.fold_importance, atol=1e-12)
    assert res.settings["n_images"] == 96 and res.settings["n_items"] == 24
    labels = nib.Nifti1Image(np.repeat([1, 2], 24).reshape(4, 4, 3).astype(np.int16),
                             AFFINE)
    res = mlem_neuro.mlem_roi(imgs, table, labels, items="item", random_state=0, **FAST)
    ref = mlem_neuro.mlem_roi(_images(mean), first.drop(columns="item"), labels,
                              random_state=0, **FAST)
    np.testing.assert_allclose(res.fold_score, ref.fold_score, atol=1e-12)
    assert res.settings["trials_per_item"] == [4] * 24


def test_runs_are_z_scored_before_the_items_are_averaged(trials):
    """standardize="run" works on the trials' images (runs given per trial), then the
    items are averaged: equal to doing both by hand in that order."""
    from mlem_neuro.fmri import zscore_runs

    data, table = trials
    imgs = _images(data)
    mask = nib.Nifti1Image(np.ones((4, 4, 3), np.int8), AFFINE)
    runs = np.tile(np.arange(4), 24)                   # every item has a trial in each run
    X = zscore_runs(np.asarray(imgs.dataobj).reshape(-1, len(data)).T, runs)
    order, mean = by_hand(X, table["item"])
    ref_imgs = nib.Nifti1Image(mean.T.reshape(4, 4, 3, -1), AFFINE)
    first = table.drop_duplicates("item").set_index("item").loc[order].reset_index()
    kw = dict(radius=4.0, random_state=0, **FAST)
    res = mlem_neuro.mlem_searchlight(imgs, table.set_index(pd.Index(runs, name="run")),
                                      mask, items="item", standardize="run", **kw)
    ref = mlem_neuro.mlem_searchlight(ref_imgs, first.drop(columns="item"), mask, **kw)
    np.testing.assert_allclose(res.fold_score, ref.fold_score, atol=1e-12)
    assert res.settings["standardize"] == "run" and res.settings["n_items"] == 24


def test_items_settings_round_trip(trials, tmp_path):
    data, table = trials
    res = mlem_neuro.mlem_array(data, table, items="item", random_state=0, **FAST)
    back = mlem_neuro.read_result(res.save(tmp_path / "items_mlem.npz"))
    for key in ("items", "n_items", "item_labels", "trials_per_item"):
        assert back.settings[key] == res.settings[key]


# ------------------------------------------------------------------ ground truth
def test_averaging_items_recovers_what_single_trials_hide():
    """2 conditions x 20 items x 8 trials, condition pattern amplitude 0.5, trial noise 1.
    Measured over seeds 0-19 (benchmarks/bench_items.py): held-out ρ per trial
    0.250 +- 0.064 (range 0.125 to 0.333), with items= 0.823 +- 0.061 (range 0.661 to
    0.864); the cap with one binary feature is 0.866."""
    for seed in (0, 1):
        data, table = simulate_item_trials(n_items=40, n_trials=8, n_units=16,
                                           amplitude=0.5, random_state=seed)
        kw = dict(cv=4, n_repeats=1, n_permutations=1, random_state=seed)
        trial = mlem_neuro.mlem_array(data, table[["condition"]], **kw).score[0]
        item = mlem_neuro.mlem_array(data, table, items="item", **kw).score[0]
        assert trial < 0.4 < 0.55 < item < np.sqrt(3) / 2 + 1e-9


# ---------------------------------------------------------------------- errors
def test_items_validation(trials):
    data, table = trials
    call = dict(random_state=0, **FAST)
    with pytest.raises(ValueError, match=r"items='word' names no column.*'item'"):
        mlem_neuro.mlem_array(data, table, items="word", **call)
    with pytest.raises(ValueError, match=r"one label per trial \(96\); got shape \(95,\)"):
        mlem_neuro.mlem_array(data, table, items=table["item"][:95], **call)
    labels = table["item"].to_numpy(dtype=object).copy()
    labels[5] = None
    with pytest.raises(ValueError, match="1 missing label.*trial 5"):
        mlem_neuro.mlem_array(data, table, items=labels, **call)
    with pytest.raises(ValueError, match=r"1 item\(s\).*at least 3"):
        mlem_neuro.mlem_array(data, table, items=["w"] * 96, **call)
    with pytest.raises(ValueError, match=r"'condition'\) names 2 item\(s\)"):
        mlem_neuro.mlem_array(data, table, items="condition", **call)
    with pytest.raises(TypeError, match="items must be None, a column name"):
        mlem_neuro.mlem_array(data, table, items=3, **call)
    bad = table.copy()
    t = int(np.flatnonzero(bad["item"] == "i07")[2])
    bad.loc[t, "size"] = 9
    with pytest.raises(ValueError, match=r"trials of item 'i07' disagree on the feature "
                                         rf"'size': trial \d+ has 1, trial {t} has 9"):
        mlem_neuro.mlem_array(data, bad, items="item", **call)
    groups = np.arange(96) % 4                  # varies within items
    with pytest.raises(ValueError, match="disagree on groups.*constant per item"):
        mlem_neuro.mlem_array(data, table, items="item", groups=groups, **call)
    info = mne.create_info([f"EEG{k}" for k in range(8)], 100.0, "eeg")
    epochs = mne.EpochsArray(data * 1e-6, info, metadata=table, verbose=False)
    with pytest.raises(ValueError, match=r"no column of the feature table or of "
                                         r"epochs.metadata"):
        mlem_neuro.mlem_epochs(epochs, items="word", **call)


def test_items_object():
    items = check_items(np.array([3, 1, 3, 2, 1, 2, 2]), 7)
    assert items.labels_.tolist() == [3, 1, 2] and items.counts_.tolist() == [2, 2, 3]
    x = np.arange(7.0)
    np.testing.assert_array_equal(items.average(x), [1.0, 2.5, 14 / 3])
    table = pd.DataFrame({"f": [np.nan, 0, np.nan, 1, 0, 1, 1]})   # NaN agrees with NaN
    assert items.reduce_table(table)["f"].tolist()[1:] == [0, 1]
    assert check_items(None, 7) is None
    assert Items(["a", "b", "a"]).n_items == 2
    with pytest.raises(ValueError, match="label 7 trials but the data have 6"):
        items.average(np.zeros(6))


# ------------------------------------------------------------------------- CLI
def test_cli_items(trials, tmp_path, capsys):
    from mlem_neuro.cli import main

    data, table = trials
    info = mne.create_info([f"EEG{k}" for k in range(8)], 100.0, "eeg")
    fname = tmp_path / "items-epo.fif"
    mne.EpochsArray(data * 1e-6, info, metadata=table, verbose=False).save(fname,
                                                                          verbose=False)
    out = tmp_path / "out"
    assert main(["epochs", str(fname), "--features", "condition,size", "--items", "item",
                 "--cv", "3",
                 "--n-permutations", "1", "--max-steps", "50", "--out", str(out)]) == 0
    assert "24 items of 4-4 trials" in capsys.readouterr().out
    res = mlem_neuro.read_result(out / "mlem.npz")
    assert res.terms == ["condition", "size"] and res.settings["n_items"] == 24
    assert main(["epochs", str(fname), "--items", "word", "--out",
                 str(tmp_path / "o2")]) == 2
    assert "--items 'word' is not a metadata column" in capsys.readouterr().err


def test_cli_searchlight_items_checked_before_any_glm(tmp_path, capsys):
    from mlem_neuro.cli import main

    bold = tmp_path / "bold.nii.gz"                # never read: the errors come first
    bold.write_bytes(b"")
    events = tmp_path / "events.tsv"
    pd.DataFrame({"onset": [0, 10], "duration": [1, 1], "trial_type": ["a", "b"],
                  "word": ["x", "y"]}).to_csv(events, sep="\t", index=False)
    args = ["searchlight", "--imgs", str(bold), "--events", str(events), "--mask",
            str(bold), "--t-r", "2", "--out", str(tmp_path / "out")]
    assert main([*args, "--items", "word", "--model", "condition"]) == 2
    assert "--items needs --model trial" in capsys.readouterr().err
    assert main([*args, "--items", "stimulus"]) == 2
    assert "--items 'stimulus' is not a column of the events" in capsys.readouterr().err
