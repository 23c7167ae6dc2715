"""Family-wise error over tests: how often pure noise gives a significant result *somewhere*.

An analysis with ``n_null > 0`` runs several tests ("score", one per feature,
"interactions"), each corrected over its models (``pvalues_fwe``, maximum statistic over
time points).  On pure noise every null is true, so the rate of datasets with *any*
corrected p < alpha is the family-wise error over models and tests.  This script measures
it for ``pvalues_fwe`` (each test on its own: expect about the number of tests times
alpha) and for ``pvalues_fwe_tests`` (corrected over models and tests, by
:func:`mlem_neuro.stats.familywise_over_tests`: expect at most alpha).

Data: :func:`mlem_neuro.simulation.simulate_epochs` with ``--n-features`` balanced binary
features none of which is encoded (40 trials x 16 channels x 10 time points of Gaussian
noise by default); analysis: :func:`mlem_neuro.mlem_array` at its defaults (now ``cv=2,
n_repeats="auto"``; the recorded figures were measured at the former ``cv=5``, one repeat;
feature level, interactions modelled: with 2 features the tests are the score, A, B and
the interactions) with ``n_null`` relabellings, seeded apart from the data.  Prints
counts, rates and Wilson 95 % intervals.

The p-values are multiples of ``1 / (1 + n_null)``: with 99 nulls a p-value below 0.05
is at most 0.04, so each test's own rate is at most 0.04; corrected over ``k`` tests the
smallest p-value is ``k / (1 + n_null)``, so with 99 nulls and 4 tests only a corrected
p of 0.01 becomes significant (rate at most 0.04 again), and with 5 tests (3 features)
none can: use ``--n-null 199`` there.

Run (one core: 1.4 s of CPU per dataset for the first, 5.6 s for the second; the
method page quotes both, 1,000 and 300 datasets)::

    OMP_NUM_THREADS=1 python validation/calib_familywise.py --n-datasets 1000
    OMP_NUM_THREADS=1 python validation/calib_familywise.py --n-features 3 --n-null 199 \
        --n-datasets 300
"""
import argparse
import time
import warnings

import numpy as np
import torch
from _common import wilson

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs


def noise_dataset(seed, n_trials=40, n_channels=16, n_times=10, n_features=3):
    """Pure noise and ``n_features`` balanced binary features (none encoded)."""
    windows = {name: None for name in "ABCDEFGH"[:n_features]}
    return simulate_epochs(n_trials=n_trials, n_channels=n_channels, n_times=n_times,
                           sfreq=100.0, tmin=0.0, windows=windows, n_levels=2,
                           random_state=seed)


def analyse(seed, n_null, alpha, **sizes):
    """Per test: any model with ``pvalues_fwe < alpha``, and with
    ``pvalues_fwe_tests < alpha``; the tests' names."""
    data, table, times = noise_dataset(seed, **sizes)
    with warnings.catch_warnings():
        # e.g. a fold whose held-out stimuli share a feature's value: part of the defaults
        warnings.simplefilter("ignore", UserWarning)
        # the analysis's seed differs from the data's (folds and relabellings apart from
        # the noise)
        res = mlem_neuro.mlem_array(data, table, times=times, n_null=n_null,
                                    random_state=10**6 + seed, verbose="WARNING")
    with np.errstate(invalid="ignore"):
        per_test = (res.pvalues_fwe < alpha).any(axis=0)
        over_tests = (res.pvalues_fwe_tests < alpha).any(axis=0)
    return res.tests, per_test, over_tests


def line(label, count, n):
    lo, hi = wilson(count, n)
    return f"  {label:34s} {count:5d} / {n:<5d} {count / n:.3f}  [{lo:.3f}, {hi:.3f}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-datasets", type=int, default=200)
    parser.add_argument("--n-null", type=int, default=99)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--n-trials", type=int, default=40)
    parser.add_argument("--n-channels", type=int, default=16)
    parser.add_argument("--n-times", type=int, default=10)
    parser.add_argument("--n-features", type=int, default=2)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--progress", type=int, default=50,
                        help="print the running counts every this many datasets")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = dict(n_trials=args.n_trials, n_channels=args.n_channels, n_times=args.n_times,
                 n_features=args.n_features)
    print(f"pure noise, {args.n_trials} trials x {args.n_channels} channels x "
          f"{args.n_times} times, {args.n_features} binary features (none encoded); "
          f"mlem_array defaults, n_null={args.n_null}, alpha={args.alpha:g}; "
          f"{args.n_datasets} datasets", flush=True)
    t0, c0 = time.perf_counter(), time.process_time()
    per_test, over_tests, tests = [], [], None
    for i, seed in enumerate(range(args.first_seed, args.first_seed + args.n_datasets)):
        tests, a, b = analyse(seed, args.n_null, args.alpha, **sizes)
        per_test.append(a)
        over_tests.append(b)
        if args.progress and (i + 1) % args.progress == 0:
            print(f"  {i + 1} datasets: any pvalues_fwe {np.any(per_test, axis=1).sum()}, "
                  f"any pvalues_fwe_tests {np.any(over_tests, axis=1).sum()} "
                  f"({time.process_time() - c0:.0f} s CPU)", flush=True)
    per_test, over_tests = np.array(per_test), np.array(over_tests)
    n = len(per_test)
    floor = len(tests) / (1 + args.n_null)
    print(f"smallest p-value corrected over the {len(tests)} tests: {len(tests)}/"
          f"{args.n_null + 1} = {floor:.3g}" + (" (not below alpha: none can be "
                                                  "significant)" if floor >= args.alpha
                                                  else ""))
    print(f"datasets with a significant result (count / datasets, rate, Wilson 95 %); "
          f"tests {tests}:")
    for k, test in enumerate(tests):
        print(line(f"{test}: pvalues_fwe", int(per_test[:, k].sum()), n))
    for k, test in enumerate(tests):
        print(line(f"{test}: pvalues_fwe_tests", int(over_tests[:, k].sum()), n))
    print(line("any test, pvalues_fwe", int(per_test.any(axis=1).sum()), n))
    print(line("any test, pvalues_fwe_tests", int(over_tests.any(axis=1).sum()), n))
    print(f"total {time.perf_counter() - t0:.0f} s wall, {time.process_time() - c0:.0f} s "
          "CPU")


if __name__ == "__main__":
    main()
