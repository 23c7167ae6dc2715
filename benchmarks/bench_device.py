"""Engine cost per training step against the number of models, on the CPU and on a GPU.

``fit_stack`` trains ``M`` models (n = 200 stimuli, 32 units each, 19,900 pairs, the paper's
batch-size selection) for a fixed number of steps (no early stopping), on each device in
turn, for two designs:

* categorical: 6 binary features with interactions (64 groups of identical term rows: the
  grouped soft ranks);
* numeric: 3 continuous features with interactions (every pair distinct: torchsort's soft
  rank on every pair).

Each case is fitted for 10 and for 40 steps: the difference gives the cost of one training
step (ms, all ``M`` models), the rest the fixed cost of a call (batch-size selection, pair
terms, target ranks); together they show where a GPU pays.  With ``--profile`` it also
counts the CUDA
kernels launched per step (``torch.profiler``) for the first size.

Run: ``.venv/bin/python benchmarks/bench_device.py [--devices cpu cuda] [--models 16 64 256]``
"""
import argparse

import numpy as np
import pandas as pd
from _common import clock, describe, warm_up

from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.neural import NeuralTargets
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.training.engine import fit_stack


def design(kind, n, M, units=32, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "categorical":
        F = rng.integers(0, 2, (n, 6)).astype(float)
        table = pd.DataFrame({f"f{k}": np.where(F[:, k], "a", "b") for k in range(6)})
    else:
        F = rng.random((n, 3))
        table = pd.DataFrame(F, columns=["u", "v", "w"])
    base = F @ rng.standard_normal((F.shape[1], units))
    Y = base[None] + rng.standard_normal((M, n, units)) * np.linspace(0.2, 2.0, M)[:, None, None]
    return Y, table


def timed_fit(kind, M, device, steps, n=200):
    Y, table = design(kind, n, M)
    enc = FeatureSpace().fit_transform(table)
    opts = MLEMOptions(max_steps=steps, patience=10 * steps, device=device)
    t0 = clock(device)
    res = fit_stack(enc, NeuralTargets.from_data(Y, "euclidean", device), opts, random_state=0)
    t = clock(device) - t0
    assert (res.n_iter == steps).all()
    return t, res.batch_size


def per_step(kind, M, device):
    """(ms per step, ms fixed per call, batch size) from fits of 10 and 40 steps."""
    t10, b = timed_fit(kind, M, device, 10)
    t40, _ = timed_fit(kind, M, device, 40)
    step = (t40 - t10) / 30
    return 1e3 * step, 1e3 * max(t10 - 10 * step, 0.0), b


def kernels_per_step(kind, M):
    from torch.profiler import ProfilerActivity, profile

    counts = []
    for steps in (10, 40):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            timed_fit(kind, M, "cuda", steps)
        counts.append(sum(e.count for e in prof.key_averages()
                          if e.device_type.name == "CUDA"))
    return (counts[1] - counts[0]) / 30


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", nargs="+", default=["cpu", "cuda"])
    p.add_argument("--models", nargs="+", type=int, default=[16, 64, 256, 1024])
    p.add_argument("--numeric-max-models", type=int, default=256)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    for dev in args.devices:
        warm_up(dev)
        print(describe(dev))
    print("ms per training step of all M models (fixed ms per fit_stack call); n = 200")
    print(f"{'design':>12} {'models':>7} {'batch':>6} "
          + " ".join(f"{d:>18}" for d in args.devices))
    for kind in ("categorical", "numeric"):
        for M in args.models:
            if kind == "numeric" and M > args.numeric_max_models:
                continue
            res = [per_step(kind, M, dev) for dev in args.devices]
            print(f"{kind:>12} {M:>7} {res[0][2]:>6} "
                  + " ".join(f"{f'{t:.2f} ({f:.0f})':>18}" for t, f, _ in res))
    if args.profile and "cuda" in args.devices:
        for kind in ("categorical", "numeric"):
            M = args.models[0]
            print(f"CUDA kernels per step ({kind}, M = {M}): "
                  f"{kernels_per_step(kind, M):.0f}")


if __name__ == "__main__":
    main()
