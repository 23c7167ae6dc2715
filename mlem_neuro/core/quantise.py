"""Quantised grouping of numeric feature distances, for training only.

With numeric features the pairs' term rows rarely repeat, so every training step ranks the
batch pair by pair (a sort of each model's ``b`` predictions).  Rounding each numeric
feature's pair distances onto ``q`` equally spaced values spanning ``[0, max]`` puts the
pairs into at most ``q ** m`` cells (``m`` numeric features), and training takes the
grouped path of categorical designs (:mod:`mlem_neuro.core.tied`) on the cells: no
per-pair sort, target ranks summed per cell.  A cell's term row is the mean of its pairs'
exact term rows, so its prediction ``tw · row`` is the mean of its pairs' exact quadratic
forms (the quadratic form is linear in the term row); the rounded rows themselves would
bias ``W`` (measured: 2.6 times the recovery error of exact training with 5 features on
4 levels, against 1.4 times with cell means).

Only training sees the grid: held-out scores and importances are computed on the exact
distances.  Features whose distances take at most ``q`` values (categorical, binary,
few-level ordinal) are left as they are.  ``numeric_levels="auto"`` picks the largest
``q`` (at most :data:`MAX_LEVELS`) whose cells ``q ** m`` times the distinct distance
combinations of the other features stay within :data:`MAX_CELLS`, and trains pair by pair
(exactly) when that ``q`` would be below :data:`MIN_LEVELS`.  The error this introduces is
measured by ``benchmarks/bench_numeric.py`` and ``benchmarks/numeric_recovery.py`` (see
the performance page).
"""
from __future__ import annotations

import math

import torch

from . import tied
from .metric import term_matrix
from .pairs import pair_indices

#: most grid levels per numeric feature chosen by ``numeric_levels="auto"``.
MAX_LEVELS = 16
#: fewest levels ``"auto"`` accepts; below it training stays pair by pair (exact).
MIN_LEVELS = 4
#: largest number of grid cells (distinct term rows) ``"auto"`` aims at.
MAX_CELLS = 1024


def _distinct(col):
    return int(torch.unique(col).numel())


def choose_levels(D, numeric_levels):
    """Grid levels for the feature distances ``D (n_pairs, m)``, or ``None`` (exact).

    ``numeric_levels`` is ``None`` (exact), an int (used as given) or ``"auto"``.  Columns
    with at most :data:`MIN_LEVELS` distinct values count as categorical (kept as they are).
    """
    if numeric_levels is None:
        return None
    counts = [_distinct(D[:, k]) for k in range(D.shape[1])]
    if numeric_levels != "auto":
        return int(numeric_levels) if max(counts) > numeric_levels else None
    numeric = [c for c in counts if c > MIN_LEVELS]
    if not numeric:
        return None
    other = math.prod(c for c in counts if c <= MIN_LEVELS)
    q = MAX_LEVELS
    while q >= MIN_LEVELS and other * q ** len(numeric) > MAX_CELLS:
        q -= 1
    return q if q >= MIN_LEVELS else None


def quantise_distances(D, levels):
    """Round each column of ``D (n_pairs, m)`` onto ``levels`` values spanning ``[0, max]``.

    Columns with at most ``levels`` distinct values are returned unchanged.
    """
    out = D.clone()
    for k in range(D.shape[1]):
        col = D[:, k]
        top = float(col.max())
        if top <= 0 or _distinct(col) <= levels:
            continue
        step = top / (levels - 1)
        out[:, k] = torch.round(col / step) * step
    return out


def training_groups(enc_t, n, k, l, numeric_levels):
    """Groups of the training pairs on a grid of numeric distances, and the levels used.

    Returns ``((rows, group_of_pair), levels)``: pairs sharing a grid cell form a group
    whose term row is the mean of its pairs' exact term rows (so a group's prediction
    ``tw · row`` is the mean of its pairs' exact quadratic forms).  ``(None, None)`` when
    the rule keeps training exact or the grid still leaves too many distinct term rows
    for the grouped path.
    """
    i, j = pair_indices(n)
    D = enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j))
    levels = choose_levels(D, numeric_levels)
    if levels is None:
        return None, None
    groups = tied.distinct_rows(term_matrix(quantise_distances(D, levels), k, l))
    if groups is None:
        return None, None
    cells, inverse = groups
    P = term_matrix(D, k, l)
    counts = torch.bincount(inverse, minlength=cells.shape[0]).to(P.dtype)
    rows = torch.zeros(cells.shape[0], P.shape[1], dtype=P.dtype,
                       device=P.device).index_add_(0, inverse, P) / counts[:, None]
    return (rows, inverse), levels
