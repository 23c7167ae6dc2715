"""Threads under load: ``mlem_epochs`` with the package's thread policy vs torch's threading.

The setting of ``bench_time.py``, smaller by default so that it runs in a few minutes:
simulated epochs (:func:`bench_time.simulate`), 200 trials, 64 EEG channels, 10 time
points, 5 two-level features with all interactions (15 terms), 5 folds, 10 permutations,
the package's default training options.

While it runs, the benchmark keeps ``--load`` busy processes spinning (default: one per
available core; ``--load 0`` for a quiet run).  They are started before the first timing,
exit by themselves after ``--load-seconds`` at the latest, and are terminated at the end.

Timed side by side in one process, in turn, ``--repeats`` times (each a fresh call, the
same data and seed):

* ``defaults``: the package as a user gets it (the thread policy on; torch left at its own
  default before the call);
* ``single``: ``torch.set_num_threads(1)`` before the call, the policy off
  (``MLEM_NEURO_NUM_THREADS=off``), so the package does not touch the threads;
* ``torch``: the policy off and torch at its own default threads (what every call got
  before the policy);
* ``n_jobs=K`` for each ``--n-jobs K`` > 1: the defaults with ``K`` worker processes; the
  workers are shut down before each such run, so each timing includes their start-up;
  with ``--warm``, ``n_jobs=K warm`` runs again right after on the started workers.

``--configs`` picks among ``defaults``, ``single`` and ``torch`` (all three by default).

Prints each time, the median per configuration and the ratios to the better of
``defaults`` / ``single`` (target: defaults <= 1.3x).

Run: ``.venv/bin/python benchmarks/bench_threads.py [--load 2] [--repeats 3] [--n-jobs 2]``
"""
import argparse
import multiprocessing as mp
import os
import time
import warnings

import numpy as np
import torch
from _common import THREADS_ENV as ENV_VAR
from _common import available_cores
from bench_time import simulate

import mlem_neuro
from mlem_neuro.core.stimuli.pairs import kfold_stimuli


def _spin(deadline):
    """Busy loop until ``deadline`` (time.time()): one core of load."""
    x = 0
    while time.time() < deadline:
        x += 1


def _loadavg():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:                      # not on every platform
        return "n/a"


def start_load(n, seconds):
    # fork where there is one: the child only spins (nothing to import)
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    procs = [ctx.Process(target=_spin, args=(time.time() + seconds,), daemon=True)
             for _ in range(n)]
    for p in procs:
        p.start()
    return procs


def stop_load(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.join(timeout=10)


def run(config, epochs, folds, torch_default, kw):
    """One timed ``mlem_epochs`` call under ``config``; returns (seconds, result)."""
    from joblib.externals.loky import get_reusable_executor

    n_jobs = None
    if config == "defaults":
        os.environ.pop(ENV_VAR, None)
        torch.set_num_threads(torch_default)
    elif config == "single":
        os.environ[ENV_VAR] = "off"
        torch.set_num_threads(1)
    elif config == "torch":
        os.environ[ENV_VAR] = "off"
        torch.set_num_threads(torch_default)
    else:                                                   # "n_jobs=K[ warm]"
        os.environ.pop(ENV_VAR, None)
        torch.set_num_threads(torch_default)
        n_jobs = int(config.split("=")[1].split()[0])
        if not config.endswith("warm"):
            get_reusable_executor().shutdown(wait=True)     # time the workers' start too
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = mlem_neuro.mlem_epochs(epochs, cv=folds, n_jobs=n_jobs, **kw)
    seconds = time.perf_counter() - t0
    os.environ.pop(ENV_VAR, None)
    torch.set_num_threads(torch_default)
    return seconds, res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--times", type=int, default=10)
    p.add_argument("--features", type=int, default=5)
    p.add_argument("--load", type=int, default=available_cores(),
                   help="busy processes running during the timings (default: one per "
                        "available core; 0: none)")
    p.add_argument("--load-seconds", type=float, default=3600.0,
                   help="the busy processes exit by themselves after this long")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n-jobs", type=int, nargs="*", default=[2],
                   help="also time the defaults with these n_jobs (> 1)")
    p.add_argument("--warm", action="store_true",
                   help="also time each n_jobs again right after, its workers already "
                        "started (without their start-up)")
    p.add_argument("--configs", nargs="*", default=["defaults", "single", "torch"])
    args = p.parse_args()
    if args.load < 0:
        p.error("--load must be >= 0")
    if ENV_VAR in os.environ:
        p.error(f"unset {ENV_VAR}: the benchmark sets it itself")

    torch_default = torch.get_num_threads()
    epochs, _ = simulate(args.trials, args.channels, args.times, args.features)
    folds = kfold_stimuli(args.trials, 5, np.random.default_rng(0))
    kw = dict(constraint="spd", interactions=True, n_permutations=10, random_state=0)
    configs = list(args.configs)
    for k in args.n_jobs:
        if k > 1:
            configs += [f"n_jobs={k}"] + ([f"n_jobs={k} warm"] if args.warm else [])
    print(f"torch {torch.__version__}, torch's default {torch_default} threads, "
          f"{available_cores()} available cores, os.cpu_count() {os.cpu_count()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}; {args.load} busy "
          f"process(es); {args.trials} trials, {args.channels} channels, {args.times} time "
          f"points, {args.features} features + interactions, 5 folds, 10 permutations; "
          f"load average before {_loadavg()}")
    run("defaults", epochs, folds, torch_default,
        dict(kw, max_steps=5))                              # warm-up, untimed

    load = start_load(args.load, args.load_seconds)
    times = {c: [] for c in configs}
    ref = None
    try:
        time.sleep(1.0 if args.load else 0.0)
        for r in range(args.repeats):
            for c in configs:
                seconds, res = run(c, epochs, folds, torch_default, kw)
                times[c].append(seconds)
                if ref is None:
                    ref = res.importance
                diff = np.abs(res.importance - ref).max()
                print(f"repeat {r + 1} {c:>14}: {seconds:7.2f} s  (max |importance - first "
                      f"run's| {diff:.1e})", flush=True)
    finally:
        print(f"load average at the end (the benchmark's own load included): "
              f"{_loadavg()}")
        stop_load(load)
    med = {c: float(np.median(v)) for c, v in times.items()}
    best = min(med[c] for c in ("defaults", "single") if c in med)
    print("median over repeats (ratio to the better of defaults / single):")
    for c in configs:
        print(f"  {c:>14}: {med[c]:7.2f} s  {med[c] / best:5.2f}x   "
              f"[{', '.join(f'{t:.2f}' for t in times[c])}]")
    if "defaults" in med and "torch" in med:
        print(f"torch's default threading / package defaults: "
              f"{med['torch'] / med['defaults']:.2f}x")


if __name__ == "__main__":
    main()
