"""BIDS in, BIDS derivatives out: MLEM as a BIDS App.

:func:`run_bids` follows the BIDS-Apps conventions (``bids_root output_dir
participant|group``), as the ``mlem-neuro bids`` command does:

* **participant** (:func:`bids_participant`): for each participant, the recordings of one
  task are found in the dataset and analysed.

  - fMRI (``func``): the preprocessed BOLD runs, brain masks and confounds of a
    derivatives folder in fMRIPrep's layout (``space`` picks the space), events from the
    raw dataset's ``events.tsv``; per-trial (or per-condition) betas with
    :func:`mlem_neuro.fmri.trial_images`, then :func:`mlem_neuro.mlem_searchlight` or
    :func:`mlem_neuro.mlem_roi`.
  - MEG / EEG (``meg``, ``eeg``): each recording read with :func:`mne_bids.read_raw_bids`,
    epoched around the onsets of its ``events.tsv`` (whose rows become the epochs'
    metadata, so its columns are the features), then :func:`mlem_neuro.mlem_epochs`.

* **group** (:func:`bids_group`): the group tests over the participants' saved results:
  :func:`mlem_neuro.stats.permutation_cluster_test` for time courses,
  :func:`mlem_neuro.stats.second_level_maps` for brain maps.

Files are found with nilearn's BIDS helpers (:func:`nilearn.interfaces.bids.get_bids_files`,
:func:`~nilearn.interfaces.bids.parse_bids_filename`) and mne-bids
(:class:`mne_bids.BIDSPath`, :func:`mne_bids.get_entity_vals`); nothing here parses BIDS
by hand.

The outputs form a BIDS derivatives dataset::

    output_dir/dataset_description.json     (GeneratedBy: mlem_neuro and its version;
                                             the settings of each task under MLEMSettings)
    output_dir/sub-<label>/<func|eeg|meg>/sub-<label>_task-<T>[_space-<S>]_desc-mlem_<suffix>
        result.npz        the result (mlem_neuro.read_result); written last: its presence
                          marks the participant as done
        importance.csv    result.to_data_frame()
        importance.png    the figure the other commands draw
        importance.nii.gz, importance.json, score.nii.gz   (maps: one volume per term)
    output_dir/group/task-<T>[_space-<S>]_desc-mlem_<suffix>
        clusters.csv, clusters.png, tstat.csv             (time courses)
        logp.nii.gz, logp.json, summary.csv               (maps)

Each participant is written into a hidden folder of ``output_dir`` and its files are
renamed into place once all of them are complete; participants already done are skipped
(``overwrite=True`` redoes them); a participant that fails is reported with its cause
and the others still run, so a second run redoes only what is missing.  Participants are
dispatched through joblib, so ``joblib.parallel_config(backend="dask")`` runs a study on
a dask cluster.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ._docs import fill_doc
from ._outputs import brain_map_figure, deferred_interrupts, save_figure
from ._version import __version__
from .core.checks import CROSSVALIDATED_DISTANCES, check
from .core.options import MLEMOptions, jsonable
from .utils import logger, verbose, warn_user

__all__ = ["BIDSInputs", "bids_group", "bids_inputs", "bids_participant",
           "bids_participants", "run_bids"]

#: fMRIPrep's six head-motion parameters, the default confounds
MOTION = ("trans_x", "trans_y", "trans_z", "rot_x", "rot_y", "rot_z")
#: the BIDS version the derivatives' dataset_description.json declares
BIDS_VERSION = "1.10.0"
#: the ``desc`` entity of every output file
DESC = "mlem"
#: the raw entities that tell runs apart (besides sub and task)
_RUN_ENTITIES = ("ses", "acq", "ce", "rec", "dir", "run", "echo", "part")
#: the analysis options a participant's analysis takes through ``**options``
_OPTION_NAMES = tuple(n for n in MLEMOptions.names() if n != "n_jobs")


# --------------------------------------------------------------------------- finding
def _root(path, what="bids_root"):
    root = Path(os.fspath(path)).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"{what} {str(path)!r} is not a folder; give the top folder "
                                "of a BIDS dataset (the one holding dataset_description.json "
                                "and the sub-<label> folders).")
    return root


def _entities(path):
    from nilearn.interfaces.bids import parse_bids_filename

    return parse_bids_filename(str(path))["entities"]


def _files(root, tag, ext, *, sub="*", folder="func", filters=(), top=False):
    """nilearn's :func:`~nilearn.interfaces.bids.get_bids_files`, as a sorted list."""
    from nilearn.interfaces.bids import get_bids_files

    return sorted(get_bids_files(root, file_tag=tag, file_type=ext, sub_label=sub,
                                 modality_folder=folder, filters=list(filters),
                                 sub_folder=not top))


def _label(value):
    """A BIDS label as text: ``1`` and ``"01"`` stay apart, digits compare as numbers in
    :func:`_run_key`."""
    return None if value is None else str(value)


def _run_key(entities):
    """What tells a participant's runs apart: session, acquisition, run... (numbers
    compared as numbers: fMRIPrep writes ``run-1`` for the raw ``run-01``)."""
    out = []
    for name in _RUN_ENTITIES:
        value = entities.get(name)
        if value is not None and str(value).isdigit():
            value = int(value)
        out.append(value)
    return tuple(out)


def _meeg_paths(root, task, datatype, subject=None):
    """The MEG / EEG recordings of ``task`` (mne-bids :func:`~mne_bids.find_matching_paths`)."""
    from mne_bids import find_matching_paths
    from mne_bids.config import ALLOWED_DATATYPE_EXTENSIONS

    return sorted(find_matching_paths(root, subjects=subject, tasks=task,
                                      datatypes=datatype, suffixes=datatype,
                                      extensions=ALLOWED_DATATYPE_EXTENSIONS[datatype]),
                  key=str)


def _task_files(root, task, datatype, subject=None):
    if datatype == "func":
        return _files(root, "bold", "nii*", sub=subject or "*", filters=[("task", task)])
    return _meeg_paths(root, task, datatype, subject)


def _resolve_datatype(root, task, datatype):
    """The datatype holding ``task``: ``datatype`` checked, or the one found."""
    from mne_bids import get_entity_vals

    check("datatype", datatype)
    tasks = list(get_entity_vals(root, "task"))
    if task not in tasks:
        raise ValueError(f"task {task!r} is not in the BIDS dataset {root}: its tasks are "
                         f"{tasks}. Pass one of them (the label after 'task-' in the file "
                         "names).")
    wanted = ("func", "eeg", "meg") if datatype == "auto" else (datatype,)
    found = [dt for dt in wanted if _task_files(root, task, dt)]
    if not found:
        what = "func (BOLD), eeg or meg" if datatype == "auto" else datatype
        raise ValueError(f"task {task!r} of {root} has no {what} recording (mlem_neuro "
                         "analyses sub-<label>/[ses-<label>/]func/*_bold.nii[.gz] and "
                         "eeg / meg recordings).")
    if len(found) > 1:
        raise ValueError(f"task {task!r} of {root} is recorded in several datatypes "
                         f"{found}; pass datatype= (--datatype) to choose one.")
    return found[0]


def _labels(participant_label):
    if participant_label is None:
        return None
    if isinstance(participant_label, (str, int)):
        participant_label = [participant_label]
    out = []
    for value in participant_label:
        text = str(value)
        out.append(text[4:] if text.startswith("sub-") else text)
    return out


def _participants(root, task, participant_label, datatype):
    """``(labels, datatype)``: the participants with ``task`` recordings (those asked)."""
    datatype = _resolve_datatype(root, task, datatype)
    if datatype == "func":
        found = sorted({_entities(f)["sub"] for f in _task_files(root, task, "func")})
    else:
        found = sorted({p.subject for p in _task_files(root, task, datatype)})
    asked = _labels(participant_label)
    if asked is None:
        return found, datatype
    missing = [s for s in asked if s not in found]
    if len(missing) == len(asked):
        raise ValueError(f"no participant matches participant_label {asked}: the "
                         f"participants with {datatype} recordings of task {task!r} in "
                         f"{root} are {found}.")
    if missing:
        raise ValueError(f"participant_label {missing} have no {datatype} recording of task "
                         f"{task!r} in {root}; the participants that have one are "
                         f"{found}.")
    return [s for s in found if s in asked], datatype


@fill_doc
def bids_participants(bids_root, task, *, participant_label=None, datatype="auto"):
    """The participants of a BIDS dataset who have recordings of a task.

    Parameters
    ----------
    %(bids_root)s
    %(task)s
    %(participant_label)s
    %(datatype)s

    Returns
    -------
    labels : list of str
        The participants' labels (``"01"`` for ``sub-01``), sorted.

    Raises
    ------
    ValueError
        When the task is not in the dataset (the message lists the tasks present), when it
        is recorded in several datatypes and ``datatype="auto"``, or when no participant
        (or not every one) of ``participant_label`` has recordings of it.

    Examples
    --------
    >>> from mlem_neuro.bids import bids_participants
    >>> bids_participants("ds000001", "balloonanalogrisktask")     # doctest: +SKIP
    ['01', '02', '03', ...]
    """
    return _participants(_root(bids_root), task, participant_label, datatype)[0]


@dataclass
class BIDSInputs:
    """The files of one participant's analysis (what :func:`bids_inputs` finds).

    Parameters
    ----------
    participant : str
        The participant's label.
    task : str
        The task.
    datatype : str
        ``"func"``, ``"eeg"`` or ``"meg"``.
    recordings : list of str
        The preprocessed BOLD runs (fMRI) or raw recordings (MEG / EEG), in order.
    events : list of str
        The ``events.tsv`` of each recording.
    space : str | None
        The space of the BOLD runs (fMRI).
    masks : list of str
        The brain mask of each BOLD run (fMRI).
    confounds : list of str | None
        The confounds table of each BOLD run (fMRI; ``None`` where there is none).
    sidecars : list of str | None
        The JSON sidecar of each BOLD run that gives its ``RepetitionTime`` (fMRI).
    """

    participant: str
    task: str
    datatype: str
    recordings: list
    events: list
    space: str | None = None
    masks: list = field(default_factory=list)
    confounds: list = field(default_factory=list)
    sidecars: list = field(default_factory=list)


def _derivatives(root, derivatives):
    """The fMRIPrep derivatives folder: given, or ``derivatives/fmriprep`` (then
    ``derivatives``) of the raw dataset."""
    if derivatives is not None:
        return _root(derivatives, "derivatives")
    for candidate in (root / "derivatives" / "fmriprep", root / "derivatives"):
        if candidate.is_dir() and any(candidate.glob("sub-*")):
            return candidate
    raise FileNotFoundError(f"no derivatives folder with preprocessed BOLD runs in {root} "
                            "(looked for derivatives/fmriprep/sub-* and derivatives/sub-*); "
                            "pass derivatives= (--derivatives) with fMRIPrep's output "
                            "folder.")


def _one_per_run(files, what, label):
    keys = {}
    for f in files:
        keys.setdefault(_run_key(_entities(f)), []).append(f)
    twins = [v for v in keys.values() if len(v) > 1]
    if twins:
        raise ValueError(f"sub-{label}: several {what} files for one run: "
                         f"{[Path(f).name for f in twins[0]]}; pass space= (and remove "
                         "the other resolutions or descriptions) so that one is left.")
    return {k: v[0] for k, v in keys.items()}


def _expected(folder_root, label, entities, suffix, ext, extra=()):
    """The path a BIDS file of ``entities`` would have (for error messages)."""
    from nilearn.interfaces.bids.utils import create_bids_filename

    keep = ["sub", "ses", "task", "acq", "ce", "rec", "dir", "run", "echo", "part", *extra]
    name = create_bids_filename({"entities": entities, "suffix": suffix, "extension": ext},
                                entities_to_include=keep)
    folder = Path(folder_root) / f"sub-{label}"
    if entities.get("ses"):
        folder = folder / f"ses-{entities['ses']}"
    return folder / "func" / name


def _func_inputs(root, deriv, label, task, space):
    bolds = _files(deriv, "bold", "nii*", sub=label, filters=[("task", task),
                                                               ("desc", "preproc")])
    if not bolds:
        raise FileNotFoundError(
            f"sub-{label} has no preprocessed BOLD run of task {task!r} in the derivatives "
            f"{deriv} (fMRIPrep's sub-{label}/[ses-<label>/]func/sub-{label}_task-{task}"
            "[_run-<index>]_space-<space>_desc-preproc_bold.nii.gz); run the preprocessing "
            "for this participant, or leave it out with participant_label.")
    spaces = sorted({_entities(b).get("space") or "" for b in bolds})
    if space is None and len(spaces) > 1:
        raise ValueError(f"sub-{label}: the preprocessed BOLD runs of task {task!r} are in "
                         f"several spaces {spaces}; pass space= (--space) to choose one "
                         "(a space shared by every participant, e.g. MNI152NLin2009cAsym, "
                         "for the group level).")
    if space is not None:
        bolds = [b for b in bolds if _entities(b).get("space") == space]
        if not bolds:
            raise FileNotFoundError(f"sub-{label} has no preprocessed BOLD run of task "
                                    f"{task!r} in space {space!r} in {deriv}; its spaces "
                                    f"are {spaces}.")
    runs = _one_per_run(bolds, "preprocessed BOLD", label)
    space = _entities(next(iter(runs.values()))).get("space")
    events = {}
    for f in _files(deriv, "events", "tsv", sub=label, filters=[("task", task)]) + \
            _files(root, "events", "tsv", sub=label, filters=[("task", task)]):
        events[_run_key(_entities(f))] = f          # the raw dataset's win
    inherited = _files(root, "events", "tsv", top=True, filters=[("task", task)])
    raw_bolds = {_run_key(_entities(f)): f for f in _task_files(root, task, "func", label)}
    masks = [m for m in _files(deriv, "mask", "nii*", sub=label, filters=[("task", task)])
             if _entities(m).get("space") == space
             and "brain" in (_entities(m).get("desc"), _entities(m).get("label"))]
    anat = [m for m in _files(deriv, "mask", "nii*", sub=label, folder="anat")
            if _entities(m).get("space") == space and "task" not in _entities(m)
            and "brain" in (_entities(m).get("desc"), _entities(m).get("label"))]
    confounds = [c for tag in ("timeseries", "regressors")
                 for c in _files(deriv, tag, "tsv", sub=label, filters=[("task", task)])
                 if _entities(c).get("desc") in ("confounds", None)]
    confounds = {_run_key(_entities(c)): c for c in confounds}
    out = BIDSInputs(participant=label, task=task, datatype="func", recordings=[],
                     events=[], space=space)
    for key in sorted(runs, key=lambda k: tuple((v is None, str(v).zfill(8)) for v in k)):
        bold = runs[key]
        ent = _entities(bold)
        if key in events:
            ev = events[key]
        elif len(inherited) == 1:
            ev = inherited[0]
        else:
            expected = (re.sub(r"_bold\.nii(\.gz)?$", "_events.tsv", raw_bolds[key])
                        if key in raw_bolds else _expected(root, label, ent, "events", "tsv"))
            raise FileNotFoundError(
                f"no events.tsv for the BOLD run {bold}: expected {expected} (or a task-{task}"
                "_events.tsv at the top of the dataset, shared by every run).")
        run_masks = [m for m in masks if _run_key(_entities(m)) == key
                     and _entities(m).get("res") == ent.get("res")]
        run_masks = run_masks or [m for m in anat if _entities(m).get("res") == ent.get("res")]
        if not run_masks:
            expected = _expected(deriv, label, {**ent, "desc": "brain"}, "mask", "nii.gz",
                                 extra=("space", "res", "desc"))
            raise FileNotFoundError(
                f"sub-{label} has no brain mask for the BOLD run {bold} in the derivatives: "
                f"expected {expected} (fMRIPrep's brain mask of the run, or an anat "
                f"sub-{label}_space-{space}_desc-brain_mask.nii.gz).")
        out.recordings.append(str(bold))
        out.events.append(str(ev))
        out.masks.append(str(run_masks[0]))
        out.confounds.append(None if key not in confounds else str(confounds[key]))
        out.sidecars.append(_sidecar(bold, root, label, task, key))
    return out


def _sidecar(bold, root, label, task, key):
    """The JSON sidecar that gives the run's RepetitionTime: the derivative's own, else
    the raw run's, else the dataset's ``task-<T>_bold.json`` (``None`` if none)."""
    candidates = [re.sub(r"\.nii(\.gz)?$", ".json", str(bold))]
    candidates += [f for f in _files(root, "bold", "json", sub=label, filters=[("task", task)])
                   if _run_key(_entities(f)) == key]
    candidates += _files(root, "bold", "json", top=True, filters=[("task", task)])
    for path in candidates:
        if Path(path).is_file():
            with open(path) as fh:
                try:
                    meta = json.load(fh)
                except json.JSONDecodeError as err:
                    raise ValueError(f"cannot read the JSON sidecar {path} ({err}).") \
                        from None
            if "RepetitionTime" in meta:
                return str(path)
    return None


def _meeg_inputs(root, label, task, datatype):
    paths = _meeg_paths(root, task, datatype, label)
    if not paths:
        raise FileNotFoundError(f"sub-{label} has no {datatype} recording of task {task!r} "
                                f"in {root}.")
    out = BIDSInputs(participant=label, task=task, datatype=datatype, recordings=[],
                     events=[])
    for bp in paths:
        ev = bp.find_matching_sidecar(suffix="events", extension=".tsv", on_error="ignore")
        if ev is None:
            expected = bp.copy().update(suffix="events", extension=".tsv").fpath
            raise FileNotFoundError(f"no events.tsv for the recording {bp.fpath}: expected "
                                    f"{expected}; the epochs are cut around its onsets.")
        out.recordings.append(str(bp.fpath))
        out.events.append(str(ev))
    return out


@fill_doc
def bids_inputs(bids_root, participant, task, *, datatype="auto", derivatives=None,
                space=None):
    """The files one participant's analysis reads, found in a BIDS dataset.

    Only file names and sidecars are read: no image or recording is loaded.

    Parameters
    ----------
    %(bids_root)s
    participant : str
        The participant's label (``"01"`` or ``"sub-01"``).
    %(task)s
    %(datatype)s
    %(derivatives)s
    %(space)s

    Returns
    -------
    inputs : BIDSInputs
        The recordings and, for each, its ``events.tsv`` (and, for fMRI, its brain
        mask, confounds and the sidecar giving its repetition time).

    Raises
    ------
    FileNotFoundError
        Naming the file expected: a run without ``events.tsv``, a BOLD run without a
        brain mask in the derivatives, a participant without preprocessed runs.
    ValueError
        The task is not in the dataset (the tasks present are listed), or the BOLD runs
        are in several spaces and ``space`` is not given.

    Examples
    --------
    >>> from mlem_neuro.bids import bids_inputs
    >>> inputs = bids_inputs("ds000001", "01", "balloonanalogrisktask",
    ...                      space="MNI152NLin2009cAsym")               # doctest: +SKIP
    >>> inputs.recordings, inputs.events, inputs.masks                  # doctest: +SKIP
    """
    root = _root(bids_root)
    label = _labels(participant)[0]
    datatype = _resolve_datatype(root, task, datatype)
    return _inputs(root, derivatives, label, task, datatype, space)


def _inputs(root, derivatives, label, task, datatype, space):
    if datatype == "func":
        return _func_inputs(root, _derivatives(root, derivatives), label, task, space)
    return _meeg_inputs(root, label, task, datatype)


# --------------------------------------------------------------------------- reading
def _header_t_r(img):
    """The header's repetition time in seconds, ``None`` when it gives none."""
    zooms = img.header.get_zooms()
    if len(zooms) < 4:
        return None
    tr = float(zooms[3])
    unit = img.header.get_xyzt_units()[1]
    tr = tr / 1000.0 if unit == "msec" else tr / 1e6 if unit == "usec" else tr
    if tr <= 0 or (unit == "unknown" and tr == 1.0):   # no TR known
        return None
    return tr


def _repetition_time(inputs, t_r=None):
    """The runs' common repetition time, from the sidecars, checked against the NIfTI
    headers and between runs (a ValueError naming the files otherwise)."""
    import nibabel as nib

    found = []
    for bold, sidecar in zip(inputs.recordings, inputs.sidecars):
        header = _header_t_r(nib.load(bold))
        if sidecar is not None:
            with open(sidecar) as fh:
                value = json.load(fh)["RepetitionTime"]
            try:
                value = check("t_r", value)
            except (TypeError, ValueError) as err:
                raise ValueError(f"the RepetitionTime of {sidecar} is not usable: {err}") \
                    from None
            if header is not None and abs(header - value) > 0.01 * value:
                raise ValueError(f"the RepetitionTime of {sidecar} ({value:g} s) differs from "
                                 f"the NIfTI header of {bold} ({header:g} s); correct the "
                                 "sidecar or the header (events would be placed at the "
                                 "wrong scans).")
        elif header is not None:
            value = header
        elif t_r is not None:
            value = check("t_r", t_r)
        else:
            raise ValueError(f"no repetition time for {bold}: no sidecar gives "
                             "RepetitionTime and the NIfTI header gives none; add it to the "
                             "bold.json sidecar.")
        found.append((value, bold))
    values = sorted({v for v, _ in found})
    if len(values) > 1:
        runs = "; ".join(f"{Path(b).name}: {v:g} s" for v, b in found)
        raise ValueError(f"sub-{inputs.participant}: the BOLD runs have different repetition "
                         f"times ({runs}); analyse runs of one TR together (e.g. one "
                         "acquisition with participant_label and a separate output folder).")
    return values[0]


def _read_tsv(path):
    import pandas as pd

    try:
        return pd.read_csv(path, sep="\t")
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ValueError(f"cannot read {path} as a tab-separated table "
                         f"({' '.join(str(err).split())}).") from None


def _confounds(inputs, columns):
    """The confounds tables of the runs (``None`` without ``columns``)."""
    if not columns:
        return None
    out = []
    for bold, path in zip(inputs.recordings, inputs.confounds):
        if path is None:
            raise FileNotFoundError(
                f"no confounds table for the BOLD run {bold} in the derivatives (fMRIPrep's "
                "..._desc-confounds_timeseries.tsv); pass confounds=None (--confounds none) "
                "to fit without confounds.")
        table = _read_tsv(path)
        missing = [c for c in columns if c not in table.columns]
        if missing:
            raise ValueError(f"the confounds table {path} lacks the column(s) {missing}; its "
                             f"columns include {list(table.columns)[:12]}.")
        table = table[list(columns)].astype(float)
        table.iloc[0] = table.iloc[0].fillna(0.0)   # derivatives: first row undefined
        if table.isna().any().any():
            raise ValueError(f"the confounds table {path} has missing values in "
                             f"{[c for c in columns if table[c].isna().any()]} beyond the "
                             "first row.")
        out.append(table)
    return out


def _brain_mask(masks):
    """One mask for the participant: the run's, or the voxels in every run's."""
    unique = list(dict.fromkeys(masks))
    if len(unique) == 1:
        return unique[0]
    from nilearn.masking import intersect_masks

    return intersect_masks(unique, threshold=1, connected=False)


def _features_present(features, table, path, columns=None):
    """Refuse an events table that lacks a feature column, or the column named by
    ``items``, ``partitions`` or ``groups`` (``columns``: role -> name or None)."""
    missing = [c for c in features if c not in table.columns]
    if missing:
        raise ValueError(f"the feature column(s) {missing} are not in {path} (its columns: "
                         f"{list(table.columns)}).")
    for role, name in (columns or {}).items():
        if name is not None and name not in table.columns:
            raise ValueError(f"the {role} column {name!r} is not in {path} (its columns: "
                             f"{list(table.columns)}); {role}= names an events.tsv column "
                             "of every recording.")


def _epochs(inputs, features, tmin, tmax, baseline, trial_types, columns=None):
    """The participant's epochs, cut around the events' onsets, with the events' rows as
    metadata (a ``run`` column numbers the recordings when there are several)."""
    import mne
    from mne_bids import get_bids_path_from_fname, read_raw_bids

    parts = []
    for k, (rec, ev_path) in enumerate(zip(inputs.recordings, inputs.events)):
        table = _read_tsv(ev_path)
        if "onset" not in table.columns:
            raise ValueError(f"{ev_path} has no 'onset' column (BIDS events tables give "
                             "each event's onset in seconds).")
        _features_present(features, table, ev_path, columns)
        if trial_types is not None:
            if "trial_type" not in table.columns:
                raise ValueError(f"trial_types is given but {ev_path} has no 'trial_type' "
                                 "column.")
            table = table[table["trial_type"].astype(str).isin([str(t) for t in trial_types])]
        onset = table["onset"].apply(lambda v: np.nan if v == "n/a" else v).astype(float)
        table = table[np.isfinite(onset.to_numpy())].reset_index(drop=True)
        if not len(table):
            raise ValueError(f"{ev_path} has no event to epoch"
                             f"{' of trial_types ' + str(trial_types) if trial_types else ''}.")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # mne-bids' notes on sidecar details
            raw = read_raw_bids(get_bids_path_from_fname(rec), verbose="ERROR")
        sfreq = raw.info["sfreq"]
        samples = raw.first_samp + np.round(table["onset"].astype(float).to_numpy()
                                            * sfreq).astype(int)
        events = np.column_stack([samples, np.zeros_like(samples), np.ones_like(samples)])
        if len(inputs.recordings) > 1:
            table = table.assign(run=k)
        epochs = mne.Epochs(raw, events, {"event": 1}, tmin=tmin, tmax=tmax,
                            baseline=baseline, metadata=table, preload=True,
                            reject_by_annotation=False, verbose="ERROR")
        if len(epochs) < len(table):
            logger.info("%s: %d of %d events too close to the recording's edges for "
                        "[%g, %g] s epochs, left out", Path(rec).name,
                        len(table) - len(epochs), len(table), tmin, tmax)
        parts.append(epochs)
    epochs = parts[0] if len(parts) == 1 else mne.concatenate_epochs(parts, verbose="ERROR")
    if len(epochs) < 3:
        raise ValueError(f"sub-{inputs.participant}: {len(epochs)} epoch(s) left from "
                         f"{inputs.events}; MLEM compares pairs of at least 3 trials.")
    return epochs


# --------------------------------------------------------------------------- writing
def _stem(participant, task, space):
    """``sub-01_task-T[_space-S]_desc-mlem`` (``task-T...`` at the group level)."""
    head = f"sub-{participant}_" if participant else ""
    return f"{head}task-{task}{f'_space-{space}' if space else ''}_desc-{DESC}"


def _write_json(path, content):
    tmp = Path(f"{path}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(content, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def _write_result(res, folder, stem, bg_img=None, figures=True):
    """The result's files, as the other commands write them, under BIDS-style names."""
    res.to_data_frame().to_csv(folder / f"{stem}_importance.csv", index=False)
    if hasattr(res, "to_nifti"):
        res.to_nifti().to_filename(folder / f"{stem}_importance.nii.gz")
        res.score_img.to_filename(folder / f"{stem}_score.nii.gz")
        _write_json(folder / f"{stem}_importance.json",
                    {"Description": "MLEM permutation importance on held-out pairs, one "
                                    "volume per term", "Terms": list(res.terms),
                     "ScoreKind": res.score_kind})
    if figures:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "with n_null=", UserWarning)
            if hasattr(res, "to_nifti"):
                fig = brain_map_figure(res, bg_img)[0]
            else:
                fig = res.plot(show=False)
        save_figure(fig, folder / f"{stem}_importance.png")
    res.save(folder / f"{stem}_result.npz", overwrite=True)


def _publish(staging, dest, stem, trash_root):
    """Move the complete files of ``staging`` into ``dest``: earlier files of ``stem``
    out first, then the new ones, the result (which marks the participant as done)
    last; Ctrl-C is held back meanwhile."""
    dest.mkdir(parents=True, exist_ok=True)
    new = sorted(staging.iterdir(), key=lambda p: (p.name.endswith("_result.npz"), p.name))
    trash = None
    try:
        with deferred_interrupts():
            trash = Path(tempfile.mkdtemp(dir=trash_root, prefix=".mlem-neuro-old-"))
            for path in sorted(dest.glob(f"{stem}_*")):
                os.replace(path, trash / path.name)
            for path in new:
                os.replace(path, dest / path.name)
    finally:
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)


def _description(output_dir, bids_root, key, settings, overwrite):
    """Write (or update) ``dataset_description.json``; refuse settings that differ from
    those of the results an earlier run left for the same task, unless ``overwrite``."""
    path = output_dir / "dataset_description.json"
    settings = json.loads(json.dumps(jsonable(settings)))
    if path.is_file():
        try:
            desc = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"cannot read {path} ({err}); move it away, or choose another "
                             "output folder.") from None
        before = desc.get("MLEMSettings", {}).get(key)
        made = [p for p in output_dir.glob(f"sub-*/*/sub-*_{key}*_desc-{DESC}_result.npz")
                if _entities(p).get("task") == settings["task"]]
        if made and before is not None and before != settings and not overwrite:
            changed = sorted(k for k in set(before) | set(settings)
                             if before.get(k) != settings.get(k))
            raise ValueError(f"{output_dir} holds results of {key} made with other settings "
                             f"({', '.join(changed)} differ: see {path}); pass overwrite=True "
                             "(--overwrite) to redo the participants with the new ones, or "
                             "choose another output folder.")
    else:
        desc = {"Name": f"mlem_neuro analyses of {Path(bids_root).resolve().name}",
                "BIDSVersion": BIDS_VERSION, "DatasetType": "derivative",
                "GeneratedBy": [{"Name": "mlem_neuro", "Version": __version__,
                                 "Description": "Metric Learning Encoding Models"}],
                "SourceDatasets": [{"URL": Path(bids_root).resolve().as_uri()}]}
    desc["GeneratedBy"][0]["Version"] = __version__
    desc.setdefault("MLEMSettings", {})[key] = settings
    _write_json(path, desc)


# ----------------------------------------------------------------------- participant
@dataclass
class _Spec:
    """One participant-level run's settings (picklable: the joblib jobs take it)."""

    root: str
    output_dir: str
    task: str
    datatype: str
    features: list
    derivatives: object
    space: object
    analysis: str
    radius: float
    labels_img: object
    model: str
    standardize: object
    confounds: object
    group_runs: bool
    groups: object
    items: object
    partitions: object
    t_r: object
    tmin: float
    tmax: float
    baseline: object
    picks: object
    decim: int
    window: object
    trial_types: object
    figures: bool
    options: dict


def _one_line(err):
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


def _name_runs(err, inputs):
    """``err``'s message, with the files behind ``events[k]`` / ``bold_imgs[k]`` named."""
    text = str(err)
    names = []
    for what, files in (("events", inputs.events), ("bold_imgs", inputs.recordings)):
        for k in sorted({int(m) for m in re.findall(rf"\b{what}\[(\d+)\]", text)}):
            if k < len(files):
                names.append(f"{what}[{k}] is {files[k]}")
    return f"{text} ({'; '.join(names)})" if names else text


def _analyse_func(spec, inputs, n_jobs):
    from nilearn.image import mean_img

    from . import fmri, searchlight

    t_r = _repetition_time(inputs, spec.t_r)
    mask = _brain_mask(inputs.masks)
    confounds = _confounds(inputs, spec.confounds)
    columns = _columns(spec)
    for path in dict.fromkeys(inputs.events):
        _features_present(spec.features, _read_tsv(path), path, columns)
    extra = [c for c in dict.fromkeys(columns.values()) if c is not None
             and c not in spec.features]
    try:
        imgs, table = fmri.trial_images(inputs.recordings, inputs.events, t_r=t_r,
                                        mask_img=mask, model=spec.model,
                                        feature_cols=[*spec.features, *extra],
                                        standardize=spec.standardize, confounds=confounds)
    except ValueError as err:
        raise ValueError(_name_runs(err, inputs)) from None
    runs = table.index.get_level_values("run").to_numpy()
    groups = runs if spec.group_runs else None
    if spec.groups is not None:
        groups = table[spec.groups].to_numpy()
    partitions = None
    if spec.partitions is not None:
        partitions = table[spec.partitions].to_numpy()
    elif (spec.options.get("distance") in CROSSVALIDATED_DISTANCES
          and len(np.unique(runs)) > 1):
        partitions = runs          # the runs are independent partitions, as in the CLI
    names = [*spec.features, *([spec.items] if spec.items not in (None, *spec.features)
                               else [])]
    kw = dict(spec.options, items=spec.items, partitions=partitions, n_jobs=n_jobs,
              verbose="WARNING")
    if spec.analysis == "roi":
        res = searchlight.mlem_roi(imgs, table[names], spec.labels_img,
                                   mask_img=mask, groups=groups, **kw)
    else:
        res = searchlight.mlem_searchlight(imgs, table[names], mask,
                                           radius=spec.radius, groups=groups, **kw)
    res.settings.update(bids_t_r=t_r)
    if spec.model == "trial" and spec.standardize in ("auto", "run"):
        res.settings.update(standardize="run", standardize_runs="trial_images")
    return res, mean_img(inputs.recordings[0], copy_header=True)


def _analyse_meeg(spec, inputs, n_jobs):
    from . import time_resolved

    epochs = _epochs(inputs, spec.features, spec.tmin, spec.tmax, spec.baseline,
                     spec.trial_types, _columns(spec))
    groups = "run" if spec.group_runs and "run" in epochs.metadata.columns else None
    if spec.groups is not None:
        groups = spec.groups
    res = time_resolved.mlem_epochs(epochs, features=list(spec.features), picks=spec.picks,
                                    decim=spec.decim, window=spec.window, groups=groups,
                                    items=spec.items, partitions=spec.partitions,
                                    n_jobs=n_jobs, verbose="WARNING", **spec.options)
    return res, None


def _columns(spec):
    """The events columns named by ``items``, ``partitions`` and ``groups``."""
    return dict(items=spec.items, partitions=spec.partitions, groups=spec.groups)


def _participant_job(spec, label, n_jobs):
    """Analyse and write one participant; never raises (but for Ctrl-C): a failure is
    returned, with its cause, so that the other participants run."""
    output_dir = Path(spec.output_dir)
    staging = None
    try:
        inputs = _inputs(Path(spec.root), spec.derivatives, label, spec.task, spec.datatype,
                         spec.space)
        analyse = _analyse_func if spec.datatype == "func" else _analyse_meeg
        res, bg_img = analyse(spec, inputs, n_jobs)
        root = Path(spec.root)
        res.settings.update(bids=dict(
            participant=label, task=spec.task, datatype=spec.datatype, space=inputs.space,
            recordings=[os.path.relpath(p, root) for p in inputs.recordings],
            events=[os.path.relpath(p, root) for p in inputs.events]))
        stem = _stem(label, spec.task, inputs.space)
        staging = Path(tempfile.mkdtemp(dir=output_dir, prefix=f".mlem-neuro-new-sub-{label}-"))
        _write_result(res, staging, stem, bg_img, spec.figures)
        dest = output_dir / f"sub-{label}" / spec.datatype
        _publish(staging, dest, stem, output_dir)
        logger.info("sub-%s: done (%s)", label, dest / f"{stem}_result.npz")
        return dict(participant=label, status="done", message="",
                    result=str(dest / f"{stem}_result.npz"))
    except Exception as err:    # noqa: BLE001 - reported, the other participants run
        logger.error("sub-%s failed: %s", label, _one_line(err))
        return dict(participant=label, status="failed", message=_one_line(err), result="")
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _check_options(options):
    unknown = sorted(set(options) - set(_OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown analysis option(s) {unknown}; the options are "
                        f"{list(_OPTION_NAMES)} (and n_jobs).")
    return MLEMOptions(**options)


def _check_columns(groups, items, partitions, group_runs, distance):
    """``groups``, ``items`` and ``partitions`` (events.tsv column names) and their
    combinations, checked before any file is read."""
    for name, value in (("groups", groups), ("items", items), ("partitions", partitions)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} names a column of the events.tsv files (a str, e.g. "
                            f"{name}='run'); got {type(value).__name__} {value!r}.")
    if groups is not None and group_runs:
        raise ValueError(f"groups={groups!r} and group_runs=True both set the folds' groups; "
                         "pass one of them.")
    crossvalidated = distance in CROSSVALIDATED_DISTANCES
    if crossvalidated and items is None:
        raise ValueError(f"distance={distance!r} compares the trials of each item across "
                         "independent partitions: pass items= (the events.tsv column naming "
                         "each trial's item; and optionally partitions=, e.g. a run column).")
    if partitions is not None and not crossvalidated:
        raise ValueError(f"partitions={partitions!r} is used by the cross-validated "
                         f"distances {list(CROSSVALIDATED_DISTANCES)}; distance is "
                         f"{distance!r}.")


#: the options of one datatype's analysis: ``"func"`` or ``"meeg"`` (MEG / EEG)
_DATATYPE_OPTIONS = {"func": ("derivatives", "space", "analysis", "radius", "labels_img",
                              "model", "standardize", "confounds", "t_r"),
                     "meeg": ("tmin", "tmax", "baseline", "picks", "decim", "window",
                              "trial_types")}


def _check_datatype_options(datatype, given):
    """Refuse an option of the other datatype given a value other than its default."""
    import inspect

    params = inspect.signature(bids_participant).parameters
    kind = "func" if datatype == "func" else "meeg"
    other = "meeg" if kind == "func" else "func"
    wrong = []
    for name in _DATATYPE_OPTIONS[other]:
        value, default = given[name], params[name].default
        if isinstance(value, list):
            value = tuple(value)
        same = value is None if default is None else (
            value is not None and isinstance(value, (str, int, float, tuple))
            and value == default)
        if not same:
            wrong.append(name)
    if wrong:
        what = "fMRI" if other == "func" else "MEG / EEG"
        raise ValueError(f"{', '.join(wrong)}: option(s) of the {what} analysis, but the "
                         f"recordings of this task are {datatype}; leave them out (or give "
                         "their defaults).")


def _done_result(output_dir, label, datatype, task, space):
    """The participant's result file when it is there (``space=None``: any space)."""
    folder = Path(output_dir) / f"sub-{label}" / datatype
    if space is not None:
        path = folder / f"{_stem(label, task, space)}_result.npz"
        return path if path.is_file() else None
    found = sorted(folder.glob(f"sub-{label}_task-{task}_*desc-{DESC}_result.npz"))
    found = [p for p in found if _entities(p).get("task") == task]
    return found[0] if found else None


@verbose
@fill_doc
def bids_participant(bids_root, output_dir, *, task, features, participant_label=None,
                     datatype="auto", derivatives=None, space=None,
                     analysis="searchlight", radius=6.0, labels_img=None, model="trial",
                     standardize="auto", confounds=MOTION, group_runs=False, groups=None,
                     items=None, partitions=None, distance="euclidean", t_r=None,
                     tmin=-0.2, tmax=0.5, baseline=None, picks=None, decim=1, window=None,
                     trial_types=None, figures=True, overwrite=False, n_jobs=None,
                     verbose=None, **options):
    """The participant level of a BIDS study: one MLEM analysis per participant.

    For each participant with recordings of ``task``, the files are found
    (:func:`bids_inputs`), analysed, and the results written to ``output_dir`` as a BIDS
    derivatives dataset (module :mod:`mlem_neuro.bids` describes the layout):

    * fMRI: betas per trial (``model="trial"``, z-scored within run by default) or
      condition from the preprocessed runs with :func:`mlem_neuro.fmri.trial_images`
      (the runs' brain masks intersected, ``confounds`` from fMRIPrep's tables), then
      :func:`mlem_neuro.mlem_searchlight` (``analysis="searchlight"``) or
      :func:`mlem_neuro.mlem_roi` (``"roi"``, with ``labels_img``);
    * MEG / EEG: each recording read with mne-bids, epoched from ``tmin`` to ``tmax``
      around the onsets of its ``events.tsv`` (its rows are the epochs' metadata), the
      recordings' epochs concatenated, then :func:`mlem_neuro.mlem_epochs`.

    Participants already done (their ``*_desc-mlem_result.npz`` is there) are skipped
    unless ``overwrite``; a participant that fails is logged with its cause and the
    others still run; a second call redoes the failed and missing ones only.

    Parameters
    ----------
    %(bids_root)s
    output_dir : path-like
        The derivatives folder written (created if needed).
    %(task)s
    features : list of str
        The ``events.tsv`` columns to analyse as features (e.g. ``["trial_type"]``).
    %(participant_label)s
    %(datatype)s
    %(derivatives)s
    %(space)s
    analysis : "searchlight" | "roi"
        fMRI: a searchlight, or one model per region of ``labels_img``.
    %(radius)s
    labels_img : 3D image | path | None
        fMRI with ``analysis="roi"``: an atlas of integer labels in ``space`` (see
        :func:`mlem_neuro.mlem_roi`).
    model : "trial" | "condition"
        fMRI: one beta image per event row or per ``trial_type``
        (:func:`mlem_neuro.fmri.trial_images`).
    standardize : "auto" | "run" | None
        fMRI: z-score the betas within run (:func:`mlem_neuro.fmri.trial_images`).
    confounds : list of str | None
        fMRI: the columns of fMRIPrep's confounds tables added to the GLM (default: the
        six head-motion parameters, :data:`MOTION`); ``None``: no confounds.  Their first
        row (undefined for derivatives) is set to 0.
    group_runs : bool
        Keep each run's (fMRI) or recording's (MEG / EEG) trials in one fold.
    %(groups_bids)s
    %(items_bids)s
    %(partitions_bids)s
    %(distance_bids)s
    t_r : float | None
        fMRI: the repetition time in seconds, used only when neither the sidecars nor the
        NIfTI headers give one (they are checked against each other and between runs).
    tmin, tmax : float
        MEG / EEG: the epochs' start and end around each onset, in seconds.
    baseline : None | tuple of float
        MEG / EEG: baseline correction of the epochs (MNE's ``baseline``; default none).
    picks : str | list of str | None
        MEG / EEG: the channels (default: the good data channels).
    %(decim)s
    %(window)s
    trial_types : list of str | None
        MEG / EEG: epoch only the events whose ``trial_type`` is one of these (default:
        every event with an onset).
    figures : bool
        Draw each participant's figure (``*_importance.png``).
    overwrite : bool
        Redo the participants already done (their files are replaced once the new ones
        are complete), and accept settings other than those recorded in
        ``dataset_description.json``.
    n_jobs : int | None
        Participants run in parallel with joblib (``None``: one at a time; inside
        ``joblib.parallel_config(backend="dask")`` they run on a dask cluster).  Each
        participant's analysis then runs in one job; with a single participant to run,
        its analysis gets the ``n_jobs`` (as in :func:`mlem_neuro.mlem_epochs`).
    %(verbose)s
    **options
        The analysis options of :func:`mlem_neuro.mlem_epochs` and
        :func:`mlem_neuro.mlem_searchlight` (``cv``, ``n_repeats``, ``n_null``,
        ``random_state``, ``max_steps``, ``constraint``...), checked before any file is
        read.

    Returns
    -------
    report : DataFrame
        One row per participant: ``participant``, ``status`` (``"done"``, ``"skipped"``:
        done before, ``"failed"``), ``message`` (the cause of a failure) and ``result``
        (the result file).  A warning lists the failed participants.

    Raises
    ------
    ValueError
        Before any file is written: a bad option or combination (``groups`` with
        ``group_runs``; a cross-validated ``distance`` without ``items``; ``partitions``
        with another ``distance``), or an option of one datatype given another value than
        its default for the other (``picks`` for fMRI, ``labels_img`` for EEG...).  A
        participant whose ``events.tsv`` lacks a column named by ``features``, ``items``,
        ``partitions`` or ``groups`` fails with the file named, and the others run.

    See Also
    --------
    bids_group, run_bids

    Examples
    --------
    >>> from mlem_neuro.bids import bids_participant
    >>> report = bids_participant("ds000001", "derivatives/mlem",
    ...                           task="balloonanalogrisktask", features=["trial_type"],
    ...                           space="MNI152NLin2009cAsym", n_null=99,
    ...                           random_state=0)                    # doctest: +SKIP
    >>> report[report.status == "failed"]                          # doctest: +SKIP
    """
    import pandas as pd
    from joblib import Parallel, delayed, effective_n_jobs

    opts = _check_options({**options, "distance": distance})
    check("analysis", analysis)
    check("model", model)
    check("n_jobs", n_jobs)
    _check_columns(groups, items, partitions, group_runs, opts.distance)
    if analysis == "roi" and labels_img is None:
        raise ValueError("analysis='roi' needs labels_img: an atlas of integer labels in "
                         "the runs' space.")
    if isinstance(features, str):
        features = [features]
    if not features:
        raise ValueError("features names no column: pass the events.tsv columns to "
                         "analyse, e.g. features=['trial_type'].")
    if isinstance(confounds, str):
        confounds = [confounds]
    root = _root(bids_root)
    labels, datatype = _participants(root, task, participant_label, datatype)
    _check_datatype_options(datatype, locals())
    if datatype == "func":
        if model != "trial" and (items, groups, partitions) != (None, None, None):
            raise ValueError(f"items, groups and partitions name events.tsv columns per "
                             f"trial: they need model='trial' (model={model!r} makes one "
                             "image per trial_type, averaged over its trials and runs).")
        _derivatives(root, derivatives)          # before anything is written
    output_dir = Path(os.fspath(output_dir))
    if output_dir.resolve() == root.resolve():
        raise ValueError(f"output_dir {output_dir} is the BIDS dataset itself; write the "
                         "derivatives to a folder of their own (e.g. "
                         "<bids_root>/derivatives/mlem).")
    output_dir.mkdir(parents=True, exist_ok=True)
    fmri = datatype == "func"
    settings = dict(task=task, datatype=datatype, features=list(features),
                    space=space if fmri else None, options=opts.to_settings(),
                    groups=groups, items=items, partitions=partitions,
                    **(dict(analysis=analysis, radius=radius if analysis == "searchlight"
                            else None, labels_img=None if labels_img is None else
                            str(labels_img) if isinstance(labels_img, (str, os.PathLike))
                            else "image", model=model, standardize=standardize,
                            confounds=None if confounds is None else list(confounds),
                            group_runs=group_runs) if fmri else
                       dict(tmin=tmin, tmax=tmax, baseline=baseline, picks=picks,
                            decim=decim, window=window, trial_types=trial_types,
                            group_runs=group_runs)))
    key = f"task-{task}" + (f"_space-{space}" if fmri and space else "")
    _description(output_dir, root, key, settings, overwrite)
    spec = _Spec(root=str(root), output_dir=str(output_dir), task=task, datatype=datatype,
                 features=list(features), derivatives=derivatives, space=space,
                 analysis=analysis, radius=radius, labels_img=labels_img, model=model,
                 standardize=standardize, confounds=confounds, group_runs=group_runs,
                 groups=groups, items=items, partitions=partitions, t_r=t_r,
                 tmin=tmin, tmax=tmax, baseline=baseline, picks=picks,
                 decim=decim, window=window, trial_types=trial_types, figures=figures,
                 options={**options, "distance": opts.distance})
    rows, todo = {}, []
    for label in labels:
        done = _done_result(output_dir, label, datatype, task, space if fmri else None)
        if done is not None and not overwrite:
            rows[label] = dict(participant=label, status="skipped",
                               message="done before", result=str(done))
        else:
            todo.append(label)
    skipped = [s for s in labels if s not in todo]
    if skipped:
        logger.info("participants done before, skipped: %s (overwrite=True redoes them)",
                    ", ".join(f"sub-{s}" for s in skipped))
    workers = effective_n_jobs(n_jobs) if len(todo) > 1 else 1
    inner = n_jobs if workers == 1 else 1
    logger.info("%d participant(s) to analyse (%s), %d at a time", len(todo), datatype,
                workers)
    jobs = (delayed(_participant_job)(spec, label, inner) for label in todo)
    # MNE's ``verbose`` sets its one logger's level for the length of a call and then
    # restores it: participants read in threads (joblib's threading backend, a dask
    # worker's threads) interleave those calls and left it at WARNING after the run
    # (measured: MNE's progress bars silenced in the rest of the session)
    import mne

    mne_level = mne.utils.logger.level
    try:
        for row in Parallel(n_jobs=n_jobs if len(todo) > 1 else 1)(jobs):
            rows[row["participant"]] = row
    finally:
        mne.utils.logger.setLevel(mne_level)
    report = pd.DataFrame([rows[s] for s in labels],
                          columns=["participant", "status", "message", "result"])
    failed = report[report.status == "failed"]
    if len(failed):
        causes = "; ".join(f"sub-{p} ({m})" for p, m in zip(failed.participant,
                                                           failed.message))
        warn_user(f"{len(failed)} of {len(report)} participant(s) failed: {causes}. The "
                  "others are written; run again to redo only the failed ones.")
    return report


# ----------------------------------------------------------------------------- group
def _group_results(output_dir, task, space, participant_label):
    """The participants' results of ``task`` in ``output_dir``, and the settings."""
    from .results import read_result

    path = output_dir / "dataset_description.json"
    if not path.is_file():
        raise FileNotFoundError(f"{output_dir} holds no participant-level results: run the "
                                f"participant level first ({path} not found).")
    desc = json.loads(path.read_text())
    keys = [k for k in desc.get("MLEMSettings", {})
            if k == f"task-{task}" or k.startswith(f"task-{task}_space-")]
    if space is not None:
        keys = [k for k in keys if k == f"task-{task}_space-{space}"] or \
            [k for k in keys if k == f"task-{task}"]
    if not keys:
        have = sorted(desc.get("MLEMSettings", {}))
        raise ValueError(f"{output_dir} holds no participant-level results of task {task!r}"
                         f"{'' if space is None else f' in space {space!r}'} (it holds "
                         f"{have}); run the participant level of that task first.")
    if len(keys) > 1:
        raise ValueError(f"{output_dir} holds results of task {task!r} in several spaces "
                         f"({keys}); pass space= to choose one.")
    settings = desc["MLEMSettings"][keys[0]]
    datatype = settings["datatype"]
    filters = [("task", task), ("desc", DESC)]
    files = [f for f in _files(output_dir, "result", "npz", folder=datatype, filters=filters)
             if space is None or _entities(f).get("space") in (space, None)]
    if space is None:
        spaces = {_entities(f).get("space") for f in files}
        if len(spaces) > 1:
            raise ValueError(f"{output_dir} holds results of task {task!r} in several "
                             f"spaces {sorted(map(str, spaces))}; pass space=.")
    asked = _labels(participant_label)
    if asked is not None:
        files = [f for f in files if _entities(f)["sub"] in asked]
    if len(files) < 2:
        raise ValueError(f"the group level needs the results of 2 participants or more; "
                         f"{output_dir} holds {len(files)} of task {task!r}"
                         f"{'' if asked is None else f' among {asked}'}: run the "
                         "participant level first.")
    labels = [_entities(f)["sub"] for f in files]
    return [read_result(f) for f in files], labels, settings, _entities(files[0]).get("space")


def _group_time(results, terms, measure, n_null, random_state, n_jobs, folder, stem,
                figures):
    import pandas as pd

    from .stats import permutation_cluster_test, plot_clusters

    tests, rows, curves = {}, [], []
    for term in terms:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "with n_null=", UserWarning)
            res = permutation_cluster_test(results, term, measure=measure, n_null=n_null,
                                           random_state=random_state, n_jobs=n_jobs,
                                           verbose="WARNING")
        tests[term] = res
        table = res.to_data_frame()
        rows.append(table)
        curves.append(pd.DataFrame({"term": term, "time": res.times,
                                    "mean": res.data.mean(axis=0), "t": res.t_obs}))
    clusters = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    clusters.insert(1, "measure", measure)
    clusters.to_csv(folder / f"{stem}_clusters.csv", index=False)
    pd.concat(curves, ignore_index=True).to_csv(folder / f"{stem}_tstat.csv", index=False)
    if figures:
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(terms), 1, figsize=(7, 2.4 * len(terms)),
                                 squeeze=False, sharex=True)
        for ax, term in zip(axes[:, 0], terms):
            plot_clusters(results, term, stats=tests[term], ax=ax, show=False)
        fig.tight_layout()
        save_figure(fig, folder / f"{stem}_clusters.png")
    return tests


def _group_maps(results, terms, measure, n_null, random_state, n_jobs, folder, stem,
                figures):
    import pandas as pd
    from nilearn.image import concat_imgs

    from .stats import second_level_maps

    tests, rows = {}, []
    for term in terms:
        logp = second_level_maps(results, term, n_null=n_null, random_state=random_state,
                                 n_jobs=n_jobs, measure=measure)
        tests[term] = logp
        data = np.asarray(logp.dataobj)
        k = np.unravel_index(int(np.nanargmax(data)), data.shape)
        peak = (logp.affine @ np.r_[np.array(k, dtype=float), 1.0])[:3]
        rows.append(dict(term=term, measure=measure, max_logp=float(np.nanmax(data)),
                         n_voxels_p05=int((data > -np.log10(0.05)).sum()),
                         peak_x=float(peak[0]), peak_y=float(peak[1]), peak_z=float(peak[2])))
    concat_imgs([tests[t] for t in terms]).to_filename(folder / f"{stem}_logp.nii.gz")
    _write_json(folder / f"{stem}_logp.json",
                {"Description": "-log10 family-wise corrected p-values of the one-sample "
                                "permutation test across participants "
                                "(mlem_neuro.stats.second_level_maps), one volume per term",
                 "Terms": list(terms), "Measure": measure, "NNull": int(n_null)})
    pd.DataFrame(rows).to_csv(folder / f"{stem}_summary.csv", index=False)
    if figures:
        import matplotlib.pyplot as plt
        from nilearn.plotting import plot_stat_map

        fig, axes = plt.subplots(len(terms), 1, figsize=(8, 2.6 * len(terms)),
                                 squeeze=False)
        for ax, term in zip(axes[:, 0], terms):
            plot_stat_map(tests[term], bg_img=None, axes=ax, figure=fig, title=term,
                          draw_cross=False, colorbar=True)
        save_figure(fig, folder / f"{stem}_logp.png")
    return tests


@verbose
@fill_doc
def bids_group(output_dir, *, task, space=None, participant_label=None,
               measure="importance", terms=None, n_null=None, random_state=0,
               figures=True, n_jobs=None, verbose=None):
    """The group level of a BIDS study: group tests over the participants' results.

    Reads the participants' results that :func:`bids_participant` wrote to
    ``output_dir`` and tests each term across participants: time courses (MEG / EEG)
    with :func:`mlem_neuro.stats.permutation_cluster_test` (clusters over time), brain
    maps (fMRI) with :func:`mlem_neuro.stats.second_level_maps` (voxel-level
    family-wise corrected).  The outputs go to ``output_dir/group/`` (their files
    replaced at once when complete): ``task-<T>_desc-mlem_clusters.csv`` (one row per
    cluster), ``_tstat.csv`` (group mean and t over time) and ``_clusters.png``; or
    ``task-<T>_space-<S>_desc-mlem_logp.nii.gz`` (one volume per term, named in
    ``_logp.json``), ``_summary.csv`` and ``_logp.png``.

    Parameters
    ----------
    output_dir : path-like
        The derivatives folder of the participant level.
    %(task)s
    %(space)s
    %(participant_label)s
    measure : "importance" | "main_effect"
        Test each term's held-out importance, or each feature's in-sample main effect.
    terms : list of str | None
        The terms (features) to test; default: every term of the results (every
        feature with ``measure="main_effect"``).
    n_null : int | None
        Sign-flip permutations (default: 1024 for time courses, 10000 for maps; all
        ``2 ** n_participants`` when fewer).
    random_state : None | int
        Seeds the permutations.
    figures : bool
        Draw the group figure.
    n_jobs : int | None
        Passed to the group tests.
    %(verbose)s

    Returns
    -------
    tests : dict
        Term -> :class:`~mlem_neuro.stats.timecourse.ClusterTestResult` (time courses)
        or the image of ``-log10`` FWE-corrected p-values (maps); under the key
        ``"participants"``, the participants tested.

    See Also
    --------
    bids_participant, run_bids

    Examples
    --------
    >>> from mlem_neuro.bids import bids_group
    >>> tests = bids_group("derivatives/mlem", task="words")            # doctest: +SKIP
    >>> tests["word_class"].to_data_frame()                             # doctest: +SKIP
    """
    output_dir = Path(os.fspath(output_dir))
    if not output_dir.is_dir():
        raise FileNotFoundError(f"{output_dir} holds no participant-level results: run the "
                                "participant level first (it writes them there).")
    check("n_jobs", n_jobs)
    results, labels, settings, space = _group_results(output_dir, task, space,
                                                      participant_label)
    names = results[0].feature_names if measure == "main_effect" else results[0].terms
    if terms is None:
        terms = list(names)
    else:
        terms = [terms] if isinstance(terms, str) else list(terms)
        bad = [t for t in terms if t not in names]
        if bad:
            raise ValueError(f"terms {bad} are not terms of the results; they have {names}.")
    maps = settings["datatype"] == "func"
    n_null = (10000 if maps else 1024) if n_null is None else check("n_null", n_null)
    stem = _stem(None, task, space)
    staging = Path(tempfile.mkdtemp(dir=output_dir, prefix=".mlem-neuro-new-group-"))
    try:
        run = _group_maps if maps else _group_time
        tests = run(results, terms, measure, n_null, random_state, n_jobs, staging, stem,
                    figures)
        _write_json(staging / f"{stem}_participants.json",
                    {"Participants": [f"sub-{s}" for s in labels], "Measure": measure,
                     "NNull": int(n_null)})
        _publish(staging, output_dir / "group", stem, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("group level of task %s: %d participants, written to %s", task,
                len(labels), output_dir / "group")
    return {**tests, "participants": labels}


@fill_doc
def run_bids(bids_root, output_dir, analysis_level, **kwargs):
    """MLEM as a BIDS App: ``run_bids(bids_root, output_dir, "participant" | "group")``.

    The function behind ``mlem-neuro bids BIDS_ROOT OUTPUT_DIR participant|group``.

    Parameters
    ----------
    %(bids_root)s
    output_dir : path-like
        The derivatives folder (e.g. ``<bids_root>/derivatives/mlem``).
    analysis_level : "participant" | "group"
        Analyse each participant (:func:`bids_participant`), or test the participants'
        results across the group (:func:`bids_group`).
    **kwargs
        The parameters of :func:`bids_participant` (``task``, ``features`` and the
        analysis options) or of :func:`bids_group` (``task``...).

    Returns
    -------
    out : DataFrame | dict
        What :func:`bids_participant` or :func:`bids_group` returns.

    Examples
    --------
    >>> from mlem_neuro.bids import run_bids
    >>> run_bids("study", "study/derivatives/mlem", "participant", task="words",
    ...          features=["word_class"], n_null=99, random_state=0)   # doctest: +SKIP
    >>> run_bids("study", "study/derivatives/mlem", "group", task="words")
    ...                                                                # doctest: +SKIP
    """
    check("analysis_level", analysis_level)
    if analysis_level == "participant":
        return bids_participant(bids_root, output_dir, **kwargs)
    _root(bids_root)
    return bids_group(output_dir, **kwargs)
