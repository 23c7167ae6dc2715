"""Cost of the single-subject permutation tests against ``n_null=0``.

A time-resolved analysis of 200 trials x 64 channels x 100 time points
(:func:`mlem_neuro.simulation.simulate_epochs`, three binary features A, B, C with A and B
encoded in windows; with ``--numeric`` C takes uniform numeric values), level="feature"
(``--level``), cv=5, the default training options: ``n_null=0``,
then each ``--n-null`` value.  The null models are trained like the observed ones, so the
training grows linearly with the ``1 + n_null * n_tests`` models per time point (1,001 at
n_null=200 with the interaction test's two fits; with categorical features they share
the observed ranks, ``core/scoring/fastnull.py``; measured results: ``doc/performance.rst``).
All runs are in this process, one after the other (serially), with
the same seed; the script prints the wall and CPU (process) times (with one torch thread
the CPU time does not depend on what else the machine runs; ``n_null=0``: the median of
three runs, since it takes under a second), their ratios to n_null=0,
and with ``--profile`` where the time goes.  With ``--n-jobs`` the CPU time is the main
process's alone: read the wall time.

    OMP_NUM_THREADS=1 python benchmarks/bench_null.py [--n-times 100] [--n-null 5 10]
        [--batch-size full] [--n-jobs 2]
"""
import argparse
import cProfile
import io
import pstats
import time

import numpy as np
import torch
from _common import add_device_argument, add_optimiser_arguments, clock, describe, warm_up

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-trials", type=int, default=200)
    parser.add_argument("--n-channels", type=int, default=64)
    parser.add_argument("--n-times", type=int, default=100)
    parser.add_argument("--n-null", type=int, nargs="+", default=[5],
                        help="n_null of the runs with tests (their cost grows linearly)")
    parser.add_argument("--batch-size", default="auto",
                        help="'auto' (default), 'full' (every pair each step: cheaper "
                             "null models with categorical features) or an int")
    parser.add_argument("--numeric", action="store_true",
                        help="feature C numeric (uniform values; A and B stay binary): the "
                             "grid's null models, which relabel the data")
    parser.add_argument("--level", default="feature", choices=["feature", "term"])
    parser.add_argument("--cv", type=int, default=5)
    parser.add_argument("--n-repeats", default="1",
                        help="n_repeats of every run (an int or 'auto')")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-jobs", type=int, default=None,
                        help="n_jobs of every run (worker processes; wall time then drops "
                             "below the CPU time)")
    parser.add_argument("--profile", action="store_true")
    add_device_argument(parser)
    add_optimiser_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warm_up(args.device)
    data, table, times = simulate_epochs(n_trials=args.n_trials, n_channels=args.n_channels,
                                         n_times=args.n_times, sfreq=100.0, tmin=-0.2,
                                         random_state=0)
    if args.numeric:
        table = table.assign(C=np.random.default_rng(0).uniform(size=len(table)))
    batch_size = int(args.batch_size) if args.batch_size.isdigit() else args.batch_size
    n_repeats = int(args.n_repeats) if args.n_repeats.isdigit() else args.n_repeats
    kw = dict(times=times, level=args.level, cv=args.cv, n_repeats=n_repeats,
              batch_size=batch_size, device=args.device,
              n_jobs=args.n_jobs, lr=args.lr, patience=args.patience, tol=args.tol,
              random_state=0)
    print(describe(args.device))
    print(f"{args.n_trials} trials x {args.n_channels} channels x {args.n_times} time points, "
          f"features {list(table.columns)} ({'C numeric' if args.numeric else 'binary'}), "
          f"level={args.level!r}, cv={args.cv}, n_repeats={n_repeats!r}, "
          f"batch_size={batch_size!r}, n_jobs={args.n_jobs}, lr={args.lr}, "
          f"patience={args.patience}, tol={args.tol:g}")
    runs = []
    for _ in range(3):      # the analysis takes under a second: the median of three runs
        t0, c0 = clock(args.device), time.process_time()
        ref = mlem_neuro.mlem_array(data, table, **kw)
        runs.append((clock(args.device) - t0, time.process_time() - c0))
    t_ref, c_ref = (float(np.median(x)) for x in zip(*runs))
    print(f"n_null=0: {t_ref:.2f} s wall, {c_ref:.2f} s CPU (median of 3 runs: "
          f"{', '.join(f'{t:.2f}' for t, _ in runs)} s wall; steps per model "
          f"{ref.n_iter.mean():.0f})")
    for n_null in args.n_null:
        prof = cProfile.Profile() if args.profile else None
        t0, c0 = clock(args.device), time.process_time()
        if prof:
            prof.enable()
        res = mlem_neuro.mlem_array(data, table, n_null=n_null, **kw)
        if prof:
            prof.disable()
        t_null, c_null = clock(args.device) - t0, time.process_time() - c0
        rows = 1 + len(res.tests) * n_null
        print(f"n_null={n_null}: {t_null:.1f} s wall, {c_null:.1f} s CPU; ratio "
              f"{t_null / t_ref:.1f}x wall, {c_null / c_ref:.1f}x CPU ({len(res.tests)} tests, "
              f"{rows} trained models per time point and fold)")
        print("  FWE-significant time points:", {t: int(res.significant(t).sum())
                                                  for t in res.tests})
        if prof:
            out = io.StringIO()
            stats = pstats.Stats(prof, stream=out)
            stats.sort_stats("tottime").print_stats(12)
            stats.sort_stats("cumulative").print_stats(r"mlem_neuro.*\((train|rank_sums|"
                                                       r"null_statistics|interaction_"
                                                       r"scores|rdm|fit_stack)\)")
            print(out.getvalue())


if __name__ == "__main__":
    main()
