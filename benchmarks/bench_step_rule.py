"""The step rule (``lr``, ``patience``): training steps, time and answers, before and after.

``lr="auto", patience="auto"`` (the defaults since 2026-11-29) train fits on the full batch
of exact feature-distance rows (categorical designs) with ``lr=0.1`` and patience 10 (20 until
2026-11-30, when the options page's table of this script was measured) and every
other fit with ``lr=0.03, patience=50`` (the former defaults of every fit).  This script
runs each design with both, one after the other in this process, on the same arrays and
seeds, and prints per design:

* the training steps (summed over every fit the analysis makes, and per fit), counted by
  wrapping the engine's training loop;
* the wall time, and its ratio to a RSA with the same number of permutations
  (:func:`mlem_neuro.rsa.rsa_array`, a max statistic over time points);
* the answers: the largest difference and the correlation of the importance curves and
  scores between the two rules, beside the same between two seeds of the former rule
  (the noise they are read against), and the models with ``p_fwe < 0.05`` per test under
  each rule.

Designs: ``reference`` (:func:`~mlem_neuro.simulation.simulate_epochs`, 200 trials x 64
channels x 100 times, three binary features; the design of ``bench_defaults_cost.py``),
``small`` (40 trials x 8 channels x 10 times of smooth noise, two binary features, A
encoded in time points 3-6: ``validation/calib_defaults.py``'s power design at amplitude
1.0), ``numeric`` (the reference design with a fourth, numeric feature: its fits train on
the grid, so the rule is unchanged by construction and the steps must be equal).

    OMP_NUM_THREADS=1 python benchmarks/bench_step_rule.py [--designs small reference]
        [--n-null 99] [--n-jobs 1]
"""
import argparse
import time
import warnings

import numpy as np
import pandas as pd
import torch

import mlem_neuro
from mlem_neuro import rsa
from mlem_neuro.core.training import engine
from mlem_neuro.simulation import simulate_epochs

RULES = {"former (0.03 / 50)": dict(lr=0.03, patience=50),
         "auto (default)": dict(lr="auto", patience="auto")}


class StepCounter:
    """Counts the steps and fits of every training call (the engine's one loop entry)."""

    def __init__(self):
        self.steps = self.fits = 0
        self.real = engine._train

    def __enter__(self):
        def counting(*args, **kwargs):
            fit = self.real(*args, **kwargs)
            self.steps += int(np.sum(fit.n_iter))
            self.fits += len(fit.n_iter)
            return fit
        engine._train = counting
        return self

    def __exit__(self, *exc):
        engine._train = self.real


def make(design, seed=0):
    if design in ("reference", "numeric"):
        data, table, times = simulate_epochs(n_trials=200, n_channels=64, n_times=100,
                                             sfreq=100.0, tmin=-0.2, random_state=seed)
        if design == "numeric":
            table = table.copy()
            table["N"] = np.random.default_rng(seed).uniform(size=len(table))
        return data, table, times
    rng = np.random.default_rng([7, seed])
    n, c, T = 40, 8, 10
    data = rng.standard_normal((n, c, T))
    kernel = np.hanning(5)
    data = np.apply_along_axis(lambda x: np.convolve(x, kernel, "same"), 2, data)
    data /= data.std()
    table = pd.DataFrame({"A": np.repeat([0, 1], n // 2), "B": np.tile([0, 1], n // 2)})
    table = table.sample(frac=1, random_state=seed).reset_index(drop=True)
    pattern = rng.standard_normal((2, c))
    pattern /= np.sqrt((pattern ** 2).mean())
    envelope = np.hanning(6)[1:-1]
    data[:, :, 3:7] += 1.0 * pattern[table["A"].to_numpy()][:, :, None] * envelope
    return data, table, np.arange(T) / 100.0


def run(data, table, times, rule, seed, n_null, n_jobs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with StepCounter() as count:
            t0 = time.perf_counter()
            res = mlem_neuro.mlem_array(data, table, times=times, n_null=n_null,
                                        random_state=seed, n_jobs=n_jobs,
                                        verbose="WARNING", **RULES[rule])
            wall = time.perf_counter() - t0
    return res, wall, count


def compare(a, b):
    ia, ib = np.asarray(a.importance), np.asarray(b.importance)
    r = np.corrcoef(ia.ravel(), ib.ravel())[0, 1]
    return float(np.abs(ia - ib).max()), float(r)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--designs", nargs="+", default=["small", "reference", "numeric"])
    p.add_argument("--n-null", type=int, default=99)
    p.add_argument("--n-jobs", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(1)
    for design in args.designs:
        data, table, times = make(design)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rsa.rsa_array(data, table, times=times, n_null=args.n_null,
                                 random_state=0, verbose="WARNING")
        t_rsa = time.perf_counter() - t0
        print(f"\n== {design}: {data.shape[0]} trials x {data.shape[1]} channels x "
              f"{data.shape[2]} times, features {list(table.columns)}, n_null="
              f"{args.n_null}, n_jobs={args.n_jobs}; RSA with {args.n_null} permutations "
              f"{t_rsa:.2f} s")
        out = {}
        for rule in RULES:
            res, wall, count = run(data, table, times, rule, 0, args.n_null, args.n_jobs)
            out[rule] = res
            sig = {t: int((res.pvalues_fwe[:, i] < 0.05).sum())
                   for i, t in enumerate(res.tests)}
            print(f"{rule:>20}: {wall:7.1f} s ({wall / t_rsa:6.0f}x RSA), {count.fits:,} fits, "
                  f"{count.steps:,} steps ({count.steps / max(count.fits, 1):.0f} per fit); "
                  f"models with p_fwe < 0.05: {sig}")
        former, auto = (out[r] for r in RULES)
        seed1, _, _ = run(data, table, times, "former (0.03 / 50)", 1, 0, args.n_jobs)
        d_rule, r_rule = compare(former, auto)
        d_seed, r_seed = compare(former, seed1)
        print(f"{'importance':>20}: rules differ by at most {d_rule:.4f} (r = {r_rule:.4f}); "
              f"two seeds of the former rule by {d_seed:.4f} (r = {r_seed:.4f})")


if __name__ == "__main__":
    main()
