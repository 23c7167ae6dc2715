"""Plain RSA baselines: Mantel and partial Mantel tests of feature model RDMs.

What a user would run instead of MLEM (rsatoolbox / mne-rsa style): the Spearman
correlation between the neural RDM (Euclidean distances between patterns) and one
feature's model RDM (0/1 for a categorical feature, ``|difference|`` for a numeric one),
tested by permuting the stimuli; the partial test first removes the other features' model
RDMs (ranks, least squares) from both.  The benchmarks and the demo compare MLEM's tests
with these on the same data.
"""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats
from scipy.spatial.distance import pdist, squareform

from ._docs import fill_doc
from .core.checks import check
from .core.constants import MANTEL_RESIDUAL_RTOL, MANTEL_TIE_TOL
from .core.memory import check_memory
from .core.ranks.partial import partial_residuals, span_basis
from .core.stimuli.features import as_feature_table
from .utils import (
    check_random_state,
    check_real,
    logger,
    normalise_magnitude,
    renamed,
    verbose,
    warn_user,
)

__all__ = ["mantel_tests", "model_rdm", "rsa_array", "rsa_epochs", "rsa_searchlight"]


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
    S, coords = span_basis(models[:, :len(names)], MANTEL_RESIDUAL_RTOL)
    del models
    a0 = S.T @ centred
    undefined_partial, neural_explained = [], []
    partial = {}
    residuals = partial_residuals(coords, MANTEL_RESIDUAL_RTOL) if n_features > 1 else []
    for name, (others, w) in zip(names, residuals):
        if w is None:
            undefined_partial.append(name)
        elif norm2 - float(np.sum((others.T @ a0) ** 2)) <= MANTEL_RESIDUAL_RTOL**2 * norm2:
            neural_explained.append(name)
        else:
            partial[name] = (others, w)

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


# ---------------------------------------------------------------------------------------
# Time-resolved and searchlight RSA: one neural RDM per model (time point, sphere), the
# same max-statistic permutation tests and result containers as MLEM's analyses.
# ---------------------------------------------------------------------------------------
def _model_basis(table, partial):
    """What every statistic of the RSA analyses needs from the features.

    Each feature's model RDM (:func:`model_rdm`) is ranked, centred and scaled to unit
    norm; ``S`` is an orthonormal basis of their span and ``coords`` their coordinates in
    it, so the Spearman correlation of a centred unit-norm neural rank vector ``a`` with
    feature ``k`` is ``(S.T @ a) @ coords[:, k]``.  With ``partial``, feature ``k``'s
    partial correlation is ``(S.T @ a) @ w_k / sqrt(1 - |O_k.T (S.T @ a)|^2)``, ``w_k``
    the unit residual of its model RDM on the others' (``O_k`` their basis), both in
    ``S``'s coordinates.

    Returns ``(S, coords, usable, partials, untestable)``: ``usable`` the column of
    ``coords`` of each feature (``None`` for a constant model RDM), ``partials`` the
    ``(O_k, w_k)`` of each feature (``None`` when its partial correlation is undefined)
    and ``untestable`` the ``{feature: reason}`` of the features without a statistic.
    """
    names = list(table.columns)
    n = len(table)
    models, usable, untestable = [], {}, {}
    for name in names:
        m = stats.rankdata(model_rdm(table[name]))
        if m.max() == m.min():
            usable[name] = None
            untestable[name] = (f"the model RDM of {name!r} is constant (one level, or "
                                "missing for every stimulus): its Spearman correlation "
                                "is undefined")
            continue
        m -= m.mean()
        usable[name] = len(models)
        models.append(m / np.linalg.norm(m))
    n_pairs = n * (n - 1) // 2
    S, coords = span_basis(np.column_stack(models) if models else np.zeros((n_pairs, 0)),
                           MANTEL_RESIDUAL_RTOL)
    partials = {}
    if partial and len(models) > 1:
        residuals = partial_residuals(coords, MANTEL_RESIDUAL_RTOL)
        for name in names:
            k = usable[name]
            if k is None:
                continue
            others, w = residuals[k]
            if w is None:
                partials[name] = None
                untestable[name] = (f"the other features' model RDMs determine that of "
                                    f"{name!r} (identical or nested features): nothing is "
                                    "left to correlate once they are removed")
            else:
                partials[name] = (others, w)
    return S, coords, usable, partials, untestable


def _statistics(a, coords, usable, partials, names):
    """Spearman (or partial Spearman, when ``partials`` is not empty) of every feature
    from ``a = S.T @ ranks`` ``(..., r)``: ``(..., n_features)``, NaN where undefined."""
    out = np.full(a.shape[:-1] + (len(names),), np.nan)
    for f, name in enumerate(names):
        k = usable[name]
        if k is None:
            continue
        if not partials:
            out[..., f] = a @ coords[:, k]
        elif partials.get(name) is not None:
            others, w = partials[name]
            rest = 1.0 - np.sum((a @ others) ** 2, axis=-1)
            with np.errstate(invalid="ignore", divide="ignore"):
                out[..., f] = np.where(rest > MANTEL_RESIDUAL_RTOL**2,
                                       (a @ w) / np.sqrt(np.maximum(rest, 0.0)), np.nan)
    return out


def _neural_ranks(d):
    """Centred, unit-norm ranks of each row of ``d`` (torch float64 ``(M, n_pairs)``);
    NaN rows for a constant RDM (its correlation with anything is undefined).

    The package's exact average ranks (:func:`mlem_neuro.core.ranks.spearman.rankdata`):
    on 8,000 spheres x 1,770 pairs they took about a third of scipy's time."""
    from .core.ranks.spearman import rankdata

    r = rankdata(d).numpy()
    r -= r.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(r, axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(norm > 0, r / norm, np.nan)


def _permuted_basis(S, inverse, n):
    """``S`` with its pairs relabelled by each of ``inverse (R, n)``: ``(n_pairs, R * r)``,
    block ``b`` the basis of the model RDMs under relabelling ``b``."""
    from .core.scoring.nulls import permuted_pairs

    idx = permuted_pairs(inverse, np.arange(n), n)             # (R, n_pairs)
    return np.ascontiguousarray(S[idx].transpose(1, 0, 2).reshape(S.shape[0], -1))


def _rsa_chunk(source, S, coords, usable, partials, names, inverse, perm_blocks, cached):
    """Observed ``(Mc, K)`` and null ``(R, Mc, K)`` statistics of one chunk of models, and
    which of them have a constant neural RDM ``(Mc,)``."""
    n = source.n_stimuli
    d = source.rdm(np.arange(n))
    A = _neural_ranks(d)
    del d
    flat = np.isnan(A[:, 0])
    A[flat] = 0.0
    r = S.shape[1]
    observed = _statistics(A @ S, coords, usable, partials, names)
    observed[flat] = np.nan
    R = 0 if inverse is None else len(inverse)
    null = np.empty((R, A.shape[0], len(names)))
    for block in perm_blocks:
        Sb = cached if cached is not None else _permuted_basis(S, inverse[block], n)
        a = (A @ Sb).reshape(A.shape[0], -1, r).transpose(1, 0, 2)   # (Rb, Mc, r)
        null[block] = _statistics(a, coords, usable, partials, names)
    null[:, flat] = np.nan
    return observed, null, flat


def _rsa_nulls(table, groups, n_null, rng):
    """The relabellings ``(n_null, n)`` of the RSA tests (every stimulus, within
    ``groups`` as MLEM's nulls: :func:`~mlem_neuro.core.scoring.nulls.null_design` with
    ``null="marginal"``), the exchange mode and the untestable features."""
    from .core.scoring.nulls import _expand_units, null_design, permute_within
    from .core.stimuli.features import FeatureSpace

    if groups is None:
        return permute_within(np.zeros(len(table)), n_null, rng), None, {}
    space = FeatureSpace()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the encoding only says which rows are equal
        enc = space.fit_transform(table)
    design = null_design(enc, space.kinds_, groups, null="marginal")
    perms = permute_within(design.strata[0], n_null, rng)
    if design.units is not None:
        perms = _expand_units(perms, design.units)
    untestable = {k: v for k, v in design.untestable.items() if k != "score"}
    if "score" in design.untestable:          # nothing moves at all
        untestable = {name: design.untestable["score"] for name in table.columns}
    return perms, design.mode, untestable


def _run_rsa(source, table, *, n_null, partial, groups, rng, n_jobs, desc):
    """The RSA statistics and tests of every model of ``source``: a dict with
    ``rho (M, K)``, ``tests``, ``pvalues``, ``pvalues_fwe``, ``untestable``, ``mode``."""
    from joblib import Parallel, delayed

    from .core.constants import CHUNK_BYTES, NULL_COLUMNS_BYTES
    from .core.jobs import run_jobs
    from .core.scoring.nulls import permutation_pvalues

    names = list(table.columns)
    n, M, K = source.n_stimuli, source.n_models, len(names)
    n_pairs = n * (n - 1) // 2
    S, coords, usable, partials, untestable = _model_basis(table, partial)
    r = S.shape[1]
    # one model's RDM, ranks and centred ranks, the pair-index table of the relabellings,
    # one relabelled basis and the model ranks: the least one chunk holds
    check_memory(8 * n_pairs * (4 + 2 * r + K) + 24 * n * n,
                 f"the RSA of {n:,} stimuli and {K} features",
                 "average the trials of each item, or analyse fewer stimuli")
    inverse, mode = None, None
    if n_null:
        perms, mode, null_untestable = _rsa_nulls(table, groups, n_null, rng)
        inverse = np.argsort(perms, axis=1)
        for name, why in null_untestable.items():
            untestable.setdefault(name, why)
    R = 0 if inverse is None else len(inverse)
    per_perm = 8 * n_pairs * (1 + r)                 # pair indices and relabelled basis
    step = max(1, int(NULL_COLUMNS_BYTES // max(per_perm, 1)))
    perm_blocks = [slice(s, s + step) for s in range(0, R, step)]
    cached = None
    if len(perm_blocks) == 1 and r:
        cached = _permuted_basis(S, inverse, n)
    if r == 0:
        perm_blocks = []
    per_model = 8 * n_pairs * 3 + 8 * R * (r + K)
    size = max(1, int(CHUNK_BYTES // max(per_model, 1)))
    chunks = [slice(s, min(s + size, M)) for s in range(0, M, size)]
    jobs = (delayed(_rsa_chunk)(source.subset(sl), S, coords, usable, partials, names,
                                inverse, perm_blocks, cached) for sl in chunks)
    results = run_jobs(Parallel, jobs, len(chunks), n_jobs, desc)
    rho = np.concatenate([o for o, _, _ in results], axis=0)
    flat = np.concatenate([f for _, _, f in results])
    out = dict(rho=rho, tests=None, pvalues=None, pvalues_fwe=None, mode=mode)
    if n_null:
        null = np.concatenate([nl for _, nl, _ in results], axis=1)   # (R, M, K)
        tests = {name: (rho[:, f], null[:, :, f]) for f, name in enumerate(names)}
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # all-NaN nulls
            tnames, p, p_fwe = permutation_pvalues(tests, tol=MANTEL_TIE_TOL)
        for f, name in enumerate(tnames):
            if name in untestable:
                p[:, f] = p_fwe[:, f] = np.nan
        out.update(tests=tnames, pvalues=p, pvalues_fwe=p_fwe)
    if flat.any() and flat.sum() < M:
        warn_user(f"RSA: the neural RDM of {int(flat.sum())} of {M} {desc} is constant "
                  "(every pair of patterns at the same distance), so its correlations "
                  "are undefined: NaN there.")
    elif flat.all() and M:
        warn_user(f"RSA: the neural RDM of every one of the {M} {desc} is constant "
                  "(e.g. identical patterns), so every correlation is undefined (NaN).")
    for name, why in untestable.items():
        what = ("statistic and p-values are" if usable[name] is None
                or (partials and partials.get(name) is None) else "p-values are")
        warn_user(f"RSA: the test of {name!r} cannot be run: {why}. Its {what} NaN.")
    out["untestable"] = untestable
    return out


def _rsa_settings(out, *, distance, n_null, partial, groups, random_state, **extra):
    settings = dict(method="rsa", statistic="partial spearman" if partial else "spearman",
                    distance=distance, n_null=int(n_null), partial=bool(partial),
                    null="marginal", null_exchange=out["mode"],
                    n_groups=None if groups is None else int(len(np.unique(groups))),
                    random_state=random_state if isinstance(random_state, int) else None,
                    cv=None)
    if out["untestable"]:
        settings["untestable_tests"] = dict(out["untestable"])
    settings.update(extra)
    return settings


def _result_arrays(out, names):
    """The fold arrays of a result container from RSA statistics (one "fold": all pairs;
    no held-out score, no weights: NaN)."""
    rho = out["rho"]
    M, K = rho.shape
    return dict(fold_importance=rho[None], fold_score=np.full((1, M), np.nan),
                fold_weights=np.full((1, M, K, K), np.nan),
                n_iter=np.zeros((1, M), dtype=int), terms=names, feature_names=names,
                tests=out["tests"], pvalues=out["pvalues"], pvalues_fwe=out["pvalues_fwe"])


def _check_rsa_options(distance, n_null, partial, n_jobs):
    distance = check("distance", distance, allowed=("euclidean", "correlation", "cosine"),
                     where=" for RSA")
    return (distance, check("n_null", n_null), check("partial", partial),
            check("n_jobs", n_jobs))


def _time_result(out, table, times, ch_names, settings):
    from .results.rsa import RSATimeCourseResult

    names = list(table.columns)
    res = RSATimeCourseResult(**_result_arrays(out, names), settings=settings, times=times,
                              ch_names=ch_names)
    if res.pvalues is not None:
        logger.info("RSA tests (%d null relabellings): FWE-significant time points %s",
                    settings["n_null"], {t: int(np.nansum(res.pvalues_fwe[:, k] < 0.05))
                                         for k, t in enumerate(res.tests)})
    return res


def _time_rsa(data, table, times, ch_names, settings, *, distance, n_null, partial,
              groups, random_state, n_jobs):
    from .core.rdms.sources import DenseRDMSource
    from .time_resolved import _scale_channels

    data = normalise_magnitude(data, "data")
    n, C, T = data.shape
    if settings["scale"]:
        data = _scale_channels(data)
    groups = None if groups is None else _check_groups(groups, n)
    rng = check_random_state(random_state)
    source = DenseRDMSource(np.ascontiguousarray(data.transpose(2, 0, 1)), distance)
    logger.info("RSA time course: %d stimuli, %d channels, %d time points, features %s",
                n, C, T, list(table.columns))
    out = _run_rsa(source, table, n_null=n_null, partial=partial, groups=groups, rng=rng,
                   n_jobs=n_jobs, desc="time points")
    settings = _rsa_settings(out, distance=distance, n_null=n_null, partial=partial,
                             groups=groups, random_state=random_state, n_trials=n,
                             n_channels=C, **settings)
    return _time_result(out, table, times, ch_names, settings)


def _check_groups(groups, n):
    from .crossval import check_groups

    return check_groups(groups, n)


@verbose
@fill_doc
def rsa_array(data, features, times=None, sfreq=None, ch_names=None, *, tmin=None,
              tmax=None, decim=1, window=None, scale=True, distance="euclidean",
              partial=False, n_null=999, groups=None, random_state=None, n_jobs=None,
              verbose=None):
    """Time-resolved RSA on an array of trials, with MLEM's tests and results.

    The counterpart of :func:`mlem_neuro.mlem_array` with the same data, features and time
    selection: at every time point, the Spearman correlation of the trials' neural RDM
    with each feature's model RDM, tested by relabelling the trials.

    Parameters
    ----------
    data : array (n_trials, n_channels, n_times)
        The trials (each is a stimulus).
    features : DataFrame | array (n_trials, n_features)
        One row per trial; one model RDM per column (:func:`model_rdm`).
    times : array (n_times,) | None
        Time of each sample in seconds.  Default: ``arange(n_times) / sfreq``, or sample
        indices when ``sfreq`` is also None.
    sfreq : float | None
        Sampling rate in Hz (needed for ``window`` when ``times`` is not given).
    ch_names : list of str | None
        Channel names, kept on the result.
    %(tmin)s
    %(tmax)s
    %(decim)s
    %(window)s
    %(scale)s
    %(distance_rsa_trials)s
    %(partial_rsa)s
    %(n_null_rsa_trials)s
    groups : array-like | str | None
        One label per trial (run, session, item...) (a str names a column of the features
        holding them: an identifier, not a feature).  The null relabellings respect them as
        MLEM's nulls do (:func:`~mlem_neuro.core.scoring.nulls.null_design`): trials are
        relabelled within their group when each group holds several feature rows (runs), and
        groups holding one feature row (the trials of an item) are exchanged whole.  Without
        ``groups`` every trial is exchangeable with every other.
    random_state : None | int | numpy Generator
        Seeds the null relabellings.
    n_jobs : int | None
        Chunks of time points run in parallel with joblib (``None``: one process; ``-1``:
        all cores).
    %(verbose)s

    Returns
    -------
    RSATimeCourseResult
        ``.rho`` (= ``.importance``, n_times × n_features), ``.tests``, ``.pvalues``,
        ``.pvalues_fwe``, ``.significant()``, ``.plot()``, ``.to_data_frame()``,
        ``.save()``.

    See Also
    --------
    rsa_epochs, rsa_searchlight, mantel_tests, mlem_neuro.mlem_array

    Notes
    -----
    Per time point, the statistic of a feature is the Spearman correlation, over every pair
    of trials, of the neural RDM with the feature's model RDM (:func:`model_rdm`: 0/1
    for a categorical feature, ``|difference|`` for a numeric one, 0 for a pair with a
    missing value).  A relabelling of the trials permutes the neural RDM's rows and
    columns; the same correlation is obtained by permuting the (small) model RDMs the
    other way, so the neural RDMs are ranked once per time point and every null statistic is
    one matrix product of those ranks with the relabelled model ranks.  An undefined
    correlation is NaN (a constant neural RDM, a feature with one level), never a p-value.

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> rng = np.random.default_rng(0)
    >>> side = rng.integers(0, 2, 40)
    >>> data = rng.standard_normal((40, 6, 12))
    >>> data[:, :3, 6:] += 2 * side[:, None, None]          # "side" encoded from sample 6
    >>> res = rsa_array(data, pd.DataFrame({"side": side.astype(bool)}), sfreq=100.0,
    ...                 n_null=99, random_state=0)
    >>> res.rho.shape
    (12, 1)
    >>> bool(res.significant("side")[6:].all() and not res.significant("side")[:6].any())
    True
    """
    from .time_resolved import array_inputs

    distance, n_null, partial, n_jobs = _check_rsa_options(distance, n_null, partial,
                                                           n_jobs)
    arr = array_inputs(data, features, times, sfreq, ch_names, tmin, tmax, window, groups)
    data, times, settings = arr.crop(arr.data, decim, scale)
    settings = dict(analysis="time", **settings)
    table, groups, ch_names = arr.table, arr.groups, arr.ch_names
    return _time_rsa(data, table, times, ch_names, settings, distance=distance,
                     n_null=n_null, partial=partial, groups=groups,
                     random_state=random_state, n_jobs=n_jobs)


@verbose
@fill_doc
def rsa_epochs(epochs, features=None, picks=None, tmin=None, tmax=None, decim=1, *,
               window=None, scale=True, distance="euclidean", partial=False, n_null=999,
               groups=None, random_state=None, n_jobs=None, verbose=None):
    """Time-resolved RSA on MEG/EEG epochs, with MLEM's tests and results.

    The counterpart of :func:`mlem_neuro.mlem_epochs` (features read from the same
    places, the same channel and time selection): at every time point, the Spearman
    correlation of the epochs' neural RDM with each feature's model RDM, tested by
    relabelling the epochs.  The caller's ``epochs`` are never modified.

    Parameters
    ----------
    epochs : mne.Epochs
        The trials.  Non-preloaded epochs are read through a copy (bad epochs dropped).
    features : None | str | list of str | DataFrame
        ``None``: ``epochs.metadata`` when present (every column is a feature but the
        one ``groups`` names), else the table of :func:`mlem_neuro.features_from_events`
        (``/``-tagged event names).  Column name(s) of ``epochs.metadata``.  Or a
        DataFrame with one row per epoch (or one per original event, aligned with
        ``epochs.selection``).
    picks : str | list | slice | None
        Channels, as in MNE (names, types such as ``"eeg"``, indices); ``None``: the good
        data channels.
    %(tmin)s
    %(tmax)s
    %(decim)s
    %(window)s
    %(scale)s
    %(distance_rsa_trials)s
    %(partial_rsa)s
    %(n_null_rsa_trials)s
    groups : array-like | str | None
        One label per trial (run, session, item...) (a str names an ``epochs.metadata``
        column holding them; labels of every original event are aligned with
        ``epochs.selection``).  The null relabellings respect them as MLEM's nulls do
        (:func:`~mlem_neuro.core.scoring.nulls.null_design`): trials are relabelled within
        their group when each group holds several feature rows (runs), and groups holding
        one feature row (the trials of an item) are exchanged whole.  Without ``groups``
        every trial is exchangeable with every other.
    random_state : None | int | numpy Generator
        Seeds the null relabellings.
    n_jobs : int | None
        Chunks of time points run in parallel with joblib (``None``: one process; ``-1``:
        all cores).
    %(verbose)s

    Returns
    -------
    RSATimeCourseResult
        As :func:`rsa_array`.

    See Also
    --------
    rsa_array, mlem_neuro.mlem_epochs

    Notes
    -----
    Per time point, the statistic of a feature is the Spearman correlation, over every pair
    of trials, of the neural RDM with the feature's model RDM (:func:`model_rdm`: 0/1
    for a categorical feature, ``|difference|`` for a numeric one, 0 for a pair with a
    missing value).  A relabelling of the trials permutes the neural RDM's rows and
    columns; the same correlation is obtained by permuting the (small) model RDMs the
    other way, so the neural RDMs are ranked once per time point and every null statistic is
    one matrix product of those ranks with the relabelled model ranks.  An undefined
    correlation is NaN (a constant neural RDM, a feature with one level), never a p-value.

    Examples
    --------
    >>> res = mlem_neuro.rsa.rsa_epochs(epochs, features=["modality", "side"],
    ...                                 n_null=999, random_state=0)  # doctest: +SKIP
    >>> res.plot()                                                   # doctest: +SKIP
    """
    from .adapters.epochs import epochs_data, epochs_feature_table, per_epoch
    from .time_resolved import _check_data, _metadata_column

    distance, n_null, partial, n_jobs = _check_rsa_options(distance, n_null, partial,
                                                           n_jobs)
    data, times, ch_names, work = epochs_data(epochs, picks=picks, tmin=tmin, tmax=tmax,
                                              decim=decim, window=window)
    table = epochs_feature_table(work, features)
    groups = per_epoch(groups, work, "groups")
    if isinstance(groups, str):         # a metadata column names the groups
        column, groups = groups, _metadata_column(work, groups)
        if features is None and column in table.columns:
            table = table.drop(columns=column)       # an identifier, not a feature
    sfreq = float(epochs.info["sfreq"])
    settings = dict(analysis="time", window=None if window is None else float(window),
                    scale=bool(scale), sfreq=sfreq / int(decim), decim=int(decim),
                    picks=picks if picks is None or isinstance(picks, str) else None,
                    tmin=None if tmin is None else float(tmin),
                    tmax=None if tmax is None else float(tmax), times_in_seconds=True,
                    n_epochs=int(len(work)))
    return _time_rsa(_check_data(data), table, times, ch_names, settings,
                     distance=distance, n_null=n_null, partial=partial, groups=groups,
                     random_state=random_state, n_jobs=n_jobs)


@verbose
@fill_doc
def rsa_searchlight(imgs, features, mask_img, process_mask_img=None, radius=6.0, *,
                    standardize=None, distance="euclidean", partial=False, n_null=999,
                    groups=None, random_state=None, n_jobs=None, verbose=None):
    """Searchlight RSA on NIfTI images, with MLEM's tests and results.

    The counterpart of :func:`mlem_neuro.mlem_searchlight` (the same spheres): in each
    sphere, the Spearman correlation of the images' neural RDM with each feature's model
    RDM, tested by relabelling the images.

    Parameters
    ----------
    %(imgs)s
    %(features_images)s
    %(mask_img)s
    process_mask_img : 3D image | None
        Voxels used as sphere centres (nilearn's ``process_mask_img``; its own grid gives
        the grid of the maps).  Default: every voxel of ``mask_img``.
    %(radius)s
    standardize : "run" | None
        ``"run"``: z-score each voxel across the images of each run before the distances
        (runs from the ``run`` level of the features' index, else ``groups``), as in
        :func:`mlem_neuro.mlem_searchlight`.  ``None``: the images as given.
    distance : {"euclidean", "correlation", "cosine"}
        Neural distance between the patterns of two images (``"correlation"``: ``1 - r``
        across the sphere's voxels), computed as in MLEM's analyses
        (:mod:`mlem_neuro.core.rdms.distances`).
    %(partial_rsa)s
    n_null : int
        Null relabellings of the images (``0``: no test).  The same relabellings serve
        every sphere and every feature, so ``pvalues_fwe`` (maximum statistic over
        spheres) controls the family-wise error over spheres, and
        ``pvalues_fwe_tests`` over spheres and features, as in MLEM's results.  The
        smallest p-value is ``1 / (1 + n_null)``.
    groups : array-like | None
        One label per image (run, session, item...) (with ``standardize="run"``, the runs
        when the features' index does not name them).  The null relabellings respect them as
        MLEM's nulls do (:func:`~mlem_neuro.core.scoring.nulls.null_design`): images are
        relabelled within their group when each group holds several feature rows (runs), and
        groups holding one feature row (the trials of an item) are exchanged whole.  Without
        ``groups`` every image is exchangeable with every other.
    random_state : None | int | numpy Generator
        Seeds the null relabellings.
    n_jobs : int | None
        Chunks of spheres run in parallel with joblib (``None``: one process; ``-1``:
        all cores).
    %(verbose)s

    Returns
    -------
    RSABrainMapResult
        ``.rho`` (= ``.importance``), ``importance_img(feature)``, ``significance_img``,
        ``to_nifti()``, ``to_data_frame()``, ``plot(feature)``, ``save``.

    See Also
    --------
    rsa_array, mlem_neuro.mlem_searchlight

    Notes
    -----
    Per sphere, the statistic of a feature is the Spearman correlation, over every pair
    of images, of the neural RDM with the feature's model RDM (:func:`model_rdm`: 0/1
    for a categorical feature, ``|difference|`` for a numeric one, 0 for a pair with a
    missing value).  A relabelling of the images permutes the neural RDM's rows and
    columns; the same correlation is obtained by permuting the (small) model RDMs the
    other way, so the neural RDMs are ranked once per sphere and every null statistic is
    one matrix product of those ranks with the relabelled model ranks.  An undefined
    correlation is NaN (a constant neural RDM, a feature with one level), never a p-value.

    Examples
    --------
    >>> res = mlem_neuro.rsa.rsa_searchlight(imgs, table[["category"]], mask,
    ...                                      radius=6.0, n_null=999)  # doctest: +SKIP
    >>> res.plot("category")                                        # doctest: +SKIP
    """
    from .adapters.nifti import check_radius
    from .core.rdms.sources import SphereRDMSource
    from .results.rsa import RSABrainMapResult
    from .searchlight import _prepare, _standardize_runs, mean_background, space_code, spheres

    distance, n_null, partial, n_jobs = _check_rsa_options(distance, n_null, partial,
                                                           n_jobs)
    radius = check_radius(radius)
    if mask_img is None:
        raise ValueError("mask_img is required: pass a brain mask, e.g. "
                         "nilearn.masking.compute_brain_mask(imgs), so that only brain "
                         "voxels enter the spheres.")
    runs, runs_from = _standardize_runs(standardize, features, groups)
    img4d, table, mask, _, groups, _, _ = _prepare(imgs, features, mask_img, None, groups,
                                                   runs_from=runs_from)
    centres_mask, centres_affine, centre_ijk, A, X = spheres(
        img4d, mask, process_mask_img, radius, runs, runs_from)
    sizes = np.diff(A.indptr)
    n = X.shape[0]
    groups = None if groups is None else _check_groups(groups, n)
    source = SphereRDMSource(normalise_magnitude(X, "images"), A, distance)
    source.check_patterns()
    logger.info("RSA searchlight: %d images, %d voxels in mask, %d spheres of %d voxels "
                "(median)", n, X.shape[1], len(sizes), int(np.median(sizes)))
    out = _run_rsa(source, table, n_null=n_null, partial=partial, groups=groups,
                   rng=check_random_state(random_state), n_jobs=n_jobs, desc="spheres")
    settings = _rsa_settings(out, distance=distance, n_null=n_null, partial=partial,
                             groups=groups, random_state=random_state,
                             analysis="searchlight", radius=radius, n_images=n,
                             n_mask_voxels=int(X.shape[1]),
                             median_sphere_size=float(np.median(sizes)),
                             standardize=runs_from and "run", standardize_runs=runs_from,
                             space_code=space_code(img4d))
    return RSABrainMapResult(**_result_arrays(out, list(table.columns)), settings=settings,
                             affine=centres_affine, shape=centres_mask.shape,
                             voxel_indices=centre_ijk, kind="searchlight",
                             background=mean_background(img4d, centres_mask.shape,
                                                        centres_affine))
