"""What every MLEM result container shares: fold statistics, tidy frames, save / read."""
from __future__ import annotations

import contextlib
import importlib
import json
import math
import numbers
import os
import stat
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from .._docs import fill_doc
from .._provenance import check_recorded
from .._provenance import collect as collect_provenance
from ..core.memory import memory_budget
from ..core.options import jsonable
from ..core.scoring.familywise import familywise_over_tests
from ..utils import check_real

#: result class name → module defining it (read_result imports it on demand).
RESULT_MODULES = {
    "TimeCourseResult": "mlem_neuro.results.timecourse",
    "BrainMapResult": "mlem_neuro.results.brainmap",
    "SensorMapResult": "mlem_neuro.results.spacetime",
    "SourceMapResult": "mlem_neuro.results.spacetime",
    "RSATimeCourseResult": "mlem_neuro.results.rsa",
    "RSABrainMapResult": "mlem_neuro.results.rsa",
}
_FORMAT = 1


def _least_n_null(alpha):
    """Fewest null relabellings whose smallest p-value, ``1 / (1 + n_null)``, is below
    ``alpha``."""
    n = max(0, math.floor(1.0 / alpha) - 1)
    while 1.0 / (1 + n) >= alpha:
        n += 1
    return n


@fill_doc
class BaseResult:
    """Cross-validated MLEM results for ``M`` models (time points, spheres, regions).

    Subclasses add the coordinates of the models (times, voxels...) and their plots.  The
    per-fold arrays are kept; the public summaries average over folds.

    Parameters
    ----------
    %(fold_importance)s
    %(fold_score)s
    %(fold_weights)s
    %(n_iter)s
    %(terms)s
    %(feature_names)s
    %(settings)s
    %(tests)s
    %(pvalues)s
    %(pvalues_fwe)s
    %(main_effect)s
    %(gate_open)s
    %(training)s
    %(compiled)s

    Attributes
    ----------
    %(pvalues_fwe_tests)s
    """

    #: names of extra ndarray attributes a subclass saves (besides the fold arrays).
    _extra_arrays: tuple = ()

    def __init__(self, fold_importance, fold_score, fold_weights, n_iter, terms,
                 feature_names, settings=None, *, tests=None, pvalues=None,
                 pvalues_fwe=None, main_effect=None, gate_open=None, training=None,
                 compiled=None):
        for name, values in (("fold_importance", fold_importance),
                             ("fold_score", fold_score), ("fold_weights", fold_weights),
                             ("pvalues", pvalues), ("pvalues_fwe", pvalues_fwe),
                             ("main_effect", main_effect)):
            if values is not None:
                check_real(values, name)
        self.fold_importance = np.asarray(fold_importance, dtype=float)
        self.fold_score = np.asarray(fold_score, dtype=float)
        self.fold_weights = np.asarray(fold_weights, dtype=float)
        self.n_iter = np.asarray(n_iter)
        self.terms = list(terms)
        self.feature_names = list(feature_names)
        self.settings = dict(settings or {})
        if self.fold_importance.ndim != 3:
            raise ValueError("fold_importance must have shape (folds, models, terms); got "
                             f"{self.fold_importance.shape}")
        F, M, T = self.fold_importance.shape
        if len(self.terms) != T:
            raise ValueError(f"{T} importance columns but {len(self.terms)} terms")
        if self.fold_score.shape != (F, M) or self.fold_weights.shape[:2] != (F, M):
            raise ValueError("fold arrays disagree on the number of folds or models")
        m = len(self.feature_names)
        if self.fold_weights.shape != (F, M, m, m):
            raise ValueError(f"fold_weights must have shape (folds, models, m, m) = "
                             f"{(F, M, m, m)} for {m} features; got "
                             f"{self.fold_weights.shape}")
        if self.n_iter.shape != (F, M):
            raise ValueError(f"n_iter must have shape (folds, models) = {(F, M)}; got "
                             f"{self.n_iter.shape}")
        self._set_tests(tests, pvalues, pvalues_fwe, M)
        self.main_effect = None
        if main_effect is not None:
            self.main_effect = np.asarray(main_effect, dtype=float)
            if self.main_effect.shape != (M, m):
                raise ValueError(f"main_effect must have shape (models, features) = "
                                 f"{(M, m)} for {M} models and {m} features "
                                 f"{self.feature_names}; got {self.main_effect.shape}")
        self.gate_open = _check_gate_open(gate_open, M)
        #: what the result was computed with (versions, platform, device): collected now,
        #: or read back from the file (:mod:`mlem_neuro._provenance`)
        self.provenance = collect_provenance(self.settings.get("device"), training,
                                             compiled)

    def _set_tests(self, tests, pvalues, pvalues_fwe, M):
        given = [x is not None for x in (tests, pvalues, pvalues_fwe)]
        if any(given) and not all(given):
            raise ValueError("tests, pvalues and pvalues_fwe go together: give all three "
                             "or none.")
        self.tests = None if tests is None else [str(t) for t in tests]
        self.pvalues = self.pvalues_fwe = None
        if tests is None:
            return
        self.pvalues = np.asarray(pvalues, dtype=float)
        self.pvalues_fwe = np.asarray(pvalues_fwe, dtype=float)
        shape = (M, len(self.tests))
        if self.pvalues.shape != shape or self.pvalues_fwe.shape != shape:
            raise ValueError(f"pvalues and pvalues_fwe must have shape (models, tests) = "
                             f"{shape}; got {self.pvalues.shape} and "
                             f"{self.pvalues_fwe.shape}")

    def _test_index(self, test):
        if self.tests is None:
            raise ValueError("this result has no tests: run the analysis with n_null > 0 "
                             "(e.g. n_null=200).")
        if test not in self.tests:
            raise ValueError(f"unknown test {test!r}; tests are {self.tests}")
        return self.tests.index(test)

    @property
    def pvalues_fwe_tests(self):
        """Corrected p-values over models and tests ``(n_models, n_tests)``, or None.

        Computed from :attr:`pvalues_fwe` by
        :func:`mlem_neuro.stats.familywise_over_tests` (Holm's step-down over the tests):
        a value below ``alpha`` anywhere, in any test, is an ``alpha``-level claim.  NaN
        where :attr:`pvalues_fwe` is NaN (a test that was not run counts for nothing).
        """
        if self.tests is None:
            return None
        return familywise_over_tests(self.pvalues_fwe)

    def _corrected_pvalues(self, corrected):
        """The p-values that ``corrected`` names (see :meth:`significant`)."""
        if isinstance(corrected, (bool, np.bool_)):
            return self.pvalues_fwe if corrected else self.pvalues
        if isinstance(corrected, str) and corrected in ("models", "all"):
            return self.pvalues_fwe if corrected == "models" else self.pvalues_fwe_tests
        raise ValueError("corrected must be False (uncorrected), True or 'models' "
                         "(family-wise over the models of each test) or 'all' (over "
                         f"models and tests); got {corrected!r}")

    def significant(self, test, alpha=0.05, corrected=True):
        """Models where ``test`` is significant.

        Parameters
        ----------
        test : str
            A name of :attr:`tests` (``"score"`` or a feature).
        alpha : float
            Level of the test.
        corrected : bool | "models" | "all"
            Which p-values: ``False`` uncorrected (:attr:`pvalues`, for a model chosen in
            advance); ``True`` or ``"models"`` (default) family-wise corrected over the
            models of this test (:attr:`pvalues_fwe`, maximum statistic over models);
            ``"all"`` corrected over models and tests (:attr:`pvalues_fwe_tests`), so
            that the chance of any false positive in any test stays at ``alpha``.

        Returns
        -------
        mask : ndarray of bool (n_models,)
            False where the p-value is NaN (a model whose score is undefined, or a test
            that could not be run).  A test that could not be run at all (every p-value
            NaN: :attr:`untestable_tests`) gives all False with a warning naming it and
            why: a boolean mask, not NaN, so that plotting and indexing code keeps
            working, but never silently.

        Notes
        -----
        A p-value is ``(1 + #null >= observed) / (1 + n_null)``, at least
        ``1 / (1 + n_null)``: with ``n_null=19`` none is below 0.05, and a warning says
        so (use ``n_null=99`` or more).  A feature's test that reads its main effect alone
        reads more null datasets (``settings["n_null_used"]``, method page "The feature
        test"), and its floor is theirs.  With ``corrected="all"`` and ``k`` tests the
        smallest is ``k / (1 + n_null)``, and the warning comes when that is not below
        ``alpha`` (4 tests need ``n_null >= 80``; 199 or more leaves room).

        With the staged feature test (:attr:`gate_open` not ``None``), a feature that is
        significant in models where the gate is open gets one warning saying in how many:
        there its test includes the held-out importance, so the finding rests on the
        test of interactions too (:meth:`rests_on_interactions` returns those models).
        """
        mask = self._significant(test, alpha, corrected, stacklevel=3)
        if test in self.feature_names and self.gate_open is not None:
            n_open = int(np.count_nonzero(mask & self.gate_open))
            if n_open:
                warnings.warn(f"{test!r} is significant in {n_open} model(s) (of "
                              f"{int(mask.sum())}) where the test of interactions found "
                              "interactions (result.gate_open): there its test includes the "
                              "feature's interactions, so it rests on them; on null data a "
                              "chance interaction carried into it (method page, 'Where the "
                              "gate opens'). result.rests_on_interactions("
                              f"{test!r}) gives these models.", UserWarning, stacklevel=2)
        return mask

    def rests_on_interactions(self, test, alpha=0.05, corrected=True):
        """Models where a feature is significant *and* the staged test's gate is open.

        With ``feature_test="staged"`` (the default) a feature's test is its main effect
        alone, except in the models where the test of interactions is family-wise
        significant (:attr:`gate_open`): there it is the larger of the standardised
        held-out importance and the main effect, so a finding there rests on the test of
        interactions too (a chance interaction carries into it; method page, "Where the
        gate opens").  :meth:`significant` warns when a feature's significant models
        include such models; this returns them, without that warning.

        Parameters
        ----------
        test : str
            A feature of :attr:`tests`.
        alpha : float
            Level of the test.
        corrected : bool | "models" | "all"
            Which p-values, as in :meth:`significant`.

        Returns
        -------
        mask : ndarray of bool (n_models,)
            ``significant(test, alpha, corrected) & gate_open``; all False when
            :attr:`gate_open` is ``None`` (not a staged test, or a file saved before it
            was recorded).
        """
        if test not in self.feature_names:
            raise ValueError(f"rests_on_interactions reads a feature's test; {test!r} is "
                             f"none of the features {self.feature_names}")
        mask = self._significant(test, alpha, corrected, stacklevel=3)
        if self.gate_open is None:
            return np.zeros_like(mask)
        return mask & self.gate_open

    def _significant(self, test, alpha, corrected, stacklevel):
        """The mask of :meth:`significant`, with its warnings about the p-values (at
        ``stacklevel``) but not the one about the gate."""
        k = self._test_index(test)
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1]; got {alpha!r}")
        p = self._corrected_pvalues(corrected)
        used = self.settings.get("n_null_used") or {}
        n_null = self.settings.get("n_null")
        if used.get(test) is not None:        # this test's own null datasets
            n_null = used[test]
        n_tests = int((~np.isnan(self.pvalues_fwe)).any(axis=0).sum()) \
            if corrected == "all" else 1
        if n_null is not None and n_tests > 1 and n_tests / (1 + n_null) >= alpha:
            warnings.warn(f"with n_null={n_null} and {n_tests} tests the smallest p-value "
                          f"corrected over the tests is {n_tests}/{n_null + 1} = "
                          f"{n_tests / (1 + n_null):.3g}, not below alpha={alpha:g}: no "
                          "model can be significant with corrected='all'. Run the "
                          "analysis with more null relabellings (n_null >= "
                          f"{_least_n_null(alpha / n_tests)}).", UserWarning, stacklevel=stacklevel)
        elif n_null is not None and 1.0 / (1 + n_null) >= alpha:
            warnings.warn(f"with n_null={n_null} the smallest p-value is 1/{n_null + 1} = "
                          f"{1.0 / (1 + n_null):.3g}, not below alpha={alpha:g}: no model "
                          "can be significant. Run the analysis with more null "
                          f"relabellings (n_null >= {_least_n_null(alpha)}, e.g. 99).",
                          UserWarning, stacklevel=stacklevel)
        if np.isnan(p[:, k]).all():
            why = self.untestable_tests.get(test)
            warnings.warn(f"the test of {test!r} could not be run"
                          f"{': ' + why if why else ''}: its p-values are all NaN (not "
                          "testable), so no model is marked significant; that is no "
                          "evidence against an effect.", UserWarning, stacklevel=stacklevel)
        return p[:, k] < alpha

    # ------------------------------------------------------------- summaries
    @property
    def n_folds(self):
        """Number of cross-validation folds (1 with ``cv=None``)."""
        return self.fold_importance.shape[0]

    @property
    def importance(self):
        """Fold-mean importance ``(M, n_terms)``."""
        return self.fold_importance.mean(axis=0)

    @property
    def importance_fold_std(self):
        """Spread of importance across folds (std, ``ddof=1``; zeros for one fold).

        It describes how much the folds disagree; it is **not** a standard error of the
        importance (folds share training stimuli, and pairs share stimuli).  For evidence
        that a feature matters, use the permutation tests (``n_null``) or a group-level
        test over subjects.
        """
        if self.n_folds < 2:
            return np.zeros_like(self.importance)
        return self.fold_importance.std(axis=0, ddof=1)

    @property
    def importance_std(self):
        """Deprecated alias of :attr:`importance_fold_std` (the spread across folds)."""
        warnings.warn("importance_std is deprecated and will be removed: use "
                      "importance_fold_std (the spread of importance across folds, not a "
                      "standard error).", FutureWarning, stacklevel=2)
        return self.importance_fold_std

    @property
    def score(self):
        """Fold-mean held-out Spearman ``(M,)``."""
        return self.fold_score.mean(axis=0)

    @property
    def score_kind(self):
        """What the scores are: ``"held-out"``, or ``"in-sample"`` without cross-validation.

        ``cv=None`` trains and scores on the same stimuli: scores are then optimistic.
        """
        return "in-sample" if "cv" in self.settings and self.settings["cv"] is None \
            else "held-out"

    @property
    def _no_cv_note(self):
        return " (no cross-validation)" if self.score_kind == "in-sample" else ""

    @property
    def score_std(self):
        """Spread of the held-out Spearman across folds (std, ``ddof=1``; 0 for one fold)."""
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
        data["importance_fold_std"] = self.importance_fold_std.ravel()
        data["score"] = np.repeat(self.score, T)
        if self.tests is not None:
            kinds = (("pvalue", self.pvalues), ("pvalue_fwe", self.pvalues_fwe),
                     ("pvalue_fwe_tests", self.pvalues_fwe_tests))
            for name, p in kinds:
                data[name] = self._term_pvalues(p).ravel()
            # the tests of no term ("score", "interactions"): one column each
            for k, test in enumerate(self.tests):
                if test not in self.terms:
                    for name, p in kinds:
                        data[f"{test}_{name}"] = np.repeat(p[:, k], T)
            untestable = self.untestable_tests
            if untestable:          # why a term's p-values are NaN
                data["test_note"] = np.tile([untestable.get(t, "") for t in self.terms], M)
        if self.gate_open is not None:          # the staged test's gate, per model
            data["gate_open"] = np.repeat(self.gate_open, T)
        return pd.DataFrame(data)

    @property
    def untestable_tests(self):
        """The ``{test: reason}`` of the tests whose null could not move what they test (a
        feature nested in the others, or constant within every group): their p-values are
        NaN, not 1 (empty when every test could be run)."""
        return dict(self.settings.get("untestable_tests") or {})

    def _term_pvalues(self, p):
        """``(M, n_terms)`` p-values of each term's test (NaN for terms without one)."""
        out = np.full(self.importance.shape, np.nan)
        for k, term in enumerate(self.terms):
            if term in self.tests and term != "score":
                out[:, k] = p[:, self.tests.index(term)]
        return out

    # ------------------------------------------------------------------ I/O
    def _state(self):
        """Arrays and JSON settings that rebuild this object exactly."""
        arrays = dict(fold_importance=self.fold_importance, fold_score=self.fold_score,
                      fold_weights=self.fold_weights, n_iter=self.n_iter)
        for name in self._extra_arrays:
            arrays[name] = np.asarray(getattr(self, name))
        meta = dict(terms=self.terms, feature_names=self.feature_names,
                    settings=_json_settings(self.settings), extra=self._extra_meta(),
                    provenance=jsonable(self.provenance))
        if self.tests is not None:
            arrays.update(pvalues=self.pvalues, pvalues_fwe=self.pvalues_fwe)
            meta["tests"] = self.tests
        if self.main_effect is not None:
            arrays["main_effect"] = self.main_effect
        if self.gate_open is not None:
            arrays["gate_open"] = self.gate_open
        return arrays, meta

    def _extra_meta(self):
        """JSON-serialisable constructor arguments of a subclass (override)."""
        return {}

    @classmethod
    def _from_state(cls, arrays, meta):
        extra_arrays = {name: arrays[name] for name in cls._extra_arrays}
        # files written before the tests existed have none of these entries
        tests = dict(tests=meta.get("tests"), pvalues=arrays.get("pvalues"),
                     pvalues_fwe=arrays.get("pvalues_fwe"))
        # files written before the main effects existed have none: None
        tests["main_effect"] = arrays.get("main_effect")
        # nor those written before the staged test's gate was recorded: None
        tests["gate_open"] = arrays.get("gate_open")
        res = cls(fold_importance=arrays["fold_importance"], fold_score=arrays["fold_score"],
                  fold_weights=arrays["fold_weights"], n_iter=arrays["n_iter"],
                  terms=meta["terms"], feature_names=meta["feature_names"],
                  settings=meta["settings"], **tests, **extra_arrays, **meta["extra"])
        # files written before provenance was recorded have none: {} (unknown)
        res.provenance = check_recorded(meta.get("provenance"))
        return res

    def save(self, fname, overwrite=False):
        """Save to a ``.npz`` file, readable with :func:`mlem_neuro.read_result`.

        The file is written under a temporary name in the same folder and moved into
        place only once complete, so an interrupted save never leaves a truncated file
        nor destroys the file it was replacing.

        :attr:`settings` are stored as JSON: numpy numbers and arrays are read back as
        Python numbers and lists, tuples as lists, sets as lists in sorted order, dict
        keys as strings.  Any other value (an object, a function) is refused with a
        ``TypeError`` naming its key, not stored as its ``repr``.

        Parameters
        ----------
        fname : path-like
            Destination, ending with ``.npz``.
        overwrite : bool
            Replace an existing file (default ``False``: refuse).

        Returns
        -------
        fname : Path
            The path written.
        """
        fname = Path(os.fsdecode(os.fspath(fname)))
        if fname.suffix != ".npz":
            raise ValueError(f"result files end with '.npz' (e.g. 'sub-01_mlem.npz'); got "
                             f"{str(fname)!r}")
        if fname.exists() and not overwrite:
            raise FileExistsError(f"{fname} exists; pass overwrite=True to replace it.")
        folder = fname.parent
        if not folder.is_dir():
            raise FileNotFoundError(f"cannot save {fname}: the folder {folder} does not "
                                    "exist; create it first.")
        arrays, meta = self._state()
        header = dict(format=_FORMAT, kind=type(self).__name__, **meta)
        payload = {f"array__{k}": v for k, v in arrays.items()}
        payload["__header__"] = np.array(json.dumps(header))
        _write_atomic(fname, payload, overwrite)
        return fname

    def __repr__(self):
        M, T = self.importance.shape
        note = (f", not testable: {sorted(self.untestable_tests)}" if self.untestable_tests
                else "")
        if self.gate_open is not None and self.gate_open.any():
            note += f", gate open in {int(self.gate_open.sum())} of {M} models"
        versions = (self.provenance or {}).get("versions", {})
        if versions.get("mlem_neuro"):
            note += f", mlem_neuro {versions['mlem_neuro']}"
        return (f"<{type(self).__name__} | {M} models, {T} terms, {self.n_folds} fold(s), "
                f"mean score {np.nanmean(self.score):.3f}{note}>")


def _check_gate_open(gate_open, M):
    """``gate_open`` as an ``(M,)`` bool array (``None`` stays ``None``); ValueError
    for another shape or for values other than True / False (or 0 / 1)."""
    if gate_open is None:
        return None
    gate = np.asarray(gate_open)
    if gate.shape != (M,):
        raise ValueError(f"gate_open must have shape (models,) = {(M,)}, one bool per "
                         f"model; got {gate.shape}")
    if gate.dtype != bool:
        if gate.dtype.kind not in "iuf" or not np.isin(gate, (0, 1)).all():
            raise ValueError("gate_open must hold True / False, one per model; got "
                             f"values of dtype {gate.dtype}")
        gate = gate.astype(bool)
    return gate.copy()


def _json_settings(value, where="settings"):
    """``value`` as the JSON a result file stores (see :meth:`BaseResult.save`): numbers,
    strings, ``None``, lists and string-keyed dicts; sets become sorted lists (by value,
    or by ``repr`` when their items do not compare); ``TypeError`` naming ``where`` for a
    value JSON cannot hold."""
    if isinstance(value, (set, frozenset)):
        try:
            items = sorted(value)
        except TypeError:
            items = sorted(value, key=repr)
        return [_json_settings(v, f"{where}[{k}]") for k, v in enumerate(items)]
    if isinstance(value, dict):
        return {str(k): _json_settings(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_settings(v, f"{where}[{k}]") for k, v in enumerate(value)]
    if isinstance(value, (complex, np.complexfloating)) or (
            isinstance(value, np.ndarray) and value.dtype.kind == "c"):
        raise TypeError(f"{where} holds complex values ({value!r:.80}), which a result "
                        "file does not store; save abs(value), .real or .imag instead.")
    if isinstance(value, np.ndarray):
        return _json_settings(value.tolist(), where)
    if value is None or isinstance(value, (bool, np.bool_, str, numbers.Real, np.number)):
        return jsonable(value)
    raise TypeError(f"{where} holds a {type(value).__name__} ({value!r:.80}), which a "
                    "result file cannot store (its settings are JSON: numbers, strings, "
                    "lists, dicts). Store a plain value instead, e.g. str(value).")


def _new_file_mode():
    """Permission bits a newly created file gets under the current umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _write_atomic(fname, payload, overwrite=True):
    """``np.savez`` into a temporary file next to ``fname``, then move it into place:
    renamed over the old file (``overwrite``), or else linked to the new name, which fails
    if the name was taken meanwhile (two saves to one new path: one wins, the other gets
    ``FileExistsError``, never both a success)."""
    fd, tmp = tempfile.mkstemp(dir=fname.parent, prefix=f".{fname.stem}-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())
        mode = fname.stat().st_mode & 0o777 if fname.exists() else _new_file_mode()
        os.chmod(tmp, mode)
        if overwrite:
            os.replace(tmp, fname)
        else:
            _claim(tmp, fname)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _claim(tmp, fname):
    """Give the complete file ``tmp`` the new name ``fname`` only if nobody holds it."""
    try:
        os.link(tmp, fname)                  # atomic: fails if fname exists
    except FileExistsError:
        raise FileExistsError(f"{fname} exists (written meanwhile by another process?); "
                              "pass overwrite=True to replace it.") from None
    except OSError:                          # no hard links here: claim the name first
        try:
            os.close(os.open(fname, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            raise FileExistsError(f"{fname} exists (written meanwhile by another "
                                  "process?); pass overwrite=True to replace it.") from None
        os.replace(tmp, fname)
        return
    os.unlink(tmp)


# ------------------------------------------------------------------------- reading
#: the words every damaged-file error holds
READABLE_MARK = "is not a readable mlem_neuro result file"


def _damaged(fname, what, detail):
    """The one error a damaged or foreign file gives."""
    detail = " ".join(str(detail).split()) or "no further detail"
    return ValueError(f"{fname} {READABLE_MARK} ({what}): {detail}")


#: entries larger than this (uncompressed) are not read from a result file: a result's
#: arrays are fold statistics, and a small file that unpacks into gigabytes is not one.
_MAX_ENTRY_BYTES = 2**31


class _ArchiveArrays(Mapping):
    """The arrays of an open result archive, each read only when asked for (an entry a
    result does not use is never decompressed), after its unpacked size is checked
    against ``budget`` (the memory budget read when the file was opened)."""

    def __init__(self, archive, fname, budget):
        self._archive, self._fname, self._read = archive, fname, {}
        self._budget = budget
        self._names = [k[len("array__"):] for k in archive.files if k.startswith("array__")]

    def __getitem__(self, key):
        if key not in self._read:
            if key not in self._names:
                raise KeyError(key)
            _check_entry(self._archive, f"array__{key}", self._fname, self._budget)
            values = self._archive[f"array__{key}"]
            if values.dtype.kind == "c":     # read as floats, the imaginary part would go
                raise _damaged(self._fname, "complex array",
                               f"the entry {key!r} holds complex values ({values.dtype}); "
                               "a result's arrays are real")
            self._read[key] = values
        return self._read[key]

    def __iter__(self):
        return iter(self._names)

    def __len__(self):
        return len(self._names)


def _check_entry(archive, name, fname, budget):
    size = archive.zip.getinfo(f"{name}.npy").file_size
    if size > min(_MAX_ENTRY_BYTES, budget):
        raise _damaged(fname, "oversized entry",
                       f"the entry {name!r} unpacks into {size} bytes, more than a result "
                       "holds (or than the memory budget, MLEM_NEURO_MEMORY)")


#: what reading a damaged archive can raise
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError, KeyError, ValueError)


@contextlib.contextmanager
def _open_archive(fname):
    """``(header dict, arrays mapping)`` of a result file, the arrays read on demand while
    the archive is open; ValueError when it is damaged or not a result file.  The memory
    budget (``MLEM_NEURO_MEMORY``) is read once, here, for every entry of the file."""
    # read first: a bad MLEM_NEURO_MEMORY says so, not that the file is damaged
    budget = memory_budget()
    if not stat.S_ISREG(fname.stat().st_mode):
        raise _damaged(fname, "not a regular file",
                       "result files are .npz files written by .save() (a pipe, socket or "
                       "device is not read)")
    with open(fname, "rb") as f:
        start = f.read(4)
    if start != b"PK\x03\x04":
        what = "empty file" if not start else "not a .npz (zip) archive"
        raise _damaged(fname, what, "result files are written by the .save() method of an "
                       "MLEM result")
    try:
        archive = np.load(fname, allow_pickle=False)
    except _ARCHIVE_ERRORS as err:
        raise _damaged(fname, "truncated or corrupt archive",
                       f"{type(err).__name__}: {err}") from None
    with archive:
        names = list(archive.files)
        if "__header__" not in names:
            raise _damaged(fname, "missing header",
                           "the archive has no '__header__' entry, so it is not an "
                           f"mlem_neuro result written by .save() (entries: {names[:8]})")
        try:
            _check_entry(archive, "__header__", fname, budget)
            text = str(archive["__header__"])
        except _ARCHIVE_ERRORS as err:
            if isinstance(err, ValueError) and READABLE_MARK in str(err):
                raise
            raise _damaged(fname, "truncated or corrupt archive",
                           f"{type(err).__name__}: {err}") from None
        try:
            header = json.loads(text)
        except json.JSONDecodeError as err:
            raise _damaged(fname, "bad header",
                           f"the header is not valid JSON ({err})") from None
        if not isinstance(header, dict):
            raise _damaged(fname, "bad header", "the header is not a JSON object")
        yield header, _ArchiveArrays(archive, fname, budget)


def _result_class(fname, header):
    fmt, kind = header.get("format"), header.get("kind")
    if not isinstance(fmt, int) or isinstance(fmt, bool):
        raise _damaged(fname, "bad header", f"no valid format number (got {fmt!r})")
    if fmt > _FORMAT:
        raise _damaged(fname, f"format {fmt}",
                       f"it was written by a newer mlem_neuro (this version reads format "
                       f"{_FORMAT} and older); upgrade mlem_neuro to read it")
    if kind not in RESULT_MODULES:
        raise _damaged(fname, "unknown result kind",
                       f"kind {kind!r} is none of {sorted(RESULT_MODULES)}")
    return getattr(importlib.import_module(RESULT_MODULES[kind]), kind)


#: header field -> (JSON type it holds, what that is called)
_HEADER_TYPES = {"terms": (list, "a list"), "feature_names": (list, "a list"),
                 "tests": (list, "a list"), "settings": (dict, "a JSON object"),
                 "extra": (dict, "a JSON object")}


def _check_header_types(fname, meta):
    """The header's fields hold what ``.save()`` writes (absent ones are left to the
    reader, which names them; ``tests`` may be null); the error names the first field
    that does not, where it would otherwise be misread (a string of terms split into
    letters) or fail later (``repr`` of a string provenance)."""
    for key, (kind, what) in _HEADER_TYPES.items():
        value = meta.get(key)
        if key in meta and not isinstance(value, kind) and not (key == "tests"
                                                                 and value is None):
            raise _damaged(fname, "bad header",
                           f"{key!r} is a {type(value).__name__} ({value!r:.60}), not {what}")
    try:
        check_recorded(meta.get("provenance"))
    except ValueError as err:
        raise _damaged(fname, "bad header", err) from None


def read_result(fname):
    """Read a result saved with ``.save()`` (any MLEM result class).

    Parameters
    ----------
    fname : path-like
        A ``.npz`` file written by the ``save`` method of a result.

    Returns
    -------
    result : TimeCourseResult | BrainMapResult | SensorMapResult | SourceMapResult
        The saved object, of the class that saved it.

    Raises
    ------
    FileNotFoundError
        When ``fname`` does not exist.
    ValueError
        When the file is not a readable result file (not a ``.npz`` archive, truncated,
        no header, a header that is not JSON, missing or inconsistent arrays); the message
        names the file and what is wrong with it.
    """
    fname = Path(os.fsdecode(os.fspath(fname)))
    if not fname.exists():
        raise FileNotFoundError(f"no such result file: {fname}")
    if fname.is_dir():
        raise _damaged(fname, "a folder", "give the path of a .npz file inside it")
    with _open_archive(fname) as (header, arrays):
        cls = _result_class(fname, header)
        meta = {k: v for k, v in header.items() if k not in ("format", "kind")}
        _check_header_types(fname, meta)
        try:
            return cls._from_state(arrays, meta)
        except KeyError as err:
            raise _damaged(fname, "missing entries",
                           f"no {err.args[0]!r} entry (the file holds arrays "
                           f"{sorted(arrays)} and header keys {sorted(meta)})") from None
        except ValueError as err:
            if READABLE_MARK in str(err):            # already says what is wrong
                raise
            raise _damaged(fname, "inconsistent contents", err) from None
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
            raise _damaged(fname, "truncated or corrupt archive",
                           f"{type(err).__name__}: {err}") from None
        except (TypeError, IndexError, AttributeError) as err:
            raise _damaged(fname, "inconsistent contents", err) from None
