"""The README's usage example runs as written, and the demo command works."""
import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_readme_usage_example_runs(capsys):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    namespace = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    est, imp = namespace["est"], namespace["imp"]
    assert est.W_.shape == (6, 6)
    assert np.linalg.norm(est.W_) == pytest.approx(1.0)
    assert len(imp) == 21                      # 6 features + 15 interactions
    assert namespace["est"].score(namespace["X"][100:], namespace["y"][100:]) > 0.3


def test_simulation_table_compares_models():
    from mlem_neuro.cli import _simulation_figure, _simulation_table

    lines = []
    table = _simulation_table(40, 3, 20, noise_levels=(0.1, 1.0), seeds=(0, 1),
                              log=lines.append)
    assert list(table["model"]) == ["MLEM", "FR-RSA-I"] * 4
    assert list(table["seed"]) == [0, 0, 1, 1] * 2
    assert table["frobenius_error"].between(0, 2).all()
    assert (table["steps"] >= 1).all() and len(lines) == 5
    assert "(2 seeds)" in lines[0] and lines[-1].endswith("of 4")
    # low noise predicts held-out distances better than high noise
    by_noise = table.groupby("noise")["test_spearman"].mean()
    assert by_noise[0.1] > by_noise[1.0]
    assert len(_simulation_figure(table).axes) == 3


@pytest.mark.parametrize("argv, message", [
    (["epochs", "missing-epo.fif", "--out", "x"], "epochs file not found"),
    (["searchlight", "--imgs", "nope.nii", "--events", "e.tsv", "--mask", "m.nii",
      "--t-r", "2", "--out", "x"], "image not found"),
])
def test_cli_bad_paths_give_one_line_errors(argv, message, capsys):
    from mlem_neuro.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_cli_bad_options_exit_nonzero(capsys):
    from mlem_neuro.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["epochs", "f-epo.fif", "--out", "x", "--n-permutations", "0"])
    assert exc.value.code != 0
    with pytest.raises(SystemExit) as exc:
        main(["demo", "--bogus"])
    assert exc.value.code != 0


def _readme_blocks():
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def test_readme_epochs_example_runs(tmp_path, monkeypatch):
    """The README's MEG/EEG/ECoG block runs as written, given the inputs it names."""
    import mne
    import pandas as pd

    import mlem_neuro
    from mlem_neuro.simulation import simulate_epochs

    def subject(seed):
        data, meta, times = simulate_epochs(
            n_trials=40, n_channels=6, n_times=8, sfreq=20.0, tmin=-0.1,
            windows={"word_class": (0.0, 0.15), "number": (0.1, 0.25)}, random_state=seed)
        info = mne.create_info([f"EEG{k}" for k in range(6)], 20.0, "eeg")
        return mne.EpochsArray(data * 1e-6, info, tmin=times[0], metadata=meta,
                               verbose=False), data, meta

    epochs, data, features = subject(0)
    results = [mlem_neuro.mlem_epochs(subject(s)[0], features=["word_class", "number"],
                                      cv=2, n_permutations=1, max_steps=30, random_state=s)
               for s in range(1, 4)]
    block = next(b for b in _readme_blocks() if "mlem_epochs" in b)
    monkeypatch.chdir(tmp_path)
    namespace = dict(epochs=epochs, results_per_subject=results, data=data,
                     features=features)
    exec(compile(block, "README.md", "exec"), namespace)
    assert set(namespace["res"].terms) == {"word_class", "number", "word_class:number"}
    assert (tmp_path / "sub-01_mlem.npz").exists()
    assert namespace["stats"].term == "number"
    assert namespace["res_ecog"].importance.shape == (8, 3)


HAXBY = ROOT.parent / "shared" / "data" / "haxby2001_sub001_25mm" / "sub001"


@pytest.mark.skipif(not HAXBY.exists(), reason="shared Haxby data absent")
@pytest.mark.filterwarnings("ignore:every held-out pair")   # 32 images in 5 folds: small
def test_readme_fmri_example_runs(tmp_path, monkeypatch):
    """The README's fMRI block runs as written on four Haxby runs."""
    import nibabel as nib
    import pandas as pd

    runs = (1, 2, 3, 4)
    bold_runs = [str(HAXBY / f"BOLD/task001_run{r:03d}/bold_25mm.nii.gz") for r in runs]
    events_tables = []
    for r in runs:
        ev = pd.read_csv(HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv", sep="\t")
        ev["category"] = ev["trial_type"]
        ev["animacy"] = ev["trial_type"].isin(["face", "cat"]).map({True: "animate",
                                                                   False: "inanimate"})
        events_tables.append(ev)
    mask = str(HAXBY / "masks/25mm/gray.nii.gz")                # 28 voxels
    mask_img = nib.load(mask)
    inside = np.argwhere(mask_img.get_fdata() > 0)
    labels = np.zeros(mask_img.shape)
    half = len(inside) // 2
    labels[tuple(inside[:half].T)], labels[tuple(inside[half:].T)] = 1, 2
    labels_img = nib.Nifti1Image(labels, mask_img.affine)
    block = next(b for b in _readme_blocks() if "mlem_searchlight" in b)
    monkeypatch.chdir(tmp_path)
    namespace = dict(mlem_neuro=__import__("mlem_neuro"), bold_runs=bold_runs,
                     events_tables=events_tables, mask=mask, labels_img=labels_img)
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["res"].terms == ["category", "animacy", "category:animacy"]
    assert nib.load(tmp_path / "importance.nii.gz").shape[-1] == 3
    assert len(namespace["roi"].importance) == 2               # one model per region
