"""Plain RSA baselines: Mantel and partial Mantel tests of feature model RDMs.

What a user would run instead of MLEM (rsatoolbox / mne-rsa style): the Spearman
correlation between the neural RDM (Euclidean distances between patterns) and one
feature's model RDM (0/1 for a categorical feature, ``|difference|`` for a numeric one),
tested by permuting the stimuli; the partial test first removes the other features' model
RDMs (ranks, least squares) from both.  The benchmarks and the demo compare MLEM's tests
with these on the same data.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from scipy.spatial.distance import pdist, squareform

from .core.checks import check
from .core.constants import MANTEL_RESIDUAL_RTOL, MANTEL_TIE_TOL
from .core.memory import check_memory
from .core.stimuli.features import as_feature_table
from .utils import check_random_state, check_real, normalise_magnitude, renamed, warn_user

__all__ = ["mantel_tests", "model_rdm"]


def model_rdm(column):
    """Condensed model RDM of one feature column.

    Parameters
    ----------
    column : Series | array (n_stimuli,)
        The feature's value of each stimulus.

    Returns
    -------
    ndarray (n_stimuli * (n_stimuli - 1) / 2,)
        0/1 (differ or not) for a categorical feature, ``|difference|`` for a numeric
        one, in :func:`scipy.spatial.distance.pdist` order.  A pair with a missing value
        (NaN / None / pd.NA) on either side is at distance 0, as in MLEM (the default
        ``missing_distance`` of :class:`~mlem_neuro.core.stimuli.features.FeatureSpace`).
    """
    column = pd.Series(column)
    missing = column.isna().to_numpy()
    if column.dtype.kind in "fiu":
        values = column.to_numpy(dtype=float, na_value=np.nan)
        if np.isinf(values).any():
            raise ValueError(f"feature {column.name!r} holds infinite values; a numeric "
                             "feature needs finite values (NaN for a missing one).")
        d = pdist(np.where(missing, 0.0, values)[:, None], "cityblock")
    else:
        d = pdist(pd.factorize(column)[0][:, None], "hamming")
    if missing.any():
        i, j = np.triu_indices(len(column), 1)
        d[missing[i] | missing[j]] = 0.0
    return d


def _check_data(X, table):
    """``X`` as a finite float (n_stimuli, n_units) array and ``table`` as a feature table
    with one row per stimulus (the estimator's rules for ``X`` and ``y``)."""
    if isinstance(X, (pd.DataFrame, pd.Series)):
        X = X.to_numpy()
    check_real(X, "X")
    try:
        X = np.asarray(X, dtype=float)
    except (TypeError, ValueError):
        raise TypeError("X must be a numeric array (n_stimuli, n_units); got "
                        f"{type(X).__name__}") from None
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_stimuli, n_units); got shape {X.shape}. For a "
                         "single unit pass X[:, None].")
    n = X.shape[0]
    if n < 3:
        raise ValueError(f"mantel_tests needs at least 3 stimuli (with fewer than 3 pairs "
                         f"a rank correlation is undefined); got {n}.")
    if not np.isfinite(X).all():
        bad = int((~np.isfinite(X)).sum())
        raise ValueError(f"X holds {bad} NaN or infinite values; the neural RDM needs "
                         "finite patterns (drop or impute them first).")
    table = as_feature_table(table, name="table")
    if len(table) != n:
        raise ValueError(f"X has {n} stimuli (rows) but table has {len(table)} rows; they "
                         "must match one-to-one.")
    return normalise_magnitude(X, "X"), table


def _basis(A):
    """Orthonormal basis (columns) of the span of ``A``'s columns, from its SVD: the
    left singular vectors of the singular values above ``MANTEL_RESIDUAL_RTOL`` times the
    largest (so that nested or identical columns add no spurious direction), and the
    coordinates of ``A``'s columns in it."""
    if A.shape[1] == 0:
        return A[:, :0], np.zeros((0, 0))
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    r = int((s > MANTEL_RESIDUAL_RTOL * s[0]).sum())
    return U[:, :r], s[:r, None] * Vt[:r]


@renamed(n_permutations="n_null")
def mantel_tests(X, table, n_null=999, random_state=None, *, n_permutations=None):
    """Mantel and partial Mantel p-values of every feature of ``table``.

    Parameters
    ----------
    X : array (n_stimuli, n_units)
        Patterns; the neural RDM is their Euclidean distances.  Finite, at least 3
        stimuli.
    table : DataFrame
        One column per feature, one row per stimulus (a pair with a missing value of a
        feature is at distance 0 in its model RDM: :func:`model_rdm`).
    n_null : int
        Null permutations of the stimuli (the same ones for every feature), named as
        the analyses' null counts.
    random_state : None | int | numpy Generator
        Seeds the permutations.
    n_permutations : int | None
        Former name of ``n_null`` (deprecated; a FutureWarning; both names: a
        TypeError).  In the analyses ``n_permutations`` counts the shuffles of the
        permutation *importance*.

    Returns
    -------
    DataFrame
        One row per feature: ``rho`` (Spearman of the neural and model RDMs), ``p``
        (Mantel, one-sided: greater) and ``p_partial`` (partial Mantel, the other
        features' model RDMs removed; equal to ``p`` with one feature).

    Notes
    -----
    An undefined correlation gives NaN (with a warning), not a p-value: ``rho``, ``p``
    and ``p_partial`` of every feature when the neural RDM is constant (e.g. identical
    patterns), of a feature whose model RDM is constant (one level, or missing for
    every stimulus); ``p_partial`` of a feature that the other features' model RDMs
    determine (identical or nested features), or when they determine the neural RDM's
    ranks.

    The permuted neural RDMs are never held together: each permutation's ranks are
    projected, one at a time, onto the span of the model RDMs, so memory grows with the
    pairs and the features (checked against the budget, :mod:`mlem_neuro.core.memory`),
    not with ``n_null``.  The p-values are those of the direct computation (Spearman of
    each permuted RDM with each model RDM, and of their residuals).
    """
    n_null = check("n_null", n_null, low=1)
    X, table = _check_data(X, table)
    rng = check_random_state(random_state)
    n, n_features = X.shape[0], table.shape[1]
    n_pairs = n * (n - 1) // 2
    index = np.int32 if n * n < 2**31 else np.intp
    # ranks, centred ranks, their square form, the pair indices, one permuted RDM, the
    # model ranks and their basis: what the test holds at once
    check_memory(8 * n * n + n_pairs * (3 * np.dtype(index).itemsize + 8 * (4 + 4 * n_features)),
                 f"the Mantel tests of {n:,} stimuli and {n_features} features",
                 "test fewer stimuli (e.g. condition averages) or features")

    ranks = stats.rankdata(pdist(X))
    centred = ranks - ranks.mean()
    norm2 = float(centred @ centred)
    models, names, constant = np.empty((n_pairs, n_features)), [], []
    for name in table.columns:
        m = stats.rankdata(model_rdm(table[name]))
        if m.max() == m.min():
            constant.append(name)
            continue
        m -= m.mean()
        models[:, len(names)] = m / np.linalg.norm(m)
        names.append(name)
    if ranks.max() == ranks.min():
        _warn_undefined(True, [], [], [])
        return pd.DataFrame.from_dict({name: dict(rho=np.nan, p=np.nan, p_partial=np.nan)
                                       for name in table.columns}, orient="index")
    # every model RDM (centred ranks, unit norm) is S @ coords[:, k], and so is each one's
    # residual on the others: a centred permuted RDM c enters every statistic through
    # S.T @ c only (S has at most n_features columns)
    S, coords = _basis(models[:, :len(names)])
    del models
    a0 = S.T @ centred
    undefined_partial, neural_explained = [], []
    partial = {}
    for k, name in enumerate(names):
        if n_features == 1:
            continue
        others, _ = _basis(np.delete(coords, k, axis=1))
        res = coords[:, k] - others @ (others.T @ coords[:, k])
        size = float(np.linalg.norm(res))
        if size <= MANTEL_RESIDUAL_RTOL:        # of a unit-norm model RDM
            undefined_partial.append(name)
        elif norm2 - float(np.sum((others.T @ a0) ** 2)) <= MANTEL_RESIDUAL_RTOL**2 * norm2:
            neural_explained.append(name)
        else:
            partial[name] = (others, res / size)

    def statistics(a):
        """Mantel and partial Mantel correlations of the centred RDM ``S @ a``."""
        rho = (a @ coords) / np.sqrt(norm2)
        rho_res = {}
        for name, (others, w) in partial.items():
            rest = norm2 - float(np.sum((others.T @ a) ** 2))
            rho_res[name] = a @ w / np.sqrt(rest) if rest > 0 else np.nan
        return rho, rho_res

    rho0, res0 = statistics(a0)
    exceed = np.zeros(len(names))
    exceed_res = dict.fromkeys(partial, 0)
    if names:
        square = squareform(centred).ravel()
        i, j = (v.astype(index) for v in np.triu_indices(n, 1))
        flat = np.empty(n_pairs, dtype=index)
        permuted = np.empty(n_pairs)
        for _ in range(n_null):
            # the permuted RDM's ranks are the ranks permuted: pair (i, j) takes the
            # centred rank of the pair (p[i], p[j])
            p = rng.permutation(n).astype(index)
            np.take(p * index(n), i, out=flat)
            flat += p[j]
            np.take(square, flat, out=permuted)
            rho, rho_res = statistics(S.T @ permuted)
            exceed += rho >= rho0 - MANTEL_TIE_TOL
            for name, value in rho_res.items():
                exceed_res[name] += value >= res0[name] - MANTEL_TIE_TOL

    rows = {}
    for name in table.columns:
        if name in constant:
            rows[name] = dict(rho=np.nan, p=np.nan, p_partial=np.nan)
            continue
        k = names.index(name)
        p = float((1 + exceed[k]) / (1 + n_null))
        p_partial = (p if n_features == 1 else
                     float((1 + exceed_res[name]) / (1 + n_null)) if name in partial
                     else np.nan)
        rows[name] = dict(rho=float(rho0[k]), p=p, p_partial=p_partial)
    _warn_undefined(False, constant, undefined_partial, neural_explained)
    return pd.DataFrame.from_dict(rows, orient="index")


def _warn_undefined(neural_constant, constant, undefined_partial, neural_explained):
    """Say why some of the Mantel tests' statistics are NaN."""
    if neural_constant:
        warn_user("mantel_tests: the neural RDM is constant (every pair of patterns at the "
                  "same distance, e.g. identical patterns), so its Spearman correlation "
                  "with any model RDM is undefined: rho, p and p_partial are NaN.")
        return
    if constant:
        warn_user(f"mantel_tests: feature(s) {constant} have a constant model RDM (one "
                  "level, or missing for every stimulus), so their Spearman correlation "
                  "is undefined: rho, p and p_partial are NaN.")
    if undefined_partial:
        warn_user(f"mantel_tests: the other features' model RDMs determine those of "
                  f"{undefined_partial} (identical or nested features), so nothing is left "
                  "to correlate once they are removed: p_partial is NaN.")
    if neural_explained:
        warn_user(f"mantel_tests: the other features' model RDMs explain the neural RDM's "
                  f"ranks entirely in the partial tests of {neural_explained}, so the "
                  "partial correlation is undefined: p_partial is NaN.")
