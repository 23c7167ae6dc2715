"""Steps and training optimum of grouped full-batch fits, by step size and patience.

The fits are those of the single-subject tests on ``bench_null.py``'s design (200 trials x
64 channels, three binary features, level="feature", cv=5, ``n_null=4``): every grouped
full-batch fit the tests make (the null models of the score and feature tests, and the
interaction test's fits with and without interactions) is recorded, then fitted again
with each ``lr / patience`` setting (``tol`` 1e-4, at most 1,000 steps).  For each setting
the script prints the median and mean steps, and the gap of each fit's best training soft
Spearman to the best that any setting reached for that fit (0: the best optimum found;
mean, 95th percentile, max and the share of fits more than 0.01 below it), then what the
fits more than 0.01 below it with the first setting look like (their training score,
and the smallest diagonal weight of their ``W``, with that setting and with 0.1 / 50).

    OMP_NUM_THREADS=1 python benchmarks/grouped_steps.py [--n-times 100] \
        [--settings 0.1/50 0.1/20 0.1/5]

``--settings`` runs those only (the gap is then to the best of them; the first one's
low fits are described at the end, beside ``0.1 / 50`` when given, else the last).
"""
import argparse
import dataclasses
import time

import numpy as np
import torch

import mlem_neuro
from mlem_neuro.core.scoring import fastnull
from mlem_neuro.core.training import engine
from mlem_neuro.simulation import simulate_epochs

SETTINGS = [(0.03, 50), (0.03, 20), (0.1, 50), (0.1, 30), (0.1, 20), (0.1, 10), (0.1, 5),
            (0.3, 20), (0.3, 10)]


def record(n_times):
    """Every grouped fit the tests make, as (distance rows, counts, sums, options)."""
    data, table, times = simulate_epochs(n_trials=200, n_channels=64, n_times=n_times,
                                         sfreq=100.0, tmin=-0.2, random_state=0)
    calls = []
    real = fastnull.fit_grouped

    def keep(D_uniq, counts, target_sums, options=None, **kw):
        calls.append((D_uniq.clone(), counts.clone(), target_sums.clone(), options))
        return real(D_uniq, counts, target_sums, options, **kw)

    fastnull.fit_grouped = keep
    try:
        mlem_neuro.mlem_array(data, table, times=times, level="feature", cv=5, n_null=4,
                              random_state=0, verbose="WARNING")
    finally:
        fastnull.fit_grouped = real
    return calls


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-times", type=int, default=100,
                        help="time points of the simulated epochs (default 100)")
    parser.add_argument("--settings", nargs="+", default=None, metavar="LR/PATIENCE",
                        help="the settings to compare (default: all of SETTINGS)")
    args = parser.parse_args()
    settings = SETTINGS if args.settings is None else [
        (float(s.split("/")[0]), int(s.split("/")[1])) for s in args.settings]
    torch.set_num_threads(1)
    calls = record(args.n_times)
    n_fits = sum(c[1].shape[0] for c in calls)
    print(f"{n_fits} grouped fits ({len(calls)} calls) from the tests of {args.n_times} time "
          f"points, n_null=4; tol 1e-4, at most 1,000 steps")
    best, steps, took, small = {}, {}, {}, {}
    for lr, patience in settings:
        scores, iters, diag = [], [], []
        t0 = time.process_time()
        for D, counts, sums, options in calls:
            opts = dataclasses.replace(options, lr=lr, patience=patience, tol=1e-4,
                                       max_steps=1000)
            fit = engine.fit_grouped(D, counts, sums, opts)
            scores.append(fit.best_score)
            iters.append(fit.n_iter)
            # the smallest diagonal weight of each fitted W (Frobenius norm 1)
            diag.append(np.diagonal(fit.W, axis1=1, axis2=2).min(axis=1))
        took[lr, patience] = time.process_time() - t0
        best[lr, patience] = np.concatenate(scores)
        steps[lr, patience] = np.concatenate(iters)
        small[lr, patience] = np.concatenate(diag)
    top = np.max(np.stack(list(best.values())), axis=0)
    print(f"{'lr / patience':>14}  {'steps median / mean':>19}  {'gap mean':>9}  {'p95':>7}  "
          f"{'max':>7}  {'> 0.01':>7}  CPU")
    for (lr, patience), b in best.items():
        gap = top - b
        s = steps[lr, patience]
        print(f"{lr:>8g} / {patience:<3d}  {np.median(s):>9.0f} / {s.mean():<7.0f}  "
              f"{gap.mean():9.4f}  {np.percentile(gap, 95):7.4f}  {gap.max():7.4f}  "
              f"{np.mean(gap > 0.01):7.3f}  {took[lr, patience]:.2f} s")
    ref = settings[0]
    big = (0.1, 50) if (0.1, 50) in settings else settings[-1]
    low = top - best[ref] > 0.01
    if low.any():
        print(f"the {low.sum()} fits more than 0.01 below with {ref[0]:g} / {ref[1]}: mean "
              f"training score {best[ref][low].mean():.3f} ({best[big][low].mean():.3f} with "
              f"{big[0]:g} / {big[1]}; the other fits {best[ref][~low].mean():.3f}); median "
              f"smallest diagonal weight of W {np.median(small[ref][low]):.3f} "
              f"({np.median(small[big][low]):.3f} with {big[0]:g} / {big[1]})")


if __name__ == "__main__":
    main()
