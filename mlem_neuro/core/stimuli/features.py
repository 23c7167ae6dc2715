"""Theoretical features → per-pair feature distances.

A :class:`FeatureSpace` is fitted on a feature table (the training stimuli) and encodes any
table with the same columns into an :class:`EncodedFeatures`: one float block per feature and
a missing-value mask.  Pair distances are then computed for any list of stimulus pairs, on
any device, without building per-pair copies of the table.

Distances, for a pair of stimuli ``(i, j)`` and one feature:

* ``"categorical"`` (object, string, category, bool columns): ``1`` if the values differ,
  else ``0``.
* ``"ordinal"`` (ordered pandas categoricals): ``|code_i - code_j| / (n_categories - 1)``,
  so that neighbouring levels are ``1 / (n_categories - 1)`` apart and the extremes ``1``.
* ``"numeric"`` (numeric columns): ``|x_i - x_j|`` after min-max scaling fitted on the
  stimuli passed to :meth:`FeatureSpace.fit` (training stimuli map to ``[0, 1]``; held-out
  stimuli may fall outside).  Integer columns are taken minus their training minimum in
  exact integer arithmetic before they become floats, so ``10**17 + k`` keeps its unit
  gaps; a warning says when distinct integers still became one float (a range beyond
  ``2**53``).
* multi-column features (``groups``): Euclidean distance between the min-max scaled vectors.
* missing value (NaN / None / pd.NA) on either side: ``missing_distance`` (default ``0``, the
  choice of the MLEM paper).

Numeric and ordinal distances are rounded to multiples of ``1 / DISTANCE_GRID`` (about
1e-9 of the training range), so that equal gaps tie exactly (see :data:`DISTANCE_GRID`).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from numbers import Number

import numpy as np
import pandas as pd

from ..checks import FEATURE_KINDS as KINDS
from ..checks import is_int
from ..constants import DISTANCE_GRID
from ..utils import check_real, warn_user


def check_row_order(table, name="features"):
    """Refuse a table whose index says its rows were reordered.

    The rows of a feature table are matched to the data **by position** (row ``k`` is
    stimulus ``k``).  An integer index holding exactly ``0 .. n - 1`` out of order is the
    mark of a table sorted or shuffled after it was built (``sort_values``, ``sample``)
    while the data kept their order: matched by position, every row would describe another
    stimulus.  Other indices (labels, a subset of rows in any order) are left alone.
    """
    index = table.index
    if isinstance(index, pd.MultiIndex) or index.is_monotonic_increasing or len(index) < 2:
        return
    if not pd.api.types.is_integer_dtype(index.dtype):
        return
    values = index.to_numpy()
    n = len(values)
    if values.min() == 0 and values.max() == n - 1 and len(np.unique(values)) == n:
        raise ValueError(
            f"{name}'s index holds the row numbers 0..{n - 1} out of order (first "
            f"{values[:5].tolist()}): the table was reordered (e.g. by sort_values), but "
            "its rows are matched to the data by position. Reorder the data the same way "
            f"and pass {name}.reset_index(drop=True), or restore the order with "
            f"{name}.sort_index().")


def as_feature_table(y, *, name="y"):
    """Turn ``y`` (DataFrame, Series, 1-D or 2-D array) into a DataFrame with str columns
    (rows matched to the data by position; a table whose index says it was reordered is
    refused: :func:`check_row_order`)."""
    if isinstance(y, (pd.DataFrame, pd.Series)):
        check_row_order(y, name)
    if isinstance(y, pd.DataFrame):
        table = y.copy()
        table.columns = [str(c) for c in table.columns]
    elif isinstance(y, pd.Series):
        table = y.to_frame(name=str(y.name) if y.name is not None else "f0")
    else:
        try:
            arr = np.asarray(y)
        except Exception as err:  # pragma: no cover - exotic input
            raise TypeError(f"{name} must be a DataFrame or an array; got "
                            f"{type(y).__name__}") from err
        if arr.dtype == object and arr.ndim == 0:
            raise TypeError(f"{name} must be a DataFrame or an array; got {type(y).__name__}")
        if arr.ndim == 1:
            arr = arr[:, None]
        if arr.ndim != 2:
            raise ValueError(f"{name} must be 1-D or 2-D (stimuli × features); got shape "
                             f"{arr.shape}")
        table = pd.DataFrame(arr, columns=[f"f{k}" for k in range(arr.shape[1])])
    if table.shape[1] == 0:
        raise ValueError(f"{name} has no feature columns: MLEM needs at least one feature.")
    if table.columns.duplicated().any():
        dup = table.columns[table.columns.duplicated()].tolist()
        raise ValueError(f"{name} has duplicated column names {dup}.")
    for column in table.columns:
        _check_cells(table[column], name)
    return table.reset_index(drop=True)


def _check_cells(col, name):
    """Refuse columns a feature cannot be read from: dates and durations (compared as
    labels, every pair would differ), complex numbers (:func:`~mlem_neuro.utils.check_real`),
    cells holding containers (lists, dicts...) and object columns mixing booleans with
    numbers (:func:`_check_bools_and_numbers`)."""
    dtype = col.dtype
    if (pd.api.types.is_datetime64_any_dtype(dtype) or pd.api.types.is_timedelta64_dtype(dtype)
            or isinstance(dtype, pd.PeriodDtype)):
        raise ValueError(
            f"{name} column {col.name!r} holds dates or durations ({dtype}), which would be "
            "compared as labels (every pair differing). Convert it to numbers first, e.g. "
            f"(t - t.min()).dt.total_seconds() for a numeric feature.")
    check_real(dtype, f"{name} column {col.name!r}")
    if not pd.api.types.is_object_dtype(dtype):
        return
    bad = col.map(lambda v: isinstance(v, (list, tuple, dict, set, np.ndarray)))
    if bad.any():
        example = col[bad].iloc[0]
        raise TypeError(
            f"{name} column {col.name!r} holds {type(example).__name__}s (e.g. "
            f"{example!r}): a cell must hold one value. For a vector feature put each "
            "component in a column of its own and compare them together with "
            f"feature_groups={{{str(col.name)!r}: [...columns...]}}.")
    complex_cells = col.map(lambda v: isinstance(v, (complex, np.complexfloating)))
    if complex_cells.any():
        check_real(np.asarray(col[complex_cells].iloc[0]), f"{name} column {col.name!r}")
    _check_bools_and_numbers(col, name)


def _check_bools_and_numbers(col, name):
    """Refuse an object column mixing booleans and numbers.

    Python counts ``True == 1`` and ``False == 0`` (and hashes them alike), so such a
    column's levels would merge ``True`` with ``1`` -- or not, had the user meant them
    apart: the column is ambiguous, and the user says which it is by converting it.
    Strings stay apart from numbers (``'1' != 1`` in Python too).
    """
    present = col[col.notna()]
    bools = present.map(lambda v: isinstance(v, (bool, np.bool_)))
    numbers = present.map(lambda v: not isinstance(v, (bool, np.bool_))
                          and isinstance(v, (Number, np.number)))
    if bools.any() and numbers.any():
        examples = list(dict.fromkeys(map(repr, present[bools])))[:2] + list(
            dict.fromkeys(map(repr, present[numbers])))[:2]
        raise TypeError(
            f"{name} column {col.name!r} mixes booleans and numbers (e.g. "
            f"{', '.join(examples)}): Python counts True == 1 and False == 0, so their "
            "levels would merge. Convert the column first: .astype(str) keeps True and 1 "
            "apart, .astype(float) makes True the number 1.")


def _check_names(names):
    """Feature names must not contain ':', which names interaction terms ("a:b")."""
    bad = [n for n in names if ":" in n]
    if bad:
        raise ValueError(f"feature names must not contain ':' (interaction terms are named "
                         f"'a:b'); rename {bad}, e.g. {bad[0].replace(':', '_')!r}.")


def _infer_kind(col: pd.Series) -> str:
    if isinstance(col.dtype, pd.CategoricalDtype):
        return "ordinal" if col.dtype.ordered else "categorical"
    if pd.api.types.is_bool_dtype(col.dtype):
        return "categorical"
    if pd.api.types.is_numeric_dtype(col.dtype):
        return "numeric"
    return "categorical"  # object, string (pandas 2 and 3), anything else hashable


def _integers(col: pd.Series):
    """``col``'s values as Python ints (``None`` where missing) when the column holds
    integers only (an integer dtype, or an object column of ints; not bools), else
    ``None``."""
    dtype = col.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return None
    if pd.api.types.is_integer_dtype(dtype):
        return col.to_numpy(dtype=object, na_value=None).tolist()
    if not pd.api.types.is_object_dtype(dtype):
        return None
    miss = col.isna().to_numpy()
    values = col.tolist()
    if not all(m or is_int(v) for v, m in zip(values, miss)):
        return None
    return [None if m else int(v) for v, m in zip(values, miss)]


def _integer_offset(col: pd.Series):
    """The smallest value of an integer column (a Python int), else ``0``: numeric values
    are taken minus it, in exact integer arithmetic (:func:`_numeric_values`)."""
    ints = _integers(col)
    present = [v for v in ints if v is not None] if ints is not None else []
    return min(present) if present else 0


def _numeric_values(col: pd.Series, fname: str, offset=0) -> np.ndarray:
    """The floats of ``col`` minus ``offset`` (an int).

    For an integer column the subtraction is exact (Python ints) before the conversion to
    float, so ``10**17 + k`` minus ``10**17`` gives ``k`` exactly, where the floats of
    ``10**17 + k`` are 16 apart.  Where values and offset are within ``2**53`` (every
    such int is a float) float arithmetic gives the very same, correctly rounded numbers.
    """
    ints = _integers(col)
    if ints is not None and any(v is not None and abs(v) > 2**53 for v in ints + [offset]):
        return np.array([np.nan if v is None else float(v - offset) for v in ints])
    try:
        values = pd.to_numeric(col, errors="raise")
    except (ValueError, TypeError):
        raise ValueError(f"feature {fname!r} was declared numeric but column "
                         f"{col.name!r} holds non-numeric values (e.g. "
                         f"{col.dropna().iloc[0]!r}); declare it 'categorical'.") from None
    check_real(values, f"feature column {col.name!r}")
    values = values.to_numpy(dtype=float, na_value=np.nan)
    return values - float(offset) if offset else values


def _warn_merged_integers(col: pd.Series, fname: str, offset, vals):
    """Warn when distinct integers of ``col`` became one float (their range is beyond
    ``2**53``, where float64 no longer holds every integer)."""
    ints = _integers(col)
    if ints is None:
        return
    n_ints = len({v for v in ints if v is not None})
    n_floats = len(np.unique(vals[~np.isnan(vals)]))
    if n_floats < n_ints:
        present = [v for v in ints if v is not None]
        warn_user(f"feature {fname!r} holds integers spanning {max(present) - offset} "
                  f"(more than 2**53, the float64 integers): {n_ints} distinct values "
                  f"became {n_floats} floats, so some stimuli with different values are "
                  "compared as equal. Store it in coarser units, or as categorical if it "
                  "is an identifier.")


@dataclass
class _Spec:
    name: str
    kind: str            # categorical | ordinal | numeric
    columns: list
    categories: list | None = None   # categorical / ordinal levels (training)
    lo: np.ndarray | None = None     # numeric min (per column)
    scale: np.ndarray | None = None  # numeric 1 / (max - min)
    exponent: int = 0                # numeric: exact power-of-two prescaling (extremes)
    offsets: list | None = None      # numeric: integer columns' minimum (Python ints)
    missing: float = 0.0


@dataclass
class EncodedFeatures:
    """Numeric encoding of a feature table, ready for pair distances.

    Attributes
    ----------
    values : ndarray, shape (n_stimuli, n_dims)
        All features' blocks side by side (NaN-free; missing rows hold 0): unscaled
        numeric values minus their training minimum, level codes of ordinal and
        categorical features.
    missing : ndarray of bool, shape (n_stimuli, n_features)
    slices : list of slice
        ``values[:, slices[k]]`` is feature ``k``'s block.
    indicator : ndarray of bool, shape (n_features,)
        Whether feature ``k`` uses the indicator distance (else Euclidean on its block).
    missing_distance : ndarray, shape (n_features,)
    names : list of str
    scale : ndarray, shape (n_dims,) | None
        Factor of each column of ``values``, applied to the differences of two stimuli's
        values (``None``: 1).  Differences are taken before scaling so that equal level
        gaps (ordinal codes, integer levels) give bitwise equal distances, which exact
        Spearman then ties.
    """

    values: np.ndarray
    missing: np.ndarray
    slices: list
    indicator: np.ndarray
    missing_distance: np.ndarray
    names: list
    scale: np.ndarray | None = None

    def column_scale(self):
        """:attr:`scale`, with ones when it is ``None``."""
        return np.ones(self.values.shape[1]) if self.scale is None else self.scale

    @property
    def n_stimuli(self):
        return self.values.shape[0]

    @property
    def n_features(self):
        return len(self.names)

    def to_torch(self, device, dtype):
        import torch

        return _TorchEncoded(
            values=torch.as_tensor(self.values, device=device, dtype=dtype),
            missing=torch.as_tensor(self.missing, device=device),
            slices=self.slices, indicator=self.indicator.tolist(),
            missing_distance=self.missing_distance.tolist(),
            scale=torch.as_tensor(self.column_scale(), device=device, dtype=dtype))

    def two_valued(self):
        """Whether each feature's pair distances take at most two values (0 and one other).

        True for categorical features (indicator distance) and two-valued numeric ones
        without missing values.  When every feature is two-valued, ``dᵀ W d`` ranks pairs
        alike along ``W = diag(w) + λ w wᵀ`` (``d_k² ∝ d_k``), so term-level interaction
        importances are not identifiable.  Computed on the distinct codes of each feature.
        """
        out = np.zeros(self.n_features, dtype=bool)
        for k, sl in enumerate(self.slices):
            codes = np.concatenate([self.values[:, sl], self.missing[:, [k]]], axis=1)
            uniq = np.unique(codes, axis=0)
            if len(uniq) > 64:       # >= 3 distinct scalar values give >= 2 distances
                continue
            i, j = np.triu_indices(len(uniq), k=1)
            sub = EncodedFeatures(values=uniq[:, :-1], missing=uniq[:, -1:].astype(bool),
                                  slices=[slice(0, uniq.shape[1] - 1)],
                                  indicator=self.indicator[[k]],
                                  missing_distance=self.missing_distance[[k]],
                                  names=[self.names[k]], scale=self.column_scale()[sl])
            d = sub.pair_distances(i, j)[:, 0] if len(i) else np.zeros(0)
            out[k] = len(np.unique(np.append(d, 0.0))) <= 2
        return out

    def pair_distances(self, i, j):
        """Feature distances ``(n_pairs, n_features)`` (numpy, float64) for pairs ``(i, j)``."""
        import torch

        enc = self.to_torch("cpu", torch.float64)
        return enc.pair_distances(torch.as_tensor(i), torch.as_tensor(j)).numpy()


@dataclass
class _TorchEncoded:
    values: object
    missing: object
    slices: list
    indicator: list
    missing_distance: list
    scale: object

    def feature_distance(self, k, i, j, perm=None):
        """Distance of feature ``k`` for pairs (i, j); ``perm`` relabels stimuli first."""
        import torch

        if perm is not None:
            i, j = perm[i], perm[j]
        block = self.values[:, self.slices[k]]
        a, b = block[i], block[j]
        if self.indicator[k]:
            d = (a != b).any(dim=-1).to(block.dtype)
        elif a.shape[-1] == 1:
            d = (a - b).abs()[..., 0] * self.scale[self.slices[k]][0]
        else:
            d = torch.linalg.vector_norm((a - b) * self.scale[self.slices[k]], dim=-1)
        if not self.indicator[k]:
            d = torch.round(d * DISTANCE_GRID) / DISTANCE_GRID
        miss = self.missing[i, k] | self.missing[j, k]
        if bool(miss.any()):
            d = torch.where(miss, torch.full_like(d, self.missing_distance[k]), d)
        return d

    def pair_distances(self, i, j):
        import torch

        i = i.to(self.values.device)
        j = j.to(self.values.device)
        return torch.stack([self.feature_distance(k, i, j) for k in range(len(self.slices))],
                           dim=-1)


# --------------------------------------------------------------- fitting, per kind
def _fit_numeric(spec, sub):
    """Min-max scaling of a numeric (possibly multi-column) feature."""
    name = spec.name
    spec.offsets = [_integer_offset(sub[c]) for c in spec.columns]
    vals = np.column_stack([_numeric_values(sub[c], name, o)
                            for c, o in zip(spec.columns, spec.offsets)])
    for k, c in enumerate(spec.columns):
        _warn_merged_integers(sub[c], name, spec.offsets[k], vals[:, k])
    if np.isinf(vals).any():
        raise ValueError(f"feature {name!r} holds infinite values.")
    ok = ~np.isnan(vals).any(axis=1)
    if not ok.any():
        raise ValueError(f"feature {name!r} is missing (NaN) for every stimulus: "
                         "it carries no distance; drop it from the table.")
    spec.exponent = _power_of_two_exponent(vals[ok])
    top = float(np.max(np.abs(vals[ok])))
    if 0 < top < np.finfo(float).tiny:
        warnings.warn(f"feature {name!r} holds subnormal numbers (up to {top:.3g}), which "
                      f"keep only about {int(np.log2(top / 5e-324)) + 1} of 53 bits: "
                      "nearby values may have been rounded together. Store it in other "
                      "units (e.g. times 1e300).", UserWarning, stacklevel=3)
    vals = np.ldexp(vals, spec.exponent)
    lo = vals[ok].min(axis=0)
    rng = vals[ok].max(axis=0) - lo
    if np.all(rng == 0):
        raise ValueError(f"feature {name!r} is constant over the stimuli: it "
                         "carries no distance; drop it from the table.")
    spec.lo, spec.scale = lo, np.where(rng > 0, 1.0 / np.where(rng > 0, rng, 1), 0)


def _power_of_two_exponent(vals):
    """``0`` for values of ordinary magnitude; for tiny or huge ones (a range of 1e-320,
    whose inverse overflows, or values near 1e300), the exponent ``e`` such that
    ``ldexp(vals, e)`` brings the largest magnitude to [0.5, 1): exact, so distances keep
    their ties and their order.  An exponent, not a factor: ``2**1062``, which subnormal
    values need, is no float (it overflows)."""
    top = float(np.max(np.abs(vals)))
    if top == 0 or 2.0 ** -500 <= top <= 2.0 ** 500:
        return 0
    return -int(np.frexp(top)[1])


def _fit_levels(spec, sub):
    """The levels of a categorical or ordinal feature (ordinal: in order)."""
    name = spec.name
    col = sub[spec.columns[0]]
    present = col[col.notna()]
    if present.empty:
        raise ValueError(f"feature {name!r} is missing (NaN) for every stimulus: "
                         "it carries no distance; drop it from the table.")
    if spec.kind == "ordinal":
        if isinstance(col.dtype, pd.CategoricalDtype):
            cats = list(col.dtype.categories)
        else:
            try:
                cats = sorted(present.unique())
            except TypeError:
                types = sorted({type(v).__name__ for v in present})
                raise ValueError(f"feature {name!r} is declared ordinal but its values "
                                 f"({', '.join(types)}) have no order between them; pass "
                                 "an ordered pandas Categorical, e.g. pd.Categorical("
                                 "values, categories=[...], ordered=True).") from None
            if not pd.api.types.is_numeric_dtype(col.dtype):
                # sorted strings are alphabetical ("high" < "low" < "medium", "10" < "2")
                warnings.warn(f"feature {name!r} is declared ordinal on unordered values: "
                              f"its levels are taken in sorted order {cats}. If that is not "
                              "their order, pass an ordered pandas Categorical, e.g. "
                              "pd.Categorical(values, categories=[...], ordered=True).",
                              UserWarning, stacklevel=2)
    else:
        cats = list(pd.unique(present))
    if present.nunique() < 2:
        raise ValueError(f"feature {name!r} is constant over the stimuli (only "
                         f"{present.iloc[0]!r}): it carries no distance; drop it "
                         "from the table.")
    spec.categories = cats


#: kind -> ``fit(spec, sub_table)`` filling the spec's scaling or levels.
_FITTERS = {"numeric": _fit_numeric, "ordinal": _fit_levels, "categorical": _fit_levels}


# -------------------------------------------------------------- encoding, per kind
def _encode_numeric(spec, sub, n):
    """Block ``(n, n_columns)`` of values minus the training minimum (unscaled), missing
    rows (0 in the block), indicator flag, column scales."""
    offsets = getattr(spec, "offsets", None) or [0] * len(spec.columns)
    vals = np.column_stack([_numeric_values(sub[c], spec.name, o)
                            for c, o in zip(spec.columns, offsets)])
    # ``unit``: the prescaling factor of specs pickled before ``exponent`` replaced it
    vals = np.ldexp(vals, getattr(spec, "exponent", 0)) * getattr(spec, "unit", 1.0) \
        - spec.lo
    m = np.isnan(vals).any(axis=1)
    return np.where(m[:, None], 0.0, vals), m, False, spec.scale


def _encode_ordinal(spec, sub, n):
    """Level codes (scale ``1 / (n_levels - 1)``); a level unseen in fit is an error."""
    col = sub[spec.columns[0]]
    m = col.isna().to_numpy()
    lookup = {c: k for k, c in enumerate(spec.categories)}
    codes = np.array([lookup.get(v, np.nan) if not mm else 0.0
                      for v, mm in zip(col.tolist(), m)], dtype=float)
    if np.isnan(codes).any():
        bad = col[np.isnan(codes)].iloc[0]
        raise ValueError(f"ordinal feature {spec.name!r} has level {bad!r} not "
                         f"seen in fit (levels: {spec.categories}).")
    return codes[:, None], m, False, np.array([1.0 / max(len(spec.categories) - 1, 1)])


def _encode_categorical(spec, sub, n):
    """Level codes compared by the indicator distance."""
    col = sub[spec.columns[0]]
    m = col.isna().to_numpy()
    lookup = {c: k for k, c in enumerate(spec.categories)}
    # unseen levels get fresh codes: they differ from every known level
    nxt = len(lookup)
    codes = np.zeros(n)
    for r, (v, mm) in enumerate(zip(col.tolist(), m)):
        if mm:
            continue
        if v not in lookup:
            lookup[v] = nxt
            nxt += 1
        codes[r] = lookup[v]
    return codes[:, None], m, True, np.ones(1)


#: kind -> ``encode(spec, sub_table, n) -> (block, missing rows, indicator, column
#: scales)``.
_ENCODERS = {"numeric": _encode_numeric, "ordinal": _encode_ordinal,
             "categorical": _encode_categorical}


# ------------------------------------------------------------------ fit helpers
def _check_groups(groups, table):
    """Grouped columns exist, belong to one group, and group names clash with no column."""
    grouped = [c for cols in groups.values() for c in cols]
    unknown = sorted(set(grouped) - set(table.columns))
    if unknown:
        raise ValueError(f"feature_groups name columns {unknown} that are not in the feature "
                         f"table (columns: {list(table.columns)}).")
    if len(grouped) != len(set(grouped)):
        raise ValueError("a column appears in more than one group.")
    for g, cols in groups.items():
        if g in table.columns and g not in cols:
            raise ValueError(f"group name {g!r} is also a column of the feature table "
                             "that is not in the group; rename the group.")


def _feature_order(table, groups):
    """Feature names in column order (a group where its first column stands)."""
    order = []
    for col in table.columns:
        owner = next((g for g, cols in groups.items() if col in cols), None)
        name = owner if owner is not None else col
        if name not in order:
            order.append(name)
    return order


def _missing_value(name, missing):
    """The checked missing distance of feature ``name``."""
    miss = missing.get(name, missing.get(None, 0.0))
    from ..checks import check

    try:
        miss = float(miss)
    except (TypeError, ValueError):
        pass                                 # refused by the check, as not a number
    return check("missing_distance", miss)


def _warn_numbers_as_text(name, col):
    """Warn when a column inferred categorical holds 3 or more numbers stored as text
    (compared as equal or not; with two values both kinds give the same distances)."""
    if pd.api.types.is_bool_dtype(col.dtype) or isinstance(col.dtype, pd.CategoricalDtype):
        return
    values = pd.Series(col.dropna().unique())
    if len(values) < 3 or not values.map(lambda v: isinstance(v, str)).all():
        return
    numbers = pd.to_numeric(values, errors="coerce")
    if numbers.notna().all():
        smallest = values.iloc[np.argsort(numbers.to_numpy(), kind="stable")].tolist()[:3]
        warnings.warn(f"feature {name!r} holds numbers stored as text (e.g. "
                      f"{smallest}): it is compared as categorical (equal or "
                      "not). Convert it (pd.to_numeric) for a numeric distance, or declare "
                      f"feature_kinds={{{name!r}: 'categorical'}} to keep it categorical.",
                      UserWarning, stacklevel=3)


def _feature_kind(name, table, kinds, groups):
    """The declared or inferred kind of feature ``name`` (grouped features: numeric)."""
    if name in groups:
        kind = kinds.get(name, "numeric")
        if kind != "numeric":
            raise ValueError(f"multi-column feature {name!r} must be numeric; got "
                             f"kind {kind!r}")
    else:
        kind = kinds.get(name, _infer_kind(table[name]))
        if name not in kinds and kind == "categorical":
            _warn_numbers_as_text(name, table[name])
    if kind not in KINDS:
        raise ValueError(f"kind of feature {name!r} must be one of {list(KINDS)}; "
                         f"got {kind!r}")
    return kind


class FeatureSpace:
    """Encode theoretical features and fit their scaling on training stimuli.

    Parameters
    ----------
    kinds : dict | None
        Override the inferred kind of a feature: ``{name: "categorical" | "ordinal" |
        "numeric"}``.  By default object/string/category/bool columns are categorical,
        ordered categoricals ordinal and numeric columns numeric.
    groups : dict | None
        Multi-column features: ``{name: [col1, col2, ...]}``.  The columns are min-max
        scaled and the feature distance is the Euclidean distance between the vectors.
        Grouped columns must be numeric.
    missing_distance : float | dict
        Distance given to a pair when either stimulus lacks the feature (default ``0.0``, as
        in the MLEM paper).  A dict sets it per feature (others keep ``0.0``).
    """

    def __init__(self, kinds=None, groups=None, missing_distance=0.0):
        self.kinds = kinds
        self.groups = groups
        self.missing_distance = missing_distance

    # ------------------------------------------------------------------ fitting
    def _parse_options(self):
        """``kinds``, ``groups`` and ``missing_distance`` as dicts keyed by str names
        (a single missing distance is keyed ``None``)."""
        kinds = {str(k): v for k, v in dict(self.kinds or {}).items()}
        groups = {str(k): [str(c) for c in v] for k, v in dict(self.groups or {}).items()}
        missing = self.missing_distance
        missing = ({str(k): v for k, v in missing.items()} if isinstance(missing, dict)
                   else {None: missing})
        return kinds, groups, missing

    def fit(self, table: pd.DataFrame):
        """Fit the encoding (kinds, levels, min-max scaling) on ``table``'s stimuli."""
        table = as_feature_table(table)
        kinds, groups, missing = self._parse_options()
        _check_groups(groups, table)
        order = _feature_order(table, groups)
        _check_names(order)
        for key in list(kinds) + [k for k in missing if k is not None]:
            if key not in order:
                raise ValueError(f"{key!r} is not a feature of this table; features are "
                                 f"{order}.")
        specs = []
        for name in order:
            cols = groups.get(name, [name])
            miss = _missing_value(name, missing)
            kind = _feature_kind(name, table, kinds, groups)
            spec = _Spec(name=name, kind=kind, columns=cols, missing=miss)
            _FITTERS[kind](spec, table[cols])
            specs.append(spec)
        self.specs_ = specs
        self.feature_names_ = [s.name for s in specs]
        self.kinds_ = {s.name: s.kind for s in specs}
        self.columns_ = list(table.columns)
        return self

    # --------------------------------------------------------------- encoding
    def transform(self, table) -> EncodedFeatures:
        """Encode ``table`` (same columns as in fit) with the fitted scaling and levels."""
        table = as_feature_table(table)
        missing_cols = sorted(set(self.columns_) - set(table.columns))
        if missing_cols:
            raise ValueError(f"the feature table lacks columns {missing_cols} seen in fit.")
        n = len(table)
        blocks, slices, indicator, miss, scales = [], [], [], [], []
        start = 0
        for s in self.specs_:
            block, m, ind, scale = _ENCODERS[s.kind](s, table[s.columns], n)
            blocks.append(np.asarray(block, dtype=float))
            scales.append(np.asarray(scale, dtype=float))
            slices.append(slice(start, start + blocks[-1].shape[1]))
            start += blocks[-1].shape[1]
            indicator.append(ind)
            miss.append(np.asarray(m, dtype=bool))
        return EncodedFeatures(values=np.concatenate(blocks, axis=1),
                               missing=np.column_stack(miss),
                               slices=slices, indicator=np.array(indicator),
                               missing_distance=np.array([s.missing for s in self.specs_],
                                                         dtype=float),
                               names=list(self.feature_names_),
                               scale=np.concatenate(scales))

    def fit_transform(self, table):
        """:meth:`fit` on ``table``, then :meth:`transform` it."""
        return self.fit(table).transform(table)

    def refit_scales(self, table, rows):
        """The column scales that fitting this space on other stimuli of ``table`` gives,
        when such a fit changes nothing but the scales.

        Null models that relabel the features (:mod:`~mlem_neuro.core.scoring.fastnull`)
        fit the encoding on the relabelled training stimuli, as the analysis of the
        relabelled table does: a numeric feature's min-max scaling then spans their range,
        not the observed training stimuli's.  The values' offset (their training minimum)
        cancels in every distance, so the encoding of ``table`` by this space with these
        scales in place of its own gives the refitted encoding's distances (up to the
        rounding of the offset, in the last bit of a value).

        Parameters
        ----------
        table : DataFrame
            The table this space encodes (every stimulus).
        rows : array of int (R, k)
            ``R`` sets of ``k`` rows of ``table`` to fit on.

        Returns
        -------
        ndarray (R, n_columns) | None
            The scales of each fit (one per column of :meth:`transform`'s values), or
            ``None`` when some fit would change more than the scales: an ordinal feature
            whose levels come from the values present (not from an ordered categorical
            dtype) with other levels present, a numeric feature with every value missing
            or constant over some set (the fit refuses it), values of extreme magnitude
            (the fit's power-of-two prescaling), or integers beyond ``2**53``.
        """
        table = as_feature_table(table)
        rows = np.asarray(rows, dtype=np.int64)
        out = []
        for s in self.specs_:
            if s.kind == "categorical":          # indicator distances: no scale
                out.append(np.ones((len(rows), 1)))
                continue
            if s.kind == "ordinal":
                col = table[s.columns[0]]
                if not isinstance(col.dtype, pd.CategoricalDtype):
                    values = np.asarray(col.tolist(), dtype=object)
                    present = ~col.isna().to_numpy()
                    levels = set(s.categories)
                    if any(set(values[r][present[r]]) != levels for r in rows):
                        return None
                out.append(np.full((len(rows), 1), 1.0 / max(len(s.categories) - 1, 1)))
                continue
            scales = _refit_numeric_scales(s, table[s.columns], rows)
            if scales is None:
                return None
            out.append(scales)
        return np.concatenate(out, axis=1)


def _refit_numeric_scales(spec, sub, rows):
    """:meth:`FeatureSpace.refit_scales` of one numeric feature: ``(R, n_columns)`` or
    ``None``.  The range of each set is taken as :func:`_fit_numeric` takes it (the
    maximum minus the minimum of the same floats, or of integers minus an integer offset,
    exact), so the scales are the refit's to the bit."""
    if getattr(spec, "exponent", 0) != 0 or getattr(spec, "unit", 1.0) != 1.0:
        return None
    offsets = getattr(spec, "offsets", None) or [0] * len(spec.columns)
    cols = []
    for c, offset in zip(spec.columns, offsets):
        ints = _integers(sub[c])
        if ints is not None and any(v is not None and abs(v) > 2**53 for v in ints):
            return None
        cols.append(_numeric_values(sub[c], spec.name, offset))
    vals = np.column_stack(cols)                                  # (n, k)
    ok = ~np.isnan(vals).any(axis=1)
    v, okr = vals[rows], ok[rows][..., None]                      # (R, t, k), (R, t, 1)
    if not okr.any(axis=1).all():
        return None                                               # every value missing
    top = np.where(okr, np.abs(v), 0.0).max(axis=(1, 2))
    if np.any((top > 0) & ((top < 2.0 ** -500) | (top > 2.0 ** 500))):
        return None                                               # prescaled by the fit
    rng = np.where(okr, v, -np.inf).max(axis=1) - np.where(okr, v, np.inf).min(axis=1)
    if np.any(np.all(rng == 0, axis=1)):
        return None                                               # constant: refused
    return np.where(rng > 0, 1.0 / np.where(rng > 0, rng, 1), 0)


def feature_space(options):
    """A new, unfitted :class:`FeatureSpace` with the feature options of ``options`` (an
    :class:`~mlem_neuro.core.options.MLEMOptions`: ``feature_kinds``, ``feature_groups``,
    ``missing_distance``)."""
    return FeatureSpace(kinds=options.feature_kinds, groups=options.feature_groups,
                        missing_distance=options.missing_distance)
