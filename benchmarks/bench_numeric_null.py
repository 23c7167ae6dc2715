"""Cost of permutation tests with a numeric covariate against a categorical one.

A simulated N400-like design (issue 28, item 4): ``--n-pairs`` word pairs (stimuli) x
``--n-channels`` channels x ``--n-times`` time points; ``relatedness`` binary (half the
pairs related), ``FAS`` (forward association strength) numeric, > 0 for most related
pairs (a few related pairs have 0) and 0 for every unrelated pair.  The N400 (a
centro-parietal negativity, 300-500 ms) shrinks with relatedness and with FAS.  The same
analysis runs twice: with ``FAS`` numeric, and with ``FAS`` replaced by a categorical
covariate of similar information (``FAS`` binned into 3 levels, as strings: none, weak,
strong).  Each design runs with ``n_null=0`` and with ``--n-null``, side by side in one
process, with the same seed, serially; the script prints wall and CPU (process) times,
the ratio of each design's tests to its analysis without tests, and the ratio numeric /
categorical of the runs with tests.  ``--profile`` profiles the numeric run with tests
(cProfile, the top functions by cumulative and own time).

    OMP_NUM_THREADS=1 python benchmarks/bench_numeric_null.py [--n-times 10] [--n-null 19]
        [--repeats 1] [--profile] [--only numeric|categorical]
"""
import argparse
import cProfile
import io
import pstats
import time
import warnings

import numpy as np
import pandas as pd
import torch

import mlem_neuro


def simulate(n_pairs, n_channels, n_times, seed=0):
    """Trials ``(n_pairs, n_channels, n_times)``, the numeric table and the categorical one."""
    rng = np.random.default_rng(seed)
    related = np.zeros(n_pairs, dtype=int)
    related[rng.permutation(n_pairs)[:n_pairs // 2]] = 1
    fas = np.where(related == 1, rng.gamma(2.0, 0.08, n_pairs), 0.0)
    fas[(related == 1) & (rng.random(n_pairs) < 0.1)] = 0.0      # related, no association
    times = np.linspace(-0.1, 0.8, n_times)
    n400 = np.exp(-0.5 * ((times - 0.4) / 0.08) ** 2)               # (n_times,)
    topo = np.exp(-0.5 * ((np.arange(n_channels) - n_channels / 2) / (n_channels / 5)) ** 2)
    amp = -3.0 + 1.2 * related + 4.0 * fas                          # less negative if related
    data = rng.normal(size=(n_pairs, n_channels, n_times))
    data += amp[:, None, None] * topo[None, :, None] * n400[None, None, :]
    numeric = pd.DataFrame({"relatedness": related.astype(str), "FAS": fas})
    bins = np.where(fas == 0, "none", np.where(fas < np.median(fas[fas > 0]), "weak",
                                                "strong"))
    categorical = pd.DataFrame({"relatedness": related.astype(str), "FAS": bins})
    return data, times, numeric, categorical


def run(data, times, table, n_null, repeats, n_jobs=None):
    """Median wall and CPU time of ``repeats`` runs, and the last result."""
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            res = mlem_neuro.mlem_array(data, table, times=times, cv=5, n_null=n_null,
                                        random_state=0, n_jobs=n_jobs,
                                        verbose="WARNING")
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return float(np.median(walls)), float(np.median(cpus)), res


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-pairs", type=int, default=120)
    parser.add_argument("--n-channels", type=int, default=32)
    parser.add_argument("--n-times", type=int, default=10)
    parser.add_argument("--n-null", type=int, default=19)
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per configuration (medians); n_null=0 runs 3 at least")
    parser.add_argument("--only", choices=["numeric", "categorical"], default=None)
    parser.add_argument("--profile", action="store_true",
                        help="profile the numeric design's run with tests")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-jobs", type=int, default=None,
                        help="n_jobs of the runs with tests (the CPU time is then the main "
                             "process's alone: read the wall time)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data, times, numeric, categorical = simulate(args.n_pairs, args.n_channels, args.n_times)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); "
          f"{args.n_pairs} pairs x {args.n_channels} channels x {args.n_times} times, "
          f"cv=5, n_null={args.n_null}; FAS > 0 for {int((numeric.FAS > 0).sum())} pairs, "
          f"categorical FAS levels {sorted(categorical.FAS.unique())}")
    run(data[:, :, :2], times[:2], categorical, 0, 1)               # warm-up (imports)
    designs = [("categorical", categorical), ("numeric", numeric)]
    if args.only:
        designs = [d for d in designs if d[0] == args.only]
    with_tests = {}
    for name, table in designs:
        w0, c0, _ = run(data, times, table, 0, max(3, args.repeats))
        w1, c1, res = run(data, times, table, args.n_null, args.repeats, args.n_jobs)
        with_tests[name] = w1
        p = res.pvalues_fwe if res.pvalues_fwe is not None else None
        sig = {t: int((p[:, k] <= 0.05).sum()) for k, t in enumerate(res.tests)} if p is not None \
            else {}
        print(f"{name:12s} n_null=0: {w0:7.2f} s wall {c0:7.2f} s CPU | n_null={args.n_null}: "
              f"{w1:7.2f} s wall {c1:7.2f} s CPU ({w1 / w0:.1f}x) | time points at "
              f"FWE p <= 0.05 {sig}")
    if len(with_tests) == 2:
        print(f"ratio numeric / categorical (tests): "
              f"{with_tests['numeric'] / with_tests['categorical']:.2f}")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(data, times, numeric, args.n_null, 1)
        prof.disable()
        for key in ("cumulative", "tottime"):
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats(key).print_stats(30)
            print(s.getvalue())


if __name__ == "__main__":
    main()
