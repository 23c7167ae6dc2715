"""The CUDA code paths, run without a GPU on an emulated device (``tests/fake_cuda.py``).

No GPU has been available to this project's CI, so the ``device="cuda"`` paths would
otherwise never run.  The emulation computes on the CPU but tags every tensor with its
device and raises where CUDA would (tensors of two devices in one operation, ``.numpy()``
of a CUDA tensor, a CPU generator for CUDA random numbers), so these tests find device
bugs; they cannot find GPU-specific numerics (``tests/test_cuda.py`` does, on a GPU).

First the emulation is checked to raise where CUDA raises and to allow what CUDA allows;
then every analysis runs with ``device="cuda"`` and must equal the CPU run: the CUDA path
trains with torch while the CPU path uses the numpy training loop, the same steps to
float32 rounding (measured, ``pytest -s``: scores and p-values equal, importances within
1.1e-16; 5.3e-5 was seen with other quantised numeric data).  Tolerances: 1e-3 for importances and
scores, one null's worth (``1 / (1 + n_null)``) for p-values.
"""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import fake_cuda  # tests/ is on sys.path (pytest's rootdir-relative import)
import mne
import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import torch
from fake_cuda import CpuTensor, CudaTensor, DeviceMismatch

import mlem_neuro
from mlem_neuro.core.training import compiled
from mlem_neuro.simulation import simulate_epochs, simulate_item_trials

HERE = Path(__file__).parent
# the former step rule for every fit: with lr="auto" (0.1, patience 20 then, now 10, on
# grouped designs) float rounding between the CUDA and the compiled CPU path flipped one model's
# stopping step on the source-space design (20 stimuli, score 0.074 apart; every other
# analysis equal to 1e-16); these tests compare the paths' arithmetic, which the rule
# does not change (tests/test_backends.py checks the backends at the default rule)
FAST = dict(cv=3, n_repeats=1, max_steps=150, n_permutations=4, random_state=0, lr=0.03,
            patience=50)
N_NULL = 3

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(),
                                  reason="a real GPU is present: tests/test_cuda.py runs")


# ----------------------------------------------------------------- the emulation itself
@needs_no_gpu
def test_emulation_raises_where_cuda_raises():
    with fake_cuda.fake_cuda():
        assert torch.cuda.is_available()
        x = torch.arange(4.0, device="cuda")
        assert isinstance(x, CudaTensor) and x.device == torch.device("cuda", 0) and x.is_cuda
        cpu = torch.ones(4)
        assert isinstance(cpu, CpuTensor) and cpu.device.type == "cpu"
        for bad in (lambda: x + cpu, lambda: torch.cat([x, cpu]),
                    lambda: torch.where(x > 1, x, cpu), lambda: x @ torch.ones(4, 2),
                    lambda: x + torch.from_numpy(np.ones(4)),
                    lambda: cpu[torch.tensor([0, 1], device="cuda")],
                    lambda: torch.randperm(4, device="cuda", generator=torch.Generator())):
            with pytest.raises(DeviceMismatch):
                bad()
        with pytest.raises(TypeError, match="cuda"):
            x.numpy()
        with pytest.raises(TypeError, match="cuda"):
            np.asarray(x * 2)
        y = torch.zeros(3, device="cuda")
        with pytest.raises(DeviceMismatch):
            y[torch.tensor([0, 1])] = torch.ones(2)       # CPU values into a CUDA tensor
    assert not torch.cuda.is_available() or torch.version.cuda is not None


@needs_no_gpu
def test_emulation_allows_what_cuda_allows():
    with fake_cuda.fake_cuda():
        x = torch.arange(4.0, device="cuda")
        idx = torch.tensor([2, 0])
        assert isinstance(x[idx], CudaTensor)                 # CPU indices into CUDA
        assert isinstance(x * torch.tensor(2.0), CudaTensor)  # 0-dim CPU tensors mix
        assert isinstance(x + 1, CudaTensor) and isinstance(torch.zeros_like(x), CudaTensor)
        host = torch.zeros(4)
        host.copy_(x)                                          # copies across devices
        host[1:3] = x[:2]                                      # a basic slice copies too
        moved = host.to(x.device)
        assert isinstance(moved, CudaTensor)
        moved += 1
        assert host.tolist() == [0, 0, 1, 3] and float(moved[0]) == 1.0  # a move copies
        np.testing.assert_array_equal(x.cpu().numpy(), [0, 1, 2, 3])
        assert x.sum().item() == 6.0 and x.tolist() == [0, 1, 2, 3]
        w = torch.ones(3, device="cuda", requires_grad=True)
        (w * w).sum().backward()
        assert w.is_leaf and isinstance(w.grad, CudaTensor)
        with torch.no_grad():
            w -= 0.5 * w.grad
        import torchsort
        r = torchsort.soft_rank(torch.tensor([[3.0, 1.0, 2.0]], device="cuda"))
        assert isinstance(r, CudaTensor)
        np.testing.assert_allclose(r.cpu().numpy(), [[3, 1, 2]], atol=1e-6)
    assert not isinstance(torch.zeros(2), fake_cuda._Tagged)   # nothing leaks out


# ------------------------------------------------------------------ analyses on "cuda"
def _epochs():
    data, table, times = simulate_epochs(n_trials=36, n_channels=8, n_times=8,
                                         random_state=0)
    names = ["Fz", "Cz", "Pz", "Oz", "C3", "C4", "P3", "P4"]
    info = mne.create_info(names, 100.0, "eeg")
    epochs = mne.EpochsArray(data * 1e-6, info, tmin=times[0], metadata=table[["A", "B"]],
                             verbose="ERROR")
    epochs.set_montage(mne.channels.make_standard_montage("standard_1020"))
    return epochs


def _numeric(d):
    data, table, times = simulate_epochs(n_trials=36, n_channels=8, n_times=6,
                                         random_state=1)
    table = pd.DataFrame({"u": np.random.default_rng(1).random(36), "A": table["A"]})
    return mlem_neuro.mlem_array(data, table, times=times, n_null=N_NULL, device=d, **FAST)


def _items(d):
    X, table = simulate_item_trials(n_items=12, n_trials=4, n_units=8, n_times=3,
                                    random_state=0)[:2]
    return mlem_neuro.mlem_array(X, table[["condition"]], items=table["item"].to_numpy(),
                                 distance="crossnobis", times=np.arange(3) / 100.0,
                                 device=d, **FAST)


def _images():
    rng = np.random.default_rng(0)
    shape, n = (5, 5, 5), 24
    a = np.tile([0, 1], n // 2)
    data = rng.standard_normal(shape + (n,)).astype(np.float32)
    data[1:4, 1:4, 1:4] += a * rng.standard_normal((3, 3, 3, 1)).astype(np.float32)
    affine = np.diag([3.0, 3.0, 3.0, 1.0])
    table = pd.DataFrame({"a": a, "b": rng.permutation(a)})
    mask = nib.Nifti1Image(np.ones(shape, np.int8), affine)
    labels = np.ones(shape, np.int16)
    labels[3:] = 2
    return nib.Nifti1Image(data, affine), table, mask, nib.Nifti1Image(labels, affine)


def _stcs(d):
    src = mne.setup_volume_source_space(pos=15.0, sphere=(0, 0, 0, 0.045), verbose=False)
    v = src[0]["vertno"]
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.arange(20) % 2, "b": rng.permutation(np.arange(20) % 2)})
    stcs = [mne.VolSourceEstimate(rng.standard_normal((len(v), 3)) + table["a"][i] *
                                  (np.arange(len(v)) < 6)[:, None], [v], 0.0, 0.01)
            for i in range(20)]
    return mlem_neuro.mlem_stcs(stcs, table, src, spatial_radius=0.02, device=d, **FAST)


def _searchlight(d):
    imgs, table, mask, _ = _images()
    return mlem_neuro.mlem_searchlight(imgs, table, mask, radius=4.0, n_null=N_NULL,
                                       device=d, **FAST)


def _roi(d):
    imgs, table, _, labels = _images()
    return mlem_neuro.mlem_roi(imgs, table, labels, n_null=N_NULL, device=d, **FAST)


ANALYSES = {
    "epochs, tests": lambda d: mlem_neuro.mlem_epochs(_epochs(), n_null=N_NULL, device=d,
                                                      **FAST),
    "epochs, sensor searchlight": lambda d: mlem_neuro.mlem_epochs(
        _epochs(), spatial_radius=0.06, device=d, **FAST),
    "epochs, term level, mini-batches": lambda d: mlem_neuro.mlem_epochs(
        _epochs(), level="term", batch_size=200, device=d, **FAST),
    "numeric features, tests": _numeric,
    "items, crossnobis": _items,
    "searchlight, tests": _searchlight,
    "regions, tests": _roi,
    "source space": _stcs,
}


def _numbers(res):
    out = {"score": np.asarray(res.score, float), "importance": np.asarray(res.importance,
                                                                           float)}
    if res.pvalues is not None:
        out["pvalues"] = np.asarray(res.pvalues, float)
        out["pvalues_fwe"] = np.asarray(res.pvalues_fwe, float)
    return out


@needs_no_gpu
@pytest.mark.parametrize("name", list(ANALYSES))
def test_analysis_on_emulated_cuda_equals_cpu(name, monkeypatch):
    run = ANALYSES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cpu = _numbers(run("cpu"))
        used_numpy_loop = []            # the compiled CPU loop must not train on cuda
        train = compiled.train
        monkeypatch.setattr(compiled, "train",
                            lambda *a, **k: used_numpy_loop.append(1) or train(*a, **k))
        before = fake_cuda.CUDA_OPS[0]
        with fake_cuda.fake_cuda():
            res = run("cuda")
        gpu = _numbers(res)
    assert res.settings["device"] == "cuda"
    assert fake_cuda.CUDA_OPS[0] - before > 1000 and not used_numpy_loop  # the CUDA path ran
    assert set(gpu) == set(cpu)
    for key in cpu:
        assert np.isfinite(gpu[key]).all() == np.isfinite(cpu[key]).all()
        tol = 1.0 / (1 + N_NULL) + 1e-12 if key.startswith("pvalues") else 1e-3
        print(f"MEASURED {name}, {key}: max |cuda - cpu| = "
              f"{np.nanmax(np.abs(gpu[key] - cpu[key])):.2g}")
        np.testing.assert_allclose(gpu[key], cpu[key], atol=tol, rtol=0, err_msg=key)


@needs_no_gpu
def test_estimator_on_emulated_cuda_equals_cpu():
    X, y, _ = mlem_neuro.simulation.simulate_representations(
        n_stimuli=40, n_features=3, n_units=10, noise=0.5, random_state=0)
    fits = {}
    for device in ("cpu", "cuda"):
        with fake_cuda.fake_cuda() if device == "cuda" else warnings.catch_warnings():
            est = mlem_neuro.MLEM(device=device, max_steps=150, random_state=0).fit(X, y)
            imp = est.permutation_importance(X, y, n_permutations=3, random_state=0)
            fits[device] = (est.W_, est.score(X, y), imp["importance"].to_numpy())
    assert isinstance(fits["cuda"][0], np.ndarray)
    for a, b in zip(fits["cpu"], fits["cuda"]):
        np.testing.assert_allclose(b, a, atol=1e-3, rtol=0)


def _categorical_encoding(n, seed):
    from mlem_neuro.core.stimuli.features import FeatureSpace
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"a": rng.choice(["x", "y"], n), "b": rng.choice(["p", "q", "r"], n),
                          "c": rng.choice(["u", "v"], n)})
    return FeatureSpace().fit_transform(table)


@needs_no_gpu
@pytest.mark.parametrize("design", ["per pair", "grouped", "grouped, expansion"])
def test_one_host_synchronisation_per_check_of_the_stopped_models(design, monkeypatch):
    """Each read of a GPU value by the host waits for the GPU (reads, ``nonzero``, boolean
    masks, outputs sized by the values: ``fake_cuda.SYNCS``).  The full-batch training
    loop reads one per check of which models still train, every
    :data:`GPU_CHECK_EVERY` steps, and none per step or per model (measured: the former
    loop read 2 per step that the emulation counted and 2 boolean masks it did not);
    the grouped soft ranks' expansion (large stacks of many groups) included."""
    from mlem_neuro.core import constants
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.ranks import grouped
    from mlem_neuro.core.rdms.neural import NeuralTargets
    from mlem_neuro.core.stimuli.features import FeatureSpace
    from mlem_neuro.core.training.engine import fit_stack
    if design == "per pair":
        X, y, _ = mlem_neuro.simulation.simulate_representations(
            n_stimuli=40, n_features=3, n_units=10, noise=0.5, random_state=0)
        enc = FeatureSpace().fit_transform(y)
    else:
        X = np.random.default_rng(1).standard_normal((40, 10))
        enc = _categorical_encoding(40, 0)
    expansions, real = [0], grouped._expanded_isotonic
    if design == "grouped, expansion":
        monkeypatch.setattr(grouped, "_isotonic_method",
                            lambda U, b, M, device_type="cpu": "expansion")

        def counted(*args):
            expansions[0] += 1
            return real(*args)
        monkeypatch.setattr(grouped, "_expanded_isotonic", counted)
    Y = np.stack([X + 0.3 * s * np.random.default_rng(s).standard_normal(X.shape)
                  for s in range(6)])
    syncs = {}
    with fake_cuda.fake_cuda():
        for steps in (20, 60):
            opts = MLEMOptions(device="cuda", max_steps=steps, batch_size="full")
            object.__setattr__(opts, "tol", -np.inf)      # never stop early
            targets = NeuralTargets.from_data(Y, "euclidean", "cuda")
            before = fake_cuda.SYNCS[0]
            fit = fit_stack(enc, targets, opts, random_state=0)
            syncs[steps] = fake_cuda.SYNCS[0] - before
            assert (fit.n_iter == steps).all()
    per_step = (syncs[60] - syncs[20]) / 40
    print(f"MEASURED host synchronisations per step ({design}): {per_step} ({syncs})")
    assert 0 < per_step <= 1 / constants.GPU_CHECK_EVERY, syncs
    assert (expansions[0] >= 80) == (design == "grouped, expansion")


# ------------------------------------------------------- the GPU test files, emulated
@needs_no_gpu
def test_cuda_tests_pass_on_emulated_cuda():
    """tests/test_cuda.py and the CUDA tests of the other files, with ``-p fake_cuda_plugin``
    (their "needs a CUDA GPU" marks see the emulated device)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "fake_cuda_plugin", "-p",
           "no:cacheprovider", "--no-header", "-W", "ignore::UserWarning",
           str(HERE / "test_cuda.py"), str(HERE / "test_validation.py"),
           str(HERE / "test_options.py"), str(HERE / "test_sklearn_contract.py"),
           str(HERE / "test_time_resolved.py"), "-k", "cuda or Cuda or device"]
    proc = subprocess.run(cmd, cwd=HERE.parent, env=env, capture_output=True, text=True,
                          timeout=600)
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    summary = proc.stdout.strip().splitlines()[-1]
    n_passed = int(summary.split(" passed")[0].split()[-1])
    assert n_passed >= 30, summary   # 21 in test_cuda.py, 15 in the others (measured)
    assert " failed" not in summary and " error" not in summary, summary
