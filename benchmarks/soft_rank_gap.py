"""How far the training objective's soft ranks are from the exact ranks.

Training maximises a *soft* Spearman: predictions are rescaled to the spread of the ranks
1..b and passed to ``torchsort.soft_rank`` (:func:`mlem_neuro.core.ranks.spearman.soft_rank`).
This script measures, on batches like the ones training sees, the mean and the 99th
percentile of |soft rank - exact (average) rank| in rank units, and the gap between the
soft and the exact Spearman against a noisy target.

Batches: b pairs of random stimuli, predictions ``dᵀ W d`` of a random SPD ``W`` (Frobenius
norm 1) over m features that are binary (heavy ties: at most 2^m distinct values), 4-level
ordinal, or continuous; the target is the prediction plus Gaussian noise (SNR 1).

    python benchmarks/soft_rank_gap.py [--seeds 5]
"""
from __future__ import annotations

import argparse

import numpy as np
import torch

from mlem_neuro.core.ranks.spearman import (
    rankdata,
    soft_rank,
    soft_spearman,
    spearman,
    standardize,
)


def batch(kind, b, m, rng):
    n = int(np.ceil(np.sqrt(2 * b))) + 2
    if kind == "binary":
        F = rng.integers(0, 2, (n, m)).astype(float)
    elif kind == "4-level":
        F = rng.integers(0, 4, (n, m)) / 3.0
    else:
        F = rng.uniform(0, 1, (n, m))
    i, j = np.triu_indices(n, 1)
    pick = rng.choice(len(i), b, replace=False)
    D = np.abs(F[i[pick]] - F[j[pick]])
    A = rng.normal(size=(m, m))
    W = A @ A.T + m * np.eye(m) * 0.1
    W /= np.linalg.norm(W)
    q = np.einsum("pa,ab,pb->p", D, W, D)
    target = q + q.std() * rng.normal(size=b)
    return torch.as_tensor(q), torch.as_tensor(target)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'features':>10} {'b':>6} {'m':>3} | {'mean |Δrank|':>12} {'p99 |Δrank|':>11} "
          f"{'max':>8} | {'mean |Δρ|':>9}")
    for kind in ("binary", "4-level", "continuous"):
        for b in (512, 4096, 20000):
            for m in (4, 8):
                mean_gap, p99, mx, drho = [], [], [], []
                for seed in range(args.seeds):
                    rng = np.random.default_rng(seed)
                    q, t = batch(kind, b, m, rng)
                    hard = rankdata(q)
                    gap = (soft_rank(q[None])[0] - hard).abs().numpy()
                    mean_gap.append(gap.mean())
                    p99.append(np.quantile(gap, 0.99))
                    mx.append(gap.max())
                    tz = standardize(rankdata(t))
                    drho.append(abs(float(soft_spearman(q[None], tz[None])[0])
                                    - float(spearman(q, t))))
                print(f"{kind:>10} {b:>6} {m:>3} | {np.mean(mean_gap):>12.3f} "
                      f"{np.mean(p99):>11.2f} {np.max(mx):>8.1f} | {np.mean(drho):>9.5f}")


if __name__ == "__main__":
    main()
