"""Are interactions real?  A permutation test of non-additivity.

With binary feature distances, ``W = diag(w) + λ w wᵀ`` ranks every pair the same for all
``λ ≥ 0``, so the interaction terms of a fitted ``W`` are not evidence of interactions.
What is identifiable is whether *any* additive (diagonal) metric explains the neural
ranking.  :func:`interaction_test` measures it:

* **Statistic**: the fold-mean held-out Spearman of the model with interactions (the
  options' ``constraint``, ``"spd"`` by default) minus that of the diagonal model (FR-RSA),
  on the same folds.  Larger means the interactions predict held-out pairs better than
  the best additive metric.
* **Null** (Freedman & Lane's residual permutation under the reduced model, with Mantel
  permutations of stimuli): the diagonal model is fitted on all stimuli, the neural
  distances' ranks ``r`` are regressed isotonically (monotone, as the model is only defined
  up to a monotone map) on its prediction ``q``: ``g = iso(r | q)``, ``R = r − g``.  A null
  dataset is ``g + R[π, π]`` for a random permutation ``π`` of the stimuli: the additive
  structure (main effects) is kept, the part the additive model leaves out is moved to
  other stimuli whole (so pairs that share a stimulus keep their dependence).  Every null
  dataset goes through the same cross-validated comparison.

Replicate ``0`` is the identity permutation (``g + R = r``, the observed ranks), so the
observed and null statistics come from one stack: the null datasets of every model are
more members of the stacks that :func:`~mlem_neuro.crossval.run_cv` fits, and replicate
``b`` uses the same permutation for every model (a max over models gives family-wise
error control).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..utils import check_random_state, logger
from .engine import fit_stack
from .features import as_feature_table
from .metric import predict, term_index, term_matrix, term_weights
from .neural import NeuralTargets
from .options import MLEMOptions, _is_int
from .pairs import pair_indices
from .spearman import rankdata

__all__ = ["interaction_test"]


def _pair_lin(a, b, n):
    """Linear :func:`~mlem_neuro.core.pairs.pair_indices` index of pairs ``{a, b}``."""
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return lo * n - lo * (lo + 1) // 2 + hi - lo - 1


def isotonic_fit(y, x):
    """Non-decreasing least-squares fit of each row of ``y`` on the same row of ``x``.

    Tied ``x`` values get one fitted value (their mean is fitted, weighted by their
    count: the "secondary" treatment of ties).  Rows are solved together with the pool
    adjacent violators kernel of :mod:`torchsort`.

    Parameters
    ----------
    y, x : ndarray (M, P)

    Returns
    -------
    fitted : ndarray (M, P)
    """
    from torchsort import ops

    y = np.asarray(y, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, axis=1, kind="stable")
    xs = np.take_along_axis(x, order, axis=1)
    ys = np.take_along_axis(y, order, axis=1)
    # average y over runs of tied x (a run of equal values stays equal in the solution)
    new = np.ones_like(xs, dtype=bool)
    new[:, 1:] = xs[:, 1:] != xs[:, :-1]
    run = np.cumsum(new, axis=1) - 1
    rows = np.arange(y.shape[0])[:, None]
    sums = np.zeros_like(ys)
    counts = np.zeros_like(ys)
    np.add.at(sums, (np.broadcast_to(rows, run.shape), run), ys)
    np.add.at(counts, (np.broadcast_to(rows, run.shape), run), 1.0)
    ys = (sums / np.maximum(counts, 1))[rows, run]
    # torchsort's kernel solves the non-increasing problem: fit -y
    vs = -ops.isotonic_l2["cpu"](torch.as_tensor(-ys)).numpy()
    fitted = np.empty_like(vs)
    np.put_along_axis(fitted, order, vs, axis=1)
    return fitted


class NullRDMSource:
    """RDM source of observed and residual-permuted neural ranks (see the module).

    Model ``k`` of this source is replicate ``k % n_rep`` of model ``k // n_rep`` of the
    original source: replicate ``0`` serves the observed ranks, replicate ``b`` the ranks
    ``g + R[π_b, π_b]``.

    Parameters
    ----------
    ranks : ndarray (M, n_pairs)
        Ranks of the neural distances over all pairs of the ``n`` stimuli.
    fitted : ndarray (M, n_pairs)
        The additive (isotonic) fit ``g`` of ``ranks``.
    perms : ndarray of int (n_rep, n)
        Stimulus permutations; ``perms[0]`` is the identity.
    models : ndarray of int | None
        Row of ``ranks`` / ``fitted`` of each model of this source (default all
        ``M × n_rep``, replicate-minor).
    reps : ndarray of int | None
        Replicate of each model of this source.
    """

    def __init__(self, ranks, fitted, perms, models=None, reps=None):
        self.ranks, self.fitted, self.perms = ranks, fitted, perms
        if models is None:
            n_rep = perms.shape[0]
            models = np.repeat(np.arange(ranks.shape[0]), n_rep)
            reps = np.tile(np.arange(n_rep), ranks.shape[0])
        self.models, self.reps = np.asarray(models), np.asarray(reps)

    @property
    def n_models(self):
        return len(self.models)

    @property
    def n_stimuli(self):
        return self.perms.shape[1]

    def subset(self, models):
        """The source of ``models`` only, keeping just the rows they use."""
        rows, inv = np.unique(self.models[models], return_inverse=True)
        return NullRDMSource(self.ranks[rows], self.fitted[rows], self.perms, inv,
                             self.reps[models])

    def rdm(self, stimuli, device="cpu"):
        """Ranks ``(n_models, n_pairs)`` between ``stimuli`` (see
        :class:`~mlem_neuro.core.sources.RDMSource`)."""
        s = np.asarray(stimuli)
        n = self.n_stimuli
        i, j = pair_indices(len(s))
        lin = _pair_lin(s[i], s[j], n)
        out = self.fitted[self.models[:, None], lin[None, :]]
        pi = self.perms[self.reps]                                  # (K, n)
        lin_p = _pair_lin(pi[:, s[i]], pi[:, s[j]], n)
        out += self.ranks[self.models[:, None], lin_p] - self.fitted[self.models[:, None],
                                                                     lin_p]
        observed = self.reps == 0          # exactly the observed ranks (no rounding)
        out[observed] = self.ranks[self.models[observed][:, None], lin[None, :]]
        return torch.as_tensor(out, dtype=torch.float64, device=device)


def _check_inputs(source, table, options, n_null):
    for attr in ("n_models", "n_stimuli", "subset", "rdm"):
        if not hasattr(source, attr):
            raise TypeError("source must be an RDM source (n_models, n_stimuli, "
                            "subset(models), rdm(stimuli, device)), e.g. a "
                            "mlem_neuro.core.sources.DenseRDMSource; got "
                            f"{type(source).__name__} without {attr!r}.")
    if not isinstance(options, MLEMOptions):
        raise TypeError("options must be an MLEMOptions (mlem_neuro.core.options); got "
                        f"{type(options).__name__}.")
    if not _is_int(n_null):
        raise TypeError(f"n_null must be an int >= 1 (null permutations); got {n_null!r}.")
    if n_null < 1:
        raise ValueError(f"n_null must be >= 1 null permutations (99 or more for a test at "
                         f"0.05 with some power); got {n_null}.")
    if len(table) != source.n_stimuli:
        raise ValueError(f"the feature table has {len(table)} rows but the data have "
                         f"{source.n_stimuli} stimuli; they must match one-to-one.")
    if options.constraint == "diagonal":
        raise ValueError("interaction_test compares a model with interactions against the "
                         "diagonal (additive) one; options has constraint='diagonal'. Use "
                         "constraint='spd' (or 'none').")
    space = options.feature_space().fit(table)
    if len(space.feature_names_) < 2:
        raise ValueError("interaction_test needs at least 2 features (an interaction is "
                         f"between features); got {space.feature_names_}.")
    return space


def _reduced_fit(source, space, table, options, seed):
    """Observed ranks and their additive (diagonal-model, isotonic) fit over all pairs."""
    n = source.n_stimuli
    enc = space.transform(table)
    dev = torch.device(options.device)
    rdm = source.rdm(np.arange(n), dev)
    ranks = rankdata(rdm).cpu().numpy()
    diag = dataclasses.replace(options, constraint="diagonal", interactions=False)
    fit = fit_stack(enc, NeuralTargets.from_rdm(rdm, n, dev), diag,
                    random_state=np.random.default_rng(seed))
    k, l = term_index(enc.n_features, False)
    D = enc.to_torch("cpu", torch.float64).pair_distances(*map(torch.as_tensor,
                                                               pair_indices(n)))
    q = term_weights(torch.as_tensor(fit.W), k, l) @ term_matrix(D, k, l).T
    return ranks, isotonic_fit(ranks, predict(q, "diagonal").numpy())


def interaction_test(source, features, options, *, groups=None, n_null, random_state=None):
    """Permutation test of non-additivity: is the geometry explained by an additive metric?

    The statistic of each model is the fold-mean held-out Spearman of the model with
    interactions (``options.constraint``, ``"spd"`` or ``"none"``) minus that of the
    diagonal model (FR-RSA), over the folds of ``options.cv``.  The null keeps the
    additive structure: the diagonal model is fitted on all stimuli, the neural ranks are
    fitted isotonically on its prediction, and the residual ranks are permuted with the
    stimuli (Freedman & Lane's scheme with Mantel permutations; see
    :mod:`mlem_neuro.core.additivity`).  Each null dataset goes through the same
    cross-validated comparison; the null datasets of all models are fitted in the same
    stacks as the observed ones.

    Parameters
    ----------
    source : RDMSource
        Neural distances of ``M`` models (:mod:`mlem_neuro.core.sources`).
    features : DataFrame
        Feature table, one row per stimulus of ``source`` (at least 2 features).
    options : MLEMOptions
        Training and analysis options; ``cv`` defines the folds (the same folds as
        :func:`~mlem_neuro.crossval.run_cv` with the same options when
        ``options.random_state`` is an int), ``constraint`` the model with interactions.
        ``level`` and ``n_permutations`` are not used.
    groups : array-like | None
        One label per stimulus: folds never split a group.  Permutations of stimuli are
        not restricted by groups.
    n_null : int
        Number of null datasets (random stimulus permutations).
    random_state : None | int | numpy Generator
        Seeds the permutations (and the training, when ``options.random_state`` is not an
        int).

    Returns
    -------
    observed : ndarray (M,)
        Statistic of each model (larger: more evidence of non-additivity).
    null : ndarray (n_null, M)
        Statistic of each null dataset; row ``b`` uses the same stimulus permutation for
        every model.  The p-value of model ``m`` is
        ``(1 + (null[:, m] >= observed[m]).sum()) / (1 + n_null)``.

    Notes
    -----
    Cost: two cross-validated fits (with and without interactions) of ``M × (n_null + 1)``
    models plus one diagonal fit of ``M`` models on all stimuli.
    """
    from ..crossval import check_cv, run_cv

    table = as_feature_table(features, name="features")
    space = _check_inputs(source, table, options, n_null)
    n, M = source.n_stimuli, source.n_models
    rng = check_random_state(random_state)
    folds = check_cv(options.cv, n, check_random_state(options.random_state), groups)
    seed = (options.random_state if _is_int(options.random_state)
            else int(rng.integers(2**31 - 1)))
    perms = np.stack([np.arange(n)] + [rng.permutation(n) for _ in range(n_null)])
    logger.info("interaction test: %d model(s) x %d null permutations", M, n_null)
    ranks, fitted = _reduced_fit(source, space, table, options, seed)
    null_source = NullRDMSource(ranks, fitted, perms)
    common = dict(cv=folds, random_state=seed, level="feature", n_permutations=1)
    scores = []
    for constraint in (options.constraint, "diagonal"):
        opts = dataclasses.replace(options, constraint=constraint,
                                   interactions=constraint != "diagonal", **common)
        out = run_cv(null_source, table, opts, groups=groups,
                     desc="interaction-test models")
        scores.append(out.score.mean(axis=0).reshape(M, n_null + 1))
    stat = scores[0] - scores[1]
    return stat[:, 0], np.ascontiguousarray(stat[:, 1:].T)
