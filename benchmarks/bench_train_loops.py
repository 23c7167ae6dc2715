"""The training loops of grouped designs on the CPU side by side: C, numpy and torch.

``core/ctrain.py`` trains grouped full batches in C, one model at a time;
``core/numpy_train.py`` runs the same steps on stacks of models in numpy (it still trains
grouped mini-batches, and every grouped design where the C loop is not built); the torch
loop (autograd) is what ran before and still runs on a GPU and for per-pair designs.
Each case is run with each loop in turn, in alternation for ``--rounds`` rounds, in this
process (one torch thread); the script prints the median CPU time of each loop, the
ratios to the C loop, the largest difference of the fitted metrics from the C loop's and
the steps per model (a stack runs as long as its slowest model: the long tail is what
makes the fixed cost of a stack's step matter).

Cases:

* ``time``: :func:`mlem_neuro.mlem_array`, 200 simulated trials x 64 channels x 100 time
  points, 3 binary features (:func:`~mlem_neuro.simulation.simulate_epochs`), the
  defaults (5 folds, 10 permutations);
* ``nulls``: the same with ``n_null=20`` (the null models stack by thousands);
* ``spheres``: :func:`mlem_neuro.mlem_searchlight` on a 10 x 10 x 10 image of 3 mm voxels
  (every voxel a 6 mm sphere), 48 images, 4 binary features.

    OMP_NUM_THREADS=1 python benchmarks/bench_train_loops.py [--rounds 3]
"""
import argparse
import time

import nibabel as nib
import numpy as np
import pandas as pd
import torch

import mlem_neuro
from mlem_neuro.core import ctrain, numpy_train
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
    return {
        "time": lambda: mlem_neuro.mlem_array(data, table, times=times, random_state=0,
                                              verbose="WARNING"),
        "nulls": lambda: mlem_neuro.mlem_array(data, table, times=times, random_state=0,
                                               n_null=20, verbose="WARNING"),
        "spheres": lambda: mlem_neuro.mlem_searchlight(
            imgs, feats, mask, radius=6.0, random_state=0, verbose="WARNING"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["time", "nulls", "spheres"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    real = numpy_train.available
    loops = {"c": (True, real), "numpy": (False, real), "torch": (False, lambda *a: False)}
    if not ctrain.built():
        print("the compiled loop is not built: comparing numpy and torch only")
        del loops["c"]
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds, CPU times")
    first = next(iter(loops))
    for name, run in cases().items():
        if name not in args.cases:
            continue
        times, W = {k: [] for k in loops}, {}
        for _ in range(args.rounds):
            for loop, (use_c, available) in loops.items():
                ctrain.USE_C, numpy_train.available = use_c, available
                c0 = time.process_time()
                res = run()
                times[loop].append(time.process_time() - c0)
                W[loop], steps = res.fold_weights, res.n_iter
        ctrain.USE_C, numpy_train.available = True, real
        med = {k: np.median(v) for k, v in times.items()}
        print(f"{name:8s} " + "  ".join(f"{k} {v:6.1f} s" for k, v in med.items()) + "  "
              + "  ".join(f"{k}/{first} {med[k] / med[first]:4.2f}x" for k in loops
                          if k != first) + "; max |W - W " + first + "| "
              + " ".join(f"{k} {np.nanmax(np.abs(W[k] - W[first])):.1e}" for k in loops
                         if k != first)
              + f"; steps per model: median {np.median(steps):.0f}, 99th percentile "
              f"{np.percentile(steps, 99):.0f}, max {steps.max()}", flush=True)


if __name__ == "__main__":
    main()
