"""The compiled training loop of grouped designs (``core/training/compiled.py`` and its
kernels, ``core/kernels/training.py``, numba) against the torch loop on full batches and the
grid's mini-batches: the same step (value and gradient as autograd's), the same fits up to
float32 rounding, the same stops, and used only where it applies.  (Against the reference
backend on a matrix of designs: ``tests/test_backends.py``.)"""
import numpy as np
import pandas as pd
import pytest
import torch

import mlem_neuro
from mlem_neuro.core import kernels
from mlem_neuro.core.kernels import _numba
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.ranks.grouped import grouped_soft_spearman
from mlem_neuro.core.rdms.neural import NeuralTargets
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.core.runtime import Runtime
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.training import compiled
from mlem_neuro.core.training.engine import fit_grouped, fit_stack
from mlem_neuro.core.training.metric import (
    make_W,
    predict,
    term_index,
    term_matrix,
    term_weights,
)
from mlem_neuro.simulation import simulate_representations


def _design(n=60, seed=0):
    X, y, _ = simulate_representations(n_stimuli=n, n_features=3, n_units=16, noise=0.5,
                                       random_state=seed)
    rng = np.random.default_rng(seed)
    Y = np.stack([X + 0.4 * rng.standard_normal(X.shape) for _ in range(5)])
    enc = FeatureSpace().fit(y).transform(y)
    targets = NeuralTargets.from_rdm(DenseRDMSource(Y).rdm(np.arange(n)), n, "cpu")
    return enc, targets


def _loops(monkeypatch, run):
    """``run(runtime)`` with the compiled loop, then with torch's (``Runtime(compiled=
    False)``), and which loop ran."""
    ran = []
    train = compiled.train
    monkeypatch.setattr(compiled, "train", lambda *a, **k: ran.append("compiled")
                        or train(*a, **k))
    fast = run(Runtime())
    slow = run(Runtime(compiled=False))
    return fast, slow, ran


@pytest.mark.parametrize("constraint", ["spd", "diagonal", "none"])
@pytest.mark.parametrize("per_model", [False, True])
def test_step_is_the_autograd_step(constraint, per_model):
    """Soft Spearman and gradient of one step (shared or per-model counts) against
    autograd through the grouped soft Spearman, from float32 parameters.  Measured over
    6 seeds and the 6 cases: rho within 1.0e-9, gradients within 2.2e-7 of their largest
    value (float32 W); the bounds are 1e-6 and 1e-5."""
    rng = np.random.default_rng(1)
    m, U, M = 3, 8, 6
    k, l = term_index(m, True)
    D = torch.as_tensor([[a, b, c] for a in (0, 1) for b in (0, 1) for c in (0, 1)],
                        dtype=torch.float64)
    P = term_matrix(D, k, l)
    A = rng.standard_normal((M, m, m)).astype(np.float32)
    counts = rng.integers(1, 40, (M, U) if per_model else U).astype(np.float64)
    sums = rng.standard_normal((M, U)) * 0.1
    rho, grad = compiled.value_and_grad(A, constraint, k, l, P.numpy(), counts, sums, 1.0)
    Ag = torch.as_tensor(A).requires_grad_(True)
    q = term_weights(make_W(Ag, constraint), k, l).double() @ P.T
    ref = grouped_soft_spearman(predict(q, constraint), torch.as_tensor(counts),
                                torch.as_tensor(sums), 1.0)
    ref.sum().backward()
    g = Ag.grad.numpy()
    assert np.abs(g).max() > 1e-3                         # a gradient worth comparing
    np.testing.assert_allclose(rho, ref.detach().numpy(), atol=1e-6)
    np.testing.assert_allclose(grad, g, rtol=0, atol=1e-5 * np.abs(g).max())


@pytest.mark.parametrize("constraint, interactions",
                         [("spd", True), ("spd", False), ("diagonal", False),
                          ("none", True)])
def test_compiled_loop_fits_as_the_torch_loop(monkeypatch, constraint, interactions):
    """60 steps without early stopping: W and histories agree to float32 rounding
    (measured over 4 design seeds at lr 0.03: W within 2.4e-7, histories within 3.0e-8).
    The step size is pinned: lr="auto" gives these full batches 0.1, whose larger steps
    carry the loops' float32 rounding further (``none``: W 3.9e-5 apart after 60 steps)."""
    enc, targets = _design()
    opts = MLEMOptions(constraint=constraint, interactions=interactions, max_steps=60,
                       patience=1000, tol=0.0, lr=0.03)
    fast, slow, ran = _loops(monkeypatch, lambda rt: fit_stack(enc, targets, opts,
                                                               random_state=0, runtime=rt))
    assert ran == ["compiled"] and fast.full_batch
    np.testing.assert_array_equal(fast.n_iter, slow.n_iter)
    np.testing.assert_allclose(fast.W, slow.W, atol=2e-5)
    np.testing.assert_allclose(fast.history, slow.history, atol=1e-5)
    np.testing.assert_allclose(fast.best_score, slow.best_score, atol=1e-5)
    assert fast.history.shape == slow.history.shape == (5, 60)


def test_early_stopping_matches(monkeypatch):
    """The default stopping rule stops the models at the same steps; histories end with
    NaN after a model's stop, as the stack's do."""
    enc, targets = _design(seed=2)
    opts = MLEMOptions(max_steps=400)
    fast, slow, ran = _loops(monkeypatch, lambda rt: fit_stack(enc, targets, opts,
                                                               random_state=0, runtime=rt))
    assert ran == ["compiled"]
    assert fast.converged.all() and fast.n_iter.max() < 400
    assert len(set(fast.n_iter)) > 1                      # models stop at different steps
    np.testing.assert_array_equal(fast.n_iter, slow.n_iter)
    np.testing.assert_array_equal(fast.converged, slow.converged)
    np.testing.assert_allclose(fast.W, slow.W, atol=1e-5)
    assert fast.history.shape == slow.history.shape
    np.testing.assert_array_equal(np.isnan(fast.history), np.isnan(slow.history))


def test_per_model_counts(monkeypatch):
    rng = np.random.default_rng(3)
    D = torch.as_tensor([[a, b] for a in (0, 1) for b in (0, 1)], dtype=torch.float64)
    counts = torch.as_tensor(rng.integers(1, 50, (7, 4))).double()
    counts[2, 1] = 0.0                                   # a row a model lacks
    sums = torch.as_tensor(rng.standard_normal((7, 4))) * 0.1
    opts = MLEMOptions(max_steps=50, patience=1000, tol=0.0)
    fast, slow, ran = _loops(monkeypatch, lambda rt: fit_grouped(D, counts, sums, opts,
                                                                       runtime=rt))
    assert ran == ["compiled"]
    np.testing.assert_allclose(fast.W, slow.W, atol=1e-5)
    np.testing.assert_allclose(fast.best_score, slow.best_score, atol=1e-6)
    assert fast.history is None and slow.history is None


def test_no_models():
    D = torch.as_tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    fit = fit_grouped(D, torch.zeros(0, 3), torch.zeros(0, 3), MLEMOptions())
    assert fit.W.shape == (0, 2, 2) and fit.n_iter.shape == (0,)


@pytest.mark.parametrize("case", ["mini-batch", "float64", "switched off"])
def test_used_only_where_it_applies(monkeypatch, case):
    """Mini-batches of pairs, float64 training and ``Runtime(compiled=False)`` train with
    torch."""
    enc, targets = _design()
    opts = MLEMOptions(max_steps=5, batch_size=300 if case == "mini-batch" else "auto")
    dtype = torch.float64 if case == "float64" else torch.float32
    runtime = Runtime(compiled=case != "switched off")
    ran = []
    monkeypatch.setattr(compiled, "train", lambda *a, **k: ran.append("compiled"))
    fit = fit_stack(enc, targets, opts, random_state=0, dtype=dtype, runtime=runtime)
    assert ran == [] and fit.W.shape == (5, 3, 3)


def test_engine_uses_it_by_default(monkeypatch):
    enc, targets = _design()
    seen = []
    real = compiled.available
    monkeypatch.setattr(compiled, "available",
                        lambda *a: seen.append(real(*a)) or seen[-1])
    fit_stack(enc, targets, MLEMOptions(max_steps=5), random_state=0)
    assert seen == [True]


def _numeric_design(n=200, seed=0, models=4):
    """Numeric features on the grid: with 200 stimuli the batch-size rule keeps
    mini-batches of blocks (fewer than all pairs)."""
    rng = np.random.default_rng(seed)
    y = pd.DataFrame({f: rng.random(n) for f in "abc"})
    X = y.to_numpy() @ rng.standard_normal((3, 12))
    Y = np.stack([X + 0.8 * rng.standard_normal(X.shape) for _ in range(models)])
    enc = FeatureSpace().fit(y).transform(y)
    targets = NeuralTargets.from_rdm(DenseRDMSource(Y).rdm(np.arange(n)), n, "cpu")
    return enc, targets


@pytest.mark.parametrize("stopping", ["fixed steps", "default"])
def test_grid_mini_batches_fit_as_the_torch_loop(monkeypatch, stopping):
    """The grid's mini-batches of blocks: the same blocks each step (drawn in advance from
    the same stream, which is left where the torch loop leaves it), the same fits up to
    float32 rounding."""
    enc, targets = _numeric_design()
    opts = (MLEMOptions(max_steps=60, patience=1000, tol=0.0) if stopping == "fixed steps"
            else MLEMOptions())
    rngs = []

    def run(rt):
        rngs.append(np.random.default_rng(5))
        return fit_stack(enc, targets, opts, random_state=rngs[-1], runtime=rt)

    fast, slow, ran = _loops(monkeypatch, run)
    assert ran == ["compiled"] and not fast.full_batch and not slow.full_batch
    assert fast.batch_size == slow.batch_size < enc.n_stimuli * (enc.n_stimuli - 1) // 2
    np.testing.assert_array_equal(fast.n_iter, slow.n_iter)
    # float32 rounding (sums in another order) grows over noisy steps in some models:
    # measured (against the numpy loop of the C kernel this one reproduces bit for bit,
    # the torch loop's numbers to float32 rounding) over 12 draw seeds: histories within
    # 1.4e-4, W within 3e-7 in 42 of 48 models and at most 4.1e-3 in the others
    np.testing.assert_allclose(fast.history, slow.history,
                               atol=3e-4 if stopping == "fixed steps" else 1e-3)
    dW = np.abs(fast.W - slow.W).max(axis=(1, 2))
    assert dW.max() < 1e-2 and np.median(dW) < 1e-5
    # the stream continues as after the torch loop's draws
    assert rngs[0].integers(2**31) == rngs[1].integers(2**31)


def test_grid_block_tables_are_the_torch_sums(monkeypatch):
    """The grid's per-block target tables from one compiled pass equal torch's
    scatter_add_ / index_add_ sums bit for bit (the same pairs added in the same order)."""
    from mlem_neuro.core.training.quantise import GridBlocks

    rng = np.random.default_rng(9)
    P, cells = 3000, 40
    uid = torch.as_tensor(rng.integers(0, cells, P))
    blocks = GridBlocks(uid, cells, np.random.default_rng(0))
    values = torch.as_tensor(np.round(rng.random((6, P)), 2))        # tied ranks too
    fast = blocks.targets(values, np.random.default_rng(1))
    slow = blocks.targets(values, np.random.default_rng(1), compiled=False)
    assert fast.T.shape == slow.T.shape == (6, cells, 32)
    for name in ("T", "S1", "S2"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert slow.T.sum() > 0


def test_kernels_run_in_threads():
    """The kernels release the GIL (``nogil``) and hold no shared state: chunks run in
    threads (joblib's threading backend, a dask worker) train the models a single thread
    trains."""
    from concurrent.futures import ThreadPoolExecutor

    enc, targets = _design()
    opts = MLEMOptions(max_steps=40)
    one = fit_stack(enc, targets, opts, random_state=0)
    with ThreadPoolExecutor(4) as pool:
        fits = list(pool.map(lambda _: fit_stack(enc, targets, opts, random_state=0),
                             range(4)))
    for fit in fits:
        np.testing.assert_array_equal(fit.W, one.W)


@pytest.mark.parametrize("grid", [False, True])
def test_threads_train_the_models_one_thread_trains(grid, monkeypatch):
    """With more than one thread (the thread policy's cores, ``MLEM_NEURO_NUM_THREADS``)
    the loop splits the models between threads (numba's ``prange``): every model's steps
    depend on it alone, so the fits are those of one thread, bit for bit."""
    from mlem_neuro.core.runtime import Runtime

    enc, targets = _numeric_design() if grid else _design()
    opts = MLEMOptions(max_steps=80)
    assert compiled.threads_for(4) == 1                  # outside an analysis: one
    one = fit_stack(enc, targets, opts, random_state=np.random.default_rng(5))
    assert compiled.threads_for(compiled.PARALLEL_MODELS - 1, 2) == 1    # a small stack
    monkeypatch.setattr(compiled, "PARALLEL_MODELS", 1)    # these stacks are small
    if compiled.threads_for(4, 2) < 2:
        pytest.skip("numba has a single thread here")
    assert compiled.threads_for(1, 2) == 1               # never more threads than models
    two = fit_stack(enc, targets, opts, random_state=np.random.default_rng(5),
                    runtime=Runtime(compiled_threads=2))
    assert grid != one.full_batch
    np.testing.assert_array_equal(two.W, one.W)
    np.testing.assert_array_equal(two.n_iter, one.n_iter)
    np.testing.assert_array_equal(two.history, one.history)


def test_without_numba_torch_trains_and_a_warning_says_so(tmp_path):
    """numba is a dependency, but a machine without it (a GPU node carrying few wheels)
    still imports the package and trains the same models with torch, saying why it is
    slower."""
    import subprocess
    import sys

    code = ("import sys, warnings; sys.modules['numba'] = None\n"
            "import numpy as np, pandas as pd, mlem_neuro\n"
            "from mlem_neuro.core import kernels\n"
            "assert not kernels.built() and kernels.numba_version() is None\n"
            "rng = np.random.default_rng(0)\n"
            "t = pd.DataFrame({'a': np.tile(['x', 'y'], 12)})\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            "    res = mlem_neuro.mlem_array(rng.standard_normal((24, 4, 2)), t, cv=2,\n"
            "                               n_repeats=1, max_steps=5, verbose='ERROR')\n"
            "assert res.provenance['training'] == ['torch (cpu)'], res.provenance\n"
            "assert res.provenance['compiled_training'] is False\n"
            "assert any('numba is not installed' in str(x.message) for x in w)\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("text, expected", [
    ("", False), ("0", False), ("false", False), ("False", False), (" no ", False),
    ("off", False), ("1", True), ("true", True), ("YES", True), ("on", True)])
def test_no_compiled_reads_yes_no_words(text, expected):
    """``MLEM_NEURO_NO_COMPILED=false`` leaves the kernels on (it switched them off)."""
    assert kernels.env_flag(kernels.NO_COMPILED_VAR,
                            {kernels.NO_COMPILED_VAR: text}) is expected
    assert kernels.env_flag(kernels.NO_COMPILED_VAR, {}) is False


def test_no_compiled_refuses_other_words():
    with pytest.raises(ValueError, match=r"MLEM_NEURO_NO_COMPILED='maybe' is not a yes/no"):
        kernels.env_flag(kernels.NO_COMPILED_VAR, {kernels.NO_COMPILED_VAR: "maybe"})


def test_no_compiled_is_read_by_the_runtime_not_at_import():
    """The flag is read when a runtime is resolved (once per analysis), from the
    environment of that moment; ``Runtime()`` reads none (the kernels on where numba is
    installed), and a bad word is refused there."""
    on = compiled.numba is not None
    assert Runtime().compiled is on
    assert Runtime.resolve(environ={kernels.NO_COMPILED_VAR: "false"}).compiled is on
    assert Runtime.resolve(environ={kernels.NO_COMPILED_VAR: "true"}).compiled is False
    assert Runtime.resolve(environ={}).compiled is on
    with pytest.raises(ValueError, match="MLEM_NEURO_NO_COMPILED='maybe'"):
        Runtime.resolve(environ={kernels.NO_COMPILED_VAR: "maybe"})
    assert not hasattr(_numba, "USE_COMPILED")


#: the compiled kernels themselves (numba functions), which no analysis whose runtime
#: has them off may call
_KERNELS = [("mlem_neuro.core.kernels.grid", "_block_tables_kernel"),
            ("mlem_neuro.core.kernels.distances", "_condensed_kernel"),
            ("mlem_neuro.core.kernels.ranks", "_subset_ranks_kernel"),
            ("mlem_neuro.core.kernels.sorted_keys", "_packed_keys_kernel"),
            ("mlem_neuro.core.kernels.sorted_keys", "_feature_keys_kernel"),
            ("mlem_neuro.core.kernels.sorted_keys", "_rank_walk_kernel"),
            ("mlem_neuro.core.training.compiled", "train")]


@pytest.mark.skipif(compiled.numba is None, reason="numba not installed")
@pytest.mark.parametrize("feature", ["categorical", "numeric"])
def test_no_compiled_set_before_an_analysis_runs_no_kernel(monkeypatch, feature):
    """``MLEM_NEURO_NO_COMPILED=1`` set in the environment before an analysis (no
    re-import) runs every step of that analysis (training, scores, rank sums, the test of
    interactions) without the compiled kernels, and its provenance says so; unset, the
    next analysis uses them again."""
    import importlib

    rng = np.random.default_rng(0)
    n = 30
    table = pd.DataFrame({"a": rng.integers(0, 2, n) > 0, "b": rng.integers(0, 2, n) > 0,
                          "c": rng.integers(0, 3, n).astype(float) + (
                              rng.random(n) if feature == "numeric" else 0.0)})
    X = rng.standard_normal((n, 4, 2))
    kw = dict(cv=2, n_repeats=2, n_null=3, max_steps=5, random_state=0, verbose="ERROR")
    called = []
    for module, name in _KERNELS:
        mod = importlib.import_module(module)
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _real=real, _name=name, **k:
                            called.append(_name) or _real(*a, **k))
    monkeypatch.setenv(kernels.NO_COMPILED_VAR, "1")
    res = mlem_neuro.mlem_array(X, table, **kw)
    assert called == []
    assert res.provenance["compiled_training"] is False
    assert res.provenance["training"] == ["torch (cpu)"]
    monkeypatch.delenv(kernels.NO_COMPILED_VAR)
    res = mlem_neuro.mlem_array(X, table, **kw)
    assert called and res.provenance["compiled_training"] is True


def test_no_writable_place_for_the_cache_says_so_and_keeps_mne_off_numba(monkeypatch):
    """Neither the user's private folder nor a folder of the process's can be made (no
    writable temporary directory): no disk cache, one warning, and MNE is told not to use
    numba (its kernels ask for a cache and would raise)."""
    if compiled.numba is None:
        pytest.skip("numba is not installed")
    monkeypatch.delenv("MNE_USE_NUMBA", raising=False)
    monkeypatch.setattr(_numba, "fallback_cache_dir", lambda: None)
    monkeypatch.setattr(_numba, "_private_cache_dir", lambda: None)
    before = compiled.numba.config.CACHE_DIR
    with pytest.warns(RuntimeWarning, match="no writable place for numba's cache"):
        assert _numba._fallback_cache() is None
    import os
    assert os.environ["MNE_USE_NUMBA"] == "false"
    assert compiled.numba.config.CACHE_DIR == before
