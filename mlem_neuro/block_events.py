"""Events tables from the other layouts of block designs.

:func:`~mlem_neuro.fmri.trial_images` takes BIDS-style events tables (``onset``,
``duration`` in seconds, ``trial_type``).  Two other layouts are common:

- one label and one run per volume, rest included: PyMVPA's ``attributes.txt`` and the
  ``labels`` / ``chunks`` table that nilearn's Haxby example reads
  (:func:`events_from_labels`);
- FSL's three-column onset files, one per condition (``onset duration weight`` per
  line), as in OpenFMRI's ``model/model001/onsets/task001_run001/cond001.txt`` with the
  condition names in ``condition_key.txt`` (:func:`read_fsl_onsets`,
  :func:`read_openfmri_onsets`).

Each function returns what ``trial_images`` takes: one table per run.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from .core.checks import check
from .utils import warn_user

__all__ = ["events_from_labels", "read_fsl_onsets", "read_openfmri_onsets"]

_COLUMNS = ["onset", "duration", "trial_type"]
#: the first line of nilearn's copy of the Haxby labels (a header, not a volume)
_LABEL_HEADERS = (("labels", "chunks"),)


# ------------------------------------------------------------------ per-volume labels
def _is_number(text):
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_attributes(path):
    """Labels and runs of an ``attributes.txt``-style file (``label run`` per line)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ValueError(f"labels: no such file {str(path)!r}") from None
    rows = [(i + 1, line.split()) for i, line in enumerate(text.splitlines())
            if line.strip()]
    if not rows:
        raise ValueError(f"labels: {str(path)!r} is empty; an attributes file has one line "
                         "'label run' per volume.")
    first = rows[0][1]
    if len(first) == 2 and (tuple(f.lower() for f in first) in _LABEL_HEADERS or (
            len(rows) > 1 and len(rows[1][1]) == 2 and not _is_number(first[1])
            and _is_number(rows[1][1][1]))):
        rows = rows[1:]                             # a header line
    for lineno, fields in rows:
        if len(fields) != 2:
            raise ValueError(f"labels: {str(path)!r}, line {lineno}: {len(fields)} field(s) "
                             f"({' '.join(fields)!r}); an attributes file has two per line, "
                             "the volume's label and its run, separated by white space.")
    labels = [fields[0] for _, fields in rows]
    runs = [fields[1] for _, fields in rows]
    if all(re.fullmatch(r"[+-]?\d+", r) for r in runs):
        runs = [int(r) for r in runs]
    return labels, runs


def _labels_and_runs(labels, runs):
    """Per-volume labels and runs as object arrays, checked."""
    if isinstance(labels, (str, os.PathLike)):
        if runs is not None:
            raise ValueError("runs is read from the attributes file with the labels; pass "
                             "runs=None with a file.")
        labels, runs = _read_attributes(labels)
    elif isinstance(labels, pd.DataFrame):
        if "labels" not in labels.columns:
            raise ValueError(f"labels: a table of labels needs a 'labels' column (and "
                             f"'chunks' for the runs, as in nilearn's Haxby example); its "
                             f"columns are {list(labels.columns)}.")
        if runs is None and "chunks" in labels.columns:
            runs = labels["chunks"]
        labels = labels["labels"]
    labels = np.asarray(labels, dtype=object)
    if labels.ndim != 1:
        raise ValueError(f"labels: one label per volume is expected (a 1D sequence); got "
                         f"shape {labels.shape}.")
    if len(labels) == 0:
        raise ValueError("labels is empty: give one label per volume.")
    runs = np.zeros(len(labels), dtype=int) if runs is None else np.asarray(runs,
                                                                           dtype=object)
    if runs.ndim != 1 or len(runs) != len(labels):
        raise ValueError(f"{len(labels)} label(s) but {runs.size} run value(s): give one "
                         "label and one run per volume, in the order of the volumes.")
    bad = [i for i, v in enumerate(labels) if not isinstance(v, str)]
    if bad:
        i = bad[0]
        raise TypeError(f"labels: volume {i} has the label {labels[i]!r} "
                        f"({type(labels[i]).__name__}), not a string ({len(bad)} such "
                        "volume(s)); labels are condition names: map numeric codes to "
                        "names first, e.g. [names[c] for c in codes].")
    missing = pd.isna(runs)
    if missing.any():
        raise ValueError(f"runs: volume {int(np.flatnonzero(missing)[0])} has no run "
                         f"(missing value; {int(missing.sum())} such volume(s)); every "
                         "volume needs one.")
    return labels, runs


def _run_segments(runs):
    """``[(run, start, stop)]``: each run's volumes, in the order of the volumes."""
    change = np.flatnonzero(runs[1:] != runs[:-1]) + 1
    starts = np.r_[0, change]
    stops = np.r_[change, len(runs)]
    segments, seen = [], {}
    for a, b in zip(starts, stops):
        run = runs[a]
        if run in seen:
            first = seen[run]
            raise ValueError(f"run {run!r} comes back at volume {a} after other runs (its "
                             f"first volumes are {first[0]}-{first[1] - 1}): list each "
                             "run's volumes together, in the order they were acquired.")
        seen[run] = (int(a), int(b))
        segments.append((run, int(a), int(b)))
    return segments


def _rest_set(rest):
    if rest is None:
        return frozenset()
    values = [rest] if isinstance(rest, str) else rest
    if not hasattr(values, "__iter__") or not all(isinstance(v, str) for v in values):
        raise TypeError(f"rest: give the label of the volumes outside the blocks (a str), "
                        f"several labels (a list of str) or None; got {rest!r}.")
    return frozenset(values)


def events_from_labels(labels, runs=None, *, t_r, rest="rest"):
    """Events tables of a block design from one label and one run per volume.

    Consecutive volumes with one label in one run make one block.  Its onset is the
    index of its first volume within its run times ``t_r``, its duration the number of
    its volumes times ``t_r``.  Volumes labelled ``rest`` make no block.  A label that
    comes back later in the run, after other volumes, starts another block (another
    row).

    Parameters
    ----------
    labels : sequence of str | DataFrame | path
        The label (condition name) of every volume, rest included, in the order of the
        volumes, the runs one after the other.  A DataFrame gives the labels in its
        ``labels`` column and the runs in its ``chunks`` column (the table nilearn's
        Haxby example reads with ``pd.read_csv(path, sep=" ")``).  A path is read as
        PyMVPA's ``attributes.txt``: one line per volume, its label and its run separated
        by white space; a first line ``labels chunks`` (or any first line whose run is
        not a number when the next line's is) is a header.
    runs : sequence | None
        The run of every volume (any labels: ints, strings).  ``None``: the ``chunks``
        column of a DataFrame, the second field of a file, or else one run.
    t_r : float
        Repetition time in seconds.
    rest : str | list of str | None
        The label(s) of the volumes that belong to no block (rest, fixation, baseline).
        ``None``: every volume belongs to a block.

    Returns
    -------
    events : list of DataFrame
        One events table per run, with the columns ``onset`` and ``duration`` (seconds
        from the run's first volume) and ``trial_type`` (the label), one row per block in
        the order of the volumes.  The runs come in the order of their volumes in
        ``labels``, which is the order of their first appearance, not a sort of the run
        labels (chunks ``0, 1, ..., 11``, or runs ``"run2"`` before ``"run10"`` if the
        volumes come so); give the BOLD runs to
        :func:`~mlem_neuro.fmri.trial_images` in the same order.

    Raises
    ------
    ValueError
        Labels and runs of different lengths, ``t_r`` not a positive number, a run whose
        volumes are not together (it comes back after another run), a run with no block
        (every volume labelled ``rest``; the error names the run), a malformed file.
    TypeError
        A label that is not a string (numeric codes: map them to names first).

    See Also
    --------
    read_fsl_onsets : The events from FSL's three-column onset files.
    mlem_neuro.fmri.trial_images : Beta images from BOLD runs and these events.

    Examples
    --------
    >>> from mlem_neuro.fmri import events_from_labels
    >>> labels = ["rest", "face", "face", "rest", "house", "house", "house",
    ...           "face", "rest", "house", "house", "rest"]
    >>> runs = [0] * 8 + [1] * 4
    >>> run0, run1 = events_from_labels(labels, runs, t_r=2.0)
    >>> run0
       onset  duration trial_type
    0    2.0       4.0       face
    1    8.0       6.0      house
    2   14.0       2.0       face
    >>> run1
       onset  duration trial_type
    0    2.0       4.0      house

    PyMVPA's ``attributes.txt`` and nilearn's copy of the Haxby labels::

        events = events_from_labels("attributes.txt", t_r=2.5)
        events = events_from_labels(pd.read_csv("labels.txt", sep=" "), t_r=2.5)
    """
    t_r = check("t_r", t_r)
    labels, runs = _labels_and_runs(labels, runs)
    rest = _rest_set(rest)
    out = []
    for run, a, b in _run_segments(runs):
        seg = labels[a:b]
        change = np.flatnonzero(seg[1:] != seg[:-1]) + 1
        starts, stops = np.r_[0, change], np.r_[change, len(seg)]
        keep = [k for k in range(len(starts)) if seg[starts[k]] not in rest]
        if not keep:
            raise ValueError(
                f"run {run!r} (volumes {a}-{b - 1}) has no block: all its {b - a} volumes "
                f"are labelled {sorted(set(seg))!r}, which rest={sorted(rest)!r} leaves out. "
                "Drop the run (its labels and its BOLD image), or check rest.")
        out.append(pd.DataFrame({
            "onset": [float(starts[k] * t_r) for k in keep],
            "duration": [float((stops[k] - starts[k]) * t_r) for k in keep],
            "trial_type": [str(seg[starts[k]]) for k in keep]}, columns=_COLUMNS))
    return out


# ------------------------------------------------------------------- FSL onset files
def _read_onset_file(path, name):
    """``(onset, duration, weight)`` rows of one FSL three-column file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ValueError(f"no such FSL onset file {str(path)!r} (condition {name!r})") \
            from None
    rows = []
    for i, line in enumerate(text.splitlines()):
        fields = line.split()
        if not fields:
            continue                                  # blank lines (a trailing one, often)
        where = f"{str(path)!r}, line {i + 1} ({line.strip()!r})"
        if len(fields) != 3:
            hint = (" A single column is FSL's one-value-per-volume format, which this "
                    "does not read." if len(fields) == 1 else "")
            raise ValueError(f"{where}: {len(fields)} column(s); an FSL onset file has "
                             "three per line, onset, duration and weight, separated by "
                             f"spaces or tabs.{hint}")
        try:
            values = [float(f) for f in fields]
        except ValueError:
            values = [np.nan]
        if not np.isfinite(values).all():
            raise ValueError(f"{where}: not three numbers; each line of an FSL onset file "
                             "is an onset and a duration in seconds and a weight.")
        if values[1] < 0:
            raise ValueError(f"{where}: negative duration ({values[1]:g} s); durations are "
                             ">= 0 s.")
        rows.append(values)
    if not rows:
        warn_user(f"FSL onset file {str(path)!r} is empty: condition {name!r} has no event "
                  "(as in FSL, where an empty file is a condition that did not occur) and "
                  "no row.")
    return rows


def _onsets_table(pairs):
    """One events table from ``[(name, path)]``: rows sorted by onset (ties in the
    files' order), a ``modulation`` column where a weight is not 1."""
    parts = []
    for name, path in pairs:
        rows = np.asarray(_read_onset_file(path, name), dtype=float).reshape(-1, 3)
        parts.append(pd.DataFrame({"onset": rows[:, 0], "duration": rows[:, 1],
                                   # str: what pandas reads from a text file
                                   "trial_type": pd.Series([name] * len(rows), dtype=str),
                                   "modulation": rows[:, 2]}))
    table = pd.concat(parts, ignore_index=True)
    table = table.sort_values("onset", kind="stable").reset_index(drop=True)
    if (table["modulation"] == 1).all():
        table = table.drop(columns="modulation")
    return table


def read_fsl_onsets(files, names=None):
    """One events table from FSL's three-column onset files (one file per condition).

    Each line of a file is an event of its condition: onset (s), duration (s) and weight,
    separated by spaces or tabs (FSL FEAT's "custom, 3 column format").

    Parameters
    ----------
    files : path | list of path | dict
        The files of one run: a path, a list of paths (the condition is the file name
        without its extension, or its entry in ``names``), or a dict
        ``{condition: path}``.
    names : dict | None
        With a list of files: ``{file stem: condition}``, e.g. ``{"cond001": "house"}``
        (every file needs an entry).  Two files may map to one condition (their events
        are merged).

    Returns
    -------
    events : DataFrame
        The columns ``onset``, ``duration`` (seconds) and ``trial_type`` (the condition),
        one row per line of the files, sorted by onset (events with the same onset in the
        order of the files).  Where a weight is not 1, a ``modulation`` column (nilearn's
        name) holds every event's weight.  :func:`~mlem_neuro.fmri.trial_images` does not
        scale the regressors by it: it is a feature column unless ``feature_cols`` leaves
        it out (with ``model="trial"`` each event has its own beta, which a weight would
        only rescale).

    Raises
    ------
    ValueError
        Naming the file and the line: a line without three columns, a field that is not a
        finite number, a negative duration; a missing file; two files of one stem with no
        ``names`` to tell their conditions apart.

    Warns
    -----
    UserWarning
        For each empty file: FSL reads it as a condition with no event, so it gives no
        row.  If every file is empty the table has no row, which
        :func:`~mlem_neuro.fmri.trial_images` refuses.

    See Also
    --------
    read_openfmri_onsets : The onset files of one OpenFMRI run, named by its
        ``condition_key.txt``.
    events_from_labels : The events from one label per volume.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from mlem_neuro.fmri import read_fsl_onsets
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = (folder / "face.txt").write_text("15 22.5 1\\n87.5 22.5 1\\n")
    >>> _ = (folder / "house.txt").write_text("52.5\\t22.5\\t1\\n")
    >>> read_fsl_onsets([folder / "face.txt", folder / "house.txt"])
       onset  duration trial_type
    0   15.0      22.5       face
    1   52.5      22.5      house
    2   87.5      22.5       face
    >>> events = read_fsl_onsets({"faces": folder / "face.txt"})
    >>> events["trial_type"].tolist()
    ['faces', 'faces']
    """
    if isinstance(files, dict):
        if names is not None:
            raise ValueError("names renames the files of a list; a dict of files "
                             "{condition: path} names them already: pass names=None.")
        pairs = [(str(name), path) for name, path in files.items()]
    else:
        if isinstance(files, (str, os.PathLike)):
            files = [files]
        elif not isinstance(files, (list, tuple)):
            raise TypeError(f"files: give a path, a list of paths or a dict {{condition: "
                            f"path}}; got {type(files).__name__}.")
        if names is not None and not isinstance(names, dict):
            raise TypeError(f"names: give a dict {{file stem: condition}} or None; got "
                            f"{type(names).__name__}.")
        pairs = []
        for path in files:
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError(f"files: {path!r} is not a path.")
            stem = Path(path).stem
            if names is None:
                pairs.append((stem, path))
            elif stem in names:
                pairs.append((str(names[stem]), path))
            else:
                raise ValueError(f"names has no condition for the file {str(path)!r} (stem "
                                 f"{stem!r}); its entries are {sorted(names)}.")
        if names is None:
            stems = [stem for stem, _ in pairs]
            twice = sorted({s for s in stems if stems.count(s) > 1})
            if twice:
                paths = [str(p) for s, p in pairs if s == twice[0]]
                raise ValueError(f"the files {paths} have one stem, {twice[0]!r}, so one "
                                 "condition: files of several runs in one call? Pass the "
                                 "files of one run, or name the conditions with a dict "
                                 "{condition: path}.")
    if not pairs:
        raise ValueError("files is empty: give the onset files of the run's conditions.")
    return _onsets_table(pairs)


def _read_condition_key(key):
    """``{(task, cond): name}`` of an OpenFMRI ``condition_key.txt`` (or a dict as it
    is)."""
    if isinstance(key, dict):
        return {(None, str(c)): str(n) for c, n in key.items()}
    try:
        text = Path(key).read_text()
    except FileNotFoundError:
        raise ValueError(f"condition_key: no such file {str(key)!r}") from None
    out = {}
    for i, line in enumerate(text.splitlines()):
        fields = line.split(maxsplit=2)
        if not fields:
            continue
        if len(fields) != 3:
            raise ValueError(f"condition_key: {str(key)!r}, line {i + 1} ({line.strip()!r}):"
                             f" {len(fields)} field(s); each line of an OpenFMRI condition "
                             "key is a task, a condition and its name, e.g. 'task001 cond001 "
                             "house'.")
        out[(fields[0], fields[1])] = fields[2].strip()
    if not out:
        raise ValueError(f"condition_key: {str(key)!r} is empty.")
    return out


def read_openfmri_onsets(onsets_dir, condition_key, task=None):
    """The events table of one run in the OpenFMRI layout: its ``condNNN.txt`` files.

    OpenFMRI keeps one folder of FSL three-column onset files per run
    (``sub001/model/model001/onsets/task001_run001/cond001.txt``, ...) and names the
    conditions in ``models/model001/condition_key.txt``, one line per condition:
    ``task001 cond001 house``.  The files are read by :func:`read_fsl_onsets`.

    Parameters
    ----------
    onsets_dir : path
        The run's folder of ``cond*.txt`` files.
    condition_key : path | dict
        The study's ``condition_key.txt``, or a dict ``{"cond001": "house", ...}``.
    task : str | None
        The task whose conditions the key gives (``"task001"``).  ``None``: the task in
        the folder's name (``task001_run001``), or else the key's only task.

    Returns
    -------
    events : DataFrame
        As :func:`read_fsl_onsets` returns it, the conditions named by the key.

    Raises
    ------
    ValueError
        A folder without ``cond*.txt`` files, a file whose condition the key does not
        name, a malformed key line, a key of several tasks when the task cannot be told;
        and the errors of :func:`read_fsl_onsets`.

    Warns
    -----
    UserWarning
        For each condition of the key that has no file in the folder, and for each empty
        file.

    See Also
    --------
    read_fsl_onsets : Onset files named by a list or a dict.

    Examples
    --------
    >>> from mlem_neuro.fmri import read_openfmri_onsets, trial_images
    >>> key = "ds105/models/model001/condition_key.txt"
    >>> events = [read_openfmri_onsets(f"ds105/sub001/model/model001/onsets/"
    ...                                f"task001_run{r:03d}", key)
    ...           for r in range(1, 13)]                             # doctest: +SKIP
    >>> imgs, table = trial_images(runs, events, t_r=2.5)            # doctest: +SKIP
    """
    folder = Path(onsets_dir)
    if not folder.is_dir():
        raise ValueError(f"onsets_dir: no such folder {str(onsets_dir)!r}")
    files = sorted(folder.glob("cond*.txt"))
    if not files:
        raise ValueError(f"onsets_dir: no cond*.txt onset file in {str(folder)!r}.")
    key = _read_condition_key(condition_key)
    tasks = sorted({t for t, _ in key if t is not None})
    if tasks:
        if task is None:
            match = re.match(r"(task\d+)_run\d+", folder.name)
            if match:
                task = match.group(1)
            elif len(tasks) == 1:
                task = tasks[0]
            else:
                raise ValueError(f"the condition key names several tasks ({tasks}) and the "
                                 f"folder's name {folder.name!r} is not 'taskNNN_runNNN': "
                                 "pass task='task001' (say which).")
        names = {c: n for (t, c), n in key.items() if t == task}
        if not names:
            raise ValueError(f"the condition key has no condition of task {task!r}; its "
                             f"tasks are {tasks}.")
    else:
        names = {c: n for (_, c), n in key.items()}
    unnamed = [f.name for f in files if f.stem not in names]
    if unnamed:
        raise ValueError(f"the condition key gives no name to {unnamed} (task {task!r}; it "
                         f"names {sorted(names)}): a key of another study or task?")
    absent = sorted(set(names) - {f.stem for f in files})
    if absent:
        warn_user(f"{str(folder)!r} has no onset file for {absent} "
                  f"({[names[c] for c in absent]}): those conditions have no event in this "
                  "run.")
    return read_fsl_onsets(files, names=names)
