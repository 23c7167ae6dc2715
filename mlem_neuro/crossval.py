"""Cross-validated MLEM over a stack of models: the driver every analysis shares.

For each fold the feature encoding is fitted on the training stimuli, all models are trained
on pairs of training stimuli (in chunks of models, each chunk one :func:`fit_stack` call),
then scored and permuted on pairs of held-out stimuli.  Chunks go through joblib, so
``joblib.parallel_config(backend="dask")`` spreads them over a cluster; each chunk uses its
fold's seed derived from ``random_state`` (every chunk of a fold draws the same batches and
permutations), so results do not depend on ``n_jobs`` or chunking.

Neural distances come from an *RDM source*: any object with ``n_models``, ``n_stimuli``,
``subset(models)`` (a picklable source of those models only) and ``rdm(stimuli)`` returning
an ``(n_models, n_pairs)`` tensor of distances between the given stimuli (pairs in
:func:`~mlem_neuro.core.pairs.pair_indices` order).  :class:`DenseRDMSource` serves data
of shape ``(M, n_stimuli, n_units)`` from Gram products; the searchlight provides its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import numbers
import warnings

import numpy as np
import torch
from joblib import effective_n_jobs

from .utils import check_device, check_random_state, logger
from .core.engine import fit_stack
from .core.features import FeatureSpace, as_feature_table
from .core.importance import feature_importance, term_importance
from .core.metric import term_index, term_names
from .core.neural import NeuralTargets, rdm_from_rows
from .core.pairs import kfold_stimuli, n_pairs, pair_indices

#: bytes of training-pair distances (float64) allowed in one chunk of models.
CHUNK_BYTES = 256 * 2**20


class DenseRDMSource:
    """Distances of ``M`` models with dense data ``Y`` ``(M, n_stimuli, n_units)``."""

    def __init__(self, Y, metric="euclidean"):
        self.Y = Y
        self.metric = metric

    @property
    def n_models(self):
        return self.Y.shape[0]

    @property
    def n_stimuli(self):
        return self.Y.shape[1]

    def subset(self, models):
        return DenseRDMSource(self.Y[models], self.metric)

    def rdm(self, stimuli, device="cpu"):
        Y = torch.as_tensor(np.ascontiguousarray(self.Y[:, stimuli]), device=device)
        i, j = pair_indices(len(stimuli))
        return rdm_from_rows(Y, i, j, self.metric)


@dataclass
class CVOutput:
    """Per-fold results of :func:`run_cv` (numpy arrays).

    Attributes
    ----------
    W : (n_folds, M, m, m)
    score : (n_folds, M)
        Exact Spearman on held-out pairs.
    importance : (n_folds, M, n_terms)
        Mean drop over permutations.
    importance_perm_std : (n_folds, M, n_terms)
        Standard deviation over permutations.
    n_iter : (n_folds, M)
    converged : (n_folds, M)
    terms, feature_names : list of str
    folds : list of (train_idx, test_idx)
    batch_size : list of int (per fold, first chunk)
    """

    W: np.ndarray
    score: np.ndarray
    importance: np.ndarray
    importance_perm_std: np.ndarray
    n_iter: np.ndarray
    converged: np.ndarray
    terms: list
    feature_names: list
    folds: list
    batch_size: list = field(default_factory=list)


def _check_cv(cv, n, rng):
    if cv is None:
        idx = np.arange(n)
        return [(idx, idx)]
    if isinstance(cv, (numbers.Integral, np.integer)) and not isinstance(cv, bool):
        return kfold_stimuli(n, int(cv), rng)
    if hasattr(cv, "split"):
        folds = list(cv.split(np.zeros((n, 1))))
    else:
        try:
            folds = list(cv)
        except TypeError:
            raise TypeError("cv must be None, an int, a scikit-learn splitter or an iterable "
                            f"of (train, test) index arrays; got {cv!r}") from None
    out = []
    for tr, te in folds:
        tr, te = np.asarray(tr, dtype=int), np.asarray(te, dtype=int)
        if len(tr) < 3 or len(te) < 3:
            raise ValueError("every cv fold needs at least 3 training and 3 held-out stimuli "
                             f"(got {len(tr)} and {len(te)}).")
        out.append((tr, te))
    return out


def _fit_chunk(source, enc_train, enc_test, train, test, fit_kw, n_permutations, level,
               interactions, seed, device):
    """Train one chunk of models on training pairs; score and permute on held-out pairs."""
    # separate streams: training draws as many batches as its slowest model needs
    train_seq, perm_seq = np.random.SeedSequence(seed).spawn(2)
    rng = np.random.default_rng(perm_seq)
    dev = check_device(device)
    targets = NeuralTargets.from_rdm(source.rdm(train, dev), len(train), dev)
    fit = fit_stack(enc_train, targets, random_state=np.random.default_rng(train_seq),
                    device=dev, **fit_kw)
    target_test = source.rdm(test, dev)
    enc_t = enc_test.to_torch(dev, torch.float64)
    i, j = pair_indices(len(test))
    if level == "term":
        k, l = term_index(enc_test.n_features, interactions)
        D = enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j))
        drops, base = term_importance(fit.W, D, target_test, k, l, n_permutations, rng)
    else:
        drops, base = feature_importance(fit.W, enc_t, i, j, target_test, n_permutations, rng)
    drops = drops.cpu().numpy()
    std = drops.std(axis=-1, ddof=1) if n_permutations > 1 else np.zeros(drops.shape[:-1])
    return dict(W=fit.W, score=base.cpu().numpy(), importance=drops.mean(axis=-1),
                importance_perm_std=std, n_iter=fit.n_iter, converged=fit.converged,
                batch_size=fit.batch_size)


def _chunk_slices(M, n_train, chunk_size, n_jobs):
    if chunk_size is None:
        chunk_size = max(1, int(CHUNK_BYTES // (8 * max(n_pairs(n_train), 1))))
        workers = effective_n_jobs(n_jobs)
        if workers > 1:
            chunk_size = min(chunk_size, -(-M // workers))
    chunk_size = max(1, min(int(chunk_size), M))
    return [slice(s, min(s + chunk_size, M)) for s in range(0, M, chunk_size)]


def run_cv(source, features, *, cv=5, n_permutations=10, level="term", constraint="spd",
           interactions=True, feature_kinds=None, feature_groups=None, missing_distance=0.0,
           max_steps=1000, patience=50, lr=0.1, tol=1e-4, batch_size="auto",
           chunk_size=None, n_jobs=None, device="cpu", random_state=None, desc="models"):
    """Cross-validated MLEM for every model of ``source``.

    Parameters
    ----------
    source : RDM source
        See the module docstring.
    features : DataFrame
        One row per stimulus of ``source``.
    cv : None | int | splitter | iterable
        ``None`` trains and evaluates on all stimuli (optimistic); an int gives shuffled
        K-fold splits of the stimuli.
    chunk_size : int | None
        Models per engine call (default: bounded by memory, split across ``n_jobs``).
    Other parameters are those of :class:`mlem_neuro.MLEM`.

    Returns
    -------
    CVOutput
    """
    from joblib import Parallel, delayed

    check_device(device)
    table = as_feature_table(features, name="features")
    n, M = source.n_stimuli, source.n_models
    if len(table) != n:
        raise ValueError(f"the feature table has {len(table)} rows but the data have {n} "
                         "stimuli; they must match one-to-one.")
    rng = check_random_state(random_state)
    folds = _check_cv(cv, n, rng)
    inter = bool(interactions) and constraint != "diagonal"
    fit_kw = dict(constraint=constraint, interactions=inter, max_steps=max_steps,
                  patience=patience, lr=lr, tol=tol, batch_size=batch_size)
    space_kw = dict(kinds=feature_kinds, groups=feature_groups,
                    missing_distance=missing_distance)
    layout = []
    names = None
    flat = {}
    for f, (train, test) in enumerate(folds):
        space = FeatureSpace(**space_kw).fit(table.iloc[train])
        names = space.feature_names_
        enc_train = space.transform(table.iloc[train])
        enc_test = space.transform(table.iloc[test])
        for name in _flat_features(enc_test, names):
            flat.setdefault(name, []).append(f + 1)
        if len(names) and all(f + 1 in flat.get(name, ()) for name in names):
            raise ValueError(
                f"every held-out pair of fold {f + 1} has the same distance on every feature "
                f"({list(names)}), so the fold cannot be scored: choose folds whose held-out "
                "stimuli differ in some features and agree in others (e.g. fewer folds).")
        # one seed per fold: every chunk draws the same batches and permutations, so
        # results do not depend on chunk_size or n_jobs
        seed = int(rng.integers(2**63 - 1))
        for sl in _chunk_slices(M, len(train), chunk_size, n_jobs):
            layout.append((f, sl, enc_train, enc_test, train, test, seed))
    if flat:
        where = "; ".join(f"{name!r} in fold(s) {', '.join(map(str, k))}"
                          for name, k in flat.items())
        warnings.warn(f"every held-out pair has the same distance on {list(flat)} ({where}): "
                      "importance there is 0 by construction. Choose folds whose held-out "
                      "stimuli vary in these features (e.g. fewer folds).", UserWarning,
                      stacklevel=5)   # user > verbose wrapper > public > _fit > run_cv
    # chunk data are cut lazily, as joblib asks for the next job
    jobs = (delayed(_fit_chunk)(source.subset(sl), et, ete, tr, te, fit_kw, n_permutations,
                                level, inter, sd, str(device))
            for _, sl, et, ete, tr, te, sd in layout)
    logger.info("MLEM: %d %s x %d fold(s) in %d chunk(s)", M, desc, len(folds), len(layout))
    results = _run_jobs(Parallel, jobs, len(layout), n_jobs, desc)
    terms = term_names(names, inter) if level == "term" else list(names)
    m, T, F = len(names), len(terms), len(folds)
    out = CVOutput(W=np.empty((F, M, m, m)), score=np.empty((F, M)),
                   importance=np.empty((F, M, T)), importance_perm_std=np.empty((F, M, T)),
                   n_iter=np.empty((F, M), dtype=int), converged=np.empty((F, M), dtype=bool),
                   terms=terms, feature_names=list(names), folds=folds)
    for (f, sl, *_), r in zip(layout, results):
        for key in ("W", "score", "importance", "importance_perm_std", "n_iter", "converged"):
            getattr(out, key)[f, sl] = r[key]
        if sl.start == 0:
            out.batch_size.append(r["batch_size"])
    return out


def cv_settings(cv, folds):
    """How the folds were made, for a result's settings (JSON-friendly).

    ``cv`` is kept as given when it is ``None`` or an int, as its ``repr`` for a splitter,
    and as ``"explicit"`` for an iterable of folds; the held-out stimuli of every fold are
    recorded in all cases (``fold_test_indices``), so any split can be reproduced.
    """
    if cv is None or isinstance(cv, (numbers.Integral, np.integer)) and \
            not isinstance(cv, bool):
        desc = None if cv is None else int(cv)
    elif hasattr(cv, "split"):
        desc = repr(cv)
    else:
        desc = "explicit"
    return dict(cv=desc, fold_test_indices=[[int(k) for k in te] for _, te in folds])


def _flat_features(enc, names):
    """Features whose distance is the same on every pair of the encoded stimuli."""
    if enc.n_stimuli < 2:
        return []
    D = np.asarray(enc.pair_distances(*pair_indices(enc.n_stimuli)))
    return [name for name, col in zip(names, D.T) if np.ptp(col) == 0]


def _run_jobs(Parallel, jobs, n_total, n_jobs, desc):
    """Run joblib jobs in order, with a progress bar at INFO."""
    import logging

    show = logger.isEnabledFor(logging.INFO) and n_total > 1
    parallel = Parallel(n_jobs=n_jobs, return_as="generator")
    results = []
    if show:
        from mne.utils import ProgressBar

        with ProgressBar(n_total, mesg=f"MLEM chunks ({desc})") as bar:
            for r in parallel(jobs):
                results.append(r)
                bar.update(len(results))
    else:
        results = list(parallel(jobs))
    return results
