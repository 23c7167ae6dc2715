"""One validation vocabulary: every parameter of the package is checked by one function,
found in one table keyed by the parameter's name.

This is the idea of nilearn's ``check_params``: :data:`CHECKS` maps a parameter name to
``check(name, value, **kw) -> normalised value``, which raises a ``TypeError`` (wrong
kind) or ``ValueError`` (wrong value) naming the parameter, saying what it accepts and how
to fix it.  Every entry point goes through it:

- :class:`~mlem_neuro.core.options.MLEMOptions` (the estimator and the analyses) checks
  its fields with :func:`check_params`;
- functions that take a parameter outside the options (``measure`` and ``tail`` of the
  cluster test, ``radius`` of a searchlight, ``sfreq`` of an array, ...) call
  :func:`check` with its name;
- the command line's ``type=`` functions are :func:`argparse_type` of the same checks, so
  ``--cv 1`` and ``cv=1`` are refused by one function with one message.

``tests/test_options.py`` checks that no other module raises an error about a parameter
named here.  The lists of allowed words (:data:`CONSTRAINTS`, :data:`LEVELS`, ...) are
defined here once too.
"""
from __future__ import annotations

import numbers

import numpy as np

from .constants import AUTO_FOLDS, MAX_REPEATS

#: the metric W's parametrisations: MLEM (spd), FR-RSA (diagonal), FR-RSA-I (none)
CONSTRAINTS = ("spd", "diagonal", "none")
#: neural distances computed from the trials of each item in independent partitions
#: (:mod:`mlem_neuro.core.rdms.crossdist`): time-resolved analyses with ``items`` only.
CROSSVALIDATED_DISTANCES = ("crossnobis", "cv_euclidean")
LEVELS = ("term", "feature")
#: the question a feature's permutation test asks (:mod:`mlem_neuro.core.scoring.nulls`).
NULLS = ("conditional", "marginal")
#: which held-out pairs score a fold (:func:`mlem_neuro.crossval.held_out_columns`).
HELD_OUT_PAIRS = ("auto", "all", "between_groups")
#: the statistic of each feature's test (:func:`mlem_neuro.crossval.run_cv`):
#: ``"staged"`` is the main effect alone, joined by the held-out importance in the models
#: where the test of interactions finds interactions
#: (:func:`mlem_neuro.core.scoring.main_effect.staged`); ``"combined"`` joins the held-out
#: importance and the in-sample main effect
#: (:mod:`mlem_neuro.core.scoring.main_effect`) in one max statistic; ``"importance"`` is the
#: held-out importance alone; ``"main_effect"`` the main effect alone (a conditional partial
#: Mantel test: no power for a feature that acts only through an interaction)
FEATURE_TESTS = ("staged", "combined", "importance", "main_effect")
#: the training paths: the names of the table of backends
#: (:data:`mlem_neuro.core.training.backends.BACKENDS`, checked against these when it is
#: built); ``"auto"`` picks the fastest one that can train the design on its device
BACKENDS = ("auto", "compiled", "torch", "reference")
FEATURE_KINDS = ("categorical", "ordinal", "numeric")
#: what :func:`mlem_neuro.stats.permutation_cluster_test` tests
MEASURES = ("importance", "score", "interactions", "main_effect")
#: what :func:`mlem_neuro.stats.second_level_maps` tests (the score and the interactions
#: through ``term``)
MAP_MEASURES = ("importance", "main_effect")
#: the tails of a test (MNE's convention)
TAILS = (1, 0, -1)
#: the GLM of :func:`mlem_neuro.fmri.trial_images`
FMRI_MODELS = ("trial", "condition")
#: the levels of a BIDS App (:func:`mlem_neuro.bids.run_bids`)
ANALYSIS_LEVELS = ("participant", "group")
#: the BIDS datatypes :mod:`mlem_neuro.bids` analyses (``"auto"``: the one in the data)
BIDS_DATATYPES = ("auto", "func", "eeg", "meg")
#: the analysis of fMRI participants in :mod:`mlem_neuro.bids`
BIDS_ANALYSES = ("searchlight", "roi")


#: name -> neural distance, in registration order: it is
#: :data:`mlem_neuro.core.rdms.distances.REGISTRY` (the same dict), filled by
#: :func:`~mlem_neuro.core.rdms.distances.register_distance` (the built-in ones when the
#: package is imported); held here so that this module, the lowest layer, imports no other.
DISTANCE_REGISTRY = {}


def registered_distances():
    """Every neural distance registered in :mod:`mlem_neuro.core.rdms.distances` (read at check
    time, so a distance registered by a user is accepted everywhere)."""
    return tuple(DISTANCE_REGISTRY)


# ---------------------------------------------------------------------- primitives
def is_int(value):
    """An integer that is not a bool."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
        value, (bool, np.bool_))


def choice(allowed):
    """A check accepting one of ``allowed`` (``allowed=`` and ``where=`` override)."""
    def check(name, value, allowed=allowed, where=""):
        words = all(isinstance(a, str) for a in allowed)
        if (not isinstance(value, str) if words else isinstance(value, (bool, np.bool_))) \
                or value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}{where}; got {value!r}.")
        return value
    return check


def _bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r}.")
    return bool(value)


def int_at_least(low, hint=""):
    """A check accepting an int ``>= low`` (``low=`` and ``hint=`` override)."""
    def check(name, value, low=low, hint=hint):
        if not is_int(value):
            raise TypeError(f"{name} must be an int >= {low}; got {value!r}.{hint}")
        if value < low:
            raise ValueError(f"{name} must be an int >= {low}; got {value}.{hint}")
        return int(value)
    return check


def optional(check):
    """``check``, or ``None`` as it is."""
    def wrapped(name, value, **kw):
        return None if value is None else check(name, value, **kw)
    return wrapped


def real(name, value, strict, hint=""):
    """A finite number ``> 0`` (strict) or ``>= 0``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating)):
        raise TypeError(f"{name} must be a number; got {value!r}.{hint}")
    value = float(value)
    if not np.isfinite(value) or value < 0 or (strict and value == 0):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} 0; got "
                         f"{value}.{hint}")
    return value


def int_or(words, low, hint, high=None, high_hint=""):
    """A check accepting ``words`` (``None`` or strings) as they are, else an int >=
    ``low`` (``numeric_levels``, ``n_repeats``) and, with ``high``, <= ``high``
    (``high_hint`` saying why)."""
    allowed = f"{', '.join(repr(w) for w in words)} or an int >= {low}"

    def check(name, value):
        if any(value is w if w is None else (isinstance(value, str) and value == w)
               for w in words):
            return value
        if not is_int(value):
            raise TypeError(f"{name} must be {allowed}; got {value!r}.{hint}")
        if value < low:
            raise ValueError(f"{name} must be {allowed}; got {value}.{hint}")
        if high is not None and value > high:
            raise ValueError(f"{name} must be at most {high}; got {value}.{high_hint}")
        return int(value)
    return check


# ---------------------------------------------------------------- parameter checks
def _lr(name, value):
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, str):
        raise ValueError(f"{name} must be 'auto' or a float > 0; got {value!r}.")
    return real(name, value, strict=True,
                hint=" It is AdamW's learning rate (default 'auto': 0.1 for categorical "
                     "designs, 0.03 otherwise).")


def _patience(name, value):
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, str):
        raise ValueError(f"{name} must be 'auto' or an int >= 1; got {value!r}.")
    return int_at_least(1, hint=" It is the steps without improvement before a fit stops "
                                "(default 'auto': 20 for categorical designs, 50 "
                                "otherwise).")(name, value)


def _tol(name, value):
    return real(name, value, strict=False,
                hint=" It is the training improvement that resets patience (default 1e-4).")


def _sfreq(name, value):
    return real(name, value, strict=True, hint=" It is the sampling rate in Hz.")


def _t_r(name, value):
    return real(name, value, strict=True, hint=" It is the repetition time in seconds.")


def _batch_size(name, value):
    if isinstance(value, str):
        if value in ("auto", "full"):
            return value
        raise ValueError(f"{name} must be 'auto', 'full' or an int >= 2; got {value!r}.")
    if not is_int(value):
        raise TypeError(f"{name} must be 'auto', 'full' or an int >= 2; got {value!r}.")
    if value < 2:
        raise ValueError(f"{name} must be 'auto', 'full' or an int >= 2 (pairs per step); "
                         f"got {value}.")
    return int(value)


def _feature_kinds(name, value):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be None or a dict {{column: kind}}; got "
                        f"{type(value).__name__}.")
    out = {}
    for col, kind in value.items():
        if kind not in FEATURE_KINDS:
            raise ValueError(f"{name}[{col!r}] must be one of {list(FEATURE_KINDS)}; got "
                             f"{kind!r}.")
        out[str(col)] = kind
    return out


def _feature_groups(name, value):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be None or a dict {{name: [columns]}}; got "
                        f"{type(value).__name__}.")
    out = {}
    for group, cols in value.items():
        if isinstance(cols, str) or not hasattr(cols, "__iter__"):
            raise TypeError(f"{name}[{group!r}] must be a list of column names; got "
                            f"{cols!r}.")
        cols = [str(c) for c in cols]
        if not cols:
            raise ValueError(f"{name}[{group!r}] names no column.")
        out[str(group)] = cols
    return out


def _missing_distance(name, value):
    if isinstance(value, dict):
        return {str(k): real(f"{name}[{k!r}]", v, strict=False) for k, v in value.items()}
    return real(name, value, strict=False, hint=" (or a dict {feature: distance})")


def _device(name, value):
    """A torch device name ('cpu', 'cuda', 'cuda:N'), refused when CUDA is absent."""
    import torch

    if isinstance(value, torch.device):
        dev = value
    elif isinstance(value, str):
        try:
            dev = torch.device(value)
        except RuntimeError:
            raise ValueError(f"{name} must be 'cpu', 'cuda' or 'cuda:N'; got {value!r}.") \
                from None
    else:
        raise TypeError(f"{name} must be a str or torch.device; got {type(value).__name__}.")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"{name} must be 'cpu' or 'cuda'; got {value!r}.")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}='cuda' was requested but torch sees no CUDA GPU "
                         f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                         f"use {name}='cpu' or install a CUDA build of torch.")
    return str(value)


def _random_state(name, value):
    if value is None:
        return None
    if is_int(value):
        if value < 0:
            raise ValueError(f"{name} must be None or an int >= 0; got {value}.")
        return int(value)
    if isinstance(value, (np.random.Generator, np.random.RandomState)):
        return value
    raise TypeError(f"{name} must be None, an int >= 0, a numpy Generator or RandomState; "
                    f"got {value!r}.")


def _cv(name, value):
    if value is None or (hasattr(value, "split") and not isinstance(value, (str, bytes))):
        return value
    if is_int(value):
        if value < 2:
            raise ValueError(f"{name} must be >= 2 folds (or None for no cross-validation; "
                             f"0 on the command line); got {value}.")
        return int(value)
    if isinstance(value, (str, bytes, float, bool, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be None, an int >= 2, a scikit-learn splitter or an "
                        f"iterable of (train, test) index arrays; got {value!r}.")
    return list(value)     # a generator is consumed once: keep its folds


def _n_jobs(name, value):
    if value is None:
        return None
    if not is_int(value):
        raise TypeError(f"{name} must be None or an int (joblib semantics); got {value!r}.")
    if value == 0:
        raise ValueError(f"{name} must be None, a positive int or a negative int (joblib "
                         "semantics: -1 uses every core); got 0.")
    return int(value)


def _radius_mm(name, value):
    """A searchlight sphere radius in millimetres of world coordinates (nilearn's unit)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real,
                                                                     np.floating)):
        raise TypeError(f"{name} must be a number of millimetres; got {value!r}.")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of millimetres (world "
                         f"coordinates), e.g. {name}=6.0; got {value}.")
    return float(value)


def _radius_m(name, value):
    """A sensor / source-space neighbourhood radius in metres (MNE's unit)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real,
                                                                     np.floating)):
        raise TypeError(f"{name} must be a number of metres (e.g. 0.01 for 1 cm); got "
                        f"{value!r}.")
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive, finite number of metres (e.g. 0.01 "
                         f"for 1 cm); got {value}.")
    if value > 1.0:
        raise ValueError(f"{name}={value} m is larger than a head: MNE positions are in "
                         "metres, so give e.g. 0.01 for 1 cm (not 10).")
    return value


def _distance(name, value, allowed=None, where=""):
    allowed = (registered_distances() + CROSSVALIDATED_DISTANCES if allowed is None
               else tuple(allowed))
    return choice(allowed)(name, value, where=where)


#: one check per parameter name: ``check(name, value, **kw) -> normalised value``.
CHECKS = {
    "analysis": choice(BIDS_ANALYSES),
    "analysis_level": choice(ANALYSIS_LEVELS),
    "backend": choice(BACKENDS),
    "batch_size": _batch_size,
    "chunk_size": optional(int_at_least(1, " (models per engine call; None sizes it from "
                                           "memory)")),
    "constraint": choice(CONSTRAINTS),
    "cv": _cv,
    "datatype": choice(BIDS_DATATYPES),
    "device": _device,
    "distance": _distance,
    "feature_groups": _feature_groups,
    "feature_kinds": _feature_kinds,
    "feature_test": choice(FEATURE_TESTS),
    "held_out_pairs": choice(HELD_OUT_PAIRS),
    "interactions": _bool,
    "level": choice(LEVELS),
    "lr": _lr,
    "max_steps": int_at_least(1),
    "measure": choice(MEASURES),
    "missing_distance": _missing_distance,
    "model": choice(FMRI_MODELS),
    "n_jobs": _n_jobs,
    "n_null": int_at_least(0, " (null permutations for the single-subject tests; 0 runs "
                              "none)"),
    "n_permutations": int_at_least(1),
    "null": choice(NULLS),
    "n_repeats": int_or(("auto",), 1, (
        " (repetitions of an int cv with new random folds; 'auto' chooses them from the "
        "number of stimuli)"), high=MAX_REPEATS, high_hint=(
        f" Beyond {MAX_REPEATS} repeats the spread due to the split is under 3% of one "
        f"split's and the training costs that many analyses ('auto' gives at most "
        f"{AUTO_FOLDS[1]} folds in all).")),
    "numeric_levels": int_or(("auto", None), 2, (
        " It is the grid of numeric feature distances in training: 'auto' (default), an "
        "int >= 2, or None for exact per-pair training.")),
    "partial": _bool,
    "patience": _patience,
    "radius": _radius_mm,
    "random_state": _random_state,
    "sfreq": _sfreq,
    "spatial_radius": _radius_m,
    "t_r": _t_r,
    "tail": choice(TAILS),
    "tol": _tol,
}


def check(name, value, **kw):
    """The checked, normalised ``value`` of parameter ``name`` (see :data:`CHECKS`);
    ``kw`` narrows the check where a function needs it (``low=`` of an int,
    ``allowed=`` of a choice)."""
    if name not in CHECKS:
        raise TypeError(f"unknown option {name!r}; options are {sorted(CHECKS)}.")
    return CHECKS[name](name, value, **kw)


def check_params(params, *, distances=None):
    """Validate ``params`` and return the normalised values.

    Only the names present are checked, each by its check in :data:`CHECKS`; a bad value
    raises the TypeError / ValueError of that check, an unknown name a TypeError.

    Parameters
    ----------
    params : dict
        Parameter name -> value.
    distances : sequence of str | None
        The neural distances accepted instead of the registered ones (the estimator
        also takes ``"precomputed"``).

    Returns
    -------
    dict
        Parameter name -> checked, normalised value.
    """
    return {name: check(name, value, **({"allowed": distances}
                                         if name == "distance" and distances is not None
                                         else {}))
            for name, value in params.items()}


def argparse_type(name, parse=str, as_value=None):
    """An argparse ``type=``: ``parse`` the text, then :func:`check` it as ``name``; a
    refused value becomes an argparse error (the message without the leading name,
    which argparse replaces with the flag).  ``as_value(parsed)`` is what is checked
    when the command line spells a value differently (``--cv 0`` for ``cv=None``); the
    parsed value is then returned as it is."""
    import argparse

    def convert(text):
        try:
            value, unreadable = parse(text), False
        except ValueError:
            value, unreadable = text, True   # the check says what it takes
        try:
            if unreadable:
                check(name, text)
                raise ValueError(f"{name} cannot read {text!r}")
            if as_value is not None:
                check(name, as_value(value))
                return value
            return check(name, value)
        except (TypeError, ValueError) as err:
            msg = str(err)
            raise argparse.ArgumentTypeError(msg[len(name) + 1:] if msg.startswith(
                name + " ") else msg) from None
    convert.__name__ = name     # argparse names the type in "invalid <name> value"
    return convert
