"""Permutation tests on a block design with runs: calibration with and without groups.

A simulated fMRI-like block design where the truth is known (no feature is encoded):
``--runs`` runs, each holding one block of every condition in a random order; the
conditions cross a binary feature ``a`` and a ``--levels``-level feature ``b`` (or, with
``--single``, are the levels of one feature ``category``, as in Haxby's design).  Every
block's pattern (``--units`` voxels, ``--models`` regions analysed as the models of one
analysis) is noise plus a run offset (a random pattern shared by the run's blocks), a
linear drift over the run's blocks (a random direction per run) and, by default, spatially
smooth noise; the patterns are then z-scored per voxel within each run, as the docs advise
for runs.  Per-run z-scoring makes pairs of the same run more distant than pairs of
different runs, and in this design every pair of the same run differs in condition: the
structure a null must keep.

Each dataset is analysed three times with the same grouped folds (GroupKFold over the
runs, the defaults otherwise, ``n_null`` nulls):

* ``default``: ``groups=runs`` (the nulls relabel blocks within their run; held-out pairs
  between runs only, ``held_out_pairs="auto"``);
* ``all pairs``: ``groups=runs, held_out_pairs="all"`` (nulls within runs, every held-out
  pair: is the estimate itself protected?);
* ``across runs``: the same folds passed as ``cv`` without ``groups`` (the nulls relabel
  blocks across runs, every held-out pair: the behaviour before the nulls respected
  groups).

Printed per test: the rate of (dataset, model) with uncorrected p < 0.05, the rate of
datasets with a family-wise corrected p < 0.05 at any model, their Wilson 95 % intervals,
and the median importance of each feature (no feature is encoded, so its expectation is
the bias of the estimate).

Run::

    OMP_NUM_THREADS=1 python validation/calib_runs.py --datasets 200
"""
import argparse
import time
import warnings

import numpy as np
import pandas as pd
import torch
from _common import wilson
from sklearn.model_selection import GroupKFold

import mlem_neuro


def block_design(seed, n_runs=8, levels=4, units=40, models=4, offset=1.0, drift=1.0,
                 smooth=True, crossed=True):
    """Patterns ``(n_blocks, units, models)`` z-scored within run, the feature table and
    the run of each block (no feature encoded)."""
    rng = np.random.default_rng(seed)
    n_cond = 2 * levels
    order = np.concatenate([rng.permutation(n_cond) for _ in range(n_runs)])
    runs = np.repeat(np.arange(n_runs), n_cond)
    X = rng.standard_normal((len(order), units, models))
    if smooth:                        # neighbouring voxels share noise (a 1-D smoothing)
        kernel = np.exp(-0.5 * (np.arange(-3, 4) / 1.5) ** 2)
        X = np.apply_along_axis(lambda v: np.convolve(v, kernel / kernel.sum(), "same"),
                                1, X)
    position = np.tile(np.linspace(-1, 1, n_cond), n_runs)
    for r in range(n_runs):
        rows = runs == r
        X[rows] += offset * rng.standard_normal((1, units, models))
        X[rows] += drift * position[rows, None, None] * rng.standard_normal((1, units, models))
    for r in range(n_runs):                                 # z-score within run
        rows = runs == r
        X[rows] = (X[rows] - X[rows].mean(axis=0)) / X[rows].std(axis=0)
    if not crossed:                                   # one feature: the condition
        return X, pd.DataFrame({"category": pd.Categorical([f"c{c}" for c in order])}), runs
    table = pd.DataFrame({"a": pd.Categorical([f"a{c % 2}" for c in order]),
                          "b": pd.Categorical([f"b{c // 2}" for c in order])})
    return X, table, runs


MODES = {"default": "groups=runs (nulls within runs, held-out pairs between runs)",
         "all pairs": "groups=runs, held_out_pairs='all' (nulls within runs)",
         "across runs": "no groups (nulls across runs, every held-out pair)"}


def analyse(X, table, runs, n_null, seed, mode, cv):
    kw = dict(n_null=n_null, random_state=seed, verbose="ERROR")
    folds = list(GroupKFold(cv).split(X, groups=runs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "across runs":
            return mlem_neuro.mlem_array(X, table, cv=folds, **kw)
        pairs = "all" if mode == "all pairs" else "auto"
        return mlem_neuro.mlem_array(X, table, groups=runs, cv=folds,
                                     held_out_pairs=pairs, **kw)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_argument("--n-null", type=int, default=99)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--levels", type=int, default=4)
    parser.add_argument("--units", type=int, default=40)
    parser.add_argument("--models", type=int, default=4)
    parser.add_argument("--cv", type=int, default=4)
    parser.add_argument("--single", action="store_true",
                        help="one feature, the condition (2 x levels categories), as in "
                             "Haxby's design; default: a x b crossed")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated analyses among {list(MODES)}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    modes = args.modes.split(",")
    unc = {m: {} for m in modes}
    fwe = {m: {} for m in modes}
    imp = {m: {} for m in modes}
    start = time.time()
    for d in range(args.datasets):
        X, table, runs = block_design(d, args.runs, args.levels, args.units, args.models,
                                         crossed=not args.single)
        for mode in modes:
            res = analyse(X, table, runs, args.n_null, d, mode, args.cv)
            for k, test in enumerate(res.tests):
                unc[mode].setdefault(test, []).append(res.pvalues[:, k] < 0.05)
                fwe[mode].setdefault(test, []).append(bool(np.any(res.pvalues_fwe[:, k]
                                                                  < 0.05)))
            for k, name in enumerate(res.feature_names):
                imp[mode].setdefault(name, []).append(res.importance[:, k])
        if (d + 1) % 10 == 0 or d + 1 == args.datasets:
            print(f"{d + 1} datasets, {time.time() - start:.0f} s", flush=True)
    for mode in modes:
        label = MODES[mode]
        print(f"\n{label}: {args.datasets} datasets x {args.models} models, "
              f"{args.runs} runs x {2 * args.levels} conditions "
              f"({'one feature' if args.single else 'a x b'}), cv={args.cv}, "
              f"n_null={args.n_null}")
        for test in unc[mode]:
            u = np.concatenate(unc[mode][test])
            f = np.array(fwe[mode][test])
            lo, hi = wilson(u.sum(), u.size)
            flo, fhi = wilson(f.sum(), f.size)
            print(f"  {test:13s} uncorrected {u.mean():.3f} ({lo:.3f}-{hi:.3f}, n={u.size})"
                  f"  FWE {f.mean():.3f} ({flo:.3f}-{fhi:.3f}, n={f.size})")
        for name, values in imp[mode].items():
            v = np.concatenate(values)
            print(f"  importance of {name}: median {np.median(v):+.4f}, mean {v.mean():+.4f}"
                  f" (SE {v.std(ddof=1) / np.sqrt(v.size):.4f})")


if __name__ == "__main__":
    main()
