"""The training loops of grouped designs on the CPU side by side: compiled (numba) and torch.

``core/training/compiled.py`` (its kernels: ``core/kernels/training.py``) trains grouped
full batches and the grid's mini-batches compiled, one model at a time
(``backend="compiled"``, what ``"auto"`` picks); the torch loop (autograd,
``backend="torch"``) runs on a GPU and for per-pair designs.
Each case is run with each loop in turn, in alternation for ``--rounds`` rounds, in this
process (one torch thread); the script prints the median CPU time of each loop, the
ratios to the compiled loop, the largest difference of the fitted metrics from the
compiled loop's and the steps per model (a stack runs as long as its slowest model: the
long tail is what makes the fixed cost of a stack's step matter).

Cases:

* ``time``: :func:`mlem_neuro.mlem_array`, 200 simulated trials x 64 channels x 100 time
  points, 3 binary features (:func:`~mlem_neuro.simulation.simulate_epochs`), the
  defaults (5 folds, 10 permutations);
* ``nulls``: the same with ``n_null=20`` (the null models stack by thousands);
* ``spheres``: :func:`mlem_neuro.mlem_searchlight` on a 10 x 10 x 10 image of 3 mm voxels
  (every voxel a 6 mm sphere), 48 images, 4 binary features;
* ``grid``: :func:`mlem_neuro.mlem_array` on ``bench_numeric.py``'s numeric design (200
  trials x 32 channels x 20 time points, 4 uniform numeric features): training on the grid
  of numeric distances, in mini-batches of blocks.

With ``--per-step``, the cost of one training step per model instead: stacks of
synthetic grouped full batches (:func:`mlem_neuro.core.training.engine.fit_grouped`, every binary
feature-distance row, 3,000 pairs, targets ranked from a random additive code plus noise)
trained for a fixed number of steps (no early stopping), for 3, 4 and 8 binary features
(8, 16 and 256 distinct rows); the best of 2 runs per loop, in ns per model and step.

    OMP_NUM_THREADS=1 python benchmarks/bench_train_loops.py [--rounds 3] [--per-step]
"""
import argparse
import itertools
import time

import nibabel as nib
import numpy as np
import pandas as pd
import torch
from bench_numeric import simulate as simulate_numeric  # this folder

import mlem_neuro
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.training.engine import fit_grouped
from mlem_neuro.simulation import simulate_epochs


def cases():
    data, table, times = simulate_epochs(n_trials=200, n_channels=64, n_times=100,
                                         sfreq=100.0, tmin=-0.2, random_state=0)
    rng = np.random.default_rng(0)
    n = 48
    feats = pd.DataFrame({f: rng.permutation(np.arange(n) % 2) for f in "abcd"})
    img = rng.standard_normal((10, 10, 10, n))
    img[3:7, 3:7, 3:7] += 0.8 * rng.standard_normal((4, 4, 4))[..., None] * feats["a"].values
    affine = np.diag([3.0, 3.0, 3.0, 1.0])
    imgs = nib.Nifti1Image(img.astype(np.float32), affine)
    mask = nib.Nifti1Image(np.ones((10, 10, 10), np.int8), affine)
    feats = feats.astype(str)
    num_data, num_table = simulate_numeric(200, 32, 20, 4, "numeric", 0.5, 0)
    return {
        "time": lambda b: mlem_neuro.mlem_array(data, table, times=times, random_state=0,
                                                backend=b, verbose="WARNING"),
        "nulls": lambda b: mlem_neuro.mlem_array(data, table, times=times, random_state=0,
                                                 n_null=20, backend=b, verbose="WARNING"),
        "spheres": lambda b: mlem_neuro.mlem_searchlight(
            imgs, feats, mask, radius=6.0, random_state=0, backend=b, verbose="WARNING"),
        "grid": lambda b: mlem_neuro.mlem_array(num_data, num_table, random_state=0,
                                                backend=b, verbose="WARNING"),
    }


def per_step(loops):
    """ns per model and step of each loop on synthetic grouped full batches."""
    rng = np.random.default_rng(0)
    for m, M, steps in [(3, 2000, 300), (4, 1000, 300), (8, 200, 100)]:
        D = torch.tensor(list(itertools.product((0.0, 1.0), repeat=m)), dtype=torch.float64)
        U = D.shape[0]
        g = rng.integers(0, U, size=3000)
        counts = np.bincount(g, minlength=U).astype(float) + 1.0
        sums = np.zeros((M, U))
        for i in range(M):
            x = D.numpy()[g] @ rng.normal(size=m) * 0.3 + rng.normal(size=len(g))
            r = np.argsort(np.argsort(x)).astype(float)
            r -= r.mean()
            sums[i] = np.bincount(g, weights=r / np.linalg.norm(r), minlength=U)
        counts = torch.tensor(np.tile(counts, (M, 1)))
        sums = torch.tensor(sums)
        cost, W = {}, {}
        for loop, backend in loops.items():
            opts = MLEMOptions(max_steps=steps, patience=10**6, tol=0.0, backend=backend)
            best = np.inf
            for _ in range(2):
                c0 = time.process_time()
                W[loop] = fit_grouped(D, counts, sums, opts).W
                best = min(best, time.process_time() - c0)
            cost[loop] = best / (M * steps) * 1e9
        first = next(iter(loops))
        print(f"{m} features ({U} rows), {M} models x {steps} steps: "
              + "  ".join(f"{k} {v:7.0f} ns" for k, v in cost.items()) + "  "
              + "  ".join(f"{k}/{first} {cost[k] / cost[first]:4.2f}x" for k in loops
                          if k != first) + "; max |W - W " + first + "| "
              + " ".join(f"{k} {np.abs(W[k] - W[first]).max():.1e}" for k in loops
                         if k != first), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["time", "nulls", "spheres", "grid"])
    parser.add_argument("--per-step", action="store_true",
                        help="time one step per model on synthetic stacks instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loops = {"compiled": "compiled", "torch": "torch"}
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds, CPU times")
    if args.per_step:
        per_step(loops)
        return
    first = next(iter(loops))
    for name, run in cases().items():
        if name not in args.cases:
            continue
        times, W = {k: [] for k in loops}, {}
        for _ in range(args.rounds):
            for loop, backend in loops.items():
                c0 = time.process_time()
                res = run(backend)
                times[loop].append(time.process_time() - c0)
                W[loop], steps = res.fold_weights, res.n_iter
        med = {k: np.median(v) for k, v in times.items()}
        print(f"{name:8s} " + "  ".join(f"{k} {v:6.2f} s" for k, v in med.items()) + "  "
              + "  ".join(f"{k}/{first} {med[k] / med[first]:4.2f}x" for k in loops
                          if k != first) + "; max |W - W " + first + "| "
              + " ".join(f"{k} {np.nanmax(np.abs(W[k] - W[first])):.1e}" for k in loops
                         if k != first)
              + f"; steps per model: median {np.median(steps):.0f}, 99th percentile "
              f"{np.percentile(steps, 99):.0f}, max {steps.max()}", flush=True)


if __name__ == "__main__":
    main()
