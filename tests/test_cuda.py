"""CUDA vs CPU: the same data, settings and seeds give the same numbers on both devices.

Every test but the last skips without a CUDA GPU.  Training runs in float32 on both devices,
so fitted metrics differ by float32 rounding (different reduction orders); early stopping is
turned off (``patience`` above ``max_steps``, or ``tol=-inf`` for the engine) where step
counts must match, since a 1e-7 difference can flip one "improved by more than tol"
decision.  Scores and importances are float64 on both devices;
with the same ``W`` they agree to float64 rounding.

Each comparison prints its largest difference (``MEASURED ...``; run ``pytest -s``).
Tolerances: about 10x what an H100 gave against its host's CPU for float32 training
(W, training histories: 1e-7 to 6e-7 measured), float64 rounding (1e-9 to 1e-12) for soft
ranks and for scores of the same ``W``, and one swapped pair of ranks (1e-3) for held-out
scores of two separately trained fits (measured: 1e-16, i.e. no swap).
"""
import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import torch

from mlem_neuro import MLEM
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.ranks import grouped
from mlem_neuro.core.ranks.spearman import SubsetRanks, rankdata, soft_spearman, standardize
from mlem_neuro.core.rdms.neural import NeuralTargets
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.training.engine import fit_stack
from mlem_neuro.simulation import simulate_representations

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
AFFINE = np.diag([3.0, 3.0, 3.0, 1.0])


def _fit(enc, targets, device, random_state=None, tol=1e-4, **kw):
    """fit_stack with options; ``tol=-inf`` (never stop early; the best state is kept) is set
    past the public validation, which refuses it."""
    opts = MLEMOptions(device=device, **kw)
    object.__setattr__(opts, "tol", tol)
    return fit_stack(enc, targets, opts, random_state=random_state)


def _report(name, a, b):
    diff = float(np.max(np.abs(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))))
    print(f"MEASURED {name}: max |cuda - cpu| = {diff:.3g}")
    return diff


def _cpu(x):
    assert x is not None
    return x.detach().cpu().numpy() if torch.is_tensor(x) else np.asarray(x)


def _categorical(n=60, seed=0):
    X, y, _ = simulate_representations(n_stimuli=n, n_features=4, n_units=24, noise=0.5,
                                       random_state=seed)
    return X, y


def _numeric(n=60, seed=0):
    """Three continuous features (every pair distinct: the per-pair soft-rank path)."""
    rng = np.random.default_rng(seed)
    F = rng.random((n, 3))
    X = (F * np.array([2.0, 1.0, 0.3])) @ rng.standard_normal((3, 20))
    X = X + 0.3 * rng.standard_normal(X.shape)
    return X, pd.DataFrame(F, columns=["u", "v", "w"])


# --------------------------------------------------------------------- soft ranks
@needs_cuda
@pytest.mark.parametrize("path", ["table", "expansion"])
def test_grouped_soft_rank_values_and_gradients(path, monkeypatch):
    """Grouped soft ranks (float64) on the GPU equal the CPU's, values and gradients;
    the expansion runs torchsort's CUDA kernel."""
    monkeypatch.setattr(grouped, "_isotonic_method", lambda *a: path)
    if path == "expansion":
        assert grouped._pav_kernel("cuda") is not None, "torchsort built without CUDA"
    g = torch.Generator().manual_seed(3)
    M, U = 7, 48
    counts = torch.randint(1, 150, (U,), generator=g)
    pred = torch.randn(M, U, dtype=torch.float64, generator=g)
    pred[:, 5] = pred[:, 17]                             # two groups predicted equal
    sums = torch.randn(M, U, dtype=torch.float64, generator=g)
    out = {}
    for dev in ("cpu", "cuda"):
        p = pred.clone().to(dev).requires_grad_(True)         # a leaf on each device
        r = grouped.grouped_soft_rank(p, counts.to(dev), 1.0)
        rho = grouped.grouped_soft_spearman(p, counts.to(dev), sums.to(dev), 1.0)
        (r.square().mean() + rho.sum()).backward()
        out[dev] = (_cpu(r), _cpu(rho), _cpu(p.grad))
    assert out["cpu"][2].std() > 1e-4                    # a gradient worth comparing
    for k, name in enumerate(("rank", "rho", "grad")):
        d = _report(f"grouped soft {name} ({path})", out["cuda"][k], out["cpu"][k])
        assert d < 1e-9


@needs_cuda
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-9), (torch.float32, 2e-5)])
def test_per_pair_soft_spearman_values_and_gradients(dtype, tol):
    """torchsort's soft rank on the GPU: same soft Spearman and gradient as on the CPU."""
    g = torch.Generator().manual_seed(5)
    pred = torch.rand(5, 3000, dtype=torch.float64, generator=g)
    target = pred + 0.5 * torch.rand(5, 3000, dtype=torch.float64, generator=g)
    tz = standardize(rankdata(target))
    out = {}
    for dev in ("cpu", "cuda"):
        p = pred.clone().to(dev, dtype).requires_grad_(True)
        rho = soft_spearman(p, tz.to(dev, dtype))
        rho.sum().backward()
        out[dev] = (_cpu(rho), _cpu(p.grad) * 3000)        # gradient per pair ~ 1/P
    for k, name in enumerate(("rho", "grad")):
        assert _report(f"per-pair soft {name} ({dtype})", out["cuda"][k],
                       out["cpu"][k]) < tol


@needs_cuda
def test_exact_ranks_with_large_tie_groups():
    """Average ranks are exact on the GPU too (float64), also when tie groups hold
    positions whose sums exceed float32's exact integers."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (2, 200_000), generator=g).to(torch.float64)
    cpu, gpu = rankdata(x), rankdata(x.cuda())
    assert gpu.dtype == torch.float64
    assert torch.equal(gpu.cpu(), cpu)
    v = torch.round(torch.rand(4, 500, dtype=torch.float64, generator=g) * 20)
    cols = torch.randperm(500, generator=g)[:130]
    groups = torch.randint(0, 6, (500,), generator=g)
    counts = torch.bincount(groups[cols], minlength=6)
    sr_cpu, sr_gpu = SubsetRanks(v, groups), SubsetRanks(v.cuda(), groups.cuda())
    assert torch.equal(sr_gpu.ranks(cols.cuda()).cpu(), sr_cpu.ranks(cols))
    assert _report("SubsetRanks.group_sums", _cpu(sr_gpu.group_sums(cols.cuda(),
                                                                    counts.cuda())),
                   _cpu(sr_cpu.group_sums(cols, counts))) < 1e-12


# -------------------------------------------------------------------------- MLEM
def _pair(kind):
    X, y = _categorical() if kind == "categorical" else _numeric()
    return X[:45], y.iloc[:45], X[45:], y.iloc[45:]


@needs_cuda
@pytest.mark.parametrize("batch_size", ["full", 300])
@pytest.mark.parametrize("kind", ["categorical", "numeric"])
def test_mlem_fit_score_importance(kind, batch_size):
    """Grouped (categorical) and per-pair (numeric) paths, full and mini-batch: the GPU
    learns the CPU's W (float32 rounding apart) and scores/permutes it identically."""
    Xtr, ytr, Xte, yte = _pair(kind)
    kw = dict(max_steps=60, patience=10_000, tol=0.0, batch_size=batch_size, random_state=0)
    cpu = MLEM(device="cpu", **kw).fit(Xtr, ytr)
    gpu = MLEM(device="cuda", **kw).fit(Xtr, ytr)
    assert isinstance(gpu.W_, np.ndarray) and gpu.W_.dtype == np.float64
    assert gpu.n_iter_ == cpu.n_iter_ == 60
    assert (gpu.batch_size_ == cpu.batch_size_) and (batch_size == "full") == (
        cpu.batch_size_ == 45 * 44 // 2)
    name = f"{kind}, batch {batch_size}"
    assert _report(f"W ({name})", gpu.W_, cpu.W_) < 2e-6                # H100: 8.9e-8
    assert _report(f"history ({name})", gpu.history_, cpu.history_) < 2e-6   # 2.4e-7
    # held-out scores of the two fits (H100: 1e-16): room for one swapped pair of ranks
    assert _report(f"score ({name})", gpu.score(Xte, yte), cpu.score(Xte, yte)) < 1e-3
    # same W on both devices: float64 scores and importances agree to rounding
    same = MLEM(device="cuda", **kw).fit(Xtr, ytr)
    same.W_ = cpu.W_.copy()
    assert abs(same.score(Xte, yte) - cpu.score(Xte, yte)) < 1e-12
    for level in ("term", "feature"):
        a = same.permutation_importance(Xte, yte, n_permutations=4, level=level,
                                        random_state=1)
        b = cpu.permutation_importance(Xte, yte, n_permutations=4, level=level,
                                       random_state=1)
        assert a.index.equals(b.index)
        assert a["importance"].abs().max() > 1e-3
        cols = ["importance", "importance_perm_std"]
        assert _report(f"{level} importance, same W ({name})", a[cols], b[cols]) < 1e-12
        assert a.attrs["baseline_score"] == pytest.approx(b.attrs["baseline_score"],
                                                          abs=1e-12)


@needs_cuda
@pytest.mark.parametrize("variant", ["full", "ranker", "sorted", "rows", "per-batch terms"])
def test_fit_stack_many_models(variant, monkeypatch):
    """A stack of M = 12 models on the GPU: every target/term source of the engine."""
    import mlem_neuro.core.rdms.neural as neural
    import mlem_neuro.core.training.engine as engine
    X, y, _ = simulate_representations(n_stimuli=60, n_features=3, n_units=16, noise=0.0,
                                       random_state=1)
    rng = np.random.default_rng(1)
    Y = np.stack([X + s * X.std(0) * rng.standard_normal(X.shape)
                  for s in np.linspace(0.1, 2.0, 12)])
    enc = FeatureSpace().fit_transform(y)
    batch = "full" if variant == "full" else 500
    if variant == "sorted":                        # targets ranked at every step
        monkeypatch.setattr(engine, "MAX_RANKER_ELEMENTS", 0)
    if variant == "rows":                          # distances from rows, per batch
        monkeypatch.setattr(neural, "MAX_FULL_ELEMENTS", 0)
    if variant == "per-batch terms":               # no term matrix of all pairs
        monkeypatch.setattr(engine, "MAX_TERM_ELEMENTS", 0)
    kw = dict(batch_size=batch, max_steps=50, tol=-np.inf, random_state=0)
    res = {dev: _fit(enc, NeuralTargets.from_data(Y, "euclidean", dev), dev, **kw)
           for dev in ("cpu", "cuda")}
    assert res["cuda"].W.shape == (12, 3, 3) and res["cuda"].full_batch == (batch == "full")
    np.testing.assert_array_equal(res["cuda"].n_iter, res["cpu"].n_iter)
    assert _report(f"fit_stack W ({variant})", res["cuda"].W, res["cpu"].W) < 2e-6  # 2.1e-7
    assert _report(f"fit_stack history ({variant})", res["cuda"].history,
                   res["cpu"].history) < 2e-6                                 # H100: 2.4e-7


@needs_cuda
def test_fit_stack_early_stopping():
    """With early stopping on, the GPU stops models as the CPU does (measured: same
    step counts) and keeps the same best states."""
    X, y, _ = simulate_representations(n_stimuli=60, n_features=3, n_units=16, noise=0.0,
                                       random_state=2)
    rng = np.random.default_rng(2)
    Y = np.stack([X + s * X.std(0) * rng.standard_normal(X.shape)
                  for s in np.linspace(0.1, 2.0, 16)])
    enc = FeatureSpace().fit_transform(y)
    kw = dict(batch_size=500, max_steps=400, patience=10, tol=1e-3, random_state=0)
    res = {dev: _fit(enc, NeuralTargets.from_data(Y, "euclidean", dev), dev, **kw)
           for dev in ("cpu", "cuda")}
    assert res["cuda"].converged.any()
    same = res["cuda"].n_iter == res["cpu"].n_iter
    print(f"MEASURED early stopping: {same.sum()} of {len(same)} models stop at the same "
          "step")
    assert same.mean() >= 0.75
    assert _report("early-stopped best score", res["cuda"].best_score[same],
                   res["cpu"].best_score[same]) < 1e-6                       # H100: 3e-8


# ----------------------------------------------------------------- analyses
def _epochs(n=60, n_channels=8, n_times=12, amp=0.8, seed=0):
    rng = np.random.default_rng(seed)
    feats = {f: rng.integers(0, 2, n) for f in "AB"}
    X = rng.standard_normal((n, n_channels, n_times))
    p = rng.standard_normal(n_channels)
    X[:, :, 4:8] += amp * (2.0 * feats["A"] - 1)[:, None, None] * p[None, :, None]
    return X, pd.DataFrame({f: np.where(v, "hi", "lo") for f, v in feats.items()})


@needs_cuda
def test_mlem_array():
    from mlem_neuro.time_resolved import mlem_array
    X, y = _epochs()
    kw = dict(cv=3, n_repeats=1, max_steps=60, patience=10_000, tol=0.0, n_permutations=4,
              random_state=0)
    cpu = mlem_array(X, y, device="cpu", **kw)
    gpu = mlem_array(X, y, device="cuda", **kw)
    assert gpu.settings["device"] == "cuda"
    np.testing.assert_array_equal(gpu.n_iter, cpu.n_iter)
    assert cpu.fold_importance[:, 4:8, 0].mean() > 0.05          # A is found ...
    assert _report("mlem_array W", gpu.fold_weights, cpu.fold_weights) < 3e-6   # 3.0e-7
    # held-out scores and importances (H100: 2.5e-16): room for one swapped pair of ranks
    assert _report("mlem_array score", gpu.fold_score, cpu.fold_score) < 1e-3
    assert _report("mlem_array importance", gpu.fold_importance,
                   cpu.fold_importance) < 1e-3


@needs_cuda
def test_null_models_relabelling_features():
    """The relabelled-feature null models (per-model counts, the interval table on the
    GPU) and the interaction test's shared-rank fits give the CPU's statistics."""
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.inference import run_analysis
    X, y = _epochs()
    source = DenseRDMSource(np.ascontiguousarray(X.transpose(2, 0, 1)))
    out = {}
    for dev in ("cpu", "cuda"):
        # feature_test="combined": every feature's null models in every model (the
        # staged default fits them only where the test of interactions opens the gate,
        # which 3 nulls never do)
        opts = MLEMOptions(cv=3, n_repeats=1, max_steps=40, patience=10_000, tol=0.0,
                           n_permutations=2, feature_test="combined",
                           n_null=3, random_state=0, device=dev)   # equal step counts
        res = run_analysis(source, y, opts)
        out[dev] = (res.fold_null, res.tests["interactions"][1])
    assert _report("null statistics", out["cuda"][0], out["cpu"][0]) < 1e-3
    assert _report("interaction nulls", out["cuda"][1], out["cpu"][1]) < 1e-3


@needs_cuda
def test_grouped_soft_spearman_with_per_model_counts():
    g = torch.Generator().manual_seed(5)
    M, U = 6, 20
    counts = torch.randint(1, 90, (M, U), generator=g).double()
    pred = torch.randn(M, U, dtype=torch.float64, generator=g)
    sums = torch.randn(M, U, dtype=torch.float64, generator=g)
    out = {}
    for dev in ("cpu", "cuda"):
        p = pred.clone().to(dev).requires_grad_(True)
        rho = grouped.grouped_soft_spearman(p, counts.to(dev), sums.to(dev), 1.0)
        rho.sum().backward()
        out[dev] = (_cpu(rho), _cpu(p.grad))
    assert _report("per-model counts rho", out["cuda"][0], out["cpu"][0]) < 1e-9
    assert _report("per-model counts grad", out["cuda"][1], out["cpu"][1]) < 1e-9


def _images(n=24, shape=(6, 6, 6), seed=0):
    rng = np.random.default_rng(seed)
    a = np.tile([0, 1], n // 2)
    b = rng.permutation(np.tile([0, 1], n // 2))
    data = rng.standard_normal(shape + (n,))
    data[2:5, 2:5, 2:5] += 1.5 * rng.standard_normal((3, 3, 3))[..., None] * a
    table = pd.DataFrame({"a": np.where(a, "on", "off"), "b": np.where(b, "u", "v")})
    mask = nib.Nifti1Image(np.ones(shape, np.int8), AFFINE)
    process = np.zeros(shape, np.int8)
    process[::2, ::2, ::2] = 1                                    # 27 centres
    return (nib.Nifti1Image(data.astype(np.float32), AFFINE), table, mask,
            nib.Nifti1Image(process, AFFINE))


@needs_cuda
def test_mlem_searchlight():
    import mlem_neuro
    imgs, table, mask, process = _images()
    kw = dict(radius=4.0, cv=3, n_repeats=1, max_steps=60, patience=10_000, tol=0.0,
              n_permutations=4,
              random_state=0)
    cpu = mlem_neuro.mlem_searchlight(imgs, table, mask, process, device="cpu", **kw)
    gpu = mlem_neuro.mlem_searchlight(imgs, table, mask, process, device="cuda", **kw)
    np.testing.assert_array_equal(gpu.n_iter, cpu.n_iter)
    assert _report("searchlight W", gpu.fold_weights, cpu.fold_weights) < 6e-6  # 6.0e-7
    # held-out scores and importances (H100: 2.2e-16): room for one swapped pair of ranks
    assert _report("searchlight score", gpu.fold_score, cpu.fold_score) < 1e-3
    assert _report("searchlight importance", gpu.fold_importance,
                   cpu.fold_importance) < 1e-3


# -------------------------------------------------------- without a CUDA build
def test_pav_kernel_is_none_without_torchsorts_cuda_extension(monkeypatch):
    """torchsort installed without its CUDA extension keeps a stub that raises on call in
    its kernel table: the grouped path must see no CUDA kernel (and use the interval
    table) instead of calling the stub."""
    import sys
    torchsort = pytest.importorskip("torchsort")
    monkeypatch.setitem(sys.modules, "torchsort.isotonic_cuda", None)   # import fails
    monkeypatch.delattr(torchsort, "isotonic_cuda", raising=False)      # even if loaded
    assert grouped._pav_kernel("cuda") is None
    assert grouped._pav_kernel("cpu") is not None


def test_gpu_prefers_the_interval_table(monkeypatch):
    """On a GPU the interval table is used whenever it fits in memory (torchsort's CUDA
    kernel runs one sequential thread per model); on the CPU scipy's weighted
    pool-adjacent-violators, or without it the table only for few groups."""
    assert grouped._isotonic_method(256, 8496, 100, "cpu") == "pav"
    assert grouped._isotonic_method(256, 8496, 100, "cuda") == "table"
    too_big = int((grouped.MAX_TABLE_ELEMENTS / 100) ** 0.5) + 1
    assert grouped._isotonic_method(too_big, 10**9, 100, "cuda") == "expansion"
    monkeypatch.setattr(grouped, "_scipy_pav", lambda: None)          # scipy < 1.12
    assert grouped._isotonic_method(256, 8496, 100, "cpu") == "expansion"
    assert grouped._isotonic_method(32, 8496, 100, "cpu") == "table"


@needs_cuda
def test_backends_on_the_gpu_torch_trains_and_the_cpu_loops_say_why_not():
    """On a GPU ``backend="auto"`` trains with torch (recorded as ``torch (cuda)``), the
    same models as torch on the CPU; the compiled loop, CPU-only, refuses."""
    import mlem_neuro

    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile(["x", "y"], 12), "b": np.repeat(["u", "v"], 12)})
    data = rng.standard_normal((24, 6, 2))
    kw = dict(cv=2, n_repeats=1, max_steps=60, patience=100, random_state=0,
              verbose="ERROR")
    gpu = mlem_neuro.mlem_array(data, table, device="cuda", **kw)
    cpu = mlem_neuro.mlem_array(data, table, backend="torch", **kw)
    assert gpu.provenance["training"] == ["torch (cuda)"]
    print(f"MEASURED backend auto on cuda vs torch on cpu, W: max |cuda - cpu| = "
          f"{np.abs(gpu.fold_weights - cpu.fold_weights).max():.3g}")
    np.testing.assert_allclose(gpu.fold_weights, cpu.fold_weights, atol=6e-6)
    with pytest.raises(ValueError, match="cannot train this design"):
        mlem_neuro.mlem_array(data, table, device="cuda", backend="compiled", **kw)


needs_real_cuda = pytest.mark.skipif(not torch.cuda.is_available() or torch.version.cuda is None,
                                     reason="needs a real CUDA GPU (graphs are not emulated)")


@needs_real_cuda
@pytest.mark.parametrize("stops", [False, True])
def test_cuda_graph_steps_equal_the_eager_steps(stops, monkeypatch):
    """``MLEM_NEURO_CUDA_GRAPHS=1``: the full-batch steps replayed from a captured CUDA
    graph give the fits of the eager steps (the same kernels; the AdamW step count is a
    device tensor there), with and without models stopping (a new capture after each
    check that drops rows).  Tolerance: float32 training rounding (1e-5)."""
    from mlem_neuro.core.training import graphs
    X, y = _categorical(n=80)
    enc = FeatureSpace().fit_transform(y)
    rng = np.random.default_rng(0)
    Y = np.stack([X + s * rng.standard_normal(X.shape) for s in np.linspace(0.1, 3.0, 32)])
    runners = []

    def keep(*args):
        out = graphs.GraphRunner(*args)
        runners.append(out)
        return out
    fits = {}
    for on in (False, True):
        monkeypatch.setenv(graphs.ENV, "1" if on else "0")
        monkeypatch.setattr(graphs, "GraphRunner", keep)
        kw = dict(patience=10, max_steps=400) if stops else dict(max_steps=60)
        fits[on] = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cuda"), "cuda",
                        tol=1e-4 if stops else -np.inf, batch_size="full", random_state=0, **kw)
    assert len(runners) == 1 and runners[0].failed is None, runners[0].failed
    assert runners[0].replays > 0 and runners[0].captures >= (2 if stops else 1)
    a, b = fits[False], fits[True]
    print(f"MEASURED graphs ({'with' if stops else 'without'} stops): {runners[0].captures} "
          f"captures, {runners[0].replays} replays; max |W graph - W eager| = "
          f"{np.abs(a.W - b.W).max():.3g}; steps differ in "
          f"{int((a.n_iter != b.n_iter).sum())} of {len(a.n_iter)} models")
    if not stops:
        np.testing.assert_array_equal(a.n_iter, b.n_iter)
    assert (a.n_iter == b.n_iter).mean() >= 0.9
    same = a.n_iter == b.n_iter
    np.testing.assert_allclose(b.W[same], a.W[same], atol=1e-5)
