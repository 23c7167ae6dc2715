"""Error of training on a grid of numeric distances (``numeric_levels``), where the truth is known.

:func:`mlem_neuro.simulation.simulate_representations` with ``kind="realisable"`` and
``feature_type="numeric"``: ``n`` stimuli with ``m`` numeric features, a known metric
``W_true`` (well conditioned, Frobenius norm 1), and neural distances
``sqrt(dᵀ W_true d)`` plus noise.  For each seed, the stimuli are split 80 / 20 and three
fits of :class:`mlem_neuro.MLEM` (``distance="precomputed"``, default options) are compared:

* exact: ``numeric_levels=None`` (per-pair training), ``random_state=seed``;
* grid: ``numeric_levels="auto"`` (the default), ``random_state=seed``;
* exact, other seed: ``numeric_levels=None``, ``random_state=seed + 1000`` -- how much two
  exact fits differ through their mini-batches alone (the reference for the grid's error).

Printed per ``m``: the recovery error ``||W - W_true||_F`` of each fit, the distance of
the grid fit and of the other-seed fit from the exact one, and held-out Spearman of each.

    OMP_NUM_THREADS=1 python validation/numeric_recovery.py [--n 200] [--m 2 3 4 5]
        [--seeds 5] [--noise 1.0]
"""
import argparse
import time
import warnings

import numpy as np
import torch

from mlem_neuro import MLEM
from mlem_neuro.simulation import simulate_representations


def fit(X, y, train, levels, seed):
    est = MLEM(distance="precomputed", numeric_levels=levels, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X[np.ix_(train, train)], y.iloc[train])
    return est


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--m", type=int, nargs="+", default=[2, 3, 4, 5])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--noise", type=float, default=1.0)
    args = p.parse_args()
    torch.set_num_threads(1)
    print(f"{args.n} stimuli (80/20 split), noise {args.noise}, {args.seeds} seeds per m, "
          "default options, one torch thread")
    for m in args.m:
        rows = []
        t = {"exact": 0.0, "grid": 0.0}
        for seed in range(args.seeds):
            X, y, W_true = simulate_representations(args.n, m, noise=args.noise,
                                                    kind="realisable",
                                                    feature_type="numeric",
                                                    random_state=seed)
            perm = np.random.default_rng(seed).permutation(args.n)
            train, test = perm[: int(0.8 * args.n)], perm[int(0.8 * args.n):]
            t0 = time.perf_counter()
            exact = fit(X, y, train, None, seed)
            t["exact"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            grid = fit(X, y, train, "auto", seed)
            t["grid"] += time.perf_counter() - t0
            other = fit(X, y, train, None, seed + 1000)
            Xt, yt = X[np.ix_(test, test)], y.iloc[test]
            rows.append([np.linalg.norm(e.W_ - W_true) for e in (exact, grid, other)]
                        + [np.linalg.norm(grid.W_ - exact.W_),
                           np.linalg.norm(other.W_ - exact.W_)]
                        + [e.score(Xt, yt) for e in (exact, grid, other)])
        r = np.array(rows)
        mean = r.mean(axis=0)
        print(f"m = {m}: ||W - W_true||_F exact {mean[0]:.4f}, grid {mean[1]:.4f}, exact "
              f"other seed {mean[2]:.4f} | ||W_grid - W_exact|| {mean[3]:.4f} (max "
              f"{r[:, 3].max():.4f}), ||W_other seed - W_exact|| {mean[4]:.4f} (max "
              f"{r[:, 4].max():.4f}) | held-out rho exact {mean[5]:.4f}, grid {mean[6]:.4f} "
              f"(max |diff| {np.abs(r[:, 6] - r[:, 5]).max():.4f}), other seed "
              f"{mean[7]:.4f} (max |diff| {np.abs(r[:, 7] - r[:, 5]).max():.4f}) | fit time "
              f"exact {t['exact']:.1f} s, grid {t['grid']:.1f} s")


if __name__ == "__main__":
    main()
