"""Calibration of the permutation tests (``n_null``) on items and cross-validated distances.

Pure noise with repeated trials: ``n_items`` items of two balanced binary features A and B
(neither encoded), ``n_trials`` trials per item, unit noise plus noise shared by the
channels (two random directions, standard deviation ``--shared``), ``T`` time points.
Each dataset is analysed with ``items="item"`` and each ``--distances`` value (the item
means' Euclidean distance, ``cv_euclidean``, ``crossnobis``), ``n_null`` relabellings of the
items; every test's null is true.  Prints, per distance and test, the KS test of the
pooled p-values against the uniform (per-model p-values are discrete: a KS p-value is a
rough guide), the pointwise rate of p < 0.05 and the family-wise rate (datasets with any
FWE p < 0.05 over the time points; binomial standard error about 0.015 at 200 datasets).
With 99 nulls, p < 0.05 means p <= 0.04: the nominal rate is 0.04.

    OMP_NUM_THREADS=1 python validation/calib_crossdist.py [--datasets 200] [--n-null 99]
"""
import argparse
import time

import numpy as np
import pandas as pd
import torch
from scipy import stats

import mlem_neuro

FIT = dict(cv=3, max_steps=100, patience=20, n_permutations=2, interactions=False)


def noise_items(seed, n_items=24, n_trials=6, C=8, T=4, shared=2.0):
    rng = np.random.default_rng(seed)
    A = rng.permutation(np.arange(n_items) % 2)
    B = rng.permutation(np.arange(n_items) % 2)
    dirs = rng.standard_normal((2, C))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    n = n_items * n_trials
    data = (rng.standard_normal((n, C, T))
            + shared * np.einsum("nkt,kc->nct", rng.standard_normal((n, 2, T)), dirs))
    item = np.repeat(np.arange(n_items), n_trials)
    table = pd.DataFrame({"A": np.where(A[item], "a1", "a0"),
                          "B": np.where(B[item], "b1", "b0"),
                          "item": [f"i{k:02d}" for k in item]})
    return data, table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_argument("--n-null", type=int, default=99)
    parser.add_argument("--shared", type=float, default=2.0)
    parser.add_argument("--distances", nargs="+",
                        default=["euclidean", "cv_euclidean", "crossnobis"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    p, fwe = {}, {}
    t0 = time.process_time()
    for seed in range(args.datasets):
        data, table = noise_items(seed, shared=args.shared)
        for d in args.distances:
            res = mlem_neuro.mlem_array(data, table, items="item", distance=d,
                                        n_null=args.n_null, random_state=seed + 1000,
                                        verbose="ERROR", **FIT)
            for k, test in enumerate(res.tests):
                p.setdefault((d, test), []).append(res.pvalues[:, k])
                fwe.setdefault((d, test), []).append(bool((res.pvalues_fwe[:, k] < 0.05)
                                                          .any()))
    print(f"{args.datasets} pure-noise datasets (24 items x 6 trials, 8 channels, 4 time "
          f"points, shared noise sd {args.shared}), n_null={args.n_null}, "
          f"{time.process_time() - t0:.0f} s CPU")
    print(f"{'distance':14s} {'test':6s} {'KS p':>6s} {'p<0.05':>7s} {'FWE':>6s}")
    for (d, test), values in p.items():
        pooled = np.concatenate(values)
        ks = stats.kstest(pooled, "uniform").pvalue
        print(f"{d:14s} {test:6s} {ks:6.3f} {np.mean(pooled < 0.05):7.3f} "
              f"{np.mean(fwe[(d, test)]):6.3f}")


if __name__ == "__main__":
    main()
