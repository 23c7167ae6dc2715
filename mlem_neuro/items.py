"""Items and trials: average the trials of each stimulus before an analysis.

A recording often holds several trials of one stimulus (an *item*: a word, an image, an
object at a position).  MLEM compares stimuli, so the analyses accept ``items=`` (a column
of the feature table, or one label per trial) and work on items instead of trials:

- the trials of each item are averaged, per unit and per time point / voxel (the neural
  distance between two items is then that of their mean responses, far less inflated by
  trial noise than the distance between two single trials);
- the feature table keeps one row per item (the trials of an item must agree on every
  feature);
- ``groups`` given per trial are reduced to one label per item (they must be constant
  within an item), and folds split items, so no item has trials on both sides of a fold;
- pairs are formed between items only.

:class:`Items` holds the grouping, built and validated by :func:`check_items` at the
public boundary of every analysis; the analyses call :meth:`Items.average`,
:meth:`Items.reduce_table` and :meth:`Items.reduce_groups` before the neural RDMs are
built, and record :meth:`Items.settings` on their result (``n_items``,
``trials_per_item``...).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .utils import logger

__all__ = ["Items", "check_items"]


def _label(value):
    """A label as a plain Python value (for messages and JSON settings)."""
    return value.item() if isinstance(value, np.generic) else value


class Items:
    """The items of a set of trials: which trials are averaged into which stimulus.

    Parameters
    ----------
    labels : array (n_trials,)
        The item of every trial (any hashable values, no missing value).
    column : str | None
        The feature-table column the labels come from (``None``: given as an array).

    Attributes
    ----------
    labels_ : ndarray (n_items,)
        The items, in the order of their first trial (the order of the averaged stimuli).
    inverse_ : ndarray (n_trials,)
        The position in ``labels_`` of each trial's item.
    counts_ : ndarray (n_items,)
        Trials per item.
    """

    def __init__(self, labels, column=None):
        codes, uniques = pd.factorize(pd.Series(np.asarray(labels, dtype=object)),
                                      sort=False)
        self.column = column
        self.labels_ = np.asarray(uniques, dtype=object)
        self.inverse_ = np.asarray(codes, dtype=np.intp)
        self.counts_ = np.bincount(self.inverse_, minlength=len(self.labels_))
        order = np.argsort(self.inverse_, kind="stable")      # trials of item 0, 1, ...
        self._members = np.split(order, np.cumsum(self.counts_)[:-1])

    @property
    def n_trials(self):
        """Number of trials."""
        return len(self.inverse_)

    @property
    def n_items(self):
        """Number of items (stimuli after averaging)."""
        return len(self.labels_)

    def average(self, data):
        """Mean over the trials of each item along the first axis.

        Parameters
        ----------
        data : array (n_trials, ...)

        Returns
        -------
        ndarray (n_items, ...)
            Row ``k`` is ``data[trials of item k].mean(axis=0)``.
        """
        data = np.asarray(data)
        if data.shape[0] != self.n_trials:
            raise ValueError(f"items label {self.n_trials} trials but the data have "
                             f"{data.shape[0]}.")
        return np.stack([data[rows].mean(axis=0) for rows in self._members])

    def reduce_table(self, table):
        """One row per item: the feature values its trials share.

        Raises a ValueError naming the item and the column when the trials of an item
        disagree on a feature (missing values agree with each other only).
        """
        if len(table) != self.n_trials:
            raise ValueError(f"items label {self.n_trials} trials but the feature table has "
                             f"{len(table)} rows.")
        for col in table.columns:
            codes = pd.factorize(table[col], use_na_sentinel=False)[0]
            self._check_constant(codes, lambda t, col=col: table[col].iloc[t],
                                 f"the feature {col!r}",
                                 "Every trial of an item must have the same features: fix "
                                 "the table, or give distinct items to trials that differ.")
        first = [rows[0] for rows in self._members]
        return table.iloc[first].reset_index(drop=True)

    def reduce_groups(self, groups):
        """One group label per item (``None`` stays ``None``).

        Raises a ValueError when the trials of an item are in different groups: folds
        split items, so an item cannot belong to two groups.
        """
        if groups is None or isinstance(groups, str):   # a str is refused by check_cv
            return groups
        groups = np.asarray(groups)
        if groups.ndim != 1 or len(groups) != self.n_trials:
            raise ValueError(f"groups must hold one label per trial ({self.n_trials}) when "
                             f"items are given; got shape {groups.shape}.")
        codes = pd.factorize(pd.Series(groups, dtype=object), use_na_sentinel=False)[0]
        self._check_constant(codes, lambda t: groups[t], "groups",
                             "Folds split items, so all trials of an item must share one "
                             "group (e.g. an item presented in several runs cannot be "
                             "grouped by run): drop groups or make them constant per item.")
        return groups[[rows[0] for rows in self._members]]

    def _check_constant(self, codes, value, what, hint):
        first = codes[[rows[0] for rows in self._members]]
        bad = np.flatnonzero(codes != first[self.inverse_])
        if bad.size:
            t = int(bad[0])
            k = int(self.inverse_[t])
            t0 = int(self._members[k][0])
            raise ValueError(
                f"the trials of item {_label(self.labels_[k])!r} disagree on {what}: trial "
                f"{t0} has {_label(value(t0))!r}, trial {t} has {_label(value(t))!r} "
                f"({len(np.unique(self.inverse_[bad]))} item(s) disagree). {hint}")

    def drop_from(self, table):
        """``table`` without the items column (an identifier, not a feature)."""
        if self.column is not None and self.column in table.columns:
            logger.info("items: the column %r names the items and is not a feature",
                        self.column)
            return table.drop(columns=self.column)
        return table

    def settings(self):
        """What a result records: the column, the items and their numbers of trials."""
        return dict(items=self.column, n_items=self.n_items,
                    item_labels=[_label(v) for v in self.labels_],
                    trials_per_item=[int(c) for c in self.counts_])


def trial_labels(value, name, n_trials, table=None, metadata=None, what="a label"):
    """One label per trial from ``value``: a column name of ``table`` (looked up there
    first, then in ``metadata``) or an array; ``(labels, column)``, ``column`` the name
    given (``None`` for an array).  Clear errors for an unknown column, a wrong length, a
    type that is neither, and missing labels (``name`` and ``what`` word them)."""
    column = None
    if isinstance(value, str):
        column = value
        sources = [t for t in (table, metadata) if t is not None]
        found = [t for t in sources if value in t.columns]
        if not found:
            have = sorted({str(c) for t in sources for c in t.columns})
            raise ValueError(f"{name}={value!r} names no column of the feature table"
                             f"{' or of epochs.metadata' if metadata is not None else ''} "
                             f"(columns: {have}); pass a column name or one label per "
                             "trial.")
        value = found[0][value].to_numpy()
    elif isinstance(value, (bytes, dict)) or np.ndim(value) == 0:
        raise TypeError(f"{name} must be None, a column name or one label per trial; got "
                        f"{type(value).__name__}.")
    labels = np.asarray(value, dtype=object)
    if labels.ndim != 1 or len(labels) != n_trials:
        raise ValueError(f"{name} must hold one label per trial ({n_trials}); got shape "
                         f"{np.shape(value)}.")
    missing = pd.isna(pd.Series(labels, dtype=object)).to_numpy()
    if missing.any():
        raise ValueError(f"{name}{f' (column {column!r})' if column else ''} has "
                         f"{int(missing.sum())} missing label(s) (NaN/None), e.g. trial "
                         f"{int(np.flatnonzero(missing)[0])}: give every trial {what}.")
    return labels, column


def check_items(items, n_trials, table=None, metadata=None):
    """Validate ``items`` at a public boundary and return an :class:`Items` (or ``None``).

    Parameters
    ----------
    items : None | str | array-like (n_trials,)
        A column name of ``table`` (then also of ``metadata``), or one label per trial.
    n_trials : int
        Number of trials of the data.
    table : DataFrame | None
        The feature table; a column named by ``items`` is looked up here first (and is
        then an identifier, not a feature: the caller drops it).
    metadata : DataFrame | None
        A second table to look the column up in (``epochs.metadata``).

    Returns
    -------
    Items | None
    """
    if items is None:
        return None
    labels, column = trial_labels(items, "items", n_trials, table, metadata,
                                  what="an item")
    try:
        out = Items(labels, column)
    except TypeError as err:
        raise TypeError(f"items labels must be hashable values (str, int...); {err}") \
            from None
    if out.n_items < 3:
        raise ValueError(f"items{f' (column {column!r})' if column else ''} names "
                         f"{out.n_items} item(s) ({[_label(v) for v in out.labels_]}): MLEM "
                         "compares pairs of items and needs at least 3; items names the "
                         "stimulus of each trial, not its condition.")
    logger.info("items: %d trials averaged into %d items (%d to %d trials per item)",
                n_trials, out.n_items, out.counts_.min(), out.counts_.max())
    return out


def check_partitions(partitions, distance, items, n_trials, table=None, metadata=None):
    """Validate ``partitions`` (and a cross-validated ``distance``) at a public boundary.

    Parameters
    ----------
    partitions : None | str | array-like (n_trials,)
        A column name of ``table`` (or of ``metadata``) or one label per trial: the
        independent partitions (runs, sessions) of a cross-validated distance.
    distance : str
        The analysis's neural distance.
    items : Items | None
        The validated items (a cross-validated distance compares their trials).
    n_trials : int
    table, metadata : DataFrame | None
        Where a column name is looked up (``table`` first).

    Returns
    -------
    labels : ndarray (n_trials,) | None
        The partition of each trial, or ``None`` (default partitions, or a plain distance).
    column : str | None
        The column the labels come from (the caller drops it from the features).
    """
    from .core.options import CROSSVALIDATED_DISTANCES

    crossvalidated = distance in CROSSVALIDATED_DISTANCES
    if crossvalidated and items is None:
        raise ValueError(f"distance={distance!r} compares the trials of each item across "
                         "independent partitions of the trials: pass items= (the stimulus "
                         "of each trial), and optionally partitions= (e.g. the run of each "
                         "trial).")
    if partitions is None:
        return None, None
    if not crossvalidated:
        raise ValueError(f"partitions= is used by the cross-validated distances "
                         f"{list(CROSSVALIDATED_DISTANCES)}; got distance={distance!r}. "
                         "Drop partitions, or choose one of those distances.")
    labels, column = trial_labels(partitions, "partitions", n_trials, table, metadata,
                                  what="a partition")
    codes = pd.factorize(pd.Series(labels, dtype=object))[0]
    present = np.zeros((items.n_items, codes.max() + 1), dtype=bool)
    present[items.inverse_, codes] = True
    if codes.max() < 1:
        raise ValueError("partitions holds a single partition; cross-validated distances "
                         "need at least 2 (e.g. runs, sessions).")
    lacking = np.flatnonzero(~present.all(axis=1))
    if lacking.size:
        raise ValueError(f"item {_label(items.labels_[lacking[0]])!r} has no trial in some "
                         f"partition ({int((~present[lacking[0]]).sum())} of "
                         f"{present.shape[1]}): every item needs trials in every partition.")
    return codes.astype(np.intp), column


def trial_partitions(partitions, items, distance, random_state=None):
    """The partition of each trial for a cross-validated ``distance``: ``partitions`` as
    validated by :func:`check_partitions`, or by default each item's trials dealt in turn
    (shuffled by ``random_state``) into as many parts as the rarest item has trials (half
    as many for crossnobis, which also needs residuals within each part)."""
    from .core.rdms.crossdist import default_partitions

    if partitions is not None:
        return partitions
    fewest = int(items.counts_.min())
    if fewest < 2:
        raise ValueError(f"distance={distance!r} needs at least 2 trials of every item; "
                         f"item {_label(items.labels_[int(np.argmin(items.counts_))])!r} has "
                         f"{fewest}.")
    K = max(2, fewest // 2) if distance == "crossnobis" else fewest
    seed = None if random_state is None else int(random_state)
    return default_partitions(items.inverse_, K, random_state=seed)
