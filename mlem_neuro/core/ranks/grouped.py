"""Soft Spearman when predictions take few distinct values (categorical feature designs).

With categorical (or few-level) features, the pair term rows ``P`` take only ``U`` distinct
values (``U ≤ 2**m`` for ``m`` binary features) however many pairs a batch holds, so every
model's predictions on a batch of ``b`` pairs are ``U`` values repeated with counts ``c_u``.
The soft rank of :func:`torchsort.soft_rank` (l2 regularisation) can then be computed on the
``U`` values alone, exactly:

* torchsort sorts ``θ`` decreasingly and solves a non-increasing isotonic regression of
  ``s − w`` with ``w = b, b−1, …, 1``.  Inside a run of tied values ``s`` is constant and ``w``
  decreases, so ``s − w`` increases and the run is always pooled into one block: tied values
  get equal soft ranks, whatever order the sort left them in.
* Pooling a run first changes nothing in the pool-adjacent-violators solution, so the
  problem reduces to a *weighted* isotonic regression over ``U`` groups: value
  ``s_u − mean(w over the group's positions)``, weight ``c_u``.
* The Spearman sum then needs the targets only through ``T_u = Σ_{pairs of group u} t_z``.

A step then needs no sort of the ``M × b`` predictions.  The weighted isotonic regression
is solved, on the CPU, by scipy's weighted pool-adjacent-violators over the ``U`` groups of
every model in one call (``O(U)`` per model), inside one numpy pass that also computes the
gradient by hand (:class:`_SoftSpearmanPAV`); on a GPU (or without scipy ≥ 1.12) by the
min–max formula ``v_i = min_{j≤i} max_{k≥i} avg(j..k)``, all intervals at once (``O(U²)``
per model, for few groups), or by torchsort's pool-adjacent-violators kernel on the groups
expanded in sorted order (``O(b)``); the Jacobian (the weighted average over each pooled
block) is the one torchsort's backward applies.  ``tests/test_engine.py`` checks values and
gradients of every path against torchsort on the expanded batch.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from ..constants import MAX_GROUPS, MAX_TABLE_ELEMENTS, MEMORY_BYTES, PAV_ROWS
from ..constants import NORM_EPS as _EPS
from .spearman import inverse_order, sort_order


def distinct_rows(P, codes=None):
    """``(uniq, inverse)`` of the rows of ``P`` when there are few of them, else ``None``.

    ``codes`` (a :class:`PairCodes`) computes the same result, bit for bit, without
    ``P``: when a pair's row is a function of its two stimuli's codes, the distinct rows are
    found among one row per pair of codes and each pair's row index is read from a table
    (``O(pairs)``, no sort of the pairs' rows).  It is used when ``P`` is ``None`` or the
    table pays (:meth:`PairCodes.pays`).
    """
    if codes is not None and (P is None or codes.pays()):
        return codes.distinct_rows()
    n_rows = P.shape[0]
    if n_rows < 4 * 2:
        return None
    # the rows are at least as many as any column's distinct values (a 1-D sort each):
    # numeric designs are ruled out without sorting the rows
    for col in P.T:
        if _few(torch.unique(col), None, n_rows) is None:
            return None
    uniq, inverse = torch.unique(P, dim=0, return_inverse=True)
    return _few(uniq, inverse, n_rows)


def few_rows(n_groups, n_rows):
    """Whether ``n_rows`` pairs that fall into ``n_groups`` distinct rows are trained and
    scored on the groups (the rule of :func:`distinct_rows`): at least 8 pairs, at most
    :data:`MAX_GROUPS` groups and at most a quarter of the pairs."""
    return n_rows >= 4 * 2 and n_groups <= MAX_GROUPS and 4 * n_groups <= n_rows


def _few(uniq, inverse, n_rows):
    if not few_rows(uniq.shape[0], n_rows):
        return None
    return uniq, inverse


class PairCodes:
    """Rows of stimulus pairs that depend on the stimuli only through per-stimulus codes.

    Stimuli with equal encoded features (values and missing flags) have equal feature
    distances to every other stimulus, so with ``S`` distinct stimuli (codes) a pair's row
    (feature distances or terms) is one of ``S (S + 1) / 2`` rows, one per unordered pair of
    codes (distances are symmetric bit for bit).  :meth:`distinct_rows` computes those rows
    once from a representative stimulus of each code, keeps the pairs of codes that occur,
    and looks each pair's group up in an ``S × S`` table.

    Parameters
    ----------
    codes : tensor of int (n,)
        Code of each stimulus.
    first : tensor of int (S,)
        A stimulus of each code.
    rows_of : callable
        ``rows_of(i, j)`` (int64 tensors of stimuli) returns the rows of those pairs, with
        the same operations as for the pairs themselves.
    i, j : tensor of int | None
        The pairs; ``None``: every pair ``i < j`` of the ``n`` stimuli in
        :func:`~mlem_neuro.core.stimuli.pairs.pair_indices` order (never stored).
    memory_bytes : int | None
        The memory budget that :meth:`distinct_rows`'s tables must fit (the runtime's,
        :attr:`~mlem_neuro.core.runtime.Runtime.memory_bytes`; ``None``: the default,
        :data:`~mlem_neuro.core.constants.MEMORY_BYTES`).
    """

    #: pairs (or n² table cells) handled at once when reading the table.
    BLOCK = 2**22

    def __init__(self, codes, first, rows_of, i=None, j=None, memory_bytes=None):
        self.codes, self.first, self.rows_of = codes, first, rows_of
        self.i, self.j = i, j
        self.memory_bytes = MEMORY_BYTES if memory_bytes is None else int(memory_bytes)
        n = codes.shape[0]
        self.n_rows = n * (n - 1) // 2 if i is None else i.shape[0]

    @classmethod
    def from_values(cls, values, missing, rows_of, i=None, j=None, memory_bytes=None):
        """Codes from the encoded features ``values (n, dims)`` and ``missing (n, m)``."""
        rows = torch.cat([values, missing.to(values.dtype)], dim=1)
        _, codes = torch.unique(rows, dim=0, return_inverse=True)
        S = int(codes.max()) + 1 if codes.numel() else 0
        order = torch.arange(codes.shape[0], device=codes.device)
        first = torch.full((S,), codes.shape[0], dtype=torch.long, device=codes.device)
        first.scatter_reduce_(0, codes, order, reduce="amin")
        return cls(codes, first, rows_of, i, j, memory_bytes)

    @property
    def n_codes(self):
        return self.first.shape[0]

    def pays(self):
        """Whether the code table is no larger than the pairs (else sort the rows)."""
        S = self.n_codes
        return S * (S + 1) // 2 <= self.n_rows

    def _pair_keys(self):
        """Ordered code pair ``a * S + b`` of each pair, block by block."""
        S, codes = self.n_codes, self.codes
        if self.i is not None:
            for s in range(0, self.n_rows, self.BLOCK):
                yield slice(s, min(s + self.BLOCK, self.n_rows)), \
                    codes[self.i[s:s + self.BLOCK]] * S + codes[self.j[s:s + self.BLOCK]]
            return
        n = codes.shape[0]
        col = torch.arange(n, device=codes.device)
        step = max(1, self.BLOCK // max(n, 1))
        start = 0
        for r in range(0, n - 1, step):
            rows = torch.arange(r, min(r + step, n - 1), device=codes.device)
            keys = codes[rows, None] * S + codes[None, :]
            keys = keys[col[None, :] > rows[:, None]]        # row-major: pair order
            yield slice(start, start + keys.shape[0]), keys
            start += keys.shape[0]

    def distinct_rows(self):
        """What :func:`distinct_rows` gives for the rows of all the pairs."""
        if self.n_rows < 4 * 2:
            return None
        S, dev = self.n_codes, self.codes.device
        if 2 * 8 * S * S > self.memory_bytes // 4:
            # the S x S tables would not fit: train pair by pair (e.g. tens of thousands of
            # distinct stimuli, whose pairs could not be held together anyway)
            return None
        if 8 * self.n_rows > self.memory_bytes // 4:
            # the group index of every pair (int64) would not fit: train pair by pair on
            # mini-batches (40,000 stimuli: 6.4 GB for 800 million pairs)
            return None
        seen = torch.zeros(S * S, dtype=torch.long, device=dev)
        for _, key in self._pair_keys():
            seen += torch.bincount(key, minlength=S * S)
        seen = seen.view(S, S)
        a, b = torch.nonzero(torch.triu(seen + seen.T) > 0, as_tuple=True)     # a <= b
        uniq, inverse = torch.unique(self.rows_of(self.first[a], self.first[b]), dim=0,
                                     return_inverse=True)
        if _few(uniq, inverse, self.n_rows) is None:
            return None
        table = torch.full((S, S), -1, dtype=torch.long, device=dev)
        table[a, b] = inverse
        table[b, a] = inverse
        table = table.view(-1)
        out = torch.empty(self.n_rows, dtype=torch.long, device=dev)
        for sl, key in self._pair_keys():
            out[sl] = table[key]
        return uniq, out


def _minmax_isotonic(y, c):
    """Non-increasing weighted isotonic regression of ``y (M, U)`` with weights ``c``."""
    M, U = y.shape
    zero = torch.zeros(M, 1, dtype=y.dtype, device=y.device)
    S = torch.cat([zero, torch.cumsum(c * y, dim=-1)], dim=-1)         # (M, U+1)
    C = torch.cat([zero, torch.cumsum(c, dim=-1)], dim=-1)
    # A[j, k] = weighted mean of y[j..k]; only j <= k is meaningful
    num = S[:, None, 1:] - S[:, :U, None]
    den = C[:, None, 1:] - C[:, :U, None]
    upper = torch.ones(U, U, dtype=torch.bool, device=y.device).triu()
    A = torch.where(upper, num / den.clamp_min(_EPS), -math.inf)
    # R[j, i] = max_{k >= i} A[j, k]
    R = torch.flip(torch.cummax(torch.flip(A, dims=[-1]), dim=-1).values, dims=[-1])
    R = torch.where(upper, R, math.inf)
    return R.min(dim=-2).values                                          # v_i = min_{j<=i}


def _expanded_isotonic(s, c, b=None):
    """The same regression as :func:`_minmax_isotonic` for soft ranks, in ``O(b)`` per row.

    ``s (M, U)`` are sorted (decreasing) values, ``c`` their integer counts (each row sums to
    ``b``).  Each value is repeated ``c`` times and torchsort's pool-adjacent-violators
    kernel solves ``isotonic(s_expanded − (b, b−1, …, 1))``; every run of repeats is pooled
    whole, so the solution at a run's first position is the weighted solution for the group
    (``y_u = s_u − mean of w over its positions``).  ``b``: the pairs per row when the
    caller knows it (else read from ``c``, a host synchronisation on a GPU).
    """
    M, U = s.shape
    counts = c.to(torch.long)
    b = int(counts[0].sum()) if b is None else int(b)
    offset = torch.arange(M, device=s.device)[:, None] * U
    block = torch.repeat_interleave((offset + torch.arange(U, device=s.device)).reshape(-1),
                                    counts.reshape(-1), output_size=M * b).view(M, b) - offset
    w = torch.arange(b, 0, -1, dtype=s.dtype, device=s.device)
    dual = _pav_kernel(s.device.type)(s.gather(1, block) - w)
    start = torch.cumsum(counts, dim=-1) - counts
    return dual.gather(1, start)


def _pav_kernel(device_type):
    """torchsort's pool-adjacent-violators kernel for this device, or ``None``.

    torchsort built without its CUDA extension keeps a stub that raises when called in its
    kernel table, so the extension itself must import for ``"cuda"``.
    """
    try:
        from torchsort import ops
        if device_type == "cuda":
            from torchsort import isotonic_cuda  # noqa: F401
        return ops.isotonic_l2[device_type]
    except (ImportError, AttributeError, KeyError, TypeError):
        return None


def _scipy_pav():
    """scipy's weighted pool-adjacent-violators solver, or ``None`` (scipy < 1.12)."""
    try:
        from scipy.optimize import isotonic_regression
    except ImportError:
        return None
    return isotonic_regression


def _pav_rows(y, c):
    """Weighted pool-adjacent-violators (non-increasing) of every row of ``y (M, U)``
    (numpy, float64) with weights ``c (M, U)``: ``(v, starts)``, the solution and the flat
    index (into ``v.ravel()``) of the first element of every pooled block.

    Rows are laid end to end, each shifted above the next by more than the spread of the
    values, so that no block can pool across two rows: one call of scipy's solver (C++)
    per :data:`PAV_ROWS` rows, with no loop over models and no expansion of the groups to
    pairs.  The shift costs precision: values are resolved to about
    ``1e-16 × rows × spread`` (``1e-9`` for 1,000 models of batches of 10,000 pairs).
    """
    M, U = y.shape
    v = np.empty_like(y)
    starts = []
    for lo in range(0, M, PAV_ROWS):
        hi = min(lo + PAV_ROWS, M)
        yb = y[lo:hi]
        shift = ((2.0 * float(yb.max() - yb.min()) + 1.0)
                 * np.arange(hi - lo - 1, -1, -1, dtype=np.float64))[:, None]
        res = _scipy_pav()((yb + shift).ravel(), weights=c[lo:hi].ravel(), increasing=False)
        v[lo:hi] = res.x.reshape(hi - lo, U) - shift
        starts.append(res.blocks[:-1] + lo * U)
    return v, np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)


def _pav_isotonic(y, c):
    """The regression of :func:`_minmax_isotonic` by weighted pool-adjacent-violators on
    the CPU (:func:`_pav_rows`), ``O(U)`` per row."""
    yn = y.detach().cpu().numpy().astype(np.float64, copy=False)
    cn = np.broadcast_to(c.detach().cpu().numpy().astype(np.float64), yn.shape)
    return torch.as_tensor(_pav_rows(yn, cn)[0], dtype=y.dtype)


def _isotonic_method(n_groups, batch_size, n_models, device_type="cpu"):
    """How the weighted isotonic regression of the grouped soft rank is solved.

    ``"pav"`` (CPU, scipy >= 1.12): weighted pool-adjacent-violators over the groups,
    ``O(U)`` per model; ``"table"``: the min-max interval table, ``O(U²)``; ``"expansion"``:
    torchsort's kernel on the groups expanded to the batch's pairs, ``O(b)``.

    On a GPU the table is used while its ``M × U²`` elements fit the memory budget: its
    cost hardly grows with ``U`` while torchsort's CUDA kernel runs one sequential thread
    per model (measured on an H100, 100 models, b = 8,496: table 2.4-4.1 ms per step for
    U = 16-256, expansion 17.9-22.3 ms).  On the CPU the pool-adjacent-violators pass is
    used whenever scipy provides it (``benchmarks/internals/bench_soft_rank.py`` measures
    the three); without it, the table while ``U² ≤ b + 1024``, else the expansion (measured per step
    for 100 models on 2 CPU threads: the table costs about 3.5 µs × U², the expansion about
    4 µs × b + 3 ms).
    """
    fits = n_models * n_groups * n_groups <= MAX_TABLE_ELEMENTS
    if device_type == "cuda":
        return "table" if fits else "expansion"
    if _scipy_pav() is not None:
        return "pav"
    return "table" if fits and n_groups * n_groups <= float(batch_size) + 1024 else "expansion"


class _WeightedIsotonic(torch.autograd.Function):
    """``argmin Σ c_u (v_u − y_u)²`` s.t. ``v`` non-increasing, rows independent.

    ``y`` are the group means of ``s − w`` (soft-rank duals); with ``s`` given, large group
    counts solve it by expansion (:func:`_expanded_isotonic`) instead of the ``O(U²)`` table.
    """

    @staticmethod
    def forward(ctx, y, c, s=None, method="table", n_pairs=None):
        if method == "pav":
            v = _pav_isotonic(y, c)
        elif method == "expansion" and _pav_kernel(s.device.type) is not None:
            v = _expanded_isotonic(s, c, n_pairs)
        else:
            v = _minmax_isotonic(y, c)
        ctx.save_for_backward(v, c)
        return v

    @staticmethod
    def backward(ctx, grad):
        v, c = ctx.saved_tensors
        # pooled blocks: runs of equal values (up to rounding)
        tol = 1e-10 * (1.0 + v.abs().amax(dim=-1, keepdim=True))
        new = torch.ones_like(v, dtype=torch.bool)
        new[:, 1:] = (v[:, :-1] - v[:, 1:]) > tol
        block = torch.cumsum(new, dim=-1) - 1
        g_sum = torch.zeros_like(grad).scatter_add_(1, block, grad)
        c_sum = torch.zeros_like(c).scatter_add_(1, block, c)
        return c * (g_sum / c_sum).gather(1, block), None, None, None, None


def grouped_soft_rank(pred, counts, strength, n_pairs=None):
    """Soft ranks ``(M, U)`` of ``U`` distinct values per row, each repeated ``counts[u]`` times.

    Equal to :func:`mlem_neuro.core.ranks.spearman.soft_rank` applied to the expanded rows (every
    repeat of a value gets the value's soft rank).  ``n_pairs``: ``counts``' sum (an int),
    when the caller knows it: the expansion then reads nothing back from the device.
    """
    c = counts.to(pred.dtype)
    b = c.sum() if c.dim() == 1 else c.sum(dim=-1, keepdim=True)
    mean = (pred * c).sum(dim=-1, keepdim=True) / b
    xc = pred - mean
    norm = torch.sqrt((c * xc * xc).sum(dim=-1, keepdim=True)).clamp_min(_EPS)
    theta = xc / norm * (torch.sqrt(b) * b / math.sqrt(12.0) / strength)
    perm = sort_order(theta, descending=True)
    s = theta.gather(1, perm)
    c_s = c[perm] if c.dim() == 1 else c.gather(1, perm)
    start = torch.cumsum(c_s, dim=-1) - c_s                             # first position
    w_mean = b - start - (c_s - 1.0) / 2.0                               # mean of w = b..1
    method = _isotonic_method(pred.shape[-1], b.max(), pred.shape[0], pred.device.type)
    if c.dim() == 2 and method == "expansion":
        method = "table"                 # the expansion needs integer counts shared by rows
    dual = _WeightedIsotonic.apply(s - w_mean, c_s, s.detach(), method, n_pairs)
    r_sorted = s - dual
    return r_sorted.gather(1, inverse_order(perm))


#: whether :func:`grouped_soft_spearman` uses :class:`_SoftSpearmanPAV` on the CPU.
USE_FUSED = True


def _descending_order(x):
    """``(flat, sorted)``: flat indices (into ``x.ravel()``, row by row) sorting each row of
    ``x`` decreasingly, and the sorted rows.

    The sort runs on float32 keys (numpy sorts them about 3x faster than float64 ones,
    measured on 2,000 rows of 256 values); where rounding to float32 leaves a row out of
    order in float64 (values within a float32 rounding of each other) it is sorted again
    in float64, so the order is always exact.
    """
    M, U = x.shape
    off = (np.arange(M) * U)[:, None]
    flat = np.argsort(-x.astype(np.float32), axis=-1)
    flat += off
    s = np.take(x, flat)
    if (s[:, 1:] > s[:, :-1]).any():
        bad = (s[:, 1:] > s[:, :-1]).any(axis=-1)
        flat[bad] = np.argsort(-x[bad], axis=-1) + off[bad]
        s[bad] = np.take(x, flat[bad])
    return flat, s


def _rowsum(x):
    """Sums of the rows of ``x (M, U)``: a matrix-vector product (numpy's ``sum(-1)``
    over a short last axis measured 3x slower on 80,000 rows of 8)."""
    return x @ np.ones(x.shape[-1], dtype=x.dtype)


def _rowdot(a, b):
    """Row-wise dot products of ``a`` and ``b (M, U)`` (no temporary product array)."""
    return np.einsum("ij,ij->i", a, b)


class _SoftSpearmanPAV(torch.autograd.Function):
    """:func:`grouped_soft_spearman` on the CPU in one pass, with its gradient by hand.

    The same numbers as the chain of torch operations (standardise, sort, weighted
    isotonic regression, standardise, correlate), computed with numpy in place on ``(M, U)``
    arrays and the regression solved by scipy's weighted pool-adjacent-violators, all rows
    in one call per :data:`PAV_ROWS`; the pooled blocks it returns give the Jacobian of
    the regression without detecting runs of equal values.  Backward, for the soft
    Spearman ``ρ = Σ_u z_u T_u`` of weighted-standardised soft ranks ``z``:
    ``∂ρ/∂r = (T − c ΣT / b − ρ c z) / n_r``; through the soft rank ``r = θ − v(θ)`` the
    regression's Jacobian sums the gradient over each pooled block, times
    ``c / Σ_block c``; through the weighted standardisation ``θ = κ x̂``:
    ``∂/∂p = κ / σ (g − c Σg / b − c x̂ Σ g x̂)``.
    """

    @staticmethod
    def forward(ctx, pred, counts, target_sums, strength):
        p = pred.detach().numpy().astype(np.float64, copy=False)
        M, U = p.shape
        c = counts.detach().numpy().astype(np.float64)
        if c.ndim == 1:                  # one set of counts for every model
            b = c.sum()
            xc = p - (p @ c / b)[:, None]
            sigma = np.sqrt(np.maximum((xc * xc) @ c, _EPS ** 2))
        else:                            # counts of each model (rows of c)
            b = _rowsum(c)
            xc = p - (_rowdot(p, c) / b)[:, None]
            sigma = np.sqrt(np.maximum(np.einsum('ij,ij,ij->i', xc, xc, c), _EPS ** 2))
        xhat = xc / sigma[:, None]
        kappa = np.sqrt(b) * b / math.sqrt(12.0) / strength
        flat, s = _descending_order(xhat)                          # θ decreasing
        s *= kappa if c.ndim == 1 else kappa[:, None]
        cs = (np.take(c, flat - (np.arange(M) * U)[:, None]) if c.ndim == 1
              else np.take(c, flat))
        bb = b if c.ndim == 1 else b[:, None]
        start = torch.cumsum(torch.from_numpy(cs), dim=-1).numpy() - cs
        y = s - (bb - start - (cs - 1.0) / 2.0)
        v, blocks = _pav_rows(y, cs)
        rs = s - v                                                 # sorted soft ranks
        t = np.take(target_sums.detach().numpy().astype(np.float64, copy=False), flat)
        rc = rs - (_rowdot(rs, cs) / b)[:, None]
        n_r = np.sqrt(np.maximum(np.einsum('ij,ij,ij->i', cs, rc, rc), _EPS ** 2))
        z = rc / n_r[:, None]
        rho = _rowdot(z, t)
        ctx.save = (flat, c, cs, blocks, xhat, sigma, kappa, z, t, n_r, rho)
        ctx.dtype = pred.dtype
        return torch.from_numpy(rho).to(pred.dtype)

    @staticmethod
    def backward(ctx, grad):
        flat, c, cs, blocks, xhat, sigma, kappa, z, t, n_r, rho = ctx.save
        b = c.sum() if c.ndim == 1 else _rowsum(c)
        g = grad.detach().numpy().astype(np.float64)[:, None]
        # d rho / d r (sorted order)
        g_r = g * (t - cs * (_rowsum(t) / b)[:, None] - cs * z * rho[:, None]) / n_r[:, None]
        # through r = s - v(y): minus the weighted block average of g_r
        flat_c = cs.ravel()
        block_g = np.add.reduceat(g_r.ravel(), blocks)
        block_c = np.add.reduceat(flat_c, blocks)
        lengths = np.diff(np.append(blocks, flat_c.size))
        g_s = g_r - cs * np.repeat(block_g / block_c, lengths).reshape(g_r.shape)
        g_theta = np.empty_like(g_s)
        np.put(g_theta, flat, g_s)                                 # back to group order
        gx = g_theta * (kappa if c.ndim == 1 else kappa[:, None])
        g_p = (gx - c * (_rowsum(gx) / b)[:, None]
               - c * xhat * _rowdot(gx, xhat)[:, None]) / sigma[:, None]
        return torch.from_numpy(g_p).to(ctx.dtype), None, None, None


def grouped_soft_spearman(pred, counts, target_sums, strength, n_pairs=None):
    """Soft Spearman ``(M,)`` from grouped predictions.

    Parameters
    ----------
    pred : tensor (M, U)
        Prediction of each distinct term row (requires grad).
    counts : tensor (U,) | tensor (M, U)
        Pairs of the batch in each group (all > 0), shared by the models or each model's
        own (every row summing to about the same number of pairs; a group a model lacks
        may hold a negligible positive count, e.g. ``1e-9``).
    target_sums : tensor (M, U)
        Sum, over each group's pairs, of the standardised exact target ranks.
    n_pairs : int | None
        The sum of shared ``counts``, when the caller knows it (:func:`grouped_soft_rank`).
    """
    if pred.device.type == "cpu" and _scipy_pav() is not None and USE_FUSED:
        return _SoftSpearmanPAV.apply(pred, counts, target_sums, strength)
    r = grouped_soft_rank(pred, counts, strength, n_pairs)
    c = counts.to(r.dtype)
    b = c.sum() if c.dim() == 1 else c.sum(dim=-1, keepdim=True)
    rc = r - (r * c).sum(dim=-1, keepdim=True) / b
    norm = torch.sqrt((c * rc * rc).sum(dim=-1, keepdim=True)).clamp_min(_EPS)
    return (rc / norm * target_sums).sum(dim=-1)


def grouped_spearman(values, counts, target_sums, n):
    """Exact tie-aware Spearman from grouped values (no gradient).

    Parameters
    ----------
    values : tensor (..., G)
        Value of each group (groups with equal values are tied).
    counts : tensor (..., G)
        Elements in each group (broadcastable to ``values``; zero allowed).
    target_sums : tensor (..., G)
        Sum of the standardised exact target ranks over each group's elements.
    n : int | tensor (..., 1)
        Total number of elements (``counts.sum(-1)``), one for all rows or one per row.
    """
    counts = counts.to(torch.float64).expand_as(values)
    order = sort_order(values)
    s = values.gather(-1, order)
    c_s = counts.gather(-1, order)
    new = torch.ones_like(s, dtype=torch.bool)
    new[..., 1:] = s[..., 1:] != s[..., :-1]
    run = torch.cumsum(new, dim=-1) - 1                         # tie run of each group
    run_count = torch.zeros_like(c_s).scatter_add_(-1, run, c_s)
    run_start = torch.cumsum(run_count, dim=-1) - run_count
    rank = (run_start + (run_count + 1.0) / 2.0).gather(-1, run)  # average rank, 1-based
    rc = rank - (n + 1) / 2.0
    norm = torch.sqrt((c_s * rc * rc).sum(dim=-1)).clamp_min(_EPS)
    target_sums = target_sums.expand_as(values)
    return (rc * target_sums.gather(-1, order)).sum(dim=-1) / norm
