"""MNE ``Epochs`` → trial × channel × time array, and the trials' feature table.

Two things come out of an :class:`mne.Epochs`: the data of the chosen channels and time
samples (:func:`epochs_data`), and a feature table with one row per kept epoch
(:func:`epochs_feature_table`), built from ``epochs.metadata``, from a table the user
passes, or from the event names (:func:`features_from_events`).

Event names follow MNE's ``/``-separated tags (``"auditory/left"``).  MNE treats the tags of
a name as an unordered set (``epochs["left"]`` selects every name with the tag ``left``);
here the tags become feature columns:

* when every name has the same number of tags and each tag only ever appears at one
  position (``"auditory/left"``, ``"visual/right"``...), each position is a categorical
  column (``tag0``, ``tag1``... or the ``names`` you pass, e.g. ``["modality", "side"]``);
* otherwise (names with different numbers of tags, or a tag that moves between positions)
  each tag becomes a boolean column, ``True`` for the epochs whose name carries it.

Columns that do not vary over the epochs carry no distance and are dropped.  Nothing in the
caller's ``Epochs`` is modified: non-preloaded epochs are read through a copy.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..core.stimuli.features import as_feature_table
from ..times import check_window, time_mask, window_average  # generic: mlem_neuro.times
from ..utils import check_real, logger, verbose


def _check_epochs(epochs):
    from mne import BaseEpochs

    if not isinstance(epochs, BaseEpochs):
        raise TypeError("epochs must be an mne.Epochs (or EpochsArray) instance; got "
                        f"{type(epochs).__name__}. For a plain (n_trials, n_channels, n_times) "
                        "array use mlem_neuro.mlem_array.")
    return epochs


def _readable(epochs):
    """Epochs whose data can be read without touching the caller's object.

    Reading non-preloaded epochs drops the bad ones *in place* (MNE updates ``drop_log``
    and ``selection``), so those are read through a copy, which holds no data yet.
    """
    if epochs.preload:
        return epochs
    work = epochs.copy()
    work.drop_bad(verbose=False)
    return work


def _epoch_event_names(epochs):
    inv = {}
    for name, code in epochs.event_id.items():
        inv.setdefault(int(code), name)
    codes = epochs.events[:, 2]
    unknown = sorted({int(c) for c in codes} - set(inv))
    if unknown:
        raise ValueError(f"event codes {unknown} of these epochs have no name in "
                         "epochs.event_id; name every event (event_id={'name': code}) or "
                         "pass a feature table.")
    return [inv[int(c)] for c in codes]


@verbose
def features_from_events(epochs, names=None, verbose=None):
    """Feature table built from the event names of epochs (``/``-separated tags).

    Parameters
    ----------
    epochs : mne.Epochs
        Epochs with named events (``event_id={"auditory/left": 1, ...}``).
    names : list of str | None
        Column names for the tag positions when tags sit in consistent positions (e.g.
        ``["modality", "side"]`` for ``"auditory/left"``).  Default: ``"event"`` for names
        with one tag, ``"tag0"``, ``"tag1"``... for several.
    verbose : bool | str | int | None
        Logging level for this call.

    Returns
    -------
    DataFrame
        One row per epoch (in the order of ``epochs.events``), one column per varying tag
        position (unordered :class:`pandas.Categorical` of the tags) or, when positions are
        inconsistent, one boolean
        column per tag.  ``attrs["layout"]`` is ``"positions"`` or ``"tags"``.

    Raises
    ------
    ValueError
        When the epochs hold a single condition (nothing varies), or when ``names`` does
        not match the number of tag positions.

    Notes
    -----
    Like MNE's tag-based selection, tags are compared as written (case-sensitive) and empty
    tags (``"a//b"``) are ignored.  Constant columns (a tag shared by every epoch) are
    dropped, as they carry no distance.

    Examples
    --------
    >>> import numpy as np, mne
    >>> info = mne.create_info(4, 100.0, "eeg")
    >>> events = np.array([[i * 10, 0, 1 + i % 4] for i in range(8)])
    >>> event_id = {"auditory/left": 1, "auditory/right": 2, "visual/left": 3,
    ...             "visual/right": 4}
    >>> epochs = mne.EpochsArray(np.zeros((8, 4, 5)), info, events, event_id=event_id,
    ...                          verbose=False)
    >>> features_from_events(epochs, names=["modality", "side"]).head(2)
       modality   side
    0  auditory   left
    1  auditory  right
    """
    _check_epochs(epochs)
    per_epoch = _epoch_event_names(epochs)
    if len(per_epoch) == 0:
        raise ValueError("these epochs hold no epoch (all were dropped?); nothing to model.")
    conds = list(dict.fromkeys(per_epoch))
    if len(conds) < 2:
        raise ValueError(f"all {len(per_epoch)} epochs share one condition ({conds[0]!r}): "
                         "event names carry no feature that varies. Pass a feature table "
                         "(features=DataFrame or epochs.metadata) describing each trial.")
    tags = {c: [t for t in c.split("/") if t != ""] for c in conds}
    lengths = {len(t) for t in tags.values()}
    positions = {}
    for tl in tags.values():
        for p, t in enumerate(tl):
            positions.setdefault(t, set()).add(p)
    consistent = len(lengths) == 1 and all(len(p) == 1 for p in positions.values())
    if consistent:
        L = lengths.pop()
        if names is None:
            cols = ["event"] if L == 1 else [f"tag{p}" for p in range(L)]
        else:
            cols = [str(n) for n in names]
            if len(cols) != L or len(set(cols)) != L:
                raise ValueError(f"names must give {L} distinct column name(s), one per tag "
                                 f"position of the event names (e.g. {conds[0]!r}); got "
                                 f"{list(names)!r}.")
        # unordered categoricals: tags are labels, even numbered ones ("1", "2": the
        # names mne.Epochs gives events without event_id)
        table = pd.DataFrame({col: pd.Categorical([tags[c][p] for c in per_epoch])
                              for p, col in enumerate(cols)})
        layout = "positions"
    else:
        if names is not None:
            raise ValueError("names only applies when every event name has its tags in the "
                             f"same positions; these names do not ({conds}), so each tag "
                             "becomes a boolean column named after it.")
        all_tags = list(dict.fromkeys(t for c in conds for t in tags[c]))
        table = pd.DataFrame({t: [t in tags[c] for c in per_epoch] for t in all_tags})
        layout = "tags"
    const = [c for c in table.columns if table[c].nunique(dropna=False) < 2]
    if const:
        logger.info("features_from_events: dropping constant column(s) %s", const)
        table = table.drop(columns=const)
    table.attrs["layout"] = layout
    logger.info("features_from_events: %d epochs, %d conditions -> columns %s (%s)",
                len(table), len(conds), list(table.columns), layout)
    return table


def epochs_feature_table(epochs, features=None):
    """One row per kept epoch: ``epochs.metadata``, a table, or the event-name table.

    Parameters
    ----------
    epochs : mne.Epochs
        Epochs whose bad epochs are already dropped (preloaded or after ``drop_bad``).
    features : None | str | list of str | DataFrame | Series | array
        ``None``: ``epochs.metadata`` when present, else :func:`features_from_events`.
        Column name(s): those columns of ``epochs.metadata`` (or of the event-name table
        when the epochs have no metadata).  A table with one row per epoch; a table with one
        row per *original* event (``len(epochs.drop_log)`` rows, before epochs were
        dropped) is aligned with ``epochs.selection``.

    Returns
    -------
    DataFrame (a copy, index 0..n_epochs-1)
    """
    _check_epochs(epochs)
    n = len(epochs)
    meta = epochs.metadata
    if features is None:
        if meta is not None:
            return as_feature_table(meta, name="epochs.metadata")
        return features_from_events(epochs)
    if isinstance(features, str):
        features = [features]
    if (isinstance(features, (np.ndarray, pd.Index)) and features.ndim == 1
            and all(isinstance(c, str) for c in features)
            and (len(features) != n or meta is not None
                 and all(c in meta.columns for c in features))):
        features = list(features)             # column names given as an array or Index
    if isinstance(features, (list, tuple)) and all(isinstance(c, str) for c in features):
        if len(features) == 0:
            raise ValueError("features is an empty list; name at least one column.")
        hint = ("" if meta is not None else " (these epochs have no metadata; attach "
                "one with epochs.metadata = DataFrame or pass a DataFrame)")
        if meta is not None:
            source, what = meta, "epochs.metadata"
        else:
            try:
                source, what = features_from_events(epochs), "the event-name table"
            except ValueError as err:
                raise ValueError(f"features names columns {list(features)}, but these "
                                 f"epochs have no metadata and their event names give no "
                                 f"feature table ({err}){hint}.") from None
        missing = [c for c in features if c not in source.columns]
        if missing:
            raise ValueError(f"unknown feature column(s) {missing}: {what} has columns "
                             f"{list(source.columns)}{hint}.")
        return as_feature_table(source[list(features)], name="features")
    if isinstance(features, (pd.DataFrame, pd.Series, np.ndarray, list, tuple)):
        table = as_feature_table(features, name="features")
        n_orig = len(epochs.drop_log)
        if len(table) == n:
            return table
        if len(table) == n_orig:
            logger.info("features: %d rows = original events; keeping the %d rows of the "
                        "epochs that were not dropped (epochs.selection)", n_orig, n)
            return table.iloc[np.asarray(epochs.selection)].reset_index(drop=True)
        raise ValueError(f"the feature table has {len(table)} rows but the epochs hold {n} "
                         f"epochs ({n_orig} events before dropping); pass one row per epoch "
                         "(or one per original event).")
    raise TypeError("features must be None, a column name, a list of column names or a "
                    f"DataFrame with one row per epoch; got {type(features).__name__}.")


def per_epoch(values, epochs, name):
    """``values`` (one label per epoch) aligned with the kept epochs: an array of one
    label per *original* event (``len(epochs.drop_log)``, as reading non-preloaded epochs
    can drop some) keeps the labels of ``epochs.selection``, as the feature table does.
    ``None``, a column name or an array of another length is returned as given (the
    analyses check it)."""
    if values is None or isinstance(values, str):
        return values
    arr = np.asarray(values)
    n, n_orig = len(epochs), len(epochs.drop_log)
    if arr.ndim == 1 and len(arr) == n_orig and n_orig != n:
        logger.info("%s: %d labels = original events; keeping the %d of the epochs that "
                    "were not dropped (epochs.selection)", name, n_orig, n)
        return arr[np.asarray(epochs.selection)]
    return values


def _empty_picks(picks):
    """Whether ``picks`` is an empty list / array (which MNE reads as "no channel")."""
    if picks is None or isinstance(picks, (str, slice)):
        return False
    try:
        return len(picks) == 0
    except TypeError:
        return False


def _pick_indices(epochs, picks):
    """Indices of the channels ``picks`` selects, by MNE's public picking rules.

    ``None`` picks the good data channels; names, channel types (``"eeg"``, ``"data"``...),
    integer indices and slices are read as :meth:`mne.Epochs.pick` reads them (bad
    channels are left out of type-based selections).  The selection is made on a
    one-sample :class:`mne.EvokedArray` sharing the epochs' measurement info, so no data
    are copied and the caller's epochs are untouched.
    """
    from mne import EvokedArray

    info = epochs.info
    if picks is None:
        sel = "data"
    elif _empty_picks(picks):
        raise ValueError(f"picks={picks!r} selects no channel; pick channels by name, type "
                         "or index (e.g. picks='eeg' or picks=['EEG 001', ...]).")
    else:
        sel = picks
    probe = EvokedArray(np.zeros((info["nchan"], 1)), info, verbose=False)
    try:
        picked = probe.pick(sel, exclude="bads", verbose=False).ch_names
    except (ValueError, TypeError, IndexError, RuntimeError) as err:
        if picks is None:
            raise ValueError("these epochs have no good data channel; pick channels by "
                             "name, type or index (e.g. picks='eeg' or picks=['EEG 001', "
                             "...]).") from None
        raise ValueError(f"invalid picks {picks!r}: {str(err).rstrip('.')}. Pick channels by "
                         "name, type or index (e.g. picks='eeg' or picks=['EEG 001', "
                         "...]).") from None
    position = {name: k for k, name in enumerate(info["ch_names"])}
    return np.array([position[name] for name in picked], dtype=int)


def epochs_data(epochs, picks=None, tmin=None, tmax=None, decim=1, window=None):
    """Data ``(n_epochs, n_channels, n_times)``, times, channel names and the read epochs.

    Picks channels (default: good data channels), averages over ``window`` seconds around
    each sample (on the full-rate data), crops to ``[tmin, tmax]`` (inclusive) and keeps
    every ``decim``-th sample on a grid anchored at ``t = 0`` (as MNE's ``decimate``).
    The caller's epochs are not modified.

    Returns
    -------
    data : ndarray, times : ndarray, ch_names : list of str, epochs : the epochs read
        (the caller's object when preloaded, else a copy whose bad epochs were dropped).
    """
    _check_epochs(epochs)
    idx = _pick_indices(epochs, picks)
    sfreq = float(epochs.info["sfreq"])
    window = check_window(window, sfreq)
    times = np.asarray(epochs.times, dtype=float)
    mask = time_mask(times, sfreq, tmin, tmax, decim, window=window,
                     lowpass=epochs.info.get("lowpass"), stacklevel=5)
    work = _readable(epochs)
    if len(work) == 0:
        raise ValueError("no epoch is left (all were dropped); nothing to model.")
    data = work.get_data(picks=idx)
    check_real(data, "the epochs' data")
    if data.shape[-1] != len(times):
        raise ValueError(f"the epochs hold {data.shape[-1]} samples per epoch but "
                         f"epochs.times has {len(times)} entries (MNE can lose one when tmin "
                         f"= {times[0]:.6g} s is not a whole number of samples at "
                         f"{sfreq:g} Hz); recreate the epochs with tmin a multiple of "
                         f"1/sfreq.")
    if window is not None:
        data = window_average(data, sfreq, window)
    data = np.ascontiguousarray(data[..., mask], dtype=float)
    ch_names = [epochs.ch_names[k] for k in idx]
    return data, times[mask], ch_names, work
