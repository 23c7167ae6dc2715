"""Results record where the staged feature test's gate was open (``gate_open``, one bool
per model), so that a feature finding that rests on the test of interactions can be
seen: kept, checked, saved and read back, in the tidy frame, and
:meth:`~mlem_neuro.results.TimeCourseResult.significant` warns when a feature's
significant models include gate-open ones (method page, "Where the gate opens").

Ground truth: an XOR code (``A XOR B``, no main effect) in the first two of four time
points and noise in the last two opens the gate exactly where the test of interactions is
family-wise significant; an additive code (``a`` strong, ``b`` weak, no interaction)
leaves it shut everywhere."""
import re
import warnings

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro import read_result
from mlem_neuro.core.constants import STAGED_GATE
from mlem_neuro.crossval import CVOutput, result_tests
from mlem_neuro.results import TimeCourseResult

GATE_WARNING = "where the test of interactions found interactions"


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def _gate_warnings(fn, *args, **kwargs):
    """``(value, [messages of the gate warnings])`` of ``fn(*args, **kwargs)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn(*args, **kwargs)
    return value, [str(w.message) for w in caught if GATE_WARNING in str(w.message)]


@pytest.fixture(scope="module")
def xor_result():
    """XOR in time points 0 and 1, noise in 2 and 3 (about 15 s)."""
    rng = np.random.default_rng(5)
    n, units = 32, 16
    a, b = np.arange(n) % 2, (np.arange(n) // 2) % 2
    X = rng.normal(size=(n, units, 4))
    X[:, :, :2] += 1.5 * rng.normal(size=(2, units, 1))[a ^ b]
    table = pd.DataFrame({"A": [f"a{k}" for k in a], "B": [f"b{k}" for k in b]})
    return _quiet(mlem_neuro.mlem_array, X, table, cv=2, n_repeats=2, n_null=19,
                  max_steps=60, random_state=0)


def _additive(**kwargs):
    """``a`` strongly encoded at every time point, ``b`` weakly, no interaction."""
    rng = np.random.default_rng(2)
    n, units = 24, 8
    a, b = rng.integers(0, 3, n), rng.integers(0, 2, n)
    X = rng.normal(size=(n, units, 3)) + 1.0 * rng.normal(size=(3, units, 1))[a] \
        + 0.3 * rng.normal(size=(2, units, 1))[b]
    table = pd.DataFrame({"a": [f"a{k}" for k in a], "b": [f"b{k}" for k in b]})
    opts = dict(cv=2, n_repeats=2, n_null=19, max_steps=40, random_state=0)
    return _quiet(mlem_neuro.mlem_array, X, table, **dict(opts, **kwargs))


def test_gate_open_is_where_the_test_of_interactions_is_family_wise_significant(
        xor_result):
    res = xor_result
    assert res.settings["feature_test_used"] == "staged"
    gate = res.pvalues_fwe[:, res.tests.index("interactions")] <= STAGED_GATE
    assert res.gate_open is not None and res.gate_open.dtype == bool
    np.testing.assert_array_equal(res.gate_open, gate)
    # the premise: open at the XOR time points, shut in the noise
    np.testing.assert_array_equal(res.gate_open, [True, True, False, False])
    assert res.settings["feature_test_staged_open"] == int(res.gate_open.sum())
    assert "gate open in 2 of 4 models" in repr(res)


@pytest.mark.parametrize("feature", ["A", "B"])
def test_significant_warns_when_a_features_significant_models_are_gate_open(xor_result,
                                                                          feature):
    res = xor_result
    # n_null=19: the smallest p-value is 0.05, so alpha=0.1
    mask, said = _gate_warnings(res.significant, feature, alpha=0.1)
    both = mask & res.gate_open
    assert both.any()                      # the premise: found through the XOR code
    assert len(said) == 1
    assert said[0].startswith(f"{feature!r} is significant in {int(both.sum())} model(s)")
    assert f"(of {int(mask.sum())})" in said[0]
    rests, said = _gate_warnings(res.rests_on_interactions, feature, alpha=0.1)
    assert said == []                      # it returns them, without the warning
    np.testing.assert_array_equal(rests, both)
    # not for the score and the test of interactions, even where significant
    for test in ("score", "interactions"):
        mask, said = _gate_warnings(res.significant, test, alpha=0.1)
        assert (mask & res.gate_open).any() and said == []
    with pytest.raises(ValueError, match="none of the features"):
        res.rests_on_interactions("score")


def test_no_warning_where_the_significant_models_are_shut(xor_result):
    """The same result with the gate recorded open only in noise models where nothing
    is significant, then with none recorded: no warning, nothing rests on it."""
    res = xor_result
    state, meta = res._state()
    for gate in ([False, False, True, True], None):
        other = TimeCourseResult._from_state(dict(state, gate_open=gate), meta) \
            if gate is not None else TimeCourseResult._from_state(
                {k: v for k, v in state.items() if k != "gate_open"}, meta)
        mask, said = _gate_warnings(other.significant, "A", alpha=0.1)
        assert mask[:2].all() and not mask[2:].any() and said == []
        assert not other.rests_on_interactions("A", alpha=0.1).any()


def test_additive_design_keeps_the_gate_shut_and_warns_nothing():
    res = _additive()
    assert res.gate_open is not None
    assert not res.gate_open.any()
    np.testing.assert_array_equal(
        res.gate_open, res.pvalues_fwe[:, res.tests.index("interactions")] <= STAGED_GATE)
    mask, said = _gate_warnings(res.significant, "a")
    assert mask.any() and said == []       # found, by its main effect alone
    assert not res.rests_on_interactions("a").any()
    assert "gate open" not in repr(res)
    df = res.to_data_frame()
    assert not df["gate_open"].any()


def test_no_gate_without_tests_and_none_open_without_interactions():
    """``n_null=0``: no tests, no gate (None).  ``interactions=False``: the staged test
    has no interaction to find, the main effect is every feature's test: the gate is
    recorded shut in every model (``settings["feature_test_staged_open"]`` 0)."""
    res = _additive(n_null=0, n_repeats=1, max_steps=20)
    assert res.tests is None and res.gate_open is None
    assert "gate_open" not in res.to_data_frame().columns
    res = _additive(n_null=9, n_repeats=1, max_steps=20, interactions=False)
    assert "interactions" not in res.tests
    assert res.gate_open is not None and not res.gate_open.any()
    assert res.settings["feature_test_staged_open"] == 0
    _, said = _gate_warnings(res.significant, "a", alpha=0.1)
    assert said == []


def _cv_output(feature_test, tests, gate):
    out = CVOutput(W=None, score=None, importance=None, importance_perm_std=None,
                   n_iter=None, converged=None, terms=["A"], feature_names=["A"],
                   folds=[])
    out.tests, out.feature_test, out.gate_open = tests, feature_test, gate
    return out


def test_result_tests_passes_the_gate_of_a_staged_test_only():
    """What every analysis (time-resolved, searchlight, ROI, sensors, sources) passes to
    its result: the gate with a staged test, None with another feature test or none."""
    rng = np.random.default_rng(0)
    tests = {"A": (rng.normal(size=3), rng.normal(size=(9, 3)))}
    gate = np.array([True, False, True])
    got = result_tests(_cv_output("staged", tests, gate))["gate_open"]
    np.testing.assert_array_equal(got, gate)
    assert got.dtype == bool
    assert result_tests(_cv_output("combined", tests, gate))["gate_open"] is None
    assert result_tests(_cv_output("importance", tests, None))["gate_open"] is None
    assert result_tests(_cv_output("staged", {}, gate))["gate_open"] is None


def test_gate_open_is_saved_and_read_back(xor_result, tmp_path):
    res = xor_result
    back = read_result(res.save(tmp_path / "r.npz"))
    assert back.gate_open.dtype == bool
    np.testing.assert_array_equal(back.gate_open, res.gate_open)
    _, said = _gate_warnings(back.significant, "A", alpha=0.1)
    assert len(said) == 1
    # a result without one (a file saved before it was recorded) reads back None
    state, meta = res._state()
    old = TimeCourseResult._from_state({k: v for k, v in state.items()
                                        if k != "gate_open"}, meta)
    assert old.gate_open is None
    again = read_result(old.save(tmp_path / "old.npz"))
    assert again.gate_open is None
    with np.load(tmp_path / "old.npz") as f:
        assert "array__gate_open" not in f.files


def _small(gate_open):
    rng = np.random.default_rng(0)
    F, M = 2, 5
    return TimeCourseResult(rng.standard_normal((F, M, 3)), rng.uniform(-1, 1, (F, M)),
                            rng.standard_normal((F, M, 2, 2)), rng.integers(1, 9, (F, M)),
                            ["a", "b", "a:b"], ["a", "b"], gate_open=gate_open)


def test_gate_open_shape_and_values_are_checked():
    with pytest.raises(ValueError, match=re.escape("gate_open must have shape (models,) "
                                                   "= (5,)")):
        _small(np.zeros(4, bool))
    with pytest.raises(ValueError, match="must have shape"):
        _small(np.zeros((5, 1), bool))
    with pytest.raises(ValueError, match="True / False"):
        _small(np.array([0, 1, 2, 0, 1]))
    with pytest.raises(ValueError, match="True / False"):
        _small(np.array(["a"] * 5))
    res = _small([0, 1, 1, 0, 0])           # 0 / 1 read as bool
    assert res.gate_open.dtype == bool
    np.testing.assert_array_equal(res.gate_open, [False, True, True, False, False])
    assert _small(None).gate_open is None


def test_tidy_frame_has_the_gate_of_each_rows_model(xor_result):
    res = xor_result
    df = res.to_data_frame()
    assert df["gate_open"].dtype == bool
    for t, gate in zip(res.times, res.gate_open):
        assert (df.loc[df["time"] == t, "gate_open"] == gate).all()
    assert len(df) == len(res.times) * len(res.terms)
    one = res.to_data_frame(terms="A")
    np.testing.assert_array_equal(one["gate_open"], res.gate_open)
