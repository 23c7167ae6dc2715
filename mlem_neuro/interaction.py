"""Are interactions real?  A permutation test of non-additivity.

With binary feature distances, ``W = diag(w) + λ w wᵀ`` ranks every pair the same for all
``λ ≥ 0``, so the interaction terms of a fitted ``W`` are not evidence of interactions.
What is identifiable is whether the neural geometry needs more than the features' main
effects.  :func:`interaction_test` measures it:

* **Statistic**: the fold-mean held-out Spearman of the model with interactions (the
  options' ``constraint``, ``"spd"`` by default) minus that of the diagonal model (FR-RSA),
  on the same folds.  Larger means the interactions predict held-out pairs better than
  the best additive metric.
* **Null** (residual permutation under the reduced model, on the response patterns):
  each unit's response is regressed on the features' main effects (one-hot levels of
  categorical features, a cubic polynomial of numeric and ordinal ones: a non-linear main
  effect stays a main effect), ``Y = Ŷ + E``.
  The residuals are written in an orthonormal basis ``Q`` of the residual space
  (``E = Q Z``, ``Z = QᵀY`` with ``n − rank`` rows; Huh & Jhun's variant of Freedman &
  Lane's scheme: under i.i.d. Gaussian noise the rows of ``Z`` are i.i.d., so permuting
  them is exact) and a null dataset is ``Ŷ + Q Z[π]`` for a random permutation ``π`` of
  those rows.  The main effects stay where they are; whatever they leave out (an
  interaction, the noise) is shuffled; the noise stays noise of the patterns, so the null
  distances keep the structure of real ones (pairs sharing a stimulus are dependent, and
  a stimulus's noise displaces it along the feature directions).  Each null dataset goes
  through the same cross-validated comparison.

Replicate ``0`` is the identity permutation (the observed data), so the observed and null
statistics come from one stack: the null datasets of every model are more members of the
stacks that :func:`~mlem_neuro.crossval.run_cv` fits, and replicate ``b`` uses the same
permutation for every model (a max over models gives family-wise error control).

Measured alternatives (additive numeric codes, 32 stimuli, 3 folds, ``n_null = 99``,
``validation/calib_interactions.py`` settings): permuting residual *ranks* of the RDM
(``g(q) + R[π, π]``, ``g`` the isotonic fit of the neural ranks on the diagonal model's
prediction) rejected 5 of 30 datasets at 0.05 and 9-11 of 30 at 0.1 (2 of 30 at 0.05 with
i.i.d. noise on the distances instead of the patterns); permuting the residual patterns
of the stimuli (plain Freedman & Lane) 15 of 120 at 0.05.  The rotated residuals make the
test exact under main effects plus i.i.d. Gaussian noise (measured rates: method page).

**Runs.**  With ``groups`` whose stimuli differ in the features (runs), the main effects
also hold one intercept per run.  Noise centred within each run (a run offset, per-run
z-scoring) is ``C ε`` with ``C`` the within-run centring; since the run indicators are
among the design's columns, ``Qᵀ C = Qᵀ``, so the rotated residuals are again i.i.d.
under Gaussian noise and the test stays exact.  Without them the rotation mixed runs and
rejected additive codes too often on a simulated block design with runs (0.089 at 0.05,
``validation/calib_runs.py``; method page).
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import torch
from joblib import effective_n_jobs

from .core.checks import check
from .core.constants import NUMERIC_DEGREE  # noqa: F401  (tuning constants, defined there once)
from .core.options import MLEMOptions, _is_int
from .core.rdms.sources import (
    DenseRDMSource,
    RankedRDMSource,
    SphereRDMSource,
    with_runtime,
)
from .core.runtime import Runtime
from .core.scoring import fastnull
from .core.scoring.nulls import exchange_units
from .core.stimuli.features import as_feature_table, feature_space
from .utils import check_random_state, logger

__all__ = ["interaction_test", "main_effects_design", "residual_basis"]


def main_effects_design(space, table):
    """Design matrix of the features' main effects (with an intercept).

    Categorical features contribute one indicator column per level but the first; numeric
    and ordinal ones their scaled value(s) and, per value column, the square and cube of
    the standardised value (a smooth main effect of any shape, up to
    :data:`NUMERIC_DEGREE`; fewer powers when the feature takes fewer distinct values).
    A feature with missing values gets a missing-indicator column (its other columns are 0
    there).

    Parameters
    ----------
    space : FeatureSpace
        Fitted feature encoding.
    table : DataFrame
        The stimuli's feature table.

    Returns
    -------
    X : ndarray (n_stimuli, n_columns)
    """
    enc = space.transform(table)
    cols = [np.ones((enc.n_stimuli, 1))]
    for k, sl in enumerate(enc.slices):
        block = enc.values[:, sl] * enc.column_scale()[sl]
        miss = enc.missing[:, k]
        if enc.indicator[k]:
            levels = np.unique(block[~miss, 0])
            block = (block[:, :1] == levels[None, 1:]).astype(float)
        else:
            block = np.concatenate([block, _powers(block, miss)], axis=1)
        block = np.where(miss[:, None], 0.0, block)
        cols.append(block)
        if miss.any():
            cols.append(miss[:, None].astype(float))
    return np.concatenate(cols, axis=1)


def _powers(block, miss):
    """Powers 2 to :data:`NUMERIC_DEGREE` of each standardised column of ``block``."""
    out = []
    for v in block.T:
        present = v[~miss]
        degree = min(NUMERIC_DEGREE, len(np.unique(present)) - 1)
        if degree < 2:
            continue
        z = (v - present.mean()) / present.std()
        out.extend(z ** p for p in range(2, degree + 1))
    return np.stack(out, axis=1) if out else np.zeros((len(block), 0))


def group_indicators(groups):
    """Indicator columns ``(n, n_groups - 1)`` of the groups but the first."""
    codes = np.unique(np.asarray(groups).astype(str), return_inverse=True)[1].ravel()
    return (codes[:, None] == np.arange(1, codes.max() + 1)[None]).astype(float)


def residual_basis(X):
    """Orthonormal basis ``Q`` ``(n, n − rank X)`` of the complement of ``X``'s columns.

    ``Q Qᵀ = I − H`` with ``H`` the projection onto the design; under i.i.d. Gaussian
    noise the rows of ``Qᵀ Y`` are i.i.d. (Huh & Jhun's rotation of the residuals).

    Parameters
    ----------
    X : ndarray (n, p)

    Returns
    -------
    Q : ndarray (n, n − rank X)
    """
    n = X.shape[0]
    vals, vecs = np.linalg.eigh(np.eye(n) - X @ np.linalg.pinv(X))
    return vecs[:, vals > 0.5]


class PatternNullSource:
    """RDM source of observed and residual-permuted datasets (see the module).

    Model ``k`` is replicate ``k // M`` of model ``k % M`` of ``base``: replicate ``0``
    is the observed data, replicate ``b`` the patterns ``Ŷ + Q (QᵀY)[π_b]``, with
    ``Ŷ = Y − Q QᵀY`` the main effects' fit and ``QᵀY`` the residuals' coordinates.

    Parameters
    ----------
    base : DenseRDMSource | SphereRDMSource
        The observed data.
    basis : ndarray (n_stimuli, n_resid)
        Orthonormal basis ``Q`` of the residual space (:func:`residual_basis`).
    perms : ndarray of int (n_rep, n_resid)
        Permutations of the residual coordinates; ``perms[0]`` is the identity.
    models, reps : ndarray of int | None
        Base model and replicate of each model of this source (default: all
        ``n_rep × M``, replicate-major).
    """

    def __init__(self, base, basis, perms, models=None, reps=None):
        self.base, self.basis, self.perms = base, basis, perms
        if models is None:
            M, n_rep = base.n_models, perms.shape[0]
            models = np.tile(np.arange(M), n_rep)
            reps = np.repeat(np.arange(n_rep), M)
        self.models, self.reps = np.asarray(models), np.asarray(reps)

    @property
    def n_models(self):
        return len(self.models)

    @property
    def n_stimuli(self):
        return self.base.n_stimuli

    def subset(self, models):
        """The source of ``models`` only (the base data of the models they use)."""
        rows, inv = np.unique(self.models[models], return_inverse=True)
        return PatternNullSource(self.base.subset(rows), self.basis, self.perms, inv,
                                 self.reps[models])

    def rdm(self, stimuli, device="cpu"):
        """Distances ``(n_models, n_pairs)`` between ``stimuli`` (see
        :class:`~mlem_neuro.core.rdms.sources.RDMSource`).

        The residual coordinates ``Z = QᵀY`` and the main effects' fit ``Y − Q Z`` of the
        base models are computed once and shared by every replicate present; replicate
        ``b``'s patterns are then one product, ``Y − Q Z + Q[:, π_b⁻¹] Z``
        (``Q (Z[π]) = Q[:, π⁻¹] Z``).
        """
        from .core.stimuli.pairs import n_pairs

        out = torch.empty(self.n_models, n_pairs(len(stimuli)), dtype=torch.float64,
                          device=device)
        rows, inv = np.unique(self.models, return_inverse=True)
        base = self.base.subset(rows)
        Y = np.asarray(_patterns(base), dtype=np.float64)
        Z = self.basis.T @ Y                                 # (..., n_resid, units)
        fitted = Y - self.basis @ Z
        for b in np.unique(self.reps):
            sel = np.flatnonzero(self.reps == b)
            if b == 0:
                sub = base.subset(inv[sel])
            else:
                Qb = self.basis[:, np.argsort(self.perms[b])]
                sub = _replicate(base, fitted, Qb, Z, inv[sel])
            out[torch.as_tensor(sel, device=device)] = sub.rdm(stimuli, device)
        return out


def _scores_by_blocks(null_source, table, options, common, constraints, groups,
                      runtime=None):
    """Fold-mean held-out Spearman ``(len(constraints), n_models)`` of the models of
    ``null_source`` fitted with each constraint by :func:`~mlem_neuro.crossval.run_cv`,
    and what trained them (:attr:`~mlem_neuro.crossval.CVOutput.training`).

    The models go in blocks (an eighth of the memory budget for their RDMs of all
    stimuli and one sort of each): each block's datasets are built, their RDMs of all
    stimuli computed and sorted, once; every fold of both fits then reads the ranks of its
    training and held-out distances off them (:class:`~mlem_neuro.core.rdms.sources.
    RankedRDMSource`; the numbers of ``run_cv`` on ``null_source`` up to rounding).
    ``runtime``: the test's :class:`~mlem_neuro.core.runtime.Runtime` (its memory budget
    sizes the blocks), given to every ``run_cv`` (``None``: resolved here, once)."""
    from .core.stimuli.pairs import n_pairs
    from .crossval import run_cv

    if runtime is None:
        runtime = Runtime.resolve(effective_n_jobs(options.n_jobs), options.device)
    n, N = null_source.n_stimuli, null_source.n_models
    block = max(1, runtime.memory_bytes // 8 // (64 * n_pairs(n)))   # RDM, sort, ties
    scores = np.empty((len(constraints), N))
    training = set()
    for lo in range(0, N, block):
        models = np.arange(lo, min(lo + block, N))
        rdms = RankedRDMSource(null_source.subset(models).rdm(np.arange(n)).numpy(),
                               compiled=runtime.compiled)
        for c, constraint in enumerate(constraints):
            opts = dataclasses.replace(options, constraint=constraint,
                                       interactions=constraint != "diagonal", **common)
            out = run_cv(rdms, table, opts, groups=groups, desc="interaction-test models",
                         runtime=runtime)
            scores[c, models] = out.score.mean(axis=0)
            training |= out.training
    return scores, training


def _patterns(source):
    return source.Y if isinstance(source, DenseRDMSource) else source.X


def _replicate(base, fitted, Qb, Z, models):
    """The source of ``models`` of ``base`` with patterns ``fitted + Qb Z``."""
    if isinstance(base, DenseRDMSource):
        return DenseRDMSource(fitted[models] + Qb @ Z[models], base.distance,
                              compiled=base.compiled)
    return SphereRDMSource(fitted + Qb @ Z, base.A, base.distance).subset(models)


def _check_inputs(source, table, options, n_null):
    if not getattr(source, "supports_interaction_test", False):
        raise TypeError("interaction_test permutes the residuals of the response patterns, "
                        "so it needs a source that holds them: a DenseRDMSource or a "
                        f"SphereRDMSource (mlem_neuro.core.rdms.sources); got "
                        f"{type(source).__name__}.")
    if not isinstance(options, MLEMOptions):
        raise TypeError("options must be an MLEMOptions (mlem_neuro.core.options); got "
                        f"{type(options).__name__}.")
    n_null = check("n_null", n_null, low=1, hint=" (null permutations; 99 or more for a "
                                                 "test at 0.05 with some power)")
    if len(table) != source.n_stimuli:
        raise ValueError(f"the feature table has {len(table)} rows but the data have "
                         f"{source.n_stimuli} stimuli; they must match one-to-one.")
    if options.constraint == "diagonal":
        raise ValueError("interaction_test compares a model with interactions against the "
                         "diagonal (additive) one; options has constraint='diagonal'. Use "
                         "constraint='spd' (or 'none').")
    space = feature_space(options).fit(table)
    if len(space.feature_names_) < 2:
        raise ValueError("interaction_test needs at least 2 features (an interaction is "
                         f"between features); got {space.feature_names_}.")
    return space


def interaction_test(source, features, options, *, groups=None, n_null, random_state=None,
                     progress=None, folds=None, return_training=False, runtime=None):
    """Permutation test of non-additivity: do the features interact in the geometry?

    The statistic of each model is the fold-mean held-out Spearman of the model with
    interactions (``options.constraint``, ``"spd"`` or ``"none"``) minus that of the
    diagonal model (FR-RSA), over the folds of ``options.cv`` (``cv=None``: in-sample
    fits on all stimuli).  The null keeps the main effects: every unit's response is
    regressed on the features' main effects and the residuals, rotated into an
    orthonormal basis of the residual space, are permuted (Huh & Jhun's variant of
    Freedman & Lane's scheme; exact under main effects plus i.i.d. Gaussian noise; see
    :mod:`mlem_neuro.interaction`).  Each null dataset goes through the same
    cross-validated comparison; the null datasets of all models are fitted in the same
    stacks as the observed ones.

    Parameters
    ----------
    source : DenseRDMSource | SphereRDMSource
        Response patterns of ``M`` models (:mod:`mlem_neuro.core.rdms.sources`).
    features : DataFrame
        Feature table, one row per stimulus of ``source`` (at least 2 features).
    options : MLEMOptions
        Training and analysis options; ``cv`` defines the folds (the same folds as
        :func:`~mlem_neuro.crossval.run_cv` with the same options when
        ``options.random_state`` is an int), ``constraint`` the model with interactions.
        ``level`` and ``n_permutations`` are not used.
    groups : array-like | None
        One label per stimulus: folds never split a group.  Groups whose stimuli differ
        in their features (runs) also enter the null's main effects, one intercept each
        (see the module notes).
    n_null : int
        Number of null datasets (random permutations of the residuals).
    random_state : None | int | numpy Generator
        Seeds the permutations (and the training, when ``options.random_state`` is not an
        int).
    progress : bool | None
        Whether to show a progress bar over the blocks of models of categorical designs
        (``None``: at the INFO log level).
    folds : list of (train, test) | None
        The folds of both fits, e.g. those of an analysis
        (:attr:`~mlem_neuro.crossval.CVOutput.folds`); ``None`` draws them from
        ``options`` (``cv``, ``n_repeats``, ``random_state``, ``groups``), as
        :func:`~mlem_neuro.crossval.run_cv` does.  Ignored with ``options.cv=None``.
    return_training : bool
        Also return what trained the fits (an analysis records it in its provenance).
    runtime : Runtime | None
        The threads, memory budget and compiled loop of every fit of the test
        (:class:`~mlem_neuro.core.runtime.Runtime`); ``None`` resolves it once, at the
        start of the fits, for ``options.n_jobs`` workers.

    Returns
    -------
    observed : ndarray (M,)
        Statistic of each model (larger: more evidence of non-additivity).
    null : ndarray (n_null, M)
        Statistic of each null dataset; row ``b`` uses the same permutation for every
        model.  The p-value of model ``m`` is
        ``(1 + (null[:, m] >= observed[m]).sum()) / (1 + n_null)``.
    training : set of (str, float, int)
        With ``return_training``: the ``(backend, lr, patience)`` of every fit
        (:meth:`~mlem_neuro.core.training.stackfit.StackFit.trained_with`).

    Notes
    -----
    Cost: two cross-validated fits (with and without interactions) of ``M × (n_null + 1)``
    models, i.e. about ``2 (n_null + 1)`` times the training of one
    :func:`~mlem_neuro.crossval.run_cv` of the same data, less the per-call overhead that
    the stacks share.
    """
    from .crossval import check_cv, fold_usable

    table = as_feature_table(features, name="features")
    space = _check_inputs(source, table, options, n_null)
    n, M = source.n_stimuli, source.n_models
    rng = check_random_state(random_state)
    if folds is None or options.cv is None:
        folds = check_cv(options.cv, n, check_random_state(options.random_state), groups,
                         options.n_repeats, fold_usable(options, table), M)
    else:
        folds = [(np.asarray(tr), np.asarray(te)) for tr, te in folds]
    seed = (options.random_state if _is_int(options.random_state)
            else int(rng.integers(2**31 - 1)))
    X = main_effects_design(space, table)
    if groups is not None and exchange_units(space.transform(table), groups) == "within":
        # runs: one intercept per run among the main effects, so that what runs share
        # (an offset; per-run centring, which makes a run's noise sum to zero) leaves the
        # rotated residuals (see the module notes)
        X = np.concatenate([X, group_indicators(groups)], axis=1)
    basis = residual_basis(X)
    r = basis.shape[1]
    if r < 4:
        what = ("no null dataset differs from the data and every p-value of the test is 1"
                if r < 2 else f"only {math.factorial(r)} distinct null datasets exist (one "
                "of them the data), so its p-values cannot reach 0.05")
        warnings.warn(
            f"the test of interactions has {r} residual degree(s) of freedom: {n} stimuli "
            f"and a main-effects design of rank {n - r} (intercept, levels of categorical "
            f"features, cubic polynomials of numeric ones), so {what}. It needs at least 4 "
            "more stimuli than that rank.", UserWarning, stacklevel=3)
    perms = np.stack([np.arange(basis.shape[1])]
                     + [rng.permutation(basis.shape[1]) for _ in range(n_null)])
    logger.info("interaction test: %d model(s) x %d null permutations", M, n_null)
    # one runtime for every fit of the test (threads, memory, compiled kernels)
    if runtime is None:
        runtime = Runtime.resolve(effective_n_jobs(options.n_jobs), options.device)
    source = with_runtime(source, runtime)    # its null datasets' distances on its kernels
    null_source = PatternNullSource(source, basis, perms)
    # the same folds for both fits (cv=None: both in-sample, on all stimuli)
    common = dict(cv=None if options.cv is None else folds, n_repeats=1, random_state=seed,
                  level="feature", n_permutations=1, n_null=0)
    constraints = (options.constraint, "diagonal")
    # categorical designs on full batches: each null dataset's RDM, ranks and row sums
    # once for both fits (the numbers of run_cv up to rounding)
    fitted = fastnull.interaction_scores(null_source, table, options, folds, constraints,
                                         progress=progress, runtime=runtime)
    if fitted is None:
        fitted = _scores_by_blocks(null_source, table, options, common, constraints, groups,
                                   runtime)
    scores, training = fitted
    scores = np.asarray(scores).reshape(2, n_null + 1, M)
    stat = scores[0] - scores[1]
    if return_training:
        return stat[0], np.ascontiguousarray(stat[1:]), training
    return stat[0], np.ascontiguousarray(stat[1:])
