"""Spatial searchlights over time: MEG/EEG source space and sensor neighbourhoods.

* :func:`mlem_stcs`: one model per (time point, source-space patch) or per (time point,
  :class:`mne.Label`), from a list of source estimates (one per stimulus); importance as
  :class:`mne.SourceEstimate` objects (:class:`~mlem_neuro.results.SourceMapResult`).
* The sensor searchlight of :func:`mlem_neuro.mlem_epochs` (``spatial_radius``): one model
  per (time point, channel neighbourhood); importance topographies over time
  (:class:`~mlem_neuro.results.SensorMapResult`).

Both take ``items=`` (the trials of each item averaged, or with
``distance="cv_euclidean"`` compared across partitions of the trials:
:func:`crossval_spacetime_sq_distances`; :mod:`mlem_neuro.items` validates and reduces)
and reduce to data ``(n_stimuli, n_times, n_locations)`` and a sparse neighbourhood
membership ``(n_neighbourhoods, n_locations)`` (:mod:`mlem_neuro.adapters.stcs`,
:mod:`mlem_neuro.adapters.sensors`: MNE's source-space distances and channel
positions), which :class:`~mlem_neuro.core.rdms.spacetime.SpaceTimeRDMSource` turns into the
RDMs of every (time, neighbourhood) model for the shared driver
:func:`~mlem_neuro.crossval.run_cv`: the models of a fold are trained as batched stacks in
chunks of at most 1,000 models, each chunk holding only the (time, location) cells it
needs.
"""
from __future__ import annotations

import numpy as np

from ._docs import fill_doc
from .adapters.stcs import (
    check_spatial_radius,
    check_stcs,
    label_neighbourhoods,
    src_neighbourhoods,
    stcs_array,
)
from .core.options import CROSSVALIDATED_DISTANCES, MLEMOptions
from .core.rdms.sources import CondensedRDMSource
from .core.rdms.spacetime import SpaceTimeRDMSource
from .core.stimuli.features import as_feature_table
from .crossval import groups_from_table, result_settings, result_tests
from .inference import run_analysis
from .items import check_items, check_partitions, trial_partitions
from .results.spacetime import SensorMapResult, SourceMapResult
from .times import check_window, time_mask
from .utils import logger, verbose

__all__ = ["mlem_stcs"]


def run_spacetime(data, neighbourhoods, table, options, groups, desc, items=None,
                  partitions=None):
    """Cross-validated MLEM of every (time point, neighbourhood) model.

    Parameters
    ----------
    data : ndarray (n_trials, n_times, n_locations)
        One row per stimulus, or with ``items`` per trial.
    neighbourhoods : scipy.sparse matrix (n_neighbourhoods, n_locations)
    table : DataFrame
        One row per stimulus (per item with ``items``: reduced by
        :func:`check_spatial_items`).
    options : MLEMOptions
    groups : array-like | None
        One label per stimulus (per item with ``items``).
    desc : str
        What a neighbourhood is, for messages.
    items : Items | None
        The trials' items (:func:`~mlem_neuro.items.check_items`): their trials are
        averaged, or with a cross-validated distance compared across partitions.
    partitions : ndarray (n_trials,) | None
        Validated partitions (:func:`~mlem_neuro.items.check_partitions`).

    Returns
    -------
    out : CVOutput
        Models in time-major order (``t * n_neighbourhoods + s``).
    sizes : ndarray of int (n_neighbourhoods,)
        Locations per neighbourhood.
    extra : dict
        Settings the items add (``n_items``, ``item_labels``, ``n_partitions``...).
    """
    n, T, L = data.shape
    n_stimuli = n if items is None else items.n_items
    if items is not None and items.n_trials != n:
        raise ValueError(f"items label {items.n_trials} trials but there are {n}.")
    if len(table) != n_stimuli:
        raise ValueError(f"the feature table has {len(table)} rows but there are "
                         f"{n_stimuli} stimuli; pass one row per stimulus, in the same "
                         "order.")
    extra = {} if items is None else items.settings()
    sizes = np.diff(neighbourhoods.indptr)
    if options.distance in CROSSVALIDATED_DISTANCES:
        partitions = trial_partitions(partitions, items, options.distance,
                                      options.random_state)
        source = CondensedRDMSource(crossval_spacetime_sq_distances(
            data, neighbourhoods, items, partitions,
            crossnobis=options.distance == "crossnobis"))
        extra["n_partitions"] = int(len(np.unique(partitions)))
    else:
        if items is not None:
            data = items.average(data)
        source = SpaceTimeRDMSource(data, neighbourhoods, options.distance)
        source.check_patterns()
    logger.info("MLEM %s searchlight: %d stimuli, %d %s x %d time points = %d models, "
                "%d locations per neighbourhood (median; %d-%d)", desc, source.n_stimuli,
                neighbourhoods.shape[0], desc, T, neighbourhoods.shape[0] * T,
                int(np.median(sizes)), sizes.min(), sizes.max())
    return run_analysis(source, table, options, groups=groups,
                  desc="(time point, neighbourhood) models"), sizes, extra


def check_spatial_items(items, partitions, options, table, groups, metadata=None):
    """Validate ``items`` and ``partitions`` of a spatial searchlight before any data are
    read, and reduce the feature table and the groups to one row per item.

    Parameters
    ----------
    items, partitions
        As given by the user (:func:`~mlem_neuro.items.check_items`,
        :func:`~mlem_neuro.items.check_partitions`).
    options : MLEMOptions
    table : DataFrame
        One row per trial (source estimate, epoch).
    groups : array-like | None
        One label per trial.
    metadata : DataFrame | None
        ``epochs.metadata``, where column names are also looked up.

    Returns
    -------
    items : Items | None
    partitions : ndarray (n_trials,) | None
    table : DataFrame
        The features, one row per item (the items and partitions columns dropped).
    groups : ndarray | None
        One label per item.
    part_col : str | None
        The column ``partitions`` named.
    """
    n = len(table)
    items = check_items(items, n, table, metadata=metadata)
    partitions, part_col = check_partitions(partitions, options.distance, items, n, table,
                                            metadata=metadata)
    if items is not None:
        table = items.drop_from(table)
    if part_col is not None and part_col in table.columns:
        table = table.drop(columns=part_col)          # an identifier, not a feature
    if items is not None:
        table = items.reduce_table(table)
        groups = items.reduce_groups(groups)
    return items, partitions, table, groups, part_col


def crossval_spacetime_sq_distances(data, neighbourhoods, items, partitions,
                                    crossnobis=False):
    """Cross-validated squared Euclidean (or crossnobis) distances between items, for
    every (time point, neighbourhood) model.

    The models are the rows of the block-diagonal membership ``I_T ⊗ A`` over the (time,
    location) cells of ``data``, so one call of
    :func:`~mlem_neuro.core.rdms.crossdist.crossval_sq_distances_membership` gives them all
    (no loop over models); the time points are cut into blocks only to bound the memory
    of the partition means (:data:`~mlem_neuro.core.rdms.crossdist.CHUNK_BYTES` per block), and
    every block uses the same partitions, so the result does not depend on the blocks.

    Parameters
    ----------
    data : ndarray (n_trials, n_times, n_locations)
    neighbourhoods : scipy.sparse matrix (n_neighbourhoods, n_locations)
        0/1 membership.
    items : Items
    partitions : ndarray (n_trials,)
        The partition of each trial.
    crossnobis : bool
        Whiten each model's cells by their own shrunk noise covariance
        (:func:`~mlem_neuro.core.rdms.crossdist.crossnobis_membership`: each (time point,
        neighbourhood) row of the block-diagonal membership is one "sphere").

    Returns
    -------
    d2 : ndarray (n_times * n_neighbourhoods, n_pairs)
        Time-major (row ``t * n_neighbourhoods + s``); pairs of items in
        :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order.
    """
    import scipy.sparse as sp

    from .core.memory import check_memory
    from .core.rdms.crossdist import (
        CHUNK_BYTES,
        crossnobis_membership,
        crossval_sq_distances_membership,
    )

    n, T, L = data.shape
    A = sp.csr_matrix(neighbourhoods, dtype=np.float64)
    S, m = A.shape[0], items.n_items
    n_pairs = m * (m - 1) // 2
    K = int(len(np.unique(partitions)))
    check_memory(8 * T * S * n_pairs,
                 f"the cross-validated distances of {T * S:,} (time point, neighbourhood) "
                 f"models x {n_pairs:,} item pairs",
                 "keep fewer time points (tmin, tmax, decim, window) or neighbourhoods "
                 "(labels, a coarser source space, picks)")
    # a block's trials, partition means, their sum and a copy of them, per time point
    per_time = 8 * L * (2 * n + (2 * K + 2) * m)
    step = max(1, int(CHUNK_BYTES // per_time))
    out = np.empty((T * S, n_pairs))
    for t0 in range(0, T, step):
        t1 = min(T, t0 + step)
        block = sp.kron(sp.identity(t1 - t0, format="csr"), A, format="csr")
        distances = crossnobis_membership if crossnobis else crossval_sq_distances_membership
        out[t0 * S:t1 * S] = distances(data[:, t0:t1].reshape(n, -1), block, items.inverse_,
                                       partitions)
    logger.info("%s distances between %d items from %d partitions of their trials: %d "
                "(time point, neighbourhood) models in %d block(s) of time points",
                "crossnobis" if crossnobis else "cv_euclidean", m, K, T * S, -(-T // step))
    return out


@verbose
@fill_doc
def mlem_stcs(stcs, features, src=None, *, spatial_radius=None, labels=None, tmin=None,
              tmax=None, decim=1, window=None, groups=None, items=None, partitions=None,
              cv=2, n_repeats="auto",
              n_permutations=10, n_null=0,
              null="conditional", feature_test="staged", held_out_pairs="auto",
              level="feature", constraint="spd",
              interactions=True,
              feature_kinds=None, feature_groups=None, missing_distance=0.0,
              distance="euclidean", max_steps=1000, patience="auto", lr="auto", tol=1e-4,
              batch_size="auto", numeric_levels="auto", chunk_size=None, n_jobs=None,
              device="cpu", backend="auto", random_state=None, verbose=None):
    """MLEM over source space and time: importance maps as source estimates.

    At every time point, the source estimates' patterns within a patch (a searchlight of
    ``spatial_radius`` metres around each source point, or each label of ``labels``)
    give the neural distances between stimuli; one cross-validated MLEM model per (time
    point, patch) learns the metric over the feature distances, and the permutation
    importance of each feature (or term) on held-out pairs is mapped at the patch's
    centre (a label's value over the label's vertices).

    Parameters
    ----------
    stcs : list of mne.SourceEstimate | list of mne.VolSourceEstimate
        One source estimate per stimulus, or with ``items`` per trial (e.g. the output of
        :func:`mne.minimum_norm.apply_inverse_epochs`, or one per condition), all with
        the same vertices, times and subject.
    features : DataFrame | array (n_stimuli, n_features)
        The theoretical features, one row per estimate, in the same order (see
        :class:`mlem_neuro.MLEM` for how columns are compared).
    src : mne.SourceSpaces | None
        The source space of the estimates (needed with ``spatial_radius``; e.g.
        ``inverse_operator["src"]``).
    %(spatial_radius_src)s
    labels : list of mne.Label | None
        Non-overlapping cortical labels (surface estimates): one model per label and time
        point, over the label's vertices.  Give either ``labels`` or ``spatial_radius``.
    %(tmin)s
    %(tmax)s
    %(decim)s
    %(window)s
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
    %(distance_spatial)s
    %(max_steps)s
    %(patience)s
    %(lr)s
    %(tol)s
    %(batch_size)s
    %(numeric_levels)s
    chunk_size : int | None
        (time point, patch) models per engine call (default: at most 1,000, bounded by
        memory, and split over ``n_jobs``).  Results do not depend on it.
    %(n_jobs)s
    %(device)s
    %(backend)s
    %(random_state)s
    %(verbose)s

    Returns
    -------
    result : SourceMapResult
        ``importance_stc(term)``, ``score_stc()``, ``to_stcs()``, ``to_data_frame()``,
        ``peak(term)``, ``save``.

    Notes
    -----
    There are ``n_times × n_patches`` models (e.g. 50 time points × 8,196 sources = 409,800
    models); they are trained as batched stacks in chunks of at most 1,000 models (memory
    bounded by the chunk, whatever the number of time points), so the cost grows linearly
    with both.  Use ``tmin``/``tmax``/``decim`` (or ``window``) to keep the time points
    that matter, and a coarse source space.  The estimates are used as they are (no
    scaling): give noise-normalised estimates (dSPM, sLORETA) so that deep and
    superficial sources weigh alike.

    Examples
    --------
    >>> res = mlem_neuro.mlem_stcs(stcs, table[["animacy", "size"]], inv["src"],
    ...                            spatial_radius=0.01, tmin=0.0, tmax=0.5, decim=5,
    ...                            random_state=0)                     # doctest: +SKIP
    >>> res.importance_stc("animacy").plot(subjects_dir=subjects_dir)  # doctest: +SKIP
    """
    options = MLEMOptions.from_call(locals())
    if (spatial_radius is None) == (labels is None):
        raise ValueError("give either spatial_radius (a searchlight over source points, "
                         "in metres, with src) or labels (one model per mne.Label), not "
                         "both nor neither.")
    if spatial_radius is not None:
        spatial_radius = check_spatial_radius(spatial_radius)
        if src is None:
            raise ValueError("spatial_radius needs src, the mne.SourceSpaces the estimates "
                             "were computed on (e.g. inverse_operator['src']).")
    stcs, vertices, times, kind, subject, tstep = check_stcs(stcs)
    table = as_feature_table(features, name="features")
    if len(table) != len(stcs):
        raise ValueError(f"features has {len(table)} rows but stcs holds {len(stcs)} source "
                         "estimates; the table needs one row per estimate, in the same "
                         "order.")
    groups, table = groups_from_table(groups, table)
    items, partitions, table, groups, part_col = check_spatial_items(
        items, partitions, options, table, groups)
    sfreq = 1.0 / tstep
    window = check_window(window, sfreq)
    keep = time_mask(times, sfreq, tmin, tmax, decim, window=window)
    if labels is not None:
        A, names = label_neighbourhoods(labels, vertices, kind, subject)
        vertex_model = np.asarray(A.argmax(axis=0)).ravel()
        covered = np.asarray(A.sum(axis=0)).ravel() > 0
        # the result's estimates hold the labels' vertices only
        offsets = np.cumsum([0] + [len(v) for v in vertices])
        out_vertices = [v[covered[offsets[h]:offsets[h + 1]]] for h, v in enumerate(vertices)]
        vertex_model = vertex_model[covered]
        desc = "labels"
    else:
        A = src_neighbourhoods(src, vertices, kind, spatial_radius, n_jobs=n_jobs,
                               subject=subject)
        names, out_vertices, vertex_model, desc = None, vertices, None, "patches"
    data, times = stcs_array(stcs, keep, sfreq, window), times[keep]
    del stcs
    out, sizes, extra = run_spacetime(data, A, table, options, groups, desc, items,
                                      partitions)
    settings = result_settings(
        options, out, groups, analysis=f"source {desc}", spatial_radius=spatial_radius,
        n_stimuli=int(data.shape[0] if items is None else items.n_items),
        n_estimates=int(data.shape[0]), n_sources=int(data.shape[2]),
        median_patch_size=float(np.median(sizes)), tmin=tmin, tmax=tmax, decim=int(decim),
        window=window, tstep=tstep * int(decim), partitions=part_col, **extra)
    return SourceMapResult(out.importance, out.score, out.W, out.n_iter, out.terms,
                           out.feature_names, settings, times=times, vertices=out_vertices,
                           n_locations=A.shape[0], vertex_model=vertex_model, kind=kind,
                           subject=subject, label_names=names, **result_tests(out))


def sensor_searchlight(data, info, table, times, spatial_radius, options, groups,
                       settings, items=None, partitions=None):
    """The sensor searchlight of :func:`mlem_neuro.mlem_epochs` (``spatial_radius``).

    ``data`` ``(n_trials, n_channels, n_times)`` (scaled as asked), ``info`` that of the
    analysed channels at the analysed sampling rate; ``table``, ``groups``, ``items`` and
    ``partitions`` as :func:`check_spatial_items` returns them.
    """
    from .adapters.sensors import channel_neighbourhoods

    A = channel_neighbourhoods(info, spatial_radius)
    out, sizes, extra = run_spacetime(np.ascontiguousarray(data.transpose(0, 2, 1)), A,
                                      table, options, groups, "channels", items, partitions)
    settings = result_settings(options, out, groups, n_trials=int(data.shape[0]),
                               n_channels=int(data.shape[1]), spatial_radius=spatial_radius,
                               median_neighbourhood_size=float(np.median(sizes)),
                               **settings, **extra)
    return SensorMapResult(out.importance, out.score, out.W, out.n_iter, out.terms,
                           out.feature_names, settings, times=times, info=info,
                           **result_tests(out))

