"""BIDS in, BIDS derivatives out (:mod:`mlem_neuro.bids`, ``mlem-neuro bids``).

Small simulated studies (:func:`mlem_neuro.simulation.simulate_bids_study`: EEG written
with mne-bids, fMRI with an fMRIPrep-style derivatives folder) run at the participant then
the group level; bad datasets fail with the file named while the other participants run;
a second run redoes only what is missing; participants run through joblib (a local dask
cluster); the shared example layouts (empty data files) for discovery only.
"""
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("mne_bids")
pytest.importorskip("nilearn")

from mlem_neuro import bids  # noqa: E402
from mlem_neuro.cli import main  # noqa: E402
from mlem_neuro.simulation import simulate_bids_study  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "shared" / "data" / "bids_examples"
SPACE = "MNI152NLin2009cAsym"
#: small settings: each participant trains in well under a second
FAST = dict(cv=2, n_repeats=1, max_steps=40, random_state=0)
FAST_FLAGS = ["--cv", "2", "--n-repeats", "1", "--max-steps", "40", "--random-state", "0"]


def _eeg_study(root, effect, n_subjects=6, seed=0):
    pytest.importorskip("pybv")          # mne-bids writes BrainVision files with it
    return simulate_bids_study(root, "eeg", n_subjects=n_subjects, n_trials=40,
                               effect=effect, random_state=seed)


@pytest.fixture(scope="module")
def eeg_study(tmp_path_factory):
    return _eeg_study(tmp_path_factory.mktemp("eeg") / "study", effect=1.0)["bids_root"]


@pytest.fixture(scope="module")
def fmri_study(tmp_path_factory):
    return simulate_bids_study(tmp_path_factory.mktemp("fmri") / "study", "func",
                               n_subjects=6, n_trials=16, effect=1.0, random_state=0)


@pytest.fixture
def small_fmri(tmp_path):
    """Three fMRI participants, to break (a fresh copy per test)."""
    return simulate_bids_study(tmp_path / "study", "func", n_subjects=3, n_trials=12,
                               effect=1.0, random_state=1)


def _roi(paths, out, **kw):
    kw = {"features": ["category", "size"], **FAST, **kw}
    return bids.bids_participant(paths["bids_root"], out, task="objects", space=SPACE,
                                 analysis="roi", labels_img=paths["labels_img"],
                                 figures=False, **kw)


# --------------------------------------------------------------------- discovery
def _example(name):
    path = EXAMPLES / name
    if not path.is_dir():
        pytest.skip(f"{path} not found (the shared example layouts)")
    return path


def test_finds_fmriprep_derivatives_and_raw_events_of_the_example_layouts():
    raw, deriv = _example("ds001"), _example("ds000001-fmriprep")
    assert bids.bids_participants(raw, "balloonanalogrisktask") == [f"{k:02d}" for k in
                                                                    range(1, 17)]
    inputs = bids.bids_inputs(raw, "sub-16", "balloonanalogrisktask", derivatives=deriv,
                              space=SPACE)
    assert inputs.datatype == "func" and inputs.space == SPACE
    # fMRIPrep's run-1 is the raw run-01
    assert [Path(p).name for p in inputs.events] == [
        f"sub-16_task-balloonanalogrisktask_run-0{r}_events.tsv" for r in (1, 2, 3)]
    assert [Path(p).name for p in inputs.recordings] == [
        f"sub-16_task-balloonanalogrisktask_run-{r}_space-{SPACE}_res-2_desc-preproc_bold"
        ".nii.gz" for r in (1, 2, 3)]
    assert all("desc-brain_mask" in m and f"run-{r}_" in m
               for r, m in zip((1, 2, 3), inputs.masks))
    assert all(c.endswith("desc-confounds_timeseries.tsv") for c in inputs.confounds)
    assert all(s.endswith("desc-preproc_bold.json") for s in inputs.sidecars)
    # a raw participant fMRIPrep did not process: the file it expected is named
    with pytest.raises(FileNotFoundError, match=r"sub-01 has no preprocessed BOLD run .*"
                                                r"ds000001-fmriprep"):
        bids.bids_inputs(raw, "01", "balloonanalogrisktask", derivatives=deriv)


def test_finds_sessions_inherited_events_and_asks_for_a_space():
    root = _example("synthetic")
    assert bids.bids_participants(root, "nback") == ["01", "02", "03", "04", "05"]
    with pytest.raises(ValueError, match=r"several spaces \['MNI152NLin2009cAsym', 'T1w'\]"
                                         r"; pass space="):
        bids.bids_inputs(root, "01", "nback")
    inputs = bids.bids_inputs(root, "01", "nback", space="T1w")
    assert len(inputs.recordings) == 4                     # 2 sessions x 2 runs
    assert {Path(e).name for e in inputs.events} == {"task-nback_events.tsv"}  # inherited
    assert all("label-brain_mask" in m and "space-T1w" in m for m in inputs.masks)
    with pytest.raises(ValueError, match=r"task 'nbak' is not in the BIDS dataset .*its "
                                         r"tasks are \['nback', 'rest'"):
        bids.bids_participants(root, "nbak")


def test_finds_eeg_recordings_with_mne_bids():
    root = _example("eeg_matchingpennies")
    assert bids.bids_participants(root, "matchingpennies") == [
        "05", "06", "07", "08", "09", "10", "11"]
    inputs = bids.bids_inputs(root, "05", "matchingpennies")
    assert inputs.datatype == "eeg"
    assert [Path(p).name for p in inputs.recordings] == [
        "sub-05_task-matchingpennies_eeg.vhdr"]
    assert [Path(p).name for p in inputs.events] == [
        "sub-05_task-matchingpennies_events.tsv"]
    with pytest.raises(ValueError, match=r"no participant matches participant_label "
                                         r"\['99'\].*are \['05', '06'"):
        bids.bids_participants(root, "matchingpennies", participant_label="sub-99")
    with pytest.raises(ValueError, match="has no func recording"):
        bids.bids_participants(root, "matchingpennies", datatype="func")


# ------------------------------------------------------------------- MEG / EEG
def test_eeg_participant_then_group_finds_the_encoded_feature(eeg_study, tmp_path):
    out = tmp_path / "derivatives" / "mlem"
    report = bids.run_bids(eeg_study, out, "participant", task="objects",
                           features=["category", "size"], tmin=-0.1, tmax=0.4, **FAST)
    assert list(report.status) == ["done"] * 6
    stem = "sub-01_task-objects_desc-mlem"
    assert sorted(p.name for p in (out / "sub-01" / "eeg").iterdir()) == [
        f"{stem}_importance.csv", f"{stem}_importance.png", f"{stem}_result.npz"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]     # no staging left
    desc = json.loads((out / "dataset_description.json").read_text())
    assert desc["DatasetType"] == "derivative" and desc["BIDSVersion"]
    assert desc["GeneratedBy"][0]["Name"] == "mlem_neuro"
    assert desc["GeneratedBy"][0]["Version"] == __import__("mlem_neuro").__version__
    settings = desc["MLEMSettings"]["task-objects"]
    assert settings["features"] == ["category", "size"] and settings["datatype"] == "eeg"
    assert settings["options"]["max_steps"] == 40 and settings["tmin"] == -0.1
    res = __import__("mlem_neuro").read_result(out / "sub-01" / "eeg" / f"{stem}_result.npz")
    assert res.settings["bids"]["events"] == [
        "sub-01/eeg/sub-01_task-objects_events.tsv"]
    assert res.settings["n_epochs"] == 40 and res.times[0] == pytest.approx(-0.1)

    tests = bids.run_bids(eeg_study, out, "group", task="objects", n_null=200)
    assert tests["participants"] == [f"{k:02d}" for k in range(1, 7)]
    found = tests["category"].significant(0.05)
    assert found, tests["category"].to_data_frame()
    # the code peaks 0.2 s after onset (a bump of sd 0.05 s)
    assert any(res.times[c].min() <= 0.2 <= res.times[c].max() for c in found)
    assert not tests["size"].significant(0.05)
    clusters = pd.read_csv(out / "group" / "task-objects_desc-mlem_clusters.csv")
    assert set(clusters.term) <= {"category", "size"}
    assert (clusters[clusters.term == "category"].p_value < 0.05).any()
    assert {p.name for p in (out / "group").iterdir()} == {
        f"task-objects_desc-mlem_{s}" for s in ("clusters.csv", "clusters.png",
                                                "tstat.csv", "participants.json")}


def test_eeg_group_without_an_effect_finds_nothing(tmp_path):
    root = _eeg_study(tmp_path / "null", effect=0.0, seed=3)["bids_root"]
    out = tmp_path / "out"
    report = bids.bids_participant(root, out, task="objects", features=["category"],
                                   tmin=0.0, tmax=0.4, figures=False, **FAST)
    assert list(report.status) == ["done"] * 6
    tests = bids.bids_group(out, task="objects", n_null=200, figures=False)
    assert not tests["category"].significant(0.05), tests["category"].to_data_frame()


# -------------------------------------------------------------------------- fMRI
def test_fmri_cli_participant_then_group_maps(fmri_study, tmp_path, capsys):
    root, out = fmri_study["bids_root"], tmp_path / "mlem"
    args = ["bids", str(root), str(out), "participant", "--task", "objects",
            "--features", "category,size", "--space", SPACE, "--analysis", "roi",
            "--labels-img", str(fmri_study["labels_img"]), "--no-figures", *FAST_FLAGS]
    assert main(args) == 0
    assert "6 done, 0 skipped, 0 failed" in capsys.readouterr().out
    stem = f"sub-02_task-objects_space-{SPACE}_desc-mlem"
    assert sorted(p.name for p in (out / "sub-02" / "func").iterdir()) == sorted(
        f"{stem}_{s}" for s in ("importance.csv", "importance.json", "importance.nii.gz",
                                "result.npz", "score.nii.gz"))
    sidecar = json.loads((out / "sub-02" / "func" / f"{stem}_importance.json").read_text())
    assert sidecar["Terms"] == ["category", "size"]
    assert main(["bids", str(root), str(out), "group", "--task", "objects",
                 "--group-n-null", "500", "--no-figures"]) == 0
    printed = capsys.readouterr().out
    assert "Group level of task objects: 6 participants" in printed
    summary = pd.read_csv(out / "group" / f"task-objects_space-{SPACE}_desc-mlem_summary.csv")
    cat, size = (summary.set_index("term").loc[t] for t in ("category", "size"))
    # category is encoded in region 1 (x < 0 mm: 108 voxels) of every participant
    assert cat.max_logp > -np.log10(0.05) and cat.n_voxels_p05 == 108 and cat.peak_x < 0
    assert size.n_voxels_p05 == 0
    import nibabel as nib

    logp = nib.load(out / "group" / f"task-objects_space-{SPACE}_desc-mlem_logp.nii.gz")
    assert logp.shape == (6, 6, 6, 2)


def test_fmri_searchlight_of_one_participant_writes_maps_and_figure(small_fmri, tmp_path):
    out = tmp_path / "sl"
    report = bids.bids_participant(small_fmri["bids_root"], out, task="objects",
                                   features=["category"], participant_label="sub-01",
                                   radius=5.0, **FAST)
    assert list(report.status) == ["done"]
    folder = out / "sub-01" / "func"
    stem = f"sub-01_task-objects_space-{SPACE}_desc-mlem"
    import nibabel as nib

    imp = nib.load(folder / f"{stem}_importance.nii.gz")
    assert imp.shape[:3] == (6, 6, 6) and (folder / f"{stem}_importance.png").is_file()
    res = __import__("mlem_neuro").read_result(folder / f"{stem}_result.npz")
    assert res.settings["bids_t_r"] == 2.0 and res.settings["standardize"] == "run"
    assert res.settings["analysis"] == "searchlight"
    assert not (out / "sub-02").exists()


# ------------------------------------------------------------------ bad datasets
def _events(paths, label, run=1):
    return (paths["bids_root"] / f"sub-{label}" / "func"
            / f"sub-{label}_task-objects_run-{run:02d}_events.tsv")


def _deriv(paths, label, what, run=1):
    return (paths["derivatives"] / f"sub-{label}" / "func"
            / f"sub-{label}_task-objects_run-{run}_space-{SPACE}_{what}")


def test_bad_participants_are_named_and_the_others_run_then_resumed(small_fmri, tmp_path,
                                                                    capsys):
    events = _events(small_fmri, "02", run=2)
    mask = _deriv(small_fmri, "03", "desc-brain_mask.nii.gz")
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    shutil.move(events, hidden / events.name)
    shutil.move(mask, hidden / mask.name)
    out = tmp_path / "out"
    args = ["bids", str(small_fmri["bids_root"]), str(out), "participant", "--task",
            "objects", "--features", "category", "--space", SPACE, "--analysis", "roi",
            "--labels-img", str(small_fmri["labels_img"]), "--no-figures", *FAST_FLAGS]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "sub-02 failed: FileNotFoundError: no events.tsv for the BOLD run" in err
    assert f"expected {events}" in err
    assert "sub-03 failed: FileNotFoundError: sub-03 has no brain mask for the BOLD run" in err
    assert "run-1_space-MNI152NLin2009cAsym_desc-brain_mask.nii.gz" in err
    assert "2 participant(s) failed (sub-02, sub-03)" in err
    done = out / "sub-01" / "func" / f"sub-01_task-objects_space-{SPACE}_desc-mlem_result.npz"
    assert done.is_file() and not (out / "sub-02").exists() and not (out / "sub-03").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]
    # fixed: a second run redoes the failed ones only
    first = done.stat().st_mtime_ns
    shutil.move(hidden / events.name, events)
    shutil.move(hidden / mask.name, mask)
    assert main(args) == 0
    assert "2 done, 1 skipped, 0 failed" in capsys.readouterr().out
    assert done.stat().st_mtime_ns == first
    # --overwrite redoes every one
    assert main([*args, "--overwrite"]) == 0
    assert "3 done, 0 skipped, 0 failed" in capsys.readouterr().out
    assert done.stat().st_mtime_ns != first


def test_repetition_times_that_disagree_are_refused_naming_the_files(small_fmri, tmp_path):
    import nibabel as nib

    sidecar = _deriv(small_fmri, "01", "desc-preproc_bold.json")
    sidecar.write_text(json.dumps({"RepetitionTime": 2.5}))
    bold = _deriv(small_fmri, "02", "desc-preproc_bold.nii.gz", run=2)
    img = nib.load(bold)
    img = nib.Nifti1Image(np.asarray(img.dataobj), img.affine, img.header)
    img.header["pixdim"][4] = 3.0
    img.to_filename(bold)
    _deriv(small_fmri, "02", "desc-preproc_bold.json", run=2).write_text(
        json.dumps({"RepetitionTime": 3.0}))
    with pytest.warns(UserWarning, match="2 of 3 participant"):
        report = _roi(small_fmri, tmp_path / "out").set_index("participant")
    assert list(report.status) == ["failed", "failed", "done"]
    assert re.search(rf"RepetitionTime of {re.escape(str(sidecar))} \(2.5 s\) differs from "
                     r"the NIfTI header .* \(2 s\)", report.message["01"])
    assert ("sub-02: the BOLD runs have different repetition times "
            f"(sub-02_task-objects_run-1_space-{SPACE}_desc-preproc_bold.nii.gz: 2 s; "
            in report.message["02"])


def test_missing_columns_unknown_options_and_other_settings(small_fmri, tmp_path):
    out = tmp_path / "out"
    with pytest.warns(UserWarning, match="3 of 3 participant"):
        report = _roi(small_fmri, out, features=["category", "colour"])
    assert report.message[0].startswith("ValueError: the feature column(s) ['colour'] are "
                                        "not in ")
    assert str(_events(small_fmri, "01")) in report.message[0]
    with pytest.raises(TypeError, match=r"unknown analysis option\(s\) \['n_nul'\]"):
        _roi(small_fmri, out, n_nul=10)
    with pytest.raises(ValueError, match="analysis must be one of"):
        bids.bids_participant(small_fmri["bids_root"], out, task="objects",
                              features=["category"], analysis="sphere")
    _roi(small_fmri, out, participant_label="01")
    # the same folder with other settings: refused before anything runs
    with pytest.raises(ValueError, match=r"holds results of task-objects_space-"
                                         r"MNI152NLin2009cAsym made with other settings "
                                         r"\(options differ"):
        _roi(small_fmri, out, participant_label="01", max_steps=41)
    assert list(_roi(small_fmri, out, participant_label="01", max_steps=41,
                     overwrite=True).status) == ["done"]


def test_an_interrupted_participant_leaves_nothing_half_written(small_fmri, tmp_path,
                                                               monkeypatch):
    out = tmp_path / "out"
    real = bids._write_result

    def crash(res, folder, stem, *args):
        real(res, folder, stem, *args)
        raise OSError("disk full")

    monkeypatch.setattr(bids, "_write_result", crash)
    with pytest.warns(UserWarning, match="failed"):
        report = _roi(small_fmri, out, participant_label="02")
    assert report.message[0] == "OSError: disk full"
    assert sorted(p.name for p in out.iterdir()) == ["dataset_description.json"]
    monkeypatch.setattr(bids, "_write_result", real)
    assert list(_roi(small_fmri, out, participant_label="02").status) == ["done"]


# ------------------------------------------------------------------ command line
def test_cli_without_features_lists_the_events_columns(small_fmri, tmp_path, capsys):
    assert main(["bids", str(small_fmri["bids_root"]), str(tmp_path / "o"), "participant",
                 "--task", "objects", "--space", SPACE]) == 2
    err = capsys.readouterr().err
    assert "--features is required" in err and "'category'" in err and "'size'" in err
    assert main(["bids", str(small_fmri["bids_root"]), str(tmp_path / "o"), "participant",
                 "--task", "object", "--features", "category"]) == 2
    assert "its tasks are ['objects']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bids", str(small_fmri["bids_root"]), str(tmp_path / "o"), "everyone",
              "--task", "objects"])
    assert "must be one of ['participant', 'group']; got 'everyone'" in \
        capsys.readouterr().err
    assert main(["bids", str(small_fmri["bids_root"]), str(tmp_path / "o"), "group",
                 "--task", "objects"]) == 2
    assert "holds no participant-level results: run the participant level first" in \
        capsys.readouterr().err


# ------------------------------------------------------------------------ dask
def test_participants_run_on_a_local_dask_cluster(eeg_study, tmp_path):
    distributed = pytest.importorskip("distributed")
    import joblib
    import mne

    kw = dict(task="objects", features=["category"], tmin=0.0, tmax=0.3,
              participant_label=["01", "02", "03"], figures=False, **FAST)
    alone = bids.bids_participant(eeg_study, tmp_path / "alone", **kw)
    level = mne.utils.logger.level
    # two threads: with one, joblib sees a single worker and runs the jobs in this thread
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        with distributed.get_task_stream(client) as stream:
            with joblib.parallel_config(backend="dask"):
                report = bids.bids_participant(eeg_study, tmp_path / "dask", n_jobs=2, **kw)
    assert list(report.status) == ["done"] * 3 and stream.data
    # MNE's log level as it was: participants read in threads must not leave it changed
    assert mne.utils.logger.level == level
    read = __import__("mlem_neuro").read_result
    for a, b in zip(alone.result, report.result):
        np.testing.assert_allclose(read(a).importance, read(b).importance)



def test_eeg_recording_without_events_is_named_and_the_others_run(tmp_path):
    root = _eeg_study(tmp_path / "study", effect=1.0, n_subjects=2, seed=5)["bids_root"]
    events = root / "sub-02" / "eeg" / "sub-02_task-objects_events.tsv"
    events.unlink()
    with pytest.warns(UserWarning, match="1 of 2 participant"):
        report = bids.bids_participant(root, tmp_path / "out", task="objects",
                                       features=["category"], tmin=0.0, tmax=0.3,
                                       figures=False, **FAST)
    assert list(report.status) == ["done", "failed"]
    assert report.message[1] == (
        "FileNotFoundError: no events.tsv for the recording "
        f"{root / 'sub-02' / 'eeg' / 'sub-02_task-objects_eeg.vhdr'}: expected {events}; "
        "the epochs are cut around its onsets.")


# ------------------------------------------------------------------------- MEG
def test_meg_participant_then_group_finds_the_encoded_feature(tmp_path):
    """MEG (magnetometers and gradiometers, FIF written by mne-bids) runs through the
    same path as EEG: the encoded feature is found at the group level, the other not."""
    root = simulate_bids_study(tmp_path / "meg", "meg", n_subjects=6, n_trials=40,
                               effect=1.0, random_state=2)["bids_root"]
    assert bids.bids_inputs(root, "01", "objects").datatype == "meg"
    out = tmp_path / "mlem"
    report = bids.run_bids(root, out, "participant", task="objects",
                           features=["category", "size"], tmin=-0.1, tmax=0.4,
                           figures=False, **FAST)
    assert list(report.status) == ["done"] * 6
    res = __import__("mlem_neuro").read_result(
        out / "sub-01" / "meg" / "sub-01_task-objects_desc-mlem_result.npz")
    assert res.settings["bids"]["recordings"] == ["sub-01/meg/sub-01_task-objects_meg.fif"]
    assert res.settings["n_epochs"] == 40
    tests = bids.run_bids(root, out, "group", task="objects", n_null=200, figures=False)
    found = tests["category"].significant(0.05)
    assert found, tests["category"].to_data_frame()
    assert any(res.times[c].min() <= 0.2 <= res.times[c].max() for c in found)
    assert not tests["size"].significant(0.05)


# ---------------------------------------------------- items, partitions, groups
def _add_items(events_files):
    """Give each trial an ``item`` (a category and size, and a number: items of equal
    size within each run) and a ``half`` (its occurrence's parity: each item has as many
    trials in both halves)."""
    for path in events_files:
        table = pd.read_csv(path, sep="\t")
        j = table.groupby(["category", "size"]).cumcount()
        per_item = 4 if len(table) % 16 == 0 else 1
        table["item"] = (table["category"] + "-" + table["size"] + "-"
                         + (j // per_item).astype(str))
        table["half"] = j % 2
        table.to_csv(path, sep="\t", index=False, na_rep="n/a")


@pytest.fixture(scope="module")
def eeg_items(tmp_path_factory):
    """Two EEG participants of 48 trials: 12 items of 4 trials, 2 in each half."""
    pytest.importorskip("pybv")
    root = simulate_bids_study(tmp_path_factory.mktemp("items") / "study", "eeg",
                               n_subjects=2, n_trials=48, effect=1.0,
                               random_state=4)["bids_root"]
    _add_items(sorted(root.glob("sub-*/eeg/*_events.tsv")))
    return root


def _eeg_run(root, out, **kw):
    kw = {"features": ["category", "size"], "tmin": 0.0, "tmax": 0.3, **FAST, **kw}
    return bids.bids_participant(root, out, task="objects", figures=False, **kw)


def test_eeg_items_average_the_trials_of_an_item(eeg_items, tmp_path):
    read = __import__("mlem_neuro").read_result
    report = _eeg_run(eeg_items, tmp_path / "items", items="item")
    assert list(report.status) == ["done"] * 2
    res = read(report.result[0])
    n_trials = len(pd.read_csv(next(eeg_items.glob("sub-01/eeg/*_events.tsv")), sep="\t"))
    assert res.settings["n_items"] == 12 < n_trials == 48
    assert res.settings["n_items"] == len(res.settings["item_labels"])
    assert sum(res.settings["trials_per_item"]) == n_trials
    assert res.feature_names == ["category", "size"]          # the item is no feature
    desc = json.loads((tmp_path / "items" / "dataset_description.json").read_text())
    assert desc["MLEMSettings"]["task-objects"]["items"] == "item"
    # groups: an events column whose trials stay in one fold
    report = _eeg_run(eeg_items, tmp_path / "groups", groups="half")
    assert list(report.status) == ["done"] * 2
    assert read(report.result[0]).settings["n_groups"] == 2


@pytest.mark.parametrize("distance", ["cv_euclidean", "crossnobis"])
def test_eeg_crossvalidated_distances_over_partitions(eeg_items, tmp_path, distance):
    report = _eeg_run(eeg_items, tmp_path / "cv", items="item", partitions="half",
                      distance=distance)
    assert list(report.status) == ["done"] * 2, report.message
    res = __import__("mlem_neuro").read_result(report.result[0])
    assert res.settings["distance"] == distance and res.settings["partitions"] == "half"
    assert res.settings["n_partitions"] == 2 and np.isfinite(res.score).all()


def test_cli_items_distance_partitions(eeg_items, tmp_path, capsys):
    out = tmp_path / "cli"
    args = ["bids", str(eeg_items), str(out), "participant", "--task", "objects",
            "--features", "category,size", "--tmin", "0", "--tmax", "0.3", "--no-figures",
            *FAST_FLAGS]
    assert main([*args, "--items", "item", "--distance", "cv_euclidean",
                 "--partitions", "half"]) == 0
    assert "2 done, 0 skipped, 0 failed" in capsys.readouterr().out
    settings = json.loads((out / "dataset_description.json").read_text())[
        "MLEMSettings"]["task-objects"]
    assert (settings["items"], settings["partitions"]) == ("item", "half")
    assert settings["options"]["distance"] == "cv_euclidean"
    # a column that is not in the events: each participant fails, its file named
    assert main([*args, "--items", "item", "--distance", "cv_euclidean", "--partitions",
                 "block", "--overwrite"]) == 1
    err = capsys.readouterr().err
    events = eeg_items / "sub-02" / "eeg" / "sub-02_task-objects_events.tsv"
    assert f"sub-02 failed: ValueError: the partitions column 'block' is not in {events}" \
        in err
    # refused before anything runs
    assert main([*args, "--distance", "crossnobis", "--overwrite"]) == 2
    assert "distance='crossnobis' compares the trials of each item" in \
        capsys.readouterr().err
    # without --features, the items column is not offered as a feature
    assert main(["bids", str(eeg_items), str(tmp_path / "o"), "participant", "--task",
                 "objects", "--items", "item"]) == 2
    err = capsys.readouterr().err
    assert "--features is required" in err and "'item'" not in err.split("can be features")[1]


def test_bad_item_columns_and_combinations_are_refused(eeg_items, small_fmri, tmp_path):
    with pytest.warns(UserWarning, match="2 of 2 participant"):
        report = _eeg_run(eeg_items, tmp_path / "bad", items="word")
    events = eeg_items / "sub-01" / "eeg" / "sub-01_task-objects_events.tsv"
    assert report.message[0].startswith(
        f"ValueError: the items column 'word' is not in {events} (its columns: ")
    for kw, match in [
            (dict(distance="cv_euclidean"), "pass items="),
            (dict(items="item", partitions="half"), "partitions='half' is used by the "
                                                    "cross-validated distances"),
            (dict(groups="half", group_runs=True), "pass one of them"),
            (dict(labels_img="atlas.nii.gz"), r"labels_img: option\(s\) of the fMRI "
                                              r"analysis, but the recordings of this task "
                                              r"are eeg"),
            (dict(space=SPACE, decim=1), "space: option"),
            (dict(distance="euclid"), "distance")]:
        with pytest.raises(ValueError, match=match):
            _eeg_run(eeg_items, tmp_path / "refused", **kw)
    with pytest.raises(TypeError, match="items names a column"):
        _eeg_run(eeg_items, tmp_path / "refused", items=["item"])
    assert not (tmp_path / "refused").exists()
    # fMRI: MEG / EEG options refused; items need model="trial"
    root = small_fmri["bids_root"]
    with pytest.raises(ValueError, match=r"tmin, picks: option\(s\) of the MEG / EEG"):
        _roi(small_fmri, tmp_path / "f", tmin=0.0, picks=["x"])
    with pytest.raises(ValueError, match="they need model='trial'"):
        bids.bids_participant(root, tmp_path / "f", task="objects", features=["category"],
                              space=SPACE, model="condition", items="item")


def test_fmri_items_with_cv_euclidean_over_runs(small_fmri, tmp_path):
    """fMRI: each item has one trial per run; the cross-validated distance takes the runs
    as its partitions (as the searchlight command does)."""
    _add_items(sorted(small_fmri["bids_root"].glob("sub-*/func/*_events.tsv")))
    report = _roi(small_fmri, tmp_path / "roi", features=["category", "size"],
                  items="item", distance="cv_euclidean", participant_label="01")
    assert list(report.status) == ["done"], report.message
    res = __import__("mlem_neuro").read_result(report.result[0])
    assert res.settings["n_items"] == 12 and set(res.settings["trials_per_item"]) == {2}
    assert res.settings["distance"] == "cv_euclidean"
    assert res.settings["n_partitions"] == 2
