"""Single-subject permutation tests: null relabellings of the stimuli and their p-values.

A null dataset relabels the stimuli: stimulus ``a`` takes the neural data of stimulus
``π(a)``, so its RDM is the observed RDM with rows and columns permuted, ``D0[a, b] =
D[π(a), π(b)]``.  The relabellings are drawn once per analysis and applied before
cross-validation (the folds are those of the observed data); the same relabelling serves
every model (time point, sphere), so the maximum of a statistic over models under each
relabelling gives family-wise error control (:func:`permutation_pvalues`).

Each test has its own relabellings:

* ``"score"`` (held-out Spearman ρ): every stimulus relabelled (null: the neural data are
  unrelated to all features);
* one test per feature ``f`` (its held-out importance): the stimuli are relabelled only
  *within strata of equal values of all the other features* (a conditional permutation:
  the null is "the neural data depend on the other features only").  Categorical and
  ordinal features give their levels; numeric features are cut into :data:`NULL_BINS`
  quantile bins (a numeric feature rarely repeats a value).  A stimulus alone in its
  stratum keeps its own data (conservative).  With one feature, every stimulus is one
  stratum, as for the score.  With ``null="marginal"`` a feature's null relabels the
  stimuli ignoring the other features (as the score's does): the null is "the neural data
  do not depend on this feature", which another feature correlated with it can violate.

**Exchangeability.**  A relabelling is a valid null only among stimuli that are
exchangeable under it.  With ``groups`` (:func:`exchange_units`):

* groups whose stimuli vary in the features (runs, sessions, blocks: ``"within"``) confine
  every null to stimuli of the same group, so that whatever the groups do to the data
  (per-run z-scoring, run offsets, drifts) is kept by every null dataset;
* groups whose stimuli all share one feature row (the trials of one item: ``"whole"``)
  move whole: a null exchanges groups of the same size (their stimuli in order), within
  the strata above taken at the group level.

A test whose null cannot move what it tests (a feature constant within every stratum:
nested in the other features, or constant within every group) is *not testable*:
:func:`null_design` names it and why, and its p-values are NaN, never 1.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..constants import NULL_BINS  # noqa: F401  (tuning constants, defined there once)
from ..stimuli.codes import exchange_units  # noqa: F401  (exported here too)
from ..stimuli.codes import factorize as _factorize
from ..stimuli.codes import feature_codes as _feature_codes
from ..stimuli.codes import row_codes as _row_codes
from ..stimuli.pairs import pair_indices


def strata(enc, kinds, feature, n_bins=NULL_BINS):
    """Stratum ``(n,)`` of each stimulus for the null of ``feature`` (an index): equal
    values (bins, for numeric features) of every other feature; ``None``: all stimuli."""
    n = enc.n_stimuli
    others = [k for k in range(enc.n_features) if k != feature]
    if feature is None or not others:
        return np.zeros(n, dtype=np.int64)
    codes = np.column_stack([_feature_codes(enc, k, kinds[enc.names[k]], n_bins)
                             for k in others])
    return np.unique(codes, axis=0, return_inverse=True)[1].ravel()


@dataclass(frozen=True)
class NullDesign:
    """How the nulls of one analysis relabel the stimuli (see the module notes).

    Attributes
    ----------
    strata : list of ndarray (n_units,)
        Per test (the score, then each feature), the stratum of each unit: units are
        relabelled only within their stratum.
    units : ndarray (n,) | None
        The unit of each stimulus when groups are exchanged whole (``None``: every stimulus
        is its own unit).
    untestable : dict
        ``test name -> reason`` of the tests whose null cannot move what they test.
    mode : str | None
        :func:`exchange_units`.
    """

    strata: list
    units: object
    untestable: dict
    mode: object


def null_design(enc, kinds, groups=None, null="conditional", n_bins=NULL_BINS):
    """The :class:`NullDesign` of the tests of ``enc`` (the score's null, then one per
    feature: conditional on the other features, or ``null="marginal"``), restricted by
    ``groups`` (one label per stimulus, or ``None``)."""
    n, m = enc.n_stimuli, enc.n_features
    mode = exchange_units(enc, groups)
    g = None if groups is None else _factorize(np.asarray(groups))
    units = None
    if mode == "whole":
        units = g
        first = np.unique(g, return_index=True)[1]          # a stimulus of each unit
        size = np.bincount(g)
        enc_units = replace(enc, values=enc.values[first], missing=enc.missing[first])
        block = size
    else:
        enc_units, block = enc, (np.zeros(n, dtype=np.int64) if g is None else g)
    rows = _row_codes(enc_units)
    out, untestable = [], {}
    for t, feature in enumerate([None] + list(range(m))):
        conditional = null == "conditional" and feature is not None
        s = _factorize(block, strata(enc_units, kinds, feature if conditional else None,
                                     n_bins))
        out.append(s)
        name = "score" if feature is None else enc.names[feature]
        moved = (rows if feature is None
                 else _feature_codes(enc_units, feature, kinds[name], np.inf))
        if _moves(s, moved):
            continue
        untestable[name] = _why_untestable(enc_units, kinds, feature, block, moved,
                                           mode, n_bins)
    return NullDesign(out, units, untestable, mode)


def _moves(stratum, codes):
    """Whether some stratum holds two units with different ``codes``."""
    pairs = np.unique(np.column_stack([stratum, codes]), axis=0)
    return len(pairs) > len(np.unique(stratum))


def _why_untestable(enc, kinds, feature, block, codes, mode, n_bins):
    if feature is None:
        where = "every group" if mode is not None else "the design"
        return (f"every stimulus of {where} has the same features: no relabelling changes "
                "them")
    name = enc.names[feature]
    if mode is not None and not _moves(block, codes):
        what = "group" if mode == "within" else "unit of the same size"
        return (f"{name!r} is constant within every {what} of `groups`: a null that "
                "relabels within groups cannot change it")
    others = [enc.names[k] for k in range(enc.n_features) if k != feature]
    return (f"{name!r} is determined by the other features {others} (nested): relabelling "
            "within their values cannot change it. Ask the marginal question with "
            "null='marginal', or drop one feature")


def permute_within(labels, n_perm, rng):
    """``n_perm`` permutations ``(n_perm, n)`` that map each stimulus into its stratum."""
    labels = np.asarray(labels)
    n = len(labels)
    home = np.argsort(labels, kind="stable")
    out = np.empty((n_perm, n), dtype=np.int64)
    for r in range(n_perm):
        shuffled = np.lexsort((rng.random(n), labels))
        out[r, home] = shuffled
    return out


def _expand_units(unit_perms, units):
    """Stimulus permutations ``(R, n)`` from permutations ``(R, n_units)`` of whole units:
    the ``k``-th stimulus of unit ``u`` takes the data of the ``k``-th of unit ``π(u)``
    (units exchanged have the same size)."""
    order = np.argsort(units, kind="stable")
    start = np.r_[0, np.cumsum(np.bincount(units))[:-1]]
    rank = np.empty(len(units), dtype=np.int64)
    rank[order] = np.arange(len(units)) - start[units[order]]
    return order[start[unit_perms[:, units]] + rank]


def null_permutations(enc, kinds, n_null, rng, n_bins=NULL_BINS, groups=None,
                      null="conditional", design=None):
    """Relabellings ``(1 + m, n_null, n)`` of the stimuli: first the score's null (all
    stimuli), then each feature's null (see the module notes), within ``groups``."""
    if design is None:
        design = null_design(enc, kinds, groups, null, n_bins)
    perms = [permute_within(s, n_null, rng) for s in design.strata]
    if design.units is not None:
        perms = [_expand_units(p, design.units) for p in perms]
    return np.stack(perms)


def permuted_pairs(perms, stimuli, n):
    """Linear pair indices ``(R, n_pairs(len(stimuli)))`` into the RDM of all ``n`` stimuli
    of the pairs of ``stimuli`` relabelled by each of ``perms (R, n)``.

    Column ``c`` is the pair ``(stimuli[i[c]], stimuli[j[c]])`` of
    :func:`~mlem_neuro.core.stimuli.pairs.pair_indices`; under relabelling ``π`` it reads the
    observed distance between ``π(stimuli[i])`` and ``π(stimuli[j])``.
    """
    stimuli = np.asarray(stimuli)
    i, j = pair_indices(len(stimuli))
    # the linear index of every ordered pair of the n stimuli, looked up (one gather)
    lo, hi = np.minimum.outer(np.arange(n), np.arange(n)), np.maximum.outer(np.arange(n),
                                                                              np.arange(n))
    table = (lo * n - lo * (lo + 1) // 2 + (hi - lo - 1)).ravel()
    perms = np.asarray(perms, dtype=np.int64)
    return table[perms[:, stimuli[i]] * n + perms[:, stimuli[j]]]


def permutation_pvalues(tests, tol=1e-12):
    """p-values of named tests from their observed and null statistics.

    Parameters
    ----------
    tests : dict
        ``name -> (observed (M,), null (n_null, M))``: larger is more significant; the
        same null replicate ``r`` of every model must come from the same relabelling.
        Tests may have different numbers of null datasets (a feature's main effect alone
        reads more relabellings than the trained tests: ``MAIN_EFFECT_NULLS``).
    tol : float
        A null statistic within ``tol`` of the observed one counts as reaching it (so that
        rounding does not make p-values anti-conservative).

    Returns
    -------
    names : list of str
    pvalues : ndarray (M, n_tests)
        ``(1 + #{null >= observed}) / (1 + n_null)`` per model (``n_null`` the test's).
    pvalues_fwe : ndarray (M, n_tests)
        The same against the maximum over models of each null replicate: family-wise
        error control over models, per test.
    """
    names = list(tests)
    obs = np.stack([np.asarray(tests[t][0], dtype=float) for t in names], axis=1)
    p, p_fwe = np.empty_like(obs), np.empty_like(obs)
    for k, t in enumerate(names):                 # each test with its own null datasets
        null = np.asarray(tests[t][1], dtype=float)
        thr = obs[None, :, k] - tol
        p[:, k] = (1.0 + (null >= thr).sum(axis=0)) / (1.0 + null.shape[0])
        peak = np.nanmax(null, axis=1)
        p_fwe[:, k] = (1.0 + (peak[:, None] >= thr).sum(axis=0)) / (1.0 + null.shape[0])
    bad = np.isnan(obs)
    p[bad] = p_fwe[bad] = np.nan
    return names, p, p_fwe
