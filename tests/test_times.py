"""Generic time helpers (mlem_neuro.times) and channel picking through public MNE calls."""
import inspect
import warnings

import mne
import numpy as np
import pytest

from mlem_neuro import times as tm
from mlem_neuro.adapters import epochs as ep_adapter
from mlem_neuro.adapters.epochs import _pick_indices, epochs_data


# --------------------------------------------------------------------------- times
def test_helpers_live_in_times_and_are_reexported():
    for name in ("window_average", "check_window", "time_mask"):
        assert getattr(ep_adapter, name) is getattr(tm, name)
    assert "mne" not in inspect.getsource(tm).replace("MNE", "")   # no MNE in times.py


def test_time_mask_crops_inclusively_and_decimates_on_a_zero_anchored_grid():
    sfreq = 100.0
    times = np.arange(-13, 40) / sfreq                      # -0.13 .. 0.39 s
    mask = tm.time_mask(times, sfreq, tmin=-0.1, tmax=0.2, decim=5)
    kept = np.round(times[mask] * sfreq).astype(int)
    assert kept.tolist() == [-10, -5, 0, 5, 10, 15, 20]     # tmin, tmax included
    # without sfreq: every decim-th sample from the first
    mask = tm.time_mask(times, None, decim=10)
    assert np.flatnonzero(mask).tolist() == [0, 10, 20, 30, 40, 50]


def test_time_mask_warnings_and_errors():
    sfreq = 100.0
    times = np.arange(0, 50) / sfreq
    with pytest.warns(RuntimeWarning, match="reaches outside the data"):
        tm.time_mask(times, sfreq, tmin=-0.2, tmax=0.1)
    with pytest.warns(RuntimeWarning, match="Nyquist frequency of 10 Hz"):
        tm.time_mask(times, sfreq, decim=5, lowpass=40.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # a wide window averages: no alias
        tm.time_mask(times, sfreq, decim=5, lowpass=40.0, window=0.05)
    with pytest.raises(ValueError, match="no time sample"):
        tm.time_mask(times, sfreq, tmin=1.0, tmax=2.0)
    with pytest.raises(ValueError, match="must not be after tmax"):
        tm.time_mask(times, sfreq, tmin=0.3, tmax=0.1)
    with pytest.raises(ValueError, match="decim must be an int >= 1; got 2.5"):
        tm.time_mask(times, sfreq, decim=2.5)
    with pytest.raises(TypeError, match="tmin must be a finite number of seconds"):
        tm.time_mask(times, sfreq, tmin="0.1")


def test_check_window():
    assert tm.check_window(None, None) is None
    assert tm.check_window(0.05, 100.0) == 0.05
    with pytest.raises(ValueError, match="sampling rate must be known"):
        tm.check_window(0.05, None)
    with pytest.raises(ValueError, match="window must be a positive number"):
        tm.check_window(0, 100.0)


# --------------------------------------------------------------------------- picks
@pytest.fixture
def mixed_epochs():
    names = [f"EEG{k:03d}" for k in range(5)] + ["MAG1", "GRAD1", "STI", "EOG"]
    types = ["eeg"] * 5 + ["mag", "grad", "stim", "eog"]
    info = mne.create_info(names, 100.0, types)
    info["bads"] = ["EEG002", "GRAD1"]
    rng = np.random.default_rng(0)
    return mne.EpochsArray(rng.standard_normal((4, len(names), 6)), info, verbose=False)


@pytest.mark.parametrize("picks, expected", [
    (None, [0, 1, 3, 4, 5]),                  # good data channels (no bads, stim, eog)
    ("data", [0, 1, 3, 4, 5]),
    ("eeg", [0, 1, 3, 4]),                    # types leave bads out
    (["mag", "eeg"], [0, 1, 3, 4, 5]),
    ("eog", [8]),
    (["EEG004", "EEG000"], [4, 0]),           # names keep their order...
    (["EEG002"], [2]),                        # ...and may name a bad channel
    ([3, 1], [3, 1]),
    (np.array([0, 2]), [0, 2]),
    (slice(1, 4), [1, 2, 3]),
    (-1, [8]),
])
def test_picks_follow_mne(mixed_epochs, picks, expected):
    snap = (list(mixed_epochs.ch_names), list(mixed_epochs.info["bads"]))
    idx = _pick_indices(mixed_epochs, picks)
    assert idx.dtype.kind == "i" and idx.tolist() == expected
    assert (list(mixed_epochs.ch_names), list(mixed_epochs.info["bads"])) == snap
    data, _, ch_names, _ = epochs_data(mixed_epochs, picks=picks)
    assert ch_names == [mixed_epochs.ch_names[k] for k in expected]
    np.testing.assert_array_equal(data, mixed_epochs.get_data()[:, expected])


@pytest.mark.parametrize("picks, match", [
    ([], r"picks=\[\] selects no channel"),
    (np.array([], dtype=int), "selects no channel"),
    ("seeg", "invalid picks 'seeg'.*Pick channels by name, type or index"),
    (["EEG000", "nope"], r"invalid picks \['EEG000', 'nope'\].*nope"),
    ([42], r"invalid picks \[42\]"),
    (2.5, "invalid picks 2.5"),
])
def test_bad_picks_raise_value_errors_naming_picks(mixed_epochs, picks, match):
    with pytest.raises(ValueError, match=match):
        _pick_indices(mixed_epochs, picks)


def test_no_good_data_channel(mixed_epochs):
    only_stim = mixed_epochs.copy().pick(["STI", "EOG"])
    with pytest.raises(ValueError, match="no good data channel"):
        _pick_indices(only_stim, None)
    assert _pick_indices(only_stim, "stim").tolist() == [0]


def test_picking_uses_no_private_mne_module():
    assert "_fiff" not in inspect.getsource(ep_adapter)


@pytest.mark.parametrize("window, half", [(0.02, 1), (0.03, 1), (0.04, 2), (0.05, 2),
                                          (0.06, 3), (0.07, 3), (0.1, 5), (0.015, 0)])
def test_window_average_keeps_the_samples_within_half_a_window(window, half):
    """``window`` averages the samples within ``±window / 2`` s, as documented: at 100 Hz
    0.03 s is ±1 sample and 0.07 s ±3 (Python's round-half-to-even gave ±2 and ±4, so
    0.03 and 0.05 s averaged alike, and 0.07 s reached 40 ms on each side)."""
    sfreq, T = 100.0, 15
    x = np.random.default_rng(0).standard_normal((2, 3, T))
    out = tm.window_average(x, sfreq, window)
    for t in range(T):
        lo, hi = max(0, t - half), min(T, t + half + 1)
        np.testing.assert_allclose(out[..., t], x[..., lo:hi].mean(-1))


@pytest.mark.parametrize("offset", [0.5, 0.25, 0.4999999999, 0.5000000001])
def test_decim_keeps_every_decim_th_sample_when_times_are_off_the_zero_grid(offset):
    """Times between sample instants (bin centres, e.g. spike rates at 5, 15, 25 ms at
    100 Hz) still decimate to every decim-th sample, on the grid of the sample nearest
    t = 0.  np.round on half samples (round half to even) kept 9 of 10 samples with
    decim=2 (0.5, 1.5, 2.5 -> 0, 2, 2)."""
    sfreq = 100.0
    times = (offset + np.arange(-10, 20)) / sfreq
    for decim in (2, 3, 5):
        kept = np.flatnonzero(tm.time_mask(times, sfreq, decim=decim))
        assert np.all(np.diff(kept) == decim), (decim, kept)
        assert abs(times[kept]).min() < 1.0 / sfreq          # anchored next to t = 0
    bins = 0.005 + np.arange(10) / sfreq                     # float noise at half samples
    assert np.flatnonzero(tm.time_mask(bins, sfreq, decim=2)).tolist() == [0, 2, 4, 6, 8]


def test_window_average_warns_when_the_window_spans_every_sample():
    """A window as long as the data (e.g. 10 s given for 10 ms, or for a 0.86 s epoch)
    made every time point the average of all samples: a flat time course, silently."""
    data = np.random.default_rng(0).standard_normal((3, 2, 22))
    with pytest.warns(UserWarning, match=r"window=10 s at 25 Hz spans all 22 samples"):
        out = tm.window_average(data, 25.0, 10.0)
    np.testing.assert_allclose(out, data.mean(-1, keepdims=True).repeat(22, -1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tm.window_average(data, 25.0, 1.6)       # +-20 samples: the ends still differ
    with pytest.warns(UserWarning, match="spans all 22 samples"):
        tm.window_average(data, 25.0, 1.68)      # +-21 samples: every one averages all
