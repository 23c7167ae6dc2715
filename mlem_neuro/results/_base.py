"""What every MLEM result container shares: fold statistics, tidy frames, save / read."""
from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

#: result class name → module defining it (read_result imports it on demand).
RESULT_MODULES = {
    "TimeCourseResult": "mlem_neuro.results.timecourse",
    "BrainMapResult": "mlem_neuro.results.brainmap",
}
_FORMAT = 1


class BaseResult:
    """Cross-validated MLEM results for ``M`` models (time points, spheres, regions).

    Subclasses add the coordinates of the models (times, voxels...) and their plots.  The
    per-fold arrays are kept; the public summaries average over folds.

    Parameters
    ----------
    fold_importance : ndarray (n_folds, M, n_terms)
    fold_score : ndarray (n_folds, M)
    fold_weights : ndarray (n_folds, M, m, m)
    n_iter : ndarray (n_folds, M)
    terms : list of str
    feature_names : list of str
    settings : dict
        JSON-serialisable analysis settings (constraint, cv, n_permutations, ...).
    """

    #: names of extra ndarray attributes a subclass saves (besides the fold arrays).
    _extra_arrays: tuple = ()

    def __init__(self, fold_importance, fold_score, fold_weights, n_iter, terms,
                 feature_names, settings=None):
        self.fold_importance = np.asarray(fold_importance, dtype=float)
        self.fold_score = np.asarray(fold_score, dtype=float)
        self.fold_weights = np.asarray(fold_weights, dtype=float)
        self.n_iter = np.asarray(n_iter)
        self.terms = list(terms)
        self.feature_names = list(feature_names)
        self.settings = dict(settings or {})
        F, M, T = self.fold_importance.shape
        if len(self.terms) != T:
            raise ValueError(f"{T} importance columns but {len(self.terms)} terms")
        if self.fold_score.shape != (F, M) or self.fold_weights.shape[:2] != (F, M):
            raise ValueError("fold arrays disagree on the number of folds or models")

    # ------------------------------------------------------------- summaries
    @property
    def n_folds(self):
        return self.fold_importance.shape[0]

    @property
    def importance(self):
        """Fold-mean importance ``(M, n_terms)``."""
        return self.fold_importance.mean(axis=0)

    @property
    def importance_std(self):
        """Spread of importance across folds (std, ``ddof=1``; zeros for one fold)."""
        if self.n_folds < 2:
            return np.zeros_like(self.importance)
        return self.fold_importance.std(axis=0, ddof=1)

    @property
    def score(self):
        """Fold-mean held-out Spearman ``(M,)``."""
        return self.fold_score.mean(axis=0)

    @property
    def score_std(self):
        if self.n_folds < 2:
            return np.zeros_like(self.score)
        return self.fold_score.std(axis=0, ddof=1)

    @property
    def weights(self):
        """Fold-mean metric ``W`` ``(M, m, m)``."""
        return self.fold_weights.mean(axis=0)

    def _term_index(self, terms):
        if terms is None:
            return list(range(len(self.terms)))
        if isinstance(terms, str):
            terms = [terms]
        bad = [t for t in terms if t not in self.terms]
        if bad:
            raise ValueError(f"unknown term(s) {bad}; terms are {self.terms}")
        return [self.terms.index(t) for t in terms]

    def _long_frame(self, coords):
        """Tidy frame: one row per (model, term), ``coords`` a dict of per-model columns."""
        M, T = self.importance.shape
        data = {name: np.repeat(np.asarray(vals), T) for name, vals in coords.items()}
        data["term"] = np.tile(self.terms, M)
        data["importance"] = self.importance.ravel()
        data["importance_std"] = self.importance_std.ravel()
        data["score"] = np.repeat(self.score, T)
        return pd.DataFrame(data)

    # ------------------------------------------------------------------ I/O
    def _state(self):
        """Arrays and JSON settings that rebuild this object exactly."""
        arrays = dict(fold_importance=self.fold_importance, fold_score=self.fold_score,
                      fold_weights=self.fold_weights, n_iter=self.n_iter)
        for name in self._extra_arrays:
            arrays[name] = np.asarray(getattr(self, name))
        meta = dict(terms=self.terms, feature_names=self.feature_names,
                    settings=self.settings, extra=self._extra_meta())
        return arrays, meta

    def _extra_meta(self):
        """JSON-serialisable constructor arguments of a subclass (override)."""
        return {}

    @classmethod
    def _from_state(cls, arrays, meta):
        extra_arrays = {name: arrays[name] for name in cls._extra_arrays}
        return cls(fold_importance=arrays["fold_importance"], fold_score=arrays["fold_score"],
                   fold_weights=arrays["fold_weights"], n_iter=arrays["n_iter"],
                   terms=meta["terms"], feature_names=meta["feature_names"],
                   settings=meta["settings"], **extra_arrays, **meta["extra"])

    def save(self, fname, overwrite=False):
        """Save to a ``.npz`` file, readable with :func:`mlem_neuro.read_result`."""
        fname = Path(os.fspath(fname))
        if fname.suffix != ".npz":
            raise ValueError(f"result files end with '.npz' (e.g. 'sub-01_mlem.npz'); got "
                             f"{str(fname)!r}")
        if fname.exists() and not overwrite:
            raise FileExistsError(f"{fname} exists; pass overwrite=True to replace it.")
        arrays, meta = self._state()
        header = dict(format=_FORMAT, kind=type(self).__name__, **meta)
        np.savez(fname, __header__=np.array(json.dumps(header)),
                 **{f"array__{k}": v for k, v in arrays.items()})
        return fname

    def __repr__(self):
        M, T = self.importance.shape
        return (f"<{type(self).__name__} | {M} models, {T} terms, {self.n_folds} fold(s), "
                f"mean score {np.nanmean(self.score):.3f}>")


def read_result(fname):
    """Read a result saved with ``.save()`` (any MLEM result class)."""
    fname = Path(os.fspath(fname))
    if not fname.exists():
        raise FileNotFoundError(f"no such result file: {fname}")
    with np.load(fname, allow_pickle=False) as f:
        if "__header__" not in f.files:
            raise ValueError(f"{fname} is not an mlem_neuro result file.")
        header = json.loads(str(f["__header__"]))
        arrays = {k[len("array__"):]: f[k] for k in f.files if k.startswith("array__")}
    kind = header.pop("kind")
    if kind not in RESULT_MODULES:
        raise ValueError(f"{fname} holds an unknown result kind {kind!r}.")
    cls = getattr(importlib.import_module(RESULT_MODULES[kind]), kind)
    header.pop("format")
    return cls._from_state(arrays, header)
