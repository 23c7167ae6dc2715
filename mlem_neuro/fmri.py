"""From BOLD runs and BIDS-style events to one beta image per trial or condition + features.

:func:`trial_images` fits nilearn's :class:`~nilearn.glm.first_level.FirstLevelModel` and
returns the images and the matching feature table that :func:`mlem_neuro.mlem_searchlight`
and :func:`mlem_neuro.mlem_roi` take.
"""
from __future__ import annotations

import os
import warnings

import numpy as np
import pandas as pd

from .utils import check_option, logger, verbose

__all__ = ["trial_images"]

_TIMING = ("onset", "duration")


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


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


@verbose
def trial_images(bold_imgs, events, t_r, mask_img=None, *, model="trial",
                 condition_col="trial_type", feature_cols=None, hrf_model="glover",
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
        voxel).  Betas are 0 outside it.
    model : {"trial", "condition"}
    condition_col : str
        Column naming the condition (used by ``model="condition"``; a feature column by
        default).
    feature_cols : list of str | None
        Columns of the events that form the feature table.  Default: every column except
        ``onset`` and ``duration``.
    hrf_model, drift_model, high_pass, noise_model, smoothing_fwhm, n_jobs
        Passed to ``FirstLevelModel``.
    confounds : DataFrame | list of DataFrame | None
        Per-run confounds, passed to ``FirstLevelModel.fit``.
    verbose : bool | str | int | None
        Logging level for this call.
    **glm_kwargs
        Other ``FirstLevelModel`` parameters (``slice_time_ref``, ``standardize``,
        ``signal_scaling``, ``minimize_memory``...).

    Returns
    -------
    imgs : Nifti1Image
        4D, one beta map per trial or condition.
    table : DataFrame
        One row per image, in the same order: the feature columns.  Its index says where
        each image comes from: a ``(run, trial)`` MultiIndex (0-based run in
        ``bold_imgs``, row in that run's events) for ``model="trial"``, the condition
        (index named ``"condition"``) for ``model="condition"``.  For leave-one-run-out
        cross-validation of trial images, pass ``cv=list(LeaveOneGroupOut().split(table,
        groups=table.index.get_level_values("run")))``.

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

    check_option("model", model, ("trial", "condition"))
    runs = _as_list(bold_imgs)
    evs = [_read_events(ev, k) for k, ev in enumerate(_as_list(events))]
    if len(evs) != len(runs):
        raise ValueError(f"{len(runs)} BOLD run(s) but {len(evs)} events table(s): pass one "
                         "events table per run, in the same order.")
    if isinstance(t_r, bool) or not isinstance(t_r, (int, float, np.integer, np.floating)) \
            or not np.isfinite(t_r) or t_r <= 0:
        raise ValueError(f"t_r must be the repetition time in seconds (> 0); got {t_r!r}")
    if confounds is not None:
        confounds = _as_list(confounds)
        if len(confounds) != len(runs):
            raise ValueError(f"{len(runs)} run(s) but {len(confounds)} confounds table(s).")
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

    # nilearn events with internal regressor names (no clash with drift/confound columns)
    nl_events, rows = [], []
    if model == "trial":
        if not feature_cols:
            raise ValueError("the events have no feature column besides onset/duration; add "
                             "e.g. a 'trial_type' column or pass feature_cols.")
        for r, ev in enumerate(evs):
            names = [f"mlem_r{r:03d}_t{k:05d}" for k in range(len(ev))]
            nl_events.append(pd.DataFrame({"onset": ev["onset"], "duration": ev["duration"],
                                           "trial_type": names}))
            rows.extend((r, k, name) for k, name in enumerate(names))
        table = pd.concat([ev[feature_cols] for ev in evs], ignore_index=True)
        table.index = pd.MultiIndex.from_tuples([(r, k) for r, k, _ in rows],
                                                names=["run", "trial"])
        regressors = [name for _, _, name in rows]
    else:
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
        for ev in evs:
            nl_events.append(pd.DataFrame({"onset": ev["onset"], "duration": ev["duration"],
                                           "trial_type": ev[condition_col].map(code)}))
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
        regressors = [code[c] for c in conds]

    glm = FirstLevelModel(t_r=float(t_r), hrf_model=hrf_model, drift_model=drift_model,
                          high_pass=high_pass, noise_model=noise_model,
                          smoothing_fwhm=smoothing_fwhm, mask_img=mask_img, n_jobs=n_jobs,
                          **glm_kwargs)
    logger.info("trial_images: first-level GLM, %d run(s), %d regressor(s) of interest (%s)",
                len(runs), len(regressors), model)
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
    return concat_imgs(maps), table
