"""The options of an MLEM analysis: one frozen object, validated once, serialised once.

Every public entry point (:class:`mlem_neuro.MLEM`, :func:`mlem_neuro.mlem_array`,
:func:`mlem_neuro.mlem_epochs`, :func:`mlem_neuro.mlem_searchlight`,
:func:`mlem_neuro.mlem_roi` and the command line) keeps flat keyword arguments, as MNE and
nilearn do, and turns them into an :class:`MLEMOptions` *before touching any data*, so a
bad value is refused identically everywhere and nothing is computed first.  The drivers
(:func:`mlem_neuro.crossval.run_cv`, :func:`mlem_neuro.core.engine.fit_stack`) take the
object; every result records :meth:`MLEMOptions.to_settings`.

The checks live in one table, :data:`CHECKS`, keyed by parameter name (the idea of
nilearn's ``check_params``): :func:`check_params` runs the check of every name it is given,
so a function that takes only some of the options can validate exactly those.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields

import numpy as np

CONSTRAINTS = ("spd", "diagonal", "none")
#: neural distances computed from the trials of each item in independent partitions
#: (:mod:`mlem_neuro.core.crossdist`): time-resolved analyses with ``items`` only.
CROSSVALIDATED_DISTANCES = ("crossnobis", "cv_euclidean")
LEVELS = ("term", "feature")
#: the question a feature's permutation test asks (:mod:`mlem_neuro.core.nulls`).
NULLS = ("conditional", "marginal")
#: which held-out pairs score a fold (:func:`mlem_neuro.crossval.held_out_columns`).
HELD_OUT_PAIRS = ("auto", "all", "between_groups")
#: the training paths (:func:`mlem_neuro.core.engine.choose_backend`); ``"auto"`` picks
#: the fastest one that can train the design on its device
BACKENDS = ("auto", "compiled", "numpy", "torch")


def registered_distances():
    """Every neural metric registered in :mod:`mlem_neuro.core.distances` (read at check
    time, so a metric registered by a user is accepted everywhere)."""
    from .distances import REGISTRY

    return tuple(REGISTRY)
FEATURE_KINDS = ("categorical", "ordinal", "numeric")


# ------------------------------------------------------------------------- checkers
def _is_int(value):
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
        value, (bool, np.bool_))


def _choice(allowed):
    def check(name, value):
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{name} must be one of {list(allowed)}; got {value!r}.")
        return value
    return check


def _bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r}.")
    return bool(value)


def _int_at_least(low, hint=""):
    def check(name, value):
        if not _is_int(value):
            raise TypeError(f"{name} must be an int >= {low}; got {value!r}.{hint}")
        if value < low:
            raise ValueError(f"{name} must be an int >= {low}; got {value}.{hint}")
        return int(value)
    return check


def _optional(check):
    def wrapped(name, value):
        return None if value is None else check(name, value)
    return wrapped


def _real(name, value, strict, hint=""):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating)):
        raise TypeError(f"{name} must be a number; got {value!r}.{hint}")
    value = float(value)
    if not np.isfinite(value) or value < 0 or (strict and value == 0):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} 0; got "
                         f"{value}.{hint}")
    return value


def _lr(name, value):
    return _real(name, value, strict=True,
                 hint=" It is AdamW's learning rate (default 0.03); with 0 every model keeps "
                      "its starting metric.")


def _tol(name, value):
    return _real(name, value, strict=False,
                 hint=" It is the training improvement that resets patience (default 1e-4).")


def _batch_size(name, value):
    if isinstance(value, str):
        if value in ("auto", "full"):
            return value
        raise ValueError(f"{name} must be 'auto', 'full' or an int >= 2; got {value!r}.")
    if not _is_int(value):
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
        return {str(k): _real(f"{name}[{k!r}]", v, strict=False) for k, v in value.items()}
    return _real(name, value, strict=False, hint=" (or a dict {feature: distance})")


def _device(name, value):
    from ..utils import check_device

    check_device(value)
    return str(value)


def _random_state(name, value):
    if value is None:
        return None
    if _is_int(value):
        if value < 0:
            raise ValueError(f"{name} must be None or an int >= 0; got {value}.")
        return int(value)
    if isinstance(value, (np.random.Generator, np.random.RandomState)):
        return value
    raise TypeError(f"{name} must be None, an int >= 0, a numpy Generator or RandomState; "
                    f"got {value!r}.")


def _cv(name, value):
    if value is None or hasattr(value, "split"):
        return value
    if _is_int(value):
        if value < 2:
            raise ValueError(f"{name} must be >= 2 folds (or None for no cross-validation); "
                             f"got {value}.")
        return int(value)
    if isinstance(value, (str, bytes, float, bool, dict)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be None, an int >= 2, a scikit-learn splitter or an "
                        f"iterable of (train, test) index arrays; got {value!r}.")
    return list(value)     # a generator is consumed once: keep its folds


def _n_jobs(name, value):
    if value is None:
        return None
    if not _is_int(value):
        raise TypeError(f"{name} must be None or an int (joblib semantics); got {value!r}.")
    if value == 0:
        raise ValueError(f"{name} must be None, a positive int or a negative int (joblib "
                         "semantics: -1 uses every core); got 0.")
    return int(value)


def _int_or(words, low, hint):
    """A check accepting ``words`` (``None`` or strings) as they are, else an int >=
    ``low`` (``numeric_levels``, ``n_repeats``)."""
    allowed = f"{', '.join(repr(w) for w in words)} or an int >= {low}"

    def check(name, value):
        if any(value is w if w is None else (isinstance(value, str) and value == w)
               for w in words):
            return value
        if not _is_int(value):
            raise TypeError(f"{name} must be {allowed}; got {value!r}.{hint}")
        if value < low:
            raise ValueError(f"{name} must be {allowed}; got {value}.{hint}")
        return int(value)
    return check


_numeric_levels = _int_or(("auto", None), 2, (
    " It is the grid of numeric feature distances in training: 'auto' (default), an int "
    ">= 2, or None for exact per-pair training."))
_n_repeats = _int_or(("auto",), 1, (
    " (repetitions of an int cv with new random folds; 'auto' chooses them from the number "
    "of stimuli)"))


#: one check per parameter name: ``check(name, value) -> normalised value``.
CHECKS = {
    "backend": _choice(BACKENDS),
    "batch_size": _batch_size,
    "chunk_size": _optional(_int_at_least(1, " (models per engine call; None sizes it from "
                                             "memory)")),
    "constraint": _choice(CONSTRAINTS),
    "cv": _cv,
    "device": _device,
    "distance": lambda name, value: _choice(registered_distances()
                                            + CROSSVALIDATED_DISTANCES)(name, value),
    "feature_groups": _feature_groups,
    "feature_kinds": _feature_kinds,
    "held_out_pairs": _choice(HELD_OUT_PAIRS),
    "interactions": _bool,
    "level": _choice(LEVELS),
    "lr": _lr,
    "max_steps": _int_at_least(1),
    "missing_distance": _missing_distance,
    "n_jobs": _n_jobs,
    "n_null": _int_at_least(0, " (null permutations for the single-subject tests; 0 runs "
                               "none)"),
    "n_permutations": _int_at_least(1),
    "null": _choice(NULLS),
    "n_repeats": _n_repeats,
    "numeric_levels": _numeric_levels,
    "patience": _int_at_least(1),
    "random_state": _random_state,
    "tol": _tol,
}


def check_params(params, *, distances=None):
    """Validate ``params`` (a dict name -> value) and return the normalised values.

    Only the names present are checked; unknown names raise a TypeError.  ``distances``
    widens the accepted neural distances (the estimator also takes ``"precomputed"``).
    """
    out = {}
    for name, value in params.items():
        if name not in CHECKS:
            raise TypeError(f"unknown option {name!r}; options are {sorted(CHECKS)}.")
        check = (_choice(distances) if name == "distance" and distances is not None
                 else CHECKS[name])
        out[name] = check(name, value)
    return out


# --------------------------------------------------------------------------- object
@dataclass(frozen=True, eq=False)
class MLEMOptions:
    """Training and analysis options of MLEM, validated on construction.

    See :class:`mlem_neuro.MLEM` and the analyses for the meaning of every field.  Build it
    with keyword arguments; a bad value raises a TypeError / ValueError naming the
    parameter.  ``allow_precomputed=True`` also accepts ``distance="precomputed"`` (the
    estimator, whose ``X`` may be a dissimilarity matrix).
    """

    constraint: str = "spd"
    interactions: bool = True
    level: str = "feature"
    distance: str = "euclidean"
    n_permutations: int = 10
    n_null: int = 0
    null: str = "conditional"
    held_out_pairs: str = "auto"
    max_steps: int = 1000
    patience: int = 50
    lr: float = 0.03
    tol: float = 1e-4
    batch_size: object = "auto"
    numeric_levels: object = "auto"
    feature_kinds: object = None
    feature_groups: object = None
    missing_distance: object = 0.0
    cv: object = 2
    n_repeats: object = "auto"
    chunk_size: object = None
    n_jobs: object = None
    device: str = "cpu"
    backend: str = "auto"
    random_state: object = None
    allow_precomputed: bool = False

    def __post_init__(self):
        distances = registered_distances() + (("precomputed",) if self.allow_precomputed
                                              else CROSSVALIDATED_DISTANCES)
        values = {f.name: getattr(self, f.name) for f in fields(self)
                  if f.name != "allow_precomputed"}
        for name, value in check_params(values, distances=distances).items():
            object.__setattr__(self, name, value)
        if (_is_int(self.n_repeats) and self.n_repeats > 1
                and (self.cv is None or not _is_int(self.cv))):
            raise ValueError(
                f"n_repeats={self.n_repeats} repeats an int cv with new random folds; got "
                f"cv={cv_description(self.cv)!r}. Use an int cv (e.g. cv=5), or build the "
                "repeated folds yourself (e.g. scikit-learn's RepeatedKFold) and pass them "
                "as cv with n_repeats=1.")

    @classmethod
    def names(cls):
        """Names of the options (the dataclass fields a caller may set)."""
        return [f.name for f in fields(cls) if f.name != "allow_precomputed"]

    @classmethod
    def from_call(cls, scope, **extra):
        """Options from a function's local variables (the names that are options)."""
        kw = {name: scope[name] for name in cls.names() if name in scope}
        kw.update(extra)
        return cls(**kw)

    @property
    def model_interactions(self):
        """Whether the metric has off-diagonal terms (never with the diagonal model)."""
        return self.interactions and self.constraint != "diagonal"

    def fit_kwargs(self):
        """The training options as :func:`~mlem_neuro.core.engine.fit_stack` uses them."""
        return dict(constraint=self.constraint, interactions=self.model_interactions,
                    max_steps=self.max_steps, patience=self.patience, lr=self.lr,
                    tol=self.tol, batch_size=self.batch_size,
                    numeric_levels=self.numeric_levels, backend=self.backend)

    def feature_space(self):
        """A new, unfitted :class:`~mlem_neuro.core.features.FeatureSpace`."""
        from .features import FeatureSpace

        return FeatureSpace(kinds=self.feature_kinds, groups=self.feature_groups,
                            missing_distance=self.missing_distance)

    def to_settings(self):
        """JSON-serialisable record of every option (what a result stores)."""
        out = {}
        for name in self.names():
            value = getattr(self, name)
            if name == "cv":
                value = cv_description(value)
            out[name] = jsonable(value)
        return out


def cv_description(cv):
    """``None`` / int as given, a splitter's ``repr``, ``"explicit"`` for folds."""
    if cv is None or _is_int(cv):
        return cv
    if hasattr(cv, "split"):
        return repr(cv)
    return "explicit"


def jsonable(value):
    """Best-effort JSON form of a setting (numbers, strings, lists, dicts, else ``repr``)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if _is_int(value):
        return int(value)
    if isinstance(value, (numbers.Real, np.floating)):
        return float(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return repr(value)
