"""The ``mlem-neuro`` command line end to end: epochs files and fMRI runs in, result files
out that read back with :func:`mlem_neuro.read_result`.  Most tests call
``mlem_neuro.cli.main`` in-process; one runs the console script and ``python -m``."""
import os
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
    assert main(["epochs", str(epochs_file), "--features", "A,B", "--tmin", "-0.1",
                 "--cv", "2", "--n-permutations", "1", "--out", str(out)]) == 0
    assert "Wrote" in capsys.readouterr().out
    for name in ("mlem.npz", "importance.csv", "importance.png"):
        assert (out / name).stat().st_size > 0
    res = mlem_neuro.read_result(out / "mlem.npz")
    assert isinstance(res, TimeCourseResult)
    assert res.terms == ["A", "B", "A:B"]
    # --tmin -0.1 keeps the samples from -0.08 s (25 Hz) to the end (0.64 s)
    np.testing.assert_allclose(res.times, -0.08 + np.arange(19) / 25.0, atol=1e-9)
    assert res.importance.shape == (19, 3) and res.n_folds == 2
    assert np.isfinite(res.importance).all() and np.isfinite(res.score).all()
    assert res.settings["n_permutations"] == 1 and res.settings["constraint"] == "spd"
    # the encoding windows come out where they were simulated (measured over simulation
    # seeds 0-5: A peaks at 0.16-0.20 s, B at 0.48-0.52 s; window means 0.08-0.43 vs
    # |baseline| <= 0.03)
    t, (imp_a, imp_b) = res.times, res.importance[:, :2].T
    assert 0.1 <= t[np.argmax(imp_a)] <= 0.3 and 0.4 <= t[np.argmax(imp_b)] <= 0.6
    assert imp_a[(t >= 0.1) & (t <= 0.3)].mean() > 0.05 > abs(imp_a[t < 0.05].mean())
    frame = pd.read_csv(out / "importance.csv")
    assert len(frame) == 19 * 3 and set(frame["term"]) == {"A", "B", "A:B"}
    np.testing.assert_allclose(
        frame.query("term == 'A'")["importance"].to_numpy(), imp_a, rtol=1e-6)


def test_epochs_metadata_features_and_options(epochs_file, tmp_path):
    """No --features: every metadata column; the analysis options reach the result."""
    out = tmp_path / "out"
    assert main(["epochs", str(epochs_file), "--tmin", "0.1", "--tmax", "0.3", "--cv", "0",
                 "--no-interactions", "--constraint", "diagonal", "--n-permutations", "2",
                 "--seed", "3", "--window", "0.08", "--out", str(out)]) == 0
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
    assert main(["epochs", str(epochs_file), "--tmin", "5", "--out", out]) == 2
    _one_line_error(capsys, "no time sample")
    assert main(["epochs", str(epochs_file), "--window", "-1", "--out", out]) == 2
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
    argv += ["--features", "trial_type,animacy", "--radius", "30", "--cv", "2",
             "--group-runs", "--n-permutations", "1"]
    assert main(argv) == 0
    assert "importance.png" in capsys.readouterr().out
    out = tmp_path / "out"
    for name in ("mlem.npz", "importance.nii.gz", "importance.csv", "importance.png"):
        assert (out / name).stat().st_size > 0

    res = mlem_neuro.read_result(out / "mlem.npz")
    gray = nib.load(HAXBY / "masks/25mm/gray.nii.gz").get_fdata() > 0
    assert isinstance(res, BrainMapResult) and res.kind == "searchlight"
    assert res.terms == ["trial_type", "animacy", "trial_type:animacy"]
    assert res.n_models == gray.sum() == 28
    assert res.importance.shape == (28, 3) and res.n_folds == 2
    assert np.isfinite(res.importance).all() and np.all(np.abs(res.score) <= 1)
    assert res.settings["n_images"] == 32 and res.settings["radius"] == 30.0
    assert res.settings["cv"] == "GroupKFold(2) over runs"

    img = nib.load(out / "importance.nii.gz")
    assert img.shape == (6, 10, 10, 3) and nifti_terms(img) == res.terms
    vol = img.get_fdata()
    assert np.isfinite(vol).all() and (vol[~gray] == 0).all()
    np.testing.assert_allclose(vol[..., 1], res.importance_img("animacy").get_fdata(),
                               rtol=1e-6)
    frame = pd.read_csv(out / "importance.csv")
    assert len(frame) == 28 * 3 and set(frame["term"]) == set(res.terms)


@needs_haxby
def test_searchlight_group_runs_folds_hold_whole_runs(monkeypatch, tmp_path):
    """--group-runs gives the searchlight folds in which no run is split."""
    import mlem_neuro.searchlight

    seen = {}
    real = mlem_neuro.searchlight.mlem_searchlight

    def spy(imgs, table, *args, **kwargs):
        seen["runs"] = table.index.get_level_values("run").to_numpy()
        seen["cv"] = kwargs["cv"]
        return real(imgs, table, *args, **kwargs)

    monkeypatch.setattr(mlem_neuro.searchlight, "mlem_searchlight", spy)
    argv = _haxby_args(range(1, 5), tmp_path / "out", mask="vt") + [
        "--cv", "2", "--group-runs", "--n-permutations", "1", "--radius", "30"]
    assert main(argv) == 0
    assert len(seen["cv"]) == 2
    for train, test in seen["cv"]:
        assert len(set(seen["runs"][test])) == 2                  # two whole runs held out
        assert not set(seen["runs"][train]) & set(seen["runs"][test])


@needs_haxby
def test_searchlight_group_runs_flat_test_folds(tmp_path, capsys):
    """Holding out one Haxby run leaves one block per category: every held-out pair differs
    in category, so the category term cannot be scored there.  Alone it is an error; next
    to a feature that still varies (animacy), a warning."""
    argv = _haxby_args(range(1, 4), tmp_path / "out", mask="vt") + [
        "--cv", "3", "--group-runs", "--n-permutations", "1", "--radius", "30"]
    assert main(argv) == 2
    _one_line_error(capsys, "fold 1 has the same distance on ['trial_type']",
                    "Use fewer folds")
    events = []
    for r in range(1, 4):
        ev = pd.read_csv(HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv", sep="\t")
        ev["animacy"] = ev["trial_type"].isin(["face", "cat"])
        events.append(str(tmp_path / f"run{r}_events.tsv"))
        ev.to_csv(events[-1], sep="\t", index=False)
    argv[argv.index("--events") + 1:argv.index("--mask")] = events
    with pytest.warns(UserWarning, match=r"same distance on \['trial_type'\]"):
        assert main(argv) == 0
    assert mlem_neuro.read_result(tmp_path / "out" / "mlem.npz").n_folds == 3


@needs_haxby
def test_searchlight_bad_options(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(_haxby_args([1, 2], out) + ["--cv", "3", "--group-runs"]) == 2
    _one_line_error(capsys, "--group-runs with --cv 3 needs at least 3 runs; got 2")
    assert main(_haxby_args([1, 2], out) + ["--cv", "0", "--group-runs"]) == 2
    _one_line_error(capsys, "--group-runs needs cross-validation")
    assert main(_haxby_args([1, 2], out) + ["--model", "condition", "--group-runs"]) == 2
    _one_line_error(capsys, "--group-runs needs --model trial")
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
                 str(text), "--t-r", "2", "--out", str(tmp_path / "out")]) == 2
    _one_line_error(capsys, "NIfTI")


# ------------------------------------------------------------------ console script
def test_console_script_and_python_m(epochs_file, tmp_path):
    """The installed ``mlem-neuro`` entry point and ``python -m mlem_neuro`` run the same
    main (one full epochs analysis through ``python -m``)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "mlem_neuro", "epochs", str(epochs_file), "--features", "A",
         "--tmin", "0.0", "--tmax", "0.4", "--cv", "2", "--n-permutations", "1", "--out",
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
