"""Time-resolved MLEM (mlem_array, mlem_epochs) and the Epochs adapter."""
import logging
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.adapters.epochs import epochs_feature_table, features_from_events
from mlem_neuro.time_resolved import mlem_array, mlem_epochs
from mlem_neuro.times import window_average

mne = pytest.importorskip("mne")

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FAST = dict(cv=3, n_repeats=1, max_steps=200)
SFREQ = 100.0
WINDOWS = {"A": (8, 14), "B": (16, 22)}      # samples where A / B shape the sensor patterns
N_BASELINE = 6                               # samples before t = 0


def simulate(n=60, n_channels=8, n_times=30, amp=0.7, seed=0):
    """Trials × channels × times; A encoded in samples 8-13 only, B in 16-21, C never.

    Each encoded feature adds ``±amp`` times its own fixed sensor pattern (norm
    sqrt(n_channels)) to unit Gaussian noise, with the sign given by its binary value.
    """
    rng = np.random.default_rng(seed)
    times = (np.arange(n_times) - N_BASELINE) / SFREQ
    feats = {f: rng.integers(0, 2, n) for f in "ABC"}
    X = rng.standard_normal((n, n_channels, n_times))
    for f, (a, b) in WINDOWS.items():
        p = rng.standard_normal(n_channels)
        p *= np.sqrt(n_channels) / np.linalg.norm(p)
        s = 2.0 * feats[f] - 1
        X[:, :, a:b] += amp * s[:, None, None] * p[None, :, None]
    y = pd.DataFrame({f: np.where(v, "hi", "lo") for f, v in feats.items()})
    return X, y, times


def to_epochs(X, y, times, metadata=True):
    info = mne.create_info([f"EEG{k:03d}" for k in range(X.shape[1])], SFREQ, "eeg")
    names = {f"A{a}/B{b}": k + 1 for k, (a, b) in
             enumerate([(a, b) for a in ("hi", "lo") for b in ("hi", "lo")])}
    codes = [names[f"A{a}/B{b}"] for a, b in zip(y["A"], y["B"])]
    events = np.column_stack([np.arange(len(X)) * 100, np.zeros(len(X), int), codes])
    return mne.EpochsArray(X * 1e-6, info, events=events, tmin=times[0], event_id=names,
                           metadata=y.copy() if metadata else None, verbose=False)


@pytest.fixture(scope="module")
def sim():
    return simulate()


@pytest.fixture(scope="module")
def sim_result(sim):
    X, y, times = sim
    return mlem_array(X, y, times=times, random_state=0, **FAST)


def snapshot(epochs):
    return dict(data=epochs.get_data(copy=True), times=epochs.times.copy(),
                ch_names=list(epochs.ch_names), bads=list(epochs.info["bads"]),
                events=epochs.events.copy(), event_id=dict(epochs.event_id),
                metadata=None if epochs.metadata is None else epochs.metadata.copy(),
                sfreq=epochs.info["sfreq"], n=len(epochs), preload=epochs.preload)


def assert_unchanged(epochs, snap):
    now = snapshot(epochs)
    for key in ("times", "events", "data"):
        np.testing.assert_array_equal(now[key], snap[key])
    for key in ("ch_names", "bads", "event_id", "sfreq", "n", "preload"):
        assert now[key] == snap[key], key
    if snap["metadata"] is None:
        assert now["metadata"] is None
    else:
        pd.testing.assert_frame_equal(now["metadata"], snap["metadata"])


# ------------------------------------------------------------------ ground truth in time
def test_importance_peaks_inside_each_features_window(sim_result):
    res = sim_result
    assert res.terms == ["A", "B", "C"]                 # feature level (the default)
    imp = res.importance
    assert imp.shape == (30, 3) and res.importance_fold_std.shape == (30, 3)
    assert res.score.shape == (30,) and res.weights.shape == (30, 3, 3)
    # measured over seeds 0-5 (amp 0.7, feature level): argmax of A always in 8..13, of B
    # in 16..20; mean importance inside its window 0.47-0.54; max |importance| outside
    # the window, of C and at baseline <= 0.21 (mean |C| <= 0.025, baseline <= 0.042).
    for k, (f, (a, b)) in enumerate(WINDOWS.items()):
        assert a <= int(np.argmax(imp[:, k])) < b, f
        assert imp[a:b, k].mean() > 0.3, f
        outside = np.delete(imp[:, k], np.arange(a, b))
        assert np.abs(outside).max() < 0.25, f
    # the unencoded feature C
    assert np.abs(imp[:, 2]).max() < 0.25
    assert np.abs(imp[:, 2]).mean() < 0.06
    # baseline samples (t < 0), every feature
    base = imp[:N_BASELINE]
    assert np.all(res.times[:N_BASELINE] < 0)
    assert np.abs(base).max() < 0.25
    assert np.abs(base).mean() < 0.06
    # held-out score: ~0.5 inside the windows, ~0 at baseline (measured |mean| <= 0.05)
    assert res.score[8:14].mean() > 0.3 and res.score[16:22].mean() > 0.3
    assert abs(res.score[:N_BASELINE].mean()) < 0.1


def test_result_keeps_folds_and_settings(sim_result, sim):
    res = sim_result
    assert res.n_folds == 3
    assert res.fold_importance.shape == (3, 30, 3)
    np.testing.assert_allclose(res.importance, res.fold_importance.mean(0))
    np.testing.assert_allclose(res.importance_fold_std, res.fold_importance.std(0, ddof=1))
    assert (res.importance_fold_std > 0).any()
    np.testing.assert_array_equal(res.times, sim[2])
    np.testing.assert_allclose(np.linalg.norm(res.fold_weights, axis=(-2, -1)), 1.0,
                               rtol=1e-5)            # trained in float32
    s = res.settings
    assert s["cv"] == 3 and s["n_folds"] == 3 and s["constraint"] == "spd"
    assert s["n_permutations"] == 10 and s["n_trials"] == 60 and s["scale"] is True
    assert sorted(s["fold_test_sizes"]) == [20, 20, 20]
    assert s["sfreq"] == pytest.approx(SFREQ)
    assert res.n_iter.shape == (3, 30) and (res.n_iter <= 200).all()


def test_cv_none_trains_and_scores_on_all_trials(sim):
    X, y, times = sim
    res = mlem_array(X[:, :, :10], y, times=times[:10], cv=None, max_steps=50,
                     random_state=0)
    assert res.n_folds == 1 and res.settings["cv"] is None
    np.testing.assert_array_equal(res.importance_fold_std, 0.0)
    assert res.settings["fold_test_sizes"] == [60]


def test_chunking_and_jobs_do_not_change_results(sim):
    X, y, times = sim
    kw = dict(times=times[:8], cv=3, n_repeats=1, max_steps=40, random_state=1)
    ref = mlem_array(X[:, :, :8], y, **kw)
    chunked = mlem_array(X[:, :, :8], y, chunk_size=3, n_jobs=2, **kw)
    np.testing.assert_allclose(chunked.fold_importance, ref.fold_importance, atol=1e-10)
    np.testing.assert_allclose(chunked.fold_weights, ref.fold_weights, atol=1e-6)
    np.testing.assert_array_equal(chunked.n_iter, ref.n_iter)


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_progress_is_logged_at_info(sim, capfd):
    X, y, times = sim
    log = logging.getLogger("mlem_neuro")
    handler = _Collect()
    log.addHandler(handler)
    try:
        mlem_array(X[:, :, :4], y, times=times[:4], cv=3, n_repeats=1, max_steps=5, chunk_size=2,
                   random_state=0, verbose="INFO")
        msgs = " | ".join(handler.messages)
        assert "MLEM time course" in msgs and "6 chunk(s)" in msgs   # 2 chunks x 3 folds
        assert "MLEM chunks (time points)" in capfd.readouterr().err  # MNE's progress bar
        handler.messages.clear()
        mlem_array(X[:, :, :4], y, times=times[:4], cv=3, n_repeats=1, max_steps=5, random_state=0)
        assert handler.messages == []                    # default level is WARNING
        assert "MLEM chunks" not in capfd.readouterr().err
    finally:
        log.removeHandler(handler)


def test_window_average_matches_manual_moving_mean():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 11))
    out = window_average(x, sfreq=100.0, window=0.04)      # ±2 samples
    for t in range(11):
        lo, hi = max(0, t - 2), min(11, t + 3)
        np.testing.assert_allclose(out[..., t], x[..., lo:hi].mean(-1))
    np.testing.assert_allclose(window_average(x, 100.0, 0.005), x)   # < 1 sample: unchanged


def test_window_option_smooths_before_distances(sim):
    X, y, times = sim
    kw = dict(times=times, cv=3, n_repeats=1, max_steps=100, random_state=0)
    res = mlem_array(X, y, window=0.05, **kw)                # +-2 samples at 100 Hz
    plain = mlem_array(X, y, **kw)
    assert res.settings["window"] == 0.05 and plain.settings["window"] is None
    # smoothing spreads A's effect onto the samples next to its window (8..13): measured
    # over seeds 0-2, samples 7 and 14 reach 0.26-0.45 with the window, |.| <= 0.04 without
    imp, imp0 = res.importance[:, 0], plain.importance[:, 0]
    assert 8 <= int(np.argmax(imp)) < 14
    assert imp[7] > 0.15 and imp[14] > 0.15
    assert abs(imp0[7]) < 0.1 and abs(imp0[14]) < 0.1
    with pytest.raises(ValueError, match="sampling rate"):
        mlem_array(X, y, window=0.05, cv=3, n_repeats=1)                 # no times / sfreq


def test_scale_balances_channel_types():
    """A feature carried by small-unit channels is lost among large-unit ones unless
    channels are standardised (scale=True, the default)."""
    rng = np.random.default_rng(3)
    n, T = 60, 4
    f = rng.integers(0, 2, n)
    small = rng.standard_normal((n, 4, T)) + 1.5 * (2 * f - 1)[:, None, None]
    big = 1e3 * rng.standard_normal((n, 4, T))              # e.g. other units, pure noise
    X = np.concatenate([small, big], axis=1)
    y = pd.DataFrame({"f": f.astype(bool), "g": rng.integers(0, 2, n).astype(bool)})
    kw = dict(sfreq=100.0, cv=3, n_repeats=1, max_steps=100, random_state=0)
    on = mlem_array(X, y, **kw)
    off = mlem_array(X, y, scale=False, **kw)
    # measured: f's importance ~0.3 with scale=True, ~0.0 without
    assert on.importance[:, 0].mean() > 0.15
    assert abs(off.importance[:, 0].mean()) < 0.08
    assert on.settings["scale"] is True and off.settings["scale"] is False


# ------------------------------------------------------------------------ mlem_epochs
def test_mlem_epochs_equals_mlem_array_on_the_same_data(sim):
    X, y, times = sim
    epochs = to_epochs(X[:, :, :12], y, times[:12])
    snap = snapshot(epochs)
    kw = dict(cv=3, n_repeats=1, max_steps=60, random_state=0)
    a = mlem_epochs(epochs, **kw)                           # features: the metadata
    b = mlem_array(X[:, :, :12] * 1e-6, y, times=times[:12], **kw)
    assert a.terms == b.terms
    np.testing.assert_allclose(a.times, b.times)
    np.testing.assert_allclose(a.fold_importance, b.fold_importance, atol=1e-9)
    assert a.ch_names == epochs.ch_names
    assert_unchanged(epochs, snap)


def test_mlem_epochs_features_from_event_names(sim):
    X, y, times = sim
    epochs = to_epochs(X[:, :, :12], y, times[:12], metadata=False)
    res = mlem_epochs(epochs, cv=3, n_repeats=1, max_steps=60, random_state=0)
    # "Ahi/Blo" tags sit in consistent positions: one column per position
    assert res.feature_names == ["tag0", "tag1"]
    assert res.terms == ["tag0", "tag1"]
    # the event-name features are A and B themselves: A's importance peaks in its window
    assert 8 <= int(np.argmax(res.importance[:, 0])) < 12


def test_mlem_epochs_crop_decim_picks_follow_mne(sim):
    X, y, times = sim
    epochs = to_epochs(X, y, times)
    snap = snapshot(epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                      # aliasing warning of decim
        res = mlem_epochs(epochs, ["A", "C"], picks=["EEG000", "EEG002", "EEG005"],
                          tmin=-0.03, tmax=0.15, decim=2, cv=3, n_repeats=1, max_steps=20,
                          random_state=0)
        ref = epochs.copy().crop(-0.03, 0.15).decimate(2)
    np.testing.assert_allclose(res.times, ref.times, atol=1e-9)
    assert res.ch_names == ["EEG000", "EEG002", "EEG005"]
    assert res.feature_names == ["A", "C"]
    assert res.settings["decim"] == 2 and res.settings["sfreq"] == pytest.approx(50.0)
    assert_unchanged(epochs, snap)


def test_decim_warns_about_aliasing(sim):
    X, y, times = sim
    epochs = to_epochs(X[:, :, :10], y, times[:10])          # lowpass = 50 Hz = Nyquist
    with pytest.warns(RuntimeWarning, match="alias"):
        mlem_epochs(epochs, decim=2, cv=3, n_repeats=1, max_steps=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                        # window >= decim samples
        mlem_epochs(epochs, decim=2, window=0.02, cv=3, n_repeats=1, max_steps=5, random_state=0)


def _lazy_epochs_one_bad(seed, n_ev=24):
    """Non-preloaded epochs of ``n_ev`` events (x/left, x/right in turn) whose epoch 8
    is rejected on reading; and the events."""
    rng = np.random.default_rng(seed)
    info = mne.create_info(["a", "b", "c"], 100.0, "eeg")
    data = rng.standard_normal((3, 3000)) * 1e-6
    data[0, 1065:1070] = 1e-3                                 # an artefact: epoch 8 is bad
    raw = mne.io.RawArray(data, info, verbose=False)
    events = np.column_stack([100 + 120 * np.arange(n_ev), np.zeros(n_ev, int),
                              1 + np.arange(n_ev) % 2])
    epochs = mne.Epochs(raw, events, {"x/left": 1, "x/right": 2}, tmin=0, tmax=0.2,
                        baseline=None, reject=dict(eeg=1e-4), preload=False,
                        verbose=False)
    return epochs, events


def test_non_preloaded_epochs_are_not_modified():
    n_ev = 24
    epochs, events = _lazy_epochs_one_bad(0, n_ev)
    drop_log = epochs.drop_log
    res = mlem_epochs(epochs, cv=3, n_repeats=1, max_steps=5, random_state=0)
    assert not epochs.preload and epochs.drop_log == drop_log   # nothing dropped in place
    assert res.settings["n_epochs"] == n_ev - 1                 # the bad epoch left out
    assert res.feature_names == ["tag1"]                       # "x" is constant: dropped
    np.testing.assert_array_equal(epochs.events, events)


def test_labels_of_every_original_event_follow_the_selection():
    """groups / items of all 24 events (one dropped on reading) keep the labels of the kept
    epochs (as a feature table of 24 rows), not an error the user cannot avoid."""
    n_ev = 24
    epochs, _ = _lazy_epochs_one_bad(1, n_ev)
    kept = epochs.copy().drop_bad().selection
    assert len(kept) == n_ev - 1
    kw = dict(cv=3, n_repeats=1, max_steps=5, random_state=0)
    groups = np.arange(n_ev) // 4
    a = mlem_epochs(epochs, groups=groups, **kw)
    b = mlem_epochs(epochs, groups=groups[kept], **kw)
    np.testing.assert_array_equal(a.fold_score, b.fold_score)
    items = np.arange(n_ev) % 12                              # epochs k, k + 12: one side
    a = mlem_epochs(epochs, items=items, **kw)
    b = mlem_epochs(epochs, items=items[kept], **kw)
    np.testing.assert_array_equal(a.fold_score, b.fold_score)
    assert a.settings["trials_per_item"] == b.settings["trials_per_item"]
    with pytest.raises(ValueError, match="groups"):           # other lengths: still refused
        mlem_epochs(epochs, groups=groups[:20], **kw)


# ------------------------------------------------------------------- feature tables
def _tagged_epochs(names, codes):
    info = mne.create_info(2, 100.0, "eeg")
    ev_id = {nm: k + 1 for k, nm in enumerate(names)}
    events = np.column_stack([np.arange(len(codes)) * 10, np.zeros(len(codes), int),
                              np.asarray(codes) + 1])
    X = np.random.default_rng(0).standard_normal((len(codes), 2, 5))
    return mne.EpochsArray(X, info, events=events, event_id=ev_id, verbose=False)


def test_features_from_events_consistent_positions():
    names = ["auditory/left", "auditory/right", "visual/left", "visual/right"]
    ep = _tagged_epochs(names, [0, 1, 2, 3, 3, 0])
    tbl = features_from_events(ep)
    assert list(tbl.columns) == ["tag0", "tag1"] and tbl.attrs["layout"] == "positions"
    assert tbl["tag0"].tolist() == ["auditory", "auditory", "visual", "visual", "visual",
                                    "auditory"]
    assert tbl["tag1"].tolist() == ["left", "right", "left", "right", "right", "left"]
    named = mlem_neuro.features_from_events(ep, names=["modality", "side"])
    assert list(named.columns) == ["modality", "side"]
    with pytest.raises(ValueError, match="2 distinct column name"):
        features_from_events(ep, names=["modality"])


def test_numbered_event_names_are_labels_without_a_warning(sim):
    """mne.Epochs without event_id names its events "1", "2"...: features_from_events
    gives them as unordered categoricals (labels, compared as equal or not), so the
    numbers-as-text warning of feature tables stays silent on the default epochs."""
    X, y, times = sim
    ep = _tagged_epochs(["1", "2", "3"], [0, 1, 2, 2, 1, 0])
    tbl = features_from_events(ep)
    assert isinstance(tbl["event"].dtype, pd.CategoricalDtype)
    assert not tbl["event"].cat.ordered
    assert tbl["event"].tolist() == ["1", "2", "3", "3", "2", "1"]
    codes = np.tile([1, 2, 3], 10)
    info = mne.create_info(4, SFREQ, "eeg")
    events = np.column_stack([np.arange(30) * 100, np.zeros(30, int), codes])
    epochs = mne.EpochsArray(X[:30, :4, :3], info, events=events, verbose=False)
    assert epochs.event_id == {"1": 1, "2": 2, "3": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        res = mlem_epochs(epochs, cv=3, n_repeats=1, max_steps=5, n_permutations=1, random_state=0)
    assert res.terms == ["event"]
    with pytest.warns(UserWarning, match="numbers stored as text"):      # a plain table
        mlem_epochs(epochs, features=tbl.astype(str).iloc[[0, 1, 2] * 10], cv=3, n_repeats=1,
                    max_steps=5, n_permutations=1, random_state=0)


def test_features_from_events_inconsistent_tags_give_boolean_columns():
    # "left" moves between positions and names have 1 or 2 tags: one column per tag
    names = ["auditory/left", "left/visual", "visual", "auditory"]
    ep = _tagged_epochs(names, [0, 1, 2, 3, 1])
    tbl = features_from_events(ep)
    assert tbl.attrs["layout"] == "tags"
    assert list(tbl.columns) == ["auditory", "left", "visual"]
    assert tbl.dtypes.map(pd.api.types.is_bool_dtype).all()
    assert tbl["left"].tolist() == [True, True, False, False, True]
    assert tbl["visual"].tolist() == [False, True, True, False, True]
    with pytest.raises(ValueError, match="same positions"):
        features_from_events(ep, names=["a", "b"])


def test_single_tag_names_and_constant_tags():
    ep = _tagged_epochs(["go", "nogo"], [0, 1, 1, 0])
    assert list(features_from_events(ep).columns) == ["event"]
    ep = _tagged_epochs(["stim/go", "stim/nogo"], [0, 1, 1, 0])
    assert list(features_from_events(ep).columns) == ["tag1"]   # "stim" never varies


def test_dropped_epochs_stay_aligned_with_their_rows():
    names = ["a", "b"]
    codes = [0, 1, 0, 1, 1, 0, 0, 1]
    table = pd.DataFrame({"row": np.arange(8), "kind": list("xyxyyxxy")})
    ep = _tagged_epochs(names, codes)
    ep.metadata = table.copy()
    ep.drop([1, 4], verbose=False)
    # metadata follows MNE's drops
    assert epochs_feature_table(ep)["row"].tolist() == [0, 2, 3, 5, 6, 7]
    # a table with one row per original event is aligned with epochs.selection
    full = epochs_feature_table(ep, table)
    assert full["row"].tolist() == [0, 2, 3, 5, 6, 7]
    # a table with one row per kept epoch is used as is
    kept = epochs_feature_table(ep, table.iloc[[0, 2, 3, 5, 6, 7]])
    assert kept["row"].tolist() == [0, 2, 3, 5, 6, 7]
    # event names: rows of the kept epochs
    assert features_from_events(ep)["event"].tolist() == ["a", "a", "b", "a", "a", "b"]


# ------------------------------------------------------------------------- bad input
@pytest.fixture
def small_epochs(sim):
    X, y, times = sim
    return to_epochs(X[:, :, :6], y, times[:6])


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(features=pd.DataFrame({"A": ["x", "y"] * 10})), ValueError, "20 rows.*60 epochs"),
    (dict(features=["A", "nope"]), ValueError, r"unknown feature column\(s\) \['nope'\]"),
    (dict(features=42), TypeError, "features must be"),
    (dict(tmin=0.02, tmax=-0.02), ValueError, "tmin .* must not be after tmax"),
    (dict(tmin=0.5, tmax=0.6), ValueError, "no time sample"),
    (dict(picks=[]), ValueError, "selects no channel"),
    (dict(picks="meg"), ValueError, "picks"),
    (dict(picks=["EEG000", "nope"]), ValueError, "picks"),
    (dict(decim=0), ValueError, "decim"),
    (dict(window=-1.0), ValueError, "window"),
    (dict(constraint="psd"), ValueError, "constraint"),
    (dict(n_permutations=0), ValueError, "n_permutations"),
    (dict(cv=40, n_repeats=1), ValueError, "folds"),
    (dict(device="tpu"), ValueError, "device"),
])
def test_bad_input_raises_clear_errors_and_leaves_epochs_alone(small_epochs, kwargs, err,
                                                               match):
    snap = snapshot(small_epochs)
    with pytest.raises(err, match=match):
        mlem_epochs(small_epochs, max_steps=5, **kwargs)
    assert_unchanged(small_epochs, snap)


def test_single_condition_epochs_without_features(sim):
    X, y, times = sim
    info = mne.create_info(8, SFREQ, "eeg")
    ep = mne.EpochsArray(X[:, :, :5], info, verbose=False)   # one event type, no metadata
    snap = snapshot(ep)
    with pytest.raises(ValueError, match="share one condition"):
        mlem_epochs(ep, max_steps=5)
    with pytest.raises(ValueError, match="no metadata"):
        mlem_epochs(ep, features=["A"], max_steps=5)
    assert_unchanged(ep, snap)


def test_not_epochs_and_bad_arrays(sim):
    X, y, times = sim
    with pytest.raises(TypeError, match="mne.Epochs"):
        mlem_epochs(X, features=y)
    with pytest.raises(ValueError, match="3-D"):
        mlem_array(X[:, :, 0], y)
    with pytest.raises(ValueError, match="59 rows but data hold 60 trials"):
        mlem_array(X, y.iloc[:59])
    with pytest.raises(ValueError, match="NaN"):
        Xn = X.copy()
        Xn[0, 0, 0] = np.nan
        mlem_array(Xn, y)
    with pytest.raises(ValueError, match="strictly increasing"):
        mlem_array(X, y, times=times[::-1])
    with pytest.raises(ValueError, match="ch_names"):
        mlem_array(X, y, ch_names=["a"])
    with pytest.raises(ValueError, match="constant"):            # C only has one value
        mlem_array(X[:, :, :2], y.assign(C="same"), cv=3, n_repeats=1, max_steps=5)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_device_recovers_the_same_windows(sim):
    X, y, times = sim
    res = mlem_array(X, y, times=times, device="cuda", random_state=0, **FAST)
    assert res.settings["device"] == "cuda"
    assert np.isfinite(res.importance).all()
    for k, (f, (a, b)) in enumerate(WINDOWS.items()):
        assert a <= int(np.argmax(res.importance[:, k])) < b, f
        assert res.importance[a:b, k].mean() > 0.3, f


def test_lazy_top_level_exports():
    assert mlem_neuro.mlem_epochs is mlem_epochs
    assert mlem_neuro.mlem_array is mlem_array
    assert mlem_neuro.features_from_events is features_from_events
    assert "Parameters" in mlem_epochs.__doc__ and "%(shared)s" not in mlem_epochs.__doc__
    assert "scale : bool" in mlem_array.__doc__


# ----------------------------------------------------------------------- real data
EEGLAB = DATA / "eeglab_tutorial_eeg"


@pytest.mark.skipif(not (EEGLAB / "test_raw.set").exists(),
                    reason="shared EEGLAB tutorial data absent")
def test_real_eeglab_recording_end_to_end():
    raw = mne.io.read_raw_eeglab(EEGLAB / "test_raw.set", preload=True, verbose=False)
    events, event_id = mne.events_from_annotations(raw, verbose=False)
    sq = events[events[:, 2] == event_id["square"]]
    meta = pd.read_csv(EEGLAB / "square_trials.csv")
    epochs = mne.Epochs(raw, sq, tmin=-0.2, tmax=0.8, baseline=(None, 0), metadata=meta,
                        preload=True, verbose=False)
    snap = snapshot(epochs)
    res = mlem_epochs(epochs, ["position", "responded", "rt_ms"], decim=4, window=0.04,
                      cv=3, n_repeats=1, max_steps=100, random_state=0)
    assert res.terms == ["position", "responded", "rt_ms"]
    assert res.importance.shape == (len(res.times), 3)
    assert len(res.times) == 32 and res.times[0] == pytest.approx(-0.1875)
    assert np.isfinite(res.importance).all() and np.isfinite(res.score).all()
    assert np.isfinite(res.weights).all()
    assert len(res.ch_names) == 32
    assert_unchanged(epochs, snap)
    df = res.to_data_frame()
    assert len(df) == 32 * 3 and np.isfinite(df["importance"]).all()


def test_epochs_whose_times_lost_a_sample_get_a_clear_error():
    """MNE can build epochs.times one entry short when tmin is not on the sample grid."""
    import mne

    info = mne.create_info(3, 25.0, "eeg")
    rng = np.random.default_rng(0)
    epochs = mne.EpochsArray(rng.standard_normal((12, 3, 10)), info, tmin=-0.1,
                             verbose=False)
    if len(epochs.times) == 10:
        pytest.skip("this MNE version keeps all samples")
    with pytest.raises(ValueError, match="whole number of samples"):
        mlem_neuro.mlem_epochs(epochs, features=pd.DataFrame({"a": list("xy") * 6}))


def test_folds_whose_held_out_pairs_cannot_score_a_feature():
    """A feature constant (or all-different) over a fold's held-out stimuli has importance 0
    there by construction: a warning names it; when no feature varies, a clear error."""
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"A": np.repeat(["x", "y"], 12), "B": np.tile(["p", "q", "r"], 8)})
    data = rng.standard_normal((24, 4, 3))
    held = [np.arange(0, 6), np.arange(12, 18)]   # 6 stimuli sharing A's value, B varies
    folds = [(np.setdiff1d(np.arange(24), h), h) for h in held]
    with pytest.warns(UserWarning, match=r"same distance on \['A'\] \('A' in fold\(s\) 1, 2"):
        res = mlem_array(data, table, sfreq=10.0, cv=folds, n_permutations=2, max_steps=20)
    assert np.all(res.importance[:, res.terms.index("A")] == 0)
    # held-out stimuli equal on A and on B: nothing left to score
    same = [np.flatnonzero((table.A == "x") & (table.B == "p")),
            np.flatnonzero((table.A == "y") & (table.B == "q"))]
    folds = [(np.setdiff1d(np.arange(24), s), s) for s in same]
    with pytest.raises(ValueError, match="fold 1 has the same distance on every feature"):
        mlem_array(data, table, sfreq=10.0, cv=folds, n_permutations=2, max_steps=20)


def test_settings_record_the_folds_whatever_cv_was(tmp_path):
    from sklearn.model_selection import KFold

    rng = np.random.default_rng(1)
    table = pd.DataFrame({"A": np.tile(["x", "y"], 12), "B": np.tile(["p", "q", "r"], 8)})
    data = rng.standard_normal((24, 4, 3))
    folds = [(np.arange(8, 24), np.arange(8)), (np.arange(16), np.arange(16, 24))]
    kw = dict(sfreq=10.0, n_permutations=1, max_steps=5)
    res = mlem_array(data, table, cv=folds, **kw)
    assert res.settings["cv"] == "explicit"
    assert res.settings["fold_test_indices"] == [list(range(8)), list(range(16, 24))]
    res.save(tmp_path / "r.npz")
    back = mlem_neuro.read_result(tmp_path / "r.npz")
    assert back.settings["fold_test_indices"] == res.settings["fold_test_indices"]
    res = mlem_array(data, table, cv=KFold(3), **kw)
    assert res.settings["cv"].startswith("KFold(")
    assert sorted(sum(res.settings["fold_test_indices"], [])) == list(range(24))
    res = mlem_array(data, table, cv=3, n_repeats=1, random_state=0, **kw)
    assert res.settings["cv"] == 3 and len(res.settings["fold_test_indices"]) == 3


def test_mlem_array_crops_and_decimates_like_mlem_epochs():
    """tmin / tmax / decim on an array select the same samples as on the equivalent Epochs,
    after the same window averaging."""
    X, y, times = simulate(n=40, n_channels=6, n_times=30)
    kw = dict(cv=2, n_repeats=1, n_permutations=1, max_steps=10, random_state=0)
    sel = dict(tmin=0.0, tmax=0.2, decim=2, window=0.03)   # +-1 sample at 100 Hz
    res = mlem_array(X * 1e-6, y, times=times, **sel, **kw)        # the Epochs' volts
    ref = mlem_epochs(to_epochs(X, y, times), features=list(y.columns), **sel, **kw)
    np.testing.assert_allclose(res.times, ref.times)
    assert res.times[0] >= 0 and res.times[-1] <= 0.2 + 1e-9
    np.testing.assert_allclose(res.importance, ref.importance, atol=1e-12)
    assert res.settings["decim"] == 2 and res.settings["sfreq"] == pytest.approx(
        ref.settings["sfreq"])
    with pytest.raises(ValueError, match="no time sample"):
        mlem_array(X, y, times=times, tmin=5.0, **kw)
    with pytest.raises(ValueError, match="decim must be an int"):
        mlem_array(X, y, times=times, decim=0, **kw)


def test_mlem_array_refuses_tmin_tmax_without_a_time_axis():
    """tmin / tmax are seconds: without times or sfreq the samples are numbered 0, 1...,
    and tmin=-0.1, tmax=0.3 silently kept sample 0 alone."""
    X, y, times = simulate(n=30, n_channels=4, n_times=12)
    kw = dict(cv=2, n_repeats=1, n_permutations=1, max_steps=5, random_state=0)
    for sel in (dict(tmin=-0.1, tmax=0.3), dict(tmin=0.1), dict(tmax=0.3)):
        with pytest.raises(ValueError, match="tmin and tmax are in seconds.*times= or sfreq="):
            mlem_array(X, y, **sel, **kw)
    res = mlem_array(X, y, sfreq=SFREQ, tmin=0.0, tmax=0.03, **kw)     # with a rate: fine
    np.testing.assert_allclose(res.times, [0.0, 0.01, 0.02, 0.03])


def test_random_folds_flat_by_chance_advise_fewer_folds():
    """Random K-fold splits (int cv, no groups) can hold out stimuli that all differ in a
    feature (7 objects x 3 positions, 7 held out per fold): the warning says it happened
    by chance and advises fewer folds or repeats, not runs the data do not have."""
    table = pd.DataFrame({"object": np.repeat(list("abcdefg"), 3),
                          "position": np.tile(list("xyz"), 7)})
    data = np.random.default_rng(0).standard_normal((21, 4, 2))
    with pytest.warns(UserWarning, match=r"own value of \['object'\].*by chance.*Fewer folds") \
            as record:
        mlem_array(data, table, sfreq=10.0, cv=3, n_repeats=10, n_permutations=2,
                   max_steps=20, random_state=0)
    assert not any("leave-one-run-out" in str(w.message) for w in record)


def test_folds_with_each_condition_once_explain_leave_one_run_out():
    """Held-out folds with one trial per condition (leave-one-run-out, each condition
    once per run): every held-out pair differs in the condition, so its importance is 0
    by construction; the warning (or error, when no feature varies) says so and
    recommends a grouped k-fold."""
    rng = np.random.default_rng(0)
    run = np.repeat(np.arange(4), 4)
    table = pd.DataFrame({"cond": np.tile(list("abcd"), 4),
                          "animate": np.tile([1, 1, 0, 0], 4)})
    data = rng.standard_normal((16, 4, 3))
    folds = [(np.flatnonzero(run != r), np.flatnonzero(run == r)) for r in range(4)]
    advice = r"own value of \['cond'\].*leave-one-run-out.*grouped k-fold"
    with pytest.warns(UserWarning, match=advice):
        res = mlem_array(data, table, sfreq=10.0, cv=folds, n_permutations=2, max_steps=20)
    assert np.all(res.importance[:, res.terms.index("cond")] == 0)
    with pytest.raises(ValueError, match=advice):
        mlem_array(data, table[["cond"]], sfreq=10.0, cv=folds, n_permutations=2,
                   max_steps=20)
    # two runs per held-out fold (grouped k-fold): pairs of one condition across runs
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        mlem_array(data, table[["cond"]], sfreq=10.0, cv=2, n_repeats=1, groups=run,
                   n_permutations=2,
                   max_steps=20, random_state=0)


def test_groups_column_is_not_a_feature_of_the_default_table(sim):
    """groups='run' names the folds' groups: with features=None (every metadata column)
    that column is left out of the features, as the items and partitions columns are and
    as the command line's --groups does; named in features explicitly it stays one."""
    X, y, times = sim
    meta = y.assign(run=np.repeat(np.arange(6), len(y) // 6))
    epochs = to_epochs(X[:, :, :4], meta, times[:4])
    kw = dict(cv=3, n_repeats=1, max_steps=5, n_permutations=1, random_state=0)
    res = mlem_epochs(epochs, groups="run", **kw)
    assert res.terms == ["A", "B", "C"] and res.settings["n_groups"] == 6
    ref = mlem_array(X[:, :, :4], y, times=times[:4], groups=meta["run"].to_numpy(), **kw)
    np.testing.assert_allclose(res.importance, ref.importance)
    res = mlem_epochs(epochs, features=["A", "run"], groups="run", **kw)
    assert res.terms == ["A", "run"]
    # mlem_array: a column of the features names the groups (as items does there)
    res = mlem_array(X[:, :, :4], meta, times=times[:4], groups="run", **kw)
    assert res.terms == ["A", "B", "C"] and res.settings["n_groups"] == 6
    np.testing.assert_allclose(res.importance, ref.importance)
    with pytest.raises(TypeError, match="names no column"):
        mlem_array(X[:, :, :4], meta, times=times[:4], groups="session", **kw)
