"""The :class:`MLEM` estimator: one model, scikit-learn contract."""
from __future__ import annotations


import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator

from .core.engine import fit_stack
from .core.features import as_feature_table
from .core.importance import baseline_scores, feature_importance, term_importance
from .core.metric import CONSTRAINTS, term_index, term_names
from .core.neural import METRICS, NeuralTargets
from .core.options import MLEMOptions
from .core.pairs import pair_indices
from .utils import (check_device, check_float, check_int, check_option, check_random_state,
                    logger, use_log_level)

DISTANCES = METRICS + ("precomputed",)
#: estimator parameters that are MLEM options (validated by MLEMOptions).
_OPTION_PARAMS = ("constraint", "interactions", "distance", "n_permutations", "max_steps",
                  "patience", "lr", "tol", "batch_size", "feature_kinds", "feature_groups",
                  "missing_distance", "device", "random_state")


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
    constraint : {"spd", "diagonal", "none"}
        ``"spd"``: symmetric positive definite ``W`` (MLEM). ``"diagonal"``: positive
        feature weights, no interactions (FR-RSA). ``"none"``: symmetric ``W`` without the
        SPD constraint (FR-RSA with interactions).
    interactions : bool
        Model feature interactions (off-diagonal ``W``).  ``False`` restricts ``W`` to its
        diagonal; importance then has one row per feature.
    distance : {"euclidean", "correlation", "cosine", "precomputed"}
        Neural distance between stimuli.  With ``"precomputed"``, ``X`` is a symmetric
        ``(n_stimuli, n_stimuli)`` dissimilarity matrix (its diagonal is ignored).
    n_permutations : int
        Default number of permutations for :meth:`permutation_importance`.
    max_steps : int
        Maximum training steps.
    patience : int
        Stop when the training (soft) Spearman has not improved for this many steps; the best
        state is restored.
    lr : float
        AdamW learning rate (no weight decay).
    tol : float
        Minimum improvement of the training Spearman that resets ``patience`` (default
        ``1e-4``).  With full-batch training the soft Spearman keeps creeping up by tiny
        amounts; with ``tol=0`` training then nearly always runs ``max_steps``.
    batch_size : "auto" | "full" | int
        Pairs per step. ``"auto"`` runs the batch-size selection of the MLEM paper
        (correlation stability of feature distances across 64 batches) and uses every pair
        when they fit in one batch.
    feature_kinds : dict | None
        Override inferred feature kinds, ``{column: "categorical" | "ordinal" | "numeric"}``.
    feature_groups : dict | None
        Multi-column features ``{name: [columns]}`` compared with the Euclidean distance.
    missing_distance : float | dict
        Feature distance of a pair in which either stimulus lacks the value (NaN): ``0``
        by default (the paper's choice); a dict sets it per feature.
    device : str
        ``"cpu"`` or ``"cuda"``; training runs in float32 there, scores in float64.
    random_state : None | int | numpy Generator
        Seeds batch sampling (and default importance permutations).
    verbose : bool | str | int | None
        Logging level for the calls of this estimator.

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
    """

    def __init__(self, constraint="spd", interactions=True, distance="euclidean",
                 n_permutations=10, max_steps=1000, patience=50, lr=0.1, tol=1e-4,
                 batch_size="auto", feature_kinds=None, feature_groups=None,
                 missing_distance=0.0, device="cpu", random_state=None, verbose=None):
        self.constraint = constraint
        self.interactions = interactions
        self.distance = distance
        self.n_permutations = n_permutations
        self.max_steps = max_steps
        self.patience = patience
        self.lr = lr
        self.tol = tol
        self.batch_size = batch_size
        self.feature_kinds = feature_kinds
        self.feature_groups = feature_groups
        self.missing_distance = missing_distance
        self.device = device
        self.random_state = random_state
        self.verbose = verbose

    # ------------------------------------------------------------------ checks
    def _options(self):
        """The estimator's parameters as validated :class:`MLEMOptions`."""
        kw = {name: getattr(self, name) for name in _OPTION_PARAMS}
        return MLEMOptions(allow_precomputed=True, cv=None, **kw)

    def _check_params(self):
        return check_device(self._options().device)

    def _check_X(self, X, n_rows=None):
        if isinstance(X, (pd.DataFrame, pd.Series)):
            X = X.to_numpy()
        try:
            X = np.asarray(X, dtype=float)
        except (TypeError, ValueError):
            raise TypeError("X must be a numeric array (n_stimuli, n_units); got "
                            f"{type(X).__name__}") from None
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

    def _check_Xy(self, X, y):
        _check_same_index(X, y)
        table = as_feature_table(y)
        return self._check_X(X, n_rows=len(table)), table

    def _targets(self, X, dev):
        if self.distance == "precomputed":
            n = X.shape[0]
            return NeuralTargets.from_rdm(X[np.triu_indices(n, k=1)], n, dev)
        return NeuralTargets.from_data(X[None], self.distance, dev)

    def _check_is_fitted(self):
        if not hasattr(self, "W_"):
            raise RuntimeError("This MLEM instance is not fitted yet; call fit(X, y) first.")

    # --------------------------------------------------------------------- fit
    def fit(self, X, y):
        """Learn ``W`` from neural data ``X`` and feature table ``y``.

        Parameters
        ----------
        X : array (n_stimuli, n_units) | (n_stimuli, n_stimuli)
            Neural responses, or dissimilarities when ``distance="precomputed"``.
        y : DataFrame | array (n_stimuli, n_features) | array (n_stimuli,)
            Theoretical features, one row per stimulus.

        Returns
        -------
        self
        """
        with use_log_level(self.verbose):
            opts = self._options()
            dev = check_device(opts.device)
            X, table = self._check_Xy(X, y)
            space = opts.feature_space().fit(table)
            enc = space.transform(table)
            res = fit_stack(enc, self._targets(X, dev), opts,
                            random_state=opts.random_state)
            self.feature_space_ = space
            self.feature_names_in_ = np.array(space.feature_names_, dtype=object)
            self.terms_ = term_names(space.feature_names_, self._interaction_terms)
            self.W_ = res.W[0]
            self.n_iter_ = int(res.n_iter[0])
            self.converged_ = bool(res.converged[0])
            self.history_ = res.history[0, : self.n_iter_]
            self.train_score_ = float(res.best_score[0])
            self.batch_size_ = res.batch_size
            logger.info("MLEM fit: %d stimuli, %d features, %d steps (%s), training soft "
                        "Spearman %.3f", X.shape[0], len(self.terms_), self.n_iter_,
                        "early-stopped" if self.converged_ else "max_steps reached",
                        self.train_score_)
        return self

    @property
    def _interaction_terms(self):
        return bool(self.interactions) and self.constraint != "diagonal"

    def _eval_data(self, X, y):
        """Encoded features, pairs and neural distances of the stimuli in (X, y)."""
        self._check_is_fitted()
        dev = check_device(self.device)
        X, table = self._check_Xy(X, y)
        enc = self.feature_space_.transform(table)
        n = X.shape[0]
        i, j = pair_indices(n)
        target = self._targets(X, dev).take(np.arange(len(i)), i, j)
        return enc.to_torch(dev, torch.float64), i, j, target

    # ------------------------------------------------------------- evaluation
    def predict_rdm(self, y):
        """Predicted dissimilarity matrix ``sqrt(dᵀ W d)`` (n_stimuli, n_stimuli) for ``y``."""
        self._check_is_fitted()
        enc = self.feature_space_.transform(as_feature_table(y))
        n = enc.n_stimuli
        i, j = pair_indices(n)
        D = enc.pair_distances(i, j)
        q = np.einsum("pa,ab,pb->p", D, self.W_, D)
        out = np.zeros((n, n))
        out[i, j] = out[j, i] = np.sign(q) * np.sqrt(np.abs(q))
        return out

    def transform(self, X):
        """Condensed neural dissimilarities of the stimuli in ``X`` (what the model ranks).

        Returns the ``n_stimuli * (n_stimuli - 1) / 2`` distances of the unordered pairs
        ``(i, j)``, ``i < j``, in row-major order (as :func:`scipy.spatial.distance.pdist`),
        using the estimator's ``distance``.  It needs no fitting.  Having it also lets MNE's
        meta-estimators (e.g. :class:`mne.decoding.SlidingEstimator`) accept MLEM.
        """
        X = self._check_X(X)
        dev = check_device(self.device)
        n = X.shape[0]
        i, j = pair_indices(n)
        return self._targets(X, dev).take(np.arange(len(i)), i, j)[0].cpu().numpy()

    def score(self, X, y):
        """Exact (tie-aware) Spearman ρ between predicted and neural distances.

        Computed over all unordered pairs of the stimuli in ``(X, y)``; for held-out
        evaluation pass held-out stimuli only.
        """
        with use_log_level(self.verbose):
            enc_t, i, j, target = self._eval_data(X, y)
            k, l = term_index(len(self.feature_names_in_), True)
            D = enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j))
            return float(baseline_scores(self.W_[None], D, target, k, l)[0])

    def permutation_importance(self, X, y, n_permutations=None, level="term",
                               random_state=None):
        """Permutation importance of each term (or feature) on the pairs of ``(X, y)``.

        Parameters
        ----------
        X, y
            Evaluation stimuli (held-out stimuli for an unbiased estimate).
        n_permutations : int | None
            Permutations per term; ``None`` uses the estimator's ``n_permutations``.
        level : {"term", "feature"}
            ``"term"``: permute each term ``P_kk = d_k²`` / ``P_kl = 2 d_k d_l`` across pairs
            (one row per feature and, with interactions, per interaction ``"f:g"``).
            ``"feature"``: permute a feature's values across stimuli; measures its total
            effect, interactions included (one row per feature).
        random_state : None | int | Generator
            Seeds the permutations; ``None`` uses the estimator's ``random_state``.

        Returns
        -------
        DataFrame
            Indexed by term (name ``"term"``), with columns ``importance`` (mean drop of
            Spearman ρ), ``std`` (across permutations) and ``kind`` (``"feature"`` or
            ``"interaction"``); ``attrs["baseline_score"]`` holds the unpermuted score.
        """
        with use_log_level(self.verbose):
            n_perm = self.n_permutations if n_permutations is None else n_permutations
            n_perm = check_int("n_permutations", n_perm, 1)
            check_option("level", level, ("term", "feature"))
            rng = check_random_state(self.random_state if random_state is None
                                     else random_state)
            enc_t, i, j, target = self._eval_data(X, y)
            names = list(self.feature_names_in_)
            if level == "term":
                k, l = term_index(len(names), self._interaction_terms)
                D = enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j))
                drops, base = term_importance(self.W_[None], D, target, k, l, n_perm, rng)
                index = term_names(names, self._interaction_terms)
                kinds = ["feature" if a == b else "interaction" for a, b in zip(k, l)]
            else:
                drops, base = feature_importance(self.W_[None], enc_t, i, j, target, n_perm,
                                                 rng)
                index, kinds = names, ["feature"] * len(names)
            d = drops[0].cpu().numpy()
            df = pd.DataFrame({"importance": d.mean(axis=1),
                               "std": d.std(axis=1, ddof=1) if n_perm > 1 else np.zeros(len(d)),
                               "kind": kinds},
                              index=pd.Index(index, name="term"))
            df.attrs.update(baseline_score=float(base[0]), n_permutations=n_perm, level=level)
            return df


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
