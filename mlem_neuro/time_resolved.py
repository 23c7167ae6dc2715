"""Time-resolved MLEM: feature-importance time courses from epochs or trial arrays.

One MLEM model per time point, all trained together: the data ``(n_trials, n_channels,
n_times)`` become a stack ``Y`` of shape ``(n_times, n_trials, n_channels)``, the neural
distances between trials at every time point come from Gram products
(:class:`~mlem_neuro.core.rdms.sources.DenseRDMSource`), and :func:`~mlem_neuro.crossval.run_cv`
trains every time point of a fold as one batched stack (in memory-bounded chunks, spread
over ``n_jobs`` with joblib), then scores and permutes on pairs of held-out trials.

Each trial is a stimulus: folds split trials, and the feature table has one row per trial.
With ``items=``, the trials of each item are averaged first (:mod:`mlem_neuro.items`): the
items are then the stimuli, the folds split items and the pairs are between items.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from ._docs import fill_doc
from .adapters.epochs import epochs_data, epochs_feature_table, per_epoch
from .core.checks import check
from .core.options import CROSSVALIDATED_DISTANCES, MLEMOptions
from .core.rdms.sources import CondensedRDMSource, DenseRDMSource
from .core.stimuli.features import as_feature_table
from .crossval import groups_from_table, result_settings, result_tests
from .inference import run_analysis
from .items import check_items, check_partitions, trial_partitions
from .results.timecourse import TimeCourseResult
from .times import check_window, time_mask, window_average
from .utils import check_real, logger, normalise_magnitude, verbose


def _check_data(data):
    check_real(data, "data")
    try:
        data = np.asarray(data, dtype=float)
    except (TypeError, ValueError):
        raise TypeError("data must be a numeric array (n_trials, n_channels, n_times); got "
                        f"{type(data).__name__}") from None
    if data.ndim != 3:
        raise ValueError("data must be 3-D (n_trials, n_channels, n_times); got shape "
                         f"{data.shape}. For one channel use data[:, None, :].")
    n, C, T = data.shape
    if n < 3:
        raise ValueError(f"MLEM needs at least 3 trials (pairs of trials are compared); got {n}.")
    if C < 1 or T < 1:
        raise ValueError(f"data has no channel or no time sample (shape {data.shape}).")
    if not np.isfinite(data).all():
        bad = int((~np.isfinite(data)).sum())
        raise ValueError(f"data hold {bad} NaN or infinite values; drop or interpolate them "
                         "first.")
    return data


def _check_times(times, sfreq, n_times):
    if sfreq is not None:
        sfreq = check("sfreq", sfreq)
    if times is None:
        if sfreq is None:
            return np.arange(n_times, dtype=float), None
        return np.arange(n_times) / sfreq, sfreq
    times = np.asarray(times, dtype=float)
    if times.shape != (n_times,):
        raise ValueError(f"times must have one value per time sample ({n_times}); got shape "
                         f"{times.shape}.")
    if not np.isfinite(times).all() or (n_times > 1 and np.any(np.diff(times) <= 0)):
        raise ValueError("times must be finite and strictly increasing (seconds).")
    if sfreq is None and n_times > 1:
        dt = np.diff(times)
        if np.allclose(dt, dt.mean(), rtol=1e-3, atol=0):
            # 9 significant digits: times built as k / sfreq give sfreq back exactly, so
            # sample counts derived from it (window, decim) do not depend on float noise
            sfreq = float(f"{1.0 / dt.mean():.9g}")
    elif sfreq is not None and n_times > 1 and not np.allclose(
            np.diff(times), 1.0 / sfreq, rtol=1e-3, atol=0):
        raise ValueError(f"times are not spaced by 1 / sfreq = {1.0 / sfreq:g} s.")
    return times, sfreq


@dataclass
class ArrayInputs:
    """The checked inputs of an array entry point (:func:`array_inputs`)."""

    data: np.ndarray
    table: pd.DataFrame
    groups: object
    times: np.ndarray
    sfreq: object
    window: object
    ch_names: object
    in_seconds: bool
    tmin: object
    tmax: object

    def crop(self, data, decim, scale):
        """``data`` averaged in the window, kept between ``tmin`` and ``tmax`` every
        ``decim`` samples: ``(data, times, settings)``, the settings every time-resolved
        result records."""
        keep = time_mask(self.times, self.sfreq, self.tmin, self.tmax, decim,
                         window=self.window)
        if self.window is not None:
            data = window_average(data, self.sfreq, self.window)
        settings = dict(window=self.window, scale=bool(scale),
                        sfreq=None if self.sfreq is None else self.sfreq / int(decim),
                        times_in_seconds=self.in_seconds, tmin=self.tmin, tmax=self.tmax,
                        decim=int(decim))
        return np.ascontiguousarray(data[..., keep]), self.times[keep], settings


def array_inputs(data, features, times, sfreq, ch_names, tmin, tmax, window, groups):
    """The checks of an array of trials ``(n_trials, n_channels, n_times)`` and its
    feature table shared by :func:`mlem_array` and :func:`mlem_neuro.rsa.rsa_array`:
    the data, the times (in seconds with ``times`` or ``sfreq``, else sample numbers), the
    window, the channel names, one feature row per trial and the groups (a column name
    or one label per trial)."""
    data = _check_data(data)
    n, C, T = data.shape
    in_seconds = times is not None or sfreq is not None
    if not in_seconds and (tmin is not None or tmax is not None):
        raise ValueError("tmin and tmax are in seconds, but without times= or sfreq= the "
                         "samples are numbered 0, 1, ...: pass times= or sfreq= (or crop "
                         "the array yourself).")
    times, sfreq = _check_times(times, sfreq, T)
    window = check_window(window, sfreq)
    if ch_names is not None:
        ch_names = [str(c) for c in ch_names]
        if len(ch_names) != C:
            raise ValueError(f"ch_names has {len(ch_names)} names for {C} channels.")
    table = as_feature_table(features, name="features")
    if len(table) != n:
        raise ValueError(f"the feature table has {len(table)} rows but data hold {n} trials; "
                         "pass one row per trial, in the same order.")
    groups, table = groups_from_table(groups, table)
    return ArrayInputs(data, table, groups, times, sfreq, window, ch_names, in_seconds,
                       tmin, tmax)


def _scale_channels(data):
    """Zero mean, unit variance per channel over trials and times (flat channels: centred)."""
    mean = data.mean(axis=(0, 2), keepdims=True)
    std = data.std(axis=(0, 2), keepdims=True)
    flat = std[0, :, 0] == 0
    if flat.any():
        logger.warning("scale: %d flat channel(s) (zero variance) are left at 0",
                       int(flat.sum()))
    return (data - mean) / np.where(std > 0, std, 1.0)


def _fit(data, table, times, ch_names, *, settings, options, groups, items=None,
         partitions=None):
    """Validated data (trials, channels, times) + table → TimeCourseResult (with
    ``items``, an :class:`~mlem_neuro.items.Items`: on the items' mean trials, or with a
    cross-validated distance on their trials' partitions)."""
    data = normalise_magnitude(data, "data")
    n, C, T = data.shape
    if len(table) != n:
        raise ValueError(f"the feature table has {len(table)} rows but there are {n} trials; "
                         "pass one row per trial (epoch), in the same order.")
    if items is not None:
        table = items.reduce_table(table)
        groups = items.reduce_groups(groups)
    if settings.get("scale", False):
        # over trials, before the items are averaged: scaled over item means, channels
        # carrying the items' differences would be shrunk (measured on
        # benchmarks/bench_items.py's design: held-out rho 0.756 scaled over items,
        # 0.823 over trials, 0.831 unscaled)
        data = _scale_channels(data)
    if options.distance in CROSSVALIDATED_DISTANCES:
        source, extra = _crossvalidated_source(data, items, partitions, options)
        settings = {**settings, **items.settings(), **extra}
    else:
        if items is not None:
            data = items.average(data)
            settings = {**settings, **items.settings()}
        source = DenseRDMSource(data.transpose(2, 0, 1), options.distance)  # (T, n, C)
    logger.info("MLEM time course: %d stimuli, %d channels, %d time points, features %s",
                source.n_stimuli, C, T, list(table.columns))
    out = run_analysis(source, table, options, groups=groups, desc="time points")
    settings = result_settings(options, out, groups, n_trials=n, n_channels=C, **settings)
    res = TimeCourseResult(fold_importance=out.importance, fold_score=out.score,
                           fold_weights=out.W, n_iter=out.n_iter, terms=out.terms,
                           feature_names=out.feature_names, settings=settings, times=times,
                           ch_names=ch_names,
                           fold_importance_perm_std=out.importance_perm_std,
                           converged=out.converged, **result_tests(out))
    if res.pvalues is not None:
        logger.info("MLEM tests (%d null permutations): FWE-significant time points %s",
                    options.n_null, {t: int((res.pvalues_fwe[:, k] < 0.05).sum())
                                     for k, t in enumerate(res.tests)})
    logger.info("MLEM time course done: peak %s score %.3f at t = %.3f", res.score_kind,
                float(np.max(res.score)), float(times[int(np.argmax(res.score))]))
    return res


def _crossvalidated_source(data, items, partitions, options):
    """Cross-validated distances between the items, per time point, from their trials
    ``data (n_trials, channels, times)``; the source and the settings it adds."""
    from .core.rdms.crossdist import crossval_sq_distances

    partitions = trial_partitions(partitions, items, options.distance, options.random_state)
    noise = "ledoit-wolf" if options.distance == "crossnobis" else None
    d2 = crossval_sq_distances(data.transpose(2, 0, 1), items.inverse_, partitions,
                               noise=noise)
    K = int(len(np.unique(partitions)))
    logger.info("%s distances between %d items from %d partitions of their trials",
                options.distance, items.n_items, K)
    return CondensedRDMSource(d2), dict(n_partitions=K)


@verbose
@fill_doc
def mlem_array(data, features, times=None, sfreq=None, ch_names=None, *, tmin=None,
               tmax=None, decim=1, window=None, scale=True, groups=None, items=None,
               partitions=None, cv=2, n_repeats="auto", n_permutations=10, n_null=0,
               null="conditional", feature_test="staged", held_out_pairs="auto",
               level="feature", constraint="spd",
               interactions=True,
               feature_kinds=None, feature_groups=None,
               missing_distance=0.0, distance="euclidean", max_steps=1000, patience="auto",
               lr="auto", tol=1e-4, batch_size="auto", numeric_levels="auto",
               chunk_size=None, n_jobs=None,
               device="cpu", backend="auto", random_state=None, verbose=None):
    """Time-resolved MLEM on an array of trials (ECoG, intracranial, any sensor array).

    Parameters
    ----------
    data : array (n_trials, n_channels, n_times)
        The trials: each is a stimulus, or with ``items`` a trial of an item.
    features : DataFrame | array (n_trials, n_features)
        The trials' theoretical features, one row per trial (see :class:`mlem_neuro.MLEM`
        for how columns are compared).
    times : array (n_times,) | None
        Time of each sample in seconds.  Default: ``arange(n_times) / sfreq``, or sample
        indices when ``sfreq`` is also None.
    sfreq : float | None
        Sampling rate in Hz (needed for ``window`` when ``times`` is not given).
    ch_names : list of str | None
        Channel names, kept on the result.
    %(tmin)s
    %(tmax)s
    %(decim)s
    %(window)s
    %(scale)s
    %(groups_trials)s
    %(items)s
    %(partitions)s
    %(cv_trials)s
    %(n_repeats)s
    %(n_permutations)s
    %(n_null)s
    %(null)s
    %(feature_test)s
    %(held_out_pairs)s
    %(level)s
    %(constraint)s
    %(interactions)s
    %(feature_kinds)s
    %(feature_groups)s
    %(missing_distance)s
    %(distance_trials)s
    %(max_steps)s
    %(patience)s
    %(lr)s
    %(tol)s
    %(batch_size)s
    %(numeric_levels)s
    %(chunk_size_time)s
    %(n_jobs)s
    %(device)s
    %(backend)s
    %(random_state)s
    %(verbose)s

    Returns
    -------
    TimeCourseResult
        ``.importance`` (n_times × n_terms, fold mean), ``.importance_fold_std``, ``.score``,
        ``.weights``, ``.to_data_frame()``, ``.to_evoked()``, ``.plot()``, ``.save()``.

    See Also
    --------
    mlem_epochs : the same from :class:`mne.Epochs`.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> side = rng.integers(0, 2, 40)
    >>> data = rng.standard_normal((40, 6, 12))
    >>> data[:, :3, 6:] += 3 * side[:, None, None]          # "side" encoded from sample 6
    >>> res = mlem_array(data, pd.DataFrame({"side": side.astype(bool),
    ...                                      "noise": rng.integers(0, 2, 40).astype(bool)}),
    ...                  sfreq=100.0, cv=3, max_steps=50, random_state=0)
    >>> res.importance.shape                 # one column per feature
    (12, 2)
    >>> bool(res.importance[6:, 0].mean() > res.importance[:6, 0].mean())
    True
    """
    options = MLEMOptions.from_call(locals())
    arr = array_inputs(data, features, times, sfreq, ch_names, tmin, tmax, window, groups)
    data, table, groups, n = arr.data, arr.table, arr.groups, arr.data.shape[0]
    items = check_items(items, n, table)
    partitions, part_col = check_partitions(partitions, options.distance, items, n, table)
    if items is not None:
        table = items.drop_from(table)
    if part_col is not None and part_col in table.columns:
        table = table.drop(columns=part_col)          # an identifier, not a feature
    data, times, settings = arr.crop(data, decim, scale)
    ch_names = arr.ch_names
    settings["partitions"] = part_col
    return _fit(data, table, times, ch_names, settings=settings, options=options,
                groups=groups, items=items, partitions=partitions)


@verbose
@fill_doc
def mlem_epochs(epochs, features=None, picks=None, tmin=None, tmax=None, decim=1, *,
                window=None, scale=True, groups=None, items=None, partitions=None, cv=2,
                n_repeats="auto", n_permutations=10, n_null=0,
                null="conditional", feature_test="staged", held_out_pairs="auto",
                spatial_radius=None,
                level="feature", constraint="spd", interactions=True, feature_kinds=None,
                feature_groups=None, missing_distance=0.0, distance="euclidean",
                max_steps=1000, patience="auto",
                lr="auto", tol=1e-4, batch_size="auto", numeric_levels="auto",
                chunk_size=None, n_jobs=None,
                device="cpu", backend="auto", random_state=None, verbose=None):
    """Time-resolved MLEM on MEG/EEG epochs: feature-importance time courses.

    Each epoch is a stimulus (with ``items``, each item is: its epochs are averaged).  The
    caller's ``epochs`` are never modified.

    Parameters
    ----------
    epochs : mne.Epochs
        The trials.  Non-preloaded epochs are read through a copy (bad epochs dropped).
    features : None | str | list of str | DataFrame
        ``None``: ``epochs.metadata`` when present (every column is a feature but those
        that ``groups``, ``items`` and ``partitions`` name), else the table of
        :func:`mlem_neuro.features_from_events` (``/``-tagged event names).
        Column name(s) of ``epochs.metadata``.  Or a DataFrame with one row per epoch (or
        one per original event, aligned with ``epochs.selection`` so that dropped epochs
        stay matched to their rows).
    picks : str | list | slice | None
        Channels, as in MNE (names, types such as ``"eeg"``, indices); ``None``: the good
        data channels.
    %(tmin)s
    %(tmax)s
    %(decim)s
    %(window)s
    %(scale)s
    %(groups_epochs)s
    %(items_epochs)s
    %(partitions)s
    %(cv_trials)s
    %(n_repeats)s
    %(n_permutations)s
    %(n_null)s
    %(null)s
    %(feature_test)s
    %(held_out_pairs)s
    %(spatial_radius_sensors)s
    %(level)s
    %(constraint)s
    %(interactions)s
    %(feature_kinds)s
    %(feature_groups)s
    %(missing_distance)s
    %(distance_trials)s
    %(max_steps)s
    %(patience)s
    %(lr)s
    %(tol)s
    %(batch_size)s
    %(numeric_levels)s
    %(chunk_size_time)s
    %(n_jobs)s
    %(device)s
    %(backend)s
    %(random_state)s
    %(verbose)s

    Returns
    -------
    TimeCourseResult | SensorMapResult
        A :class:`~mlem_neuro.results.SensorMapResult` with ``spatial_radius``.

    See Also
    --------
    mlem_array, features_from_events, mlem_neuro.stats.permutation_cluster_test

    Examples
    --------
    >>> res = mlem_neuro.mlem_epochs(epochs, features=["modality", "side"],
    ...                              tmin=-0.1, tmax=0.5, decim=2, random_state=0)
    ...                                                       # doctest: +SKIP
    >>> res.plot()                                            # doctest: +SKIP
    """
    options = MLEMOptions.from_call(locals())
    if spatial_radius is not None:
        spatial_radius = check("spatial_radius", spatial_radius)
    data, times, ch_names, work = epochs_data(epochs, picks=picks, tmin=tmin, tmax=tmax,
                                              decim=decim, window=window)
    table = epochs_feature_table(work, features)
    if len(table) != data.shape[0]:    # pragma: no cover - epochs_feature_table checks it
        raise ValueError(f"the feature table has {len(table)} rows but there are "
                         f"{data.shape[0]} epochs.")
    groups, items, partitions = (per_epoch(v, work, name) for v, name in (
        (groups, "groups"), (items, "items"), (partitions, "partitions")))
    sfreq = float(epochs.info["sfreq"])
    settings = dict(window=None if window is None else float(window), scale=bool(scale),
                    sfreq=sfreq / int(decim), decim=int(decim), picks=picks,
                    tmin=None if tmin is None else float(tmin),
                    tmax=None if tmax is None else float(tmax), times_in_seconds=True,
                    n_epochs=int(len(work)))
    if isinstance(groups, str):         # a metadata column names the groups
        column, groups = groups, _metadata_column(work, groups)
        if features is None and column in table.columns:
            # an identifier, not a feature (as the items and partitions columns)
            logger.info("groups: the column %r names the groups and is not a feature",
                        column)
            table = table.drop(columns=column)
    if spatial_radius is not None:
        from .spatial import check_spatial_items

        items, partitions, table, groups, part_col = check_spatial_items(
            items, partitions, options, table, groups, metadata=work.metadata)
        settings["partitions"] = part_col
        return _sensor_searchlight(_check_data(data), work, ch_names, table, times,
                                   spatial_radius, options, groups, settings, items,
                                   partitions)
    items = check_items(items, len(table), table, metadata=work.metadata)
    partitions, part_col = check_partitions(partitions, options.distance, items, len(table),
                                            table, metadata=work.metadata)
    if items is not None:
        table = items.drop_from(table)
    if part_col is not None and part_col in table.columns:
        table = table.drop(columns=part_col)          # an identifier, not a feature
    settings["partitions"] = part_col
    return _fit(_check_data(data), table, times, ch_names, settings=settings,
                options=options, groups=groups, items=items, partitions=partitions)


def _sensor_searchlight(data, epochs, ch_names, table, times, spatial_radius, options,
                        groups, settings, items=None, partitions=None):
    """``mlem_epochs`` with ``spatial_radius``: models per (time point, channel
    neighbourhood) (:func:`mlem_neuro.spatial.sensor_searchlight`; with ``items``, the
    channels are scaled over the trials, then the items averaged or compared across
    partitions)."""
    from mne import pick_info

    from .results.spacetime import _decimated_info
    from .spatial import sensor_searchlight

    info = pick_info(epochs.info, [epochs.ch_names.index(c) for c in ch_names])
    info = _decimated_info(info, settings["sfreq"])
    if settings["scale"]:
        data = _scale_channels(data)
    return sensor_searchlight(data, info, table, times, spatial_radius, options, groups,
                              settings, items, partitions)


def _metadata_column(epochs, name):
    if epochs.metadata is None or name not in epochs.metadata.columns:
        have = [] if epochs.metadata is None else list(epochs.metadata.columns)
        raise ValueError(f"groups={name!r} names no column of epochs.metadata (columns: "
                         f"{have}); pass a column name or one label per epoch.")
    return epochs.metadata[name].to_numpy()

