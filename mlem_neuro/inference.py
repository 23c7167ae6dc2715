"""Inference above the fold loop: an analysis is :func:`~mlem_neuro.crossval.run_cv`
(folds, fits, held-out scores and importances, the null statistics of each fold) plus the
tests that need more than one fold loop, today the test of interactions
(:func:`~mlem_neuro.interaction.interaction_test`, which runs fold loops of its own).

The test of interactions also stages the features' tests (``feature_test="staged"``, the
default): :func:`~mlem_neuro.crossval.run_cv` leaves each feature's main effect as its
test, and here the held-out importance joins it in the models where the test of
interactions has a family-wise p-value (over the models of the analysis) at most
:data:`~mlem_neuro.core.constants.STAGED_GATE`
(:func:`~mlem_neuro.core.scoring.main_effect.staged`).

Keeping it here, above :mod:`mlem_neuro.crossval`, keeps the fold loop free of the tests
built on it (no import circle between them).  A source says whether it can take the test
(``supports_interaction_test``: it holds the response patterns whose residuals the test
permutes) instead of being asked its type.
"""
from __future__ import annotations

import logging
import warnings

import numpy as np
from joblib import effective_n_jobs

from .core.constants import STAGED_GATE
from .core.runtime import Runtime
from .core.scoring.main_effect import staged
from .core.scoring.nulls import permutation_pvalues
from .crossval import run_cv
from .utils import logger, use_log_level


def run_analysis(source, features, options=None, *, groups=None, desc="models"):
    """:func:`~mlem_neuro.crossval.run_cv`, and with tests (``n_null``) of a model with
    interactions, the test of interactions added to the output's ``tests``.

    With the staged feature test (the default) the test of interactions runs between the
    fold loop's score and main effects and the features' null models, which are then
    fitted only in the models where it opens the gate (run_cv's ``stage``): elsewhere the
    features' tests read their main effects alone, which need no training.

    Parameters and returns as :func:`~mlem_neuro.crossval.run_cv`.  One
    :class:`~mlem_neuro.core.runtime.Runtime` is resolved here, for the fold loop and the
    test of interactions.
    """
    from .core.options import MLEMOptions

    opts = MLEMOptions() if options is None else options
    runtime = Runtime.resolve(effective_n_jobs(opts.n_jobs), opts.device)
    can_test = getattr(source, "supports_interaction_test", False)
    gates = []

    def stage(out):
        gates.append(_interactions(out, source, features, opts, groups, desc, runtime))
        return gates[0]

    out = run_cv(source, features, options, groups=groups, desc=desc,
                 stage=stage if can_test and opts.feature_test == "staged" else None,
                 runtime=runtime)
    if gates:                                  # staged inside the fold loop
        return _stage_feature_tests(out, gate=gates[0])
    if out.interaction_seed is None:
        # no interactions to find (one feature, an additive model) or no tests
        return _stage_feature_tests(out, gate=False)
    if not can_test:
        logger.warning("no test of interactions: it permutes residual response patterns, "
                       "which a %s does not hold", type(source).__name__)
        if out.feature_test == "staged" and out.parts:
            logger.info("MLEM: the features' tests combine the held-out importance and "
                        "the main effect in every %s (no test of interactions to stage "
                        "them)", desc)
        return _stage_feature_tests(out, gate=True)
    return _stage_feature_tests(out, gate=_interactions(out, source, features, opts,
                                                        groups, desc, runtime))


def _interactions(out, source, features, opts, groups, desc, runtime=None):
    """Run the test of interactions on ``out`` (its seed, its scores) on the analysis's
    ``runtime``, add it to ``out.tests``; return the staged test's gate per model: its
    family-wise p-value over the models at most STAGED_GATE (so that, without
    interactions, it opens in at most that fraction of analyses however many models they
    have)."""
    M = source.n_models
    # its own progress is silenced (it repeats the analysis's): say what runs
    logger.info("MLEM: test of interactions, %d %s x %d null dataset(s) x 2 fits", M, desc,
                opts.n_null)
    obs, nul, trained = _interaction_test(source, features, opts, groups,
                                          out.interaction_seed, out.folds[:out.n_test_folds],
                                          runtime)
    out.training |= trained                  # the analysis records its fits too
    undefined = np.isnan(out.score).any(axis=0)
    obs, nul = np.where(undefined, np.nan, obs), np.where(undefined, np.nan, nul)
    out.tests["interactions"] = (obs, nul)
    _, _, p_fwe = permutation_pvalues({"interactions": (obs, nul)})
    with np.errstate(invalid="ignore"):
        gate = p_fwe[:, 0] <= STAGED_GATE                      # NaN (undefined): shut
    if out.feature_test == "staged" and gate.any():
        logger.info("MLEM: interactions found (family-wise p <= %g over the %d %s) in %d "
                    "of them: there the features' tests add the held-out importance to "
                    "the main effect, and rest on these interactions (a chance finding "
                    "of the test of interactions would carry into them there; method "
                    "page, 'Where the gate opens')", STAGED_GATE, M, desc, int(gate.sum()))
    return gate


def _stage_feature_tests(out, gate):
    """With ``feature_test="staged"``, each feature's test statistic from its two parts
    (:func:`~mlem_neuro.core.scoring.main_effect.staged`): the main effect alone where
    ``gate`` (a bool, or one per model) is shut, joined by the held-out importance where
    it is open; :attr:`~mlem_neuro.crossval.CVOutput.gate_open` records it."""
    if out.feature_test != "staged" or not out.parts:
        return out
    any_part = next(iter(out.parts.values()))["main_effect"][0]
    gate = np.broadcast_to(np.asarray(gate, bool), np.shape(any_part)).copy()
    out.gate_open = gate
    if not gate.any():
        # the main effect alone in every model: out.tests keeps it on every relabelling
        # drawn for it (MAIN_EFFECT_NULLS; the staged statistic's p-values, finer)
        return out
    for name, parts in out.parts.items():
        out.tests[name] = staged(parts["importance"], parts["main_effect"], gate)
    return out


def _interaction_test(source, table, opts, groups, seed, folds, runtime=None):
    """Observed and null statistics of the non-additivity test on ``folds`` (those of the
    analysis that its tests read; its warnings and messages repeat those of the analysis,
    so they are silenced; its own progress bar, over blocks of models, shows at INFO),
    and what trained its fits; ``runtime``: the analysis's (``None``: resolved there)."""
    from .interaction import interaction_test

    progress = logger.isEnabledFor(logging.INFO)
    with warnings.catch_warnings(), use_log_level("WARNING"):
        warnings.simplefilter("ignore", UserWarning)
        return interaction_test(source, table, opts, groups=groups, n_null=opts.n_null,
                                random_state=seed, progress=progress, folds=folds,
                                return_training=True, runtime=runtime)
