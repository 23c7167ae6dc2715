"""Many trials: ``mlem_array`` wall time, peak memory and where the time goes, per n.

Simulated trials (numpy, seed 0): ``n`` trials x 64 channels x 10 time points and 5
categorical features with levels A: 2, B: 2, C: 3, D: 4, E: 6 (drawn uniformly per trial).
Each feature has one random 64-channel pattern per level; A is encoded at every time point
(amplitude 1), B from time point 3 on (0.7), C from 6 on (0.5); D and E are never encoded;
independent N(0, 1) noise on every channel and time point.  The analysis is ``mlem_array``
with its defaults (5 folds, level "feature", spd with interactions, 10 permutations,
batch_size "auto", lr, patience and tol as the package sets them), ``random_state=0``, one
torch thread.

Wall and CPU (process) time of the ``mlem_array`` call are printed: on a machine shared with
other work the CPU time is the steadier figure.  Each ``n`` runs in its own process, so that
its peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``) is its own.  The per-phase breakdown comes
from timers wrapped around the package functions named below (inclusive: a phase's time
contains the phases it calls, e.g. "step setup" contains "grouping" and "batch size"):

* ``rdm``: neural distances of a fold's training and held-out trials (``DenseRDMSource.rdm``);
* ``targets``: ``NeuralTargets.from_rdm``;
* ``step setup``: ``_StepTargets.__init__`` (term rows, grouping, batch size, ranker);
* ``pair setup``: ``PairSetup.__init__`` (term rows, grouping, batch size; once per fold
  when a fold's models are split into chunks, inside "step setup" otherwise; newer code);
* ``grouping``: distinct term rows (``grouped.distinct_rows``, or the code-based grouping);
* ``batch size``: ``engine.resolve_batch_size``;
* ``fit``: ``fit_stack`` (training, including "step setup");
* ``importance``: permutation importance on held-out pairs;
* ``flat check``: the check that held-out pairs vary in each feature.

Run: ``OMP_NUM_THREADS=1 python benchmarks/bench_many_trials.py [800 1600 3200 6400]``
"""
import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np

LEVELS = {"A": 2, "B": 2, "C": 3, "D": 4, "E": 6}
#: feature -> (first encoded time point, amplitude)
ENCODED = {"A": (0, 1.0), "B": (3, 0.7), "C": (6, 0.5)}
N_CHANNELS, N_TIMES = 64, 10


def simulate(n, seed=0):
    """Trials ``(n, 64, 10)`` and their feature table (see the module notes)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    codes = {f: rng.integers(0, k, size=n) for f, k in LEVELS.items()}
    data = rng.standard_normal((n, N_CHANNELS, N_TIMES))
    for f, (start, amp) in ENCODED.items():
        patterns = rng.standard_normal((LEVELS[f], N_CHANNELS))
        data[:, :, start:] += amp * patterns[codes[f]][:, :, None]
    table = pd.DataFrame({f: np.array([f"{f.lower()}{c}" for c in codes[f]])
                          for f in LEVELS})
    return data, table


# ------------------------------------------------------------------------- timers
PHASES = defaultdict(float)
CALLS = defaultdict(int)


def _timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            PHASES[name] += time.perf_counter() - t0
            CALLS[name] += 1
    return wrapper


def _wrap(obj, attr, name):
    """Time ``obj.attr`` under ``name`` (skipped when the attribute does not exist, so the
    benchmark runs on older and newer versions of the package)."""
    fn = getattr(obj, attr, None)
    if fn is not None:
        setattr(obj, attr, _timed(name, fn))


def install_timers():
    from mlem_neuro import crossval
    from mlem_neuro.core.ranks import grouped
    from mlem_neuro.core.rdms import neural, sources
    from mlem_neuro.core.scoring import importance
    from mlem_neuro.core.training import engine

    _wrap(sources.DenseRDMSource, "rdm", "rdm")
    _wrap(neural.NeuralTargets, "from_rdm", "targets")
    if hasattr(engine, "PairSetup"):
        _wrap(engine.PairSetup, "__init__", "pair setup")
    _wrap(grouped, "distinct_rows", "grouping")
    _wrap(engine, "pair_groups", "grouping")
    _wrap(engine, "resolve_batch_size", "batch size")
    _wrap(crossval, "fit_stack", "fit")
    _wrap(crossval, "feature_importance", "importance")
    _wrap(crossval, "term_importance", "importance")
    _wrap(importance, "distinct_rows", "importance: grouping")


def run_one(n, seed=0, chunk_size=None):
    import torch

    torch.set_num_threads(1)
    install_timers()
    from mlem_neuro import mlem_array

    data, table = simulate(n, seed)
    t0, c0 = time.perf_counter(), time.process_time()
    mlem_array(data, table, random_state=0, verbose="WARNING", chunk_size=chunk_size)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024      # Linux: KiB
    return dict(n=n, wall=wall, cpu=cpu, peak_gib=peak / 2**30, phases=dict(PHASES),
                calls=dict(CALLS))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("n", type=int, nargs="*", default=[800, 1600, 3200, 6400],
                   help="numbers of trials (default 800 1600 3200 6400)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="time points per chunk of models (default: the package's choice)")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_one(args.n[0], chunk_size=args.chunk_size)))
        return
    import torch

    import mlem_neuro

    print(f"mlem_neuro {mlem_neuro.__version__} ({os.path.dirname(mlem_neuro.__file__)}), "
          f"torch {torch.__version__}, 1 thread; {N_CHANNELS} channels x {N_TIMES} time "
          f"points, features {LEVELS} (levels), 5 folds, mlem_array defaults, chunk_size "
          f"{args.chunk_size}")
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    for n in args.n:
        extra = [] if args.chunk_size is None else ["--chunk-size", str(args.chunk_size)]
        out = subprocess.run([sys.executable, __file__, "--one", str(n), *extra], env=env,
                             capture_output=True, text=True)
        if out.returncode:
            print(f"n = {n}: failed\n{out.stderr[-3000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"n = {n:>5}: {r['wall']:7.1f} s wall, {r['cpu']:7.1f} s CPU, peak RSS "
              f"{r['peak_gib']:.2f} GiB")
        for name, sec in sorted(r["phases"].items(), key=lambda kv: -kv[1]):
            print(f"    {name:<22}{sec:7.1f} s  ({r['calls'][name]} calls)")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
