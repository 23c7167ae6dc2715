"""Explicit training backends: ``backend=`` chooses the training path, ``"auto"`` decides
in one function (:func:`mlem_neuro.core.training.backends.choose_backend`) reading one
table (:data:`~mlem_neuro.core.training.backends.BACKENDS`), every backend trains
the models the reference backend trains (:mod:`mlem_neuro.core.training.reference`: torch
autograd, ``torchsort.soft_rank``, ``torch.optim.AdamW``) on a matrix of designs, and a
backend that cannot train a design says why."""
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.core import checks
from mlem_neuro.core.constants import GROUPED_STEP_RULE
from mlem_neuro.core.kernels import _numba
from mlem_neuro.core.training import backends, engine

# fixed step counts (no early stopping): the fits compare step by step
KW = dict(cv=2, n_repeats=1, max_steps=100, patience=1000, tol=0.0, random_state=0,
          verbose="ERROR")
NAMES = {"compiled": "compiled loop (numba)", "torch": "torch (cpu)",
         "reference": engine.BACKEND_NAMES["reference"]}


def _data(numeric=False, seed=0, n=48, categorical=True):
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"a": np.tile(["x", "y"], n // 2),
                          "b": np.repeat(["u", "v"], n // 2)})
    if numeric:
        table["c"] = rng.uniform(size=n)
    if not categorical:
        table = pd.DataFrame({f: rng.uniform(size=n) for f in "abc"})
        codes = table[["a"]].to_numpy()
    else:
        codes = (table["a"] == "x").to_numpy(float)[:, None]
    data = rng.standard_normal((n, 6, 3)) + 1.5 * codes[:, :, None] * rng.standard_normal(6)[
        None, :, None]
    return data, table


#: design name -> (data arguments, analysis arguments, backends that can train it)
DESIGNS = {
    "categorical": ({}, {}, ("compiled", "torch")),
    "mixed (numeric on the grid)": ({"numeric": True}, {}, ("compiled", "torch")),
    "numeric grid, mini-batches of blocks": ({"categorical": False, "n": 200},
                                             {"n_null": 0}, ("compiled", "torch")),
    "per-pair mini-batches": ({"numeric": True},
                              {"numeric_levels": None, "batch_size": 300}, ("torch",)),
    "term level": ({}, {"level": "term"}, ("compiled", "torch")),
    "nulls": ({}, {"n_null": 2}, ("compiled", "torch")),
}


@pytest.mark.parametrize("design", list(DESIGNS))
@pytest.mark.parametrize("seed", [0, 1])
def test_every_backend_trains_the_models_the_reference_trains(design, seed):
    """100 steps of every model (no early stopping): W of each backend against the
    reference's, and the importances and null p-values (float64, on the same held-out
    pairs).  Measured over seeds 0-2: |W - W_reference| at most 1.5e-7 (float32 rounding in
    another order), importances equal (grid mini-batches: below).  The bounds leave room
    for other CPUs' float order (60x)."""
    data_kw, kw, backends = DESIGNS[design]
    data, table = _data(seed=seed, **data_kw)
    ref = mlem_neuro.mlem_array(data, table, backend="reference", **KW, **kw)
    assert ref.provenance["training"] == [NAMES["reference"]]
    for backend in backends:
        res = mlem_neuro.mlem_array(data, table, backend=backend, **KW, **kw)
        assert res.provenance["training"] == [NAMES[backend]], backend
        np.testing.assert_array_equal(res.n_iter, ref.n_iter, err_msg=backend)
        if "blocks" in design and backend == "compiled":
            # the compiled loop sums a step's block targets in another order (a total
            # minus the blocks left out): over noisy mini-batch steps the float32
            # rounding grows in some models.  Measured over seeds 0-3: W within 7.5e-8 in
            # 95 of 96 models, 2.1e-3 in one; importances within 1.7e-5.
            dW = np.abs(res.fold_weights - ref.fold_weights).max(axis=(-2, -1)).ravel()
            assert dW.max() < 1e-2 and np.median(dW) < 1e-6, backend
            np.testing.assert_allclose(res.importance, ref.importance, atol=2e-4)
            continue
        np.testing.assert_allclose(res.fold_weights, ref.fold_weights, atol=1e-5,
                                   err_msg=backend)
        np.testing.assert_allclose(res.importance, ref.importance, atol=1e-5,
                                   err_msg=backend)
        if kw.get("n_null"):
            np.testing.assert_array_equal(res.pvalues, ref.pvalues, err_msg=backend)


def test_one_table_of_backends_with_the_options_words_and_one_interface():
    """The table's names are the option's words (checked once, in core.checks), each row
    is a module with the one interface, and the recorded names are those results have
    always written (saved results read the same)."""
    assert ("auto", *backends.BACKENDS) == checks.BACKENDS
    for name, backend in backends.BACKENDS.items():
        assert backend.name == name and callable(backend.module.train)
        assert backend.record("cpu") == NAMES[name]
    assert engine.BACKEND_NAMES["compiled"] == "compiled loop (numba)"
    assert backends.BACKENDS["torch"].record("cuda") == "torch (cuda)"
    # "auto" may pick the compiled loop and torch, never the reference
    assert [b.name for b in backends.BACKENDS.values() if b.auto] == ["compiled", "torch"]


def test_every_backend_returns_what_trained_it():
    """Each backend's fit names itself and the step rule it used (resolved from "auto"):
    what the analyses record, from the return value."""
    import torch

    from mlem_neuro.core.options import MLEMOptions

    rng = np.random.default_rng(0)
    D = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    counts = torch.tensor([[10.0, 12.0, 6.0]] * 2)
    sums = torch.as_tensor(rng.standard_normal((2, 3)))
    for name in backends.BACKENDS:
        fit = engine.fit_grouped(D, counts, sums, MLEMOptions(max_steps=3, backend=name))
        assert fit.trained_with() == (NAMES[name], *GROUPED_STEP_RULE), name
        fit = engine.fit_grouped(D, counts, sums, MLEMOptions(max_steps=3, backend=name,
                                                               lr=0.05, patience=7))
        assert (fit.backend, fit.lr, fit.patience) == (NAMES[name], 0.05, 7), name


def test_the_grid_design_trains_on_mini_batches():
    """The matrix's numeric design does train on mini-batches of blocks (200 stimuli)."""
    data, table = _data(categorical=False, n=200)
    res = mlem_neuro.mlem_array(data, table, **dict(KW, max_steps=5))
    assert max(res.settings["batch_size_used"]) < 200 * 199 // 2


def test_auto_picks_the_compiled_loop_where_it_applies():
    data, table = _data()
    res = mlem_neuro.mlem_array(data, table, **KW)
    assert res.provenance["training"] == [NAMES["compiled"]]
    # a numeric feature trained pair by pair (no grid): torch
    res = mlem_neuro.mlem_array(*_data(numeric=True), numeric_levels=None, **KW)
    assert res.provenance["training"] == ["torch (cpu)"]


def test_auto_uses_torch_when_the_compiled_kernels_are_off(monkeypatch):
    monkeypatch.setenv(_numba.NO_COMPILED_VAR, "1")       # read when the analysis starts
    res = mlem_neuro.mlem_array(*_data(), **KW)
    assert res.provenance["training"] == ["torch (cpu)"]


def test_a_backend_that_cannot_train_the_design_says_why():
    data, table = _data(numeric=True)
    with pytest.raises(ValueError, match="backend='compiled' cannot train this "
                                         "design.*per-pair"):
        mlem_neuro.mlem_array(data, table, numeric_levels=None, backend="compiled", **KW)


def test_at_the_default_step_rule_the_backends_agree_with_the_reference():
    """At ``lr="auto"`` (0.1 and patience 10 on these grouped designs) the larger steps
    make the float rounding of the reference (autograd, torchsort) against the compiled
    and torch loops flip an "improved by more than tol" decision now and then.  Measured
    over seeds 0-5 (36 models stopping between steps 15 and 197): compiled and torch stop
    every model at the same step; 2 of 36 models stop elsewhere than the reference's, W
    within 1.2e-3 of its, importances and scores equal (at patience 20: 3 of 36,
    9.1e-4)."""
    worst_w, moved = 0.0, 0
    for seed in range(6):
        data, table = _data(seed=seed)
        kw = dict(cv=2, n_repeats=1, random_state=0, verbose="ERROR")
        ref = mlem_neuro.mlem_array(data, table, backend="reference", **kw)
        comp = mlem_neuro.mlem_array(data, table, backend="compiled", **kw)
        torch_ = mlem_neuro.mlem_array(data, table, backend="torch", **kw)
        np.testing.assert_array_equal(comp.n_iter, torch_.n_iter)
        moved += int((comp.n_iter != ref.n_iter).sum())
        worst_w = max(worst_w, float(np.abs(comp.fold_weights - ref.fold_weights).max()))
        np.testing.assert_allclose(comp.importance, ref.importance, atol=1e-3)
    assert moved <= 6                   # measured 2 of 36 (3 at patience 20)
    assert worst_w < 1e-2               # measured 1.2e-3 (9.1e-4 at patience 20)


def test_the_estimator_and_command_line_take_the_backend():
    data, table = _data()
    est = mlem_neuro.MLEM(backend="reference", max_steps=20, random_state=0)
    assert est.get_params()["backend"] == "reference"
    est.fit(data[:, :, 0], table)
    with pytest.raises(ValueError, match="backend must be one of"):
        mlem_neuro.MLEM(backend="gpu").fit(data[:, :, 0], table)
    with pytest.raises(ValueError, match="backend must be one of"):
        mlem_neuro.MLEM(backend="numpy").fit(data[:, :, 0], table)   # removed: numba


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_backend_stops_where_the_reference_stops(seed):
    """One stopping rule: with the same patience and tolerance every backend stops each
    model at the reference's step and keeps the state of its best score (the compiled
    loop writes the rule out for speed; torch's stack masks stopped models; the reference
    keeps one model at a time).  Measured over seeds 0-2 at ``lr=0.03, patience=50``
    (models stopping between steps 71 and 594): the same steps, W within 1.2e-7."""
    data, table = _data(seed=seed)
    kw = dict(cv=2, n_repeats=1, random_state=0, verbose="ERROR", lr=0.03, patience=50)
    ref = mlem_neuro.mlem_array(data, table, backend="reference", **kw)
    assert ref.n_iter.min() < ref.n_iter.max() < 1000     # models stop, at different steps
    for backend in ("compiled", "torch"):
        res = mlem_neuro.mlem_array(data, table, backend=backend, **kw)
        np.testing.assert_array_equal(res.n_iter, ref.n_iter, err_msg=backend)
        np.testing.assert_allclose(res.fold_weights, ref.fold_weights, atol=1e-5,
                                   err_msg=backend)
