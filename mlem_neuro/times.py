"""Time axes of time-resolved data: checks, sample selection and moving averages.

These helpers know nothing of MNE: they work on a ``times`` vector (seconds) and a
sampling rate, and serve both :func:`mlem_neuro.mlem_epochs` (through
:mod:`mlem_neuro.adapters.epochs`) and :func:`mlem_neuro.mlem_array`.

* :func:`check_time` / :func:`check_window`: validate ``tmin``/``tmax`` and ``window``;
* :func:`time_mask`: the samples kept by ``[tmin, tmax]`` and ``decim`` (with MNE's
  decimation grid anchored at ``t = 0``), with warnings for aliasing and out-of-range
  windows;
* :func:`window_average`: a centred moving average over ``window`` seconds.
"""
from __future__ import annotations

import numbers
import warnings

import numpy as np

__all__ = ["check_decim", "check_time", "check_window", "time_mask", "window_average"]


def check_time(name, value):
    """``value`` (seconds) as a float, or ``None``; refuses non-numbers and non-finite."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(value):
        raise TypeError(f"{name} must be a finite number of seconds or None; got {value!r}")
    return float(value)


def check_window(window, sfreq):
    """``window`` (seconds) as a float, or ``None``; a window needs a known ``sfreq``."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, numbers.Real) \
            or not np.isfinite(window) or window <= 0:
        raise ValueError(f"window must be a positive number of seconds or None; got {window!r}")
    if sfreq is None:
        raise ValueError("window is given in seconds, so the sampling rate must be known: "
                         "pass times= or sfreq=.")
    return float(window)


def check_decim(decim):
    """``decim`` as an int >= 1."""
    if isinstance(decim, bool) or not isinstance(decim, (numbers.Integral, np.integer)) \
            or decim < 1:
        raise ValueError(f"decim must be an int >= 1; got {decim!r}")
    return int(decim)


def window_average(data, sfreq, window):
    """Average each sample with its neighbours within ``±window / 2`` seconds (last axis).

    Samples near the edges average the neighbours that exist.  Returns a new array.
    """
    # the samples k with |k| / sfreq <= window / 2 (the tolerance absorbs float noise, as
    # in 0.06 * 100 / 2 = 3.0000000000000004; rounding would take 0.03 s at 100 Hz as
    # +-2 samples)
    half = int(np.floor(float(window) * sfreq / 2.0 + 1e-9))
    if half < 1:
        return np.array(data, dtype=float)
    T = data.shape[-1]
    if T > 1 and half >= T - 1:
        warnings.warn(f"window={float(window):g} s at {float(sfreq):g} Hz spans all {T} "
                      "samples: every time point is the average of all of them (a flat "
                      "time course). window is in seconds: give a fraction of the epoch "
                      "(e.g. 0.02).", stacklevel=3)
    c = np.cumsum(np.asarray(data, dtype=float), axis=-1)
    c = np.concatenate([np.zeros(c.shape[:-1] + (1,)), c], axis=-1)
    t = np.arange(T)
    lo, hi = np.clip(t - half, 0, T), np.clip(t + half + 1, 0, T)
    return (c[..., hi] - c[..., lo]) / (hi - lo)


def _decim_mask(times, sfreq, decim):
    """Every ``decim``-th sample, on a grid anchored at ``t = 0`` when ``sfreq`` is known
    (at the sample nearest ``t = 0`` for times between sample instants, such as bin
    centres; the times are evenly spaced by ``1 / sfreq``)."""
    samples = np.arange(len(times))
    if sfreq is not None and len(times):
        # one anchor for all samples: rounding each time (np.round, half to even) took
        # 0.5, 1.5, 2.5 samples to 0, 2, 2 and kept irregular samples
        samples = samples - int(np.floor(-float(times[0]) * sfreq + 0.5))
    return (samples % decim) == 0


def _warn_aliasing(sfreq, decim, window, lowpass, stacklevel):
    nyq = sfreq / decim / 2.0
    if lowpass > nyq and (window is None or window < decim / sfreq):
        warnings.warn(f"decim={decim} leaves a Nyquist frequency of {nyq:g} Hz, below "
                      f"the low-pass of the data ({lowpass:g} Hz): high frequencies "
                      "will alias. Low-pass filter the data first or pass window= "
                      "(which averages samples).", RuntimeWarning, stacklevel=stacklevel + 1)


def time_mask(times, sfreq, tmin=None, tmax=None, decim=1, window=None, lowpass=None,
              stacklevel=4):
    """Samples kept by ``[tmin, tmax]`` (inclusive) and ``decim`` (boolean, per sample).

    ``decim`` keeps every ``decim``-th sample on a grid anchored at ``t = 0`` (as MNE's
    ``decimate``) when ``sfreq`` is known, else every ``decim``-th sample from the first.
    Warns when ``[tmin, tmax]`` reaches outside ``times`` or when decimation leaves a Nyquist
    frequency below ``lowpass`` with no averaging ``window``; raises when nothing is left.
    ``stacklevel`` is the warnings' stack level as seen from this function.
    """
    tmin, tmax = check_time("tmin", tmin), check_time("tmax", tmax)
    if tmin is not None and tmax is not None and tmin > tmax:
        raise ValueError(f"tmin ({tmin} s) must not be after tmax ({tmax} s).")
    decim = check_decim(decim)
    step = 1.0 / sfreq if sfreq is not None else (
        float(np.min(np.diff(times))) if len(times) > 1 else 1.0)
    lo = times[0] if tmin is None else tmin
    hi = times[-1] if tmax is None else tmax
    mask = (times >= lo - 1e-3 * step) & (times <= hi + 1e-3 * step)
    if mask.any() and (lo < times[0] - step / 2 or hi > times[-1] + step / 2):
        warnings.warn(f"[tmin, tmax] = [{lo}, {hi}] s reaches outside the data "
                      f"([{times[0]:.4g}, {times[-1]:.4g}] s); using the overlap.",
                      RuntimeWarning, stacklevel=stacklevel)
    if decim > 1:
        mask &= _decim_mask(times, sfreq, decim)
        if sfreq is not None and lowpass is not None:
            _warn_aliasing(sfreq, decim, window, lowpass, stacklevel)
    if not mask.any():
        raise ValueError(f"no time sample in [tmin, tmax] = [{lo}, {hi}] s (with decim="
                         f"{decim}); the data span [{times[0]:.4g}, {times[-1]:.4g}] s.")
    return mask


# former private name, kept for callers that imported it
_check_time = check_time
