"""Recovery of a known metric: MLEM vs FR-RSA-I vs FR-RSA, and the paper simulation's ceiling.

1. The ceiling of the paper's simulation (``kind="paper"``): without noise, Spearman between
   the distances of the embedded representations and the target ``sqrt(dᵀ W_true d)``, and
   the negative share of the eigen-mass of the double-centred squared target distances
   (what classical MDS must drop).
2. The recovery table: for each noise level and seed, one dataset split once (a fifth of the
   stimuli held out), the three models fitted on the training stimuli
   (:func:`mlem_neuro.demo.simulation_table`, what ``mlem-neuro demo`` runs): Frobenius
   error to ``W_true``, training steps, held-out Spearman, and the held-out Spearman of
   ``W_true`` itself.

Run: ``.venv/bin/python validation/recovery.py [--seeds 10] [--stimuli 128] [--features 8]
[--feature-type numeric] [--kind realisable] [--ceiling-only]``
"""
import argparse

import numpy as np
import torch
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.demo import simulation_table as _simulation_table
from mlem_neuro.simulation import simulate_representations


def paper_ceiling(n, m, n_units, seeds):
    """Spearman of the noiseless embedding with its target, and negative eigen-mass."""
    rho, neg = [], []
    for seed in seeds:
        X, y, W = simulate_representations(n, m, n_units, noise=0.0, random_state=seed)
        B = (y.to_numpy() == "B").astype(float)
        i, j = pair_indices(n)
        D = (B[i] != B[j]).astype(float)
        target = np.sqrt(np.einsum("pa,ab,pb->p", D, W, D))
        rho.append(spearmanr(target, pdist(X))[0])
        T = np.zeros((n, n))
        T[i, j] = T[j, i] = target
        J = np.eye(n) - 1.0 / n
        vals = np.linalg.eigvalsh(-0.5 * J @ (T ** 2) @ J)
        neg.append(-vals[vals < 0].sum() / np.abs(vals).sum())
    return np.array(rho), np.array(neg)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--stimuli", type=int, default=128)
    p.add_argument("--features", type=int, default=8)
    p.add_argument("--units", type=int, default=256, help="kind='paper' only")
    p.add_argument("--feature-type", default="numeric", choices=("numeric", "binary"))
    p.add_argument("--kind", default="realisable", choices=("realisable", "paper"))
    p.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.5, 1.0, 2.0])
    p.add_argument("--ceiling-only", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    seeds = range(args.seeds)
    for n, m, units in ((128, 8, 256), (256, 16, 768)):
        rho, neg = paper_ceiling(n, m, units, seeds)
        print(f"paper simulation, n = {n}, m = {m}, {units} units, no noise, "
              f"{args.seeds} seeds: Spearman(embedded, target) {rho.mean():.3f} ± "
              f"{rho.std(ddof=1):.3f} (range {rho.min():.3f}-{rho.max():.3f}); negative "
              f"eigen-mass {neg.mean():.1%} (range {neg.min():.1%}-{neg.max():.1%})")
    if args.ceiling_only:
        return
    print(f"\nrecovery: kind={args.kind}, {args.feature_type} features, n = {args.stimuli}, "
          f"m = {args.features}, {args.stimuli // 5} held out, {args.seeds} seeds per noise "
          "level, default options")
    table = _simulation_table(args.stimuli, args.features, args.noise, seeds, print,
                              kind=args.kind, feature_type=args.feature_type,
                              n_units=args.units)
    summary = table.groupby(["noise", "model"], sort=False).agg(
        error_mean=("frobenius_error", "mean"), error_sd=("frobenius_error", "std"),
        steps=("steps", "median"), rho_mean=("test_spearman", "mean"),
        rho_sd=("test_spearman", "std"))
    print(summary.round(3).to_string())


if __name__ == "__main__":
    main()
