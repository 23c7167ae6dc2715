"""Permutation importance for stacks of fitted models, scored with exact Spearman.

Term level (the MLEM paper's appendix): the model is rewritten over the terms
``P_kk = d_k²`` and ``P_kl = 2 d_k d_l`` so that ``dᵀ W d = Σ_t w_t P_t``.  A term's
importance is the mean drop of the exact Spearman correlation when its column is permuted
across the evaluated pairs.

Feature level: a feature's values are permuted across *stimuli*, every pair distance of that
feature is recomputed, and the drop measures the feature's total effect (its own term and its
interactions together).

Only the order of ``dᵀ W d`` matters for Spearman (the distance is a monotone function of
it), so scores are computed on the quadratic form directly, in float64.  Every prediction,
permuted or not, is a sum over terms taken in one fixed order (:func:`_fold`), so pairs whose
(modified) term rows are equal get bitwise equal predictions: exact ties stay ties, and the
per-pair and grouped computations give the same ranks.

Memory.  When every pair's term row, the permuted copies and their ranks fit in the memory
budget (:mod:`mlem_neuro.core.memory`), models are scored in batches as above.  Otherwise
(e.g. 8,000 stimuli, 32 million pairs) the pairs are walked block by block: feature
distances are computed per block from the stimuli (:class:`PairFeatures`), categorical
designs are scored from per-group sums, and otherwise each permuted prediction vector is
ranked with one sort.  Only a few vectors with one value per pair are ever held (the target
ranks, one prediction vector per model, a permutation, a sort); :func:`check_memory` refuses
the work up front when even those exceed the budget.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import kernels
from ..constants import MIN_BLOCK_PAIRS  # noqa: F401  (tuning constants, defined there once)
from ..memory import check_memory
from ..ranks.grouped import MAX_GROUPS, PairCodes, distinct_rows, grouped_spearman
from ..ranks.spearman import rankdata, sort_with_ties, standardize
from ..rdms.neural import CHUNK_BYTES
from ..runtime import Runtime
from ..stimuli.pairs import linear_to_pair
from ..stimuli.pairs import n_pairs as count_pairs
from ..training.metric import term_index, term_weights
from ..utils import warn_user


def warn_unidentifiable_terms(enc, interactions):
    """Warn that term-level interaction importances are not identifiable for ``enc``.

    When every feature distance takes two values (:meth:`EncodedFeatures.two_valued`),
    ``dᵀ W d`` with ``W = diag(w) + λ w wᵀ`` is an increasing function of ``Σ w_k d_k``
    for every ``λ >= 0``: all those metrics rank pairs alike, so Spearman cannot tell
    interaction terms from main effects.  Returns whether it warned.
    """
    if not interactions or enc.n_features < 2 or not enc.two_valued().all():
        return False
    warn_user(
        "term-level importance with interactions is not identifiable here: every feature "
        "distance takes two values (categorical or two-valued features), so "
        "W = diag(w) + λ·w wᵀ ranks every pair alike for all λ >= 0 and a fit can move "
        "importance between 'f' and 'f:g' terms freely. Use level='feature' (the default) "
        "for importance, and for evidence of non-additivity the permutation test of "
        "interactions (n_null) or, across subjects, "
        "mlem_neuro.stats.permutation_cluster_test(measure='interactions').")
    return True


# ------------------------------------------------------------------------ pair sources
class PairFeatures:
    """Feature distances of stimulus pairs, computed a block of pairs at a time.

    Parameters
    ----------
    enc_t : encoded features on a torch device
        ``EncodedFeatures.to_torch(...)`` of the evaluated stimuli.
    i, j : array of int | None
        The pairs.  ``None`` (both): every unordered pair ``i < j`` of the stimuli in
        :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order, generated per block (never
        stored).
    """

    def __init__(self, enc_t, i=None, j=None):
        self.enc = enc_t
        self.device = enc_t.values.device
        self.n_stimuli = enc_t.values.shape[0]
        self.n_features = len(enc_t.slices)
        if (i is None) != (j is None):
            raise ValueError(f"i and j must both be pair indices or both be None (every pair); "
                             f"got i={'None' if i is None else 'indices'}, "
                             f"j={'None' if j is None else 'indices'}.")
        self.i = None if i is None else torch.as_tensor(i, device=self.device)
        self.j = None if j is None else torch.as_tensor(j, device=self.device)
        self.n_pairs = count_pairs(self.n_stimuli) if i is None else len(self.i)

    def pairs(self, sel):
        """Stimulus indices ``(i, j)`` of the pairs at positions ``sel`` (slice or tensor)."""
        if self.i is not None:
            return self.i[sel], self.j[sel]
        if isinstance(sel, slice):
            lin = np.arange(sel.start, sel.stop, dtype=np.int64)
        else:
            lin = sel.cpu().numpy()
        i, j = linear_to_pair(lin, self.n_stimuli)
        return (torch.as_tensor(i, device=self.device), torch.as_tensor(j, device=self.device))

    def feature(self, f, sel, perm=None):
        """Distances ``(len,)`` of feature ``f``; ``perm`` relabels the stimuli first."""
        i, j = self.pairs(sel)
        return self.enc.feature_distance(f, i, j, perm=perm).double()

    def distances(self, sel, features=None):
        """Feature distances ``(len, m)`` (float64) of the pairs at positions ``sel``
        (only the columns ``features`` when given)."""
        i, j = self.pairs(sel)
        return self._at(i, j, features)

    def _at(self, i, j, features=None):
        features = range(self.n_features) if features is None else features
        return torch.stack([self.enc.feature_distance(f, i, j) for f in features],
                           dim=-1).double()

    def value_index(self, f, vals):
        """Feature ``f``'s distance of any two stimuli as an index into ``vals``, from
        per-stimulus codes: ``(codes (n,), table (S * S,))`` with ``table[a * S + b]`` the
        index of the distance between stimuli of codes ``a`` and ``b`` (``-1`` when it is
        not in ``vals``), computed with :meth:`feature` itself.  ``None`` when there are
        too many codes for the table to pay."""
        enc = self.enc
        rows = torch.cat([enc.values[:, enc.slices[f]],
                          enc.missing[:, f:f + 1].to(enc.values.dtype)], dim=1)
        _, codes = torch.unique(rows, dim=0, return_inverse=True)
        S = int(codes.max()) + 1
        if S * S > self.n_pairs:
            return None
        first = torch.full((S,), self.n_stimuli, dtype=torch.long, device=self.device)
        first.scatter_reduce_(0, codes, torch.arange(self.n_stimuli, device=self.device),
                              reduce="amin")
        a = torch.arange(S, device=self.device).repeat_interleave(S)
        b = torch.arange(S, device=self.device).repeat(S)
        d = enc.feature_distance(f, first[a], first[b]).double()
        idx = torch.searchsorted(vals, d).clamp_(max=len(vals) - 1)
        return codes, torch.where(vals[idx] == d, idx, -1)

    def codes(self, memory_bytes=None):
        """The pairs' distance rows as a function of stimulus codes
        (:class:`~mlem_neuro.core.ranks.grouped.PairCodes`, for :func:`distinct_rows`;
        ``memory_bytes``: the budget its tables must fit, ``None``: the default)."""
        return PairCodes.from_values(self.enc.values, self.enc.missing, self._at, self.i,
                                     self.j, memory_bytes=memory_bytes)


class _TensorPairs:
    """The :class:`PairFeatures` interface over a ready ``(P, m)`` distance tensor."""

    def __init__(self, D):
        self.D = D
        self.device = D.device
        self.n_pairs, self.n_features = D.shape

    def distances(self, sel, features=None):
        D = self.D[sel].double()
        return D if features is None else D[:, list(features)]


def _as_pairs(D):
    return D if isinstance(D, PairFeatures) else _TensorPairs(torch.as_tensor(D))


def pair_blocks(n, bytes_per_pair, memory_bytes):
    """Slices covering ``range(n)`` (pairs) in blocks of about 1/32 of the memory budget
    ``memory_bytes`` (the runtime's, :attr:`~mlem_neuro.core.runtime.Runtime.memory_bytes`).

    ``bytes_per_pair`` is what the caller holds per pair of a block (at least
    :data:`MIN_BLOCK_PAIRS` pairs per block).
    """
    step = max(MIN_BLOCK_PAIRS, int(memory_bytes // 32 // max(int(bytes_per_pair), 1)))
    return [slice(s, min(s + step, n)) for s in range(0, n, step)]


def _in_memory(P, M, m, T, K, memory_bytes):
    """Whether the batched path (all pairs' term rows, K permuted copies) fits the budget
    ``memory_bytes``.

    The estimate counts the main arrays only; sorts and ``torch.unique`` over the term rows
    about double it (measured: 2.3 GiB peak for 4.5 million pairs estimated at 1.5 GiB),
    hence the margin.
    """
    per_pair = 8 * (T + m + 3 * M + 2 * K) + 80 * K
    return P * per_pair <= memory_bytes // 8


def _check_blockwise(P, M, memory_bytes):
    """Refuse up front when the per-pair vectors of the block-wise path exceed the budget
    ``memory_bytes``."""
    check_memory(8 * P * (2 * M + 5),
                 f"exact Spearman over {P:,} stimulus pairs ({M} model(s): target ranks, "
                 "predictions, a permutation and a sort, one value per pair each)",
                 "evaluate on fewer stimuli (a random subset of them)", budget=memory_bytes)


# ------------------------------------------------------------------------- predictions
def _fold(w, rows, skip=(), terms=None):
    """``Σ_t w_t rows[..., t]`` per model ``(M, ...)``, summed term by term from the first.

    The fixed order makes the value a function of the row alone: equal rows give bitwise
    equal sums (a matrix product, or an update ``q + w_t Δ`` of another row's sum, can round
    them apart and break exact ties).  Terms in ``skip`` are left out.  With ``terms=(k,
    l)``, ``rows`` are feature distances and each term column is computed on the fly, with
    the same values as in :func:`_term_rows`.
    """
    M = w.shape[0]
    shape = (M,) + (1,) * (rows.dim() - 1)
    out = torch.zeros((M,) + tuple(rows.shape[:-1]), dtype=torch.float64, device=rows.device)
    for t in range(w.shape[1]):
        if t not in skip:
            col = rows[..., t] if terms is None else _term_col(rows, terms[0][t], terms[1][t])
            out += w[:, t].reshape(shape) * col
    return out


def _term_col(D, a, b):
    """Term ``d_a d_b`` (doubled when ``a != b``) of feature distances ``D (..., m)``."""
    return D[..., a] * D[..., b] * (2.0 if a != b else 1.0)


def _term_q(w, rest, t, new):
    """Prediction when term ``t`` takes the values ``new``: ``fold(others) + w_t new``."""
    return rest + w[:, t].reshape((-1,) + (1,) * (rest.dim() - 1)) * new


def _feature_parts(W, w, D, k, l, f, skip):
    """``A`` (the terms without feature ``f``) and ``B = Σ_{b≠f} W_fb d_b`` per model."""
    M = W.shape[0]
    shape = (M,) + (1,) * (D.dim() - 1)
    A = _fold(w, D, skip, terms=(k, l))
    B = torch.zeros_like(A)
    for b in range(D.shape[-1]):
        if b != f:
            B += W[:, f, b].reshape(shape) * D[..., b]
    return A, B


def _feature_q(A, B, Wff, new):
    """Prediction ``A + d_f (2 B + W_ff d_f)`` with feature ``f`` at the values ``new``."""
    return A + new * (2.0 * B + Wff * new)


def _term_rows(D, k, l):
    """:func:`~mlem_neuro.core.training.metric.term_matrix` bit for bit (doubling is exact), with a
    broadcast product instead of a column scatter (several times faster on many pairs)."""
    kt = torch.as_tensor(k, device=D.device)
    lt = torch.as_tensor(l, device=D.device)
    scale = torch.where(kt != lt, 2.0, 1.0).to(D.dtype)
    return D[:, kt] * D[:, lt] * scale


def _feature_terms(k, l, f):
    return {t for t, (a, b) in enumerate(zip(k, l)) if a == f or b == f}


# ----------------------------------------------------------- batched (in-memory) path
def _score(q, tz, compiled):
    """Exact Spearman of ``q (..., P)`` against standardised target ranks ``tz``
    (broadcast to ``q``); ``compiled``: the runtime's switch of the compiled kernels.

    A row of ``q`` without ties has the ranks ``1..P`` in its sorted order, so its
    standardised ranks are one fixed vector ``c`` in that order and its Spearman is
    ``c · tz[order]``: a gather and a product instead of scattering and standardising the
    ranks.  Rows with ties take the average ranks (:func:`rankdata`).
    """
    P = q.shape[-1]
    shape = torch.broadcast_shapes(q.shape, tz.shape)
    flat = q.expand(shape).reshape(-1, P)
    if flat.device.type == "cpu" and flat.dtype == tz.dtype == torch.float64 and P > 1:
        fast = _compiled_score(flat, tz, shape, compiled)
        if fast is not None:
            return fast.reshape(shape[:-1])
    tzf = tz.expand(shape).reshape(-1, P)
    order, _, tied = sort_with_ties(flat)
    c = standardize(torch.arange(1, P + 1, dtype=tzf.dtype, device=tzf.device))
    rho = tzf.gather(1, order) @ c
    if bool(tied.any()):
        rows = tied.nonzero()[:, 0]
        rho[rows] = (standardize(rankdata(flat[rows])) * tzf[rows]).sum(dim=-1)
    return rho.reshape(shape[:-1])


def _compiled_score(flat, tz, shape, compiled):
    """:func:`_score` of the rows ``flat (R, P)`` by the compiled keys and scores
    (:func:`mlem_neuro.core.kernels.sorted_scores`; rows with ties, or too close values,
    recomputed here); ``None`` when it does not apply."""
    R, P = flat.shape
    if tz.shape == shape:
        tzr, div = tz.reshape(-1, P), 1
    elif tz.dim() == len(shape) >= 2 and tz.shape[-2] == 1 and tz.shape[:-2] == shape[:-2]:
        tzr, div = tz.reshape(-1, P), shape[-2]
    elif tz.dim() == 1:
        tzr, div = tz.reshape(1, P), R
    else:
        tzr, div = tz.expand(shape).reshape(-1, P), 1
    out = kernels.sorted_scores(np.ascontiguousarray(flat.numpy()),
                                np.ascontiguousarray(tzr.numpy()), div, compiled=compiled)
    if out is None:
        return None
    rho, redo = torch.from_numpy(out[0]), torch.from_numpy(out[1])
    if bool(redo.any()):
        rows = redo.nonzero()[:, 0]
        tz_rows = tzr[torch.div(rows, div, rounding_mode="floor")]
        rho[rows] = (standardize(rankdata(flat[rows])) * tz_rows).sum(dim=-1)
    return rho


def _model_chunks(M, per_model_elems, memory_bytes):
    chunk = min(CHUNK_BYTES, memory_bytes // 16)
    step = max(1, int(chunk // (8 * max(per_model_elems, 1))))
    return [slice(s, s + step) for s in range(0, M, step)]


def _grouped_drops(base, q_groups, key, counts, tz, P, memory_bytes):
    """Score drops ``(M, K)`` for predictions given per group of pairs.

    ``q_groups (M, G)``: prediction of each group; ``key (K, P)``: group of each pair under
    each permutation; ``counts (K, G)``: pairs per group.
    """
    M, G = q_groups.shape
    K = key.shape[0]
    drops = torch.empty(M, K, dtype=torch.float64, device=tz.device)
    for c in _model_chunks(M, K * P * 2, memory_bytes):
        Mc = tz[c].shape[0]
        sums = torch.zeros(Mc, K, G, dtype=torch.float64, device=tz.device).scatter_add_(
            2, key.expand(Mc, K, P), tz[c, None, :].expand(Mc, K, P))
        score = grouped_spearman(q_groups[c, None, :].expand(Mc, K, G), counts[None], sums, P)
        drops[c] = base[c, None] - score
    return drops


def _canonical(uniq, col, vals):
    """Distinct rows of ``uniq`` with column ``col`` set to each of ``vals``.

    Returns the distinct modified rows ``(C, width)`` and the index ``(U * V,)`` of the row
    of each (group, value) among them: groups whose modified rows are equal share one row,
    so their predictions tie exactly.
    """
    U, V = uniq.shape[0], len(vals)
    modified = uniq[:, None, :].repeat(1, V, 1)
    modified[:, :, col] = vals[None, :]
    return torch.unique(modified.reshape(U * V, -1), dim=0, return_inverse=True)


def _distinct_values(values, likely):
    """``torch.unique(values, return_inverse=True)`` (the same tensors), without sorting
    ``values`` when all of them are among the few values ``likely`` (e.g. the column's
    values in the distinct rows): one ``searchsorted`` instead of a sort of ``K × P``."""
    cand = torch.unique(likely)
    idx = torch.searchsorted(cand, values).clamp_(max=len(cand) - 1)
    if not bool((cand[idx] == values).all()):
        return torch.unique(values, return_inverse=True)
    present = torch.bincount(idx.reshape(-1), minlength=len(cand)) > 0
    remap = torch.cumsum(present, dim=0) - 1
    return cand[present], remap[idx]


def _grouping(rows, col, values, P):
    """Groups of pairs by (row group, new value of column ``col``).

    ``rows = (uniq, uid)`` groups the pairs; ``values (K, P)`` is the permuted column.
    Returns the distinct modified rows, the index ``(G,)`` of each group's row among them
    (:func:`_canonical`), the group key ``(K, P)`` of each pair and the counts ``(K, G)``;
    ``None`` when there would be too many groups to be worth it.
    """
    uniq, uid = rows
    vals, vinv = _distinct_values(values, uniq[:, col])
    U, V = uniq.shape[0], len(vals)
    if 2 * U * V > P:
        return None
    canon, index = _canonical(uniq, col, vals)
    key = uid[None, :] * V + vinv
    counts = torch.zeros(key.shape[0], U * V, dtype=torch.float64, device=key.device)
    counts.scatter_add_(1, key, torch.ones_like(key, dtype=torch.float64))
    return canon, index, key, counts


def _base(q_rows, rows, tz):
    """Baseline scores from per-group predictions."""
    uniq, uid = rows
    M, P = tz.shape
    counts = torch.bincount(uid, minlength=uniq.shape[0])
    sums = torch.zeros(M, uniq.shape[0], dtype=torch.float64, device=tz.device)
    sums.scatter_add_(1, uid.expand(M, P), tz)
    return grouped_spearman(q_rows, counts, sums, P)


def baseline_scores(W, D, target, k, l, runtime=None):
    """Exact Spearman ``(M,)`` of each model on pairs with feature distances ``D``.

    ``D`` is a ``(P, m)`` tensor or a :class:`PairFeatures` (then the pairs are walked in
    blocks when all of them would not fit in the memory budget).  ``runtime``: the
    :class:`~mlem_neuro.core.runtime.Runtime` (memory budget, compiled kernels;
    ``None``: ``Runtime()``).
    """
    runtime = Runtime() if runtime is None else runtime
    budget = runtime.memory_bytes
    pairs = _as_pairs(D)
    W = torch.as_tensor(W, dtype=torch.float64, device=pairs.device)
    w = term_weights(W, k, l)
    target = torch.as_tensor(target, device=pairs.device)
    P, M = pairs.n_pairs, W.shape[0]
    if not _in_memory(P, M, pairs.n_features, len(k), 1, budget):
        _check_blockwise(P, M, budget)
        blocks = pair_blocks(P, 8 * (3 * pairs.n_features + 2 * len(k) + 4), budget)
        return _blockwise_base(w, pairs, _blockwise_target_ranks(target, budget), k, l,
                               blocks, None, budget)
    D = pairs.distances(slice(0, P))
    q = _fold(w, D, terms=(k, l))
    return _score(q, standardize(rankdata(target.double())), runtime.compiled)


def _term_drops_per_pair(w, rest, t, new, base, tz, runtime):
    """Score drops ``(M, K)`` when term ``t`` takes the permuted values ``new (K, P)``."""
    M, P = rest.shape
    K = new.shape[0]
    drops = torch.empty(M, K, dtype=torch.float64, device=tz.device)
    for c in _model_chunks(M, K * P * 3, runtime.memory_bytes):
        qp = _term_q(w[c], rest[c, None, :], t, new[None])
        drops[c] = base[c, None] - _score(qp, tz[c, None, :], runtime.compiled)
    return drops


def _term_importance_batched(w, D, target, k, l, K, rng, select, runtime):
    """:func:`term_importance` with every pair's term row in memory (models batched)."""
    dev = D.device
    Pt = _term_rows(D.double(), k, l)
    tz = standardize(rankdata(target.to(dev).double()))
    rows = distinct_rows(Pt)
    if rows is not None:
        base = _base(_fold(w, rows[0]), rows, tz)
    else:
        base = _score(_fold(w, Pt), tz, runtime.compiled)
    M, T = w.shape
    P = Pt.shape[0]
    select = range(T) if select is None else select
    drops = torch.empty(M, len(select), K, dtype=torch.float64, device=dev)
    for c, t in enumerate(select):
        perms = torch.as_tensor(np.stack([rng.permutation(P) for _ in range(K)]), device=dev)
        new = Pt[perms, t]                                      # (K, P)
        grouping = None if rows is None else _grouping(rows, t, new, P)
        if grouping is not None:
            canon, index, key, counts = grouping
            q_groups = _term_q(w, _fold(w, canon, {t}), t, canon[:, t])[:, index]
            drops[:, c] = _grouped_drops(base, q_groups, key, counts, tz, P,
                                         runtime.memory_bytes)
        else:
            drops[:, c] = _term_drops_per_pair(w, _fold(w, Pt, {t}), t, new, base, tz,
                                               runtime)
    return drops, base


def term_importance(W, D, target, k, l, n_permutations, rng, select=None, runtime=None):
    """Score drops ``(M, n_terms, n_permutations)`` and baselines ``(M,)``.

    Parameters
    ----------
    W : (M, m, m) array or tensor
    D : tensor (P, m) | PairFeatures
        Feature distances of the evaluated pairs (a :class:`PairFeatures` computes them per
        block, for more pairs than fit in memory at once).
    target : tensor (M, P)
        Neural distances of the evaluated pairs.
    k, l : array of int
        The terms (:func:`~mlem_neuro.core.training.metric.term_index`).
    n_permutations : int
    rng : numpy Generator
        Draws, for each term in turn, ``n_permutations`` permutations of the pairs.
    select : list of int | None
        Compute only these terms (the drops then have ``len(select)`` columns, in that
        order; e.g. a null model that needs one term's importance).
    runtime : Runtime | None
        The analysis's :class:`~mlem_neuro.core.runtime.Runtime`: its memory budget (the
        batched or the block-wise path, the chunks of models) and whether the compiled
        kernels score; ``None``: ``Runtime()``.

    When the term rows take few distinct values (categorical features), pairs are scored by
    group (:func:`~mlem_neuro.core.ranks.grouped.grouped_spearman`): same scores, no sort of every
    permuted pair.
    """
    runtime = Runtime() if runtime is None else runtime
    budget = runtime.memory_bytes
    pairs = _as_pairs(D)
    W = torch.as_tensor(W, dtype=torch.float64, device=pairs.device)
    w = term_weights(W, k, l)
    target = torch.as_tensor(target, device=pairs.device)
    P, M = pairs.n_pairs, W.shape[0]
    if _in_memory(P, M, pairs.n_features, len(k), n_permutations, budget):
        return _term_importance_batched(w, pairs.distances(slice(0, P)), target, k, l,
                                        n_permutations, rng, select, runtime)
    _check_blockwise(P, M, budget)
    return _blockwise_term(w, pairs, target, k, l, n_permutations, rng, select, budget)


def _feature_drops_per_pair(W, w, D, k, l, f, skip, d_new, base, tz, runtime):
    """Score drops ``(M, K)`` when feature ``f`` takes the distances ``d_new (K, P)``."""
    M, P = tz.shape
    K = d_new.shape[0]
    A, B = _feature_parts(W, w, D, k, l, f, skip)
    drops = torch.empty(M, K, dtype=torch.float64, device=tz.device)
    for c in _model_chunks(M, K * P * 3, runtime.memory_bytes):
        fast = None
        if tz.device.type == "cpu" and tz.dtype == A.dtype == d_new.dtype == torch.float64:
            fast = _compiled_feature_score(A[c], B[c], W[c, f, f], d_new, tz[c],
                                           runtime.compiled)
        if fast is not None:
            drops[c] = base[c, None] - fast
            continue
        qp = _feature_q(A[c, None], B[c, None], W[c, f, f, None, None], d_new[None])
        drops[c] = base[c, None] - _score(qp, tz[c, None, :], runtime.compiled)
    return drops


def _compiled_feature_score(A, B, Wff, d_new, tz, compiled):
    """:func:`_score` of :func:`_feature_q` for the models ``A, B (Mc, P)``, ``Wff
    (Mc,)`` under the permuted distances ``d_new (K, P)``, the predictions computed with
    their packed keys in one compiled pass
    (:func:`mlem_neuro.core.kernels.feature_scores`; rows with ties, or too close
    values, recomputed here); ``(Mc, K)`` or ``None``."""
    Mc, K = A.shape[0], d_new.shape[0]
    if Mc == 0 or A.shape[-1] < 2:
        return None
    out = kernels.feature_scores(*(np.ascontiguousarray(x.numpy()) for x in (A, B, Wff, d_new)),
                                 compiled=compiled)
    if out is None:
        return None
    score, q = out
    tzn = np.ascontiguousarray(tz.numpy())
    rho, redo = score(tzn)
    rho, redo = torch.from_numpy(rho), torch.from_numpy(redo)
    if bool(redo.any()):
        rows = redo.nonzero()[:, 0]
        flat = torch.from_numpy(q)[rows]
        tz_rows = tz[torch.div(rows, K, rounding_mode="floor")]
        rho[rows] = (standardize(rankdata(flat)) * tz_rows).sum(dim=-1)
    return rho.reshape(Mc, K)


def _feature_importance_batched(W, pairs, target, K, rng, select, runtime):
    """:func:`feature_importance` with every pair's distances in memory (models batched)."""
    dev = pairs.device
    M, m = W.shape[0], W.shape[-1]
    k, l = term_index(m, True)
    w = term_weights(W, k, l)
    D = pairs.distances(slice(0, pairs.n_pairs))
    tz = standardize(rankdata(target.to(dev).double()))
    rows = distinct_rows(D, pairs.codes(runtime.memory_bytes))
    if rows is not None:
        base = _base(_fold(w, rows[0], terms=(k, l)), rows, tz)
    else:
        base = _score(_fold(w, D, terms=(k, l)), tz, runtime.compiled)
    P, n = D.shape[0], pairs.n_stimuli
    select = range(m) if select is None else select
    drops = torch.empty(M, len(select), K, dtype=torch.float64, device=dev)
    for c, f in enumerate(select):
        skip = _feature_terms(k, l, f)
        perms = torch.as_tensor(np.stack([rng.permutation(n) for _ in range(K)]), device=dev)
        d_new = torch.stack([pairs.feature(f, slice(0, P), perm=perms[r]) for r in range(K)])
        grouping = None if rows is None else _grouping(rows, f, d_new, P)
        if grouping is not None:
            canon, index, key, counts = grouping
            A, B = _feature_parts(W, w, canon, k, l, f, skip)
            q_groups = _feature_q(A, B, W[:, f, f, None], canon[:, f])[:, index]
            drops[:, c] = _grouped_drops(base, q_groups, key, counts, tz, P,
                                         runtime.memory_bytes)
        else:
            drops[:, c] = _feature_drops_per_pair(W, w, D, k, l, f, skip, d_new, base, tz,
                                                  runtime)
    return drops, base


def feature_importance(W, enc_t, i, j, target, n_permutations, rng, select=None,
                       runtime=None):
    """Score drops ``(M, m, n_permutations)`` when one feature is permuted across stimuli.

    Parameters
    ----------
    W : (M, m, m) array or tensor
    enc_t : encoded features on a torch device
    i, j : array of int | None
        The evaluated pairs; ``None`` (both) for every pair of the stimuli, generated block
        by block instead of stored.
    target : tensor (M, P)
        Neural distances of the evaluated pairs.
    n_permutations : int
    rng : numpy Generator
        Draws, for each feature in turn, ``n_permutations`` permutations of the stimuli.
    select : list of int | None
        Compute only these features (the drops then have ``len(select)`` columns, in that
        order).
    runtime : Runtime | None
        As for :func:`term_importance`.
    """
    runtime = Runtime() if runtime is None else runtime
    budget = runtime.memory_bytes
    pairs = PairFeatures(enc_t, i, j)
    W = torch.as_tensor(W, dtype=torch.float64, device=pairs.device)
    target = torch.as_tensor(target, device=pairs.device)
    P, M, m = pairs.n_pairs, W.shape[0], W.shape[-1]
    if _in_memory(P, M, m, m * (m + 1) // 2 + m, n_permutations, budget):
        return _feature_importance_batched(W, pairs, target, n_permutations, rng, select,
                                           runtime)
    _check_blockwise(P, M, budget)
    return _blockwise_feature(W, pairs, target, n_permutations, rng, select, budget)


# ------------------------------------------------------------------ block-wise path
def _sorted_runs(s):
    """Start positions (int64) of the runs of equal values in the sorted 1-D ``s``."""
    new = torch.ones(s.shape[0], dtype=torch.bool, device=s.device)
    new[1:] = s[1:] != s[:-1]
    return torch.nonzero(new).squeeze(1)


def _centred_ranks(starts, P, sl):
    """Average ranks minus their mean ``(P + 1) / 2`` at the sorted positions ``sl``."""
    pos = torch.arange(sl.start, sl.stop, device=starts.device)
    R = starts.shape[0]
    if R == P:                                                  # no ties
        return pos.to(torch.float64) - (P - 1) / 2.0
    run = torch.searchsorted(starts, pos, right=True) - 1
    nxt = torch.where(run + 1 < R, starts[(run + 1).clamp(max=R - 1)], P)
    return (starts[run] + nxt - 1).to(torch.float64) / 2.0 - (P - 1) / 2.0


def _blockwise_ranks(x, memory_bytes):
    """``standardize(rankdata(x))`` of a 1-D tensor with one sort and no full-size copies."""
    P = x.shape[0]
    s, order = torch.sort(x)
    starts = _sorted_runs(s)
    del s
    out = torch.empty(P, dtype=torch.float64, device=x.device)
    sumsq = 0.0
    for sl in pair_blocks(P, 48, memory_bytes):
        r = _centred_ranks(starts, P, sl)
        out[order[sl]] = r
        sumsq += float((r * r).sum())
    return out.div_(max(math.sqrt(sumsq), 1e-12))


def _blockwise_spearman(q, tz, memory_bytes):
    """Exact Spearman of ``q (P,)`` against standardised ranks ``tz (P,)``, one sort."""
    P = q.shape[0]
    s, order = torch.sort(q)
    starts = _sorted_runs(s)
    del s
    dot = sumsq = 0.0
    for sl in pair_blocks(P, 48, memory_bytes):
        r = _centred_ranks(starts, P, sl)
        dot += float((r * tz[order[sl]]).sum())
        sumsq += float((r * r).sum())
    return dot / math.sqrt(sumsq) if sumsq > 0 else 0.0


def _blockwise_target_ranks(target, memory_bytes):
    """Standardised exact ranks ``(M, P)`` of each model's target, one model at a time."""
    return torch.stack([_blockwise_ranks(row.double(), memory_bytes) for row in target])


def _column_values(pairs, blocks):
    """Distinct values of each feature-distance column, or ``None`` past MAX_GROUPS."""
    vals = [None] * pairs.n_features
    for sl in blocks:
        D = pairs.distances(sl)
        for f in range(D.shape[1]):
            u = torch.unique(D[:, f]) if vals[f] is None else torch.unique(
                torch.cat([vals[f], D[:, f]]))
            if u.shape[0] > MAX_GROUPS:
                return None
            vals[f] = u
    return vals


def _blockwise_groups(pairs, blocks, memory_bytes):
    """``(uniq (U, m), uid (P,))``: the distinct feature-distance rows and each pair's row.

    ``None`` when there are more than :data:`~mlem_neuro.core.ranks.grouped.MAX_GROUPS`
    rows (or more than a quarter of the pairs): the pairs are then scored one by one.
    Found from the stimuli's codes when that pays
    (:class:`~mlem_neuro.core.ranks.grouped.PairCodes`, same result).
    """
    if isinstance(pairs, PairFeatures):
        codes = pairs.codes(memory_bytes)
        if codes.pays():
            return distinct_rows(None, codes)
    vals = _column_values(pairs, blocks)
    if vals is None:
        return None
    sizes = [v.shape[0] for v in vals]
    if math.prod(sizes) >= 2**62:
        return None
    strides = [math.prod(sizes[f + 1:]) for f in range(len(sizes))]
    uid = torch.empty(pairs.n_pairs, dtype=torch.int64, device=pairs.device)
    keys = None
    for sl in blocks:                       # one integer key per row (codes in mixed radix)
        D = pairs.distances(sl)
        key = sum(torch.searchsorted(vals[f], D[:, f].contiguous()) * strides[f]
                  for f in range(len(vals)))
        uid[sl] = key
        keys = torch.unique(key if keys is None else torch.cat([keys, key]))
        if keys.shape[0] > MAX_GROUPS or 4 * keys.shape[0] > pairs.n_pairs:
            return None
    for sl in blocks:
        uid[sl] = torch.searchsorted(keys, uid[sl])
    uniq = torch.stack([vals[f][keys // strides[f] % sizes[f]] for f in range(len(vals))],
                       dim=-1)
    return uniq, uid


def _grouped_pass(q_groups, keys_of, blocks, tz):
    """Exact Spearman ``(M,)`` of predictions given per group; ``keys_of(block)`` gives
    each pair's group (``None`` aborts: returns ``None``)."""
    M, G = q_groups.shape
    P = tz.shape[1]
    counts = torch.zeros(G, dtype=torch.float64, device=tz.device)
    sums = torch.zeros(M, G, dtype=torch.float64, device=tz.device)
    for sl in blocks:
        key = keys_of(sl)
        if key is None:
            return None
        counts += torch.bincount(key, minlength=G).to(torch.float64)
        sums.index_add_(1, key, tz[:, sl])
    return grouped_spearman(q_groups, counts, sums, P)


def _per_pair_pass(fill, tz, blocks, memory_bytes):
    """Exact Spearman ``(M,)`` of predictions ``fill(block) -> (M, len)`` over all pairs."""
    M, P = tz.shape
    q = torch.empty(M, P, dtype=torch.float64, device=tz.device)
    for sl in blocks:
        q[:, sl] = fill(sl)
    return torch.tensor([_blockwise_spearman(q[r], tz[r], memory_bytes) for r in range(M)],
                        dtype=torch.float64, device=tz.device)


def _blockwise_base(w, pairs, tz, k, l, blocks, groups, memory_bytes):
    """Baseline scores ``(M,)`` block by block (grouped when ``groups`` is given)."""
    if groups is not None:
        uniq, uid = groups
        return _grouped_pass(_fold(w, uniq, terms=(k, l)), lambda sl: uid[sl], blocks,
                             tz)
    return _per_pair_pass(lambda sl: _fold(w, pairs.distances(sl), terms=(k, l)),
                          tz, blocks, memory_bytes)


def _blockwise_term(w, pairs, target, k, l, K, rng, select, memory_bytes):
    """:func:`term_importance` walking the pairs in blocks (see the module notes), within
    the budget ``memory_bytes``."""
    M, T = w.shape
    P = pairs.n_pairs
    blocks = pair_blocks(P, 8 * (4 * pairs.n_features + 3 * T + 6) * M, memory_bytes)
    tz = _blockwise_target_ranks(target, memory_bytes)
    groups = _blockwise_groups(pairs, blocks, memory_bytes)
    base = _blockwise_base(w, pairs, tz, k, l, blocks, groups, memory_bytes)
    select = range(T) if select is None else select
    drops = torch.empty(M, len(select), K, dtype=torch.float64, device=tz.device)
    for c, t in enumerate(select):
        grouped = None if groups is None else _term_canon(w, groups[0], k, l, t, P)
        rest = None
        if grouped is None and K > 1:           # the other terms' sum, reused K times
            rest = _cached_parts(lambda sl: (_fold(w, pairs.distances(sl), {t},
                                                   terms=(k, l)),), blocks, M, P, tz.device,
                                 memory_bytes)
        for r in range(K):
            perm = torch.as_tensor(rng.permutation(P), device=tz.device)
            if grouped is not None:
                q_groups, vinv = grouped
                score = _grouped_pass(q_groups, lambda sl: _term_keys(groups[1], vinv, sl, perm),
                                      blocks, tz)
            else:
                score = _per_pair_pass(
                    lambda sl: _blockwise_term_block(w, pairs, k, l, t, sl, perm[sl], rest), tz,
                    blocks, memory_bytes)
            drops[:, c, r] = base - score
    return drops, base


def _cached_parts(parts_of, blocks, M, P, device, memory_bytes):
    """Per-pair arrays ``(M, P)`` filled block by block from ``parts_of(block)`` (a tuple
    of ``(M, len)`` arrays), or ``None`` when holding them too would exceed the budget
    ``memory_bytes``."""
    n_parts = len(parts_of(blocks[0]))
    if 8 * P * ((2 + n_parts) * M + 5) > memory_bytes:
        return None
    out = [torch.empty(M, P, dtype=torch.float64, device=device) for _ in range(n_parts)]
    for sl in blocks:
        for full, part in zip(out, parts_of(sl)):
            full[:, sl] = part
    return out


def _term_canon(w, uniq, k, l, t, P):
    """Grouped predictions ``(M, U * V)`` when term ``t`` takes each of its ``V`` values,
    and the value index ``(U,)`` of each row's own term ``t``; ``None`` for too many."""
    rows = _term_rows(uniq, k, l)
    vals, vinv = torch.unique(rows[:, t], return_inverse=True)
    if 2 * uniq.shape[0] * len(vals) > P:
        return None
    canon, index = _canonical(rows, t, vals)
    return _term_q(w, _fold(w, canon, {t}), t, canon[:, t])[:, index], vinv


def _term_keys(uid, vinv, sl, perm):
    """Group ``uid * V + (value index of term t at the permuted pair)`` of the pairs ``sl``."""
    return uid[sl] * (int(vinv.max()) + 1) + vinv[uid.index_select(0, perm[sl])]


def _blockwise_term_block(w, pairs, k, l, t, sl, src, rest=None):
    """Predictions ``(M, len)`` of the pairs ``sl`` when term ``t`` takes the value it has
    at the pairs ``src`` (``rest``: the other terms' sum of every pair, when kept)."""
    if rest is None:
        rest = _fold(w, pairs.distances(sl), {t}, terms=(k, l))
    else:
        rest = rest[0][:, sl]
    a, b = int(k[t]), int(l[t])
    D = pairs.distances(src, [a] if a == b else [a, b])
    return _term_q(w, rest, t, _term_col(D, 0, 0 if a == b else 1))


def _blockwise_feature(W, pairs, target, K, rng, select, memory_bytes):
    """:func:`feature_importance` walking the pairs in blocks (see the module notes), within
    the budget ``memory_bytes``."""
    M, m = W.shape[0], W.shape[-1]
    k, l = term_index(m, True)
    w = term_weights(W, k, l)
    P = pairs.n_pairs
    blocks = pair_blocks(P, 8 * (5 * m + 3 * len(k) + 6) * M, memory_bytes)
    tz = _blockwise_target_ranks(target, memory_bytes)
    groups = _blockwise_groups(pairs, blocks, memory_bytes)
    base = _blockwise_base(w, pairs, tz, k, l, blocks, groups, memory_bytes)
    select = range(m) if select is None else select
    drops = torch.empty(M, len(select), K, dtype=torch.float64, device=tz.device)
    for c, f in enumerate(select):
        skip = _feature_terms(k, l, f)
        grouped = None if groups is None else _feature_canon(W, w, groups, k, l, f, skip, P)
        index = None if grouped is None else pairs.value_index(f, grouped[1])
        parts, tried = None, False
        for r in range(K):
            perm = torch.as_tensor(rng.permutation(pairs.n_stimuli), device=tz.device)
            score = None
            if grouped is not None:
                score = _grouped_pass(grouped[0], lambda sl: _feature_keys(
                    pairs, groups[1], grouped[1], f, sl, perm, index), blocks, tz)
            if score is None:
                if not tried and r < K - 1:       # A and B of every pair, reused
                    tried = True
                    parts = _cached_parts(lambda sl: _feature_parts(
                        W, w, pairs.distances(sl), k, l, f, skip), blocks, M, P, tz.device,
                        memory_bytes)
                score = _per_pair_pass(lambda sl: _blockwise_feature_block(
                    W, w, pairs, k, l, f, skip, sl, perm, parts), tz, blocks, memory_bytes)
            drops[:, c, r] = base - score
    return drops, base


def _feature_canon(W, w, groups, k, l, f, skip, P):
    """Grouped predictions ``(M, U * V)`` for feature ``f`` and its distinct values."""
    uniq = groups[0]
    vals = torch.unique(uniq[:, f])
    if 2 * uniq.shape[0] * len(vals) > P:
        return None
    canon, index = _canonical(uniq, f, vals)
    A, B = _feature_parts(W, w, canon, k, l, f, skip)
    return _feature_q(A, B, W[:, f, f, None], canon[:, f])[:, index], vals


def _feature_keys(pairs, uid, vals, f, sl, perm, index=None):
    """Group ``uid * V + (index of the permuted distance)`` of the pairs ``sl``; ``None``
    when a permuted distance is not among ``vals`` (a pair list not closed under
    relabelling the stimuli).  ``index`` (:meth:`PairFeatures.value_index`) reads the
    indices from a table of stimulus codes instead of computing the distances."""
    if index is not None:
        codes, table = index
        i, j = pairs.pairs(sl)
        relabelled = codes[perm]
        idx = table[relabelled[i] * (int(codes.max()) + 1) + relabelled[j]]
        if bool((idx < 0).any()):
            return None
        return uid[sl] * len(vals) + idx
    d = pairs.feature(f, sl, perm=perm)
    idx = torch.searchsorted(vals, d).clamp_(max=len(vals) - 1)
    if not bool((vals[idx] == d).all()):
        return None
    return uid[sl] * len(vals) + idx


def _blockwise_feature_block(W, w, pairs, k, l, f, skip, sl, perm, parts=None):
    """Predictions ``(M, len)`` of the pairs ``sl`` with feature ``f``'s stimuli relabelled
    (``parts``: ``A`` and ``B`` of every pair, when kept)."""
    if parts is None:
        A, B = _feature_parts(W, w, pairs.distances(sl), k, l, f, skip)
    else:
        A, B = parts[0][:, sl], parts[1][:, sl]
    return _feature_q(A, B, W[:, f, f, None], pairs.feature(f, sl, perm=perm))
