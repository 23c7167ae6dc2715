"""Design diagnostics before fitting: features whose permutation tests cannot work.

The test of a feature ``f`` (``n_null > 0``) relabels the stimuli only among stimuli with
the same values of every other feature (numeric features cut into the quantile bins of
:mod:`mlem_neuro.core.scoring.nulls`; with ``groups``, also within each group).  Some designs make
that conditional null powerless, silently:

* **nested**: ``f`` is a function of another feature (``animacy`` of ``category``: each
  level of ``category`` holds one value of ``animacy``), or of the combination of several
  (of all the others, at worst; with ``groups``, of the others within groups).  Inside
  every stratum of the null all stimuli share their value of ``f``: the relabelling never
  moves it (the analysis reports its p-values as NaN, not testable).  Checked exactly on
  the codes the null uses (:func:`mlem_neuro.core.scoring.nulls.strata`); the finding names an
  irreducible set of determining features: every single feature that determines ``f``
  alone, else the combination left after dropping, one by one, the features not needed.
* **duplicate**: two features carry the same information: each determines the other
  (categorical or ordinal features inducing the same partition of the stimuli, whatever
  the labels), or their pair-distance columns are identical (a numeric copy, or ``1000 x
  + 250`` of ``x``: min-max scaling makes them equal).  Neither one's test can move given
  the other, and without tests their importance splits between them.
* **correlated**: the Spearman correlation of two features' pair-distance columns,
  over all stimulus pairs, is at least :data:`CORRELATION_THRESHOLD` in absolute value
  (pairs already reported as duplicate or nested are not reported again).  The null can
  still move each one, but little: it keeps most of what they share, and both tests lose
  power.  Above :data:`MAX_PAIRS` pairs the correlation uses that many pairs drawn with
  a fixed seed (:data:`PAIR_SEED`), so the same table always gives the same findings
  (drawing 2,000 of 19,900 pairs moved correlations by sd 0.006-0.020; on 50,000 pairs
  that is below 0.005); :func:`diagnose_design` took 0.036 s on 2,000 stimuli and 6
  features (median of 7 calls, one thread).
* **constant_within_groups**: with ``groups`` (runs, sessions), a feature constant within
  every group: a null that relabels within groups cannot move it.  Groups that each hold
  one feature row (the trials of an item) are exchanged whole by the nulls: the design is
  then checked on one row per group.

Why pair distances and Spearman: the model sees the features only through their pair
distances and is scored on ranks, so the rank correlation of the distance columns is what
two features share for it.  Correlations over pairs are lower than over stimuli: two
binary features equal on a fraction ``q`` of the stimuli (independent elsewhere)
correlate about ``q`` over stimuli, about ``q²`` over pairs.  Nesting is not a
correlation: ``animacy`` (3 of 8 categories animate) correlates 0.33 with ``category``
over pairs, yet its test can never move; hence the exact check.

**The threshold, measured** (``validation/design_collinearity.py``): 48 stimuli, a binary
``A`` (balanced) and ``B``, each coded in its own subspace of 16 units plus noise;
:func:`mlem_neuro.mlem_array` with ``cv=3``, ``n_null=99``; power = share of 200 datasets
with ``A``'s p < 0.05 (a NaN p-value counts as not significant).  ``B`` is a binary copy
of ``A`` on a fraction of the stimuli (independent elsewhere); or a numeric strength
``B = q·A·U(0.5, 1) + (1 - q)·U(0, 1)``; or an association strength ``B = A·U(0.05, 1)``
(0 for every "unrelated" stimulus, > 0 for every "related" one: ``FAS``).  ``A`` alone
encoded; ``r`` is the mean pair-distance Spearman correlation:

===================  =====  =====  =====  =====  =====  =====  =====  ======
binary ``B``: r      0.00   0.25   0.51   0.64   0.74   0.82   0.92   1.00
power of ``A``       0.78   0.78   0.74   0.68   0.56   0.46   0.12   0 (NaN)
numeric ``B``: r     0.00   0.30   0.72   0.83   0.86   0.87   0.87
power of ``A``       0.76   0.56   0.21   0.18   0.14   0.14   0.23
``FAS``: r           0.63
power of ``A``       0.44
===================  =====  =====  =====  =====  =====  =====  =====  ======

With both features encoded (equal weights) ``A``'s powers were within 0.1 of these except
at the last numeric point (0.49), and ``B``'s fell alike (binary: 0.83 at r = 0 to 0.51 at
r = 0.82).  Pair-distance correlation does not predict power alone: a numeric feature
whose quantile bins (the strata of the other's null) separate a categorical feature's
levels costs power earlier than two categorical features with the same r.  From r = 0.6
on, every design measured had lost power (13 % at r = 0.64 for binary ``B``, 42 % at 0.63
for ``FAS``, 72 % at 0.72 for the numeric strength), hence :data:`CORRELATION_THRESHOLD`
= 0.6.  Below it a numeric feature can still cost a quarter of the power (r = 0.30 here):
the correlation is a screen, not a power calculation.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np

from ..constants import (
    CORRELATION_THRESHOLD,  # noqa: F401  (tuning constants, defined there once)
    NULL_BINS,
)
from ..constants import DESIGN_MAX_PAIRS as MAX_PAIRS
from .codes import exchange_units
from .codes import feature_codes as _feature_codes
from .pairs import linear_to_pair, n_pairs, pair_indices, sample_pairs

#: the kinds of :class:`DesignFinding`, in the order :func:`diagnose_design` reports them.
FINDING_KINDS = ("duplicate", "nested", "correlated", "constant_within_groups")


#: seed of the pairs drawn when a design has more than :data:`MAX_PAIRS` pairs.
PAIR_SEED = 0


@dataclass(frozen=True)
class DesignFinding:
    """A property of the design that breaks or weakens a test.

    Parameters
    ----------
    kind : str
        See the attribute of the same name.
    features : tuple of str
        See the attribute of the same name.
    value : float
        See the attribute of the same name.
    message : str
        See the attribute of the same name.

    Attributes
    ----------
    kind : str
        One of :data:`FINDING_KINDS`.
    features : tuple of str
        The feature concerned first, then the features involved (``"nested"``: the
        features that determine it; ``"duplicate"``, ``"correlated"``: the other one;
        ``"constant_within_groups"``: the feature alone).
    value : float
        The measure: ``"duplicate"`` and ``"correlated"``: the Spearman correlation of
        the two features' pair distances; ``"nested"``: the number of cells (levels or
        combinations of levels) of the determining features, each holding one value of
        the nested feature; ``"constant_within_groups"``: the number of groups.
    message : str
        What the design is, in one sentence (:func:`warn_design` adds what it does to
        the tests or to the importance).
    """

    kind: str
    features: tuple
    value: float
    message: str


# --------------------------------------------------------------------------- codes
def _dense(codes):
    """``codes`` renumbered 0, 1, ... in sorted order (int64)."""
    return np.unique(codes, return_inverse=True)[1].ravel().astype(np.int64)


def _combine(codes):
    """One integer code per stimulus for the combination of code columns (``None`` for
    no columns).  Pairs of columns are merged as ``a * (max(b) + 1) + b`` and renumbered,
    which stays far below the int64 range (codes are below the number of stimuli)."""
    codes = [np.asarray(c, dtype=np.int64) for c in codes]
    if not codes:
        return None
    out = codes[0]
    for c in codes[1:]:
        out = _dense(out * (int(c.max()) + 1) + c)
    return out


def _exact_codes(enc, k):
    """Integer code ``(n,)`` of each stimulus's exact value of feature ``k`` (missing:
    a value of its own)."""
    columns = [_dense(col) for col in enc.values[:, enc.slices[k]].T]
    return _combine(columns + [enc.missing[:, k].astype(np.int64)])


def _determines(cells, target):
    """Whether ``target`` (codes) is constant within every cell of ``cells`` (codes)."""
    if cells is None:
        return False
    combined = cells * (int(target.max()) + 1) + target
    return np.count_nonzero(np.bincount(combined)) == np.count_nonzero(np.bincount(cells))


def _n_cells(cells):
    return int(len(np.unique(cells)))


# -------------------------------------------------------------------------- pairs
def _design_pairs(n, max_pairs=MAX_PAIRS, seed=PAIR_SEED):
    """All pairs of ``n`` stimuli, or ``max_pairs`` of them drawn with ``seed`` (sorted)."""
    total = n_pairs(n)
    if total <= max_pairs:
        return pair_indices(n)
    rng = np.random.default_rng(seed)
    return linear_to_pair(np.sort(sample_pairs(rng, total, int(max_pairs))), n)


def _average_ranks(x):
    """Ranks 1..N of ``x``, ties given their average rank (``scipy.stats.rankdata``)."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return (ends - (counts - 1) / 2.0)[inverse.ravel()]


def pair_distance_correlations(enc, max_pairs=MAX_PAIRS, seed=PAIR_SEED):
    """Spearman correlations between the features' pair-distance columns.

    Parameters
    ----------
    enc : EncodedFeatures
        The encoded feature table (:meth:`FeatureSpace.transform`).
    max_pairs : int
        All stimulus pairs are used up to this many; above, this many pairs drawn
        uniformly with ``seed`` (the same pairs at every call).
    seed : int
        Seed of the drawn pairs.

    Returns
    -------
    corr : ndarray (n_features, n_features)
        Spearman correlations (average ranks for ties); NaN where a column is constant
        over the pairs used.
    distances : ndarray (n_pairs_used, n_features)
        The pair distances they were computed on.
    """
    i, j = _design_pairs(enc.n_stimuli, max_pairs, seed)
    d = enc.pair_distances(i, j)
    if d.shape[1] < 2 or d.shape[0] < 2:
        return np.full((d.shape[1], d.shape[1]), np.nan), d
    ranks = np.column_stack([_average_ranks(col) for col in d.T])
    ranks -= ranks.mean(axis=0)
    norm = np.sqrt((ranks ** 2).sum(axis=0))
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (ranks.T @ ranks) / np.outer(norm, norm)
    corr[:, norm == 0] = np.nan
    corr[norm == 0, :] = np.nan
    return np.clip(corr, -1.0, 1.0), d


# -------------------------------------------------------------------------- checks
def _check_groups(groups, n):
    groups = np.asarray(groups)
    if groups.ndim != 1 or len(groups) != n:
        raise ValueError(f"groups must hold one label per stimulus ({n}); got shape "
                         f"{groups.shape}.")
    try:
        return np.unique(groups, return_inverse=True)[1].ravel()
    except TypeError:   # mixed types: compare as text
        return np.unique(groups.astype(str), return_inverse=True)[1].ravel()


def _quote(names):
    return ", ".join(repr(n) for n in names)


def _duplicates(names, exact, null, dist):
    """Pairs ``(a, b)``, ``a < b``, whose features carry the same information."""
    m, found = len(names), {}
    for a in range(m):
        for b in range(a + 1, m):
            mutual = _determines(null[a], exact[b]) and _determines(null[b], exact[a])
            same = (_combine([exact[a], exact[b]]).max() == exact[a].max() == exact[b].max()
                    and np.array_equal(dist[:, a], dist[:, b]))
            if mutual or same:
                found[(a, b)] = "same distance for every pair" if same else (
                    "each determines the other: the same partition of the stimuli")
    return found


def _minimal_set(target, candidates, codes):
    """Drop, one by one, candidates not needed for ``codes`` to determine ``target``."""
    kept = list(candidates)
    for c in list(kept):
        rest = [k for k in kept if k != c]
        if rest and _determines(_combine([codes[k] for k in rest]), target):
            kept = rest
    return kept


def _label(k, names):
    """Feature ``k``'s name, quoted; ``None`` stands for the groups."""
    return "the groups" if k is None else repr(names[k])


def _nested(a, names, kinds, exact, null, group_codes, dups):
    """The ``"nested"`` finding of feature ``a`` (or ``None``) and the single features
    that determine it (a duplicate of one of them is not named again)."""
    m, f = len(names), names[a]
    singles = [b for b in range(m) if b != a and _determines(null[b], exact[a])]
    named = [b for b in singles
             if not any((min(b, c), max(b, c)) in dups for c in singles if c < b)]
    if singles:
        b = named[0]
        cells = _n_cells(null[b])
        unit = ("quantile bins" if kinds[b] == "numeric" and _n_cells(exact[b]) > cells
                else "levels")
        det = [names[k] for k in named]
        what = (f"each of the {cells} {unit} of {det[0]!r} holds one value of {f!r}"
                if len(det) == 1 else f"each of {_quote(det)} alone fixes it")
        return DesignFinding("nested", (f, *det), float(cells),
                             f"{f!r} is determined by {_quote(det)} ({what})"), singles
    codes = {b: null[b] for b in range(m) if b != a}
    if group_codes is not None:
        codes[None] = group_codes
    if not codes or not _determines(_combine(list(codes.values())), exact[a]):
        return None, []
    if group_codes is not None and _determines(group_codes, exact[a]):
        return None, []     # reported as constant within groups
    kept = _minimal_set(exact[a], list(codes), codes)
    cells = _n_cells(_combine([codes[k] for k in kept]))
    det = ", ".join(_label(k, names) for k in kept)
    return DesignFinding(
        "nested", (f, *[names[k] for k in kept if k is not None]), float(cells),
        f"{f!r} is determined by the combination of {det} (each of their {cells} "
        f"combinations holds one value of {f!r})"), []


def diagnose_design(table, space, groups=None, *, threshold=CORRELATION_THRESHOLD,
                    max_pairs=MAX_PAIRS):
    """Find the features whose permutation tests the design breaks or weakens.

    Run it before fitting, on the stimuli's feature table; :func:`warn_design` turns the
    findings into warnings.  See the module notes for the definitions.

    Parameters
    ----------
    table : DataFrame
        The feature table, one row per stimulus (the columns ``space`` was fitted on).
    space : FeatureSpace
        A fitted :class:`~mlem_neuro.core.stimuli.features.FeatureSpace` (its ``kinds_`` and
        :meth:`~mlem_neuro.core.stimuli.features.FeatureSpace.transform` are used).
    groups : array-like (n_stimuli,) | None
        Group label of each stimulus when the nulls respect groups: runs or sessions
        (the nulls relabel within groups: features constant within groups are found),
        or items, groups that each hold one feature row (the nulls exchange whole
        groups: the design is checked on one row per group).
    threshold : float
        Absolute Spearman correlation of pair distances from which two features are
        reported as correlated (default :data:`CORRELATION_THRESHOLD`).
    max_pairs : int
        Pairs used for the correlations (default :data:`MAX_PAIRS`; above it, a fixed
        random subset).

    Returns
    -------
    findings : list of DesignFinding
        Duplicates first, then nested features, correlated pairs and features constant
        within groups; empty when nothing was found.
    """
    if not hasattr(space, "kinds_"):
        raise ValueError("space must be a fitted FeatureSpace: call space.fit(table) "
                         "first.")
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1]; got {threshold!r}.")
    enc = space.transform(table)
    group_codes = None if groups is None else _check_groups(groups, enc.n_stimuli)
    if group_codes is not None and exchange_units(enc, group_codes) == "whole":
        # every group is one feature row (the trials of an item): the nulls exchange
        # whole groups, so the design is that of the groups
        first = np.unique(group_codes, return_index=True)[1]
        enc = replace(enc, values=enc.values[first], missing=enc.missing[first])
        group_codes = None
    names, m = list(enc.names), enc.n_features
    kinds = [space.kinds_[name] for name in names]
    exact = [_exact_codes(enc, k) for k in range(m)]
    null = [_feature_codes(enc, k, kinds[k], NULL_BINS) for k in range(m)]
    corr, dist = pair_distance_correlations(enc, max_pairs=max_pairs)

    findings = []
    dups = _duplicates(names, exact, null, dist)
    for (a, b), how in dups.items():
        findings.append(DesignFinding(
            "duplicate", (names[b], names[a]), float(corr[a, b]),
            f"{names[b]!r} duplicates {names[a]!r} ({how})"))
    twins = {k for pair in dups for k in pair}

    nested_pairs = set()
    for a in range(m):
        if a in twins:      # its test cannot move given its twin: said once, above
            continue
        finding, singles = _nested(a, names, kinds, exact, null, group_codes, dups)
        nested_pairs.update((min(a, b), max(a, b)) for b in singles)
        if finding is not None:
            findings.append(finding)

    for a in range(m):
        for b in range(a + 1, m):
            r = corr[a, b]
            if ((a, b) in dups or (a, b) in nested_pairs or not np.isfinite(r)
                    or abs(r) < threshold):
                continue
            findings.append(DesignFinding(
                "correlated", (names[a], names[b]), float(r),
                f"{names[a]!r} and {names[b]!r} are correlated (Spearman r = {r:.2f} over "
                f"pair distances; threshold {threshold:g})"))

    if group_codes is not None:
        n_groups = _n_cells(group_codes)
        for a in range(m):
            if _determines(group_codes, exact[a]):
                findings.append(DesignFinding(
                    "constant_within_groups", (names[a],), float(n_groups),
                    f"{names[a]!r} is constant within each of the {n_groups} groups"))
    order = {k: r for r, k in enumerate(FINDING_KINDS)}
    return sorted(findings, key=lambda f: order[f.kind])


# ------------------------------------------------------------------------- warnings
def _consequence(finding, n_null):
    """What ``finding`` does to the tests (``n_null > 0``) or to the importance."""
    f, rest = finding.features[0], finding.features[1:]
    if finding.kind == "constant_within_groups":
        if n_null:
            return ("the within-group null cannot move it: its p-values are NaN (not "
                    f"testable); compare the groups instead, or drop {f!r}")
        return (f"its importance cannot be told from differences between groups; compare "
                f"the groups instead, or drop {f!r}")
    given = _quote(rest) if rest else "the other features within groups"
    if finding.kind == "nested":
        if n_null:
            return (f"the conditional test of {f!r} cannot move given {given}: its "
                    "p-values are NaN (not testable); ask the marginal question with "
                    "null='marginal', or drop one feature")
        return (f"its importance and that of {given} share what they have in common: "
                f"read {f!r} as what it adds to {given}")
    g = rest[0]
    if finding.kind == "duplicate":
        if n_null:
            return (f"neither conditional test can move given the other: the p-values "
                    f"of {f!r} and {g!r} are NaN (not testable); drop one of them")
        return (f"their importance splits between {f!r} and {g!r} in arbitrary shares; "
                "drop one of them")
    if n_null:
        return ("each one's conditional test loses power given the other (measured: 72 % "
                "of it left at r = 0.74 for two binary features, 58 % at r = 0.63 for an "
                "association strength > 0 for related items only); ask the marginal "
                "question with null='marginal', or drop one feature")
    return (f"their importance is shared between {f!r} and {g!r} and each one's is "
            "unstable; read them together, or drop one feature")


def design_message(finding, n_null):
    """The warning text of ``finding``: what the design is, then what it does.

    Parameters
    ----------
    finding : DesignFinding
        A finding of :func:`diagnose_design`.
    n_null : int
        The analysis's null relabellings (``0``: the text speaks of the importance).

    Returns
    -------
    text : str
        ``"design: <finding.message>: <consequence>."``
    """
    return f"design: {finding.message}: {_consequence(finding, n_null)}."


def warn_design(findings, n_null, stacklevel=2):
    """Warn once per finding of :func:`diagnose_design`.

    Parameters
    ----------
    findings : list of DesignFinding
        What :func:`diagnose_design` found (nothing is warned for an empty list).
    n_null : int
        The analysis's null relabellings: with ``0`` (no tests) the warnings say what the
        design does to the importance, else to the conditional tests.
    stacklevel : int
        Passed to :func:`warnings.warn` (2: the line that called ``warn_design``).

    Returns
    -------
    messages : list of str
        The texts warned (one ``UserWarning`` each).
    """
    messages = [design_message(f, n_null) for f in findings]
    for text in messages:
        warnings.warn(text, UserWarning, stacklevel=stacklevel)
    return messages
