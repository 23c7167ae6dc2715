"""Numeric against categorical features: the same time-resolved analysis, side by side.

``mlem_array`` on simulated trials (``n`` trials x 32 channels x ``T`` time points), ``m``
features, 5 folds, the default options (level="feature", interactions, batch_size="auto"),
one torch thread.  Two designs at equal ``n``, ``m`` and ``T``:

* categorical: each feature is binary (two balanced levels);
* numeric: each feature is uniform on ``[0, 1]`` (a continuous value such as word frequency
  or position), standardised to the same variance as the binary feature, so that both
  designs encode the same effect strength; run twice: with the default
  ``numeric_levels="auto"`` (training on a grid of distances) and with
  ``numeric_levels=None`` (exact per-pair training).

Each feature ``k`` adds ``amplitude * x_k * pattern_k`` to the trials in the second half of
the epoch (``pattern_k`` a random channel pattern of unit RMS; features ``0 .. m-2`` are
encoded, the last one never), plus unit Gaussian noise.  The two designs are timed
alternately (``--repeats`` rounds, the order alternating), after an untimed warm-up.  The
script prints the times, their ratios, steps, batch size, held-out Spearman and feature
importances of each run, and the differences of the grid run from the exact one next to
those of an exact run with another training seed (same folds: mini-batches alone), on
``--datasets`` simulated datasets (untimed).
``--before`` adds the previous per-pair path (:func:`torchsort.soft_rank` with its own
sort, exact training) for a before/after ratio in the same run.

    OMP_NUM_THREADS=1 python benchmarks/bench_numeric.py [--n 200] [--times 20]
        [--features 4] [--repeats 2] [--datasets 1] [--before]
"""
import argparse
import math
import time

import numpy as np
import pandas as pd
import torch
from _common import describe, warm_up

import mlem_neuro
from mlem_neuro.core.stimuli.pairs import kfold_stimuli


def simulate(n, n_channels, n_times, m, kind, amplitude, seed):
    """Trials, feature table; features ``0..m-2`` encoded in the second half of the epoch."""
    rng = np.random.default_rng(seed)
    if kind == "categorical":
        x = np.stack([rng.permutation(np.arange(n) % 2) for _ in range(m)], axis=1)
        table = pd.DataFrame({f"f{k}": pd.Categorical(np.where(x[:, k], "B", "A"))
                              for k in range(m)})
        xs = (x - 0.5) * 2.0                                     # variance 1
    else:
        x = rng.uniform(0.0, 1.0, (n, m))
        table = pd.DataFrame(x, columns=[f"f{k}" for k in range(m)])
        xs = (x - 0.5) * np.sqrt(12.0)                           # variance 1
    patterns = rng.standard_normal((m, n_channels))
    patterns /= np.sqrt((patterns ** 2).mean(axis=1, keepdims=True))
    patterns[m - 1] = 0.0                                        # the last feature: none
    env = (np.arange(n_times) >= n_times // 2).astype(float)
    data = rng.standard_normal((n, n_channels, n_times))
    data += amplitude * (xs @ patterns)[:, :, None] * env[None, None, :]
    return data, table


def _torchsort_soft_spearman(pred, target_z, strength=1.0):
    """The per-pair soft Spearman before this benchmark's work: torchsort's own sort."""
    import torchsort

    from mlem_neuro.core.ranks.spearman import standardize

    n = pred.shape[-1]                 # predictions rescaled to the spread of the ranks 1..n
    scaled = standardize(pred) * (math.sqrt(n) * n / math.sqrt(12.0))
    r = torchsort.soft_rank(scaled, regularization_strength=strength)
    return (standardize(r) * target_z).sum(dim=-1)


def run(data, table, seed, before=False, folds=None, **kw):
    """``mlem_array`` on ``folds``; returns (wall seconds, CPU seconds, result).

    ``before=True``: per-pair training with :func:`torchsort.soft_rank` (the previous
    release's per-pair path), for a before/after ratio in the same run.
    """
    from mlem_neuro.core.training import engine

    fast = engine.soft_spearman
    if before:
        engine.soft_spearman = _torchsort_soft_spearman
    try:
        t0, c0 = time.perf_counter(), time.process_time()
        res = mlem_neuro.mlem_array(data, table, cv=folds, random_state=seed, **kw)
        return time.perf_counter() - t0, time.process_time() - c0, res
    finally:
        engine.soft_spearman = fast


def summary(res, T):
    late = slice(T // 2, None)
    imp = res.importance[late].mean(axis=0)
    early = res.importance[: T // 2].mean(axis=0)
    return (f"steps/model median {int(np.median(res.n_iter))}, batch "
            f"{sorted(set(res.settings['batch_size_used']))}, held-out rho "
            f"late {np.nanmean(res.score[late]):.3f} / early "
            f"{np.nanmean(res.score[: T // 2]):.3f}, importance late "
            f"{np.round(imp, 3).tolist()} early {np.round(early, 3).tolist()}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, nargs="+", default=[200])
    p.add_argument("--channels", type=int, default=32)
    p.add_argument("--times", type=int, default=20)
    p.add_argument("--features", type=int, default=4)
    p.add_argument("--amplitude", type=float, default=0.5)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--datasets", type=int, default=1,
                   help="simulated datasets for the grid-vs-exact comparison")
    p.add_argument("--before", action="store_true",
                   help="also time the previous per-pair path (torchsort's soft rank, exact)")
    args = p.parse_args()
    torch.set_num_threads(1)
    warm_up("cpu")
    print(f"{describe('cpu')}; {args.channels} channels, {args.times} time points, "
          f"{args.features} features (the last one not encoded), 5 folds, default options")
    for n in args.n:
        designs = {kind: simulate(n, args.channels, args.times, args.features, kind,
                                  args.amplitude, args.seed)
                   for kind in ("categorical", "numeric")}
        designs["numeric exact"] = designs["numeric"]
        levels = {"categorical": "auto", "numeric": "auto", "numeric exact": None}
        if args.before:
            designs["numeric before"] = designs["numeric"]
            levels["numeric before"] = None
        folds = kfold_stimuli(n, 5, np.random.default_rng(args.seed))
        times = {kind: [] for kind in designs}
        cpu = {kind: [] for kind in designs}
        results = {}
        for r in range(args.repeats):
            order = list(designs) if r % 2 == 0 else list(designs)[::-1]
            for kind in order:
                t, c, res = run(*designs[kind], args.seed, before=kind == "numeric before",
                             folds=folds, numeric_levels=levels[kind])
                times[kind].append(t)
                cpu[kind].append(c)
                results[kind] = res
        print(f"n = {n} trials ({n * (n - 1) // 2} pairs):")
        for kind in designs:
            print(f"  {kind:14s}: wall {np.round(times[kind], 1).tolist()} s, CPU "
                  f"{np.round(cpu[kind], 1).tolist()} s; {summary(results[kind], args.times)}")
        med = {kind: np.median(t) for kind, t in cpu.items()}
        print(f"  CPU time ratios (medians): numeric (default, grid) / categorical "
              f"{med['numeric'] / med['categorical']:.2f}x, numeric exact / categorical "
              f"{med['numeric exact'] / med['categorical']:.2f}x"
              + (f", numeric before / categorical {med['numeric before'] / med['categorical']:.2f}x"
                 if args.before else ""))
        # reference: exact training with another seed (same folds; other mini-batches and
        # importance permutations); --datasets repeats the comparison on other simulated
        # datasets (data, folds and seeds from seed + d)
        diffs = []
        for d in range(args.datasets):
            s = args.seed + d
            if d == 0:
                grid, exact = results["numeric"], results["numeric exact"]
                data_d, folds_d = designs["numeric"], folds
            else:
                data_d = simulate(n, args.channels, args.times, args.features, "numeric",
                                  args.amplitude, s)
                folds_d = kfold_stimuli(n, 5, np.random.default_rng(s))
                grid = run(*data_d, s, folds=folds_d, numeric_levels="auto")[2]
                exact = run(*data_d, s, folds=folds_d, numeric_levels=None)[2]
            other = run(*data_d, s + 1, folds=folds_d, numeric_levels=None)[2]
            late, early = slice(args.times // 2, None), slice(None, args.times // 2)
            for label, res in (("grid vs exact", grid), ("exact, other seed vs exact", other)):
                d_rho, d_imp = res.score - exact.score, res.importance - exact.importance
                row = [np.nanmax(np.abs(d_rho[late])), np.nanmax(np.abs(d_rho[early])),
                       np.abs(d_imp[late]).max(), np.abs(d_imp[early]).max()]
                diffs.append((label, row))
                print(f"  dataset {d}, {label} (same folds): held-out rho max |diff| "
                      f"{row[0]:.4f} (encoded half), {row[1]:.4f} (null half); importance "
                      f"max |diff| {row[2]:.4f} (encoded), {row[3]:.4f} (null)")
        if args.datasets > 1:
            for label in ("grid vs exact", "exact, other seed vs exact"):
                rows = np.array([r for lab, r in diffs if lab == label])
                print(f"  over {args.datasets} datasets, {label}: mean (max) of max |diff|: "
                      f"rho encoded {rows[:, 0].mean():.4f} ({rows[:, 0].max():.4f}), null "
                      f"{rows[:, 1].mean():.4f} ({rows[:, 1].max():.4f}); importance encoded "
                      f"{rows[:, 2].mean():.4f} ({rows[:, 2].max():.4f}), null "
                      f"{rows[:, 3].mean():.4f} ({rows[:, 3].max():.4f})")

if __name__ == "__main__":
    main()
