"""Exact (tie-aware) and differentiable (soft) Spearman correlations over the last axis.

All functions take stacks of shape ``(..., n_pairs)`` and correlate along the last axis.

The soft Spearman uses :func:`torchsort.soft_rank`'s computation (its pool-adjacent-
violators kernel; the sort is numpy's on the CPU, see :class:`_SortedSoftRank`).  Soft
ranks of raw values depend on their scale: with ``regularization_strength=1`` on values
spread over ``[0, 1]`` and thousands of pairs, every value falls into one pooled block and
the soft ranks become an affine function of the values, i.e. the "soft Spearman" silently
turns into Pearson.  Here predictions are first standardised and rescaled so that their
spread matches that of the ranks ``1..n_pairs``.
The soft ranks are then *not* close to the hard ranks rank by rank: where values are denser
than the ranks (a run of nearby values, or adjacent tie groups of categorical designs) the
regularisation pools them.  Measured by ``benchmarks/soft_rank_gap.py`` (predictions
``dᵀ W d`` of random SPD metrics, 5 seeds): the mean |soft - exact rank| is 3-5 % of the
batch size (e.g. 136-253 ranks at 4,096 pairs, 750-1,150 at 20,000; 99th percentile about
twice the mean), for binary, 4-level and continuous features alike.  The soft Spearman
against a noisy target (SNR 1) is within 0.005-0.02 of the exact one (mean |Δρ| over
seeds; largest with 4 features).  Pooling keeps gradients flowing between neighbouring
values; the exact Spearman is what every score and importance reports.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import torch

from .. import kernels
from ..constants import NORM_EPS as _EPS  # noqa: F401
from ..constants import SOFT_RANK_STRENGTH  # noqa: F401  (re-exported: where it is used)


def sort_order(x, descending=False):
    """Indices sorting each row of ``x`` (along the last axis); ties in any order.

    On the CPU numpy's sort is used: on rows of a few hundred values it measured 7-9x
    faster than ``torch.sort`` (500 rows of 256 values, one thread: 1.1 ms vs 9.1 ms).
    """
    if x.device.type == "cpu":
        a = x.detach().numpy()
        return torch.from_numpy(np.argsort(-a if descending else a, axis=-1))
    return torch.sort(x, dim=-1, descending=descending).indices


def inverse_order(order):
    """The inverse of row permutations ``order`` (a scatter, no sort)."""
    ar = torch.arange(order.shape[-1], device=order.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, ar)


def _packed_order(a):
    """Indices sorting the rows of the finite float64 array ``a (M, n)``, nearly: each
    value's order-preserving 64-bit integer key with its low bits replaced by its index,
    sorted as integers (numpy sorts integers with vector instructions, faster than an
    argsort).  Values that differ only in the dropped bits (relative
    ``2**-(52 - bits)``) come out in index order; equal values stay together."""
    n = a.shape[-1]
    bits = max(int(n - 1).bit_length(), 1)
    key = np.ascontiguousarray(a).view(np.int64).copy()
    key ^= (key >> 63) & np.int64(0x7FFFFFFFFFFFFFFF)        # negative floats: flip
    key >>= bits
    key <<= bits
    key |= np.arange(n, dtype=np.int64)
    key.sort(axis=-1)
    key &= np.int64((1 << bits) - 1)
    return key


def sort_with_ties(x):
    """``(order, sorted, tied)`` of the rows of ``x (M, n)``: :func:`sort_order`, the
    sorted rows and whether each row holds equal values.

    Finite float64 rows on the CPU are sorted by :func:`_packed_order`; the rows it
    leaves out of order (values a relative ``1e-11`` or so apart) are sorted again by
    :func:`sort_order`, so the order is exact either way (``benchmarks/internals/bench_ranks.py``
    measures it against an argsort).
    """
    n = x.shape[-1]
    if (x.device.type == "cpu" and x.dtype == torch.float64 and x.dim() == 2 and n > 1
            and n < 2**40 and not x.requires_grad):
        a = x.numpy()
        if np.isfinite(a).all():
            order = torch.from_numpy(_packed_order(a))
            s = x.gather(-1, order)
            bad = (s[:, 1:] < s[:, :-1]).any(dim=-1)
            if bool(bad.any()):
                rows = bad.nonzero()[:, 0]
                order[rows] = sort_order(x[rows])
                s[rows] = x[rows].gather(-1, order[rows])
            return order, s, (s[:, 1:] == s[:, :-1]).any(dim=-1)
    order = sort_order(x)
    s = x.gather(-1, order)
    return order, s, (s[:, 1:] == s[:, :-1]).any(dim=-1)


def rankdata(x):
    """Average ranks (1-based, ties share their mean rank) along the last axis.

    Rows without ties (continuous distances) take their ranks from the sort alone (one
    scatter of the positions); only rows with ties go through the averaging passes, which
    cost several times the sort (measured on 2,100 rows of 12,720 distances, one
    thread: 0.56 s against 2.0-5.5 s).  The ranks are the same either way (exact).
    """
    shape = x.shape
    n = shape[-1]
    flat = x.reshape(-1, n)
    order, s, tied = sort_with_ties(flat)
    pos = torch.arange(1, n + 1, device=x.device, dtype=torch.float64).expand(flat.shape)
    ranks = torch.empty(flat.shape, dtype=torch.float64, device=x.device).scatter_(
        1, order, pos)
    if bool(tied.any()):
        rows = tied.nonzero()[:, 0]
        ranks[rows] = _tie_ranks(s[rows], order[rows])
    return ranks.reshape(shape)


def _tie_ranks(s, order):
    """Average ranks of rows sorted into ``s`` by ``order`` (rows with ties)."""
    n = s.shape[-1]
    new = torch.ones_like(s, dtype=torch.bool)
    new[:, 1:] = s[:, 1:] != s[:, :-1]
    gid = torch.cumsum(new, dim=-1) - 1
    # float64 on every device: in float32 the position sums of large tie groups are not exact
    pos = torch.arange(1, n + 1, device=s.device, dtype=torch.float64).expand_as(s)
    sums = torch.zeros_like(pos).scatter_add_(1, gid, pos)
    counts = torch.zeros_like(pos).scatter_add_(1, gid, torch.ones_like(pos))
    avg = sums / counts.clamp_min(1)
    return torch.empty_like(pos).scatter_(1, order, avg.gather(1, gid))


def constant_rows(target, rtol=1e-9):
    """Rows ``(M,)`` (numpy bool) of ``target (M, P)`` whose values are all equal, up to
    ``rtol`` of the largest magnitude (identical patterns give distances of rounding
    size): their Spearman correlation with anything is undefined.  A row without values
    counts as constant."""
    import numpy as np

    if target.shape[1] == 0:
        return np.ones(target.shape[0], dtype=bool)
    hi, lo = target.amax(dim=1), target.amin(dim=1)
    scale = torch.maximum(hi.abs(), lo.abs())
    return ((hi - lo <= rtol * scale) | (scale == 0)).cpu().numpy()


def standardize(x):
    """Centre along the last axis and scale to unit L2 norm (constant rows → zeros)."""
    xc = x - x.mean(dim=-1, keepdim=True)
    norm = torch.linalg.vector_norm(xc, dim=-1, keepdim=True)
    return xc / norm.clamp_min(_EPS)


def pearson(a, b):
    return (standardize(a) * standardize(b)).sum(dim=-1)


def spearman(a, b):
    """Exact tie-aware Spearman correlation along the last axis (no gradient)."""
    with torch.no_grad():
        return (standardize(rankdata(a)) * standardize(rankdata(b))).sum(dim=-1)


def _rank_scale(x):
    """``x`` (2-D) standardised and rescaled to the spread of the ranks ``1..n``."""
    n = x.shape[-1]
    return standardize(x) * (math.sqrt(n) * n / math.sqrt(12.0))


class _SortedSoftRank(torch.autograd.Function):
    """torchsort's l2 soft rank of ``theta`` (2-D), returned in decreasing order of ``theta``.

    The same computation as :func:`torchsort.soft_rank` (sort, pool-adjacent-violators on
    ``s - (n, n-1, ..., 1)``, soft rank ``s - dual``) and the same backward pass, with the
    sort done by :func:`sort_order` (numpy on the CPU: 1.3 ms against 8.6 ms for
    ``torch.sort`` on 20 rows of 8,496 float32 values, one thread; tied values are always
    pooled, so their order does not matter) and without laying the ranks back out in the
    input's order: a correlation with a target only needs the target gathered in the same
    order.  Returns ``(ranks_sorted, order)``; ``order`` carries no gradient.
    """

    @staticmethod
    def forward(ctx, theta, strength):
        from torchsort import ops

        order = sort_order(theta, descending=True)
        s = (theta / strength).gather(1, order)
        w = torch.arange(theta.shape[-1], 0, -1, dtype=s.dtype, device=s.device)
        dual = ops.isotonic_l2[s.device.type](s - w)
        ctx.strength = strength
        ctx.save_for_backward(s, dual, order)
        ctx.mark_non_differentiable(order)
        return s - dual, order

    @staticmethod
    def backward(ctx, grad, _grad_order):
        from torchsort import ops

        s, dual, order = ctx.saved_tensors
        grad = grad.contiguous()
        g = grad - ops.isotonic_l2_backward[s.device.type](s, dual, grad)
        out = torch.empty_like(g).scatter_(1, order, g)
        return out / ctx.strength, None


def soft_rank(x, strength=SOFT_RANK_STRENGTH):
    """Soft ranks of ``x`` along the last axis after rescaling to the spread of hard ranks."""
    shape = x.shape
    flat = x.reshape(-1, shape[-1])
    r_sorted, order = _SortedSoftRank.apply(_rank_scale(flat), strength)
    return r_sorted.gather(1, inverse_order(order)).reshape(shape)


def soft_spearman(pred, target_z, strength=SOFT_RANK_STRENGTH):
    """Differentiable Spearman between predictions and standardised exact target ranks.

    The soft ranks of :func:`soft_rank`, correlated in sorted order (the target is gathered
    into the order of the predictions instead of the ranks into the order of the pairs).

    Parameters
    ----------
    pred : tensor (..., n_pairs)
        Predictions (requires grad).
    target_z : tensor (..., n_pairs)
        ``standardize(rankdata(target))``, computed once without gradient.
    """
    shape = pred.shape
    n = shape[-1]
    flat = pred.reshape(-1, n)
    r_sorted, order = _SortedSoftRank.apply(_rank_scale(flat), strength)
    t = target_z.expand(shape).reshape(-1, n).gather(1, order).to(r_sorted.dtype)
    return (standardize(r_sorted) * t).sum(dim=-1).reshape(shape[:-1])


class SubsetRanks:
    """Exact average ranks of any subset of columns, from one sort per row.

    Mini-batch training needs, at every step, the ranks of the neural distances *within* the
    batch.  Sorting each row once, the within-batch rank of a batch element is the number of
    batch elements at or before its sorted position: a cumulative count over the batch mask
    laid out in sorted order, with no sort per step.  Ties (equal values) get their average
    rank within the batch, as :func:`rankdata` gives.  A step costs ``O(M P)`` simple
    operations (``P`` columns) against ``O(M b log b)`` for sorting a batch of ``b``.

    Parameters
    ----------
    values : tensor (M, P)
        All values of each row (every pair's neural distance of each model).
    groups : tensor of int (P,) | None
        Group of each column, for :meth:`group_sums`.
    compiled : bool
        Whether :meth:`ranks_of_subsets` may run the compiled kernel (the runtime's
        :attr:`~mlem_neuro.core.runtime.Runtime.compiled`; on the CPU where numba is
        installed).
    """

    def __init__(self, values, groups=None, *, compiled=True):
        M, P = values.shape
        order = sort_order(values)
        s = values.gather(-1, order)
        self.n_columns = P
        self.order = order                                   # sorted position -> column
        # column -> sorted position (M, P)
        self.pos = torch.empty_like(order).scatter_(
            1, order, torch.arange(P, device=values.device).expand(M, P))
        self._pos_t = self._c = None                         # built when first needed
        self.compiled = bool(compiled)
        self.group_sorted = None if groups is None else groups[order]
        new = torch.ones_like(s, dtype=torch.bool)
        new[:, 1:] = s[:, 1:] != s[:, :-1]
        self.ties = bool((~new).any())
        self.first = self.last = None
        if self.ties:
            # sorted positions of the first and last member of each position's tie group
            ar = torch.arange(P, device=values.device).expand(M, P)
            self.first = torch.cummax(torch.where(new, ar, 0), dim=-1).values
            last_flag = torch.ones_like(new)
            last_flag[:, :-1] = new[:, 1:]
            self.last = torch.flip(torch.cummin(torch.flip(torch.where(last_flag, ar, P), [-1]),
                                                dim=-1).values, [-1])

    @property
    def n_rows(self):
        return self.order.shape[0]

    def keep(self, rows):
        """Restrict to the rows selected by ``rows`` (boolean mask or indices)."""
        for name in ("order", "pos", "group_sorted", "first", "last"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[rows])
        self._pos_t = self._c = None

    def rows(self, models):
        """The same ranks for the rows ``models`` only (a slice or indices), leaving these
        alone; a slice of rows shares their arrays (views, no copy)."""
        new = copy.copy(self)
        if not isinstance(models, slice):
            models = torch.as_tensor(np.asarray(models), device=self.order.device)
        for name in ("order", "pos", "group_sorted", "first", "last"):
            value = getattr(self, name)
            if value is not None:
                setattr(new, name, value[models])
        new._pos_t = None
        if self._c is not None:
            rows = models if isinstance(models, slice) else models.cpu().numpy()
            new._c = tuple(None if a is None else a[rows] for a in self._c)
        return new

    def __getstate__(self):
        # compact copies of row views (a pickled view would carry all of its storage)
        state = dict(self.__dict__, _pos_t=None)
        for name in ("order", "pos", "group_sorted", "first", "last"):
            if state[name] is not None:
                state[name] = state[name].clone()
        return state

    @property
    def pos_t(self):
        """Sorted positions stored column-major ``(P, M)``: a batch's rows gather fast."""
        if self._pos_t is None:
            self._pos_t = self.pos.T.contiguous()
        return self._pos_t

    def _compiled(self):
        """The rows as the compiled loop reads them (int32 numpy), or ``None`` (not on
        the CPU, or the compiled kernels off: :attr:`compiled`, numba not installed)."""
        if self.pos.device.type != "cpu" or not (self.compiled and kernels.built()):
            return None
        if self._c is None:
            def i32(t):
                return None if t is None else t.numpy().astype(np.int32)
            self._c = (i32(self.pos), i32(self.first), i32(self.last))
        return tuple(None if a is None else np.ascontiguousarray(a) for a in self._c)

    def ranks_of_subsets(self, cols, out=None):
        """Average ranks ``(M, R, P)`` of the columns of each of ``R`` subsets ``cols
        (R, P)`` (each without repeats) per row: ``ranks(cols[r])`` for every ``r``, in
        one compiled pass on the CPU (a count over each row's sorted positions per subset,
        no sort).  ``out``: a float64 tensor ``(M, R, P)`` (e.g. a view) to fill."""
        cols = torch.as_tensor(cols, device=self.order.device)
        M, (R, P) = self.n_rows, cols.shape
        if out is None:
            out = torch.empty(M, R, P, dtype=torch.float64, device=self.order.device)
        c = self._compiled()
        if c is not None and out.stride(2) == 1 and R > 0 and P > 0:
            kernels.subset_ranks(*c, np.ascontiguousarray(cols.numpy(), np.int64),
                                 out.numpy(), compiled=True)
            return out
        for r in range(R):
            out[:, r] = self.ranks(cols[r])
        return out

    def _sorted_ranks(self, cols):
        """Batch mask and within-batch average ranks, both laid out in sorted order."""
        mask = torch.zeros(self.n_columns, dtype=torch.uint8, device=self.order.device)
        mask[torch.as_tensor(cols, device=mask.device)] = 1
        in_order = torch.take(mask, self.order)              # (M, P)
        count = torch.cumsum(in_order, dim=-1, dtype=torch.int32)
        if not self.ties:
            return in_order, count
        before = count.gather(1, self.first) - in_order.gather(1, self.first)
        upto = count.gather(1, self.last)
        return in_order, before.to(torch.float64) + (upto - before + 1).to(torch.float64) / 2

    def ranks(self, cols):
        """Average ranks ``(M, len(cols))`` (1-based, float64) of columns ``cols`` per row."""
        _, r = self._sorted_ranks(cols)
        cols = torch.as_tensor(cols, device=self.order.device)
        return r.gather(1, self.pos_t[cols].T).to(torch.float64)

    def group_sums(self, cols, counts):
        """Per-group sums ``(M, n_groups)`` of the batch's standardised ranks.

        Equal to summing ``standardize(self.ranks(cols))`` over the columns of each group
        (``groups`` given at construction), without laying ranks out in batch order.
        ``counts`` (``n_groups``,) is the number of batch columns in each group.
        """
        in_order, r = self._sorted_ranks(cols)
        b = len(cols)
        mean = (b + 1) / 2.0
        r = r.to(torch.float64).mul_(in_order)               # zero outside the batch
        if self.ties:
            norm = torch.sqrt(((r * r).sum(dim=-1, keepdim=True) - b * mean * mean)
                              .clamp_min(1e-24))
        else:                                                # ranks 1..b
            norm = math.sqrt(b * (b * b - 1) / 12.0)
        counts = counts.to(torch.float64)
        sums = torch.zeros(r.shape[0], len(counts), dtype=torch.float64, device=r.device)
        sums.scatter_add_(1, self.group_sorted, r)
        return (sums - counts * mean) / norm
