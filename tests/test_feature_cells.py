"""Feature columns that cannot be read as features are refused with a clear error."""
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro import MLEM


@pytest.mark.parametrize("column, error, match", [
    (pd.date_range("2020-01-01", periods=12), ValueError, r"dates or durations.*seconds"),
    (pd.to_timedelta(np.arange(12), "s"), ValueError, r"dates or durations"),
    (pd.period_range("2020-01", periods=12, freq="M"), ValueError, r"dates or durations"),
    ([[1, 2]] * 12, TypeError, r"holds lists .*one value.*feature_groups"),
    ([{"a": 1}] * 12, TypeError, r"holds dicts"),
    # numpy took these as numeric and kept the real part (a ComplexWarning only)
    (np.arange(12) + 1j, ValueError, r"column 'x' holds complex values .*np\.abs"),
    ([1 + 1j, 2] * 6, ValueError, r"column 'x' holds complex values"),
    # True == 1 in Python: pandas merged True and 1 into one level
    ([True, 1, "1", 2.0] * 3, TypeError,
     r"column 'x' mixes booleans and numbers \(e\.g\. True, 1, 2\.0\).*astype\(str\)"),
])
def test_unreadable_feature_columns_are_refused(column, error, match):
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"x": column, "b": rng.integers(0, 2, 12).astype(bool)})
    data = rng.standard_normal((12, 3, 2))
    with pytest.raises(error, match=match):
        mlem_neuro.mlem_array(data, table, cv=2, n_repeats=1)
    with pytest.raises(error, match=match):
        MLEM().fit(data[:, :, 0], table)


def test_the_same_values_as_numbers_are_accepted():
    rng = np.random.default_rng(0)
    t = pd.Series(pd.date_range("2020-01-01", periods=12, freq="h"))
    table = pd.DataFrame({"x": (t - t.min()).dt.total_seconds(),
                          "b": rng.integers(0, 2, 12).astype(bool)})
    MLEM(max_steps=5).fit(rng.standard_normal((12, 3)), table)


def test_epochs_features_named_by_an_array_or_index_of_column_names():
    mne = pytest.importorskip("mne")
    rng = np.random.default_rng(0)
    meta = pd.DataFrame({"a": rng.integers(0, 2, 20).astype(bool),
                         "b": pd.Categorical(rng.integers(0, 3, 20).astype(str))})
    epochs = mne.EpochsArray(rng.standard_normal((20, 3, 4)), mne.create_info(3, 100.0, "eeg"),
                             metadata=meta, verbose="ERROR")
    kw = dict(cv=2, n_repeats=1, max_steps=3, random_state=0, verbose="ERROR")
    for names in (np.array(["a", "b"]), pd.Index(["a", "b"])):
        assert mlem_neuro.mlem_epochs(epochs, features=names, **kw).terms == ["a", "b"]
    # per-epoch labels (one string per epoch, not column names) are still values
    labels = np.array(["x", "y"] * 10)
    assert mlem_neuro.mlem_epochs(epochs, features=labels, **kw).terms == ["f0"]


def test_a_held_out_table_mixing_booleans_and_numbers_is_refused_too():
    """Levels fitted on booleans: a held-out 1 would have matched the level True."""
    from mlem_neuro.core.stimuli.features import FeatureSpace

    space = FeatureSpace().fit(pd.DataFrame({"x": [True, False] * 4}))
    with pytest.raises(TypeError, match="mixes booleans and numbers"):
        space.transform(pd.DataFrame({"x": pd.Series([True, 1, False, 0], dtype=object)}))
    # booleans with strings are distinct levels, as in Python ('1' != True)
    enc = FeatureSpace().fit_transform(pd.DataFrame({"x": [True, "1", "True", False]}))
    assert len(np.unique(enc.values)) == 4


def test_ordinal_values_without_an_order_are_refused_clearly():
    from mlem_neuro.core.stimuli.features import FeatureSpace

    table = pd.DataFrame({"x": pd.Series(["a", 1, "b", 2], dtype=object)})
    with pytest.raises(ValueError, match=r"'x' is declared ordinal but its values "
                                         r"\(int, str\) have no order"):
        FeatureSpace(kinds={"x": "ordinal"}).fit(table)
