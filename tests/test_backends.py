"""Explicit training backends: ``backend=`` chooses the training path, ``"auto"`` decides
in one function (:func:`mlem_neuro.core.engine.choose_backend`), every backend trains
the same models as torch (the reference), and a backend that cannot train a design
says why."""
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.core import ctrain, numpy_train

KW = dict(cv=2, n_repeats=1, max_steps=300, patience=50, random_state=0, verbose="ERROR")


def _data(numeric=False, seed=0, n=48):
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"a": np.tile(["x", "y"], n // 2),
                          "b": np.repeat(["u", "v"], n // 2)})
    if numeric:
        table["c"] = rng.uniform(size=n)
    codes = (table["a"] == "x").to_numpy(float)[:, None]
    data = rng.standard_normal((n, 6, 3)) + 1.5 * codes[:, :, None] * rng.standard_normal(6)[
        None, :, None]
    return data, table


def _compiled_ok():
    return ctrain.built() and ctrain.USE_C


@pytest.mark.parametrize("backend", ["compiled", "numpy"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_backend_trains_the_models_torch_trains(backend, seed):
    """Categorical design, full batches, up to 300 steps: W of the compiled and numpy
    loops against torch's.  Measured over seeds 0-5 (48 stimuli): |W - W_torch| at most
    1.2e-7 (compiled) and 1.8e-7 (numpy), float32 rounding in another order; the
    importances, float64 on the same held-out pairs, equal.  The bounds leave room for
    other CPUs' float order (50x)."""
    if backend == "compiled" and not _compiled_ok():
        pytest.skip("the compiled loop is not built here")
    if backend == "numpy" and not numpy_train.tied._scipy_pav():
        pytest.skip("scipy's pool-adjacent-violators is missing (scipy < 1.12)")
    data, table = _data(seed=seed)
    ref = mlem_neuro.mlem_array(data, table, backend="torch", **KW)
    res = mlem_neuro.mlem_array(data, table, backend=backend, **KW)
    assert res.provenance["training"] == [
        {"compiled": "compiled loop (C)", "numpy": "numpy loop"}[backend]]
    assert ref.provenance["training"] == ["torch (cpu)"]
    np.testing.assert_allclose(res.fold_weights, ref.fold_weights, atol=1e-5)
    np.testing.assert_allclose(res.importance, ref.importance, atol=1e-5)


def test_auto_picks_the_fastest_that_can_train_the_design(caplog):
    data, table = _data()
    res = mlem_neuro.mlem_array(data, table, **KW)
    expected = "compiled loop (C)" if _compiled_ok() else "numpy loop"
    assert res.provenance["training"] == [expected]
    # a numeric feature trained pair by pair (no grid): only torch can
    res = mlem_neuro.mlem_array(*_data(numeric=True), numeric_levels=None, **KW)
    assert res.provenance["training"] == ["torch (cpu)"]


def test_a_backend_that_cannot_train_the_design_says_why():
    data, table = _data(numeric=True)
    for backend in ("compiled", "numpy"):
        with pytest.raises(ValueError, match=f"backend='{backend}' cannot train this "
                                             "design.*per-pair"):
            mlem_neuro.mlem_array(data, table, numeric_levels=None, backend=backend, **KW)


def test_the_estimator_and_command_line_take_the_backend():
    data, table = _data()
    est = mlem_neuro.MLEM(backend="torch", max_steps=20, random_state=0)
    assert est.get_params()["backend"] == "torch"
    est.fit(data[:, :, 0], table)
    with pytest.raises(ValueError, match="backend must be one of"):
        mlem_neuro.MLEM(backend="gpu").fit(data[:, :, 0], table)
