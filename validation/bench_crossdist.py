"""Cross-validated distances between items: bias, and held-out ρ against item means.

Part 1 (bias): items with known patterns (5 items x 8 units, two of them identical), 8
trials each, correlated Gaussian noise; 3,000 models with independent noise serve as
replicates.  Prints, per pair, the mean estimate of the plain squared Euclidean distance
between item means, of the cross-validated squared Euclidean distance, and of crossnobis
(true covariance; Ledoit-Wolf covariance from the residuals) next to the truth.

Part 2 (held-out ρ): :func:`mlem_neuro.simulation.simulate_item_trials`, 2 conditions x 20
items x 8 trials, 16 units, one time point; optionally each item keeps only 2 to 8 of its
trials (``unequal``: the noise bias of the plain distance then differs between pairs).
``run_cv`` (4 folds, ``n_permutations=1``, package defaults otherwise, no channel
scaling) on three RDM sources over the same items: Euclidean distances between item means
(what ``items=`` does), cross-validated squared Euclidean distances, and crossnobis with
Ledoit-Wolf shrinkage (:mod:`mlem_neuro.core.rdms.crossdist`; default partitions).  Prints the
mean and standard deviation of the held-out ρ over ``--seeds`` datasets.

Run: ``OMP_NUM_THREADS=1 python validation/bench_crossdist.py [--seeds 10]``
"""
import argparse
import warnings

import numpy as np
import torch

from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.crossdist import crossval_sq_distances
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.crossval import run_cv
from mlem_neuro.items import Items
from mlem_neuro.simulation import simulate_item_trials


class PairTable:
    """An RDM source from distances of every pair of items (``(M, n_pairs)``)."""

    def __init__(self, d2, n):
        self.d2, self.n = d2, n

    @property
    def n_models(self):
        return self.d2.shape[0]

    @property
    def n_stimuli(self):
        return self.n

    def subset(self, models):
        return PairTable(self.d2[models], self.n)

    def rdm(self, stimuli, device="cpu"):
        stimuli = np.asarray(stimuli)
        i, j = pair_indices(len(stimuli))
        a = np.minimum(stimuli[i], stimuli[j])
        b = np.maximum(stimuli[i], stimuli[j])
        lin = a * self.n - a * (a + 1) // 2 + (b - a - 1)
        return torch.as_tensor(self.d2[:, lin], device=device)


def bias():
    rng = np.random.default_rng(2)
    U = 8
    A = rng.standard_normal((U, U))
    cov = A @ A.T / U + 0.2 * np.eye(U)
    mu = rng.standard_normal((5, U))
    mu[3] = mu[4]
    items = rng.permutation(np.repeat(np.arange(5), 8))
    noise = rng.standard_normal((3000, len(items), U)) @ np.linalg.cholesky(cov).T
    Y = mu[items][None] + noise
    labels = list(dict.fromkeys(items))
    i, j = pair_indices(5)
    delta = mu[labels][i] - mu[labels][j]
    means = np.stack([Y[:, items == k].mean(1) for k in labels], axis=1)
    rows = {
        "true sq. Euclidean / units": (delta ** 2).mean(1),
        "plain sq. Euclidean of means": ((means[:, i] - means[:, j]) ** 2).mean(-1).mean(0),
        "cross-validated sq. Euclidean": crossval_sq_distances(Y, items,
                                                               random_state=0).mean(0),
        "true Mahalanobis / units": np.einsum("pu,uv,pv->p", delta, np.linalg.inv(cov),
                                              delta) / U,
        "crossnobis, true covariance": crossval_sq_distances(Y, items, noise=cov,
                                                             random_state=0).mean(0),
        "crossnobis, Ledoit-Wolf": crossval_sq_distances(Y, items, noise="ledoit-wolf",
                                                         random_state=0).mean(0),
    }
    same = int(np.flatnonzero((delta ** 2).sum(1) == 0)[0])
    print("Bias (mean over 3,000 replicates), pair of identical items, then the range "
          "over the 9 other pairs:")
    for name, v in rows.items():
        other = np.delete(v, same)
        print(f"  {name:<32} identical {v[same]:+.3f}   others {other.min():.3f} to "
              f"{other.max():.3f}")


def held_out(seed, amplitude, unequal):
    data, table = simulate_item_trials(n_items=40, n_trials=8, n_units=16,
                                       amplitude=amplitude, random_state=seed)
    if unequal:
        rng = np.random.default_rng(seed)
        keep = np.ones(len(table), bool)
        for it in table["item"].unique():
            rows = np.flatnonzero(table["item"] == it)
            keep[rows[rng.integers(2, 9):]] = False
        data, table = data[keep], table[keep].reset_index(drop=True)
    items = Items(table["item"].to_numpy())
    features = items.reduce_table(table[["condition"]])
    opts = MLEMOptions(cv=4, n_permutations=1, random_state=seed)
    Y = data.transpose(2, 0, 1)
    sources = {"Euclidean, item means": DenseRDMSource(items.average(data).transpose(2, 0, 1))}
    for name, noise in (("cross-validated Euclidean", None), ("crossnobis", "ledoit-wolf")):
        d2 = crossval_sq_distances(Y, items.inverse_, noise=noise, random_state=seed)
        sources[name] = PairTable(d2, items.n_items)
    return {k: float(run_cv(s, features, opts).score.mean()) for k, s in sources.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", UserWarning)
    bias()
    for amplitude, unequal in ((0.5, False), (0.5, True), (0.3, True)):
        runs = [held_out(s, amplitude, unequal) for s in range(args.seeds)]
        print(f"held-out rho, amplitude {amplitude}, "
              f"{'2-8 (unequal)' if unequal else '8'} trials per item, {args.seeds} datasets:")
        for name in runs[0]:
            v = np.array([r[name] for r in runs])
            print(f"  {name:<26} {v.mean():.3f} +- {v.std(ddof=1):.3f}")


if __name__ == "__main__":
    main()
