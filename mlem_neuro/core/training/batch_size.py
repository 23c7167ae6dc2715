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

import torch

from ..constants import BATCH_CAP as CAP  # noqa: F401  (tuning constants, defined there once)
from ..constants import BATCH_DRAWS as N_BATCHES
from ..constants import BATCH_GROWTH as GROWTH
from ..constants import BATCH_START as START
from ..constants import BATCH_THRESHOLD as THRESHOLD
from ..ranks.spearman import standardize
from ..stimuli.pairs import n_pairs, sample_pairs
from ..utils import logger


def _grouped_correlation(rows, counts):
    """Correlation of the columns of ``rows`` (U, T), row ``u`` repeated ``counts[u]`` times."""
    c = counts.to(torch.float64)[:, None]
    centred = rows - (c * rows).sum(0) / c.sum()
    cov = (c * centred).T @ centred
    sd = torch.sqrt(cov.diagonal()).clamp_min(1e-12)
    return cov / sd[:, None] / sd[None, :]


def correlation_spread(take_terms, n, size, rng, n_batches=N_BATCHES, groups=None):
    """Largest std, across ``n_batches`` batches of ``size`` pairs, of a term correlation.

    ``take_terms(lin)`` returns the term matrix ``(len(lin), n_terms)`` of linear pair
    indices ``lin``.  ``groups = (rows, group_of_pair)``, when the term rows take few
    distinct values, gives the same correlations from each batch's group counts.
    """
    total = n_pairs(n)
    corr = []
    for _ in range(n_batches):
        lin = sample_pairs(rng, total, size)
        if groups is not None:
            rows, uid = groups
            counts = torch.bincount(uid[torch.as_tensor(lin, device=uid.device)],
                                    minlength=rows.shape[0])
            corr.append(_grouped_correlation(rows.to(torch.float64), counts))
            continue
        Z = standardize(take_terms(lin).to(torch.float64).T)
        corr.append(Z @ Z.T)                              # (T, T)
    corr = torch.stack(corr)
    T = corr.shape[-1]
    if T < 2:
        return 0.0
    iu = torch.triu_indices(T, T, offset=1, device=corr.device)
    return float(corr[:, iu[0], iu[1]].std(dim=0).max())


def select_batch_size(take_terms, n, rng, start=START, threshold=THRESHOLD, growth=GROWTH,
                      cap=CAP, n_batches=N_BATCHES, groups=None):
    """Pairs per training step (``n_pairs(n)`` means full batch).

    ``take_terms(lin)`` returns the feature (and interaction) term columns of the pairs with
    linear indices ``lin``; ``groups`` as in :func:`correlation_spread`.
    """
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
        spread = correlation_spread(take_terms, n, b, rng, n_batches, groups)
        logger.debug("batch size %d: max correlation std %.4f", b, spread)
        if spread < threshold:
            return b
        b = int(math.ceil(b * growth))
