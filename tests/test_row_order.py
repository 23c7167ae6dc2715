"""One rule for matching a feature table's rows to the data: by position, and a table
whose index says it was reordered is refused (issue: rows out of step)."""
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro import MLEM


@pytest.fixture
def design():
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": rng.integers(0, 2, 24).astype(bool),
                          "b": rng.integers(0, 3, 24).astype(str)})
    return rng.standard_normal((24, 5, 2)), table


def test_a_sorted_table_is_refused_everywhere(design):
    data, table = design
    sorted_table = table.sort_values("b")
    assert not sorted_table.index.is_monotonic_increasing
    with pytest.raises(ValueError, match=r"out of order .* sort_values"):
        mlem_neuro.mlem_array(data, sorted_table, cv=2, n_repeats=1, max_steps=5)
    with pytest.raises(ValueError, match="reset_index"):
        MLEM(max_steps=5).fit(data[:, :, 0], sorted_table)
    with pytest.raises(ValueError, match="out of order"):
        mlem_neuro.mlem_array(data, sorted_table["a"], cv=2, n_repeats=1, max_steps=5)


def test_tables_in_order_or_with_other_indices_are_matched_by_position(design):
    data, table = design
    kw = dict(cv=2, n_repeats=1, max_steps=5, random_state=0, verbose="ERROR")
    ref = mlem_neuro.mlem_array(data, table, **kw)
    # the same rows with another index: labels, or the reordered table re-indexed
    labelled = table.set_axis([f"w{k}" for k in range(24)])
    np.testing.assert_array_equal(mlem_neuro.mlem_array(data, labelled, **kw).importance,
                                  ref.importance)
    order = np.argsort(table["b"].to_numpy(), kind="stable")
    both = mlem_neuro.mlem_array(data[order], table.iloc[order].reset_index(drop=True),
                                 **kw)
    assert both.importance.shape == ref.importance.shape
    # a subset of rows in any order (e.g. a scikit-learn split) is not a reordering
    sub = np.random.default_rng(1).permutation(24)[:18]
    MLEM(max_steps=5).fit(data[sub, :, 0], table.iloc[sub])


def test_searchlight_refuses_a_trial_table_reordered_after_trial_images():
    nib = pytest.importorskip("nibabel")
    rng = np.random.default_rng(0)
    index = pd.MultiIndex.from_product([range(4), range(6)], names=["run", "trial"])
    table = pd.DataFrame({"c": np.tile(list("xyz"), 8)}, index=index)
    img = nib.Nifti1Image(rng.standard_normal((3, 3, 3, 24)).astype("float32"), np.eye(4))
    mask = nib.Nifti1Image(np.ones((3, 3, 3), "int8"), np.eye(4))
    for standardize in ("run", None):
        with pytest.raises(ValueError, match=r"\(run, trial\) index is out of order"):
            mlem_neuro.mlem_searchlight(img, table.sort_values("c"), mask, radius=1.0,
                                        standardize=standardize, max_steps=5)
