"""From BOLD runs and BIDS-style events to one beta image per trial or condition + features.

:func:`trial_images` fits nilearn's :class:`~nilearn.glm.first_level.FirstLevelModel` and
returns the images and the matching feature table that :func:`mlem_neuro.mlem_searchlight`
and :func:`mlem_neuro.mlem_roi` take.  Block designs given otherwise become events tables
with :func:`events_from_labels` (one label per volume, PyMVPA's ``attributes.txt``) and
:func:`read_fsl_onsets` / :func:`read_openfmri_onsets` (FSL three-column onset files).
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pandas as pd

# the events of block designs in other layouts (per-volume labels, FSL onset files)
from .block_events import events_from_labels, read_fsl_onsets, read_openfmri_onsets
from .core.checks import check
from .core.constants import (  # noqa: F401  (tuning constants, defined there once)
    NULL_REGRESSOR as _NULL_REGRESSOR,
)
from .core.constants import (
    TWIN_REGRESSORS as _TWIN_REGRESSORS,
)
from .utils import logger, verbose, warn_user

__all__ = ["trial_images", "events_from_labels", "read_fsl_onsets",
           "read_openfmri_onsets"]

_TIMING = ("onset", "duration")
#: values of ``standardize`` besides ``None`` / ``False`` (no standardisation)
STANDARDIZE = ("run",)


def check_standardize(standardize, allowed=STANDARDIZE):
    """``standardize`` normalised to ``"run"`` or ``None``; refuse anything else."""
    if standardize is None or standardize is False:
        return None
    if isinstance(standardize, str) and standardize in allowed:
        return standardize
    choices = ", ".join(repr(v) for v in allowed)
    hint = (" (True is ambiguous: 'run' z-scores each voxel across the images of each run)"
            if standardize is True else "")
    raise ValueError(f"standardize must be one of {choices} or None (no standardisation); "
                     f"got {standardize!r}{hint}.")


def zscore_runs(X, runs, name="imgs"):
    """Z-score each column of ``X`` (images x voxels) across the images of each run.

    Mean 0 and standard deviation 1 (``ddof=1``) per voxel within every run; a voxel that
    is constant over a run's images becomes 0 there.

    Parameters
    ----------
    X : ndarray (n_images, n_voxels)
    runs : array-like (n_images,)
        Run label of each image.
    name : str
        What the images are called in error messages.

    Returns
    -------
    Z : ndarray (n_images, n_voxels)
        A new float64 array.
    """
    X = np.asarray(X, dtype=np.float64)
    runs = np.asarray(runs)
    if runs.ndim != 1 or len(runs) != len(X):
        raise ValueError(f"standardize='run' needs one run label per image: {len(X)} "
                         f"image(s) in {name} but {runs.size} run label(s).")
    if pd.isna(runs).any():
        raise ValueError("standardize='run': the run labels hold missing values; every "
                         "image needs a run.")
    labels, inverse, counts = np.unique(runs, return_inverse=True, return_counts=True)
    if (counts < 2).any():
        single = labels[counts < 2].tolist()
        raise ValueError(f"standardize='run' z-scores each voxel across the images of a "
                         f"run, but run(s) {single} hold a single image of {name}: its "
                         "standard deviation is undefined. Drop those images, merge the "
                         "run with another, or pass standardize=None.")
    Z = np.empty_like(X)
    n_flat = 0
    for k in range(len(labels)):
        rows = inverse == k
        block = X[rows]
        mean = block.mean(axis=0)
        sd = block.std(axis=0, ddof=1)
        flat = ~(sd > 1e-12 * np.maximum(np.abs(mean), 1.0))
        n_flat += int(flat.sum())
        Z[rows] = np.where(flat, 0.0, (block - mean) / np.where(flat, 1.0, sd))
    if n_flat:
        logger.info("standardize='run': %d (voxel, run) pair(s) constant over the run's "
                    "images set to 0", n_flat)
    return Z


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _rows(where, values, label="onset"):
    """``'rows 3, 4 (onset 10000, 36000)'`` for the True entries of ``where`` (5 at most)."""
    idx = np.flatnonzero(np.asarray(where))
    more = f", ... ({len(idx)} rows in all)" if len(idx) > 5 else ""
    vals = ", ".join(f"{v:g}" if isinstance(v, (float, np.floating)) else repr(v)
                     for v in np.asarray(values, dtype=object)[idx[:5]])
    return (f"row{'s' if len(idx) > 1 else ''} {', '.join(str(int(i)) for i in idx[:5])}"
            f"{more} ({label} {vals})")


def _read_events(ev, k):
    if isinstance(ev, (str, os.PathLike)):
        try:
            ev = pd.read_csv(ev, sep="\t")
        except FileNotFoundError:
            raise ValueError(f"events[{k}]: no such file {str(ev)!r}") from None
    if not isinstance(ev, pd.DataFrame):
        raise TypeError(f"events[{k}] must be a DataFrame or the path of a BIDS events.tsv "
                        f"file; got {type(ev).__name__}")
    missing = [c for c in _TIMING if c not in ev.columns]
    if missing:
        raise ValueError(f"events[{k}] lacks the column(s) {missing}; BIDS events tables "
                         "have 'onset' and 'duration' (seconds) and one row per trial.")
    if len(ev) == 0:
        raise ValueError(f"events[{k}] has no rows: every run needs at least one trial.")
    return ev.reset_index(drop=True)


def _timing_values(ev, k):
    """Onsets and durations as float arrays; refuse missing, non-numeric or negative ones."""
    out = []
    for col in _TIMING:
        values = pd.to_numeric(ev[col], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values)
        if bad.any():
            raise ValueError(f"events[{k}]: {col} must be a finite number of seconds in "
                             f"every row; it is missing (NaN, 'n/a'), infinite or not a "
                             f"number in {_rows(bad, ev[col], col)}. Fix or drop those "
                             "rows.")
        out.append(values)
    onset, duration = out
    if (duration < 0).any():
        raise ValueError(f"events[{k}]: durations must be >= 0 s; negative in "
                         f"{_rows(duration < 0, duration, 'duration')}.")
    if (onset < 0).any():
        raise ValueError(f"events[{k}]: onsets must be >= 0 s (seconds from the first "
                         f"stored scan of the run); negative in {_rows(onset < 0, onset)}. "
                         "Drop the events that happened before the run started, or shift "
                         "the onsets if they were given relative to another time.")
    return onset, duration


def _check_timing(ev, k, n_scans, t_r):
    """Onsets and durations (float) of one run; refuse events outside ``[0, n_scans * t_r]``
    s, with a hint when they look like milliseconds."""
    onset, duration = _timing_values(ev, k)
    run_end = n_scans * t_r
    span = f"bold_imgs[{k}] lasts {n_scans} scans x t_r={t_r:g} s = {run_end:g} s"
    late = onset >= run_end
    if late.any():
        # in ms, all but onsets < run_end ms fall after the end; /1000 they fit
        if late.mean() > 0.5 and onset.max() / 1000 < run_end:
            hint = "onsets look like milliseconds: BIDS onsets are in seconds, divide by 1000"
        else:
            hint = f"check t_r and that events[{k}] belongs to bold_imgs[{k}]"
        raise ValueError(f"events[{k}]: {int(late.sum())} event(s) start at or after the "
                         f"end of the run ({span}): {_rows(late, onset)}; {hint}.")
    over = onset + duration > run_end * (1 + 1e-9)
    if over.any():
        if duration.max() > run_end and (duration / 1000).max() < run_end:
            hint = ("durations look like milliseconds: BIDS durations are in seconds, "
                    "divide by 1000")
        else:
            hint = (f"if the scan stopped before they ended, shorten their duration to "
                    f"end at {run_end:g} s")
        rows = _rows(over, onset + duration, "onset + duration")
        raise ValueError(f"events[{k}]: {int(over.sum())} event(s) end after the end of "
                         f"the run ({span}): {rows}; {hint}.")
    return onset, duration


def _check_inputs(runs, evs, t_r, confounds):
    """Validate run/events/confounds counts and ``t_r``; return each run's number of scans."""
    from .adapters.nifti import _load

    if len(evs) != len(runs):
        raise ValueError(f"{len(runs)} BOLD run(s) but {len(evs)} events table(s): pass one "
                         "events table per run, in the same order.")
    check("t_r", t_r)
    if confounds is not None and len(confounds) != len(runs):
        raise ValueError(f"{len(runs)} run(s) but {len(confounds)} confounds table(s).")
    n_scans, grids = [], []
    for r, run in enumerate(runs):
        if isinstance(run, (list, tuple)):      # one run given as a list of 3D images
            img = _run_of_volumes(run, r)
        else:                                   # header only: nilearn reads the data
            img = _load(run, f"bold_imgs[{r}]", read=False)
            _check_header_tr(img, float(t_r), r)
        shape = img.shape
        if len(shape) != 4:
            raise ValueError(f"bold_imgs[{r}] has shape {shape}: each BOLD run must be a 4D "
                             "image (x, y, z, scans).")
        n_scans.append(int(shape[3]))
        grids.append((tuple(shape[:3]), np.asarray(img.affine)))
        if not (grids[r][0] == grids[0][0] and np.allclose(grids[r][1], grids[0][1],
                                                            atol=1e-4)):
            raise ValueError(
                f"bold_imgs[{r}] is on another grid than bold_imgs[0] (shape {shape[:3]} vs "
                f"{grids[0][0]}, or another affine): the runs' betas must share one grid. "
                "Resample the runs to one grid first (e.g. nilearn.image.resample_to_img), "
                "or realign them in preprocessing.")
    if confounds is not None:
        for r, (table, n) in enumerate(zip(confounds, n_scans)):
            rows = (len(table) if isinstance(table, (pd.DataFrame, np.ndarray))
                    else None)                  # a file: nilearn reads and checks it
            if rows is not None and rows != n:
                raise ValueError(f"confounds[{r}] has {rows} rows but bold_imgs[{r}] has "
                                 f"{n} scans: give one confounds row per scan of its run.")
    return n_scans


def _run_of_volumes(volumes, r):
    """One run given as a list of 3D images, checked to share one grid."""
    from nilearn.image import load_img

    from .adapters.nifti import _load

    loaded = [_load(v, f"bold_imgs[{r}][{k}]", read=False) for k, v in enumerate(volumes)]
    for k, img in enumerate(loaded):
        if img.shape[:3] != loaded[0].shape[:3] or not np.allclose(img.affine,
                                                                   loaded[0].affine,
                                                                   atol=1e-4):
            raise ValueError(f"bold_imgs[{r}][{k}] (shape {img.shape}) is on another grid than "
                             f"bold_imgs[{r}][0] (shape {loaded[0].shape}): the volumes of a "
                             "run must share one grid.")
    return load_img(volumes)


def _check_header_tr(img, t_r, r):
    """Warn when the run's header gives another repetition time than ``t_r`` (onsets in
    seconds would then be placed at the wrong scans).

    The header's time is ``pixdim[4]`` (``get_zooms()[3]``) in its time unit; with the unit
    unset (``xyzt_units`` 0, common) it is read as seconds, as the NIfTI tools write it,
    except the value 1 that nibabel and others write when they know no TR."""
    header = getattr(img, "header", None)
    if header is None or not hasattr(header, "get_zooms") or len(header.get_zooms()) < 4:
        return
    tr = float(header.get_zooms()[3])
    unit = header.get_xyzt_units()[1] if hasattr(header, "get_xyzt_units") else "sec"
    tr = tr / 1000.0 if unit == "msec" else tr / 1e6 if unit == "usec" else tr
    unset = unit == "unknown"
    if unset and tr == 1.0:         # the placeholder of a header that knows no TR
        return
    if tr > 0 and unit in ("sec", "msec", "usec", "unknown") and abs(tr - t_r) > 0.01 * t_r:
        warn_user(f"t_r={t_r:g} s, but the header of bold_imgs[{r}] gives a repetition "
                  f"time of {tr:g} s"
                  f"{' (its time unit is unset: read as seconds)' if unset else ''}; "
                  f"t_r={t_r:g} s is used, and events would be placed at the wrong scans if "
                  "it is wrong. Check the acquisition's TR (BIDS: RepetitionTime in the "
                  "bold.json sidecar).")


def _feature_columns(evs, feature_cols):
    """Feature columns (all non-timing columns by default); whether they were explicit."""
    columns = list(dict.fromkeys(c for ev in evs for c in ev.columns))
    explicit = feature_cols is not None
    if feature_cols is None:
        feature_cols = [c for c in columns if c not in _TIMING]
    else:
        feature_cols = [feature_cols] if isinstance(feature_cols, str) else list(feature_cols)
        bad = [c for c in feature_cols if c in _TIMING or c not in columns]
        if bad:
            raise ValueError(f"feature_cols {bad} are not feature columns of the events "
                             f"(columns: {columns}; onset/duration are timing, not features).")
    for k, ev in enumerate(evs):
        missing = [c for c in feature_cols if c not in ev.columns]
        if missing:
            raise ValueError(f"events[{k}] lacks the feature column(s) {missing} that other "
                             "runs have; every run needs the same columns.")
    return feature_cols, explicit, columns


def _trial_regressors(evs, feature_cols):
    """LSA: one regressor per event row.

    Returns nilearn events per run (internal regressor names, no clash with drift or
    confound columns), the feature table, the regressor names and what each one is.
    """
    if not feature_cols:
        raise ValueError("the events have no feature column besides onset/duration; add "
                         "e.g. a 'trial_type' column or pass feature_cols.")
    nl_events, index, labels = [], [], {}
    for r, ev in enumerate(evs):
        names = [f"mlem_r{r:03d}_t{k:05d}" for k in range(len(ev))]
        nl_events.append(pd.DataFrame({"onset": ev["onset"], "duration": ev["duration"],
                                       "trial_type": names}))
        index.extend((r, k) for k in range(len(ev)))
        labels.update((name, f"the trial in row {k} (onset {ev['onset'].iloc[k]:g} s)")
                      for k, name in enumerate(names))
    table = pd.concat([ev[feature_cols] for ev in evs], ignore_index=True)
    table.index = pd.MultiIndex.from_tuples(index, names=["run", "trial"])
    return nl_events, table, list(labels), labels


def _condition_table(allev, conds, condition_col, feature_cols, explicit):
    """One row per condition: the feature columns that are constant within conditions."""
    cols = list(dict.fromkeys([condition_col] + feature_cols))
    keep = []
    for c in cols:
        constant = allev.groupby(condition_col, sort=False)[c].nunique(dropna=False) <= 1
        if constant.all():
            keep.append(c)
        elif explicit:
            raise ValueError(f"feature column {c!r} varies within a condition of "
                             f"{condition_col!r}; with model='condition' every feature "
                             "must be constant within a condition. Use model='trial' or "
                             "drop the column from feature_cols.")
        else:
            logger.info("trial_images: column %r varies within conditions; left out of "
                        "the condition table", c)
    if not explicit or condition_col in feature_cols:
        cols_out = keep
    else:
        cols_out = [c for c in keep if c != condition_col]
    first = allev.drop_duplicates(condition_col).set_index(condition_col)
    table = pd.DataFrame({c: [c_ if c == condition_col else first.loc[c_, c]
                              for c_ in conds] for c in cols_out})
    table.index = pd.Index(conds, name="condition")
    return table


def _condition_regressors(evs, condition_col, feature_cols, explicit, columns):
    """One regressor per value of ``condition_col`` (same returns as _trial_regressors)."""
    if condition_col not in columns:
        raise ValueError(f"condition_col={condition_col!r} is not a column of the events "
                         f"(columns: {columns}).")
    allev = pd.concat(evs, ignore_index=True)
    if allev[condition_col].isna().any():
        raise ValueError(f"the condition column {condition_col!r} has missing values; "
                         "every trial needs a condition.")
    conds = list(pd.unique(allev[condition_col]))
    try:
        conds = sorted(conds)
    except TypeError:
        pass
    code = {c: f"mlem_c{k:04d}" for k, c in enumerate(conds)}
    nl_events = [pd.DataFrame({"onset": ev["onset"], "duration": ev["duration"],
                               "trial_type": ev[condition_col].map(code)}) for ev in evs]
    table = _condition_table(allev, conds, condition_col, feature_cols, explicit)
    labels = {code[c]: f"condition {condition_col}={c!r}" for c in conds}
    return nl_events, table, [code[c] for c in conds], labels


def _trial_standardize(standardize, model):
    """``standardize`` of :func:`trial_images` resolved to ``"run"`` or ``None`` (betas);
    a bool keeps its earlier meaning (``FirstLevelModel``'s, handled by the caller)."""
    if isinstance(standardize, (bool, np.bool_)):
        return None
    if isinstance(standardize, str) and standardize == "auto":
        return "run" if model == "trial" else None
    standardize = check_standardize(standardize, ("auto", *STANDARDIZE))
    if standardize == "run" and model != "trial":
        raise ValueError("standardize='run' needs model='trial': model='condition' gives "
                         "one image per condition averaged over the runs, so no run is left "
                         "to z-score within.  With model='trial' each event (e.g. each "
                         "block of a condition) has its own image per run.")
    return standardize


def _check_run_sizes(sizes):
    """Refuse, before any GLM is fitted, runs with a single trial to z-score."""
    single = [r for r, n in enumerate(sizes) if n < 2]
    if single:
        raise ValueError(f"standardize='run' z-scores each voxel across the trials of a "
                         f"run, but events{single} hold a single trial: its standard "
                         "deviation is undefined.  Pass standardize=None (raw betas), or "
                         "drop or merge those runs.")


def _zscore_img(imgs, runs):
    """The 4D image ``imgs`` z-scored within run along its 4th axis (see zscore_runs)."""
    import nibabel as nib

    data = np.asanyarray(imgs.dataobj)
    dtype = data.dtype if np.issubdtype(data.dtype, np.floating) else np.float64
    Z = zscore_runs(data.reshape(-1, data.shape[3]).T, np.asarray(runs), "the beta images")
    return nib.Nifti1Image(Z.T.reshape(data.shape).astype(dtype), imgs.affine, imgs.header)


def _check_regressors(glm, nl_events, n_scans, labels):
    """Refuse a regressor of interest that is (numerically) zero in its run's design.

    The regressors are built as nilearn's ``FirstLevelModel`` builds them (same frame
    times, HRF, FIR delays, minimum onset), without drifts or confounds, which do not
    change them; this costs no voxel data, so it runs before the GLM is fitted.
    """
    from nilearn.glm.first_level import make_first_level_design_matrix

    start = (glm.slice_time_ref or 0.0) * glm.t_r
    for r, (ev, n) in enumerate(zip(nl_events, n_scans)):
        frame_times = start + glm.t_r * np.arange(n)
        with warnings.catch_warnings():     # nilearn's fit repeats any warning below
            warnings.simplefilter("ignore")
            design = make_first_level_design_matrix(
                frame_times, ev, hrf_model=glm.hrf_model, drift_model=None,
                fir_delays=[0] if glm.fir_delays is None else glm.fir_delays,
                min_onset=glm.min_onset)
        names = list(pd.unique(ev["trial_type"]))
        _check_distinct(design, names, labels, r)
        peak = {name: np.abs(design.loc[:, [c for c in design.columns if c == name or
                                             c.startswith(name + "_")]].to_numpy()).max()
                for name in names}
        top = max(peak.values())
        null = [name for name in names if not peak[name] > _NULL_REGRESSOR * top]
        if null:
            what = "; ".join(labels[name] for name in null[:5])
            raise ValueError(
                f"events[{r}]: the regressor of {what} is zero in the design matrix of run "
                f"{r} (largest |value| {peak[null[0]]:.2g}, vs {top:.2g} for the run's "
                f"largest regressor): its response falls outside the {n} scans, so its beta "
                "would be meaningless. Check the onsets (seconds from the first scan) and "
                "t_r, or drop the event.")


def _check_distinct(design, names, labels, r):
    """Refuse two regressors of interest that are (nearly) the same column: events with
    the same onset and duration get betas that are not estimable apart (nilearn's
    singular-design warning, which its fit repeats, is otherwise all that says so)."""
    cols = [c for c in names if c in design.columns]
    if len(cols) < 2:
        return
    X = design[cols].to_numpy(dtype=float)
    X = X - X.mean(axis=0)
    norm = np.linalg.norm(X, axis=0)
    ok = norm > 0
    C = (X[:, ok].T @ X[:, ok]) / np.outer(norm[ok], norm[ok])
    np.fill_diagonal(C, 0)
    a, b = np.unravel_index(np.argmax(C), C.shape)
    if C[a, b] > _TWIN_REGRESSORS:
        kept = [c for c, k in zip(cols, ok) if k]
        raise ValueError(
            f"events[{r}]: the regressors of {labels[kept[a]]} and {labels[kept[b]]} are the "
            f"same (correlation {C[a, b]:.4f}; e.g. the same onset and duration): their "
            "betas cannot be estimated apart. Merge the two events, fix their timing, or "
            "use model='condition'.")


def _fit_maps(glm, runs, nl_events, confounds, regressors):
    """Fit the GLM and return the effect-size map of each regressor of interest."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Mm]atrix is singular.*")
        # nilearn's masker notes that the given mask_img wins over mask computation
        warnings.filterwarnings("ignore", message=".*a mask was given at masker creation.*")
        glm.fit(runs, events=nl_events, confounds=confounds)
    designs = glm.design_matrices_
    maps = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Contrast for run .* is null")
        for name in regressors:
            con = [np.asarray(dm.columns == name, dtype=float) for dm in designs]
            if not any(c.any() for c in con):
                raise ValueError(f"regressor {name!r} is missing from every design matrix "
                                 "(an event outside the run's time span?).")
            maps.append(glm.compute_contrast(con if len(con) > 1 else con[0],
                                             output_type="effect_size"))
    return maps


@verbose
def trial_images(bold_imgs, events, t_r, mask_img=None, *, model="trial",
                 condition_col="trial_type", feature_cols=None, standardize="auto",
                 hrf_model="glover",
                 drift_model="cosine", high_pass=0.01, noise_model="ar1", smoothing_fwhm=None,
                 confounds=None, n_jobs=1, verbose=None, **glm_kwargs):
    """Beta images per trial or per condition from BOLD runs, with their feature table.

    A first-level GLM (nilearn's :class:`~nilearn.glm.first_level.FirstLevelModel`) is fitted
    to every run, and the effect size (beta) map of each regressor of interest is returned.

    * ``model="trial"``: least-squares-all (LSA): one regressor per row of the events
      tables, so one image per trial (runs in the given order, trials in each table's row
      order).  The feature table has the events' columns of those rows.
    * ``model="condition"``: one regressor per value of ``condition_col``; the effect is
      averaged over the runs in which the condition occurs (nilearn's fixed effects), so
      one image per condition.  Feature columns must be constant within a condition (by
      default, columns that are not are left out, with a log message).

    Parameters
    ----------
    bold_imgs : 4D image | list of 4D images
        BOLD runs (paths or nibabel images).
    events : DataFrame | path | list
        One BIDS-style events table (or ``events.tsv`` path) per run, with ``onset`` and
        ``duration`` in seconds plus any feature columns (``trial_type``...).
    t_r : float
        Repetition time in seconds.
    mask_img : 3D image | None | False
        Passed to ``FirstLevelModel`` (``None`` computes an EPI mask, ``False`` keeps every
        voxel).  Betas are 0 outside it.  A mask on another grid than the BOLD runs
        gives its grid to the betas: nilearn resamples the runs to it (e.g. a 1 mm
        anatomical mask turns 3 mm runs into 1 mm betas, 27 times the voxels).  To keep
        the BOLD voxels, resample the mask first:
        ``nilearn.image.resample_to_img(mask, run, interpolation="nearest")``.
    model : {"trial", "condition"}
    condition_col : str
        Column naming the condition (used by ``model="condition"``; a feature column by
        default).
    feature_cols : list of str | None
        Columns of the events that form the feature table.  Default: every column except
        ``onset`` and ``duration``.
    standardize : "auto" | "run" | None | bool
        ``"run"``: z-score each voxel's betas across the images of each run (mean 0,
        standard deviation 1 with ``ddof=1``; a voxel constant over a run becomes 0), so
        that what differs between runs (scanner drift, global signal, head position) does
        not dominate the distances between images.  Needs ``model="trial"`` and at least
        two images per run.  ``None``: the GLM's betas as they are.  ``"auto"``
        (default): ``"run"`` with ``model="trial"``, ``None`` with ``model="condition"``
        (its images average over runs).  On the Haxby data the held-out Spearman of a
        whole-brain region rises from about 0 with raw betas to about 0.09 with betas
        z-scored within run (``standardize`` in :doc:`/options`).  ``True`` / ``False``
        keep their earlier meaning: passed on to ``FirstLevelModel`` (``True``
        standardises each voxel's BOLD time series before the GLM), betas not z-scored.
    hrf_model, drift_model, high_pass, noise_model, smoothing_fwhm, n_jobs
        Passed to ``FirstLevelModel``.
    confounds : DataFrame | list of DataFrame | None
        Per-run confounds, passed to ``FirstLevelModel.fit``.
    verbose : bool | str | int | None
        Logging level for this call.
    **glm_kwargs
        Other ``FirstLevelModel`` parameters (``slice_time_ref``, ``signal_scaling``,
        ``minimize_memory``...).

    Returns
    -------
    imgs : Nifti1Image
        4D, one beta map per trial or condition (z-scored within run with
        ``standardize="run"``).
    table : DataFrame
        One row per image, in the same order: the feature columns.  Its index says where
        each image comes from: a ``(run, trial)`` MultiIndex (0-based run in
        ``bold_imgs``, row in that run's events) for ``model="trial"``, the condition
        (index named ``"condition"``) for ``model="condition"``.  To keep each run's
        images in one fold, pass ``groups=table.index.get_level_values("run")`` with an
        int ``cv`` (grouped k-fold, several runs held out per fold).  Avoid
        leave-one-run-out when every condition occurs once per run: all held-out pairs
        then differ in the condition, whose importance is 0 by construction.

    Raises
    ------
    ValueError
        Before any GLM is fitted, naming the run (``events[k]``) and the rows: onsets or
        durations missing (NaN, ``n/a``) or not numbers, negative durations, events that
        start before 0 s or end after the run (``n_scans * t_r`` s; onsets in
        milliseconds are recognised and said so), and regressors of interest whose design
        column is zero (their response falls after the last scan).  Also for BOLD files
        that are not readable images.

    Examples
    --------
    >>> from mlem_neuro.fmri import trial_images
    >>> runs = [f"sub-01/func/sub-01_run-{r}_bold.nii.gz" for r in (1, 2)]
    >>> events = [f"sub-01/func/sub-01_run-{r}_events.tsv" for r in (1, 2)]
    >>> imgs, table = trial_images(runs, events, t_r=2.0, mask_img="mask.nii.gz",
    ...                            feature_cols=["trial_type", "size"])   # doctest: +SKIP
    >>> res = mlem_neuro.mlem_searchlight(imgs, table, "mask.nii.gz")   # doctest: +SKIP
    """
    from nilearn.glm.first_level import FirstLevelModel
    from nilearn.image import concat_imgs

    check("model", model)
    if isinstance(standardize, (bool, np.bool_)):      # FirstLevelModel's, as before
        glm_kwargs["standardize"] = bool(standardize)
    standardize = _trial_standardize(standardize, model)
    runs = _as_list(bold_imgs)
    evs = [_read_events(ev, k) for k, ev in enumerate(_as_list(events))]
    confounds = None if confounds is None else _as_list(confounds)
    n_scans = _check_inputs(runs, evs, t_r, confounds)
    for k, (ev, n) in enumerate(zip(evs, n_scans)):
        onset, duration = _check_timing(ev, k, n, float(t_r))
        evs[k] = ev.assign(onset=onset, duration=duration)
    feature_cols, explicit, columns = _feature_columns(evs, feature_cols)
    if standardize == "run":
        _check_run_sizes([len(ev) for ev in evs])
    if model == "trial":
        nl_events, table, regressors, labels = _trial_regressors(evs, feature_cols)
    else:
        nl_events, table, regressors, labels = _condition_regressors(
            evs, condition_col, feature_cols, explicit, columns)
    glm = FirstLevelModel(t_r=float(t_r), hrf_model=hrf_model, drift_model=drift_model,
                          high_pass=high_pass, noise_model=noise_model,
                          smoothing_fwhm=smoothing_fwhm, mask_img=mask_img, n_jobs=n_jobs,
                          **glm_kwargs)
    _check_regressors(glm, nl_events, n_scans, labels)
    logger.info("trial_images: first-level GLM, %d run(s), %d regressor(s) of interest (%s)",
                len(runs), len(regressors), model)
    maps = _fit_maps(glm, runs, nl_events, confounds, regressors)
    imgs = concat_imgs(maps)
    if standardize == "run":
        imgs = _zscore_img(imgs, table.index.get_level_values("run"))
    return imgs, table
