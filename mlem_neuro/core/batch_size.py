"""Batch-size selection from the stability of feature-distance correlations.

The MLEM paper's appendix procedure: draw ``p = 64`` batches of ``b`` distinct pairs (start
``b = 4096``), correlate the feature (and interaction) distance columns within each batch, and
keep ``b`` when every correlation's standard deviation across batches is below ``0.01``;
otherwise grow ``b ← 1.2 b`` and try again.  If ``b`` reaches the number of pairs, all pairs
are used (full batch); if it passes ``cap`` the cap is used and a warning says so.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from ..utils import logger
from .metric import term_matrix
from .pairs import linear_to_pair, n_pairs, sample_pairs
from .spearman import standardize

START = 4096
N_BATCHES = 64
THRESHOLD = 0.01
GROWTH = 1.2
CAP = 2**18


def correlation_spread(enc_t, n, k, l, size, rng, n_batches=N_BATCHES):
    """Largest std, across ``n_batches`` batches of ``size`` pairs, of a term correlation."""
    total = n_pairs(n)
    T = len(k)
    if T < 2:
        return 0.0
    corr = torch.empty(n_batches, T, T, dtype=torch.float64)
    for r in range(n_batches):
        i, j = linear_to_pair(sample_pairs(rng, total, size), n)
        D = enc_t.pair_distances(torch.as_tensor(i), torch.as_tensor(j)).to(torch.float64)
        Z = standardize(term_matrix(D, k, l).T)          # (T, size)
        corr[r] = (Z @ Z.T).cpu()
    iu = torch.triu_indices(T, T, offset=1)
    return float(corr[:, iu[0], iu[1]].std(dim=0).max())


def select_batch_size(enc_t, n, k, l, rng, start=START, threshold=THRESHOLD, growth=GROWTH,
                      cap=CAP, n_batches=N_BATCHES):
    """Pairs per training step (``n_pairs(n)`` means full batch)."""
    total = n_pairs(n)
    b = int(start)
    while True:
        if b >= total:
            logger.debug("batch size: all %d pairs (full batch)", total)
            return total
        if b > cap:
            warnings.warn(f"batch-size selection reached its cap of {cap} pairs before the "
                          f"feature-distance correlations stabilised (std < {threshold}); "
                          f"training uses batches of {cap} of the {total} pairs. Pass an "
                          "explicit batch_size to override.", UserWarning, stacklevel=3)
            return cap
        spread = correlation_spread(enc_t, n, k, l, b, rng, n_batches)
        logger.debug("batch size %d: max correlation std %.4f", b, spread)
        if spread < threshold:
            return b
        b = int(math.ceil(b * growth))
