"""Where the single-subject tests' cost goes, and the least it could be on this machine.

The design of ``bench_null.py`` (200 trials x 64 channels x 100 time points, three binary
features, level="feature", cv=5, the default training options), one process, one torch
thread, CPU times (``time.process_time``).  Three runs, one after the other:

1. ``n_null=0``: the analysis (the median of three runs: it takes under a second).
2. ``n_null=N``: the analysis with its five tests (the score, each feature, the
   interactions).
3. ``n_null=N`` again with the null models' training replaced by a stub that returns
   their starting metric at once (``fastnull.fit_grouped``; the observed models train as
   usual): everything the tests cost but training.  Its p-values mean nothing.

From them: the cost per null permutation of training (run 2 - run 3) and of the rest (run
3 - run 1; of which the interaction test's datasets, timed in run 3, and the unit cost
of its irreducible steps: a Gram product, a sort, the walk), the training cost per null
model (the stub counts them) and per step, and the ratio to the analysis that 200 nulls
would reach if the null models cost nothing to train: the floor left by the interaction
test's null datasets (each is new response patterns, their RDM, one sort of its pairs and
the walks of every fold), the feature tests' grouped sums and the per-call costs.  The
ratio target is 20x.

    OMP_NUM_THREADS=1 python benchmarks/internals/bench_null_floor.py [--n-null 20] [--n-times 100]
"""
import argparse
import time

import numpy as np
import torch

import mlem_neuro
from mlem_neuro.core.scoring import fastnull
from mlem_neuro.core.training import engine
from mlem_neuro.simulation import simulate_epochs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-trials", type=int, default=200)
    parser.add_argument("--n-channels", type=int, default=64)
    parser.add_argument("--n-times", type=int, default=100)
    parser.add_argument("--n-null", type=int, default=20)
    parser.add_argument("--target", type=float, default=20.0)
    parser.add_argument("--planned-null", type=int, default=200,
                        help="n_null of the projection (default 200)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data, table, times = simulate_epochs(n_trials=args.n_trials, n_channels=args.n_channels,
                                         n_times=args.n_times, sfreq=100.0, tmin=-0.2,
                                         random_state=0)
    kw = dict(times=times, level="feature", cv=5, random_state=0)
    print(f"{args.n_trials} trials x {args.n_channels} channels x {args.n_times} time points, "
          f"features {list(table.columns)} (binary), level='feature', cv=5, one process, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread")
    mlem_neuro.mlem_array(data[:20], table.iloc[:20], times=times, cv=2)     # warm up

    def timed(**extra):
        c0 = time.process_time()
        res = mlem_neuro.mlem_array(data, table, **kw, **extra)
        return time.process_time() - c0, res

    # the analysis is short (under a second): the median of three runs
    t0 = float(np.median([timed()[0] for _ in range(3)]))
    t_full, _ = timed(n_null=args.n_null)
    fits = {"models": 0, "steps": 0}
    real = fastnull.fit_grouped

    def count(D_uniq, counts, target_sums, options=None, **k):
        out = real(D_uniq, counts, target_sums, options, **k)
        fits["models"] += len(out.n_iter)
        fits["steps"] += int(out.n_iter.sum())
        return out

    def stub(D_uniq, counts, target_sums, options=None, **k):
        M, m = counts.shape[0], D_uniq.shape[1]
        W = np.broadcast_to(np.eye(m) / np.sqrt(m), (M, m, m)).copy()
        return engine.StackFit(W=W, n_iter=np.zeros(M, dtype=int),
                               converged=np.ones(M, dtype=bool), history=None,
                               best_score=np.zeros(M), batch_size=0, full_batch=True,
                               backend="stub", lr=0.0, patience=0)

    inter = {"cpu": 0.0}
    real_inter = fastnull.interaction_scores

    def timed_inter(*a, **k):
        c0 = time.process_time()
        out = real_inter(*a, **k)
        inter["cpu"] += time.process_time() - c0
        return out

    fastnull.fit_grouped = count
    try:
        timed(n_null=args.n_null)                    # counts the null models (not timed)
        fastnull.fit_grouped = stub
        fastnull.interaction_scores = timed_inter
        t_stub, _ = timed(n_null=args.n_null)
    finally:
        fastnull.fit_grouped = real
        fastnull.interaction_scores = real_inter
    N, T, P = args.n_null, args.n_times, args.planned_null
    train = (t_full - t_stub) / N
    rest = (t_stub - t0) / N
    print(f"n_null=0: {t0:.2f} s CPU ({t0 / T * 1e3:.1f} ms a time point)")
    print(f"n_null={N}: {t_full:.2f} s CPU ({t_full / t0:.1f}x); null training stubbed: "
          f"{t_stub:.2f} s ({t_stub / t0:.1f}x)")
    print(f"per null permutation: {train * 1e3:.0f} ms training "
          f"({fits['models'] // N:,} null models, {fits['steps'] / max(fits['models'], 1):.0f} "
          f"steps each: {train * N / max(fits['models'], 1) * 1e6:.1f} us a model, "
          f"{train * N / max(fits['steps'], 1) * 1e9:.0f} ns a step) + {rest * 1e3:.0f} ms the "
          f"rest ({rest / T * 1e3:.2f} ms a time point)")
    n_sets = (args.n_null + 1) * T
    print(f"  of the rest, the interaction test's datasets (training stubbed): "
          f"{inter['cpu'] / n_sets * 1e3:.2f} ms a dataset ({n_sets:,} datasets: the data and "
          f"{args.n_null} null ones per time point)")
    unit_costs(args.n_trials, args.n_channels)
    budget = (args.target - 1) * t0 / P
    print(f"n_null={P} projected: {(t0 + P * (train + rest)) / t0:.0f}x; with free null "
          f"training: {(t0 + P * rest) / t0:.0f}x (the floor); the {args.target:g}x target "
          f"allows {budget * 1e3:.0f} ms a permutation ({budget / T * 1e3:.2f} ms a time "
          f"point), {budget / (train + rest):.2f} of today's")


def unit_costs(n, units, rows=100, repeats=5):
    """Best-of-``repeats`` cost per dataset of the interaction test's irreducible steps:
    the Gram product of ``n`` patterns of ``units`` (float64), the sort of the packed keys
    of its ``n (n - 1) / 2`` distances, and the compiled walk of 5 folds' sets."""
    from mlem_neuro.core import kernels
    from mlem_neuro.core.kernels import sorted_keys
    from mlem_neuro.core.stimuli.pairs import pair_indices

    rng = np.random.default_rng(0)
    Y = torch.as_tensor(rng.standard_normal((rows, n, units)))
    P = n * (n - 1) // 2
    D = rng.random((rows, P))
    i, j = pair_indices(n)
    test = np.zeros((5, n), dtype=bool)
    for f, block in enumerate(np.array_split(rng.permutation(n), 5)):
        test[f, block] = True
    sets = []
    for f in range(5):
        for keep in (~test[f][i] & ~test[f][j], test[f][i] & test[f][j]):
            lin = np.flatnonzero(keep)
            sets.append((torch.as_tensor(lin), torch.as_tensor(rng.integers(0, 8, len(lin)))))
    labels, J, _ = fastnull._walk_plan(sets, P, 8)

    def best(f):
        out = []
        for _ in range(repeats):
            c0 = time.perf_counter()
            f()
            out.append(time.perf_counter() - c0)
        return min(out) / rows * 1e3

    gram = best(lambda: Y @ Y.transpose(-1, -2))
    if kernels.built():                                  # the walk's own keys
        keys = sorted_keys._packed_keys(D)[0]
        sort = best(lambda: np.sort(keys, axis=-1))
        walk = best(lambda: kernels.rank_walk(D, labels, J, 8))
    else:
        sort = walk = float("nan")
    print(f"  per dataset ({n} stimuli x {units} units, {P:,} pairs; best of {repeats}, "
          f"{rows} at a time): Gram product {gram:.2f} ms, sort of the packed keys "
          f"{sort:.2f} ms, keys + sort + compiled walk of 5 folds {walk:.2f} ms")


if __name__ == "__main__":
    main()
