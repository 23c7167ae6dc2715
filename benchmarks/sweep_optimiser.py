"""Optimiser settings swept on realisable simulations: W error, steps and time per fit.

Each fit is ``MLEM(distance="precomputed")`` on exact distances ``sqrt(dᵀ W_true d)`` (no
noise) of n = 128 stimuli and m = 8 features, with interactions, fitted on all stimuli;
the error is ``||W_ - W_true||_F`` (both of Frobenius norm 1).  Three cases:

* ``numeric``: :func:`mlem_neuro.simulation.simulate_representations` with
  ``kind="realisable", feature_type="numeric"`` (uniform features, a well-conditioned SPD
  ``W_true``, eigenvalues uniform in [1, 4]): ``W`` is identifiable, the error measures the
  optimiser.
* ``numeric-paperW``: the same features with the paper's ``W_true`` (scikit-learn's
  ``make_spd_matrix``, nearly rank one after normalisation): ill-conditioned, harder.
* ``binary``: ``feature_type="binary"``: ``W`` is identifiable only up to changes that keep
  the order of the 256 distinct distances, so the error has a floor whatever the optimiser;
  ``binary-paperW``: the same with the paper's ``W_true``.

A setting is ``lr / patience / tol``.  Times are CPU seconds per fit on one thread
(``time.process_time``), so other work on the machine inflates them less than wall-clock
times.  (A reduce-on-plateau schedule was also measured, with the engine of commit 3f0585c;
it did not help, see ``doc/options.rst``, and is not part of the engine.)

Run: ``.venv/bin/python benchmarks/sweep_optimiser.py [--seeds 6] [--cases numeric binary]``
"""
import argparse
import time

import numpy as np
import pandas as pd
import torch
from sklearn.datasets import make_spd_matrix

from mlem_neuro import MLEM
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.simulation import simulate_representations

#: (lr, patience, tol)
SETTINGS = [
    (0.1, 50, 1e-4),
    (0.1, 100, 1e-4),
    (0.1, 50, 0.0),
    (0.05, 75, 1e-4),
    (0.03, 50, 1e-4),
    (0.03, 100, 1e-4),
    (0.03, 100, 0.0),
    (0.01, 100, 1e-4),
    (0.01, 300, 0.0),
    (0.03, 20, 1e-4),
    (0.03, 10, 1e-4),
    (0.1, 20, 1e-4),
    (0.2, 20, 1e-4),
    (0.1, 30, 1e-4),
]


def label(setting):
    lr, patience, tol = setting
    return f"{lr:g} / {patience} / {tol:g}"


def make_case(case, n, m, seed):
    feature_type = case.split("-")[0]
    X, y, W = simulate_representations(n, m, noise=0.0, kind="realisable",
                                       feature_type=feature_type, random_state=seed)
    if not case.endswith("paperW"):
        return X, y, W
    W = make_spd_matrix(m, random_state=seed)
    W /= np.linalg.norm(W)
    i, j = pair_indices(n)
    F = y.to_numpy() if feature_type == "numeric" else (y.to_numpy() == "B").astype(float)
    D = np.abs(F[i] - F[j])
    X = np.zeros((n, n))
    X[i, j] = X[j, i] = np.sqrt(np.einsum("pa,ab,pb->p", D, W, D))
    return X, y, W


def fit(X, y, setting):
    lr, patience, tol = setting
    t0 = time.process_time()
    est = MLEM(distance="precomputed", lr=lr, patience=patience, tol=tol,
               random_state=0).fit(X, y)
    return est, time.process_time() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--stimuli", type=int, default=128)
    p.add_argument("--features", type=int, default=8)
    p.add_argument("--cases", nargs="+",
                   default=["numeric", "numeric-paperW", "binary", "binary-paperW"])
    p.add_argument("--settings", type=int, nargs="+", default=None,
                   help="indices into SETTINGS (default: all)")
    args = p.parse_args()
    torch.set_num_threads(1)
    chosen = SETTINGS if args.settings is None else [SETTINGS[i] for i in args.settings]
    print(f"n = {args.stimuli}, m = {args.features} (+ interactions), no noise, "
          f"seeds 0-{args.seeds - 1}, max_steps 1000; lr / patience / tol")
    rows = []
    for case in args.cases:
        data = [make_case(case, args.stimuli, args.features, s) for s in range(args.seeds)]
        for setting in chosen:
            for seed, (X, y, W) in enumerate(data):
                est, sec = fit(X, y, setting)
                rows.append(dict(case=case, setting=label(setting), seed=seed,
                                 error=np.linalg.norm(est.W_ - W), steps=est.n_iter_,
                                 seconds=sec))
            sub = pd.DataFrame(rows).query("case == @case and setting == @label(@setting)")
            print(f"{case:>15} {label(setting):>24}: W error {sub.error.mean():.3f} ± "
                  f"{sub.error.std():.3f} (max {sub.error.max():.3f}), steps "
                  f"{sub.steps.median():.0f} (median), {sub.seconds.mean():.2f} s/fit",
                  flush=True)
    table = pd.DataFrame(rows).groupby(["case", "setting"], sort=False).agg(
        error_mean=("error", "mean"), error_sd=("error", "std"), error_max=("error", "max"),
        steps_median=("steps", "median"), seconds=("seconds", "mean"))
    print(table.round(3).to_string())


if __name__ == "__main__":
    main()
