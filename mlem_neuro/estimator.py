"""The :class:`MLEM` estimator: one model, scikit-learn contract."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from ._docs import fill_doc
from ._provenance import collect as collect_provenance
from ._threads import limit_threads
from .core.checks import check
from .core.constants import MIN_BLOCK_PAIRS, PRECOMPUTED_PAIR_BYTES, TRAIN_PAIR_BYTES
from .core.memory import check_memory
from .core.options import MLEMOptions
from .core.ranks.spearman import constant_rows
from .core.rdms.distances import get_distance
from .core.rdms.neural import NeuralTargets, preprocess_rows
from .core.runtime import Runtime
from .core.scoring.importance import (
    PairFeatures,
    baseline_scores,
    feature_importance,
    pair_blocks,
    term_importance,
    warn_unidentifiable_terms,
)
from .core.stimuli.design import design_message, diagnose_design
from .core.stimuli.features import as_feature_table, feature_space
from .core.stimuli.pairs import linear_to_pair, n_pairs, pair_indices
from .core.training.engine import fit_stack
from .core.training.metric import term_index, term_names
from .utils import (
    check_device,
    check_random_state,
    check_real,
    logger,
    normalise_magnitude,
    use_log_level,
    warn_user,
)

#: estimator parameters that are MLEM options (validated by MLEMOptions).
_OPTION_PARAMS = ("constraint", "interactions", "distance", "n_permutations", "max_steps",
                  "patience", "lr", "tol", "batch_size", "numeric_levels", "feature_kinds",
                  "feature_groups", "missing_distance", "device", "backend", "random_state")


@fill_doc
class MLEM(BaseEstimator):
    """Metric Learning Encoding Model.

    Learns a metric ``W`` over theoretical feature distances so that the predicted distance
    between two stimuli, ``sqrt(dᵀ W d)`` with ``d`` their per-feature distances, ranks the
    pairs as their neural distances do (maximising Spearman's ρ over stimulus pairs).

    ``X`` is the neural data (stimuli × units, or a precomputed stimuli × stimuli
    dissimilarity matrix) and ``y`` the feature table, so the estimator also runs inside
    :class:`mne.decoding.SlidingEstimator` (one feature) and
    :class:`nilearn.decoding.SearchLight`.

    Parameters
    ----------
    %(constraint)s
    %(interactions)s
    distance : {"euclidean", "correlation", "cosine", "precomputed"}
        Neural distance between stimuli.  With ``"precomputed"``, ``X`` is a symmetric
        ``(n_stimuli, n_stimuli)`` dissimilarity matrix (its diagonal is ignored).
    n_permutations : int
        Default number of permutations for :meth:`permutation_importance`.
    %(max_steps)s
    %(patience)s
    %(lr)s
    %(tol)s
    %(batch_size)s
    %(numeric_levels)s
    %(feature_kinds)s
    %(feature_groups)s
    %(missing_distance)s
    %(device)s
    %(backend)s
    random_state : None | int | numpy Generator
        Seeds batch sampling (and default importance permutations).
    verbose : bool | str | int | None
        Logging level for the calls of this estimator (``None`` keeps the level set with
        :func:`mlem_neuro.set_log_level`).

    Attributes
    ----------
    W_ : ndarray (m, m)
        The metric used in ``sqrt(dᵀ W d)``, Frobenius norm 1, in the order of
        ``feature_names_in_``.
    feature_names_in_ : ndarray of str
        The features (``y``'s columns, or group names for multi-column features).
    terms_ : list of str
        Importance terms: ``"f"`` per feature, ``"f:g"`` per interaction.
    n_iter_ : int
        Training steps run.
    converged_ : bool
        True when training stopped early (``patience``), False when it hit ``max_steps``.
    history_ : ndarray (n_steps,)
        Training soft Spearman at each of the ``n_iter_`` steps.
    train_score_ : float
        Best training soft Spearman (the state kept).
    batch_size_ : int
        Pairs per training step actually used.
    feature_space_ : FeatureSpace
        The fitted feature encoding (kinds and scaling learnt on the training stimuli).
    provenance_ : dict
        What the fit was computed with, as an analysis's result records it
        (:func:`mlem_neuro._provenance.collect`): versions, platform, device, and what
        trained the model: ``provenance_["training"]`` names the backend (e.g.
        ``["compiled loop (numba)"]``), ``provenance_["step_rules"]`` the step rule
        (``lr="auto"`` and ``patience="auto"`` resolved, e.g.
        ``[{"lr": 0.1, "patience": 20}]``).
    """

    def __init__(self, constraint="spd", interactions=True, distance="euclidean",
                 n_permutations=10, max_steps=1000, patience="auto", lr="auto", tol=1e-4,
                 batch_size="auto", numeric_levels="auto", feature_kinds=None,
                 feature_groups=None,
                 missing_distance=0.0, device="cpu", backend="auto", random_state=None,
                 verbose=None):
        self.constraint = constraint
        self.interactions = interactions
        self.distance = distance
        self.n_permutations = n_permutations
        self.max_steps = max_steps
        self.patience = patience
        self.lr = lr
        self.tol = tol
        self.batch_size = batch_size
        self.numeric_levels = numeric_levels
        self.feature_kinds = feature_kinds
        self.feature_groups = feature_groups
        self.missing_distance = missing_distance
        self.device = device
        self.backend = backend
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ checks
    def _options(self):
        """The estimator's parameters as validated :class:`MLEMOptions`."""
        kw = {name: getattr(self, name) for name in _OPTION_PARAMS}
        return MLEMOptions(allow_precomputed=True, cv=None, **kw)

    def _runtime(self):
        """The :class:`~mlem_neuro.core.runtime.Runtime` of one public call (``fit``,
        ``transform``, ``score``...): the environment read once, at its entry, as an
        analysis reads it (its memory budget and compiled kernels then travel down)."""
        return Runtime.resolve(1, self.device)

    def _check_X(self, X, n_rows=None, budget=None):
        if isinstance(X, (pd.DataFrame, pd.Series)):
            X = X.to_numpy()
        check_real(X, "X")
        try:
            X = np.asarray(X, dtype=float)
        except (TypeError, ValueError):
            raise TypeError("X must be a numeric array (n_stimuli, n_units); got "
                            f"{type(X).__name__}") from None
        if self.distance != "precomputed":
            X = normalise_magnitude(X, "X")
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D (n_stimuli, n_units"
                             f"{' or n_stimuli' if self.distance == 'precomputed' else ''}); "
                             f"got shape {X.shape}. For a single unit pass X[:, None].")
        n = X.shape[0]
        if n < 3:
            raise ValueError(f"MLEM needs at least 3 stimuli (pairs of stimuli are compared); "
                             f"got {n}.")
        if self.distance == "precomputed":
            if X.shape[1] != n:
                raise ValueError("with distance='precomputed', X must be a square (n_stimuli, "
                                 f"n_stimuli) dissimilarity matrix; got shape {X.shape}.")
            check_memory(PRECOMPUTED_PAIR_BYTES * n_pairs(n),
                         f"checking and condensing the precomputed {n:,} x {n:,} "
                         "dissimilarity matrix (its pair indices and both triangles)",
                         "pass fewer stimuli, or the neural data with a distance such as "
                         "'euclidean' (whose pairs are computed a batch at a time)",
                         budget=budget)
            iu = np.triu_indices(n, k=1)
            up, low = X[iu], X.T[iu]
            if not np.isfinite(up).all() or not np.isfinite(low).all():
                raise ValueError("the precomputed dissimilarity matrix holds NaN or infinite "
                                 "values off its diagonal.")
            if not np.allclose(up, low, rtol=1e-6, atol=1e-9 * max(np.abs(up).max(), 1e-300)):
                raise ValueError("the precomputed dissimilarity matrix is not symmetric "
                                 "(X != X.T); pass a symmetric matrix, e.g. (X + X.T) / 2.")
        elif not np.isfinite(X).all():
            bad = int((~np.isfinite(X)).sum())
            raise ValueError(f"X holds {bad} NaN or infinite values; MLEM needs finite "
                             "neural data (drop or impute them first).")
        if n_rows is not None and n != n_rows:
            raise ValueError(f"X has {n} stimuli (rows) but the feature table y has {n_rows} "
                             "rows; they must match one-to-one.")
        return X

    def _check_Xy(self, X, y, budget=None):
        _check_same_index(X, y)
        table = as_feature_table(y)
        return self._check_X(X, n_rows=len(table), budget=budget), table

    def _targets(self, X, dev, runtime):
        if self.distance == "precomputed":
            n = X.shape[0]
            return NeuralTargets.from_rdm(X[np.triu_indices(n, k=1)], n, dev)
        return NeuralTargets.from_data(X[None], self.distance, dev, runtime)

    def _check_is_fitted(self):
        check_is_fitted(self, "W_", msg="This %(name)s instance is not fitted yet; call "
                        "fit(X, y) before this method.")

    def __sklearn_tags__(self):
        """scikit-learn (>= 1.6) estimator tags.

        ``y``, the feature table, is required (one feature as a 1-D array, several as a 2-D
        table); ``X`` is a finite 2-D array (a square dissimilarity matrix, i.e. pairwise,
        with ``distance="precomputed"``).  MLEM has no ``predict``, so it claims no
        estimator type; its ``transform`` returns one float64 distance per stimulus pair.
        On CUDA, scatter-adds make training non-deterministic.
        """
        from sklearn.utils import TransformerTags

        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        tags.target_tags.one_d_labels = True
        tags.target_tags.two_d_labels = True
        tags.transformer_tags = TransformerTags(preserves_dtype=["float64"])
        tags.input_tags.pairwise = self.distance == "precomputed"
        tags.input_tags.allow_nan = False
        tags.non_deterministic = str(self.device).startswith("cuda")
        return tags

    # --------------------------------------------------------------------- fit
    def fit(self, X, y):
        """Learn ``W`` from neural data ``X`` and feature table ``y``.

        The features go through the analyses' design diagnostics first (a warning for a
        copied, nested or strongly correlated feature, whose importance is then shared).
        Many stimuli train on mini-batches of pairs within the memory budget
        (``MLEM_NEURO_MEMORY``, default 4 GiB: 40,000 stimuli took 5 s and 40 MiB); a
        ``batch_size`` (``"full"`` or an int) or a precomputed matrix whose pairs would
        not fit is refused before any work, with a ``MemoryError`` naming the budget.

        Parameters
        ----------
        X : array (n_stimuli, n_units) | (n_stimuli, n_stimuli)
            Neural responses, or dissimilarities when ``distance="precomputed"``.
        y : DataFrame | array (n_stimuli, n_features) | array (n_stimuli,)
            Theoretical features, one row per stimulus.

        Returns
        -------
        self : MLEM
            The fitted estimator.
        """
        with use_log_level(self.verbose):
            opts = self._options()
            # the runtime of this fit, resolved once: one worker, torch's threads set for
            # the fit (the caller's again afterwards), the compiled loop on every core
            runtime = Runtime.resolve(1, opts.device)
            with runtime.torch_threads():
                return self._fit(X, y, opts, runtime)

    def _fit(self, X, y, opts, runtime):
        """:meth:`fit` with its options and :class:`~mlem_neuro.core.runtime.Runtime`."""
        dev = check_device(opts.device)
        X, table = self._check_Xy(X, y, runtime.memory_bytes)
        _check_not_constant(X, self.distance)
        _check_batch_memory(X.shape[0], opts.batch_size, runtime.memory_bytes)
        space = feature_space(opts).fit(table)
        # the analyses' design diagnostics, with what they do to the importance
        for finding in diagnose_design(table, space):
            warn_user(design_message(finding, 0))
        enc = space.transform(table)
        res = fit_stack(enc, self._targets(X, dev, runtime), opts,
                        random_state=opts.random_state, runtime=runtime)
        self.feature_space_ = space
        self.feature_names_in_ = np.array(space.feature_names_, dtype=object)
        self.terms_ = term_names(space.feature_names_, self._interaction_terms)
        self.W_ = res.W[0]
        self.n_iter_ = int(res.n_iter[0])
        self.converged_ = bool(res.converged[0])
        self.history_ = res.history[0, : self.n_iter_]
        self.train_score_ = float(res.best_score[0])
        self.batch_size_ = res.batch_size
        self.provenance_ = collect_provenance(opts.device, [res.trained_with()],
                                              runtime.compiled)
        logger.info("MLEM fit: %d stimuli, %d features, %d steps (%s), training soft "
                    "Spearman %.3f", X.shape[0], len(self.terms_), self.n_iter_,
                    "early-stopped" if self.converged_ else "max_steps reached",
                    self.train_score_)
        return self

    def _undefined_predictions(self, pairs, what, memory_bytes):
        """Whether every pair of ``pairs`` (:class:`PairFeatures`) gets the same predicted
        distance (Spearman undefined: stimuli identical in every feature, or all equally far
        apart in what ``W_`` weighs): then a warning says the ``what`` is NaN.  Equal means
        equal up to the rounding that :func:`constant_rows` allows neural distances.  The
        first :data:`MIN_BLOCK_PAIRS` pairs are looked at first, then the others a block
        at a time (of the budget ``memory_bytes``), until two predictions differ."""
        W = torch.as_tensor(self.W_, dtype=torch.float64, device=pairs.device)
        P, f = pairs.n_pairs, min(pairs.n_pairs, MIN_BLOCK_PAIRS)
        blocks = [slice(0, f)] + [slice(f + sl.start, f + sl.stop) for sl in
                                  pair_blocks(P - f, 8 * (4 * len(self.W_) + 4),
                                              memory_bytes)]
        lo, hi = math.inf, -math.inf
        for sl in blocks:
            D = pairs.distances(sl)
            q = torch.einsum("pa,ab,pb->p", D, W, D)
            lo, hi = min(lo, float(q.min())), max(hi, float(q.max()))
            if not constant_rows(torch.tensor([[lo, hi]], dtype=torch.float64))[0]:
                return False
        warn_user(f"every pair of these stimuli has the same predicted distance (stimuli "
                  f"identical in every feature the model weighs, or all equally far apart "
                  f"in them): the Spearman correlation is undefined, so the {what} is NaN. "
                  "Evaluate on stimuli that differ in their features.")
        return True

    @property
    def _interaction_terms(self):
        return bool(self.interactions) and self.constraint != "diagonal"

    def _eval_data(self, X, y, runtime):
        """Encoded features, every pair's feature distances (computed per block, on
        demand) and neural distances ``(1, n_pairs)`` of the stimuli in ``(X, y)``, on
        the call's ``runtime``."""
        self._check_is_fitted()
        dev = check_device(self.device)
        X, table = self._check_Xy(X, y, runtime.memory_bytes)
        enc_t = self.feature_space_.transform(table).to_torch(dev, torch.float64)
        target = torch.as_tensor(self._transform(X, runtime), device=dev)[None]
        return enc_t, PairFeatures(enc_t), target

    # ------------------------------------------------------------- evaluation
    def predict_rdm(self, y):
        """Predicted dissimilarity matrix ``sqrt(dᵀ W d)`` of the stimuli of ``y``.

        Parameters
        ----------
        y : DataFrame | array (n_stimuli, n_features) | array (n_stimuli,)
            Theoretical features, one row per stimulus (the columns of the fit).

        Returns
        -------
        rdm : ndarray (n_stimuli, n_stimuli)
            Symmetric, zero diagonal.  A ``MemoryError`` is raised before allocating it
            when it would exceed the memory budget (``MLEM_NEURO_MEMORY``).
        """
        self._check_is_fitted()
        budget = self._runtime().memory_bytes
        enc = self.feature_space_.transform(as_feature_table(y))
        n = enc.n_stimuli
        check_memory(8 * n * n, f"the predicted dissimilarity matrix ({n:,} x {n:,} stimuli)",
                     "predict fewer stimuli at a time", budget=budget)
        out = np.zeros((n, n))
        for sl in pair_blocks(n_pairs(n), 8 * (4 * len(self.W_) + 4), budget):
            i, j = linear_to_pair(np.arange(sl.start, sl.stop), n)
            D = enc.pair_distances(i, j)
            q = np.einsum("pa,ab,pb->p", D, self.W_, D)
            out[i, j] = out[j, i] = np.sign(q) * np.sqrt(np.abs(q))
        return out

    def transform(self, X):
        """Condensed neural dissimilarities of the stimuli in ``X`` (what the model ranks).

        Returns the ``n_stimuli * (n_stimuli - 1) / 2`` distances of the unordered pairs
        ``(i, j)``, ``i < j``, in row-major order (as :func:`scipy.spatial.distance.pdist`),
        using the estimator's ``distance``.  It needs no fitting (once fitted, ``X`` must
        have the units seen in fit).  Having it also lets MNE's meta-estimators (e.g.
        :class:`mne.decoding.SlidingEstimator`) accept MLEM.  Many pairs (beyond a quarter
        of the memory budget, ``MLEM_NEURO_MEMORY``) are computed a block at a time.

        Parameters
        ----------
        X : array (n_stimuli, n_units) | (n_stimuli, n_stimuli)
            Neural responses, or dissimilarities when ``distance="precomputed"``.

        Returns
        -------
        distances : ndarray (n_stimuli * (n_stimuli - 1) / 2,)
            The neural distance of each pair.
        """
        return self._transform(X, self._runtime())

    def _transform(self, X, runtime):
        """:meth:`transform` on ``runtime`` (its memory budget and compiled kernels)."""
        budget = runtime.memory_bytes
        X = self._check_X(X, budget=budget)
        if (self.distance != "precomputed" and hasattr(self, "n_features_in_")
                and X.shape[1] != self.n_features_in_):
            raise ValueError(f"X has {X.shape[1]} features, but MLEM is expecting "
                             f"{self.n_features_in_} features as input (the units seen in "
                             "fit); pass the same units as in fit.")
        dev = check_device(self.device)
        n = X.shape[0]
        P = n_pairs(n)
        if 8 * (n * n + 8 * P) <= budget // 4:     # Gram + a few pair vectors
            i, j = pair_indices(n)
            return self._targets(X, dev, runtime).take(np.arange(P), i, j)[0].cpu().numpy()
        # too many pairs to build at once: one block of pairs at a time
        check_memory(8 * P, f"the neural distances of {P:,} stimulus pairs",
                     "pass fewer stimuli", budget=budget)
        out = np.empty(P)
        if self.distance == "precomputed":
            for sl in pair_blocks(P, 32, budget):
                out[sl] = X[linear_to_pair(np.arange(sl.start, sl.stop), n)]
            return out
        metric = get_distance(self.distance)
        Z = preprocess_rows(torch.as_tensor(X[None], device=dev), metric)
        gram = 8 * n * n <= budget // 4      # same values as the all-pairs path
        if gram:
            G = Z @ Z.transpose(-1, -2)
            sq = G.diagonal(dim1=-2, dim2=-1)
        for sl in pair_blocks(P, 8 * (3 * X.shape[1] + 6), budget):
            i, j = (torch.as_tensor(a, device=dev)
                    for a in linear_to_pair(np.arange(sl.start, sl.stop), n))
            if gram:
                d2 = sq[:, i] + sq[:, j] - 2.0 * G[:, i, j]
            else:
                diff = Z[:, i] - Z[:, j]
                d2 = (diff * diff).sum(-1)
            out[sl] = metric.finish(d2)[0].cpu().numpy()
        return out

    @limit_threads
    def score(self, X, y):
        """Exact (tie-aware) Spearman ρ between predicted and neural distances.

        Computed over all unordered pairs of the stimuli in ``(X, y)``; for held-out
        evaluation pass held-out stimuli only.  Many pairs (e.g. 8,000 stimuli, 32 million
        pairs) are processed in blocks within the memory budget (``MLEM_NEURO_MEMORY``,
        default 4 GiB).

        Parameters
        ----------
        X : array (n_stimuli, n_units) | (n_stimuli, n_stimuli)
            Neural responses, or dissimilarities when ``distance="precomputed"``.
        y : DataFrame | array (n_stimuli, n_features) | array (n_stimuli,)
            Theoretical features, one row per stimulus.

        Returns
        -------
        score : float
            Spearman ρ over the pairs; NaN, with a warning, when it is undefined: every
            pair has the same neural distance, or the same predicted distance (e.g.
            stimuli identical in every feature).
        """
        with use_log_level(self.verbose):
            runtime = self._runtime()
            _, pairs, target = self._eval_data(X, y, runtime)
            if _undefined(target, "score") or self._undefined_predictions(
                    pairs, "score", runtime.memory_bytes):
                return float("nan")
            k, l = term_index(len(self.feature_names_in_), True)
            return float(baseline_scores(self.W_[None], pairs, target, k, l, runtime)[0])

    @fill_doc
    @limit_threads
    def permutation_importance(self, X, y, n_permutations=None, level="feature",
                               random_state=None):
        """Permutation importance of each term (or feature) on the pairs of ``(X, y)``.

        Like :meth:`score`, many pairs are processed in blocks within the memory budget
        (``MLEM_NEURO_MEMORY``); each permutation then costs about one sort of the pairs
        (or, for categorical features, one pass over them).

        Parameters
        ----------
        X : array (n_stimuli, n_units) | (n_stimuli, n_stimuli)
            Neural responses (or dissimilarities) of the evaluation stimuli (held-out
            stimuli for an unbiased estimate).
        y : DataFrame | array (n_stimuli, n_features) | array (n_stimuli,)
            Their theoretical features.
        n_permutations : int | None
            Permutations per term; ``None`` uses the estimator's ``n_permutations``.
        %(level)s
        random_state : None | int | Generator
            Seeds the permutations; ``None`` uses the estimator's ``random_state``.

        Returns
        -------
        DataFrame
            Indexed by term (name ``"term"``), with columns ``importance`` (mean drop of
            Spearman ρ), ``importance_perm_std`` (its spread across permutations: how
            much the shuffles disagree, not a standard error of the importance; named as
            the analyses' ``importance_fold_std``, the spread across folds) and
            ``kind`` (``"feature"`` or ``"interaction"``); ``attrs["baseline_score"]``
            holds the unpermuted score.  ``df["std_permutations"]``, the column's
            former name, still reads it (deprecated; a FutureWarning).
        """
        with use_log_level(self.verbose):
            n_perm = self.n_permutations if n_permutations is None else n_permutations
            n_perm = check("n_permutations", n_perm)
            check("level", level)
            rng = check_random_state(self.random_state if random_state is None
                                     else random_state)
            runtime = self._runtime()
            enc_t, pairs, target = self._eval_data(X, y, runtime)
            undefined = (_undefined(target, "permutation importance")
                         or self._undefined_predictions(pairs, "permutation importance",
                                                        runtime.memory_bytes))
            names = list(self.feature_names_in_)
            if level == "term":
                warn_unidentifiable_terms(self.feature_space_.transform(as_feature_table(y)),
                                          self._interaction_terms)
                k, l = term_index(len(names), self._interaction_terms)
                drops, base = term_importance(self.W_[None], pairs, target, k, l, n_perm,
                                              rng, runtime=runtime)
                index = term_names(names, self._interaction_terms)
                kinds = ["feature" if a == b else "interaction" for a, b in zip(k, l)]
            else:
                drops, base = feature_importance(self.W_[None], enc_t, None, None, target,
                                                 n_perm, rng, runtime=runtime)
                index, kinds = names, ["feature"] * len(names)
            d = drops[0].cpu().numpy()
            if undefined:
                d, base = np.full_like(d, np.nan), np.full(1, np.nan)
            df = _ImportanceFrame({"importance": d.mean(axis=1),
                                   "importance_perm_std": (d.std(axis=1, ddof=1)
                                                           if n_perm > 1
                                                           else np.zeros(len(d))),
                                   "kind": kinds},
                                  index=pd.Index(index, name="term"))
            df.attrs.update(baseline_score=float(base[0]), n_permutations=n_perm, level=level)
            return df


class _ImportanceFrame(pd.DataFrame):
    """The table of :meth:`MLEM.permutation_importance`: a DataFrame whose renamed column
    still reads under its former name for a release (with a FutureWarning); anything
    derived from it is a plain DataFrame."""

    _RENAMED = {"std_permutations": "importance_perm_std"}

    @property
    def _constructor(self):
        return pd.DataFrame

    def _renamed(self, key):
        if isinstance(key, str) and key in self._RENAMED and key not in self.columns:
            new = self._RENAMED[key]
            warn_user(f"permutation_importance: the column {key!r} is renamed {new!r} "
                      f"(one name for the spread across permutations); {key!r} will be "
                      "removed in a future release.", FutureWarning)
            return new
        return key

    def __getitem__(self, key):
        return super().__getitem__(self._renamed(key))

    def __getattr__(self, name):
        if name in _ImportanceFrame._RENAMED:
            return self[name]
        return super().__getattr__(name)


def _undefined(target, what):
    """Whether the neural distances ``target (1, P)`` are all equal (Spearman undefined):
    then a warning says the ``what`` is NaN."""
    if not constant_rows(target)[0]:
        return False
    warnings.warn(f"every pair of these stimuli has the same neural distance (flat or "
                  f"identical patterns, or a constant dissimilarity matrix): the Spearman "
                  f"correlation is undefined, so the {what} is NaN.", UserWarning,
                  stacklevel=4)
    return True


def _check_batch_memory(n, batch_size, budget):
    """Refuse, before any work, a ``batch_size`` (``"full"`` or an int) whose training steps
    would exceed the memory budget ``budget`` (the fit's runtime's; ``"auto"`` takes
    mini-batches of at most 2**18 pairs)."""
    if batch_size == "auto":
        return
    P = n_pairs(n)
    b = P if batch_size == "full" else min(int(batch_size), P)
    check_memory(TRAIN_PAIR_BYTES * b,
                 f"training on {'all' if b == P else 'batches of ' + format(b, ',') + ' of'} "
                 f"the {P:,} pairs of {n:,} stimuli (batch_size={batch_size!r}, about "
                 f"{TRAIN_PAIR_BYTES} bytes a pair)",
                 "use batch_size='auto' (mini-batches of pairs) or a smaller batch_size",
                 budget=budget)


def _check_not_constant(X, distance):
    """Refuse neural data whose distances are all equal: there is nothing to fit."""
    if distance == "precomputed":
        off = X[~np.eye(len(X), dtype=bool)]
        flat = off.size == 0 or np.ptp(off) == 0
    else:
        flat = not np.ptp(X, axis=0).any()
    if flat:
        raise ValueError("every pair of stimuli has the same neural distance (all patterns "
                         "identical, or a constant dissimilarity matrix): MLEM has nothing "
                         "to fit. Check the data (a flat channel set, a time point without "
                         "signal, repeated trials).")


def _check_same_index(X, y):
    """Refuse pandas X and y whose indexes disagree (rows are matched by position)."""
    ix = X.index if isinstance(X, (pd.DataFrame, pd.Series)) else None
    iy = y.index if isinstance(y, (pd.DataFrame, pd.Series)) else None
    if ix is None or iy is None or ix.equals(iy):
        return
    if len(ix) == len(iy) and set(ix) == set(iy):
        fix = "reorder one to match the other, e.g. y = y.loc[X.index]"
    else:
        fix = "align them first, e.g. y = y.loc[X.index]"
    raise ValueError("X and y are pandas objects whose indexes disagree; MLEM matches "
                     f"stimuli by position, so the rows would be mismatched: {fix} (or pass "
                     "numpy arrays if the order is already right).")
