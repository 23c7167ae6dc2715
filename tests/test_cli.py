"""The ``mlem-neuro`` command line end to end: epochs files and fMRI runs in, result files
out that read back with :func:`mlem_neuro.read_result`.  Most tests call
``mlem_neuro.cli.main`` in-process; one runs the console script and ``python -m``."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.cli import main
from mlem_neuro.results import BrainMapResult, TimeCourseResult
from mlem_neuro.results.brainmap import nifti_terms

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
HAXBY = DATA / "haxby2001_sub001_25mm" / "sub001"
needs_haxby = pytest.mark.skipif(not HAXBY.exists(), reason="shared Haxby data absent")


@pytest.fixture(scope="module")
def epochs_file(tmp_path_factory):
    """60 simulated trials at 25 Hz, -0.2..0.64 s: feature A encoded 0.1-0.3 s, B 0.4-0.6 s,
    C never; the features are the epochs' metadata."""
    import mne

    from mlem_neuro.simulation import simulate_epochs

    data, features, times = simulate_epochs(n_trials=60, n_channels=8, n_times=22,
                                            sfreq=25.0, random_state=0)
    info = mne.create_info([f"EEG{k:02d}" for k in range(8)], 25.0, "eeg")
    epochs = mne.EpochsArray(data * 1e-6, info, tmin=times[0], metadata=features,
                             verbose="ERROR")
    fname = tmp_path_factory.mktemp("epochs") / "sim-epo.fif"
    epochs.save(fname, verbose="ERROR")
    return fname


def _one_line_error(capsys, *parts):
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("mlem-neuro ") and ": error: " in err
    for part in parts:
        assert part in err
    return err


# ------------------------------------------------------------------------- epochs
def test_epochs_end_to_end(epochs_file, tmp_path, capsys):
    out = tmp_path / "out"
    # seeded: the peaks asserted below were measured with seeded folds (the command, as
    # the API, is unseeded by default)
    assert main(["epochs", str(epochs_file), "--features", "A,B", "--tmin", "-0.1",
                 "--cv", "2", "--n-repeats", "1", "--n-permutations", "1",
                 "--random-state", "0", "--out", str(out)]) == 0
    assert "Wrote" in capsys.readouterr().out
    for name in ("mlem.npz", "importance.csv", "importance.png"):
        assert (out / name).stat().st_size > 0
    res = mlem_neuro.read_result(out / "mlem.npz")
    assert isinstance(res, TimeCourseResult)
    assert res.terms == ["A", "B"]             # feature level (the default)
    # --tmin -0.1 keeps the samples from -0.08 s (25 Hz) to the end (0.64 s)
    np.testing.assert_allclose(res.times, -0.08 + np.arange(19) / 25.0, atol=1e-9)
    assert res.importance.shape == (19, 2) and res.n_folds == 2
    assert np.isfinite(res.importance).all() and np.isfinite(res.score).all()
    assert res.settings["n_permutations"] == 1 and res.settings["constraint"] == "spd"
    # the encoding windows come out where they were simulated (measured over simulation
    # seeds 0-5: A peaks at 0.16-0.20 s, B at 0.48-0.52 s; window means 0.08-0.43 vs
    # |baseline| <= 0.03)
    t, (imp_a, imp_b) = res.times, res.importance[:, :2].T
    assert 0.1 <= t[np.argmax(imp_a)] <= 0.3 and 0.4 <= t[np.argmax(imp_b)] <= 0.6
    assert imp_a[(t >= 0.1) & (t <= 0.3)].mean() > 0.05 > abs(imp_a[t < 0.05].mean())
    frame = pd.read_csv(out / "importance.csv")
    assert len(frame) == 19 * 2 and set(frame["term"]) == {"A", "B"}
    np.testing.assert_allclose(
        frame.query("term == 'A'")["importance"].to_numpy(), imp_a, rtol=1e-6)


def test_epochs_metadata_features_and_options(epochs_file, tmp_path):
    """Every metadata column named; the analysis options reach the result."""
    out = tmp_path / "out"
    assert main(["epochs", str(epochs_file), "--features", "A,B,C", "--tmin", "0.1",
                 "--tmax", "0.3", "--cv", "0", "--no-interactions", "--constraint",
                 "diagonal", "--n-permutations", "2", "--seed", "3", "--window", "0.08",
                 "--out", str(out)]) == 0
    res = mlem_neuro.read_result(out / "mlem.npz")
    assert res.terms == ["A", "B", "C"]
    np.testing.assert_allclose(res.times, [0.12, 0.16, 0.2, 0.24, 0.28], atol=1e-9)
    assert res.n_folds == 1
    assert np.isfinite(res.importance).all()
    assert res.settings["constraint"] == "diagonal" and res.settings["cv"] is None
    assert res.settings["random_state"] == 3 and res.settings["window"] == 0.08
    assert np.allclose(res.weights[..., 0, 1], 0)          # diagonal W


def test_epochs_bad_input_gives_one_line_errors(epochs_file, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["epochs", str(epochs_file), "--features", "A,Z", "--out", out]) == 2
    _one_line_error(capsys, "unknown feature column", "'Z'")
    assert main(["epochs", str(epochs_file), "--features", "A", "--tmin", "5",
                 "--out", out]) == 2
    _one_line_error(capsys, "no time sample")
    assert main(["epochs", str(epochs_file), "--features", "A", "--window", "-1",
                 "--out", out]) == 2
    _one_line_error(capsys, "window must be a positive number")
    not_fif = tmp_path / "notes-epo.fif"
    not_fif.write_text("not an epochs file")
    assert main(["epochs", str(not_fif), "--out", out]) == 2
    assert "PosixPath" not in _one_line_error(capsys, str(not_fif))
    assert not Path(out).exists()


# ---------------------------------------------------------------------- searchlight
def _haxby_args(runs, out, mask="gray"):
    imgs = [str(HAXBY / f"BOLD/task001_run{r:03d}/bold_25mm.nii.gz") for r in runs]
    events = [str(HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv") for r in runs]
    return ["searchlight", "--imgs", *imgs, "--events", *events,
            "--mask", str(HAXBY / f"masks/25mm/{mask}.nii.gz"), "--t-r", "2.5",
            "--out", str(out)]


@needs_haxby
def test_searchlight_haxby_end_to_end(tmp_path, capsys):
    """4 runs (32 block betas), the 28-voxel gray-matter mask, folds over runs, and a
    derived feature added to the events files."""
    events = []
    for r in range(1, 5):
        ev = pd.read_csv(HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv", sep="\t")
        ev["animacy"] = np.where(ev["trial_type"].isin(["face", "cat"]), "animate",
                                 "inanimate")
        events.append(tmp_path / f"run{r}_events.tsv")
        ev.to_csv(events[-1], sep="\t", index=False)
    argv = _haxby_args(range(1, 5), tmp_path / "out")
    argv[argv.index("--events") + 1:argv.index("--mask")] = [str(p) for p in events]
    argv += ["--features", "trial_type,animacy", "--radius", "30", "--cv", "2", "--n-repeats", "1",
             "--group-runs", "--n-permutations", "1"]
    assert main(argv) == 0
    assert "importance.png" in capsys.readouterr().out
    out = tmp_path / "out"
    for name in ("mlem.npz", "importance.nii.gz", "score.nii.gz", "importance.csv",
                 "importance.png"):
        assert (out / name).stat().st_size > 0

    res = mlem_neuro.read_result(out / "mlem.npz")
    gray = nib.load(HAXBY / "masks/25mm/gray.nii.gz").get_fdata() > 0
    assert isinstance(res, BrainMapResult) and res.kind == "searchlight"
    assert res.terms == ["trial_type", "animacy"]
    assert res.n_models == gray.sum() == 28
    assert res.importance.shape == (28, 2) and res.n_folds == 2
    assert np.isfinite(res.importance).all() and np.all(np.abs(res.score) <= 1)
    assert res.settings["n_images"] == 32 and res.settings["radius"] == 30.0
    assert res.settings["cv"] == "GroupKFold(2) over runs"
    assert res.settings["standardize"] == "run"          # the default for trial betas
    score = nib.load(out / "score.nii.gz")
    np.testing.assert_allclose(score.get_fdata(), res.score_img.get_fdata(), rtol=1e-6)
    np.testing.assert_array_equal(score.affine, res.affine)

    img = nib.load(out / "importance.nii.gz")
    assert img.shape == (6, 10, 10, 2) and nifti_terms(img) == res.terms
    vol = img.get_fdata()
    assert np.isfinite(vol).all() and (vol[~gray] == 0).all()
    np.testing.assert_allclose(vol[..., 1], res.importance_img("animacy").get_fdata(),
                               rtol=1e-6)
    frame = pd.read_csv(out / "importance.csv")
    assert len(frame) == 28 * 2 and set(frame["term"]) == set(res.terms)


@needs_haxby
def test_searchlight_group_runs_folds_hold_whole_runs(monkeypatch, tmp_path):
    """--group-runs passes the run of each trial as ``groups`` (the analysis makes the
    GroupKFold folds): no run is split between training and test."""
    import mlem_neuro.searchlight

    seen = {}
    real = mlem_neuro.searchlight.mlem_searchlight

    def spy(imgs, table, *args, **kwargs):
        seen["runs"] = table.index.get_level_values("run").to_numpy()
        seen["groups"], seen["cv"] = kwargs["groups"], kwargs["cv"]
        return real(imgs, table, *args, **kwargs)

    monkeypatch.setattr(mlem_neuro.searchlight, "mlem_searchlight", spy)
    argv = _haxby_args(range(1, 5), tmp_path / "out", mask="vt") + [
        "--features", "trial_type", "--cv", "2", "--n-repeats", "1", "--group-runs",
        "--n-permutations", "1",
        "--radius", "30"]
    assert main(argv) == 0
    assert seen["cv"] == 2
    np.testing.assert_array_equal(seen["groups"], seen["runs"])
    res = mlem_neuro.read_result(tmp_path / "out" / "mlem.npz")
    assert res.settings["groups"] == "run" and res.settings["cv"] == "GroupKFold(2) over runs"
    tests = [np.asarray(te) for te in res.settings["fold_test_indices"]]
    assert len(tests) == 2
    for test in tests:
        train = np.setdiff1d(np.arange(len(seen["runs"])), test)
        assert len(set(seen["runs"][test])) == 2                  # two whole runs held out
        assert not set(seen["runs"][train]) & set(seen["runs"][test])


@needs_haxby
def test_searchlight_group_runs_flat_test_folds(tmp_path, capsys):
    """Holding out one Haxby run leaves one block per category: every held-out pair differs
    in category, so the category term cannot be scored there.  Alone it is an error; next
    to a feature that still varies (animacy), a warning."""
    argv = _haxby_args(range(1, 4), tmp_path / "out", mask="vt") + [
        "--cv", "3", "--n-repeats", "1", "--group-runs", "--n-permutations", "1", "--radius", "30"]
    assert main(argv + ["--features", "trial_type"]) == 2
    _one_line_error(capsys, "fold 1 has the same distance on every feature (['trial_type'])",
                    "With --group-runs every fold holds out whole runs: lower --cv")
    events = []
    for r in range(1, 4):
        ev = pd.read_csv(HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv", sep="\t")
        ev["animacy"] = ev["trial_type"].isin(["face", "cat"])
        events.append(str(tmp_path / f"run{r}_events.tsv"))
        ev.to_csv(events[-1], sep="\t", index=False)
    argv[argv.index("--events") + 1:argv.index("--mask")] = events
    with pytest.warns(UserWarning, match=r"same distance on \['trial_type'\].*own value "
                      r"of \['trial_type'\].*leave-one-run-out.*grouped k-fold"):
        assert main(argv + ["--features", "trial_type,animacy"]) == 0
    res = mlem_neuro.read_result(tmp_path / "out" / "mlem.npz")
    assert res.n_folds == 3 and not res.importance[:, 0].any()
    # the figure leaves out the map that is 0 everywhere, and says so
    assert "importance.png leaves out ['trial_type']" in capsys.readouterr().err


@needs_haxby
def test_searchlight_bad_options(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_haxby_args([1, 2], out) + ["--cv", "3", "--n-repeats", "1", "--group-runs"]) == 2
    _one_line_error(capsys, "--group-runs with --cv 3 needs at least 3 runs; got 2")
    assert main(_haxby_args([1, 2], out) + ["--cv", "0", "--group-runs"]) == 2
    _one_line_error(capsys, "--group-runs needs cross-validation")
    assert main(_haxby_args([1, 2], out) + ["--model", "condition", "--group-runs"]) == 2
    _one_line_error(capsys, "--group-runs needs --model trial")
    assert main(_haxby_args([1, 2], out) + ["--model", "condition",
                                            "--standardize", "run"]) == 2
    _one_line_error(capsys, "--standardize run needs --model trial")
    assert main(_haxby_args([1, 2], out) + ["--features", "colour"]) == 2
    _one_line_error(capsys, "['colour']", "not feature columns")
    argv = _haxby_args([1, 2], out)
    assert main(argv[:argv.index("--events") + 2] + argv[argv.index("--mask"):]) == 2
    _one_line_error(capsys, "one events file per run: 2 images, 1 events files")
    assert not out.exists()


def test_searchlight_non_nifti_input(tmp_path, capsys):
    text = tmp_path / "run1_bold.nii.gz"
    text.write_text("not an image")
    events = tmp_path / "run1_events.tsv"
    pd.DataFrame({"onset": [0.0, 10.0], "duration": 2.0,
                  "trial_type": ["a", "b"]}).to_csv(events, sep="\t", index=False)
    assert main(["searchlight", "--imgs", str(text), "--events", str(events), "--mask",
                 str(text), "--t-r", "2", "--features", "trial_type",
                 "--out", str(tmp_path / "out")]) == 2
    _one_line_error(capsys, "NIfTI")


# ------------------------------------------------------------------ console script
def test_console_script_and_python_m(epochs_file, tmp_path):
    """The installed ``mlem-neuro`` entry point and ``python -m mlem_neuro`` run the same
    main (one full epochs analysis through ``python -m``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "mlem_neuro", "epochs", str(epochs_file), "--features", "A",
         "--tmin", "0.0", "--tmax", "0.4", "--cv", "2", "--n-repeats", "1", "--n-permutations",
         "1", "--out",
         str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Wrote" in proc.stdout
    res = mlem_neuro.read_result(out / "mlem.npz")
    assert res.terms == ["A"] and res.importance.shape == (11, 1)
    assert np.isfinite(res.importance).all()

    script = shutil.which("mlem-neuro", path=os.path.dirname(sys.executable))
    if script is None:
        pytest.skip("mlem-neuro console script not installed next to this Python")
    proc = subprocess.run([script, "--help"], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0 and "searchlight" in proc.stdout
    proc = subprocess.run([script, "epochs", str(tmp_path / "missing-epo.fif"), "--out",
                           str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"mlem-neuro epochs: error: epochs file not found: "
                                   f"{tmp_path / 'missing-epo.fif'}")


# ------------------------------------------------------------------ --out, --overwrite
@pytest.fixture(scope="module")
def rich_epochs_file(tmp_path_factory):
    """48 simulated trials with metadata A, B (features), word (one string per trial),
    trial (a permutation of 0..47) and run (4 runs of 12 trials)."""
    import mne

    from mlem_neuro.simulation import simulate_epochs

    data, meta, times = simulate_epochs(n_trials=48, n_channels=6, n_times=10, sfreq=25.0,
                                        windows={"A": (0.0, 0.1), "B": (0.1, 0.2)},
                                        random_state=1)
    meta["word"] = [f"word{k:02d}" for k in range(48)]
    meta["trial"] = np.random.default_rng(0).permutation(48)
    meta["run"] = np.repeat([1, 2, 3, 4], 12)
    info = mne.create_info([f"EEG{k:02d}" for k in range(3)] + ["MEG1", "MEG2", "MEG3"],
                           25.0, ["eeg"] * 3 + ["mag"] * 3)
    epochs = mne.EpochsArray(data * 1e-6, info, tmin=times[0], metadata=meta,
                             verbose="ERROR")
    fname = tmp_path_factory.mktemp("rich") / "rich-epo.fif"
    epochs.save(fname, verbose="ERROR")
    return fname


FAST = ["--cv", "0", "--n-permutations", "1", "--no-interactions"]


def _never_called(*args, **kwargs):
    raise AssertionError("called although --out was refused")


def _old_results(out):
    out.mkdir()
    (out / "mlem.npz").write_bytes(b"old result")
    (out / "importance.csv").write_text("old table")
    return {p.name: p.read_bytes() for p in out.iterdir()}


def test_out_holding_results_is_refused_before_any_work(epochs_file, tmp_path, capsys,
                                                        monkeypatch):
    import mne

    import mlem_neuro.fmri
    import mlem_neuro.searchlight
    import mlem_neuro.time_resolved

    for module, name in ((mlem_neuro.time_resolved, "mlem_epochs"), (mne, "read_epochs"),
                         (mlem_neuro.fmri, "trial_images"),
                         (mlem_neuro.searchlight, "mlem_searchlight")):
        monkeypatch.setattr(module, name, _never_called)
    out = tmp_path / "out"
    before = _old_results(out)
    assert main(["epochs", str(epochs_file), "--out", str(out)]) == 2
    _one_line_error(capsys, f"--out {out} already holds results (importance.csv, mlem.npz)",
                    "pass --overwrite")
    fake = tmp_path / "run1.nii.gz"
    fake.write_bytes(b"")
    assert main(["searchlight", "--imgs", str(fake), "--events", str(fake), "--mask",
                 str(fake), "--t-r", "2", "--out", str(out)]) == 2
    _one_line_error(capsys, "already holds results", "pass --overwrite")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # any importance.* file counts as a result; other files do not
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    (other / "importance.nii.gz").write_bytes(b"x")
    assert main(["epochs", str(epochs_file), "--out", str(other)]) == 2
    _one_line_error(capsys, "(importance.nii.gz)")


def test_out_must_be_a_writable_folder(epochs_file, tmp_path, capsys, monkeypatch):
    import mlem_neuro.cli
    import mlem_neuro.time_resolved

    monkeypatch.setattr(mlem_neuro.time_resolved, "mlem_epochs", _never_called)
    afile = tmp_path / "results.txt"
    afile.write_text("a file")
    assert main(["epochs", str(epochs_file), "--out", str(afile)]) == 2
    _one_line_error(capsys, f"--out {afile} is a file, not a folder")
    assert main(["epochs", str(epochs_file), "--out", str(afile / "sub" / "out")]) == 2
    _one_line_error(capsys, f"cannot be created: {afile} is a file")
    # permissions (tests may run as root, for whom every folder is writable)
    monkeypatch.setattr(mlem_neuro.cli.os, "access", lambda path, mode: False)
    assert main(["epochs", str(epochs_file), "--out", str(tmp_path / "new" / "out")]) == 2
    _one_line_error(capsys, "cannot be created: no write permission in", str(tmp_path))
    assert main(["epochs", str(epochs_file), "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, f"--out {tmp_path} is not writable")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.txt"]


def test_overwrite_replaces_results(epochs_file, tmp_path, capsys):
    out = tmp_path / "out"
    _old_results(out)
    argv = ["epochs", str(epochs_file), "--features", "A", "--tmax", "0.0", *FAST,
            "--out", str(out)]
    (out / "score.nii.gz").write_bytes(b"an old searchlight's map")
    (out / "notes.txt").write_text("the user's own file")
    assert main(argv) == 2
    assert (out / "mlem.npz").read_bytes() == b"old result"
    bad = ["epochs", str(epochs_file), "--features", "Z", *FAST, "--out", str(out)]
    assert main([*bad, "--overwrite"]) == 2                  # a failed run loses nothing
    assert (out / "score.nii.gz").exists() and (out / "mlem.npz").read_bytes() == b"old result"
    assert main([*argv, "--overwrite"]) == 0
    res = mlem_neuro.read_result(out / "mlem.npz")
    assert res.terms == ["A"] and len(pd.read_csv(out / "importance.csv")) == len(res.times)
    # no temporary file, and no result of the earlier (other) analysis beside the new ones
    assert sorted(p.name for p in out.iterdir()) == ["importance.csv", "importance.png",
                                                     "mlem.npz", "notes.txt"]


def test_demo_out_is_checked_too(tmp_path, capsys, monkeypatch):
    import mlem_neuro.cli

    monkeypatch.setattr(mlem_neuro.cli, "run_demo", _never_called)
    (tmp_path / "report.html").write_text("<html>old</html>")
    assert main(["demo", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "already holds results (report.html)")


# ------------------------------------------------------------------- help, --version
def _subparsers():
    from mlem_neuro.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return parser, action.choices


def test_help_gives_every_option_help_and_its_default():
    parser, commands = _subparsers()
    assert set(commands) == {"demo", "epochs", "searchlight", "bids"}
    for name, sub in commands.items():
        formatter = sub.formatter_class(prog=name)
        for action in sub._actions:
            if action.dest == "help":
                continue
            text = formatter._get_help_string(action)
            assert action.help, (name, action.dest)
            if action.option_strings and not action.required:
                assert "default" in text, (name, action.dest, text)
        rendered = sub.format_help()
        assert ("OUTPUT_DIR" if name == "bids" else "--out") in rendered
        assert "(default: " in rendered
    epochs = commands["epochs"].format_help()
    assert "(default: 2)" in epochs and "(default: spd)" in epochs    # --cv, --constraint
    assert "--picks" in epochs and "--groups COLUMN" in epochs and "--overwrite" in epochs
    assert "--group-runs" in commands["searchlight"].format_help()


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"mlem-neuro {mlem_neuro.__version__}"


def test_cv_must_be_zero_or_at_least_two(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["epochs", "x-epo.fif", "--cv", "1", "--out", "o"])
    assert exc.value.code == 2
    assert ("argument --cv: must be >= 2 folds (or None for no cross-validation; 0 on the "
            "command line); got 1") in capsys.readouterr().err


# ------------------------------------------------------------ --picks, --groups, features
def test_picks_take_channel_names_or_types(rich_epochs_file, tmp_path, capsys):
    for picks, expected in (("EEG00, MEG2", ["EEG00", "MEG2"]),
                            ("mag", ["MEG1", "MEG2", "MEG3"])):
        out = tmp_path / picks.replace(",", "_").replace(" ", "")
        assert main(["epochs", str(rich_epochs_file), "--features", "A", "--picks", picks,
                     "--tmax", "0.0", *FAST, "--out", str(out)]) == 0
        assert mlem_neuro.read_result(out / "mlem.npz").ch_names == expected
    assert main(["epochs", str(rich_epochs_file), "--features", "A", "--picks", "EEG99",
                 *FAST, "--out", str(tmp_path / "bad")]) == 2
    _one_line_error(capsys, "EEG99")
    assert main(["epochs", str(rich_epochs_file), "--picks", " , ", *FAST, "--out",
                 str(tmp_path / "bad")]) == 2
    _one_line_error(capsys, "--picks ' , ' names nothing")
    assert not (tmp_path / "bad").exists()


def test_groups_keep_each_group_in_one_fold(rich_epochs_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["epochs", str(rich_epochs_file), "--features", "A,B", "--groups", "run",
                 "--cv", "2", "--n-repeats", "1", "--n-permutations", "1", "--tmax", "0.0",
                 "--no-interactions",
                 "--out", str(out)]) == 0
    captured = capsys.readouterr()
    res = mlem_neuro.read_result(out / "mlem.npz")
    assert res.terms == ["A", "B"]
    assert res.settings["groups"] == "run" and res.settings["cv"] == "GroupKFold(2) over run"
    runs = np.repeat([1, 2, 3, 4], 12)
    tests = [np.asarray(te) for te in res.settings["fold_test_indices"]]
    assert len(tests) == 2 and sorted(np.concatenate(tests)) == list(range(48))
    for test in tests:
        train = np.setdiff1d(np.arange(48), test)
        assert len(set(runs[test])) == 2 and not set(runs[test]) & set(runs[train])
    assert "held-out, 2-fold cross-validation grouped by run" in captured.out


def test_groups_bad_values(rich_epochs_file, epochs_file, tmp_path, capsys):
    out = str(tmp_path / "out")
    assert main(["epochs", str(rich_epochs_file), "--groups", "run", "--cv", "0",
                 "--out", out]) == 2
    _one_line_error(capsys, "--groups needs cross-validation")
    assert main(["epochs", str(rich_epochs_file), "--groups", "session", "--out", out]) == 2
    _one_line_error(capsys, "--groups 'session' is not a metadata column", "'run'")
    assert main(["epochs", str(rich_epochs_file), "--groups", "run", "--cv", "5", "--n-repeats",
                 "1",
                 "--out", out]) == 2
    _one_line_error(capsys, "--groups run with --cv 5 needs at least 5 distinct values "
                            "of 'run'; it has 4")
    assert not Path(out).exists()


def test_features_tolerate_spaces_and_id_columns_named_are_used(rich_epochs_file, tmp_path,
                                                                  capsys):
    out = tmp_path / "spaces"
    assert main(["epochs", str(rich_epochs_file), "--features", " A , B,", "--tmax", "0.0",
                 *FAST, "--out", str(out)]) == 0
    assert mlem_neuro.read_result(out / "mlem.npz").terms == ["A", "B"]
    assert "note" not in capsys.readouterr().err
    # named explicitly, an ID column is used
    out = tmp_path / "explicit"
    assert main(["epochs", str(rich_epochs_file), "--features", "A,trial", "--tmax", "0.0",
                 *FAST, "--out", str(out)]) == 0
    assert mlem_neuro.read_result(out / "mlem.npz").terms == ["A", "trial"]


def test_epochs_without_features_is_refused_with_the_columns(rich_epochs_file, tmp_path,
                                                             capsys, monkeypatch):
    """No --features: no analysis (every metadata column used to become a feature,
    reaction times, runs and nested labels included); one line lists the columns that can
    be features, those left out and why, and how to name them.  --groups / --items
    columns are not offered."""
    import mlem_neuro.time_resolved

    monkeypatch.setattr(mlem_neuro.time_resolved, "mlem_epochs", _never_called)
    out = tmp_path / "out"
    assert main(["epochs", str(rich_epochs_file), "--tmax", "0.0", *FAST,
                 "--out", str(out)]) == 2
    err = _one_line_error(capsys, "--features is required",
                          "e.g. --features A,B;",
                          "the metadata columns that can be features: ['A', 'B', 'run']",
                          "left out ['word', 'trial']: one distinct value per trial, labels "
                          "or IDs", "name them in --features to use them anyway")
    assert err.startswith("mlem-neuro epochs: error: --features is required")
    assert main(["epochs", str(rich_epochs_file), "--groups", "run", "--cv", "2", "--n-repeats",
                 "1",
                 "--out", str(out)]) == 2
    _one_line_error(capsys, "can be features: ['A', 'B'] (left out ['word', 'trial']")
    assert not out.exists()


def test_epochs_without_features_lists_event_name_tags(tmp_path, capsys):
    """Epochs without metadata: the refusal lists the tags of the '/'-separated event
    names (the features the analysis would read from them)."""
    import mne

    rng = np.random.default_rng(0)
    info = mne.create_info(["EEG00", "EEG01"], 25.0, "eeg")
    events = np.c_[np.arange(8) * 10, np.zeros(8, int), np.tile([1, 2, 3, 4], 2)]
    event_id = {"noun/singular": 1, "noun/plural": 2, "verb/singular": 3,
                "verb/plural": 4}
    epochs = mne.EpochsArray(rng.standard_normal((8, 2, 5)), info, events=events,
                             event_id=event_id, verbose="ERROR")
    fname = tmp_path / "tags-epo.fif"
    epochs.save(fname, verbose="ERROR")
    assert main(["epochs", str(fname), "--out", str(tmp_path / "out")]) == 2
    err = _one_line_error(capsys, "--features is required", "event-name columns")
    from mlem_neuro.adapters.epochs import features_from_events

    tags = list(features_from_events(epochs).columns)
    assert tags and f"can be features: {tags}" in err


def test_no_features_error_lists_candidates_and_left_out_columns():
    """ID columns (one value per row) and constant columns (one value everywhere: no
    distance) are not offered; the message says why, and the example uses the first two
    columns offered."""
    from mlem_neuro.cli import CLIError, _feature_candidates, _no_features_error

    table = pd.DataFrame({"A": ["x", "y"] * 5, "subject": "sub-01", "run": 1,
                          "rt": np.linspace(0.3, 0.9, 10), "empty": np.nan,
                          "word": [f"w{k}" for k in range(10)]})
    assert _feature_candidates(table) == (["A", "rt"], ["word"], ["subject", "run", "empty"])
    assert _feature_candidates(table, exclude=["rt"])[0] == ["A"]
    err = _no_features_error(table, "metadata")
    assert isinstance(err, CLIError)
    assert str(err) == ("--features is required: name the metadata columns to analyse, "
                        "comma-separated, e.g. --features A,rt; the metadata columns that "
                        "can be features: ['A', 'rt'] (left out ['word']: one distinct "
                        "value per trial, labels or IDs; left out ['subject', 'run', "
                        "'empty']: one value in every trial; name them in --features to "
                        "use them anyway)")
    err = str(_no_features_error(table[["A", "rt"]], "events"))
    assert err.endswith("can be features: ['A', 'rt']")           # nothing left out
    err = str(_no_features_error(table[["subject", "word"]], "metadata", row="condition"))
    assert err.startswith("--features is required, and no metadata column can be a "
                          "feature: columns ['subject', 'word'] (left out ['word']: one "
                          "distinct value per condition")


def test_id_columns():
    from mlem_neuro.cli import id_columns

    n = 6
    table = pd.DataFrame({
        "word": [f"w{k}" for k in range(n)],            # strings, one per row: ID
        "trial": [3, 1, 0, 5, 2, 4],                    # permutation of 0..5: ID
        "trial1": np.arange(1, n + 1),                  # 1..6: ID
        "code": [10, 20, 30, 40, 50, 60],               # distinct but not consecutive
        "freq": np.linspace(0, 1, n),                   # numeric feature
        "cat": pd.Categorical([f"c{k}" for k in range(n)]),   # categorical, one per row
        "animal": ["dog", "cat", "dog", "cat", "dog", "cat"],
        "flag": [True, False] * 3,
        "gap": ["a", "b", None, "d", "e", "f"],          # missing values: not an ID
    })
    assert id_columns(table) == ["word", "trial", "trial1", "cat"]
    assert id_columns(table.iloc[:2]) == []              # too few rows to tell


def test_searchlight_features_are_required(capsys):
    """Without --features the events columns (not onset, duration, nor the --items
    column) that can be features are listed, before any GLM; with it, the named columns
    (and the items column, which trial_images keeps) are used."""
    import argparse

    from mlem_neuro.cli import CLIError, _searchlight_features

    events = [pd.DataFrame({"onset": [0.0, 10.0, 20.0], "duration": 2.0,
                            "trial_type": ["a", "b", "a"],
                            "stim_file": [f"img{3 * r + k}.png" for k in range(3)],
                            "rt": [0.5, 0.7, 0.6], "item": ["i1", "i2", "i1"]})
              for r in range(2)]
    args = argparse.Namespace(features=None, model="trial", items=None)
    with pytest.raises(CLIError, match=r"e\.g\. --features trial_type,rt; the events "
                                       r"columns that can be features: \['trial_type', "
                                       r"'rt', 'item'\] \(left out \['stim_file'\]"):
        _searchlight_features(args, events)
    args.items = "item"
    with pytest.raises(CLIError, match=r"can be features: \['trial_type', 'rt'\] "):
        _searchlight_features(args, events)
    args.features = "trial_type , stim_file"
    assert _searchlight_features(args, events) == ["trial_type", "stim_file", "item"]
    args.items = "word"
    with pytest.raises(CLIError, match="--items 'word' is not a column"):
        _searchlight_features(args, events)


# ------------------------------------------------------------ wording, warnings, output
def test_cv0_is_never_called_held_out(epochs_file, tmp_path, capsys, monkeypatch):
    import logging

    from matplotlib.figure import Figure
    from matplotlib.text import Text

    texts, messages = [], []
    real_savefig = Figure.savefig

    def savefig(fig, *args, **kwargs):
        texts.extend(t.get_text() for t in fig.findobj(Text))
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("mlem_neuro")
    logger.addHandler(handler)
    try:
        assert main(["epochs", str(epochs_file), "--features", "A", "--tmax", "0.2",
                     *FAST, "--out", str(tmp_path / "out")]) == 0
    finally:
        logger.removeHandler(handler)
    assert not logger.filters                           # main removed its filter
    captured = capsys.readouterr()
    printed = [captured.out, captured.err, *messages, *texts]
    assert not [p for p in printed if "held-out" in p]
    assert "Spearman rho (in-sample (no cross-validation)): peak" in captured.out
    assert any("in-sample ρ (no cross-validation)" in t for t in texts)   # the score axis
    assert messages                                    # the analysis did log
    frame = pd.read_csv(tmp_path / "out" / "importance.csv")
    assert not [c for c in frame.columns if "held" in c]
    # with cross-validation the same figure says held-out
    texts.clear()
    assert main(["epochs", str(epochs_file), "--features", "A", "--tmax", "0.2", "--cv", "2",
                 "--n-repeats", "1",
                 "--n-permutations", "1", "--out", str(tmp_path / "cv")]) == 0
    assert any("held-out" in t for t in texts)
    assert "held-out, 2-fold cross-validation" in capsys.readouterr().out


def test_warning_format_is_one_line_and_restored(epochs_file, tmp_path, monkeypatch):
    import warnings

    from mlem_neuro.cli import _one_line_warning

    before = warnings.formatwarning
    seen = []

    def spy(*args, **kwargs):                 # the formatter in force during the analysis
        seen.append(warnings.formatwarning)
        raise ValueError("stop here")

    import mlem_neuro.time_resolved

    monkeypatch.setattr(mlem_neuro.time_resolved, "mlem_epochs", spy)
    assert main(["epochs", str(epochs_file), "--features", "A", "--out",
                 str(tmp_path / "o")]) == 2
    assert seen == [_one_line_warning] and warnings.formatwarning is before
    line = _one_line_warning(RuntimeWarning("a\n  long   message"), RuntimeWarning,
                             "/x/cli.py", 3, "res = f()")
    assert line == "mlem-neuro: warning: a long message\n"


def _run_as_user(epochs_file, out, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, "-m", "mlem_neuro", "epochs", str(epochs_file), "--features", "A",
         "--tmax", "0.0", "--n-permutations", "1", "--out", str(out), *extra],
        capture_output=True, env=env, timeout=120)
    stderr = proc.stderr.decode()         # bytes: text mode would turn \r into \n
    assert proc.returncode == 0, stderr
    return stderr


def test_warnings_print_one_line_in_a_real_run(epochs_file, tmp_path):
    """Run as a user does: a warning is one line, without the Python source."""
    stderr = _run_as_user(epochs_file, tmp_path / "out", "--tmin", "-1", "--cv", "0")
    lines = stderr.split("\n")
    warning = [line for line in lines if "warning" in line.lower()]
    assert warning == ["mlem-neuro: warning: [tmin, tmax] = [-1.0, 0.0] s reaches outside "
                       "the data ([-0.2, 0.64] s); using the overlap."]
    assert not [line for line in lines if line.startswith(" ") or "cli.py" in line]


def test_progress_bar_ends_complete(epochs_file, tmp_path):
    """The progress bar's last state is complete: no reset (0/2) bar after the run."""
    stderr = _run_as_user(epochs_file, tmp_path / "out", "--cv", "2", "--n-repeats", "1")
    states = [s for s in re.split(r"[\r\n]", stderr) if "MLEM chunks" in s]
    assert states and "2/2" in states[-1], states[-1]


# -------------------------------------------------------------------- unreadable inputs
def test_unreadable_epochs_files(epochs_file, tmp_path, capsys):
    import mne

    data = Path(epochs_file).read_bytes()
    raw = tmp_path / "rec-raw.fif"
    mne.io.RawArray(np.zeros((2, 100)), mne.create_info(2, 100.0, "eeg"),
                    verbose="ERROR").save(raw, verbose="ERROR")
    cases = {"half-epo.fif": data[: len(data) // 2], "head-epo.fif": data[:200],
             "empty-epo.fif": b"", "text-epo.fif": b"hello"}
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
    (tmp_path / "folder-epo.fif").mkdir()
    for name in [*cases, "folder-epo.fif", raw.name]:
        path = tmp_path / name
        assert main(["epochs", str(path), "--out", str(tmp_path / "out")]) == 2, name
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"mlem-neuro epochs: error: cannot read {path} as MNE "
                              "epochs ("), err
    assert not (tmp_path / "out").exists()


def test_searchlight_truncated_nifti(tmp_path, capsys):
    rng = np.random.default_rng(0)
    bold = tmp_path / "bold.nii.gz"
    nib.Nifti1Image(rng.random((4, 4, 4, 20)).astype("float32"), np.eye(4)).to_filename(bold)
    mask = tmp_path / "mask.nii.gz"
    nib.Nifti1Image(np.ones((4, 4, 4), "uint8"), np.eye(4)).to_filename(mask)
    events = tmp_path / "events.tsv"
    pd.DataFrame({"onset": [0.0, 8.0, 16.0, 24.0], "duration": 2.0,
                  "trial_type": ["a", "b", "a", "b"]}).to_csv(events, sep="\t", index=False)
    for name, source in (("cut_bold.nii.gz", bold), ("cut_mask.nii.gz", mask)):
        data = source.read_bytes()
        (tmp_path / name).write_bytes(data[: len(data) // 2])
    for imgs, msk in ((tmp_path / "cut_bold.nii.gz", mask),
                      (bold, tmp_path / "cut_mask.nii.gz")):
        bad = imgs if "cut" in imgs.name else msk
        assert main(["searchlight", "--imgs", str(imgs), "--events", str(events), "--mask",
                     str(msk), "--t-r", "2", "--features", "trial_type",
                     "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert err.startswith("mlem-neuro searchlight: error: ") and bad.name in err
    assert not (tmp_path / "out").exists()


@needs_haxby
@pytest.mark.parametrize("option, z_scored", [(None, True), ("run", True), ("none", False)])
def test_searchlight_standardize_option(monkeypatch, tmp_path, option, z_scored):
    """Trial betas reach the searchlight z-scored within run unless --standardize none."""
    import mlem_neuro.searchlight

    seen = {}
    real = mlem_neuro.searchlight.mlem_searchlight

    def spy(imgs, table, *args, **kwargs):
        seen["data"] = imgs.get_fdata()
        seen["runs"] = table.index.get_level_values("run").to_numpy()
        return real(imgs, table, *args, **kwargs)

    monkeypatch.setattr(mlem_neuro.searchlight, "mlem_searchlight", spy)
    argv = _haxby_args(range(1, 4), tmp_path / "out", mask="vt") + [
        "--features", "trial_type", "--cv", "2", "--n-repeats", "1", "--n-permutations", "1",
        "--radius", "30"]
    if option is not None:
        argv += ["--standardize", option]
    assert main(argv) == 0
    vt = nib.load(HAXBY / "masks/25mm/vt.nii.gz").get_fdata() > 0
    values = seen["data"][vt][0]
    sd = [values[seen["runs"] == r].std(ddof=1) for r in range(3)]
    assert np.allclose(sd, 1.0, atol=1e-5) == z_scored
    res = mlem_neuro.read_result(tmp_path / "out" / "mlem.npz")
    assert (res.settings.get("standardize") == "run") == z_scored


@needs_haxby
def test_searchlight_cross_validated_distances_across_runs(tmp_path, capsys):
    """--distance cv_euclidean with --items: each category's block betas compared across
    runs (the partitions); crossnobis needs more than one trial per item and run, and both
    need --items (refused before any GLM)."""
    events = []
    for r in range(1, 5):
        ev = pd.read_csv(HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv", sep="\t")
        ev["animacy"] = np.where(ev["trial_type"].isin(["face", "cat"]), "animate",
                                 "inanimate")
        events.append(tmp_path / f"run{r}_events.tsv")
        ev.to_csv(events[-1], sep="\t", index=False)
    argv = _haxby_args(range(1, 5), tmp_path / "out")
    argv[argv.index("--events") + 1:argv.index("--mask")] = [str(p) for p in events]
    argv += ["--features", "animacy", "--items", "trial_type", "--radius", "30", "--cv", "2",
             "--n-repeats", "1",
             "--n-permutations", "1"]
    assert main(argv + ["--distance", "cv_euclidean"]) == 0
    res = mlem_neuro.read_result(tmp_path / "out" / "mlem.npz")
    assert res.settings["distance"] == "cv_euclidean" and res.settings["n_partitions"] == 4
    assert res.settings["n_items"] == 8 and res.terms == ["animacy"]
    capsys.readouterr()
    assert main(argv + ["--distance", "crossnobis", "--overwrite"]) == 2
    assert "single trial" in capsys.readouterr().err
    no_items = [a for a in argv if a not in ("--items", "trial_type")]
    assert main(no_items + ["--distance", "crossnobis", "--out", str(tmp_path / "o2")]) == 2
    assert "pass --items" in capsys.readouterr().err


@pytest.mark.parametrize("n_null, noted", [(9, True), (19, True), (20, False), (99, False)])
def test_tests_summary_says_when_too_few_nulls_to_reach_p_005(n_null, noted, capsys):
    """The summary counts models with FWE-corrected p < 0.05; with n_null <= 19 the
    smallest p-value, 1 / (1 + n_null), is >= 0.05, so the count is 0 whatever the data:
    the summary says so instead of reporting a bare 0."""
    from mlem_neuro.cli import _print_tests

    rng = np.random.default_rng(0)
    p_min = 1.0 / (1 + n_null)
    pvalues = np.full((5, 2), p_min)                 # the strongest possible evidence
    res = BrainMapResult(rng.normal(size=(2, 5, 1)), rng.normal(size=(2, 5)),
                         np.ones((2, 5, 1, 1)), np.ones((2, 5)), ["a"], ["a"],
                         dict(n_null=n_null), affine=np.eye(4), shape=(5, 1, 1),
                         voxel_indices=np.c_[np.arange(5), np.zeros((5, 2), int)],
                         tests=["score", "a"], pvalues=pvalues, pvalues_fwe=pvalues)
    _print_tests(res, "spheres")
    captured = capsys.readouterr()
    assert f"Permutation tests ({n_null} null relabellings)" in captured.out
    note = (f"with --n-null {n_null} the smallest p-value is 1/{n_null + 1} = "
            f"{p_min:.3g}: no model can reach p < 0.05; pass --n-null 20 or more")
    assert (note in captured.err) == noted
    if not noted:
        assert "score 5, a 5 (of 5)" in captured.out


@pytest.fixture(scope="module")
def small_fmri(tmp_path_factory):
    """Two simulated runs on a 6 x 4 x 4 grid of 4 mm voxels (the README's example): 16
    trials per run, 4 categories, a pattern per category in the voxels with x < 12 mm."""
    from nilearn.glm.first_level import compute_regressor

    folder = tmp_path_factory.mktemp("fmri")
    rng = np.random.default_rng(0)
    t_r, n_scans, shape, affine = 2.0, 100, (6, 4, 4), np.diag([4.0, 4.0, 4.0, 1.0])
    categories = ["face", "cat", "house", "chair"]
    patterns = rng.standard_normal((4, *shape))
    patterns[:, 3:] = 0.0
    imgs, events = [], []
    for run in range(2):
        category = rng.permutation(np.repeat(categories, 4))
        bold = rng.standard_normal((*shape, n_scans))
        onsets = 8.0 + 11.0 * np.arange(16)
        for onset, cat in zip(onsets, category):
            response, _ = compute_regressor(([onset], [1.0], [1.0]), "glover",
                                            t_r * np.arange(n_scans))
            bold += 10 * patterns[categories.index(cat)][..., None] * response[:, 0]
        imgs.append(str(folder / f"run{run}_bold.nii.gz"))
        nib.Nifti1Image(bold, affine).to_filename(imgs[-1])
        events.append(str(folder / f"run{run}_events.tsv"))
        pd.DataFrame({"onset": onsets, "duration": 1.0, "category": category}).to_csv(
            events[-1], sep="\t", index=False)
    mask = str(folder / "mask.nii.gz")
    nib.Nifti1Image(np.ones(shape, dtype=np.uint8), affine).to_filename(mask)
    return ["searchlight", "--imgs", *imgs, "--events", *events, "--mask", mask, "--t-r",
            "2"]


@pytest.mark.parametrize("cv, kind", [("0", "in-sample"), ("2", "held-out")])
def test_searchlight_output_lines_say_what_the_score_is(small_fmri, tmp_path, capsys, cv,
                                                        kind):
    """With --cv 0 the score map is in-sample: no printed line calls it held-out."""
    assert main([*small_fmri, "--features", "category", "--cv", cv, "--n-permutations", "1",
                 "--max-steps", "30", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"score.nii.gz ({kind} Spearman rho)" in out
    assert ("held-out" in out) == (kind == "held-out")
    res = mlem_neuro.read_result(tmp_path / "out" / "mlem.npz")
    assert res.score_kind == kind


def test_demo_seed_must_be_non_negative(tmp_path, capsys):
    """A negative --seed is refused by the parser, naming the option, before --out is
    created (numpy's seeds are >= 0)."""
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--seed", "-1", "--out", str(tmp_path / "demo")])
    assert exc.value.code == 2
    assert "argument --random-state/--seed: must be None or an int >= 0; got -1" in \
        capsys.readouterr().err
    assert not (tmp_path / "demo").exists()


def test_searchlight_condition_features_are_required(small_fmri, tmp_path, capsys,
                                                     monkeypatch):
    """--model condition without --features: refused before the GLM, listing the columns
    constant within conditions, but not the condition label (one value per condition
    image: every pair differs) nor a column with one value everywhere; named, a feature
    runs."""
    import mlem_neuro.fmri

    argv = list(small_fmri)
    for k in (argv.index("--events") + 1, argv.index("--events") + 2):
        ev = pd.read_csv(argv[k], sep="\t")
        ev["trial_type"] = ev["category"]
        ev["animacy"] = np.where(ev["category"].isin(["face", "cat"]), "animate", "inanimate")
        ev["subject"] = "sub-01"
        ev["rt"] = np.linspace(0.4, 0.9, len(ev))          # varies within a condition
        argv[k] = str(tmp_path / Path(argv[k]).name)
        ev.drop(columns="category").to_csv(argv[k], sep="\t", index=False)
    base = [*argv, "--model", "condition", "--cv", "0", "--n-permutations", "1",
            "--max-steps", "30", "--out", str(tmp_path / "out")]
    with monkeypatch.context() as patch:
        patch.setattr(mlem_neuro.fmri, "trial_images", _never_called)
        assert main(base) == 2
    _one_line_error(capsys, "--features is required", "e.g. --features animacy;",
                    "the condition table columns that can be features: ['animacy'] (left "
                    "out ['trial_type']: one distinct value per condition, labels or IDs; "
                    "left out ['subject']: one value in every condition")
    assert main([*base, "--features", "animacy"]) == 0
    res = mlem_neuro.read_result(tmp_path / "out" / "mlem.npz")
    assert res.terms == ["animacy"] and res.importance.shape == (96, 1)


def test_comma_separated_events_file_is_named_as_such(tmp_path, capsys):
    """A comma-separated events file read as one column 'onset,duration,...': the error
    said it lacked 'onset' and 'duration'; it now says the file is not tab-separated."""
    from mlem_neuro.cli import CLIError, _read_events

    path = tmp_path / "run1_events.tsv"
    pd.DataFrame({"onset": [0.0, 8.0], "duration": 2.0,
                  "trial_type": ["a", "b"]}).to_csv(path, index=False)
    with pytest.raises(CLIError, match=r"run1_events.tsv holds one column "
                                       r"'onset,duration,trial_type'.*tab-separated"):
        _read_events([path])
    argv = ["searchlight", "--imgs", str(path), "--events", str(path), "--mask", str(path),
            "--t-r", "2", "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    assert _one_line_error(capsys, "comma-separated").endswith(r"(write it with sep='\t')")


def test_too_few_nulls_is_said_once(epochs_file, small_fmri, tmp_path, capsys, recwarn):
    """With --n-null 3 the figure's significance marks warned twice (terms, score) on top
    of the summary's note: three lines for one fact; the note alone remains."""
    assert main(["epochs", str(epochs_file), "--features", "A", "--tmax", "0.1", *FAST,
                 "--n-null", "3", "--max-steps", "20", "--out", str(tmp_path / "out")]) == 0
    assert main([*small_fmri, "--features", "category", "--cv", "2", "--n-repeats", "1",
                 "--n-permutations",
                 "1", "--max-steps", "20", "--n-null", "3", "--out", str(tmp_path / "sl")]) == 0
    assert not [w for w in recwarn if "smallest p-value" in str(w.message)]
    err = capsys.readouterr().err
    assert err.count("note: with --n-null 3 the smallest p-value is 1/4") == 2


def test_feature_groups_and_missing_distance_options(rich_epochs_file, tmp_path, capsys):
    """--feature-groups makes one feature of several columns and --missing-distance sets
    the distance of pairs missing a value; both reach the analysis and its settings."""
    base = ["epochs", str(rich_epochs_file), "--features", "A,trial,run", *FAST]
    assert main(base + ["--feature-groups", "tr = trial + run", "--missing-distance",
                        "A=0.5,tr=1", "--out", str(tmp_path / "grp")]) == 0
    res = mlem_neuro.read_result(tmp_path / "grp" / "mlem.npz")
    assert res.feature_names == ["A", "tr"]
    assert res.settings["feature_groups"] == {"tr": ["trial", "run"]}
    assert res.settings["missing_distance"] == {"A": 0.5, "tr": 1.0}
    assert main(base + ["--missing-distance", "0.25", "--out", str(tmp_path / "one")]) == 0
    one = mlem_neuro.read_result(tmp_path / "one" / "mlem.npz")
    assert one.settings["missing_distance"] == 0.25 and one.feature_names == ["A", "trial",
                                                                                "run"]
    for flag, bad, expect in (("--feature-groups", "tr", "NAME=COLUMN+COLUMN"),
                              ("--feature-groups", "tr=trial+", "NAME=COLUMN+COLUMN"),
                              ("--feature-groups", "g=A,g=run", "given twice"),
                              ("--missing-distance", "A=", "FEATURE=NUMBER"),
                              ("--missing-distance", "far", "FEATURE=NUMBER")):
        with pytest.raises(SystemExit) as exc:
            main(base + [flag, bad, "--out", str(tmp_path / "bad")])
        assert exc.value.code == 2
        assert expect in capsys.readouterr().err
    # a group naming a column that is not a feature: the analysis's own error, one line
    assert main(base + ["--feature-groups", "g=trial+B", "--out", str(tmp_path / "b")]) == 2
    assert "B" in capsys.readouterr().err


def test_feature_kinds_option(rich_epochs_file, tmp_path, capsys):
    """--feature-kinds reaches the analysis: runs coded 1-4 are numeric by default
    (|1 - 4| = 3) and categorical when declared, which changes the fit."""
    base = ["epochs", str(rich_epochs_file), "--features", "A,run", *FAST]
    assert main(base + ["--out", str(tmp_path / "num")]) == 0
    assert main(base + ["--feature-kinds", "run=categorical",
                        "--out", str(tmp_path / "cat")]) == 0
    num = mlem_neuro.read_result(tmp_path / "num" / "mlem.npz")
    cat = mlem_neuro.read_result(tmp_path / "cat" / "mlem.npz")
    assert cat.settings["feature_kinds"] == {"run": "categorical"}
    assert not np.allclose(num.fold_score, cat.fold_score)
    for bad in ("run", "run=nominal", "=categorical"):
        with pytest.raises(SystemExit) as exc:
            main(base + ["--feature-kinds", bad, "--out", str(tmp_path / "bad")])
        assert exc.value.code == 2
        assert "COLUMN=KIND" in capsys.readouterr().err


def test_out_must_name_a_folder_of_its_own(epochs_file, tmp_path, capsys, monkeypatch):
    import mlem_neuro.time_resolved

    monkeypatch.setattr(mlem_neuro.time_resolved, "mlem_epochs", _never_called)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "score.txt").write_text("the user's own file")
    for bad in ("", "  ", "out\n"):
        assert main(["epochs", str(epochs_file), "--features", "A", "--out", bad]) == 2
        _one_line_error(capsys, "is not a folder name", "--out results/")
    for cwd in (".", str(tmp_path)):
        assert main(["epochs", str(epochs_file), "--features", "A", "--out", cwd,
                     "--overwrite"]) == 2
        _one_line_error(capsys, "is the current folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["score.txt"]


def test_interrupted_overwrite_keeps_the_old_set(epochs_file, tmp_path, monkeypatch):
    """Ctrl-C while the new files are written: the old results stay, whole; no hidden
    folder is left behind."""
    import mlem_neuro.cli

    out = tmp_path / "out"
    before = _old_results(out)

    def interrupted(fig, fname):
        raise KeyboardInterrupt

    monkeypatch.setattr(mlem_neuro.cli, "_save_figure", interrupted)
    assert main(["epochs", str(epochs_file), "--features", "A", "--tmax", "0.0", *FAST,
                 "--out", str(out), "--overwrite"]) == 130         # "interrupted"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_the_swap_of_result_sets_holds_ctrl_c_back():
    import os
    import signal
    import threading
    import time

    from mlem_neuro.cli import _deferred_interrupts

    # another thread of the process may be the one the signal is delivered to
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with _deferred_interrupts():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                done.append("renames finished")
    finally:
        stop.set()
        other.join()
    assert done == ["renames finished"]
