"""fMRI front door: BOLD runs + events → beta images and feature table (nilearn GLM), and
the Haxby 2001 data end to end through the searchlight."""
from pathlib import Path

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.fmri import trial_images

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
HAXBY = DATA / "haxby2001_sub001_25mm" / "sub001"
AFFINE = np.diag([3.0, 3.0, 3.0, 1.0])
T_R = 2.0



def simulate_runs(n_runs=2, n_scans=120, shape=(3, 3, 2), noise=0.01, seed=0):
    """BOLD = Σ_trials beta_trial(voxel) · HRF-convolved boxcar + baseline + noise."""
    from nilearn.glm.first_level import make_first_level_design_matrix

    rng = np.random.default_rng(seed)
    frame_times = T_R * np.arange(n_scans)
    runs, events, betas = [], [], []
    cond_amp = {"A": rng.normal(1.0, 0.3, shape), "B": rng.normal(-0.5, 0.3, shape)}
    for r in range(n_runs):
        n_trials = 8
        ev = pd.DataFrame({"onset": 10.0 + 26.0 * np.arange(n_trials),
                           "duration": 4.0,
                           "trial_type": ["A", "B"] * (n_trials // 2),
                           "size": rng.integers(1, 4, n_trials).astype(float)})
        ev["shape"] = np.where(ev.trial_type == "A", "round", "square")
        beta = np.stack([cond_amp[c] + rng.normal(0, 0.2, shape) for c in ev.trial_type])
        design = make_first_level_design_matrix(
            frame_times, ev[["onset", "duration"]].assign(trial_type=[f"t{k}" for k in
                                                                      range(n_trials)]),
            hrf_model="glover", drift_model=None)
        X = design[[f"t{k}" for k in range(n_trials)]].to_numpy()      # (scans, trials)
        signal = np.tensordot(X, beta, axes=(1, 0))                     # (scans, *shape)
        data = 100.0 + signal + noise * rng.standard_normal(signal.shape)
        runs.append(nib.Nifti1Image(np.moveaxis(data, 0, -1).astype(np.float32), AFFINE))
        events.append(ev)
        betas.append(beta)
    mask = nib.Nifti1Image(np.ones(shape, np.int8), AFFINE)
    return runs, events, np.concatenate(betas), cond_amp, mask


@pytest.fixture(scope="module")
def sim():
    return simulate_runs()


def test_trial_model_recovers_trial_betas(sim):
    runs, events, betas, _, mask = sim
    imgs, table = trial_images(runs, events, T_R, mask_img=mask, noise_model="ols",
                               standardize=None)
    assert imgs.shape == (3, 3, 2, 16)
    est = np.moveaxis(imgs.get_fdata(), -1, 0)
    # measured over seeds 0-4: max |beta_hat - beta| <= 0.024 with noise 0.01 (0.12 with
    # noise 0.05: the error is estimation noise, not bias); betas ~1
    np.testing.assert_allclose(est, betas, atol=0.05)
    assert list(table.columns) == ["trial_type", "size", "shape"]
    assert table.index.names == ["run", "trial"]
    assert table.index.tolist() == [(r, k) for r in range(2) for k in range(8)]
    expected = pd.concat([ev[["trial_type", "size", "shape"]] for ev in events],
                         ignore_index=True)
    pd.testing.assert_frame_equal(table.reset_index(drop=True), expected)


def test_condition_model_averages_runs(sim, tmp_path):
    runs, events, betas, _, mask = sim
    # events from BIDS .tsv files, BOLD from paths
    paths, tsvs = [], []
    for r, (run, ev) in enumerate(zip(runs, events)):
        paths.append(tmp_path / f"run-{r}_bold.nii.gz")
        run.to_filename(paths[-1])
        tsvs.append(tmp_path / f"run-{r}_events.tsv")
        ev.to_csv(tsvs[-1], sep="\t", index=False)
    imgs, table = trial_images(paths, tsvs, T_R, mask_img=mask, model="condition",
                               noise_model="ols")
    assert imgs.shape == (3, 3, 2, 2)
    # "size" varies within a condition: left out by default; "shape" is constant: kept
    assert table.to_dict("list") == {"trial_type": ["A", "B"], "shape": ["round", "square"]}
    assert table.index.tolist() == ["A", "B"] and table.index.name == "condition"
    est = np.moveaxis(imgs.get_fdata(), -1, 0)
    types = np.concatenate([ev.trial_type.to_numpy() for ev in events])
    for k, c in enumerate(["A", "B"]):
        # the condition beta is the mean response to its trials (measured over seeds 0-4:
        # max |diff| <= 0.0076)
        np.testing.assert_allclose(est[k], betas[types == c].mean(axis=0), atol=0.02)
    with pytest.raises(ValueError, match="'size' varies within a condition"):
        trial_images(runs, events, T_R, mask_img=mask, model="condition",
                     feature_cols=["trial_type", "size"])


def test_trial_images_bad_input(sim):
    runs, events, _, _, mask = sim
    with pytest.raises(ValueError, match="2 BOLD run.*but 1 events table"):
        trial_images(runs, events[:1], T_R, mask_img=mask)
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['duration'\]"):
        trial_images(runs, [ev.drop(columns="duration") for ev in events], T_R, mask_img=mask)
    with pytest.raises(ValueError, match="feature_cols.*not feature columns"):
        trial_images(runs, events, T_R, mask_img=mask, feature_cols=["colour"])
    with pytest.raises(ValueError, match="t_r must be"):
        trial_images(runs, events, 0, mask_img=mask)
    with pytest.raises(ValueError, match="model must be one of"):
        trial_images(runs, events, T_R, mask_img=mask, model="block")
    with pytest.raises(ValueError, match="condition_col='cond' is not a column"):
        trial_images(runs, events, T_R, mask_img=mask, model="condition", condition_col="cond")
    with pytest.raises(ValueError, match="no feature column"):
        trial_images(runs, [ev[["onset", "duration"]] for ev in events], T_R, mask_img=mask)
    with pytest.raises(TypeError, match="events.* must be a DataFrame"):
        trial_images(runs, [1, 2], T_R, mask_img=mask)


# ------------------------------------------------------------- standardize="run"
def _zscore_by_hand(data, runs):
    """Each voxel's values z-scored (ddof=1) over the volumes of each run, one by one."""
    out = np.empty_like(data, dtype=float)
    for r in np.unique(runs):
        for idx in np.ndindex(data.shape[:3]):
            v = data[idx][runs == r].astype(float)
            out[idx + (runs == r,)] = (v - v.mean()) / v.std(ddof=1)
    return out


def test_trial_images_z_score_within_run_by_default(sim):
    runs, events, _, _, mask = sim
    raw, table = trial_images(runs, events, T_R, mask_img=mask, noise_model="ols",
                              standardize=None)
    imgs, table2 = trial_images(runs, events, T_R, mask_img=mask, noise_model="ols")
    pd.testing.assert_frame_equal(table, table2)
    run = table.index.get_level_values("run").to_numpy()
    expected = _zscore_by_hand(raw.get_fdata(), run)
    np.testing.assert_allclose(imgs.get_fdata(), expected, atol=1e-5)   # float32 betas
    explicit, _ = trial_images(runs, events, T_R, mask_img=mask, noise_model="ols",
                               standardize="run")
    np.testing.assert_array_equal(explicit.get_fdata(), imgs.get_fdata())
    # condition images average over runs: the default leaves them as they are
    cond_auto, _ = trial_images(runs, events, T_R, mask_img=mask, model="condition")
    cond_raw, _ = trial_images(runs, events, T_R, mask_img=mask, model="condition",
                               standardize=None)
    np.testing.assert_array_equal(cond_auto.get_fdata(), cond_raw.get_fdata())


def test_trial_images_standardize_refusals(sim, monkeypatch):
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)           # every refusal comes before the GLM is fitted
    with pytest.raises(ValueError, match="standardize='run' needs model='trial'"):
        trial_images(runs, events, T_R, mask_img=mask, model="condition", standardize="run")
    with pytest.raises(ValueError, match="standardize must be one of"):
        trial_images(runs, events, T_R, mask_img=mask, standardize="zscore")
    one = [events[0], events[1].iloc[:1]]
    with pytest.raises(ValueError, match=r"events\[1\] hold a single trial.*standardize=None"):
        trial_images(runs, one, T_R, mask_img=mask)


def test_trial_images_bool_standardize_is_first_level_models(sim, monkeypatch):
    """standardize=True / False keep their earlier meaning: FirstLevelModel's
    (time-series) standardize, with betas not z-scored within run."""
    import nilearn.glm.first_level as first_level

    seen = []

    class Spy(first_level.FirstLevelModel):
        def fit(self, *args, **kwargs):
            seen.append(self.standardize)
            return super().fit(*args, **kwargs)

    monkeypatch.setattr(first_level, "FirstLevelModel", Spy)
    runs, events, _, _, mask = sim
    kw = dict(mask_img=mask, noise_model="ols")
    plain, _ = trial_images(runs, events, T_R, standardize=False, **kw)
    raw, _ = trial_images(runs, events, T_R, standardize=None, **kw)
    ts, table = trial_images(runs, events, T_R, standardize=True, **kw)
    default, _ = trial_images(runs, events, T_R, **kw)
    assert seen == [False, False, True, False]
    np.testing.assert_array_equal(plain.get_fdata(), raw.get_fdata())
    run = table.index.get_level_values("run").to_numpy()
    means = np.stack([ts.get_fdata()[..., run == r].mean(-1) for r in (0, 1)])
    # not z-scored within run: per-run means up to 0.71 (measured; 0 when z-scored)
    assert np.abs(means).max() > 0.3
    assert np.abs(ts.get_fdata() - default.get_fdata()).max() > 0.5    # measured 1.08


def test_zscore_runs_constant_voxel_and_bad_labels():
    from mlem_neuro.fmri import zscore_runs

    X = np.array([[1.0, 5.0], [3.0, 5.0], [2.0, 7.0], [4.0, 9.0]])
    Z = zscore_runs(X, ["a", "a", "b", "b"])
    np.testing.assert_allclose(Z[:, 0], [-1, 1, -1, 1] / np.sqrt(2))
    np.testing.assert_allclose(Z[:2, 1], 0)                # constant over run "a"
    with pytest.raises(ValueError, match="one run label per image"):
        zscore_runs(X, [0, 0, 1])
    with pytest.raises(ValueError, match=r"run\(s\) \[2\] hold a single image"):
        zscore_runs(X, [1, 1, 1, 2])
    with pytest.raises(ValueError, match="missing values"):
        zscore_runs(X, [1.0, 1.0, np.nan, np.nan])


# ------------------------------------------------------- events outside the run
def _no_fit(monkeypatch):
    """Make any GLM fit fail loudly: the refusals below must come before fitting."""
    from nilearn.glm.first_level import FirstLevelModel

    def fit(*args, **kwargs):
        raise AssertionError("the GLM was fitted before the events were checked")

    monkeypatch.setattr(FirstLevelModel, "fit", fit)


def _edit(events, run, **cols):
    out = [ev.copy() for ev in events]
    for col, values in cols.items():
        out[run][col] = values
    return out


def test_millisecond_onsets_refused_before_fit(sim, monkeypatch):
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)
    ms = [ev.assign(onset=ev.onset * 1000, duration=ev.duration * 1000) for ev in events]
    # run 0 is 120 scans x 2 s = 240 s; onsets 10000, 36000, ... ms
    with pytest.raises(ValueError, match=r"events\[0\]: 8 event\(s\) start at or after the "
                       r"end of the run .*= 240 s\): rows 0, 1, 2, 3, 4, \.\.\. \(8 rows in "
                       r"all\) \(onset 10000, 36000.*onsets look like milliseconds: BIDS "
                       r"onsets are in seconds, divide by 1000"):
        trial_images(runs, ms, T_R, mask_img=mask)
    # durations only in ms
    dms = _edit(events, 1, duration=events[1].duration * 1000)
    with pytest.raises(ValueError, match=r"events\[1\]: 8 event\(s\) end after the end of "
                       r"the run.*durations look like milliseconds"):
        trial_images(runs, dms, T_R, mask_img=mask)


def test_events_past_the_run_end_refused(sim, monkeypatch):
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)
    late = _edit(events, 1, onset=events[1].onset + 60)     # last onset 252 s > 240 s
    with pytest.raises(ValueError, match=r"events\[1\]: 1 event\(s\) start at or after the "
                       r"end of the run \(bold_imgs\[1\] lasts 120 scans x t_r=2 s = 240 s\)"
                       r": row 7 \(onset 252\); check t_r") as err:
        trial_images(runs, late, T_R, mask_img=mask)
    assert "milliseconds" not in str(err.value)
    # the t_r of the wrong scanner makes the run too short for its events
    with pytest.raises(ValueError, match=r"events\[0\]: 3 event\(s\) start at or after.*"
                       r"rows 5, 6, 7 \(onset 140, 166, 192\)"):
        trial_images(runs, events, 1.0, mask_img=mask)       # run = 120 s
    # starts inside the run, ends 3 s after it
    over = _edit(events, 0, onset=list(events[0].onset[:-1]) + [239.0])
    with pytest.raises(ValueError, match=r"events\[0\]: 1 event\(s\) end after the end of "
                       r"the run.*row 7 \(onset \+ duration 243\); if the scan stopped"):
        trial_images(runs, over, T_R, mask_img=mask)


def test_negative_nan_and_non_numeric_timing_refused(sim, monkeypatch, tmp_path):
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)
    neg = _edit(events, 1, onset=events[1].onset - 20)       # onsets -10, 16, ...
    with pytest.raises(ValueError, match=r"events\[1\]: onsets must be >= 0 s.*negative in "
                       r"row 0 \(onset -10\)"):
        trial_images(runs, neg, T_R, mask_img=mask)
    nan = _edit(events, 0, onset=[np.nan] + list(events[0].onset[1:]))
    with pytest.raises(ValueError, match=r"events\[0\]: onset must be a finite number.*"
                       r"row 0 \(onset nan\)"):
        trial_images(runs, nan, T_R, mask_img=mask)
    dur = events[1].duration.to_numpy(copy=True)
    dur[[2, 5]] = np.nan
    with pytest.raises(ValueError, match=r"events\[1\]: duration must be a finite number.*"
                       r"rows 2, 5 \(duration nan, nan\)"):
        trial_images(runs, _edit(events, 1, duration=dur), T_R, mask_img=mask)
    dur = events[0].duration.to_numpy(copy=True)
    dur[3] = -4.0
    with pytest.raises(ValueError, match=r"events\[0\]: durations must be >= 0 s; negative "
                       r"in row 3 \(duration -4\)"):
        trial_images(runs, _edit(events, 0, duration=dur), T_R, mask_img=mask)
    # a BIDS 'n/a' and a typo in an events.tsv
    tsv = tmp_path / "events.tsv"
    bad = events[0].astype({"onset": object})
    bad.loc[1, "onset"], bad.loc[4, "onset"] = "n/a", "3O.0"
    bad.to_csv(tsv, sep="\t", index=False)
    with pytest.raises(ValueError, match=r"events\[1\]: onset .* not a number in rows 1, 4 "
                       r"\(onset nan, '3O.0'\)"):
        trial_images(runs, [events[0], tsv], T_R, mask_img=mask)


def test_zero_regressor_refused_before_fit(sim, monkeypatch):
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)
    # the last frame is at 238 s: an event at 238.5 s ends inside the 240 s run but no scan
    # sees its response, so its design column is all zero
    onset = list(events[1].onset[:-1]) + [238.5]
    zero = _edit(events, 1, onset=onset, duration=[4.0] * 7 + [1.0])
    with pytest.raises(ValueError, match=r"events\[1\]: the regressor of the trial in row 7 "
                       r"\(onset 238.5 s\) is zero in the design matrix of run 1 \(largest "
                       r"\|value\| (0|[0-9.]+e-\d\d), vs .*outside the 120 scans"):
        trial_images(runs, zero, T_R, mask_img=mask)
    # a condition seen only there
    zero[1]["trial_type"] = ["A", "B"] * 3 + ["A", "C"]
    with pytest.raises(ValueError, match=r"events\[1\]: the regressor of condition "
                       r"trial_type='C' is zero in the design matrix of run 1"):
        trial_images(runs, zero, T_R, mask_img=mask, model="condition")


@pytest.mark.filterwarnings("ignore:The following conditions contain events with null")
def test_zero_duration_events_beside_blocks_are_kept(sim):
    """The zero-regressor threshold must not refuse short events next to long blocks (the
    0 s event's column peaks at ~0.008 of a 30 s block's)."""
    runs, events, _, _, mask = sim
    mixed = _edit(events, 0, duration=[0.0, 30.0] * 4)
    imgs, table = trial_images(runs, mixed, T_R, mask_img=mask, noise_model="ols")
    assert imgs.shape[3] == len(table) == 16
    assert np.isfinite(imgs.get_fdata()).all()


def test_unreadable_bold_run(sim, tmp_path):
    runs, events, _, _, mask = sim
    text = tmp_path / "run-1_bold.nii.gz"
    text.write_text("not an image\n")
    with pytest.raises(ValueError, match=r"bold_imgs\[1\]: cannot read the image file "
                       r"'.*run-1_bold.nii.gz'.*not a NIfTI image"):
        trial_images([runs[0], text], events, T_R, mask_img=mask)


# ------------------------------------------------------------------ real data
needs_haxby = pytest.mark.skipif(not HAXBY.exists(), reason="shared Haxby data absent")


@needs_haxby
def test_haxby_trial_images_to_searchlight():
    runs = [HAXBY / f"BOLD/task001_run{r:03d}/bold_25mm.nii.gz" for r in range(1, 13)]
    events = [HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv" for r in range(1, 13)]
    mask = HAXBY / "masks/25mm/brain.nii.gz"
    imgs, table = trial_images(runs, events, t_r=2.5, mask_img=mask)
    assert imgs.shape == (6, 10, 10, 96)
    assert len(table) == 96 and list(table.columns) == ["trial_type"]
    assert table.trial_type.value_counts().to_dict() == {c: 12 for c in [
        "face", "house", "cat", "shoe", "bottle", "scissors", "chair", "scrambledpix"]}
    assert sorted(set(table.index.get_level_values("run"))) == list(range(12))
    table["animate"] = table.trial_type.isin(["face", "cat"])

    res = mlem_neuro.mlem_searchlight(imgs, table, mask, radius=30.0, cv=3, n_repeats=1,
                                      max_steps=30,
                                      n_permutations=3, random_state=0)
    in_mask = nib.load(mask).get_fdata() > 0
    assert res.n_models == in_mask.sum() == 129
    assert res.terms == ["trial_type", "animate"]
    for term in res.terms:
        vol = res.importance_img(term).get_fdata()
        assert np.isfinite(vol).all() and (vol[~in_mask] == 0).all()
        assert np.abs(vol[in_mask]).max() > 0        # something was computed in the mask
    score = res.score_img.get_fdata()[in_mask]
    assert np.isfinite(score).all() and np.all(np.abs(score) <= 1)
    # only the pipeline is checked here (3 folds that split runs, 30 steps); the real
    # effect is checked in test_haxby_category_effect_needs_z_scoring_within_run

    # per-condition betas (fixed effects over the 12 runs)
    cimgs, ctable = trial_images(runs, events, t_r=2.5, mask_img=mask, model="condition")
    assert cimgs.shape == (6, 10, 10, 8) and len(ctable) == 8
    assert np.isfinite(cimgs.get_fdata()).all()


@needs_haxby
def test_haxby_category_effect_needs_z_scoring_within_run():
    """Whole-brain region (129 voxels), 96 block betas, GroupKFold(6) over runs: raw betas
    give no held-out category effect, betas z-scored within run do.  Measured over fold
    seeds 0-9: raw -0.011 (sd 0.014), z-scored 0.115 (sd 0.023); seed 0: -0.016, 0.127."""
    runs = [HAXBY / f"BOLD/task001_run{r:03d}/bold_25mm.nii.gz" for r in range(1, 13)]
    events = [HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv" for r in range(1, 13)]
    mask = nib.load(HAXBY / "masks/25mm/brain.nii.gz")
    raw, table = trial_images(runs, events, t_r=2.5, mask_img=mask, standardize=None)
    run = table.index.get_level_values("run")
    kw = dict(groups=run, cv=6, n_repeats=1, held_out_pairs="all", random_state=0)
    score = {name: mlem_neuro.mlem_roi(raw, table[["trial_type"]], mask, standardize=st,
                                       **kw).score[0]
             for name, st in [("raw", None), ("z", "run")]}
    assert abs(score["raw"]) < 0.05
    assert score["z"] > 0.08


def test_mask_on_another_grid_gives_its_grid_to_the_betas(sim):
    """As the docstring says: nilearn resamples the runs to the mask's grid, so a finer
    mask gives finer betas; a mask resampled to the runs first keeps the BOLD grid."""
    from nilearn.image import resample_to_img

    runs, events, _, _, _ = sim
    fine = AFFINE.copy()
    fine[:3, :3] /= 3.0
    fine[:3, 3] -= 1.0
    fine_mask = nib.Nifti1Image(np.ones((9, 9, 6), np.int8), fine)
    with pytest.warns(UserWarning, match="resampled to the mask_img resolution"):
        imgs, _ = trial_images(runs, events, T_R, mask_img=fine_mask, noise_model="ols")
    assert imgs.shape[:3] == (9, 9, 6) and np.allclose(imgs.affine, fine)
    on_bold = resample_to_img(fine_mask, runs[0], interpolation="nearest",
                              force_resample=True, copy_header=True)
    imgs, _ = trial_images(runs, events, T_R, mask_img=on_bold, noise_model="ols")
    assert imgs.shape[:3] == runs[0].shape[:3] and np.allclose(imgs.affine, AFFINE)
