"""Plain RSA baselines: Mantel and partial Mantel tests of feature model RDMs.

What a user would run instead of MLEM (rsatoolbox / mne-rsa style): the Spearman
correlation between the neural RDM (Euclidean distances between patterns) and one
feature's model RDM (0/1 for a categorical feature, ``|difference|`` for a numeric one),
tested by permuting the stimuli; the partial test first removes the other features' model
RDMs (ranks, least squares) from both.  The benchmarks and the demo compare MLEM's tests
with these on the same data.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats
from scipy.spatial.distance import pdist, squareform

from .core.checks import check
from .utils import check_random_state, renamed

__all__ = ["mantel_tests", "model_rdm"]


def model_rdm(column):
    """Condensed model RDM of one feature column.

    Parameters
    ----------
    column : Series | array (n_stimuli,)
        The feature's value of each stimulus.

    Returns
    -------
    ndarray (n_stimuli * (n_stimuli - 1) / 2,)
        0/1 (differ or not) for a categorical feature, ``|difference|`` for a numeric
        one, in :func:`scipy.spatial.distance.pdist` order.
    """
    column = pd.Series(column)
    if column.dtype.kind in "fiu":
        return pdist(column.to_numpy(float)[:, None], "cityblock")
    codes = pd.factorize(column)[0]
    return pdist(codes[:, None], "hamming")


def _z(a):
    a = a - a.mean(axis=-1, keepdims=True)
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


@renamed(n_permutations="n_null")
def mantel_tests(X, table, n_null=999, random_state=None, *, n_permutations=None):
    """Mantel and partial Mantel p-values of every feature of ``table``.

    Parameters
    ----------
    X : array (n_stimuli, n_units)
        Patterns; the neural RDM is their Euclidean distances.
    table : DataFrame
        One column per feature, one row per stimulus.
    n_null : int
        Null permutations of the stimuli (the same ones for every feature), named as
        the analyses' null counts.
    random_state : None | int | numpy Generator
        Seeds the permutations.
    n_permutations : int | None
        Former name of ``n_null`` (deprecated; a FutureWarning; both names: a
        TypeError).  In the analyses ``n_permutations`` counts the shuffles of the
        permutation *importance*.

    Returns
    -------
    DataFrame
        One row per feature: ``rho`` (Spearman of the neural and model RDMs), ``p``
        (Mantel, one-sided: greater) and ``p_partial`` (partial Mantel, the other
        features' model RDMs removed; equal to ``p`` with one feature).
    """
    n_permutations = check("n_null", n_null, low=1)
    X = np.asarray(X, dtype=float)
    n = X.shape[0]
    rng = check_random_state(random_state)
    ranks = squareform(stats.rankdata(pdist(X)))
    perms = np.stack([np.arange(n)] + [rng.permutation(n) for _ in range(n_permutations)])
    iu = np.triu_indices(n, 1)
    # a permuted matrix keeps its values, so the ranks of the permuted RDM are permuted ranks
    neural = np.stack([ranks[np.ix_(p, p)][iu] for p in perms])
    models = {name: stats.rankdata(model_rdm(table[name])) for name in table.columns}
    rows = {}
    for name, m in models.items():
        rho = _z(neural) @ _z(m)
        p = float((1 + (rho[1:] >= rho[0] - 1e-12).sum()) / (1 + n_permutations))
        others = [models[o] for o in models if o != name]
        p_partial = p
        if others:
            Q, _ = np.linalg.qr(np.column_stack([np.ones(len(m))] + others))
            m_res = m - Q @ (Q.T @ m)
            n_res = neural - (neural @ Q) @ Q.T
            rho_res = _z(n_res) @ _z(m_res)
            p_partial = float((1 + (rho_res[1:] >= rho_res[0] - 1e-12).sum())
                              / (1 + n_permutations))
        rows[name] = dict(rho=float(rho[0]), p=p, p_partial=p_partial)
    return pd.DataFrame.from_dict(rows, orient="index")
