"""Codes of stimuli from their encoded features: one integer per distinct value of a
feature (bins for numeric ones), per distinct feature row, and how groups of stimuli
(runs, items) can be exchanged.  The null designs of the tests
(:mod:`mlem_neuro.core.scoring.nulls`) and the design diagnostics
(:mod:`~mlem_neuro.core.stimuli.design`) read them.
"""
import numpy as np
import pandas as pd


def factorize(*columns):
    """One integer code ``(n,)`` per distinct combination of the given columns (of any
    values: labels are coded first, so strings and objects work too)."""
    coded = []
    for col in columns:
        col = np.asarray(col)
        for c in (col.T if col.ndim == 2 else [col]):
            coded.append(pd.factorize(pd.Series(c, dtype=object if c.dtype == object
                                                else None))[0])
    return np.unique(np.column_stack(coded), axis=0, return_inverse=True)[1].ravel()


def row_codes(enc):
    """Code ``(n,)`` of each stimulus's whole feature row (every value, missing flags)."""
    if enc.n_features == 0:
        return np.zeros(enc.n_stimuli, dtype=np.int64)
    return factorize(enc.values, enc.missing)


def feature_codes(enc, k, kind, n_bins):
    """Integer code ``(n,)`` of each stimulus's value of feature ``k`` (binned if numeric)."""
    block = np.column_stack([enc.values[:, enc.slices[k]], enc.missing[:, k]])
    rows, codes = np.unique(block, axis=0, return_inverse=True)
    if kind != "numeric" or len(rows) <= n_bins:
        return codes.ravel()
    cols = []
    for col in enc.values[:, enc.slices[k]].T:
        edges = np.quantile(col, np.linspace(0, 1, n_bins + 1)[1:-1])
        cols.append(np.searchsorted(edges, col, side="right"))
    cols.append(enc.missing[:, k])
    return np.unique(np.column_stack(cols), axis=0, return_inverse=True)[1].ravel()


def exchange_units(enc, groups):
    """How ``groups`` restrict the nulls: ``None`` (no groups), ``"within"`` (stimuli are
    relabelled within their group: runs, sessions) or ``"whole"`` (every group holds one
    feature row, e.g. the trials of an item: groups are exchanged whole)."""
    if groups is None:
        return None
    g = factorize(np.asarray(groups))
    rows = row_codes(enc)
    per_group = np.unique(np.column_stack([g, rows]), axis=0)[:, 0]
    return "whole" if len(per_group) == len(np.unique(g)) else "within"
