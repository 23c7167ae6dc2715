"""Null models of categorical designs that share the observed data's ranks.

A relabelling of the stimuli can be applied to either side of a dataset: the neural data
(:mod:`mlem_neuro.core.scoring.nulls`: stimulus ``a`` takes the data of ``π(a)``) or the feature
rows (stimulus ``s`` keeps its data and takes the features of ``σ(s)``).  Under the null
hypothesis both give datasets distributed like the observed one, so both make exact
permutation tests (the identity is one of the relabellings either way).  Relabelling the
features keeps every neural distance where it is: the training and held-out target ranks
of each model, computed once for the observed model, serve all its null models, and with
categorical features a null model is fully described by how its pairs fall into the few
distinct feature-distance rows.  Per null model and fold that is:

* training: the pairs per row and the sums of the standardised target ranks per row (one
  pass over the pairs per null model, shared by all models: :func:`group_sums`), then
  grouped full-batch training (:func:`~mlem_neuro.core.training.engine.fit_grouped`) exactly
  as the observed model trains (same steps, same stopping rule);
* held out: the exact Spearman of the grouped predictions (:func:`~mlem_neuro.core.ranks.grouped.
  grouped_spearman`), and for a feature's test its importance with the same importance
  permutations of the held-out stimuli as the observed importance (the feature's values
  taken from another held-out stimulus are one more feature row, among the rows of
  :class:`CodeUniverse`).

No null model ranks its targets again, gathers an RDM or expands pairs per step.  The
folds stay with the neural data (with ``groups``, the runs stay in their folds).  Used
by :func:`mlem_neuro.crossval.run_cv` when every fold's design is grouped and trained on
full batches and ``level="feature"`` (else the null models relabel the data).

A null model is the analysis of its relabelled table, so it is fitted as that analysis
fits it.  With numeric features (of few distinct values: more make too many rows) the
encoding fitted on the relabelled training stimuli scales a numeric feature by their
range, so each null model's distance rows are those of its own scales
(:meth:`~mlem_neuro.core.stimuli.features.FeatureSpace.refit_scales`,
:meth:`CodeUniverse.rows_at`; with the fold's own scales the null statistics of the
rare-maximum design of ``tests/test_numeric_nulls.py`` were up to 0.1 away from the
relabelled tables' analyses); and a fold whose
relabelled tables would not all train grouped on their exact rows
(:func:`grouped_like_observed`: more distinct rows than the grouped path takes) relabels
the data instead.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from joblib import Parallel, delayed, effective_n_jobs

from .. import kernels
from ..constants import (
    INTERACTION_BLOCK_BYTES,
    MAX_CODES,
    MAX_STIMULUS_CODES,
    RANK_WALK_ELEMENTS,
    STACK_ARRAYS,
)
from ..ranks.grouped import MAX_GROUPS, few_rows, grouped_spearman
from ..ranks.spearman import _EPS, rankdata, sort_with_ties, standardize
from ..rdms.sources import with_runtime
from ..runtime import Runtime, run_with
from ..stimuli.features import feature_space
from ..stimuli.pairs import n_pairs, pair_indices
from ..training import quantise
from ..training.engine import fit_grouped
from ..training.metric import term_index, term_weights
from .importance import _fold


class CodeUniverse:
    """The feature rows the null models can meet, as codes, and their distance rows
    (built by :func:`code_universe`).

    Attributes
    ----------
    codes : ndarray of int (n,)
        Code of each stimulus's feature row (``S`` distinct codes).
    swap : ndarray of int (m, S, S)
        ``swap[f, a, b]``: the universe row (of ``E``) of a stimulus of code ``a`` whose
        feature ``f`` (values and missing flag) is taken from a stimulus of code ``b``
        (what feature ``f``'s permutation importance evaluates).
    table : tensor of int (E, E)
        Distance row of two universe rows.
    pair_row : tensor of int (S, S)
        Distance row of two stimuli of codes ``a`` and ``b``.
    D_uniq : tensor (U, m)
        The distinct feature-distance rows (float64).
    encoded : EncodedFeatures
        The ``E`` universe rows, encoded.
    rep : tensor of int (U, 2)
        Two universe rows whose distances are each distance row (for :meth:`rows_at`).
    """

    def __init__(self, codes, base_to_ext, swap, table, D_uniq, encoded=None, rep=None):
        self.codes, self.swap, self.table, self.D_uniq = codes, swap, table, D_uniq
        self.encoded, self.rep = encoded, rep
        ext = torch.as_tensor(base_to_ext)
        self.pair_row = table[ext][:, ext]

    @property
    def n_features(self):
        return self.D_uniq.shape[1]

    @property
    def n_rows(self):
        return self.D_uniq.shape[0]

    def rows_at(self, scale):
        """The distance rows ``(U, m)`` (float64) with the encoding's column scales
        replaced by ``scale (n_columns,)``: the rows of an encoding refitted on other
        training stimuli (:meth:`~mlem_neuro.core.stimuli.features.FeatureSpace.refit_scales`;
        with the encoding's own scales, :attr:`D_uniq`)."""
        enc = dataclasses.replace(self.encoded, scale=np.asarray(scale, dtype=np.float64))
        return enc.to_torch("cpu", torch.float64).pair_distances(self.rep[:, 0],
                                                                 self.rep[:, 1]).double()


def code_universe(enc):
    """:class:`CodeUniverse` of ``enc`` (a fold's encoding of every stimulus), or ``None``
    when its rows are too many (:data:`MAX_STIMULUS_CODES`, :data:`MAX_CODES`,
    :data:`~mlem_neuro.core.ranks.grouped.MAX_GROUPS`)."""
    from ..stimuli.features import EncodedFeatures

    dims = enc.values.shape[1]
    rows = np.column_stack([enc.values, enc.missing.astype(np.float64)])
    base_rows, codes = np.unique(rows, axis=0, return_inverse=True)
    S = base_rows.shape[0]
    if S > MAX_STIMULUS_CODES:
        return None
    # the distances of pairs of stimuli's rows are among the universe's: a feature whose
    # distances take too many values (a numeric one) rules it out before it is built
    a, b = np.triu_indices(S, 1)
    base = EncodedFeatures(values=base_rows[:, :dims], missing=base_rows[:, dims:] > 0.5,
                           slices=enc.slices, indicator=enc.indicator,
                           missing_distance=enc.missing_distance, names=enc.names,
                           scale=enc.scale)
    if any(len(np.unique(col)) > MAX_GROUPS for col in base.pair_distances(a, b).T):
        return None
    blocks = [base_rows]
    for f, sl in enumerate(enc.slices):
        cols = list(range(sl.start, sl.stop)) + [dims + f]
        r = np.repeat(base_rows[:, None, :], S, axis=1)
        r[:, :, cols] = base_rows[None, :, cols]
        blocks.append(r.reshape(S * S, -1))
    ext, inv = np.unique(np.concatenate(blocks), axis=0, return_inverse=True)
    inv = inv.ravel()
    E = ext.shape[0]
    if E > MAX_CODES:
        return None
    ext_enc = EncodedFeatures(values=ext[:, :dims], missing=ext[:, dims:] > 0.5,
                              slices=enc.slices, indicator=enc.indicator,
                              missing_distance=enc.missing_distance, names=enc.names,
                              scale=enc.scale)
    a, b = np.triu_indices(E)
    D = ext_enc.to_torch("cpu", torch.float64).pair_distances(torch.as_tensor(a),
                                                               torch.as_tensor(b))
    D_uniq, row = torch.unique(D.double(), dim=0, return_inverse=True)
    if D_uniq.shape[0] > MAX_GROUPS:
        return None
    table = torch.empty(E, E, dtype=torch.long)
    table[a, b] = row
    table[b, a] = row
    first = torch.full((D_uniq.shape[0],), len(row), dtype=torch.long).scatter_reduce_(
        0, row, torch.arange(len(row)), reduce="amin")            # a pair of each row
    rep = torch.stack([torch.as_tensor(a)[first], torch.as_tensor(b)[first]], dim=1)
    return CodeUniverse(codes.ravel(), inv[:S], inv[S:].reshape(enc.n_features, S, S),
                        table, D_uniq, ext_enc, rep)


def grouped_like_observed(universe, relabellings, train, numeric_levels, memory_bytes):
    """Whether the analysis of every relabelled table trains this fold as the null
    models here train: grouped on the exact distance rows of its own training pairs.

    The fold's own design trains grouped (the caller checks it); a relabelled table's
    training stimuli carry other feature rows, so their pairs may fall into more
    distinct rows (a numeric feature's values): more than
    :func:`~mlem_neuro.core.ranks.grouped.few_rows` groups (its analysis trains pair by
    pair, or on the grid), or more than a grid would have
    (:func:`~mlem_neuro.core.training.quantise.prefers_grid`; counted as a change
    whenever the universe's distances could make a grid).  ``relabellings (R, n)``:
    under row ``r`` stimulus ``s`` takes the features of stimulus ``relabellings[r,
    s]``; ``numeric_levels``: the option; ``memory_bytes``: the runtime's memory budget
    (a sixteenth of it holds the relabellings' rows looked at together)."""
    i, j = (torch.as_tensor(x) for x in pair_indices(len(train)))
    P, U = len(i), universe.n_rows
    ct = torch.as_tensor(universe.codes[np.asarray(relabellings)[:, train]])
    grid = _grid_possible(universe, numeric_levels)
    if few_rows(U, P) and not (grid and quantise.prefers_grid(U, numeric_levels)):
        return True                  # each relabelling's rows are among the universe's
    step = max(1, memory_bytes // 16 // (8 * max(P, U)))  # relabellings at a time
    S = universe.pair_row.shape[0]
    for r0 in range(0, ct.shape[0], step):
        c = ct[r0:r0 + step]
        g = torch.take(universe.pair_row, (c * S).index_select(1, i)
                       + c.index_select(1, j))                             # (step, P)
        seen = torch.zeros(len(c), U, dtype=torch.bool).scatter_(1, g, True)
        for rows in seen.sum(dim=1).tolist():
            if not few_rows(rows, P) or (grid and quantise.prefers_grid(rows,
                                                                         numeric_levels)):
                return False
    return True


def _grid_possible(universe, numeric_levels):
    """Whether some pairs of the universe's rows could train on a grid of numeric
    distances (a column with more distinct distances than a grid keeps as they are)."""
    return quantise.choose_levels(universe.D_uniq, numeric_levels) is not None


def group_sums(tz, g, U):
    """Sums ``(M, R, U)`` of ``tz (M, P)`` over the rows ``g (R, P)`` of the pairs in each
    of ``R`` groupings, and the pairs per row ``(R, U)``.

    One ``index_add_`` of ``tz`` per grouping (a pass over its pairs, shared by the ``M``
    models).  The sums are those of the product of ``tz`` with a one-hot matrix of the
    rows (the previous computation), up to the order of the additions, at a fraction of
    its cost: with a numeric feature's thousands of rows, building and multiplying the
    one-hot blocks took a third of the tests' time (``benchmarks/bench_numeric_null.py``).
    """
    M, P = tz.shape
    R = g.shape[0]
    tz = tz.to(torch.float64)
    counts = torch.zeros(R, U, dtype=torch.float64).scatter_add_(
        1, g, torch.ones(g.shape, dtype=torch.float64))
    out = torch.zeros(M, R, U, dtype=torch.float64)
    for r in range(R):
        out[:, r].index_add_(1, g[r], tz)
    return out, counts


def _importance_perms(perm_seq, K, f, n):
    """The ``K`` permutations of the ``n`` held-out stimuli that feature ``f``'s observed
    importance used (the observed stream replayed up to ``f``)."""
    rng = np.random.default_rng(perm_seq)
    for _ in range(f * K):
        rng.permutation(n)
    return np.stack([rng.permutation(n) for _ in range(K)])


def null_statistics(universe, perms, target_train, target_test, train, test, options,
                    perm_seq, held=None, scales=None, tests=None, runtime=None):
    """Statistics ``(M, n_tests, n_null)`` of the null models of ``M`` models.

    Parameters
    ----------
    universe : CodeUniverse
    perms : ndarray of int (n_tests, n_null, n)
        Relabellings: under ``perms[t, r]`` stimulus ``s`` takes the features of stimulus
        ``perms[t, r, s]`` (test ``0``: the score; test ``1 + f``: feature ``f``).
    target_train, target_test : tensor (M, P)
        The models' neural distances of the training and held-out pairs.
    train, test : ndarray of int
        The fold's stimuli.
    options : MLEMOptions
    perm_seq : numpy SeedSequence
        The fold's importance stream (see :func:`_importance_perms`).
    held : ndarray of int | None
        The columns of the held-out pairs that ``target_test`` holds (``None``: all).
    scales : ndarray (n_tests * n_null, n_columns) | None
        The encoding's column scales refitted on each relabelling's training stimuli
        (:meth:`~mlem_neuro.core.stimuli.features.FeatureSpace.refit_scales`, relabellings
        flattened test by test): each null model's distance rows are then those of its
        own encoding, in training and held out, as in the analysis of its relabelled
        table (``None``: the universe's rows for all, e.g. without numeric features).
    tests : ndarray of int | None
        The test of each row of ``perms`` (``0`` the score, ``1 + f`` feature ``f``):
        ``perms`` then holds the relabellings of those tests only, while ``scales`` holds
        every test's (as refitted for the analysis) and is sliced here; ``None``: row
        ``t`` is test ``t``.
    runtime : Runtime | None
        The analysis's :class:`~mlem_neuro.core.runtime.Runtime`, for the fits (``None``:
        ``Runtime()``).

    Returns
    -------
    statistics : ndarray (M, n_tests, n_null)
    training : set of (str, float, int)
        What trained the null models: ``(backend, lr, patience)`` of each fit
        (:meth:`~mlem_neuro.core.training.stackfit.StackFit.trained_with`).
    """
    n_tests, n_null, n = perms.shape
    if tests is None:
        tests = np.arange(n_tests)
    elif scales is not None:
        scales = scales.reshape(-1, n_null, scales.shape[-1])[tests].reshape(
            n_tests * n_null, -1)
    M = target_train.shape[0]
    m = universe.n_features
    U = universe.n_rows
    R = n_tests * n_null
    codes = universe.codes[perms.reshape(R, n)]                   # (R, n)
    # training: every null model of every model, one grouped full-batch stack
    i, j = (torch.as_tensor(x) for x in pair_indices(len(train)))
    ct = torch.as_tensor(codes[:, train])
    g = universe.pair_row[ct[:, i], ct[:, j]]
    tz = standardize(rankdata(target_train.double().cpu()))
    sums, counts = group_sums(tz, g, U)
    del g, tz
    D_sets, which = _relabelled_rows(universe, scales, R)
    W, training = _fit_null_models(D_sets, which, counts, sums, options,   # (M, R, m, m)
                                   runtime)
    del sums
    kk, ll = term_index(m, True)
    q = torch.empty(M, R, U, dtype=torch.float64)
    for k, D in enumerate(D_sets):
        rel = torch.nonzero(which == k).ravel()
        q[:, rel] = _fold(term_weights(W[:, rel].reshape(-1, m, m), kk, ll), D,
                          terms=(kk, ll)).reshape(M, len(rel), U)
    # held out
    n_te = len(test)
    it, jt = pair_indices(n_te)
    if held is not None:
        it, jt = it[held], jt[held]
    P_te = len(it)
    it, jt = torch.as_tensor(it), torch.as_tensor(jt)
    tzt = standardize(rankdata(target_test.double().cpu()))
    ce = codes[:, test].reshape(n_tests, n_null, n_te)
    K = options.n_permutations
    out = np.empty((M, n_tests, n_null))
    for t in range(n_tests):
        c0 = torch.as_tensor(ce[t])
        q_t = q[:, t * n_null:(t + 1) * n_null]
        base = _held_out_scores(q_t, universe.pair_row[c0[:, it], c0[:, jt]], tzt,
                                P_te)                                 # (M, n_null)
        if tests[t] == 0:
            out[:, t] = base.numpy()
            continue
        f = int(tests[t]) - 1
        p = torch.as_tensor(_importance_perms(perm_seq, K, f, n_te))
        swapped = torch.as_tensor(universe.swap[f])[c0[:, None, :], c0[:, p]]  # (R', K, n)
        gk = universe.table[swapped[..., it], swapped[..., jt]].reshape(n_null, K, P_te)
        score = _held_out_scores(q_t, gk, tzt, P_te)                  # (M, n_null, K)
        out[:, t] = (base[..., None] - score).mean(dim=-1).numpy()
    return out, training


def _held_out_scores(q, g, tzt, P_te):
    """Exact held-out Spearman ``(M, R, ...)`` of the null models' predictions per
    distance row ``q (M, R, U)`` on the held-out pairs, whose rows under each of their
    groupings are ``g (R, ..., P_te)``; ``tzt (M, P_te)``: the pairs' standardised target
    ranks.

    Grouped by rows (:func:`group_sums`, then the Spearman of ``U`` groups) when the
    rows are fewer than the pairs (categorical designs), else pair by pair (each pair
    its own group: a numeric feature's thousands of rows, most of them absent from a
    grouping's few hundred held-out pairs, cost more than the pairs).  Both are the
    tie-aware Spearman of the same numbers, up to the order of the additions.
    """
    M, R, U = q.shape
    inner = g.shape[1:-1]
    g = g.reshape(R, -1, P_te)                                     # (R, G, P_te)
    G = g.shape[1]
    if U <= P_te:
        sums, counts = group_sums(tzt, g.reshape(R * G, P_te), U)
        values = q[:, :, None, :].expand(M, R, G, U).reshape(M, R * G, U)
        score = grouped_spearman(values, counts[None], sums, P_te)
    else:
        values = q.gather(-1, g.reshape(1, R, G * P_te).expand(M, R, G * P_te))
        score = grouped_spearman(values.reshape(M, R * G, P_te),
                                 torch.ones(1, dtype=torch.float64), tzt[:, None, :], P_te)
    return score.reshape(M, R, *inner)


def _relabelled_rows(universe, scales, R):
    """The distance rows of the ``R`` relabellings' encodings: ``(D_sets, which)``, the
    distinct sets of rows ``(U, m)`` and the set of each relabelling ``(R,)``.  One set,
    the universe's own rows, when ``scales`` is ``None`` or every relabelling's scales are
    the encoding's."""
    which = torch.zeros(R, dtype=torch.long)
    if scales is None:
        return [universe.D_uniq], which
    uniq, inverse = np.unique(np.asarray(scales, dtype=np.float64), axis=0,
                              return_inverse=True)
    own = universe.encoded.column_scale()
    D_sets = [universe.D_uniq if np.array_equal(s, own) else universe.rows_at(s)
              for s in uniq]
    return D_sets, torch.as_tensor(inverse.ravel(), dtype=torch.long)


def _fit_null_models(D_sets, which, counts, sums, options, runtime=None):
    """Metrics ``(M, R, m, m)`` of the null models trained on ``counts (R, U)`` pairs per
    distance row (one grouping per relabelling, shared by the ``M`` models) and target
    sums ``sums (M, R, U)``; relabelling ``r``'s distance rows are ``D_sets[which[r]]``
    (its encoding's, :func:`_relabelled_rows`).

    Each null model trains on the rows its own pairs have, as the observed model of its
    relabelled table would (:func:`~mlem_neuro.core.training.engine.fit_grouped`): relabellings
    with the same rows train in one stack.  A stack of relabellings with different rows
    would give each model every row any of them has, the ones it lacks at the negligible
    count :data:`~mlem_neuro.core.training.engine.GroupedTargets.ABSENT_COUNT`, and every step
    pays for those rows: with a numeric feature a null model has about 1,000 of the 1,500
    rows its relabellings have together (``benchmarks/bench_numeric_null.py``), with
    categorical features most relabellings have every row (one stack).  Relabellings
    with the same rows but other distances (another numeric scale) train apart.

    Returns ``(W, training)``: the metrics and what trained them (``(backend, lr,
    patience)`` of each fit); ``runtime`` is given to every fit.
    """
    M, R, _ = sums.shape
    m = D_sets[0].shape[1]
    W = torch.empty(M, R, m, m, dtype=torch.float64)
    training = set()
    has = torch.cat([which[:, None], (counts > 0).long()], dim=1)
    masks, stack = torch.unique(has, dim=0, return_inverse=True)
    for k in range(masks.shape[0]):
        rel = torch.nonzero(stack == k).ravel()   # relabellings with these rows and scales
        rows = masks[k, 1:] > 0
        Uk = int(rows.sum())
        c = counts[rel][:, rows]                               # (Rk, Uk)
        fit = fit_grouped(D_sets[int(masks[k, 0])][rows],
                          c[None].expand(M, len(rel), Uk).reshape(-1, Uk),
                          sums[:, rel][:, :, rows].reshape(-1, Uk), options,
                          runtime=runtime)
        W[:, rel] = torch.as_tensor(fit.W, dtype=torch.float64).reshape(M, len(rel), m, m)
        training.add(fit.trained_with())
    return W, training


def rank_sums(D, sets, U, compiled=True):
    """Sums over distance rows of the standardised ranks of subsets of ``D``'s pairs.

    ``D (M, P)``: distances of every pair; ``sets``: ``(lin, g)`` pairs of a subset's
    columns of ``D`` and their distance rows (``< U``).  Returns, per set, ``(M, U)``
    sums equal to ``zeros(M, U).index_add_(1, g, standardize(rankdata(D[:, lin])))``
    up to rounding.

    Every set is ranked from one sort of every pair per model: walking that order, a
    pair's rank in a set is the count of the set's pairs up to it, so each set costs a pass
    instead of a sort.  Compiled (:func:`~mlem_neuro.core.kernels.rank_walk`), one pass
    serves every set: sets that share no pair (a fold's training and held-out pairs) share
    one label per pair.  In torch (the library not built, or a distance not finite) only
    the sets larger than a quarter of the pairs (training folds) are walked, the others
    ranked as usual.  Rows of ``D`` with tied distances are ranked as usual either way.
    ``compiled``: the runtime's switch of the compiled kernels.
    """
    M, P = D.shape
    stats = [(torch.bincount(g, minlength=U).double() * ((len(lin) + 1) / 2.0),
              # ranks 1..n: mean (n + 1) / 2, centred norm sqrt(n (n² - 1) / 12)
              max(math.sqrt(len(lin) * (len(lin) ** 2 - 1) / 12.0), _EPS))
             for lin, g in sets]
    out = [torch.empty(M, U, dtype=torch.float64) for _ in sets]
    plan = (_walk_plan(sets, P, U) if D.device.type == "cpu" and D.dtype == torch.float64
            and compiled and kernels.built() else None)
    step = max(1, RANK_WALK_ELEMENTS // max(P, 1))
    labels = {}                        # the torch walk's labels, made once when needed
    for r0 in range(0, M if sets else 0, step):
        Db = D[r0:r0 + step]
        walked = None if plan is None else kernels.rank_walk(
            np.ascontiguousarray(Db.numpy()), plan[0], plan[1], U, compiled=compiled)
        if walked is None:
            blocks = _torch_walk(Db, sets, stats, U, labels)
        else:
            acc, redo = walked
            rows = torch.from_numpy(np.flatnonzero(redo))
            blocks = []
            for k, (c, j) in enumerate(plan[2]):
                shift, norm = stats[k]
                block = (torch.from_numpy(acc[c, :, j * U:(j + 1) * U]) - shift) / norm
                if len(rows):
                    block[rows] = _ranked_sums(Db[rows], *sets[k], U)
                blocks.append(block)
        for k, block in enumerate(blocks):
            out[k][r0:r0 + step] = block
    return out


def _walk_plan(sets, P, U):
    """How the compiled walk reads ``sets``: ``(labels (C, P), J, where)``.

    The sets are grouped, in order, into ``C`` channels of sets that share no pair (a
    fold's training and held-out pairs); ``where[k] = (c, j)``: set ``k`` is the ``j``-th
    of channel ``c``, and ``labels[c, p]`` is ``j * U + g`` for a pair of that set in
    distance row ``g``, or ``J * U`` when the pair is in no set of the channel (``J``:
    the most sets of a channel).
    """
    used, size, where = [], [], []          # per channel: its pairs, its sets
    for lin, _ in sets:
        idx = np.asarray(lin)
        for c, occupied in enumerate(used):
            if not occupied[idx].any():
                break
        else:
            c = len(used)
            used.append(np.zeros(P, dtype=bool))
            size.append(0)
        used[c][idx] = True
        where.append((c, size[c]))
        size[c] += 1
    J = max(j for _, j in where) + 1
    labels = np.full((len(used), P), J * U, dtype=np.int64)
    for (lin, g), (c, j) in zip(sets, where):
        labels[c, np.asarray(lin)] = j * U + np.asarray(g)
    return labels, J, where


def _torch_walk(Db, sets, stats, U, labels):
    """:func:`rank_sums` of the rows ``Db`` in torch: the large sets walked, the small
    ones and the rows with ties ranked.  ``labels`` caches each large set's distance row
    per pair (``U`` for pairs outside it) across blocks of rows."""
    large = [k for k, (lin, _) in enumerate(sets) if 4 * len(lin) > Db.shape[1]]
    blocks = [None] * len(sets)
    if large:
        order, _, tied = sort_with_ties(Db)
        rows = tied.nonzero()[:, 0]
    for k in large:
        lin, g = sets[k]
        if k not in labels:
            labels[k] = torch.full((Db.shape[1],), U, dtype=torch.long)
            labels[k][lin] = g
        walk = labels[k][order]                              # rows in sorted order
        pos = torch.cumsum(walk < U, dim=1, dtype=torch.int32).double()
        rsum = torch.zeros(len(Db), U + 1, dtype=torch.float64).scatter_add_(
            1, walk, pos)[:, :U]
        shift, norm = stats[k]
        blocks[k] = (rsum - shift) / norm
        if len(rows):
            blocks[k][rows] = _ranked_sums(Db[rows], lin, g, U)
    for k, (lin, g) in enumerate(sets):
        if blocks[k] is None:
            blocks[k] = _ranked_sums(Db, lin, g, U)
    return blocks


def _ranked_sums(D, lin, g, U):
    """Sums over the rows ``g`` of the standardised ranks of ``D``'s columns ``lin``."""
    return torch.zeros(len(D), U, dtype=torch.float64).index_add_(
        1, g, standardize(rankdata(D[:, lin])))


def _lin(stimuli, n):
    """Linear indices into the condensed RDM of ``n`` stimuli of the pairs of ``stimuli``
    (in :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order)."""
    s = np.asarray(stimuli)
    i, j = pair_indices(len(s))
    lo, hi = np.minimum(s[i], s[j]), np.maximum(s[i], s[j])
    return torch.as_tensor(lo * n - lo * (lo + 1) // 2 + (hi - lo - 1))


def _fold_groups(universe, stimuli, n):
    """Distance row ``(P,)`` and condensed index ``(P,)`` of the pairs of ``stimuli``."""
    c = torch.as_tensor(universe.codes[np.asarray(stimuli)])
    i, j = (torch.as_tensor(x) for x in pair_indices(len(stimuli)))
    return universe.pair_row[c[i], c[j]], _lin(stimuli, n)


def interaction_scores(source, table, options, folds, constraints, progress=None,
                       runtime=None):
    """Fold-mean held-out Spearman ``(len(constraints), n_models)`` of every model of
    ``source`` fitted with each constraint, for a categorical design trained on full
    batches, and what trained them (``(backend, lr, patience)`` of each fit, returned by
    the blocks, also from worker processes); ``None`` when the design is not one (then
    train through :func:`~mlem_neuro.crossval.run_cv`).

    The non-additivity test (:func:`~mlem_neuro.interaction.interaction_test`) fits
    the same null datasets twice (with and without interactions): here each dataset's RDM
    of all stimuli is computed once, each fold's target ranks and their sums per distance
    row once, and both fits train on those sums (:func:`~mlem_neuro.core.training.engine.
    fit_grouped`), the models of every fold in one stack; the held-out score is the
    exact grouped Spearman.  The numbers are those of ``run_cv`` with full batches, up to
    rounding.  With ``options.n_jobs`` above 1 the models are split into blocks that run
    in worker processes (each model trains on its own, so the split changes nothing but
    rounding).  ``progress``: a progress bar over the blocks (``None``: at INFO).
    ``runtime``: the :class:`~mlem_neuro.core.runtime.Runtime` of the fits, given to
    every block (``None``: resolved here, once, for ``options.n_jobs`` workers).
    """
    from ..training.engine import FULL_BATCH_PAIRS

    n = source.n_stimuli
    if options.batch_size not in ("auto", "full"):
        return None
    plans = []
    for train, test in folds:
        space = feature_space(options).fit(table.iloc[train])
        universe = code_universe(space.transform(table))
        P = n_pairs(len(train))
        if universe is None or 4 * universe.n_rows > P or (
                options.batch_size == "auto" and P > FULL_BATCH_PAIRS) or (
                quantise.prefers_grid(universe.n_rows, options.numeric_levels)
                and _grid_possible(universe, options.numeric_levels)):
            return None                # run_cv would not train on the exact rows
        plans.append((universe, _fold_groups(universe, train, n),
                      _fold_groups(universe, test, n)))
    # one set of distance rows for all folds (their encodings may differ)
    D_all, glob = torch.unique(torch.cat([u.D_uniq for u, *_ in plans]), dim=0,
                               return_inverse=True)
    U, F, N = D_all.shape[0], len(plans), source.n_models
    offsets = np.cumsum([0] + [u.n_rows for u, *_ in plans])
    groups = [(glob[offsets[f] + g_tr], lin_tr, glob[offsets[f] + g_te], lin_te)
              for f, (_, (g_tr, lin_tr), (g_te, lin_te)) in enumerate(plans)]
    counts_tr = torch.stack([torch.bincount(g[0], minlength=U) for g in groups]).double()
    counts_te = torch.stack([torch.bincount(g[2], minlength=U) for g in groups]).double()
    n_te = torch.as_tensor([float(len(g[3])) for g in groups], dtype=torch.float64)
    present = counts_tr.sum(dim=0) > 0                 # rows some fold trains on
    kk, ll = term_index(D_all.shape[1], True)
    workers = effective_n_jobs(options.n_jobs)
    if runtime is None:
        runtime = Runtime.resolve(workers, options.device)
    source = with_runtime(source, runtime)      # its distances on the runtime's kernels
    outer = max(1, runtime.memory_bytes // (4 * 8 * STACK_ARRAYS) // (F * U))
    if workers > 1:                      # at least one block of models per worker
        outer = min(outer, -(-N // workers))
    shared = (groups, D_all, present, counts_tr, counts_te, n_te, (kk, ll), options,
              constraints, runtime)
    blocks = [np.arange(lo, min(lo + outer, N)) for lo in range(0, N, outer)]
    from ..jobs import run_jobs as _run_jobs

    # a progress bar at INFO when there are several blocks (e.g. the spheres of a brain)
    results = _run_jobs(Parallel, (delayed(run_with)(
        runtime, _interaction_block, source.subset(rows), *shared) for rows in blocks),
        len(blocks), options.n_jobs, "interaction test", show=progress)
    out = np.zeros((len(constraints), N))
    training = set()
    for rows, (scores, trained) in zip(blocks, results):
        out[:, rows] = scores
        training |= trained
    return out, training


def _interaction_block(source, groups, D_all, present, counts_tr, counts_te, n_te, terms,
                       options, constraints, runtime=None):
    """:func:`interaction_scores` of the models of ``source`` (one block): ``(len(
    constraints), n_models)`` and what trained them (a set of ``(backend, lr,
    patience)``), the fits and the rank sums on ``runtime`` (``None``: ``Runtime()``)."""
    runtime = Runtime() if runtime is None else runtime
    n, N = source.n_stimuli, source.n_models
    F, U = len(groups), D_all.shape[0]
    rdm_rows = max(1, INTERACTION_BLOCK_BYTES // (8 * n_pairs(n)))
    # every (fold, model) is one model of the stacks below
    sums_tr = torch.zeros(F, N, U, dtype=torch.float64)
    sums_te = torch.zeros(F, N, U, dtype=torch.float64)
    for s0 in range(0, N, rdm_rows):
        sub = np.arange(s0, min(s0 + rdm_rows, N))
        D = source.subset(sub).rdm(np.arange(n)).double().cpu()
        sums = rank_sums(D, [(lin, g) for g_tr, lin_tr, g_te, lin_te in groups
                             for lin, g in ((lin_tr, g_tr), (lin_te, g_te))], U,
                          runtime.compiled)
        for f in range(F):
            sums_tr[f, s0:s0 + len(sub)], sums_te[f, s0:s0 + len(sub)] = sums[2 * f:2 * f + 2]
        del D
    fold = torch.arange(F).repeat_interleave(N)
    out = np.zeros((len(constraints), N))
    training = set()
    for c, constraint in enumerate(constraints):
        opts = dataclasses.replace(options, constraint=constraint,
                                   interactions=constraint != "diagonal")
        fit = fit_grouped(D_all[present], counts_tr[fold][:, present],
                          sums_tr.reshape(F * N, U)[:, present], opts, runtime=runtime)
        training.add(fit.trained_with())
        W = torch.as_tensor(fit.W, dtype=torch.float64)
        q = _fold(term_weights(W, *terms), D_all, terms=terms)
        score = grouped_spearman(q, counts_te[fold], sums_te.reshape(F * N, U),
                                 n_te[fold, None])
        out[c] = score.reshape(F, N).mean(dim=0).numpy()
    return out, training
