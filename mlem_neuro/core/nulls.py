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
  stratum, as for the score.
"""
from __future__ import annotations

import numpy as np

from .pairs import pair_indices

#: quantile bins of a numeric feature when it defines the strata of another feature's null.
NULL_BINS = 5


def _feature_codes(enc, k, kind, n_bins):
    """Integer code ``(n,)`` of each stimulus's value of feature ``k`` (binned if numeric)."""
    block = np.column_stack([enc.values[:, enc.slices[k]], enc.missing[:, k]])
    rows, codes = np.unique(block, axis=0, return_inverse=True)
    if kind != "numeric" or len(rows) <= n_bins:
        return codes.ravel()
    cols = []
    for col in enc.values[:, enc.slices[k]].T:
        edges = np.quantile(col, np.linspace(0, 1, n_bins + 1)[1:-1])
        cols.append(np.searchsorted(edges, col, side="right"))
    cols.append(enc.missing[:, k])
    return np.unique(np.column_stack(cols), axis=0, return_inverse=True)[1].ravel()


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


def null_permutations(enc, kinds, n_null, rng, n_bins=NULL_BINS):
    """Relabellings ``(1 + m, n_null, n)`` of the stimuli: first the score's null (all
    stimuli), then each feature's conditional null (see the module notes)."""
    groups = [None] + list(range(enc.n_features))
    return np.stack([permute_within(strata(enc, kinds, f, n_bins), n_null, rng)
                     for f in groups])


def permuted_pairs(perms, stimuli, n):
    """Linear pair indices ``(R, n_pairs(len(stimuli)))`` into the RDM of all ``n`` stimuli
    of the pairs of ``stimuli`` relabelled by each of ``perms (R, n)``.

    Column ``c`` is the pair ``(stimuli[i[c]], stimuli[j[c]])`` of
    :func:`~mlem_neuro.core.pairs.pair_indices`; under relabelling ``π`` it reads the
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
    tol : float
        A null statistic within ``tol`` of the observed one counts as reaching it (so that
        rounding does not make p-values anti-conservative).

    Returns
    -------
    names : list of str
    pvalues : ndarray (M, n_tests)
        ``(1 + #{null >= observed}) / (1 + n_null)`` per model.
    pvalues_fwe : ndarray (M, n_tests)
        The same against the maximum over models of each null replicate: family-wise
        error control over models, per test.
    """
    names = list(tests)
    obs = np.stack([np.asarray(tests[t][0], dtype=float) for t in names], axis=1)
    null = np.stack([np.asarray(tests[t][1], dtype=float) for t in names], axis=2)
    n_null = null.shape[0]
    thr = obs[None] - tol
    p = (1.0 + (null >= thr).sum(axis=0)) / (1.0 + n_null)
    peak = np.nanmax(null, axis=1)                       # (n_null, n_tests)
    p_fwe = (1.0 + (peak[:, None, :] >= thr).sum(axis=0)) / (1.0 + n_null)
    bad = np.isnan(obs)
    p[bad] = p_fwe[bad] = np.nan
    return names, p, p_fwe
