"""The options of an MLEM analysis: one frozen object, validated once, serialised once.

Every public entry point (:class:`mlem_neuro.MLEM`, :func:`mlem_neuro.mlem_array`,
:func:`mlem_neuro.mlem_epochs`, :func:`mlem_neuro.mlem_searchlight`,
:func:`mlem_neuro.mlem_roi` and the command line) keeps flat keyword arguments, as MNE and
nilearn do, and turns them into an :class:`MLEMOptions` *before touching any data*, so a
bad value is refused identically everywhere and nothing is computed first.  The drivers
(:func:`mlem_neuro.crossval.run_cv`, :func:`mlem_neuro.core.training.engine.fit_stack`) take the
object; every result records :meth:`MLEMOptions.to_settings`.

The checks live in one table keyed by parameter name, :data:`mlem_neuro.core.checks.CHECKS`
(the idea of nilearn's ``check_params``), shared with every function and the command
line: :func:`check_params` runs the check of every name it is given, so a function that
takes only some of the options can validate exactly those.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields

import numpy as np

from .checks import (  # noqa: F401  (the vocabulary, re-exported where it was)
    BACKENDS,
    CHECKS,
    CONSTRAINTS,
    CROSSVALIDATED_DISTANCES,
    FEATURE_KINDS,
    HELD_OUT_PAIRS,
    LEVELS,
    NULLS,
    check_params,
    registered_distances,
)
from .checks import (
    is_int as _is_int,
)


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
    feature_test: str = "staged"
    held_out_pairs: str = "auto"
    max_steps: int = 1000
    patience: object = "auto"
    lr: object = "auto"
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
        """The training options as :func:`~mlem_neuro.core.training.engine.fit_stack` uses them."""
        return dict(constraint=self.constraint, interactions=self.model_interactions,
                    max_steps=self.max_steps, patience=self.patience, lr=self.lr,
                    tol=self.tol, batch_size=self.batch_size,
                    numeric_levels=self.numeric_levels, backend=self.backend)

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
