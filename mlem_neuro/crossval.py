"""Cross-validated MLEM over a stack of models: the driver every analysis shares.

For each fold the feature encoding is fitted on the training stimuli, all models are trained
on pairs of training stimuli (in chunks of models, each chunk one :func:`fit_stack` call),
then scored and permuted on pairs of held-out stimuli.  Chunks go through joblib, so
``joblib.parallel_config(backend="dask")`` spreads them over a cluster; each chunk uses its
fold's seed derived from ``random_state`` (every chunk of a fold draws the same batches and
permutations), so results do not depend on ``n_jobs`` or chunking.  What training needs
before any model (groups of identical term rows, the batch size) is computed once per fold
and shared by the fold's chunks.

Neural distances come from an *RDM source* (:class:`~mlem_neuro.core.rdms.sources.RDMSource`):
any object with ``n_models``, ``n_stimuli``, ``subset(models)`` (a picklable source of those
models only) and ``rdm(stimuli, device)`` returning an ``(n_models, n_pairs)`` tensor of
distances between the given stimuli (pairs in :func:`~mlem_neuro.core.stimuli.pairs.pair_indices`
order).  :mod:`mlem_neuro.core.rdms.sources` holds the dense and the sphere/region sources
(:class:`DenseRDMSource` is re-exported here).
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import math
import numbers
import threading
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from joblib import effective_n_jobs

from . import _projection
from .core.checks import check
from .core.constants import (  # noqa: F401  (tuning constants, defined there once)
    AUTO_FOLDS,
    AUTO_REFERENCE_FOLDS,
    AUTO_REFERENCE_MODELS,
    AUTO_REFERENCE_STIMULI,
    AUTO_TEST_FOLDS,
    CHUNK_BYTES,
    MAIN_EFFECT_NULLS,
    MAIN_EFFECT_NULLS_SHARE,
    MAX_CHUNK_MODELS,
    MAX_SPLIT_DRAWS,
    SPLITS_PER_REPEAT,
)
from .core.constants import (
    FAST_NULL_ARRAYS as _FAST_NULL_ARRAYS,
)
from .core.constants import (
    NULL_COLUMNS_BYTES as _COLUMNS_BYTES,
)
from .core.jobs import run_jobs as _run_jobs
from .core.options import MLEMOptions, cv_description, jsonable
from .core.ranks.spearman import SubsetRanks, constant_rows, rankdata
from .core.rdms.neural import NeuralTargets
from .core.rdms.sources import (  # noqa: F401
    DenseRDMSource,
    RDMSource,
    SphereRDMSource,
    with_runtime,
)
from .core.runtime import Runtime, available_cores, run_with
from .core.scoring import fastnull
from .core.scoring.importance import (
    feature_importance,
    term_importance,
    warn_unidentifiable_terms,
)
from .core.scoring.main_effect import combine, main_effect_tests, pair_columns
from .core.scoring.nulls import (
    null_design,
    null_permutations,
    permutation_pvalues,
    permuted_pairs,
)
from .core.stimuli.design import diagnose_design, warn_design
from .core.stimuli.features import as_feature_table, feature_space
from .core.stimuli.pairs import kfold_stimuli, n_pairs, pair_indices
from .core.training.engine import PairSetup, fit_stack
from .core.training.metric import term_index, term_names
from .utils import check_device, check_random_state, logger, warn_user


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
    fold_null : (n_test_folds, M, n_tests, n_null) | None
        Test statistics of the null models (``n_null > 0``), for the tests ``"score"``
        and each feature in turn, in the first :attr:`n_test_folds` folds.
    n_test_folds : int
        The folds the tests read, the first ones (:func:`tested_folds`): their observed
        statistics are means over these folds, as their null statistics are.
    n_feature_test_folds : int
        With the staged feature test, the folds the features' importance reads where the
        gate opened (every fold when their null models can be built alike in every fold,
        else :attr:`n_test_folds`); 0 without staging.
    gated_null : (models (K,), null (folds, K, n_features, n_null)) | None
        The staged test's features' null statistics per fold in the ``K`` models where
        the gate opened.
    tests : dict
        ``name -> (observed (M,), null (n_null, M))`` fold-mean statistics of every test
        (empty when ``n_null = 0``); :meth:`pvalues` turns them into p-values, and one
        more test is one more entry.
    untestable : dict
        ``test name -> reason`` of the tests whose null cannot move what they test
        (:func:`~mlem_neuro.core.scoring.nulls.null_design`): their p-values are NaN.
    held_out_pairs : str
        The held-out pairs that scored every fold: ``"all"`` or ``"between_groups"``
        (:func:`held_out_columns`).
    training : set of (str, float, int)
        What trained the models, the null models and the test of interactions' fits
        included: the ``(backend, lr, patience)`` of each fit
        (:meth:`~mlem_neuro.core.training.stackfit.StackFit.trained_with`), gathered from
        what the chunks return; a result records it in its provenance
        (:func:`result_tests`, :mod:`mlem_neuro._provenance`).
    compiled : bool | None
        Whether the compiled kernels were on (the runtime's
        :attr:`~mlem_neuro.core.runtime.Runtime.compiled`), which the result records.
    interaction_seed : int | None
        With tests of a model with interactions, the seed of the test of interactions
        that :func:`mlem_neuro.inference.run_analysis` adds to :attr:`tests`.
    n_repeats_capped : str | None
        Why fewer repeats of an int ``cv`` were run than ``n_repeats`` asked for (fewer
        distinct splits exist, :func:`check_cv`); ``None`` when none were left out.
    main_effect : (M, m) | None
        Each feature's in-sample main effect (partial rank correlation of its distance
        with the neural distance, :mod:`~mlem_neuro.core.scoring.main_effect`); ``None`` when
        the RDM of all stimuli does not fit in memory.
    parts : dict
        With tests and ``feature_test`` other than ``"importance"``, ``feature ->
        {"importance": (obs, null), "main_effect": (obs, null)}``: the two statistics.
    feature_test : str
        What each feature's test read (``"importance"`` when the main effects were not
        computed).
    gate_open : (M,) bool | None
        With ``feature_test="staged"``, the models whose features' tests added the held-out
        importance to the main effect (interactions found,
        :func:`mlem_neuro.inference.run_analysis`).
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
    fold_null: np.ndarray = None
    tests: dict = field(default_factory=dict)
    untestable: dict = field(default_factory=dict)
    held_out_pairs: str = "all"
    training: set = field(default_factory=set)
    compiled: bool = None
    interaction_seed: int = None
    n_repeats_capped: str = None
    main_effect: np.ndarray = None
    parts: dict = field(default_factory=dict)
    feature_test: str = "importance"
    gate_open: np.ndarray = None
    n_test_folds: int = 0
    n_feature_test_folds: int = 0
    gated_null: tuple = None

    def pvalues(self):
        """``(names, pvalues, pvalues_fwe)`` of :attr:`tests`, or ``(None, None, None)``
        when there are none (:func:`~mlem_neuro.core.scoring.nulls.permutation_pvalues`); NaN
        for the tests in :attr:`untestable`."""
        if not self.tests:
            return None, None, None
        names, p, p_fwe = permutation_pvalues(self.tests)
        for k, name in enumerate(names):
            if name in self.untestable:
                p[:, k] = p_fwe[:, k] = np.nan
        return names, p, p_fwe


def check_groups(groups, n):
    """One group label per stimulus (runs, items, sessions), as a 1-D numpy array."""
    if groups is None:
        return None
    if isinstance(groups, str):
        raise TypeError("groups must be an array-like with one label per stimulus (e.g. the "
                        f"run of each trial) or a column of the features; got the string "
                        f"{groups!r}, which names no column. Pass the labels, e.g. "
                        "groups=table['run'].")
    arr = np.asarray(groups)
    if arr.ndim != 1 or len(arr) != n:
        raise ValueError(f"groups must hold one label per stimulus ({n}); got shape "
                         f"{arr.shape}.")
    if arr.dtype.kind == "f" and np.isnan(arr).any() or \
            arr.dtype == object and pd.isna(arr).any():
        raise ValueError("groups holds missing values (NaN/None): give every stimulus a group.")
    return arr


def groups_from_table(groups, table):
    """``groups`` naming a column of the feature table: that column's values and the table
    without it (an identifier, not a feature, as the ``items`` column); else as given."""
    if isinstance(groups, str) and groups in table.columns:
        return table[groups].to_numpy(), table.drop(columns=groups)
    return groups, table


def _index_array(values, name, n):
    """Validated integer stimulus indices of one side of an explicit fold."""
    arr = np.asarray(values)
    if arr.dtype == bool:
        raise TypeError(f"{name} must hold stimulus indices, not a boolean mask; use "
                        "np.flatnonzero(mask).")
    if arr.ndim != 1 or arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be a 1-D array of integer stimulus indices; got "
                        f"dtype {arr.dtype} and shape {arr.shape}.")
    arr = arr.astype(int)
    if arr.size and (arr.min() < 0 or arr.max() >= n):
        raise ValueError(f"{name} holds indices outside 0..{n - 1} (min {arr.min()}, max "
                         f"{arr.max()}); indices count stimuli from 0.")
    if len(np.unique(arr)) != len(arr):
        raise ValueError(f"{name} repeats stimulus indices; each stimulus appears once.")
    return arr


def _check_fold(k, train, test, n):
    tr = _index_array(train, f"fold {k + 1}'s training indices", n)
    te = _index_array(test, f"fold {k + 1}'s held-out indices", n)
    both = np.intersect1d(tr, te)
    if both.size:
        raise ValueError(f"fold {k + 1} has {both.size} stimuli both in training and held "
                         f"out (e.g. {both[:5].tolist()}); a fold's sets must be disjoint.")
    if len(tr) < 3 or len(te) < 3:
        raise ValueError("every cv fold needs at least 3 training and 3 held-out stimuli "
                         f"(fold {k + 1}: {len(tr)} and {len(te)}).")
    return tr, te


def _group_kfold(n_splits, groups, rng, repeated=False):
    from sklearn.model_selection import GroupKFold

    n_groups = len(np.unique(groups))
    if n_groups < n_splits:
        raise ValueError(f"cv={n_splits} folds over groups needs at least {n_splits} groups; "
                         f"groups has {n_groups}. Lower cv or give more groups.")
    try:
        splitter = GroupKFold(n_splits=n_splits, shuffle=True,
                              random_state=int(rng.integers(2**31 - 1)))
    except TypeError:      # scikit-learn < 1.6: no shuffling of groups
        if repeated:
            raise ValueError("n_repeats > 1 with groups needs shuffled group folds "
                             "(scikit-learn >= 1.6); this scikit-learn has none, so every "
                             "repetition would give the same folds. Upgrade scikit-learn "
                             "or use n_repeats=1.") from None
        splitter = GroupKFold(n_splits=n_splits)
    return splitter.split(np.zeros((len(groups), 1)), groups=groups)


def _int_cv(cv):
    """Whether ``cv`` is a number of folds (K-fold splits drawn here)."""
    return isinstance(cv, (numbers.Integral, np.integer)) and not isinstance(cv, bool)



def resolve_n_repeats(n_repeats, cv, n, n_models=1):
    """The number of repetitions of ``cv`` that an analysis of ``n`` stimuli and
    ``n_models`` models (time points, spheres, regions) runs.

    An int is returned as given.  ``"auto"`` gives 1 unless ``cv`` is an int (a splitter
    or explicit folds are used once), else ``round(F / cv)`` (at least 1) with
    ``F = 20 (200 / n)**2 (100 / n_models)`` folds clipped to [12, 100]
    (:data:`AUTO_FOLDS`): the training costs about what 10 repeats of ``cv=2`` cost for
    200 stimuli x 100 time points.  With ``cv=2``: 50 repeats for one region or time point
    of up to 898 stimuli, or 100 time points of 89 stimuli or fewer; 10 for 100 time
    points of 200 stimuli; 6 for a whole-brain searchlight.  :func:`check_cv` then caps
    the repeats at the number of distinct splits (:func:`n_distinct_splits`).
    """
    n_repeats = check("n_repeats", n_repeats)      # at most MAX_REPEATS, before any work
    if not (isinstance(n_repeats, str) and n_repeats == "auto"):
        return int(n_repeats)
    if not _int_cv(cv):
        return 1
    low, high = AUTO_FOLDS
    folds = (AUTO_REFERENCE_FOLDS * (AUTO_REFERENCE_STIMULI / max(int(n), 1)) ** 2
             * AUTO_REFERENCE_MODELS / max(int(n_models), 1))
    return max(1, int(round(min(high, max(low, folds)) / int(cv))))


def tested_folds(n_repeats, cv, n_folds):
    """How many of an analysis's ``n_folds`` folds (the first ones) its permutation tests
    read.  With ``n_repeats="auto"`` and an int ``cv``: at most
    :data:`~mlem_neuro.core.constants.AUTO_TEST_FOLDS` folds, in whole repeats (10 repeats
    of ``cv=2``, 6 of ``cv=3``), the scores and importances using every fold; otherwise
    (an int ``n_repeats``, a splitter, explicit folds) every fold."""
    if not (isinstance(n_repeats, str) and n_repeats == "auto") or not _int_cv(cv):
        return n_folds
    return min(n_folds, max(1, AUTO_TEST_FOLDS // int(cv)) * int(cv))


def check_cv(cv, n, rng, groups=None, n_repeats=1, usable=None, n_models=1, notes=None):
    """Folds ``[(train, test), ...]`` of ``n`` stimuli from ``cv`` (validated).

    With ``groups``, an int ``cv`` gives :class:`~sklearn.model_selection.GroupKFold`
    folds, a splitter receives the groups, and every fold is checked to keep each group
    on one side.  ``n_repeats > 1`` (an int ``cv`` only) draws that many *distinct*
    K-fold splits, one after the other: ``n_repeats × cv`` folds.  ``usable(train,
    test)`` (an int ``cv``; with groups, repeated splits only) says whether a fold can be
    used: a random split
    with an unusable fold is drawn again (up to :data:`MAX_SPLIT_DRAWS` times), so a
    split that works is the one that would have been drawn anyway.  ``n_repeats="auto"``
    is resolved by :func:`resolve_n_repeats`.

    When fewer distinct (usable) splits exist than repeats asked for
    (:func:`n_distinct_splits`: 2 runs as groups have one split into 2 folds), every one
    of them is used once and the repeats are capped there: quietly with ``"auto"``, with
    a warning for an int.  ``notes`` (a dict), if given, then receives
    ``"n_repeats_capped"``: why.
    """
    cv = check("cv", cv)                 # explicit folds become a list
    groups = check_groups(groups, n)
    auto = isinstance(n_repeats, str) and n_repeats == "auto"
    n_repeats = resolve_n_repeats(n_repeats, cv, n, n_models)
    if cv is None:
        idx = np.arange(n)
        return [(idx, idx)]
    if _int_cv(cv):
        folds, capped = _repeated_splits(int(cv), n, rng, groups, n_repeats, usable)
        if capped:
            if not auto:
                warn_user(f"n_repeats={n_repeats}: {capped}, so {len(folds) // int(cv)} "
                          "repeat(s) are run (repeating a split would only make the "
                          "folds' spread look smaller).")
            if notes is not None:
                notes["n_repeats_capped"] = capped
    elif hasattr(cv, "split"):
        folds = cv.split(np.zeros((n, 1)), None, groups)
    else:
        folds = cv
    out = []
    for k, fold in enumerate(folds):
        try:
            train, test = fold
        except (TypeError, ValueError):
            raise TypeError(f"fold {k + 1} of cv must be a (train, test) pair of index "
                            f"arrays; got {fold!r}") from None
        out.append(_check_fold(k, train, test, n))
    if not out:
        raise ValueError("cv produced no fold.")
    if groups is not None:
        _check_groups_kept(out, groups)
    return out


def n_distinct_splits(n_units, cv):
    """How many distinct splits of ``n_units`` stimuli (or groups) into ``cv`` folds the
    random K-fold splits here give: the partitions into ``cv`` unlabelled blocks of the
    sizes :func:`numpy.array_split` gives (``r`` blocks of ``q + 1`` and ``cv - r`` of
    ``q``, ``n_units = q cv + r``), ``n_units! / ((q + 1)!**r q!**(cv - r) r! (cv - r)!)``.

    An exact int; ``math.inf`` when it exceeds 2**63 (it never caps repeats then; its
    exact value would take long to compute for 10**5 stimuli); 0 when ``n_units < cv``.
    """
    n_units, cv = int(n_units), int(cv)
    if n_units < cv:
        return 0
    q, r = divmod(n_units, cv)
    lg = math.lgamma
    log_count = (lg(n_units + 1) - r * lg(q + 2) - (cv - r) * lg(q + 1) - lg(r + 1)
                 - lg(cv - r + 1))
    if log_count > 63 * math.log(2):
        return math.inf
    f = math.factorial
    return f(n_units) // (f(q + 1) ** r * f(q) ** (cv - r) * f(r) * f(cv - r))


def _partitions(units, sizes):
    """Every partition of ``units`` (a tuple) into unlabelled blocks of ``sizes`` (a
    tuple; blocks as tuples), each once: the first unit's block is chosen first."""
    if not units:
        yield ()
        return
    first, rest = units[0], units[1:]
    for size in sorted(set(sizes)):
        left = list(sizes)
        left.remove(size)
        for others in itertools.combinations(rest, size - 1):
            taken = set(others)
            remaining = tuple(u for u in rest if u not in taken)
            for tail in _partitions(remaining, tuple(left)):
                yield ((first,) + others,) + tail


def _split_key(split):
    """What makes two splits the same: their held-out sets, in any order."""
    return frozenset(hash(np.asarray(te, dtype=np.int64).tobytes()) for _, te in split)


def _repeated_splits(cv, n, rng, groups, n_repeats, usable):
    """``n_repeats`` distinct K-fold splits of the stimuli (or of the groups), their folds
    one after the other, and why fewer were drawn (``""`` when none were left out).

    With few distinct splits (fewer than :data:`SPLITS_PER_REPEAT` x ``n_repeats``)
    every one is listed and the repeats drawn from the list without replacement; else
    random splits are drawn as before, a split already drawn being drawn again."""
    if groups is None:
        units, what, least = n, "stimuli", 3 * cv       # kfold_stimuli's own minimum
        def draw():
            return kfold_stimuli(n, cv, rng)

        def folds_of(blocks):
            return [(np.setdiff1d(np.arange(n), block), np.array(sorted(block)))
                    for block in blocks]
    else:
        labels, inverse = np.unique(groups, return_inverse=True)
        units, what, least = len(labels), "groups", cv   # _group_kfold says if fewer
        repeated = n_repeats > 1
        usable = usable if repeated else None           # one grouped split: as it comes

        def draw():
            return list(_group_kfold(cv, groups, rng, repeated))

        def folds_of(blocks):
            return [(np.flatnonzero(~np.isin(inverse, block)),
                     np.flatnonzero(np.isin(inverse, block))) for block in blocks]
    count = n_distinct_splits(units, cv) if units >= least else math.inf
    if n_repeats == 1 or count >= SPLITS_PER_REPEAT * n_repeats:
        return _draw_distinct(draw, n_repeats, usable), ""
    q, r = divmod(units, cv)
    blocks = list(_partitions(tuple(range(units)), (q + 1,) * r + (q,) * (cv - r)))
    kept, first = [], None
    for i in rng.permutation(len(blocks)):
        split = folds_of(blocks[i])
        first = split if first is None else first
        if usable is None or all(usable(tr, te) for tr, te in split):
            kept.append(split)
            if len(kept) == n_repeats:
                break
    split_word = "split" if count == 1 else "splits"
    if len(kept) == n_repeats:
        capped = ""
    elif len(kept) == count:
        capped = f"only {count} distinct {split_word} of {units} {what} into {cv} folds"
    else:
        usable_word = (f"only {len(kept)} of the {count} distinct {split_word}" if kept
                       else f"none of the {count} distinct {split_word}")
        verb = "have" if len(kept) > 1 else "has"
        capped = (f"{usable_word} of {units} {what} into {cv} folds {verb} every fold "
                  "usable (features that can be encoded on its training stimuli, held-out "
                  "pairs that can be scored)")
        if not kept:                    # one split: its folds' own errors say what is wrong
            kept = [first]
    return [fold for split in kept for fold in split], capped


def _draw_distinct(draw, n_repeats, usable):
    """``n_repeats`` random splits from ``draw()``, each new and with every fold
    ``usable`` (see :func:`check_cv`): a split is drawn again, up to
    :data:`MAX_SPLIT_DRAWS` times, when it was drawn before or has an unusable fold;
    past that the first new draw is kept, and its folds' own errors say what is
    wrong."""
    seen, out = set(), []
    for _ in range(n_repeats):
        first, unusable = None, 0
        for _ in range(MAX_SPLIT_DRAWS):
            split = draw()
            key = _split_key(split)
            if key in seen:
                continue
            first = split if first is None else first
            if usable is None or all(usable(tr, te) for tr, te in split):
                if unusable:
                    logger.info("cv: a random split kept after %d with a fold that held "
                                "out all the stimuli of a feature value (or only stimuli "
                                "alike)", unusable)
                break
            unusable += 1
        else:
            split = split if first is None else first
            key = _split_key(split)
        seen.add(key)
        out.extend(split)
    return out


def fold_usable(options, table):
    """``usable(train, test)`` for :func:`check_cv`: whether the features can be encoded
    on the fold's training stimuli and its held-out pairs can be scored (they differ in
    some feature and agree in another)."""
    def usable(train, test):
        try:
            space = feature_space(options).fit(table.iloc[train])
        except ValueError:
            return False
        names = space.feature_names_
        flat = {name for name, _ in _flat_features(space.transform(table.iloc[test]), names)}
        return not names or not set(names) <= flat
    return usable


def _check_groups_kept(folds, groups):
    for k, (tr, te) in enumerate(folds):
        split = np.intersect1d(groups[tr], groups[te])
        if split.size:
            raise ValueError(
                f"fold {k + 1} puts stimuli of group {split[0].item()!r} both in training and held "
                f"out ({split.size} group(s) split): with groups, use a group-aware splitter "
                "(an int cv, GroupKFold, LeaveOneGroupOut) or folds that keep each group "
                "together.")


def _fold_space(options, table, train, k, n_folds):
    """The feature encoding fitted on fold ``k``'s training stimuli (errors name the fold)."""
    try:
        return feature_space(options).fit(table.iloc[train])
    except ValueError as err:
        full = feature_space(options)
        try:
            full.fit(table)
        except ValueError:
            raise err from None         # a problem of the whole table, not of the fold
        raise ValueError(
            f"fold {k + 1} of {n_folds}: over its {len(train)} training stimuli, {err} "
            "The feature varies over all stimuli, but its rarer values are all held out in "
            "this fold: use fewer folds, folds stratified on this feature, or drop it."
        ) from None


def _fold_setup(enc_train, options, seed, memory_bytes):
    """The training setup of a fold that does not depend on the models (term groups, batch
    size; :class:`~mlem_neuro.core.training.engine.PairSetup`), from the fold's training stream."""
    train_seq, _ = np.random.SeedSequence(seed).spawn(2)
    return PairSetup(enc_train, options.fit_kwargs(), np.random.default_rng(train_seq),
                     check_device(options.device), torch.float32, memory_bytes=memory_bytes)


def _fit_chunk(source, enc_train, enc_test, train, test, options, seed, null=None,
               setup=None, plan=None, held=None, tests=None, runtime=None):
    """Train one chunk of models on training pairs; score and permute on held-out pairs.

    ``null`` (relabellings ``(n_tests, n_null, n)``) adds every model's null models to the
    stack: their training and held-out targets are gathered from the chunk's RDM of all
    stimuli (:func:`~mlem_neuro.core.scoring.nulls.permuted_pairs`), and only the statistic each
    test needs is computed on them; with a ``plan`` (:class:`_NullPlan`) the null models
    relabel the features instead and share the observed targets
    (:func:`~mlem_neuro.core.scoring.fastnull.null_statistics`).  ``setup`` (:func:`_fold_setup`),
    when the fold's chunks share one, skips recomputing it.  ``held`` (columns of the
    held-out pairs, :func:`held_out_columns`) scores the fold on those pairs only.
    ``tests``: which tests the rows of ``null`` are (``0`` the score, ``1 + f`` feature
    ``f``; ``None``: all, in order).  ``runtime``: the run's
    :class:`~mlem_neuro.core.runtime.Runtime` (the compiled kernels on or off, the
    compiled loop's threads, the memory budget; ``None``: ``Runtime()``).  The returned
    dict's ``"training"`` says what trained its models (:attr:`CVOutput.training`;
    returned, since chunks may run in other processes).
    """
    runtime = Runtime() if runtime is None else runtime
    # separate streams: training draws as many batches as its slowest model needs
    train_seq, perm_seq = np.random.SeedSequence(seed).spawn(2)
    rng = np.random.default_rng(perm_seq)
    dev = check_device(options.device)
    n_permutations = options.n_permutations
    target_train = source.rdm(train, dev)
    relabel_data = null is not None and plan is None
    if relabel_data:
        everything = source.rdm(np.arange(source.n_stimuli), dev)
        target_train = _with_nulls(target_train, everything, null, train, source.n_stimuli,
                                   runtime.compiled)
    # null rows relabelling the data come ranked (_with_nulls), as do ranked sources
    ranked = relabel_data or getattr(source, "ranked", False)
    targets = NeuralTargets.from_rdm(target_train, len(train), dev, ranked=ranked)
    if plan is None:
        del target_train
    fit = fit_stack(enc_train, targets, options, random_state=np.random.default_rng(train_seq),
                    setup=setup, runtime=runtime)
    del targets
    W = fit.W
    if relabel_data:
        W = fit.W.reshape(-1, 1 + null.shape[0] * null.shape[1], *fit.W.shape[1:])
    target_test = source.rdm(test, dev)
    enc_t = enc_test.to_torch(dev, torch.float64)
    i, j = pair_indices(len(test))
    if held is not None:
        target_test, i, j = target_test[:, torch.as_tensor(held, device=dev)], i[held], j[held]
    flat = constant_rows(target_test)
    stat = _importance_fn(options, enc_t, enc_test.n_features, i, j, runtime)
    drops, base = stat(W if not relabel_data else W[:, 0], target_test, n_permutations, rng,
                       None)
    drops = drops.cpu().numpy()
    std = drops.std(axis=-1, ddof=1) if n_permutations > 1 else np.zeros(drops.shape[:-1])
    out = dict(W=W if not relabel_data else W[:, 0], score=base.cpu().numpy(),
               importance=drops.mean(axis=-1), importance_perm_std=std,
               n_iter=_observed(fit.n_iter, W), converged=_observed(fit.converged, W),
               batch_size=fit.batch_size, training={fit.trained_with()})
    if relabel_data:
        out["null"] = _null_statistics(W[:, 1:], everything, null, test, options, stat,
                                       perm_seq, len(test), len(i), held, tests)
    elif null is not None:
        out["null"], trained = fastnull.null_statistics(
            plan.universe, null, target_train, target_test, train, test, options, perm_seq,
            held, plan.scales, tests, runtime=runtime)
        out["training"] |= trained
    if flat.any():              # Spearman of a constant RDM is undefined, not 0
        for key in ("score", "importance", "importance_perm_std", "null"):
            if key in out:
                out[key] = np.array(out[key], dtype=float)
                out[key][flat] = np.nan
    return out


def _observed(values, W):
    """Per-model values of the observed models of a stack (every null model dropped)."""
    return values if W.ndim == 3 else values.reshape(W.shape[:2])[:, 0]


#: the pair columns of the last relabellings asked for: every chunk of a fold asks for the
#: same ones (with many nulls, chunks hold a few models each), so they are kept
_COLUMNS = {}
#: chunks may run in threads of one process (joblib's threading backend, a dask worker):
#: the kept columns are read and changed under this lock
_COLUMNS_LOCK = threading.Lock()


def _null_columns(null, stimuli, n, device):
    """Columns ``(n_tests * n_null, n_pairs(len(stimuli)))`` into the RDM of all ``n``
    stimuli of the pairs of ``stimuli`` under each relabelling of ``null``
    (:func:`~mlem_neuro.core.scoring.nulls.permuted_pairs`), computed once for all the chunks of a
    fold (the last training and held-out columns are kept, keyed by their content)."""
    stimuli = np.asarray(stimuli)
    key = (null.shape, hashlib.sha1(np.ascontiguousarray(null).tobytes()).hexdigest(),
           hashlib.sha1(stimuli.tobytes()).hexdigest(), n, str(device))
    with _COLUMNS_LOCK:
        lin = _COLUMNS.get(key)
    if lin is not None:
        return lin
    # computed outside the lock: two threads may both compute the same columns (equal)
    lin = torch.as_tensor(permuted_pairs(null.reshape(-1, n), stimuli, n), device=device)
    with _COLUMNS_LOCK:
        while _COLUMNS and (len(_COLUMNS) >= 2 or sum(
                v.nbytes for v in _COLUMNS.values()) + lin.nbytes > _COLUMNS_BYTES):
            _COLUMNS.pop(next(iter(_COLUMNS)))
        if lin.nbytes <= _COLUMNS_BYTES:
            _COLUMNS[key] = lin
    return lin


def _with_nulls(observed, everything, null, train, n, compiled):
    """Ranked training targets ``(M * (1 + R), P)``: each model's observed row then its
    ``R`` null rows (relabellings ``null`` of the ``n`` stimuli, flattened test by test),
    each row holding the average ranks of its distances (training only ranks them).

    A null row is a subset of the pairs of all stimuli: its ranks come from one sort of
    each model's RDM of all stimuli (:class:`~mlem_neuro.core.ranks.spearman.SubsetRanks`), not
    from a sort per null row; they are the ranks :func:`~mlem_neuro.core.ranks.spearman.rankdata`
    gives (exact); ``compiled``: the runtime's switch of the compiled kernels)."""
    M, P = observed.shape
    lin = _null_columns(null, train, n, everything.device)
    out = torch.empty(M, 1 + lin.shape[0], P, dtype=torch.float64, device=observed.device)
    out[:, 0] = rankdata(observed)
    SubsetRanks(everything, compiled=compiled).ranks_of_subsets(lin, out=out[:, 1:])
    return out.reshape(M * (1 + lin.shape[0]), P)


def _importance_fn(options, enc_t, m, i, j, runtime):
    """``stat(W, target, K, rng, select) -> (drops, base)`` at the analysis's level, on
    ``runtime`` (its memory budget and compiled kernels)."""
    if options.level == "term":
        k, l = term_index(m, options.model_interactions)
        D = enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j))
        return lambda W, target, K, rng, select: term_importance(W, D, target, k, l, K, rng,
                                                                 select, runtime)
    return lambda W, target, K, rng, select: feature_importance(W, enc_t, i, j, target, K,
                                                                rng, select, runtime)


def _null_statistics(W, everything, null, test, options, stat, perm_seq, n_test, n_pairs,
                     held=None, tests=None):
    """Statistics ``(M, n_tests, n_null)`` of the null models ``W (M, n_tests * n_null,
    m, m)`` on held-out pairs: the score for the score's nulls, feature ``f``'s importance
    (its own term at ``level="term"``) for feature ``f``'s nulls.

    Feature ``f``'s importance permutes the same stimuli (pairs, for terms) as the observed
    importance of ``f`` did (the observed stream ``perm_seq`` replayed up to ``f``): the
    observed and null statistics then differ only by the data, as an exact permutation test
    needs (independent draws shared by all nulls would shift them together).
    ``tests``: the test of each row of ``null`` (``None``: row ``t`` is test ``t``).
    """
    K = options.n_permutations
    size = n_pairs if options.level == "term" else n_test
    n_tests, n_null, n = null.shape
    M, m = W.shape[0], W.shape[-1]
    lin = _null_columns(null, test, n, everything.device)
    if held is not None:
        lin = lin[:, torch.as_tensor(held, device=lin.device)]
    out = np.empty((M, n_tests, n_null))
    tests = range(n_tests) if tests is None else tests
    for t, test_id in enumerate(tests):
        Wt = torch.as_tensor(W[:, t * n_null:(t + 1) * n_null].reshape(-1, m, m))
        target = everything[:, lin[t * n_null:(t + 1) * n_null]].reshape(M * n_null, -1)
        if test_id == 0:        # the baseline score only, computed as the observed one
            value = stat(Wt, target, K, None, [])[1]
        else:
            # feature test_id - 1's column (at term level its own term has that index)
            rng = np.random.default_rng(perm_seq)
            for _ in range((test_id - 1) * K):
                rng.permutation(size)
            drops, _ = stat(Wt, target, K, rng, [test_id - 1])
            value = drops[:, 0].mean(dim=-1)
        out[:, t] = value.cpu().numpy().reshape(M, n_null)
    return out


def _chunk_slices(M, n_train, chunk_size, n_jobs, rows_per_model, budget):
    """Slices of the ``M`` models, one per chunk: ``chunk_size`` models, or (``None``) as
    many as a sixteenth of the memory ``budget`` (bytes: the runtime's) holds, at most
    :data:`CHUNK_BYTES`, at least one chunk per worker."""
    if chunk_size is None:
        per_chunk = min(CHUNK_BYTES, budget // 16)
        chunk_size = max(1, int(per_chunk // (8 * rows_per_model * max(n_pairs(n_train), 1))))
        chunk_size = min(chunk_size, MAX_CHUNK_MODELS)
        workers = effective_n_jobs(n_jobs)
        if workers > 1:
            chunk_size = min(chunk_size, -(-M // workers))
    chunk_size = max(1, min(int(chunk_size), M))
    return [slice(s, min(s + chunk_size, M)) for s in range(0, M, chunk_size)]


def _policy_threads(function):
    """Resolve ``run_cv``'s :class:`~mlem_neuro.core.runtime.Runtime` once (unless the
    caller gives one: ``runtime=``) and run it in the main process on as many torch
    threads as each worker gets (restored afterwards, also on error)."""
    @functools.wraps(function)
    def wrapper(source, features, options=None, *, runtime=None, **kwargs):
        if runtime is None:
            opts = MLEMOptions() if options is None else options
            runtime = Runtime.resolve(effective_n_jobs(opts.n_jobs), opts.device)
        # the source reads its distances with the runtime's compiled kernels (on or off)
        source = with_runtime(source, runtime)
        with runtime.torch_threads():
            return function(source, features, options, runtime=runtime, **kwargs)

    return wrapper


@_policy_threads
def run_cv(source, features, options=None, *, groups=None, desc="models", stage=None,
           runtime=None):
    """Cross-validated MLEM for every model of ``source``.

    Parameters
    ----------
    source : RDMSource
        See :mod:`mlem_neuro.core.rdms.sources`.
    features : DataFrame
        One row per stimulus of ``source``.
    options : MLEMOptions | None
        Every training / analysis option (``cv``, ``level``, ``n_permutations``,
        ``chunk_size``, ``n_jobs``, ``random_state``...); ``None`` uses the defaults.
    groups : array-like | None
        One label per stimulus (runs, items, sessions): folds never split a group.
    desc : str
        What the models are, for progress messages (``"time points"``, ``"spheres"``).
    stage : callable | None
        With tests, ``feature_test="staged"`` and a model with interactions, ``stage(out)
        -> gate (M,) bool``, called once the observed models, the score's null models and
        the main effects are in ``out`` (:func:`mlem_neuro.inference.run_analysis` runs the
        test of interactions there): the features' null models, which only the staged
        test's importance part reads, are then fitted in the models where ``gate`` is open
        only (their nulls are NaN elsewhere; :attr:`CVOutput.gate_open` records ``gate``).
        Every model fitted is the one a run fitting all of them fits (same folds, seeds
        and relabellings).  ``None``: every test's null models in every model.
    runtime : Runtime | None
        The threads, memory budget, compiled kernels and device of the run
        (:class:`~mlem_neuro.core.runtime.Runtime`), passed to every chunk; ``None``
        resolves it here, once (:meth:`~mlem_neuro.core.runtime.Runtime.resolve`, for
        ``options.n_jobs`` workers).

    Returns
    -------
    CVOutput
    """
    from joblib import Parallel

    opts = MLEMOptions() if options is None else options
    table = as_feature_table(features, name="features")
    n, M = source.n_stimuli, source.n_models
    if len(table) != n:
        raise ValueError(f"the feature table has {len(table)} rows but the data have {n} "
                         "stimuli; they must match one-to-one.")
    rng = check_random_state(opts.random_state)
    notes = {}
    folds = check_cv(opts.cv, n, rng, groups, opts.n_repeats, fold_usable(opts, table), M,
                     notes=notes)
    # the tests read the first folds (all of them unless n_repeats="auto")
    n_test = tested_folds(opts.n_repeats, opts.cv, len(folds)) if opts.n_null else 0
    # nested, duplicate, collinear features (and features constant within groups): said
    # before any fit, with what they do to the importances and tests
    # (a marginal test can move a nested feature: only the importances' sharing is said)
    conditional = opts.null == "conditional"
    space = feature_space(opts).fit(table)
    findings = diagnose_design(table, space, groups)
    warn_design(findings, opts.n_null if conditional else 0, stacklevel=7)
    # features whose untestable conditional test the diagnostics have already explained
    said = {name for f in findings if conditional and f.kind != "correlated"
            for name in (f.features if f.kind == "duplicate" else f.features[:1])}
    # how the stimuli are exchangeable (groups: runs or items), for nulls and held-out pairs
    enc_all = space.transform(table)
    design = null_design(enc_all, space.kinds_, groups, opts.null)
    # random K-fold splits of the stimuli (not runs, not the user's own splits)
    random_split = _int_cv(opts.cv) and groups is None
    plans, names, flat = [], None, {}
    for f, (train, test) in enumerate(folds):
        space = _fold_space(opts, table, train, f, len(folds))
        names = space.feature_names_
        enc_test = space.transform(table.iloc[test])
        _check_fold_scorable(f, enc_test, names, flat, random_split)
        # one seed per fold: every chunk draws the same batches and permutations, so
        # results do not depend on chunk_size or n_jobs
        plans.append(FoldPlan(f, train, test, space.transform(table.iloc[train]), enc_test,
                              int(rng.integers(2**63 - 1))))
    _warn_flat(flat, random_split)
    held = held_out_columns(opts.held_out_pairs, folds, groups, design.mode)
    untestable = {}
    if opts.n_null:
        _check_test_names(names)
        untestable = _warn_untestable(design, said)
    # drawn after the folds' seeds: the observed results do not depend on n_null
    null = _draw_nulls(opts, enc_all, design, rng) if opts.n_null else None
    # staged feature tests: the score's null models first, the features' where the
    # test of interactions opens the gate (their importance is read there only)
    staging = (stage is not None and null is not None and opts.feature_test == "staged"
               and opts.model_interactions and len(names) >= 2
               and _main_effects_fit(n, runtime.memory_bytes))
    first = None if null is None else np.arange(1 if staging else null.shape[0])
    null_plans = _null_plans(plans[:n_test], table, opts, null, runtime.memory_bytes) \
        + [None] * (len(plans) - n_test)
    for plan, null_plan, cols in zip(plans, null_plans, held):
        plan.null, plan.held = null_plan, cols
        tested = null is not None and plan.index < n_test
        plan.chunks = _chunk_slices(M, len(plan.train), opts.chunk_size, opts.n_jobs,
                                    _null_rows(null[first] if tested else None, null_plan,
                                               len(plan.train)), runtime.memory_bytes)
    if opts.level == "term":
        warn_unidentifiable_terms(plans[0].enc_train, opts.model_interactions)
    # the test of interactions, only where it will run (mlem_neuro.inference.run_analysis)
    then = ("the test of interactions" if opts.n_null and opts.model_interactions
            and len(names) >= 2 and getattr(source, "supports_interaction_test", False)
            else None)
    n_tests = 0 if null is None else len(first)
    counts = _projection.fit_counts(M, len(folds), opts.n_null, n_tests, then is not None,
                                    n_test_folds=n_test)
    calibrate = 0
    if _projection.wanted(counts):   # the first chunk cut small: timed, they project it
        rows = 1 + (0 if null is None else n_tests * null.shape[1])
        plans[0].chunks[:1], calibrate = _projection.calibration_split(plans[0].chunks[0],
                                                                       rows)
    # the runtime travels with every chunk: torch threads per worker (workers x threads
    # <= cores, main process and each worker) and the compiled loop's threads
    jobs = _chunk_jobs(source, plans, opts, null, first, runtime, n_test=n_test)
    n_chunks = sum(len(p.chunks) for p in plans)
    logger.info("MLEM: %d %s x %d fold(s) in %d chunk(s)%s", M, desc, len(folds), n_chunks,
                f"; the tests read the first {n_test}" if 0 < n_test < len(folds) else "")
    done, warned = [], False
    if calibrate:
        done, warned = _calibration(jobs, plans, calibrate, opts, dict(
            desc=desc, M=M, n_folds=len(folds), n_test_folds=n_test, n_null=opts.n_null,
            n_tests=n_tests,
            counts=counts, n_chunks=n_chunks, cv=opts.cv if _int_cv(opts.cv) else None,
            then=then, per_pair_numeric=_per_pair_numeric(opts, space),
            cores=runtime.cores or available_cores(),
            staged=len(names) if staging else 0))
    # a chunk of a fold the tests do not read fits its observed models only
    rows = 1 + (0 if null is None else n_tests * null.shape[1])
    weights = [1.0 if p.index < (n_test or len(plans)) else 1.0 / rows
               for p in plans for _ in p.chunks][len(done):]
    results = done + _run_jobs(Parallel, jobs, n_chunks - len(done), opts.n_jobs, desc,
                               estimate=bool(opts.n_null) or bool(calibrate), then=then,
                               warned=warned, weights=weights)
    terms = (term_names(names, opts.model_interactions) if opts.level == "term"
             else list(names))
    out = _collect(plans, results, folds, terms, names, M,
                   None if null is None else (null.shape[0], first), n_test)
    _warn_undefined(out, desc)
    out.compiled = runtime.compiled
    out.untestable = untestable
    out.n_repeats_capped = notes.get("n_repeats_capped")
    out.held_out_pairs = "all" if held[0] is None else "between_groups"
    # the main effect's null dataset r must be the one the importance's null model r saw:
    # null models that relabel the features (stimulus s takes the features of perm[s])
    # see the dataset whose data are relabelled by the inverse permutation
    relabelled = null
    if null is not None and plans[0].null is not None:
        relabelled = np.argsort(null, axis=-1, kind="stable")
    if null is not None and opts.model_interactions and len(names) >= 2:
        # the seed of the test of interactions, which the inference layer runs
        # (:func:`mlem_neuro.inference.run_analysis`)
        out.interaction_seed = int(rng.integers(2**63 - 1))
    # where the main effect may be a feature's whole test, more relabellings than the
    # trained tests' (drawn last: nothing else depends on them)
    n_main = _main_effect_nulls(opts, M, len(names), runtime.memory_bytes)
    if null is not None and n_main > opts.n_null:
        more = null_permutations(enc_all, None, n_main - opts.n_null,
                                 np.random.default_rng(int(rng.integers(2**63 - 1))),
                                 design=design)
        relabelled = np.concatenate([relabelled, more], axis=1)
    out.main_effect, main_null = _main_effects(source, enc_all, relabelled, opts, groups,
                                               held, runtime.memory_bytes)
    out.feature_test = "importance" if main_null is None else main_null[0]
    if staging:
        out.n_feature_test_folds = n_test
        out.gate_open = np.asarray(stage(out), bool).reshape(M)
        _fit_gated_features(out, source, plans, opts, null, runtime, desc, Parallel,
                            table)
    with _COLUMNS_LOCK:                  # the nulls' pair columns are not needed any more
        _COLUMNS.clear()
    if null is not None:
        _add_tests(out, main_null)
        if "interactions" in out.tests:      # staged: run before; listed after, as always
            out.tests["interactions"] = out.tests.pop("interactions")
    return out


def _chunk_jobs(source, plans, opts, null, tests, runtime, models=None, n_test=None):
    """The joblib jobs of every chunk of every fold (``plan.chunks``, slices of
    ``models``, an index array, or of every model when ``None``), with the null models of
    ``tests`` (rows of ``null``; ``None`` without nulls) in the folds the tests read (the
    first ``n_test``, every fold when ``None``), each run on ``runtime``'s threads and
    given it (:func:`~mlem_neuro.core.runtime.run_with`).  Chunk data are cut lazily, as
    joblib asks for the next job."""
    from joblib import delayed

    sub = None if null is None else null[tests]
    for p, sl, setup in _shared_setups(plans, opts, runtime.memory_bytes):
        part = sl if models is None else models[sl]
        tested = n_test is None or p.index < n_test
        yield delayed(run_with)(runtime, _fit_chunk, source.subset(part), p.enc_train,
                                p.enc_test, p.train, p.test, opts, p.seed,
                                sub if tested else None, setup, p.null, p.held,
                                tests if tested else None, runtime)


def _fit_gated_features(out, source, plans, opts, null, runtime, desc, Parallel, table):
    """The features' null models of the models where ``out.gate_open`` (the staged
    test, :func:`run_cv`'s ``stage``), into ``out.fold_null`` (NaN elsewhere)."""
    models = np.flatnonzero(out.gate_open)
    if not len(models):
        return
    tests = np.arange(1, null.shape[0])
    n_test = out.n_test_folds
    if 0 < n_test < len(plans):
        # the features' null models read every fold (their importance is what finds an
        # XOR code: measured, the first 20 folds found it less often) when the later
        # folds' null models are built as the first ones' (built here, once a gate opens)
        later = _null_plans(plans[n_test:], table, opts, null, runtime.memory_bytes)
        if (later[0] is None) == (plans[0].null is None):
            for plan, null_plan in zip(plans[n_test:], later):
                plan.null = null_plan
            out.n_feature_test_folds = len(plans)
    plans = plans[:out.n_feature_test_folds]        # the folds the features' tests read
    for plan in plans:
        plan.chunks = _chunk_slices(len(models), len(plan.train), opts.chunk_size,
                                    opts.n_jobs, _null_rows(null[tests], plan.null,
                                                            len(plan.train)),
                                    runtime.memory_bytes)
    n_chunks = sum(len(p.chunks) for p in plans)
    logger.info("MLEM: the features' null models where interactions are found: %d of %d "
                "%s x %d fold(s) in %d chunk(s)", len(models), out.fold_null.shape[1], desc,
                len(plans), n_chunks)
    jobs = _chunk_jobs(source, plans, opts, null, tests, runtime, models)
    results = _run_jobs(Parallel, jobs, n_chunks, opts.n_jobs, desc, estimate=True)
    chunks = [(plan.index, sl) for plan in plans for sl in plan.chunks]
    gated = np.full((len(plans), len(models), len(tests), out.fold_null.shape[-1]), np.nan)
    for (f, sl), r in zip(chunks, results):
        gated[f, sl] = r["null"]
        if f < out.n_test_folds:
            out.fold_null[f, models[sl][:, None], tests[None, :]] = r["null"]
        out.training.update(r["training"])
    out.gated_null = (models, gated)


def _main_effects_fit(n, budget):
    """Whether the main effects' RDM of all ``n`` stimuli fits in the memory ``budget``
    (bytes: the runtime's)."""
    return 8 * n_pairs(n) * 3 <= budget // 4


def _calibration(jobs, plans, n, opts, ctx):
    """Run the first ``n`` jobs (the calibration chunks,
    :func:`_projection.calibration_split`) here, timed, and project the analysis from them
    before any other chunk runs (:func:`_projection.announce`); ``(their results, whether
    the projection warned)``."""
    import time

    results, times = [], []
    for _ in range(n):
        function, args, kwargs = next(jobs)
        start = time.perf_counter()
        results.append(function(*args, **kwargs))
        times.append(time.perf_counter() - start)
    sizes = [c.stop - c.start for c in plans[0].chunks[:n]]
    rest = [c.stop - c.start for p in plans for c in p.chunks][n:]
    # a chunk of a fold the tests do not read fits its observed models only
    rows = 1 + ctx["n_null"] * ctx["n_tests"]
    weights = [1.0 if p.index < (ctx["n_test_folds"] or len(plans)) else 1.0 / rows
               for p in plans for _ in p.chunks][n:]
    ctx.update(workers=effective_n_jobs(opts.n_jobs), device=str(opts.device),
               cuda=torch.cuda.is_available())
    _, warned = _projection.announce(times, sizes, rest, ctx, weights)
    return results, warned


def _per_pair_numeric(opts, space):
    """Whether numeric features train pair by pair because ``numeric_levels=None``."""
    return opts.numeric_levels is None and any(
        kind != "categorical" for kind in getattr(space, "kinds_", {}).values())


def _warn_undefined(out, desc):
    """Warn about the models whose held-out Spearman is undefined in some fold (constant
    neural distances on the fold's held-out pairs): NaN, not a measured 0."""
    bad = np.flatnonzero(np.isnan(out.score).any(axis=0))
    if not len(bad):
        return
    folds = sorted({int(f) + 1 for f in np.flatnonzero(np.isnan(out.score[:, bad]).any(
        axis=1))})
    warnings.warn(f"{len(bad)} of {out.score.shape[1]} {desc} (index {bad[:10].tolist()}"
                  f"{'...' if len(bad) > 10 else ''}) have the same neural distance on every "
                  f"held-out pair of fold(s) {folds} (flat or identical patterns): their "
                  "Spearman correlation is undefined, so their score, importance and "
                  "p-values are NaN (not 0). Check the data there (a flat channel or time "
                  "point, voxels without signal, repeated trials).", UserWarning,
                  stacklevel=7)


@dataclass
class FoldPlan:
    """One fold, decided before any model is fitted: what :func:`run_cv`'s fold loop
    runs.

    ``index`` (the fold's number), ``train`` and ``test`` (its stimuli), ``enc_train`` and
    ``enc_test`` (their encoded features, scaled on the training stimuli), ``seed`` (every
    chunk of the fold draws the same batches and permutations from it), ``null`` (a
    :class:`_NullPlan` when the null models relabel the features, else ``None``),
    ``held`` (the held-out pair columns that score it, ``None`` for all) and ``chunks``
    (the slices of models fitted together).
    """

    index: int
    train: np.ndarray
    test: np.ndarray
    enc_train: object
    enc_test: object
    seed: int
    null: object = None
    held: object = None
    chunks: list = field(default_factory=list)


def _shared_setups(plans, opts, memory_bytes):
    """``(plan, models, setup)`` for every chunk of every fold: the fold's training setup
    computed once (lazily, only the current fold's is held) when the fold is split into
    several chunks, else ``None`` (the chunk computes it); ``memory_bytes``: the budget."""
    for plan in plans:
        if plan.null is not None:            # the fast null plan holds the fold's setup
            setup = plan.null.setup
        elif len(plan.chunks) > 1:
            setup = _fold_setup(plan.enc_train, opts, plan.seed, memory_bytes)
        else:
            setup = None
        for models in plan.chunks:
            yield plan, models, setup


@dataclass
class _NullPlan:
    """A fold whose null models relabel the features (:mod:`~mlem_neuro.core.scoring.fastnull`):
    its code universe, its training setup and the column scales of each relabelling's
    encoding (:meth:`~mlem_neuro.core.stimuli.features.FeatureSpace.refit_scales`)."""

    universe: object
    setup: object
    scales: object = None


def _null_plans(folds, table, opts, null, memory_bytes):
    """Per fold (:class:`FoldPlan`), a :class:`_NullPlan` when its null models can relabel
    the features, else ``None`` (no nulls, or null models that relabel the data).

    They can when the fold trains grouped on its exact distance rows and full batches
    (not on the grid of numeric distances), at ``level="feature"``, with few feature rows
    (:func:`~mlem_neuro.core.scoring.fastnull.code_universe`), and when the analysis of
    every relabelled table would train the same way (on the exact rows of its own
    pairs: :func:`~mlem_neuro.core.scoring.fastnull.grouped_like_observed`) with an
    encoding that differs from the fold's in its scales only
    (:meth:`~mlem_neuro.core.stimuli.features.FeatureSpace.refit_scales`).  All folds or
    none: a test's null statistic is a mean over folds, and relabelling the features by
    ``perm`` gives another dataset than relabelling the data by it, so every fold of null
    model ``r`` must see the same null dataset.  ``memory_bytes``: the runtime's budget."""
    plans = [None] * len(folds)
    if null is None or opts.level != "feature":
        return plans
    relabellings = null.reshape(-1, null.shape[-1])
    for f, fold in enumerate(folds):
        setup = _fold_setup(fold.enc_train, opts, fold.seed, memory_bytes)
        if (setup.groups is None or setup.levels is not None
                or setup.b < n_pairs(len(fold.train))):
            return [None] * len(folds)
        space = _fold_space(opts, table, fold.train, fold.index, len(folds))
        universe = fastnull.code_universe(space.transform(table))
        if universe is None:
            return [None] * len(folds)
        scales = space.refit_scales(table, relabellings[:, fold.train])
        if scales is None or not fastnull.grouped_like_observed(
                universe, relabellings, fold.train, opts.numeric_levels, memory_bytes):
            return [None] * len(folds)
        plans[f] = _NullPlan(universe, setup, scales)
    return plans


def _null_rows(null, plan, n_train):
    """Rows of training-pair size each model of a chunk costs (for the chunk size): the
    observed targets and ranks, plus its null models (their RDMs when they relabel the
    data, else a few arrays per distance row and null model)."""
    if null is None:
        return 1
    R = null.shape[0] * null.shape[1]
    if plan is None:
        return 1 + R
    return 4 + -(-R * plan.universe.n_rows * _FAST_NULL_ARRAYS // max(n_pairs(n_train), 1))


def held_out_columns(choice, folds, groups, mode):
    """Per fold, the columns (of :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` over its
    held-out stimuli) of the pairs that score it, or ``None`` for every pair.

    ``choice`` is the ``held_out_pairs`` option: ``"all"``; ``"between_groups"`` (pairs
    of stimuli of different ``groups``; a fold holding one group is refused); ``"auto"``:
    between groups when ``groups`` are given, vary in the features within a group
    (``mode == "within"``: runs, not items, :func:`~mlem_neuro.core.scoring.nulls.exchange_units`)
    and every held-out fold holds two groups or more, else every pair.
    """
    if choice == "all" or groups is None:
        if choice == "between_groups":
            raise ValueError("held_out_pairs='between_groups' keeps the held-out pairs of "
                             "stimuli from different groups: pass groups (e.g. the runs).")
        return [None] * len(folds)
    groups = np.asarray(groups)
    per_fold = [len(np.unique(groups[te])) for _, te in folds]
    if choice == "auto":
        if mode != "within" or min(per_fold) < 2:
            return [None] * len(folds)
    elif min(per_fold) < 2:
        k = per_fold.index(min(per_fold))
        raise ValueError(f"held_out_pairs='between_groups' needs two groups or more in every "
                         f"held-out fold; fold {k + 1} holds one: use fewer folds than "
                         "groups (an int cv with groups gives GroupKFold), or "
                         "held_out_pairs='all'.")
    out = []
    for _, te in folds:
        g = groups[te]
        i, j = pair_indices(len(te))
        out.append(np.flatnonzero(g[i] != g[j]))
    return out


def _warn_untestable(design, said=()):
    """Warn about the tests of ``design`` whose null cannot move what they test, unless
    named in ``said`` (the design diagnostics explained them); their ``name -> reason``."""
    for name, why in design.untestable.items():
        if name not in said:
            warnings.warn(f"the permutation test of {name!r} is not testable: {why}. Its "
                          "p-values are NaN.", UserWarning, stacklevel=7)
    return dict(design.untestable)


def _draw_nulls(opts, enc, design, rng):
    """The relabellings of every test (:class:`~mlem_neuro.core.scoring.nulls.NullDesign`),
    drawn once per analysis, after the folds, so the observed results do not depend on
    ``n_null``."""
    null_rng = np.random.default_rng(int(rng.integers(2**63 - 1)))
    if design.mode is not None:
        logger.info("permutation tests: %s", "stimuli relabelled within their group"
                    if design.mode == "within" else "groups (items) exchanged whole")
    return null_permutations(enc, None, opts.n_null, null_rng, design=design)


def _check_test_names(names):
    """Refuse a feature named like a test that is not a feature's (its test would
    replace that one under the same name)."""
    clash = [name for name in names if name in ("score", "interactions")]
    if clash:
        raise ValueError(f"a feature named {clash[0]!r} would share its name with a "
                         "permutation test (the tests are 'score', one per feature, and "
                         f"'interactions'): rename it (e.g. {clash[0] + '_'!r}), or run "
                         "without n_null.")


def _main_effects(source, enc, null, opts, groups, held, budget):
    """Every feature's in-sample main effect ``(M, m)`` and, with tests and
    ``feature_test`` other than ``"importance"``, ``(feature_test, null (M, m, R))``:
    its null under the feature's own relabellings (the ``R`` of ``null (1 + m, R, n)``:
    the trained tests' ``n_null`` first, then any drawn for the main effect alone,
    :func:`_main_effect_nulls`; :mod:`~mlem_neuro.core.scoring.main_effect`), on the
    pairs that score the folds (between groups when the held-out pairs are); ``(None,
    None)`` when the RDM of all stimuli does not fit in the memory ``budget`` (the test
    is then the importance alone, said)."""
    n = source.n_stimuli
    if not _main_effects_fit(n, budget):
        if null is not None and opts.feature_test != "importance":
            logger.warning("the features' tests use the held-out importance alone: the "
                           "main effects need the RDM of all %d stimuli in memory", n)
        return None, None
    columns = pair_columns(n, groups) if held[0] is not None else None
    use_null = null if null is not None and opts.feature_test != "importance" else None
    obs, nul = main_effect_tests(source, enc, use_null, columns, check_device(opts.device))
    return obs, (None if nul is None else (opts.feature_test, nul))


def _main_effect_nulls(opts, M, m, budget):
    """Relabellings of the features' main-effect tests: ``max(n_null,``
    :data:`~mlem_neuro.core.constants.MAIN_EFFECT_NULLS` ``)`` where the main effect may
    be a feature's whole test (``feature_test`` ``"staged"`` or ``"main_effect"``) and the
    null statistics of ``M`` models and ``m`` features fit in their share of the memory
    ``budget`` (:data:`~mlem_neuro.core.constants.MAIN_EFFECT_NULLS_SHARE`); else
    ``n_null``."""
    n = max(opts.n_null, MAIN_EFFECT_NULLS)
    if (not opts.n_null or opts.feature_test not in ("staged", "main_effect")
            or 8 * M * max(m, 1) * n > budget // MAIN_EFFECT_NULLS_SHARE):
        return opts.n_null
    return n


def _add_tests(out, main_null=None):
    """Fold-mean observed and null statistics of the tests "score" and each feature;
    with ``main_null`` (``(feature_test, null (M, m, n_null))``) each feature's statistic
    is, for ``"combined"``, the :func:`~mlem_neuro.core.scoring.main_effect.combine` of its
    held-out importance and its main effect, for ``"main_effect"`` and (until
    :func:`mlem_neuro.inference.run_analysis` reads the test of interactions)
    ``"staged"`` its main effect; both parts are kept in ``out.parts``."""
    null = out.fold_null.mean(axis=0)                       # (M, n_tests, n_null)
    k = out.n_test_folds                                    # the first folds
    out.tests["score"] = (out.score[:k].mean(axis=0), null[:, 0].T)
    importance = out.importance[:k].mean(axis=0)
    if out.gated_null is not None and out.n_feature_test_folds > k:
        # staged: the features' null models where the gate opened, on every fold
        models, gated = out.gated_null
        null = null.copy()
        null[:, 1:] = np.nan
        null[models, 1:] = gated.mean(axis=0)
        importance = out.importance[:out.n_feature_test_folds].mean(axis=0)
    for f, name in enumerate(out.feature_names):
        col = out.terms.index(name)
        part = (importance[:, col], null[:, 1 + f].T)
        if main_null is None:
            out.tests[name] = part
            continue
        kind, nul = main_null
        n_null = null.shape[-1]
        # the parts share the trained tests' null datasets (the first n_null); where the
        # main effect is the whole test it reads every relabelling drawn for it
        main = (out.main_effect[:, f], nul[:, f, :n_null].T)
        out.parts[name] = {"importance": part, "main_effect": main}
        out.tests[name] = (combine(*zip(part, main)) if kind == "combined"
                           else (out.main_effect[:, f], nul[:, f].T))


def _check_fold_scorable(f, enc_test, names, flat, random_split=False):
    """Record features flat over fold ``f``'s held-out pairs (with whether every pair
    differs in them); refuse a fold flat on all."""
    differ = []
    for name, distance in _flat_features(enc_test, names):
        flat.setdefault(name, []).append((f + 1, distance > 0))
        if distance > 0:      # every held-out stimulus has its own value
            differ.append(name)
    if len(names) and all(any(k == f + 1 for k, _ in flat.get(name, ())) for name in names):
        raise ValueError(
            f"every held-out pair of fold {f + 1} has the same distance on every feature "
            f"({list(names)}), so the fold cannot be scored: choose folds whose held-out "
            "stimuli differ in some features and agree in others (e.g. fewer folds)."
            + _differ_advice(differ, random_split))


def _differ_advice(names, random_split=False):
    """Why a feature distinct at every held-out stimulus is unscorable, and what to do."""
    if not names:
        return ""
    why = (f" Every held-out stimulus has its own value of {names}, so every held-out "
           "pair differs in it")
    if random_split:
        return (why + ": with few stimuli per fold this happens by chance. Fewer folds hold "
                "out more stimuli per fold; n_repeats averages over several splits.")
    return (why + ", as with leave-one-run-out when each condition occurs once per run: use "
            "a grouped k-fold that holds out several runs per fold (an int cv with "
            "groups=runs gives GroupKFold), so that held-out pairs include pairs of the same "
            "condition from different runs.")


def _warn_flat(flat, random_split=False):
    if flat:
        where = "; ".join(f"{name!r} in fold(s) {', '.join(str(k) for k, _ in folds)}"
                          for name, folds in flat.items())
        # distinct at every held-out stimulus in every fold where they are flat
        differ = [name for name, folds in flat.items() if all(d for _, d in folds)]
        warnings.warn(f"every held-out pair has the same distance on {list(flat)} ({where}): "
                      "importance there is 0 by construction. Choose folds whose held-out "
                      "stimuli vary in these features (e.g. fewer folds)."
                      + _differ_advice(differ, random_split), UserWarning,
                      stacklevel=6)   # user > verbose wrapper > public > _fit > run_cv > here


def _collect(plans, results, folds, terms, names, M, nulls=None, n_test=0):
    """The chunks' ``results`` in one :class:`CVOutput`; ``nulls``: ``(n_tests, tests)``,
    the tests of the analysis and those whose null statistics the chunks hold (the others
    NaN in ``fold_null``), in the first ``n_test`` folds."""
    m, T, F = len(names), len(terms), len(folds)
    out = CVOutput(W=np.empty((F, M, m, m)), score=np.empty((F, M)),
                   importance=np.empty((F, M, T)), importance_perm_std=np.empty((F, M, T)),
                   n_iter=np.empty((F, M), dtype=int), converged=np.empty((F, M), dtype=bool),
                   terms=terms, feature_names=list(names), folds=folds)
    chunks = [(plan.index, sl) for plan in plans for sl in plan.chunks]
    for (f, sl), r in zip(chunks, results):
        for key in ("W", "score", "importance", "importance_perm_std", "n_iter", "converged"):
            getattr(out, key)[f, sl] = r[key]
        if "null" in r:
            n_tests, tests = nulls
            if out.fold_null is None:
                out.fold_null = np.full((n_test, M, n_tests, r["null"].shape[-1]),
                                        np.nan)
            out.fold_null[f, sl][:, tests] = r["null"]
        if sl.start == 0:
            out.batch_size.append(r["batch_size"])
        out.training.update(r["training"])
    out.n_test_folds = n_test
    return out


def result_settings(options, out, groups=None, **extra):
    """The settings a result records: every option, the folds, the number of groups and
    ``extra`` (JSON)."""
    settings = options.to_settings()
    settings["n_groups"] = None if groups is None else int(len(np.unique(groups)))
    settings.update(cv_settings(options.cv, out.folds))
    settings.update(n_folds=len(out.folds),
                    fold_test_sizes=[int(len(te)) for _, te in out.folds],
                    batch_size_used=[int(b) for b in out.batch_size],
                    converged_fraction=float(np.mean(out.converged)))
    settings["held_out_pairs_used"] = out.held_out_pairs
    # what each feature's test read: the combined statistic, or the importance alone (by
    # choice, without tests, or when the main effects did not fit in memory)
    settings["feature_test_used"] = out.feature_test if out.tests else None
    if out.tests and out.gate_open is not None:
        # the staged test: in how many models the importance joined the main effect
        settings["feature_test_staged_open"] = int(np.count_nonzero(out.gate_open))
    if _int_cv(options.cv):             # what n_repeats="auto" (or an int) gave
        settings["n_repeats_used"] = len(out.folds) // int(options.cv)
    if out.tests:                       # the first folds, whose statistics the tests read
        settings["n_test_folds"] = int(out.n_test_folds)
        if out.n_feature_test_folds > out.n_test_folds:
            # staged: the features' tests where the gate opened read every fold
            settings["n_feature_test_folds"] = int(out.n_feature_test_folds)
        # the null datasets each test read: n_null, or more for a feature's main effect
        # alone (MAIN_EFFECT_NULLS)
        settings["n_null_used"] = {name: int(np.shape(t[1])[0])
                                   for name, t in out.tests.items()}
    if out.n_repeats_capped:            # fewer distinct splits than repeats asked for
        settings["n_repeats_capped"] = out.n_repeats_capped
    if out.untestable:                  # why those tests' p-values are NaN
        settings["untestable_tests"] = dict(out.untestable)
    settings.update({k: jsonable(v) for k, v in extra.items()})
    return settings


def result_tests(out):
    """The ``tests``, ``pvalues`` and ``pvalues_fwe`` a result takes from ``out`` (all
    ``None`` when no null was computed), its ``main_effect`` (``None`` when not
    computed), its ``training`` (:attr:`CVOutput.training`) and ``compiled``
    (:attr:`CVOutput.compiled`), which the result records in its provenance), and its
    ``gate_open`` (:attr:`CVOutput.gate_open`: the models where the staged feature test
    read the importance too; ``None`` without tests or with another feature test)."""
    names, p, p_fwe = out.pvalues()
    gate = None
    if out.tests and out.feature_test == "staged" and out.gate_open is not None:
        gate = np.asarray(out.gate_open, bool)
    return dict(tests=names, pvalues=p, pvalues_fwe=p_fwe, main_effect=out.main_effect,
                gate_open=gate, training=sorted(out.training), compiled=out.compiled)


def cv_settings(cv, folds):
    """How the folds were made, for a result's settings (JSON-friendly).

    ``cv`` is kept as given when it is ``None`` or an int, as its ``repr`` for a splitter,
    and as ``"explicit"`` for an iterable of folds; the held-out stimuli of every fold are
    recorded in all cases (``fold_test_indices``), so any split can be reproduced.
    """
    return dict(cv=cv_description(cv),
                fold_test_indices=[[int(k) for k in te] for _, te in folds])


def _flat_features(enc, names):
    """``(name, distance)`` of the features whose distance is the same on every pair of
    the encoded stimuli."""
    if enc.n_stimuli < 2:
        return []
    D = np.asarray(enc.pair_distances(*pair_indices(enc.n_stimuli)))
    return [(name, float(col[0])) for name, col in zip(names, D.T) if np.ptp(col) == 0]


