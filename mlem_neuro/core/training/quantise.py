"""Quantised grouping of numeric feature distances, for training only.

With numeric features the pairs' term rows rarely repeat, so every training step ranks the
batch pair by pair (a sort of each model's ``b`` predictions).  Rounding each numeric
feature's pair distances onto ``q`` equally spaced values spanning ``[0, max]`` puts the
pairs into at most ``q ** m`` cells (``m`` numeric features), and training takes the
grouped path of categorical designs (:mod:`mlem_neuro.core.ranks.grouped`) on the cells: no
per-pair sort, target ranks summed per cell.  A cell's term row is the mean of its pairs'
exact term rows, so its prediction ``tw · row`` is the mean of its pairs' exact quadratic
forms (the quadratic form is linear in the term row); the rounded rows themselves would
bias ``W`` (measured: 2.6 times the recovery error of exact training with 5 features on
4 levels, against 1.4 times with cell means).

With ``batch_size="auto"`` grid training takes mini-batches, as exact training does,
each a union of fixed random blocks of pairs (:class:`GridBlocks`): a step then sums
per-block tables and makes no pass over the pairs.  Full batches made models fitted to
noise run about twice as many steps as exact training's (their training score creeps up
by more than ``tol`` within ``patience``).

Numeric distances that repeat enough to fall into few distinct rows (a feature of few
values) train on those rows, exactly; beyond :data:`TARGET_CELLS` rows they train on the
grid too when it has fewer cells (:func:`prefers_grid`).

Only training sees the grid: held-out scores and importances are computed on the exact
distances.  Features whose distances take at most ``q`` values (categorical, binary,
few-level ordinal) are left as they are.  ``numeric_levels="auto"`` picks the largest
``q`` (at most :data:`MAX_LEVELS`) whose cells ``q ** m`` times the distinct distance
combinations of the other features stay within :data:`TARGET_CELLS` (a step costs each
model about the same per cell), but at least :data:`MIN_LEVELS` while the cells stay
within :data:`MAX_CELLS`, and trains pair by pair (exactly) beyond that.  The error this
introduces is measured by ``benchmarks/bench_numeric.py`` and
``validation/numeric_recovery.py`` (see the validation page).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .. import kernels
from ..constants import DISTINCT_SAMPLE as _SAMPLE
from ..constants import MAX_CELLS, MAX_LEVELS, MIN_LEVELS, N_BLOCKS, TARGET_CELLS
from ..ranks import grouped
from ..ranks.spearman import rankdata
from ..stimuli.pairs import pair_indices
from . import batch_size
from .metric import term_matrix


def _distinct(col, cap=None):
    """Distinct values of ``col``; with ``cap``, any number above ``cap`` when there are
    more than ``cap`` (a numeric column shows that within its first values: no sort of
    all its pairs)."""
    if cap is not None and col.numel() > _SAMPLE:
        if int(torch.unique(col[:_SAMPLE]).numel()) > cap:
            return cap + 1
    return int(torch.unique(col).numel())


def _counts(D, numeric_levels):
    """Distinct values of each column of ``D``, exact up to the most levels a grid of
    ``numeric_levels`` can use (all that :func:`choose_levels` and :func:`cell_index`
    read: whether a column has more values than the levels, and its values when not)."""
    cap = max(MAX_LEVELS, MIN_LEVELS, 0 if numeric_levels in (None, "auto")
              else int(numeric_levels))
    return [_distinct(D[:, k], cap) for k in range(D.shape[1])]


def _renumber(code, span):
    """Rank of each code among the distinct codes in ``[0, span)`` (as the inverse of
    ``torch.unique``): by a table of the codes when ``span`` is small, else a sort."""
    if span <= max(4 * code.numel(), 1 << 16):
        seen = torch.zeros(span, dtype=torch.bool, device=code.device)
        seen[code] = True
        return (torch.cumsum(seen, 0) - 1)[code]
    return torch.unique(code, return_inverse=True)[1]


def choose_levels(D, numeric_levels, counts=None):
    """Grid levels for the feature distances ``D (n_pairs, m)``, or ``None`` (exact).

    ``numeric_levels`` is ``None`` (exact), an int (used as given) or ``"auto"``.  Columns
    with at most :data:`MIN_LEVELS` distinct values count as categorical (kept as they are).
    ``counts``: the distinct values of each column, when already counted.
    """
    if numeric_levels is None:
        return None
    if counts is None:
        counts = _counts(D, numeric_levels)
    if numeric_levels != "auto":
        return int(numeric_levels) if max(counts) > numeric_levels else None
    numeric = [c for c in counts if c > MIN_LEVELS]
    if not numeric:
        return None
    other = math.prod(c for c in counts if c <= MIN_LEVELS)
    q = MAX_LEVELS
    while q > MIN_LEVELS and other * q ** len(numeric) > TARGET_CELLS:
        q -= 1
    return q if other * q ** len(numeric) <= MAX_CELLS else None


def prefers_grid(n_rows, numeric_levels):
    """Whether a design whose pairs fall into ``n_rows`` distinct term rows trains on the
    grid rather than on those rows, when the grid gives fewer cells
    (:class:`~mlem_neuro.core.training.engine.PairSetup`).

    Grouped training costs each model about the same per row at every step, and the grid
    aims at :data:`TARGET_CELLS` cells: beyond them exact rows cost more than the grid
    is allowed to.  Numeric features whose values repeat (a covariate that is 0 for half
    the stimuli, proportions of a norm) gave 529-1,129 exact rows per training fold of
    120 stimuli where the grid gives 28-29 cells; their permutation tests took 62 times
    those of the same design with the covariate in 3 levels, 3.4 times on the grid
    (``benchmarks/bench_numeric_null.py``; fold-mean held-out scores within 0.013 of
    exact training, 0.008 between two seeds of it).  ``numeric_levels=None`` keeps every
    design exact.
    """
    return numeric_levels is not None and n_rows > TARGET_CELLS


def quantise_distances(D, levels):
    """Round each column of ``D (n_pairs, m)`` onto ``levels`` values spanning ``[0, max]``.

    Columns with at most ``levels`` distinct values are returned unchanged.
    """
    out = D.clone()
    for k in range(D.shape[1]):
        col = D[:, k]
        top = float(col.max())
        if top <= 0 or _distinct(col, levels) <= levels:
            continue
        step = top / (levels - 1)
        out[:, k] = torch.round(col / step) * step
    return out


def cell_index(D, levels, counts=None):
    """Grid cell of each pair: ``(n_cells, cell_of_pair)``, cells in lexicographic order.

    The cells are the distinct rows of :func:`quantise_distances` ``(D, levels)``, found
    from integer level indices rather than a sort of the rows: numeric columns contribute
    their level ``round(d / step)``, the others the index of their value among the
    column's distinct values; the mixed-radix code of a pair is then renumbered by one
    1-D sort.  Both indices are increasing in the value, so the cells come in the order
    ``torch.unique(..., dim=0)`` gives the quantised rows (and their term rows: ``d²`` is
    increasing for ``d >= 0``).  ``counts`` as in :func:`choose_levels`.
    """
    if counts is None:
        counts = _counts(D, levels)
    code = torch.zeros(D.shape[0], dtype=torch.long, device=D.device)
    span = 1                                                   # codes lie in [0, span)
    for k in range(D.shape[1]):
        col = D[:, k]
        top = float(col.max())
        if top > 0 and counts[k] > levels:
            idx, radix = torch.round(col / (top / (levels - 1))).long(), levels
        else:
            idx, radix = torch.unique(col, return_inverse=True)[1], counts[k]
        if span * radix >= 2**62:                              # renumber: span <= pairs
            code = _renumber(code, span)
            span = int(code.max()) + 1
        code, span = code * radix + idx, span * radix
    code = _renumber(code, span)
    return int(code.max()) + 1 if code.numel() else 0, code


def training_groups(enc_t, n, k, l, numeric_levels, D=None, P=None):
    """Groups of the training pairs on a grid of numeric distances, and the levels used.

    Returns ``((rows, group_of_pair), levels)``: pairs sharing a grid cell form a group
    whose term row is the mean of its pairs' exact term rows (so a group's prediction
    ``tw · row`` is the mean of its pairs' exact quadratic forms).  ``(None, None)`` when
    the rule keeps training exact or the grid still leaves too many distinct term rows
    for the grouped path.  ``D`` and ``P``: every pair's feature distances and term rows
    (:func:`~mlem_neuro.core.training.metric.term_matrix` of ``D``) when already computed.
    """
    if D is None:
        i, j = pair_indices(n)
        D = enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j))
        P = None
    counts = _counts(D, numeric_levels) if numeric_levels else None
    levels = choose_levels(D, numeric_levels, counts)
    if levels is None:
        return None, None
    n_cells, inverse = cell_index(D, levels, counts)
    if D.shape[0] < 8 or n_cells > grouped.MAX_GROUPS or 4 * n_cells > D.shape[0]:
        return None, None
    if P is None:
        P = term_matrix(D, k, l)
    counts = torch.bincount(inverse, minlength=n_cells).to(P.dtype)
    rows = torch.zeros(n_cells, P.shape[1], dtype=P.dtype,
                       device=P.device).index_add_(0, inverse, P) / counts[:, None]
    return (rows, inverse), levels


class GridBlocks:
    """Mini-batches of grid training: unions of fixed random blocks of the training pairs.

    The pairs are split once, at random, into :data:`N_BLOCKS` blocks of equal size (to
    one pair); a step's batch is ``k`` distinct blocks drawn at random.  A batch's cell
    counts and per-cell target sums are then sums of per-block tables (``O(M · cells ·
    blocks)`` per step, whatever the number of pairs), where drawing pairs one by one and
    ranking the targets within the batch costs ``O(M · pairs)`` per step.  The target
    ranks of a batch are the training pairs' ranks standardised over the batch: a batch's
    pairs keep their order, only the spacing of their ranks differs from ranks within the
    batch.  ``k`` is chosen by the paper's batch-size rule (:func:`select_blocks`) on these
    batches.  Everything here depends on the stimuli and the seed only; :meth:`targets`
    adds a fit's models.

    Parameters
    ----------
    uid : tensor of int (P,)
        Grid cell of each training pair.
    n_cells : int
    rng : numpy Generator
        Draws the blocks.
    """

    def __init__(self, uid, n_cells, rng):
        P, K, dev = uid.shape[0], N_BLOCKS, uid.device
        self.block = torch.empty(P, dtype=torch.long, device=dev)
        self.block[torch.as_tensor(rng.permutation(P), device=dev)] = \
            torch.arange(P, device=dev) * K // P
        self.key = uid * K + self.block                        # (cell, block)
        self.C = torch.bincount(self.key, minlength=n_cells * K).view(n_cells, K).to(
            torch.float64)
        self.n_cells, self.n_pairs, self.k = n_cells, P, None

    def draw_blocks(self, rng, n_draws):
        """The blocks of ``n_draws`` batches ``(n_draws, k)``: each batch's ``k`` blocks are
        the first ``k`` of a random order of the blocks (``N_BLOCKS`` uniform numbers
        sorted).  One call for ``n_draws`` batches draws the same blocks as ``n_draws``
        calls for one, from the same stream: the compiled loop draws a fit's batches in
        advance with one call, the torch loop one batch per step."""
        u = rng.random((n_draws, N_BLOCKS))
        return np.argsort(u, axis=1, kind="stable")[:, :self.k]

    def draw(self, rng):
        """Indicator ``(N_BLOCKS,)`` of ``k`` blocks drawn at random (:meth:`draw_blocks`)."""
        s = torch.zeros(N_BLOCKS, dtype=torch.float64, device=self.C.device)
        s[torch.as_tensor(self.draw_blocks(rng, 1)[0], device=s.device)] = 1.0
        return s

    def select(self, rows, rng):
        """Blocks per batch by the paper's rule (:mod:`~mlem_neuro.core.training.batch_size`).

        Candidate sizes ``b`` grow from ``START`` by ``GROWTH``; each is rounded to whole
        blocks and kept when every term correlation's standard deviation over
        ``N_BATCHES`` batches of that many blocks is below ``THRESHOLD``.  Returns the
        pairs per batch, ``n_pairs`` (full batch) when no union of fewer than all blocks
        is stable.
        """
        b = batch_size.START
        rows = rows.to(torch.float64)
        while True:
            k = int(round(b * N_BLOCKS / self.n_pairs))
            if k >= N_BLOCKS:
                return self.n_pairs
            if k >= 1:
                self.k = k
                idx = torch.as_tensor(self.draw_blocks(rng, batch_size.N_BATCHES),
                                      device=self.C.device)
                S = torch.zeros(batch_size.N_BATCHES, N_BLOCKS, dtype=torch.float64,
                                device=self.C.device).scatter_(1, idx, 1.0).T
                if self._spread(rows, self.C @ S) < batch_size.THRESHOLD:
                    return int(round(k * self.n_pairs / N_BLOCKS))
            b = int(math.ceil(b * batch_size.GROWTH))

    @staticmethod
    def _spread(rows, counts):
        """Largest std over batches of a correlation of the columns of ``rows (U, T)``,
        each batch given by its cell counts (a column of ``counts (U, n_batches)``)."""
        T = rows.shape[1]
        if T < 2:
            return 0.0
        rows = rows - rows.mean(dim=0)                         # same correlations
        c = counts.T                                           # (batches, U)
        mean = (c @ rows) / c.sum(1, keepdim=True)             # (batches, T)
        outer = (rows[:, :, None] * rows[:, None, :]).reshape(rows.shape[0], T * T)
        cov = (c @ outer).view(-1, T, T) - \
            c.sum(1)[:, None, None] * mean[:, :, None] * mean[:, None, :]
        sd = torch.sqrt(cov.diagonal(dim1=1, dim2=2).clamp_min(0)).clamp_min(1e-12)
        corr = cov / sd[:, :, None] / sd[:, None, :]
        iu = torch.triu_indices(T, T, offset=1)
        return float(corr[:, iu[0], iu[1]].std(dim=0).max())

    def targets(self, values, rng, ranked=False, *, compiled=True):
        """The batches of a fit on the models' target distances ``values (M, P)``
        (``ranked``: rows that already hold their own average ranks; ``compiled``: the
        runtime's switch of the compiled kernels, which sum the tables on the CPU)."""
        return _BlockTargets(self, values, rng, ranked, compiled=compiled)


class _BlockTargets:
    """Per-block target tables of a fit's models; :meth:`draw` gives a batch's sums."""

    def __init__(self, blocks, values, rng, ranked=False, *, compiled=True):
        M, P = values.shape
        K = N_BLOCKS
        ranks = (values if ranked else rankdata(values)).to(torch.float64)
        # on the CPU one compiled pass (the same sums, in the same order)
        tables = None if ranks.device.type != "cpu" else kernels.block_tables(
            blocks.key.numpy(), blocks.block.numpy(), ranks.contiguous().numpy(),
            blocks.n_cells * K, K, compiled=compiled)
        if tables is not None:
            T, S1, S2 = (torch.from_numpy(a) for a in tables)
            self.T, self.S1, self.S2 = T.view(M, blocks.n_cells, K), S1, S2
        else:
            self.T = torch.zeros(M, blocks.n_cells * K, dtype=torch.float64,
                                 device=values.device).scatter_add_(
                1, blocks.key.expand(M, P), ranks).view(M, blocks.n_cells, K)
            self.S1 = torch.zeros(M, K, dtype=torch.float64,
                                  device=values.device).index_add_(1, blocks.block, ranks)
            self.S2 = torch.zeros(M, K, dtype=torch.float64,
                                  device=values.device).index_add_(1, blocks.block,
                                                                   ranks * ranks)
        self.blocks, self.rng = blocks, rng

    def draw(self):
        """Cell counts ``(cells,)`` and standardised target sums ``(M, cells)``."""
        s = self.blocks.draw(self.rng)
        counts = self.blocks.C @ s
        b = counts.sum()
        mean = (self.S1 @ s) / b
        norm = torch.sqrt(((self.S2 @ s) - b * mean * mean).clamp_min(1e-24))
        t = (self.T @ s - counts * mean[:, None]) / norm[:, None]
        return counts.round().to(torch.long), t

    def keep(self, rows):
        """Restrict to the models ``rows``."""
        self.T, self.S1, self.S2 = self.T[rows], self.S1[rows], self.S2[rows]
