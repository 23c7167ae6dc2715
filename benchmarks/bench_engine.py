"""Batched engine vs sequential estimator fits, measured side by side in one run.

M = 64 models (e.g. 64 time points) on the same stimuli: n = 200 stimuli, 64 units per
model, m = 6 binary features with interactions.  Both paths run the same training
(batch_size, steps, patience, learning rate); the sequential path is what a user gets from
a loop of ``MLEM().fit`` (as ``mne.decoding.SlidingEstimator`` does).

``--device cuda`` trains on the GPU (clocks read after ``torch.cuda.synchronize()``, after an
untimed warm-up fit); ``--seq-models K`` times the sequential path on the first K models only
and extrapolates it to all M (the output says so).

Run: ``.venv/bin/python benchmarks/bench_engine.py [--models 64] [--device cpu]``
"""
import argparse

import numpy as np
from _common import add_device_argument, add_optimiser_arguments, clock, describe, warm_up

from mlem_neuro import MLEM
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.neural import NeuralTargets
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.training.engine import fit_stack
from mlem_neuro.simulation import simulate_representations


def make_stack(M, n, units, m, seed=0):
    rng = np.random.default_rng(seed)
    X, y, W = simulate_representations(n, m, units, noise=0.0, random_state=seed)
    Y = np.empty((M, n, units))
    for t in range(M):  # each "time point": same geometry, its own noise level
        Y[t] = X + (0.2 + 2.0 * t / M) * X.std(0) * rng.standard_normal(X.shape)
    return Y, y, W


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=64)
    p.add_argument("--stimuli", type=int, default=200)
    p.add_argument("--units", type=int, default=64)
    p.add_argument("--features", type=int, default=6)
    p.add_argument("--batch-size", default="auto")
    p.add_argument("--seq-models", type=int, default=None,
                   help="models timed on the sequential path (default: all; extrapolated)")
    add_optimiser_arguments(p)
    add_device_argument(p)
    args = p.parse_args()
    dev = args.device
    bs = args.batch_size if args.batch_size in ("auto", "full") else int(args.batch_size)
    Y, y, W = make_stack(args.models, args.stimuli, args.units, args.features)
    kw = dict(constraint="spd", interactions=True, max_steps=1000, patience=args.patience,
              lr=args.lr, tol=args.tol, batch_size=bs)
    warm_up(dev)
    print(f"{describe(dev)}; M={args.models}, "
          f"n={args.stimuli}, units={args.units}, m={args.features} (+interactions), "
          f"batch_size={bs}")

    t0 = clock(dev)
    enc = FeatureSpace().fit_transform(y)
    res = fit_stack(enc, NeuralTargets.from_data(Y, "euclidean", dev),
                    MLEMOptions(device=dev, **kw), random_state=0)
    t_engine = clock(dev) - t0

    K = min(args.seq_models or args.models, args.models)
    t0 = clock(dev)
    Ws, iters = [], []
    for t in range(K):
        est = MLEM(random_state=0, device=dev, **kw).fit(Y[t], y)
        Ws.append(est.W_)
        iters.append(est.n_iter_)
    t_seq_sub = clock(dev) - t0
    t_seq = t_seq_sub * args.models / K

    diff = np.abs(res.W[:K] - np.array(Ws)).max()
    print(f"engine, one call : {t_engine:8.2f} s  (steps per model: median "
          f"{int(np.median(res.n_iter))}, batch {res.batch_size} pairs"
          f"{', full batch' if res.full_batch else ''})")
    label = "measured" if K == args.models else (f"EXTRAPOLATED from {K} of {args.models} "
                                                 f"models, {t_seq_sub:.2f} s measured")
    print(f"sequential fits  : {t_seq:8.2f} s  ({label}; steps per model: median "
          f"{int(np.median(iters))})")
    print(f"speed-up         : {t_seq / t_engine:8.1f} x")
    print(f"max |W_engine - W_sequential| = {diff:.3g}  (batches are drawn per call, so "
          "mini-batch runs differ slightly)")
    fro = np.linalg.norm(res.W - W[None], axis=(1, 2))
    print(f"Frobenius error to W_true, engine: low-noise models {fro[:8].mean():.3f}, "
          f"high-noise models {fro[-8:].mean():.3f}")


if __name__ == "__main__":
    main()
