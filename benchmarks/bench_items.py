"""Items and trials: held-out Spearman ρ per trial vs on items (``items=``).

Simulated design (:func:`mlem_neuro.simulation.simulate_item_trials`): 2 conditions x 20
items each, 8 trials per item (320 trials), 16 units, one time point; the condition
pattern has amplitude ``--amplitudes`` (unit RMS over units), trial noise std 1, items of a
condition differ only by trial noise (``item_sd=0``) unless ``--item-sd`` is given.  The
only feature is the condition (binary), so the held-out ρ of any analysis is capped at
``sqrt(3) / 2 = 0.866`` (a binary predictor against a continuous ranking with balanced
pairs).  Three analyses of each simulated dataset with ``mlem_array`` (4 folds,
``n_permutations=1``, other options the package defaults, ``random_state`` = the seed):

* ``per trial``: every trial is a stimulus, folds split trials freely;
* ``per trial, groups=item``: folds keep each item's trials together;
* ``items=``: the trials of each item are averaged, 40 stimuli.

Prints the mean, standard deviation and range of the held-out ρ over ``--seeds`` datasets.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_items.py [--seeds 20]``
"""
import argparse
import time

import numpy as np
import torch

import mlem_neuro
from mlem_neuro.simulation import simulate_item_trials


def run(amplitude, seeds, item_sd):
    scores = {"per trial": [], "per trial, groups=item": [], "items=": []}
    for seed in range(seeds):
        data, table = simulate_item_trials(n_items=40, n_trials=8, n_units=16,
                                           amplitude=amplitude, item_sd=item_sd,
                                           random_state=seed)
        kw = dict(cv=4, n_permutations=1, random_state=seed, verbose="WARNING")
        cond = table[["condition"]]
        runs = {"per trial": dict(),
                "per trial, groups=item": dict(groups=table["item"].to_numpy())}
        for name, extra in runs.items():
            scores[name].append(float(mlem_neuro.mlem_array(data, cond, **kw, **extra)
                                      .score[0]))
        scores["items="].append(float(mlem_neuro.mlem_array(data, table, items="item", **kw)
                                      .score[0]))
    return {k: np.array(v) for k, v in scores.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--amplitudes", type=float, nargs="+", default=[0.3, 0.5])
    parser.add_argument("--item-sd", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"cap of held-out rho with one balanced binary feature: {np.sqrt(3) / 2:.3f}")
    for amp in args.amplitudes:
        t0 = time.perf_counter()
        scores = run(amp, args.seeds, args.item_sd)
        print(f"amplitude {amp:g}, item_sd {args.item_sd:g}, {args.seeds} datasets "
              f"({time.perf_counter() - t0:.0f} s):")
        for name, s in scores.items():
            print(f"  {name:<24} held-out rho {s.mean():.3f} +- {s.std(ddof=1):.3f} "
                  f"(range {s.min():.3f} to {s.max():.3f})")


if __name__ == "__main__":
    main()
