"""Unordered stimulus pairs ``(i, j)``, ``i < j``: indexing, sampling, and CV splits."""
from __future__ import annotations

import numpy as np

from ..checks import check


def n_pairs(n):
    """Number of distinct unordered pairs of ``n`` stimuli."""
    return n * (n - 1) // 2


def pair_indices(n):
    """All pairs ``(i, j)``, ``i < j``, in row-major upper-triangle order (int64 arrays).

    A ``MemoryError`` (:func:`~mlem_neuro.core.memory.check_memory`) is raised before
    allocating when the two index arrays (and numpy's intermediates) would exceed the
    memory budget."""
    from ..memory import check_memory

    check_memory(3 * 8 * n_pairs(n), f"the indices of the {n_pairs(n):,} pairs of {n:,} "
                 "stimuli", "average the trials of each item (items=...) or analyse fewer "
                 "stimuli")
    i, j = np.triu_indices(n, k=1)
    return i.astype(np.int64), j.astype(np.int64)


def linear_to_pair(k, n):
    """Map linear indices into :func:`pair_indices` order back to ``(i, j)``."""
    k = np.asarray(k, dtype=np.int64)
    total = n_pairs(n)
    # row i starts at offset i*n - i*(i+1)/2; invert the quadratic, then fix rounding.
    i = (n - 2 - np.floor(np.sqrt(-8.0 * k + 4.0 * n * (n - 1) - 7) / 2.0 - 0.5)).astype(np.int64)
    start = i * n - i * (i + 1) // 2
    # guard against float rounding at row boundaries
    low = k < start
    i = np.where(low, i - 1, i)
    start = i * n - i * (i + 1) // 2
    high = k >= start + (n - 1 - i)
    i = np.where(high, i + 1, i)
    start = i * n - i * (i + 1) // 2
    j = k - start + i + 1
    if k.size and (k.min() < 0 or k.max() >= total):
        raise IndexError("pair index out of range")
    return i, j


def _unique(x):
    """``np.unique(x)`` of a 1-D integer array (the same sorted values), by a sort: numpy
    2's hash-based ``unique`` measured 17-57x slower on 4,500-300,000 integers."""
    s = np.sort(x)
    keep = np.empty(s.size, dtype=bool)
    keep[:1] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def sample_pairs(rng, n_total, size):
    """``size`` distinct linear pair indices drawn uniformly from ``range(n_total)``."""
    if size >= n_total:
        return rng.permutation(n_total)
    if size * 4 > n_total:
        return rng.permutation(n_total)[:size]
    out = _unique(rng.integers(0, n_total, size=int(size * 1.1) + 16))
    while out.size < size:
        extra = rng.integers(0, n_total, size=size - out.size + 16)
        out = _unique(np.concatenate([out, extra]))
    return rng.permutation(out)[:size]


def kfold_stimuli(n, cv, rng):
    """Split stimuli into ``cv`` shuffled folds: list of ``(train_idx, test_idx)``."""
    cv = check("cv", cv)
    if n < 3 * cv:
        raise ValueError(f"{n} stimuli cannot be split into {cv} folds with at least 3 "
                         "held-out stimuli each (a held-out set needs pairs); lower cv.")
    perm = rng.permutation(n)
    folds = np.array_split(perm, cv)
    return [(np.sort(np.concatenate(folds[:k] + folds[k + 1:])), np.sort(folds[k]))
            for k in range(cv)]
