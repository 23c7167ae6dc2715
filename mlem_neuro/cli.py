"""The ``mlem-neuro`` command line.

* ``mlem-neuro demo``: the main job on built-in simulated data (no download): MLEM vs
  FR-RSA-I vs FR-RSA on a simulation whose true metric is realisable, plus a time-resolved
  analysis of simulated epochs; figures, a CSV table and an HTML report go to ``--out``.
* ``mlem-neuro epochs FILE-epo.fif --features a,b --out DIR``: time-resolved MLEM.
* ``mlem-neuro searchlight --imgs RUN... --events TSV... --t-r 2.5 --mask MASK --features
  a,b --out DIR``: per-trial beta maps with nilearn's GLM (z-scored within run:
  ``--standardize``), then a searchlight; ``--group-runs`` keeps each run's trials in one
  fold.  Writes the importance maps (``importance.nii.gz``, one volume per term), the
  held-out Spearman map (``score.nii.gz``), a table and a figure.

``--features`` is required: no column is analysed unless named (without it the command
stops and lists the columns that can be features, leaving out labels, IDs and constant
columns).  ``--out`` is checked before any data are read: it must be writable, and
results already there are replaced only with ``--overwrite``.  Bad paths, unreadable
inputs and bad options end with a one-line error and exit code 2; warnings print one
line each.
"""
from __future__ import annotations

import argparse
import inspect
import os
import re
import shutil
import sys
import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np

from ._docs import short_doc
from ._outputs import brain_map_figure as _brain_map_figure
from ._outputs import deferred_interrupts as _deferred_interrupts
from ._provenance import describe as describe_provenance
from .core.checks import (
    BACKENDS,
    CONSTRAINTS,
    CROSSVALIDATED_DISTANCES,
    FEATURE_KINDS,
    FEATURE_TESTS,
    FMRI_MODELS,
    HELD_OUT_PAIRS,
    LEVELS,
    NULLS,
    argparse_type,
    registered_distances,
)
from .core.options import MLEMOptions
from .demo import DEMO_OUTPUTS, run_demo

EXIT_USAGE = 2


class CLIError(Exception):
    """An error reported to the user in one line."""


# --------------------------------------------------------------------- shared helpers
#: files that mark an --out folder as holding the results of ``epochs`` / ``searchlight``
RESULT_PATTERNS = ("mlem.npz", "importance.*", "score.*")
IN_SAMPLE = "in-sample (no cross-validation)"


class _OneName(argparse.Action):
    """Store a value given under one of an option's names (a current name and a former
    one, e.g. ``--random-state`` and ``--seed``); giving it under two is an error naming
    both, as the API refuses a parameter under its former and its new name."""

    def __call__(self, parser, namespace, values, option_string=None):
        seen = getattr(namespace, "_one_name_seen", {})
        first = seen.setdefault(self.dest, option_string)
        if first != option_string:
            parser.error(f"{first} and {option_string} are one option under its former and "
                         f"current names: give only {self.option_strings[0]}")
        namespace._one_name_seen = seen
        setattr(namespace, self.dest, values)


def _existing(path, what):
    p = Path(path)
    if not p.exists():
        raise CLIError(f"{what} not found: {path}")
    return p


def _name_list(text, option):
    """``"a, b"`` → ``["a", "b"]`` (spaces and empty items ignored); ``None`` stays None."""
    if text is None:
        return None
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise CLIError(f"{option} {text!r} names nothing; give comma-separated names, e.g. "
                       f"{option} a,b")
    return names


def check_out(out, overwrite, patterns=RESULT_PATTERNS):
    """Refuse an output folder that cannot be written, or that already holds results.

    Runs before any data are read, so that a long analysis never ends unable to save, and
    earlier results are replaced only when ``overwrite`` (``--overwrite``) says so.
    Nothing is created here.  An empty name, one with control characters, and the
    current folder itself are refused: results go into a folder of their own.
    """
    text = os.fspath(out)
    if not str(text).strip() or any(ord(c) < 32 for c in str(text)):
        raise CLIError(f"--out {text!r} is not a folder name; give the folder for the "
                       "results, e.g. --out results/")
    out = Path(out)
    if out.resolve() == Path.cwd().resolve():
        raise CLIError(f"--out {text} is the current folder; give the results a folder of "
                       "their own, e.g. --out results/")
    if out.exists():
        if not out.is_dir():
            raise CLIError(f"--out {out} is a file, not a folder; give a folder path")
        if not os.access(out, os.W_OK | os.X_OK):
            raise CLIError(f"--out {out} is not writable; choose another folder")
        found = sorted({p.name for pattern in patterns for p in out.glob(pattern)})
        if found and not overwrite:
            raise CLIError(f"--out {out} already holds results ({', '.join(found)}); pass "
                           "--overwrite to replace them, or choose another folder")
        return out
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise CLIError(f"--out {out} cannot be created: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"--out {out} cannot be created: no write permission in {parent}")
    return out


def _publish(out, write):
    """Write a result set with ``write(folder)`` and put it in ``out`` in one step.

    The new files are written into a hidden folder inside ``out``; only once all of them
    are complete are the results an earlier run left there (``--overwrite``, checked by
    :func:`check_out`) moved aside and the new ones moved in, with Ctrl-C held back for
    those renames.  A failed or interrupted run leaves the old set as it was; no file of
    another analysis stays beside the new ones (e.g. a searchlight's score.nii.gz beside
    an epochs run's mlem.npz); the user's other files are left alone.
    """
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out, prefix=".mlem-neuro-new-"))
    trash = None
    try:
        write(staging)
        new = sorted(staging.iterdir())
        old = sorted({p for pattern in RESULT_PATTERNS for p in out.glob(pattern)
                      if p.is_file()})
        with _deferred_interrupts():
            trash = Path(tempfile.mkdtemp(dir=out, prefix=".mlem-neuro-old-"))
            for path in old:
                os.replace(path, trash / path.name)
            for path in new:
                os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)


def _note(text):
    print(f"mlem-neuro: note: {text}", file=sys.stderr)


def id_columns(table):
    """Columns with one distinct value per row: labels (word strings, IDs) or trial numbers.

    Text/categorical columns with as many distinct values as rows, and integer columns
    that are a permutation of consecutive numbers.  Such columns give every pair the same
    categorical distance (or a trial-order distance): they are not features.
    """
    import pandas as pd

    n, found = len(table), []
    if n < 3:
        return found
    for name in table.columns:
        col = table[name]
        if col.isna().any() or pd.api.types.is_bool_dtype(col):
            continue
        if pd.api.types.is_integer_dtype(col):
            values = np.sort(col.to_numpy())
            if np.array_equal(values, values[0] + np.arange(n)):
                found.append(name)
        elif not pd.api.types.is_numeric_dtype(col) and col.nunique() == n:
            found.append(name)
    return found


def _feature_candidates(table, exclude=()):
    """The columns of ``table`` that can be features: ``(kept, ids, constant)``.

    ``ids``: columns with one distinct value per row (:func:`id_columns`); ``constant``:
    columns with one value in every row (no distance); ``kept``: the others, in table
    order; columns in ``exclude`` (groups, items...) are in none of them.
    """
    columns = [c for c in table.columns if c not in exclude]
    ids = id_columns(table[columns])
    constant = [c for c in columns if c not in ids and table[c].nunique(dropna=False) <= 1]
    kept = [c for c in columns if c not in ids and c not in constant]
    return kept, ids, constant


def _no_features_error(table, where, exclude=(), row="trial"):
    """The CLIError refusing to run without ``--features``: it lists the ``where`` columns
    that can be features (and those left out, and why) and says how to name them.

    Analysing every column by default made metadata such as reaction times, runs or
    nested labels (animacy beside category) into features without the user choosing
    them; their tests can be meaningless (see :mod:`mlem_neuro.core.stimuli.design`).
    """
    kept, ids, constant = _feature_candidates(table, exclude)
    left = []
    if ids:
        left.append(f"left out {ids}: one distinct value per {row}, labels or IDs")
    if constant:
        left.append(f"left out {constant}: one value in every {row}")
    if left:
        left.append("name them in --features to use them anyway")
    left_out = f" ({'; '.join(left)})" if left else ""
    if not kept:
        return CLIError(f"--features is required, and no {where} column can be a "
                        f"feature: columns {list(table.columns)}{left_out}")
    example = ",".join(str(c) for c in kept[:2])
    return CLIError(f"--features is required: name the {where} columns to analyse, "
                    f"comma-separated, e.g. --features {example}; the {where} columns "
                    f"that can be features: {kept}{left_out}")


def _score_kind(args, groups=None):
    if args.cv == 0:
        return IN_SAMPLE
    over = f" grouped by {groups}" if groups else ""
    return f"held-out, {args.cv}-fold cross-validation{over}"


def _items_note(res):
    """``", 12 items of 5-10 trials"`` for a result on items, else ``""``."""
    counts = res.settings.get("trials_per_item")
    if not counts:
        return ""
    return f", {len(counts)} items of {min(counts)}-{max(counts)} trials"


def _save_figure(fig, fname):
    import matplotlib.pyplot as plt

    fig.savefig(fname, dpi=110)
    plt.close(fig)


def _analysis_kwargs(args):
    return dict(cv=None if args.cv == 0 else args.cv, n_repeats=args.n_repeats,
                n_permutations=args.n_permutations,
                n_null=args.n_null, null=args.null, feature_test=args.feature_test,
                held_out_pairs=args.held_out_pairs,
                level=args.level,
                constraint=args.constraint, interactions=args.interactions,
                n_jobs=args.n_jobs, device=args.device, backend=args.backend,
                random_state=args.random_state,
                lr=args.lr, max_steps=args.max_steps, patience=args.patience, tol=args.tol,
                batch_size=args.batch_size, numeric_levels=args.numeric_levels,
                chunk_size=args.chunk_size, feature_kinds=args.feature_kinds,
                feature_groups=args.feature_groups, missing_distance=args.missing_distance,
                verbose="INFO")


def _check_options(args):
    """Validate the analysis options (MLEMOptions) before any file is read."""
    from .core.options import MLEMOptions

    kw = _analysis_kwargs(args)
    kw.pop("verbose")
    MLEMOptions(**kw)


def _feature_kinds(text):
    """``COLUMN=KIND,...`` as a dict (the analyses' ``feature_kinds``; the kinds are
    checked by the ``feature_kinds`` check)."""
    out = {}
    for part in text.split(","):
        col, sep, kind = (x.strip() for x in part.partition("="))
        if not sep or not col or not kind:
            raise argparse.ArgumentTypeError(
                f"expected COLUMN=KIND pairs separated by commas, KIND one of "
                f"{', '.join(FEATURE_KINDS)} (e.g. condition=categorical); got {part!r}")
        out[col] = kind
    return out


def _feature_groups(text):
    """``NAME=COLUMN+COLUMN,...`` as a dict (the analyses' ``feature_groups``)."""
    out = {}
    for part in text.split(","):
        name, sep, cols = (x.strip() for x in part.partition("="))
        cols = [c.strip() for c in cols.split("+")]
        if not sep or not name or not all(cols):
            raise argparse.ArgumentTypeError(
                f"expected NAME=COLUMN+COLUMN groups separated by commas (e.g. "
                f"position=x+y); got {part!r}")
        if name in out:
            raise argparse.ArgumentTypeError(f"feature group {name!r} is given twice")
        out[name] = cols
    return out


def _missing_distance(text):
    """A number, or ``FEATURE=NUMBER,...`` (the analyses' ``missing_distance``)."""
    def number(value, part):
        try:
            return float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number or FEATURE=NUMBER pairs separated by commas (e.g. 0.5 "
                f"or frequency=1); got {part!r}") from None
    if "=" not in text:
        return number(text.strip(), text)
    out = {}
    for part in text.split(","):
        name, sep, value = (x.strip() for x in part.partition("="))
        if not sep or not name:
            number("", part)
        out[name] = number(value, part)
    return out


def _word_or_int(*words, number=int):
    """Parse ``words`` as they are (``"none"`` as None), anything else as ``number``."""
    def parse(text):
        if text in words:
            return None if text == "none" else text
        return number(text)
    return parse


#: each analysis flag's parameter, and how its text is read before the parameter's check
#: (:data:`mlem_neuro.core.checks.CHECKS`, the same as the API's)
FLAG_PARAMS = {
    "--cv": ("cv", int), "--n-permutations": ("n_permutations", int),
    "--null": ("null", str), "--feature-test": ("feature_test", str),
    "--held-out-pairs": ("held_out_pairs", str),
    "--level": ("level", str), "--constraint": ("constraint", str),
    "--n-jobs": ("n_jobs", int), "--device": ("device", str), "--backend": ("backend", str),
    "--random-state": ("random_state", int), "--feature-kinds": ("feature_kinds", None),
    "--feature-groups": ("feature_groups", None),
    "--missing-distance": ("missing_distance", None),
    "--lr": ("lr", _word_or_int("auto", number=float)),
    "--max-steps": ("max_steps", int), "--patience": ("patience", _word_or_int("auto")),
    "--tol": ("tol", float), "--batch-size": ("batch_size", _word_or_int("auto", "full")),
    "--numeric-levels": ("numeric_levels", _word_or_int("auto", "none")),
    "--chunk-size": ("chunk_size", int), "--n-null": ("n_null", int),
    "--n-repeats": ("n_repeats", _word_or_int("auto")),
    "--distance": ("distance", str), "--radius": ("radius", float),
    "--model": ("model", str),
}


def _flag_type(flag):
    """The argparse ``type=`` of an analysis flag: its parameter's check."""
    name, parse = FLAG_PARAMS[flag]
    parse = parse or {"--feature-kinds": _feature_kinds, "--feature-groups": _feature_groups,
                      "--missing-distance": _missing_distance}[flag]
    return argparse_type(name, parse, as_value=(lambda v: None if v == 0 else v)
                         if flag == "--cv" else None)


def _one_line_warning(message, category, filename, lineno, line=None):
    """``warnings.formatwarning`` for the command line: one line, no source code."""
    return f"mlem-neuro: warning: {' '.join(str(message).split())}\n"


# ---------------------------------------------------------------------------- epochs
def _read_epochs(fname):
    """``mne.read_epochs``; any failure becomes one CLIError naming the file."""
    import mne

    try:
        return mne.read_epochs(fname, preload=True, verbose="ERROR")
    except MemoryError:
        raise
    except Exception as err:   # MNE raises many kinds on a file that is not epochs
        reason = " ".join(str(err).split()) or "no detail"
        raise CLIError(f"cannot read {fname} as MNE epochs ({type(err).__name__}: "
                       f"{reason}); give an epochs file saved by MNE (epochs.save(), "
                       "*-epo.fif)") from None


def _epochs_features(args, epochs):
    names = _name_list(args.features, "--features")
    if names is not None:
        return names
    exclude = [c for c in (args.groups, args.items, getattr(args, "partitions", None)) if c]
    if epochs.metadata is not None:
        raise _no_features_error(epochs.metadata, "metadata", exclude)
    from .adapters.epochs import features_from_events

    raise _no_features_error(features_from_events(epochs), "event-name", exclude)


def _metadata_arg(args, epochs, flag, column):
    """``column`` (the value of ``flag``), checked to be a metadata column before any
    work; ``None`` stays ``None``."""
    if column is None:
        return None
    meta = epochs.metadata
    if meta is None or column not in meta.columns:
        have = [] if meta is None else list(meta.columns)
        raise CLIError(f"{flag} {column!r} is not a metadata column of {args.fname} "
                       f"(columns: {have})")
    return column


def _epochs_items(args, epochs):
    """The --items column, checked against the metadata before any work."""
    return _metadata_arg(args, epochs, "--items", args.items)


def _epochs_partitions(args, epochs):
    """The --partitions column (with --distance crossnobis / cv_euclidean and --items)."""
    crossvalidated = args.distance in CROSSVALIDATED_DISTANCES
    if args.partitions is None and not crossvalidated:
        return None
    if args.items is None:
        raise CLIError(f"--distance {args.distance} compares the trials of each item: pass "
                       "--items COLUMN (and optionally --partitions COLUMN, e.g. the run)")
    if args.partitions is not None and not crossvalidated:
        raise CLIError("--partitions is used by --distance crossnobis or cv_euclidean")
    return _metadata_arg(args, epochs, "--partitions", args.partitions)


def _epochs_groups(args, epochs):
    if _metadata_arg(args, epochs, "--groups", args.groups) is None:
        return None
    meta = epochs.metadata
    n_groups = meta[args.groups].nunique()
    if n_groups < args.cv:
        raise CLIError(f"--groups {args.groups} with --cv {args.cv} needs at least {args.cv} "
                       f"distinct values of {args.groups!r}; it has {n_groups}. Lower --cv "
                       "or choose another --groups column.")
    return args.groups


def _peak_summary(res, where):
    score = res.score
    if not np.isfinite(score).any():
        return "no finite score"
    k = int(np.nanargmax(score))
    return f"peak {score[k]:.3f} {where(k)}, mean {np.nanmean(score):.3f}"


def _print_tests(res, what):
    """One line per test: how many models are significant, family-wise corrected."""
    if res.tests is None:
        return
    n_null = res.settings.get("n_null")
    with warnings.catch_warnings():          # too few nulls: the note below says it
        warnings.filterwarnings("ignore", "with n_null=", UserWarning)
        counts = ", ".join(f"{t} {int(res.significant(t).sum())}" for t in res.tests)
    print(f"Permutation tests ({n_null} null relabellings), {what} with FWE-corrected "
          f"p < 0.05: {counts} (of {len(res.pvalues)})")
    if n_null is not None and 1.0 / (1 + n_null) >= 0.05:
        _note(f"with --n-null {n_null} the smallest p-value is 1/{n_null + 1} = "
              f"{1.0 / (1 + n_null):.3g}: no model can reach p < 0.05; pass --n-null 20 "
              "or more (e.g. 99) to test at that level")


def run_epochs(args):
    """``mlem-neuro epochs``: a time-resolved analysis of an epochs file."""
    _check_options(args)
    fname = _existing(args.fname, "epochs file")
    picks = _name_list(args.picks, "--picks")
    _name_list(args.features, "--features")
    if args.groups is not None and args.cv == 0:
        raise CLIError("--groups needs cross-validation: pass --cv 2 or more, not 0")
    out = check_out(args.out, args.overwrite)
    import matplotlib

    matplotlib.use("Agg")
    from . import time_resolved

    epochs = _read_epochs(fname)
    groups = _epochs_groups(args, epochs)
    items = _epochs_items(args, epochs)
    partitions = _epochs_partitions(args, epochs)
    features = _epochs_features(args, epochs)
    res = time_resolved.mlem_epochs(epochs, features=features, picks=picks, tmin=args.tmin,
                                    tmax=args.tmax, decim=args.decim, window=args.window,
                                    groups=groups, items=items, partitions=partitions,
                                    distance=args.distance, **_analysis_kwargs(args))
    if groups is not None:
        res.settings.update(groups=groups, cv=f"GroupKFold({args.cv}) over {groups}")
    def write(folder):
        res.save(folder / "mlem.npz", overwrite=True)
        res.to_data_frame().to_csv(folder / "importance.csv", index=False)
        with warnings.catch_warnings():         # too few nulls: _print_tests notes it
            warnings.filterwarnings("ignore", "with n_null=", UserWarning)
            fig = res.plot(show=False)
        _save_figure(fig, folder / "importance.png")

    _publish(out, write)
    print(f"Wrote {out / 'mlem.npz'}, {out / 'importance.csv'}, {out / 'importance.png'}")
    summary = _peak_summary(res, lambda k: f"at {res.times[k]:.3f} s")
    print(f"Spearman rho ({_score_kind(args, groups)}{_items_note(res)}): {summary}")
    _print_tests(res, "time points")
    print(f"Computed with {describe_provenance(res.provenance)}")


# ---------------------------------------------------------------------- searchlight
def _searchlight_inputs(args):
    """Input paths and option combinations, checked before anything is read."""
    imgs = [str(_existing(p, "image")) for p in args.imgs]
    event_files = [_existing(p, "events file") for p in args.events]
    mask = str(_existing(args.mask, "mask image"))
    if len(imgs) != len(event_files):
        raise CLIError(f"give one events file per run: {len(imgs)} images, "
                       f"{len(event_files)} events files")
    _name_list(args.features, "--features")
    if args.standardize == "run" and args.model != "trial":
        raise CLIError("--standardize run needs --model trial (condition images average "
                       "over runs, so no run is left to z-score within)")
    if args.group_runs:
        if args.model != "trial":
            raise CLIError("--group-runs needs --model trial (condition images average "
                           "over runs)")
        if args.cv == 0:
            raise CLIError("--group-runs needs cross-validation: pass --cv 2 or more, not 0")
        if len(imgs) < args.cv:
            raise CLIError(f"--group-runs with --cv {args.cv} needs at least {args.cv} runs; "
                           f"got {len(imgs)}. Lower --cv or give more runs.")
    if args.items is not None and args.model != "trial":
        raise CLIError("--items needs --model trial (condition images already average the "
                       "trials of each condition)")
    return imgs, event_files, mask


def _read_events(event_files):
    import pandas as pd

    events = []
    for path in event_files:
        try:
            events.append(pd.read_csv(path, sep="\t"))
        except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
            reason = " ".join(str(err).split())
            raise CLIError(f"cannot read events file {path} as a tab-separated table "
                           f"({reason})") from None
        columns = list(events[-1].columns)
        if len(columns) == 1 and "," in str(columns[0]):
            raise CLIError(f"events file {path} holds one column {columns[0]!r}: it looks "
                           "comma-separated; BIDS events files are tab-separated (write it "
                           "with sep='\\t')")
    return events


def _condition_candidates(table, condition_col="trial_type"):
    """One row per condition of the pooled events ``table``: the columns constant within
    every condition (those :func:`~mlem_neuro.fmri.trial_images` can keep)."""
    if condition_col not in table.columns:
        return table
    by = table.groupby(condition_col, sort=False, dropna=False)
    keep = [c for c in table.columns if (by[c].nunique(dropna=False) <= 1).all()]
    return table.drop_duplicates(condition_col)[list(dict.fromkeys([condition_col] + keep))]


def _searchlight_features(args, events):
    """The events columns of the image table: the features, and the --items column.
    Without ``--features``, a CLIError lists the columns that can be features (before
    any GLM is fitted)."""
    import pandas as pd

    names = _name_list(args.features, "--features")
    items = getattr(args, "items", None)
    table = pd.concat(events, ignore_index=True)
    table = table[[c for c in table.columns if c not in ("onset", "duration")]]
    if items is not None and items not in table.columns:
        raise CLIError(f"--items {items!r} is not a column of the events files "
                       f"(columns: {list(table.columns)})")
    if names is None:
        if args.model == "condition":
            raise _no_features_error(_condition_candidates(table), "condition table",
                                     row="condition")
        raise _no_features_error(table, "events", [items] if items else [])
    if items is not None and items not in names:
        names = [*names, items]                     # trial_images keeps it; not a feature
    return names


def _standardize(args):
    """``--standardize`` as :func:`~mlem_neuro.fmri.trial_images` takes it."""
    return None if args.standardize == "none" else args.standardize


def _image_error(err, paths):
    """A CLIError naming the first of ``paths`` that does not read as a NIfTI image."""
    import nibabel as nib

    for path in paths:
        try:
            np.asanyarray(nib.load(path).dataobj)
        except Exception as bad:   # nibabel, gzip and zlib errors alike
            reason = " ".join(str(bad).split())
            return CLIError(f"cannot read {path} as a NIfTI image ({type(bad).__name__}: "
                            f"{reason}); --imgs and --mask take complete NIfTI files (check "
                            "a .nii.gz with 'gzip -t')")
    return CLIError(f"cannot read an input image ({type(err).__name__}: {err}); --imgs and "
                    "--mask take NIfTI images")


def _fit_searchlight(args, imgs, events, mask):
    """Beta images, then the searchlight (runs as groups with ``--group-runs``)."""
    from nibabel.filebasedimages import ImageFileError
    from nilearn.image import mean_img

    from . import fmri, searchlight

    feature_cols = _searchlight_features(args, events)
    crossvalidated = args.distance in CROSSVALIDATED_DISTANCES
    if crossvalidated and args.items is None:
        raise CLIError(f"--distance {args.distance} compares each item's trials across runs: "
                       "pass --items COLUMN (with --model trial; every item needs trials in "
                       "every run)")
    try:
        betas, table = fmri.trial_images(imgs, events, t_r=args.t_r, mask_img=mask,
                                         model=args.model, feature_cols=feature_cols,
                                         standardize=_standardize(args))
        groups = (table.index.get_level_values("run").to_numpy() if args.group_runs
                  else None)
        # cross-validated distances: the runs are the independent partitions
        runs = table.index.get_level_values("run").to_numpy() if crossvalidated else None
        res = searchlight.mlem_searchlight(betas, table, mask, radius=args.radius,
                                           groups=groups, items=args.items,
                                           distance=args.distance, partitions=runs,
                                           **_analysis_kwargs(args))
        bg_img = mean_img(imgs[0], copy_header=True)
    except (ImageFileError, EOFError, zlib.error) as err:
        raise _image_error(err, [*imgs, mask]) from None
    except ValueError as err:
        if args.group_runs and "same distance on every feature" in str(err):
            raise CLIError(f"{err} With --group-runs every fold holds out whole runs: "
                           "lower --cv so that each fold holds out more runs.") from None
        raise
    if args.group_runs:
        res.settings.update(groups="run", cv=f"GroupKFold({args.cv}) over runs")
    if _standardize(args) == "run" or (args.standardize == "auto" and args.model == "trial"):
        res.settings.update(standardize="run", standardize_runs="trial_images")
    return res, bg_img


def run_searchlight(args):
    """``mlem-neuro searchlight``: beta images per trial or condition, then a searchlight."""
    _check_options(args)
    imgs, event_files, mask = _searchlight_inputs(args)
    out = check_out(args.out, args.overwrite)
    import matplotlib

    matplotlib.use("Agg")
    events = _read_events(event_files)
    res, bg_img = _fit_searchlight(args, imgs, events, mask)
    figure = {}

    def write(folder):
        res.save(folder / "mlem.npz", overwrite=True)
        res.to_nifti().to_filename(folder / "importance.nii.gz")
        res.score_img.to_filename(folder / "score.nii.gz")
        res.to_data_frame().to_csv(folder / "importance.csv", index=False)
        with warnings.catch_warnings():         # too few nulls: _print_tests notes it
            warnings.filterwarnings("ignore", "with n_null=", UserWarning)
            fig, figure["empty"] = _brain_map_figure(res, bg_img)
        _save_figure(fig, folder / "importance.png")

    _publish(out, write)
    empty = figure["empty"]
    print(f"Wrote {out / 'mlem.npz'}, {out / 'importance.nii.gz'} (one volume per term: "
          f"{', '.join(res.terms)}), {out / 'score.nii.gz'} ({res.score_kind} Spearman rho), "
          f"{out / 'importance.csv'}, {out / 'importance.png'}")
    if empty:
        _note(f"importance.png leaves out {empty}: importance 0 in every sphere")
    score = res.score
    summary = (f"best sphere {np.nanmax(score):.3f}, median {np.nanmedian(score):.3f} over "
               f"{len(score)} spheres" if np.isfinite(score).any() else "no finite score")
    print(f"Spearman rho ({_score_kind(args, 'run' if args.group_runs else None)}"
          f"{_items_note(res)}): {summary}")
    _print_tests(res, "spheres")
    print(f"Computed with {describe_provenance(res.provenance)}")


# ----------------------------------------------------------------------------- bids
def _bids_features(args):
    """The --features names; without them, a CLIError listing the events columns of the
    first participant (before anything is analysed)."""
    names = _name_list(args.features, "--features")
    if names is not None:
        return names
    from . import bids

    labels = bids.bids_participants(args.bids_root, args.task,
                                    participant_label=args.participant_label,
                                    datatype=args.datatype)
    inputs = bids.bids_inputs(args.bids_root, labels[0], args.task, datatype=args.datatype,
                              derivatives=args.derivatives, space=args.space)
    events = _read_events(inputs.events[:1])[0]
    table = events[[c for c in events.columns if c not in ("onset", "duration")]]
    exclude = [c for c in (args.items, args.groups, args.partitions) if c]
    raise _no_features_error(table, f"events ({inputs.events[0]})", exclude)


def _interval(text, flag):
    if text is None:
        return None
    try:
        start, end = (None if v.strip().lower() in ("", "none") else float(v)
                      for v in text.split(","))
    except ValueError:
        raise CLIError(f"{flag} {text!r}: give START,END in seconds, e.g. {flag} -0.2,0") \
            from None
    return (start, end)


def _bids_participant_kwargs(args):
    kw = _analysis_kwargs(args)
    for name in ("verbose", "n_jobs"):
        kw.pop(name)
    confounds = None if args.confounds.strip().lower() == "none" else \
        _name_list(args.confounds, "--confounds")
    return dict(task=args.task, participant_label=args.participant_label,
                datatype=args.datatype, derivatives=args.derivatives, space=args.space,
                analysis=args.analysis, radius=args.radius, labels_img=args.labels_img,
                model=args.model, standardize=_standardize(args), confounds=confounds,
                group_runs=args.group_runs, groups=args.groups, items=args.items,
                partitions=args.partitions, distance=args.distance, t_r=args.t_r,
                tmin=args.tmin, tmax=args.tmax,
                baseline=_interval(args.baseline, "--baseline"),
                picks=_name_list(args.picks, "--picks"), decim=args.decim,
                window=args.window,
                trial_types=_name_list(args.trial_types, "--trial-types"),
                figures=args.figures, overwrite=args.overwrite, n_jobs=args.n_jobs,
                verbose="INFO", **kw)


def run_bids(args):
    """``mlem-neuro bids``: the participant or group level of a BIDS study; returns the
    exit code (1 when a participant failed)."""
    import matplotlib

    from . import bids

    _check_options(args)
    _existing(args.bids_root, "BIDS dataset")
    matplotlib.use("Agg")
    if args.analysis_level == "group":
        # without --random-state, bids_group's own default seed (see --random-state)
        seed = {} if args.random_state is None else {"random_state": args.random_state}
        tests = bids.bids_group(args.output_dir, task=args.task, space=args.space,
                                participant_label=args.participant_label,
                                measure=args.measure, n_null=args.group_n_null,
                                figures=args.figures, n_jobs=args.n_jobs, verbose="INFO",
                                **seed)
        labels = tests.pop("participants")
        print(f"Group level of task {args.task}: {len(labels)} participants; wrote "
              f"{Path(args.output_dir) / 'group'}")
        for term, test in tests.items():
            if hasattr(test, "cluster_p_values"):
                sig = test.significant(0.05)
                spans = ", ".join(f"{test.times[c][0]:.3f}-{test.times[c][-1]:.3f} s"
                                  for c in sig) or "none"
                print(f"  {term}: clusters with p < 0.05: {spans}")
            else:
                logp = np.asarray(test.dataobj)
                print(f"  {term}: max -log10(p, FWE) {np.nanmax(logp):.2f}, "
                      f"{int((logp > -np.log10(0.05)).sum())} voxels with p < 0.05")
        return 0
    kw = _bids_participant_kwargs(args)
    features = _bids_features(args)
    with warnings.catch_warnings():     # the failures are listed below
        warnings.filterwarnings("ignore", r".*participant\(s\) failed", UserWarning)
        report = bids.bids_participant(args.bids_root, args.output_dir, features=features,
                                       **kw)
    counts = report.status.value_counts()
    print(f"Participant level of task {args.task}: "
          + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("done", "skipped", "failed"))
          + f"; wrote {args.output_dir}")
    failed = report[report.status == "failed"]
    for label, message in zip(failed.participant, failed.message):
        print(f"mlem-neuro bids: error: sub-{label} failed: {message}", file=sys.stderr)
    if len(failed):
        print(f"mlem-neuro bids: {len(failed)} participant(s) failed "
              f"({', '.join('sub-' + s for s in failed.participant)}); the others are "
              "written, and running the command again redoes only the failed ones",
              file=sys.stderr)
        return 1
    return 0


# ------------------------------------------------------------------------------ main
class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default ("off" for flags); a help text that
    already says its default in words (``default: ...``) is left as it is."""

    def _get_help_string(self, action):
        text = action.help or ""
        if ("default" in text or action.required or not action.option_strings
                or action.default in (None, argparse.SUPPRESS)):
            return text
        if action.nargs == 0:                   # a flag (--overwrite, --no-interactions)
            return f"{text} (default: off)"
        return f"{text} (default: %(default)s)"


def _positive_int(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _choices(words):
    """The metavar listing a flag's words, as argparse's ``choices`` shows them."""
    return "{" + ",".join(words) + "}"


def _signature_defaults():
    """``{function name: {parameter: default}}`` of the API functions the commands call.

    A flag that a command passes on to one of them takes that function's default, written
    once, in its signature.  Read once, when the command line is imported (a test that
    replaces a function by a spy leaves the flags' defaults as they are).
    """
    from .bids import bids_group, bids_participant
    from .fmri import trial_images
    from .searchlight import mlem_searchlight
    from .time_resolved import mlem_epochs

    return {func.__name__: {name: param.default
                            for name, param in inspect.signature(func).parameters.items()
                            if param.default is not inspect.Parameter.empty}
            for func in (run_demo, mlem_epochs, trial_images, mlem_searchlight,
                         bids_participant, bids_group)}


_API_DEFAULTS = _signature_defaults()


def _api_default(func, name):
    """The default of parameter ``name`` of the API function named ``func``."""
    return _API_DEFAULTS[func][name]


#: what each training path is, for ``--backend``'s help (the paths are those of
#: :data:`mlem_neuro.core.checks.BACKENDS`)
_BACKEND_NOTES = {"auto": "the fastest that can train the design",
                  "compiled": "numba: categorical or grid designs on the CPU",
                  "torch": "any design and device",
                  "reference": "one model at a time, to check"}


def _backend_help():
    """``--backend``'s help, naming each backend of ``BACKENDS`` (and no other)."""
    named = [f"{b} ({_BACKEND_NOTES[b]})" if b in _BACKEND_NOTES else b for b in BACKENDS]
    return f"training path: {', '.join(named[:-1])} or {named[-1]}"


def _add_analysis_options(p, what, out=True, random_state_note=""):
    """The analysis options (:class:`~mlem_neuro.core.options.MLEMOptions`), under the
    API's names and with its defaults."""
    d = MLEMOptions()           # the defaults, defined once
    p.add_argument("--cv", type=_flag_type("--cv"), default=d.cv,
                   help=f"cross-validation folds over {what}; 0: none, the score is then "
                        "in-sample (optimistic)")
    p.add_argument("--n-permutations", type=_flag_type("--n-permutations"),
                   default=d.n_permutations,
                   help="permutations per term for the permutation importance")
    p.add_argument("--null", type=_flag_type("--null"), metavar=_choices(NULLS),
                   default=d.null,
                   help="the question of each feature's permutation test (--n-null): "
                        "conditional (does it matter given the other features?) or "
                        "marginal (does it matter at all?)")
    p.add_argument("--feature-test", type=_flag_type("--feature-test"),
                   metavar=_choices(FEATURE_TESTS), default=d.feature_test,
                   help="the statistic of each feature's permutation test (--n-null): "
                        "staged (the in-sample main effect, a partial Mantel statistic, "
                        "joined by the held-out importance where the test of "
                        "interactions finds interactions), combined (the larger of the "
                        "standardised importance and main effect everywhere), "
                        "importance (the held-out importance alone) or main_effect (the "
                        "main effect alone)")
    p.add_argument("--held-out-pairs", type=_flag_type("--held-out-pairs"),
                   metavar=_choices(HELD_OUT_PAIRS), default=d.held_out_pairs,
                   help="held-out pairs that score each fold: auto (pairs between runs "
                        "when the runs are groups), all, between_groups")
    p.add_argument("--level", type=_flag_type("--level"), metavar=_choices(LEVELS),
                   default=d.level,
                   help="importance per feature (total effect, identifiable) or per term "
                        "(f and f:g; not identifiable when every feature is categorical)")
    p.add_argument("--constraint", type=_flag_type("--constraint"),
                   metavar=_choices(CONSTRAINTS), default=d.constraint,
                   help="metric W: spd (MLEM), diagonal (FR-RSA), none (FR-RSA-I)")
    p.add_argument("--no-interactions", dest="interactions", action="store_false",
                   default=d.interactions,
                   help="report main effects only (no feature:feature interaction terms)")
    p.add_argument("--n-jobs", type=_flag_type("--n-jobs"), default=d.n_jobs,
                   help="parallel jobs (joblib; -1: every core) (default: one job)")
    p.add_argument("--device", type=_flag_type("--device"), default=d.device,
                   help="torch device, e.g. cpu or cuda")
    p.add_argument("--backend", type=_flag_type("--backend"), metavar=_choices(BACKENDS),
                   default=d.backend, help=_backend_help())
    p.add_argument("--random-state", "--seed", dest="random_state", action=_OneName,
                   type=_flag_type("--random-state"), default=d.random_state,
                   help="random seed (folds, training batches, permutations) (default: "
                        "none, as the API: each run draws its own; give one, e.g. "
                        f"--random-state 0, to repeat a run exactly{random_state_note}); "
                        "--seed is its former name")
    p.add_argument("--feature-kinds", type=_flag_type("--feature-kinds"),
                   default=d.feature_kinds,
                   metavar="COLUMN=KIND,...",
                   help="how features are compared, overriding the inferred kinds: "
                        "categorical (same or different), ordinal (levels in order) or "
                        "numeric (absolute difference); e.g. condition=categorical for "
                        "conditions coded 1, 2, 3, which are numeric otherwise (default: "
                        "inferred from the values)")
    p.add_argument("--feature-groups", type=_flag_type("--feature-groups"),
                   default=d.feature_groups,
                   metavar="NAME=COLUMN+COLUMN,...",
                   help="columns compared together as one feature, by the Euclidean "
                        "distance of their values (e.g. position=x+y for a 2-D position; "
                        "the columns must be among the features) (default: every column "
                        "is its own feature)")
    p.add_argument("--missing-distance", type=_flag_type("--missing-distance"),
                   default=d.missing_distance,
                   metavar="NUMBER | FEATURE=NUMBER,...",
                   help="feature distance of a pair in which either stimulus lacks the "
                        "value (empty or NaN in the table): one number for every feature, "
                        "or per feature (default: 0, the paper's choice)")
    chunk_key = "chunk_size_time" if what == "trials" else "chunk_size_spheres"
    # help: the first sentence of the API's docdict entry
    for flag in ("--lr", "--max-steps", "--patience", "--tol", "--batch-size",
                 "--numeric-levels", "--chunk-size", "--n-null", "--n-repeats"):
        name = FLAG_PARAMS[flag][0]
        p.add_argument(flag, type=_flag_type(flag), default=getattr(d, name),
                       help=short_doc(chunk_key if name == "chunk_size" else name))
    if not out:                 # the output folder is a positional argument (bids)
        return
    p.add_argument("--out", required=True, help="output folder (created if needed)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the results already in --out (mlem.npz, importance.*, "
                        "score.*: all removed once the new analysis has finished, so none "
                        "of an earlier run stays beside the new ones)")


def _add_demo_parser(sub, kw):
    d = sub.add_parser("demo", help="main job on built-in simulated data (no download)",
                       description="MLEM vs FR-RSA-I vs FR-RSA on a simulation with a known, "
                                   "realisable metric and a "
                                   "time-resolved analysis of simulated epochs; figures, a "
                                   "table and an HTML report go to --out.", **kw)
    d.add_argument("--out", default="mlem_demo",
                   help="output folder (default: %(default)s, the command's own: "
                        "run_demo has no default folder)")
    d.add_argument("--paper", action="store_true",
                   help="the paper's own simulation instead (MDS embedding, 256 stimuli, "
                        "16 binary features, 768 units; slower, and its W_true is not "
                        "reachable)")
    d.add_argument("--random-state", "--seed", dest="random_state", action=_OneName,
                   type=argparse_type("random_state", int),
                   default=_api_default("run_demo", "seed"),
                   help="first simulation seed (default: %(default)s, run_demo's: the "
                        "demo's figures and table are the same on every run; --seed is its "
                        "former name)")
    d.add_argument("--seeds", dest="n_seeds", type=_positive_int,
                   default=_api_default("run_demo", "n_seeds"),
                   help="simulations per noise level (seeds --random-state, "
                        "--random-state + 1, ...)")
    d.add_argument("--overwrite", action="store_true",
                   help="replace the demo outputs already in --out")


def _add_epochs_parser(sub, kw):
    e = sub.add_parser("epochs", help="time-resolved MLEM on an MNE epochs file",
                       description="Time-resolved MLEM: one model per time sample of an MNE "
                                   "epochs file; writes mlem.npz, importance.csv and "
                                   "importance.png to --out.", **kw)
    e.add_argument("fname", help="an MNE epochs file (*-epo.fif)")
    e.add_argument("--features",
                   help="comma-separated metadata columns (or event-name tags) to use as "
                        "features, e.g. --features category,animacy (required, no "
                        "default: without it the command stops and lists the columns that "
                        "can be features)")
    e.add_argument("--picks", help="comma-separated channel names or types, e.g. eeg or "
                                   "MEG0111,MEG0112 (default: the good data channels)")
    e.add_argument("--groups", metavar="COLUMN",
                   help="metadata column (run, session, item...) whose trials stay in one "
                        "fold: the folds become GroupKFold over its values (default: trials "
                        "are split freely)")
    e.add_argument("--items", metavar="COLUMN",
                   help="metadata column naming the stimulus (item) of each trial: the "
                        "trials of an item are averaged into one stimulus, folds and pairs "
                        "are over items (default: every trial is a stimulus)")
    e.add_argument("--distance", default=MLEMOptions().distance,
                   type=_flag_type("--distance"),
                   metavar=_choices(registered_distances() + CROSSVALIDATED_DISTANCES),
                   help="neural distance between trials (items); crossnobis and "
                        "cv_euclidean are cross-validated over partitions of each item's "
                        "trials and need --items")
    e.add_argument("--partitions", metavar="COLUMN",
                   help="with --distance crossnobis / cv_euclidean: metadata column of "
                        "independent partitions of the trials (e.g. run; default: each "
                        "item's trials dealt into parts)")
    e.add_argument("--tmin", type=float, default=_api_default("mlem_epochs", "tmin"),
                   help="first time in seconds (default: the epochs' first sample)")
    e.add_argument("--tmax", type=float, default=_api_default("mlem_epochs", "tmax"),
                   help="last time in seconds (default: the epochs' last sample)")
    e.add_argument("--decim", type=_positive_int, default=_api_default("mlem_epochs", "decim"),
                   help="keep one time sample in DECIM")
    e.add_argument("--window", type=float, default=_api_default("mlem_epochs", "window"),
                   help="average each sample over this many seconds around it, before "
                        "--decim, against aliasing (default: no averaging)")
    _add_analysis_options(e, "trials")


def _add_searchlight_parser(sub, kw):
    s = sub.add_parser("searchlight", help="fMRI searchlight MLEM from BOLD runs + events",
                       description="Beta images per trial (or condition) with nilearn's "
                                   "GLM (per trial: z-scored within run by default, "
                                   "see --standardize), then a searchlight MLEM; "
                                   "writes mlem.npz, importance.nii.gz, score.nii.gz, "
                                   "importance.csv and importance.png to --out.", **kw)
    s.add_argument("--imgs", nargs="+", required=True, help="BOLD runs (4D NIfTI)")
    s.add_argument("--events", nargs="+", required=True, help="BIDS events.tsv, one per run")
    s.add_argument("--mask", required=True, help="brain mask image")
    s.add_argument("--t-r", type=float, required=True, help="repetition time (s)")
    s.add_argument("--radius", type=_flag_type("--radius"),
                   default=_api_default("mlem_searchlight", "radius"),
                   help="sphere radius in mm (world coordinates, as nilearn's)")
    s.add_argument("--model", type=_flag_type("--model"), metavar=_choices(FMRI_MODELS),
                   default=_api_default("trial_images", "model"),
                   help="one beta image per trial (row of the events) or per condition "
                        "(trial_type)")
    s.add_argument("--features",
                   help="comma-separated events columns to use as features, e.g. "
                        "--features trial_type,animacy (required, no default: without it "
                        "the command stops and lists the columns that can be features)")
    s.add_argument("--standardize", choices=("auto", "run", "none"),
                   default=_api_default("trial_images", "standardize"),
                   help="run: z-score each voxel's betas across the trials of each run (run "
                        "effects otherwise dominate the distances); none: raw betas; auto: "
                        "run with --model trial, none with --model condition (its images "
                        "average over runs)")
    s.add_argument("--group-runs", action="store_true",
                   help="with --model trial: the runs are groups of GroupKFold, so that a "
                        "run's trials are never split between training and test; keep "
                        "--cv below the number of runs when each condition occurs once "
                        "per run (a fold holding out one run has no pair of the same "
                        "condition)")
    s.add_argument("--distance", default=MLEMOptions().distance,
                   type=_flag_type("--distance"),
                   metavar=_choices(registered_distances() + CROSSVALIDATED_DISTANCES),
                   help="neural distance between beta images (items) within a sphere; "
                        "cv_euclidean and crossnobis are cross-validated across runs (the "
                        "partitions) and need --items with --model trial")
    s.add_argument("--items", metavar="COLUMN",
                   help="with --model trial: events column naming the stimulus (item) of "
                        "each trial; the beta images of an item are averaged into one "
                        "stimulus, folds and pairs are over items (default: every trial "
                        "is a stimulus)")
    _add_analysis_options(s, "images")


def _add_bids_parser(sub, kw):
    from .core.checks import ANALYSIS_LEVELS, BIDS_ANALYSES, BIDS_DATATYPES

    def part(name):             # the participant level's default
        return _api_default("bids_participant", name)

    b = sub.add_parser(
        "bids", help="a BIDS study: each participant, then the group (a BIDS App)",
        description="MLEM as a BIDS App: 'participant' analyses each participant of "
                    "BIDS_ROOT (fMRI: preprocessed runs from fMRIPrep derivatives, betas "
                    "per trial, a searchlight or ROI analysis; MEG/EEG: recordings read "
                    "with mne-bids, epoched around events.tsv onsets, time-resolved "
                    "MLEM) and writes a BIDS derivatives dataset to OUTPUT_DIR "
                    "(participants done before are skipped; failed ones are listed and "
                    "the exit code is 1); 'group' tests the participants' results "
                    "across the group (cluster test over time, second-level maps) into "
                    "OUTPUT_DIR/group.", **kw)
    b.add_argument("bids_root", metavar="BIDS_ROOT", help="the BIDS dataset (raw data)")
    b.add_argument("output_dir", metavar="OUTPUT_DIR",
                   help="the derivatives folder written (e.g. BIDS_ROOT/derivatives/mlem)")
    b.add_argument("analysis_level", metavar=_choices(ANALYSIS_LEVELS),
                   type=argparse_type("analysis_level"),
                   help="participant: analyse each participant; group: test their results")
    b.add_argument("--participant-label", "--participant_label", nargs="+",
                   metavar="LABEL",
                   help="the participants (01 or sub-01) (default: every participant with "
                        "recordings of the task)")
    b.add_argument("--task", required=True, help="the task label (task-<label>)")
    b.add_argument("--features",
                   help="comma-separated events.tsv columns to use as features, e.g. "
                        "--features trial_type (required at the participant level, no default: "
                        "without it the command stops and lists the columns)")
    b.add_argument("--datatype", type=argparse_type("datatype"), default=part("datatype"),
                   metavar=_choices(BIDS_DATATYPES),
                   help="the recordings analysed (auto: the datatype holding the task)")
    b.add_argument("--derivatives", metavar="DIR",
                   help="fMRI: fMRIPrep's output folder (default: BIDS_ROOT/derivatives/"
                        "fmriprep, else BIDS_ROOT/derivatives)")
    b.add_argument("--space", help="fMRI: the space of the preprocessed runs, e.g. "
                                   "MNI152NLin2009cAsym (default: the one space of the runs; "
                                   "needed when there are several)")
    b.add_argument("--analysis", type=argparse_type("analysis"), default=part("analysis"),
                   metavar=_choices(BIDS_ANALYSES),
                   help="fMRI: a searchlight, or one model per region of --labels-img")
    b.add_argument("--radius", type=_flag_type("--radius"), default=part("radius"),
                   help="fMRI searchlight: sphere radius in mm")
    b.add_argument("--labels-img", metavar="ATLAS",
                   help="fMRI with --analysis roi: an atlas of integer labels in --space "
                        "(default: none)")
    b.add_argument("--model", type=_flag_type("--model"), metavar=_choices(FMRI_MODELS),
                   default=part("model"),
                   help="fMRI: one beta image per trial or per condition")
    b.add_argument("--standardize", choices=("auto", "run", "none"),
                   default=part("standardize"),
                   help="fMRI: z-score the betas within run (auto: with --model trial)")
    b.add_argument("--confounds", default=",".join(part("confounds")),
                   help="fMRI: comma-separated columns of fMRIPrep's confounds tables added "
                        "to the GLM, or none")
    b.add_argument("--group-runs", action="store_true",
                   help="keep each run's (recording's) trials in one fold")
    b.add_argument("--groups", metavar="COLUMN", default=part("groups"),
                   help="events.tsv column (session, block...) whose trials stay in one "
                        "fold: the folds become GroupKFold over its values (not with "
                        "--group-runs) (default: trials are split freely)")
    b.add_argument("--items", metavar="COLUMN", default=part("items"),
                   help="events.tsv column naming the stimulus (item) of each trial: the "
                        "trials of an item are averaged into one stimulus, folds and pairs "
                        "are over items (fMRI: with --model trial) (default: every trial is "
                        "a stimulus)")
    b.add_argument("--distance", default=MLEMOptions().distance,
                   type=_flag_type("--distance"),
                   metavar=_choices(registered_distances() + CROSSVALIDATED_DISTANCES),
                   help="neural distance between trials (items): across channels at each "
                        "time point (MEG/EEG) or voxels of a sphere/region (fMRI); "
                        "crossnobis and cv_euclidean are cross-validated over partitions "
                        "of each item's trials and need --items")
    b.add_argument("--partitions", metavar="COLUMN", default=part("partitions"),
                   help="with --distance crossnobis / cv_euclidean: events.tsv column of "
                        "independent partitions of the trials (e.g. run; default: fMRI, "
                        "the runs when there are several; else each item's trials dealt "
                        "into parts)")
    b.add_argument("--t-r", type=float, default=part("t_r"),
                   help="fMRI: repetition time (s), used only when neither the sidecars "
                        "nor the NIfTI headers give one (default: none)")
    b.add_argument("--tmin", type=float, default=part("tmin"),
                   help="MEG/EEG: epoch start around each onset (s)")
    b.add_argument("--tmax", type=float, default=part("tmax"),
                   help="MEG/EEG: epoch end around each onset (s)")
    b.add_argument("--baseline", metavar="START,END",
                   help="MEG/EEG: baseline correction interval in s, e.g. -0.2,0 (default: "
                        "none)")
    b.add_argument("--picks", help="MEG/EEG: comma-separated channel names or types "
                                   "(default: the good data channels)")
    b.add_argument("--decim", type=_positive_int, default=part("decim"),
                   help="MEG/EEG: keep one time sample in DECIM")
    b.add_argument("--window", type=float, default=part("window"),
                   help="MEG/EEG: average each sample over this many seconds around it "
                        "(default: no averaging)")
    b.add_argument("--trial-types", metavar="TYPE,...",
                   help="MEG/EEG: epoch only the events of these trial_type values "
                        "(default: every event with an onset)")
    b.add_argument("--measure", choices=("importance", "main_effect"),
                   default=_api_default("bids_group", "measure"),
                   help="group: test each term's importance or each feature's main effect")
    b.add_argument("--group-n-null", type=_flag_type("--n-null"),
                   default=_api_default("bids_group", "n_null"),
                   help="group: sign-flip permutations (default: 1024 for time courses, "
                        "10000 for maps)")
    b.add_argument("--no-figures", dest="figures", action="store_false",
                   default=part("figures"),
                   help="write no figures (tables, maps and results only)")
    b.add_argument("--overwrite", action="store_true",
                   help="redo the participants already done (their files are replaced once "
                        "the new ones are complete) and accept settings other than those "
                        "recorded in OUTPUT_DIR/dataset_description.json")
    _add_analysis_options(b, "trials", out=False,
                          random_state_note="; at the group level, bids_group's own "
                          f"default, {_api_default('bids_group', 'random_state')}")


def build_parser():
    """The ``mlem-neuro`` argument parser."""
    from ._version import __version__

    kw = dict(formatter_class=_HelpFormatter)
    parser = argparse.ArgumentParser(
        prog="mlem-neuro", description="Metric Learning Encoding Models for neuroimaging.",
        **kw)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the mlem_neuro version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_demo_parser(sub, kw)
    _add_epochs_parser(sub, kw)
    _add_searchlight_parser(sub, kw)
    _add_bids_parser(sub, kw)
    return parser


def _dispatch(args):
    if args.command == "demo":
        check_out(args.out, args.overwrite, DEMO_OUTPUTS)
        run_demo(args.out, paper=args.paper, seed=args.random_state, n_seeds=args.n_seeds)
    elif args.command == "epochs":
        run_epochs(args)
    elif args.command == "bids":
        return run_bids(args)
    else:
        run_searchlight(args)


def main(argv=None):
    """Run the command line; return the exit code (0, 2 for a reported error)."""
    args = build_parser().parse_args(argv)
    old_format = warnings.formatwarning
    warnings.formatwarning = _one_line_warning
    try:
        code = _dispatch(args)
    except (CLIError, ValueError, TypeError, FileNotFoundError, OSError) as err:
        msg = " ".join(str(err).split())
        msg = re.sub(r"\b(?:Posix|Windows)?Path\(('[^']*')\)", r"\1", msg)  # MNE's repr()
        print(f"mlem-neuro {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"mlem-neuro {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = old_format
    return code or 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
