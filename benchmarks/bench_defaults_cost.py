"""What the default settings cost: a time-resolved analysis against a plain RSA, and its tests.

Simulated epochs (:func:`mlem_neuro.simulation.simulate_epochs`), 200 trials x 64
channels x 100 time points, three binary features (A, B encoded in windows, C not), timed
one after the other in this process, on the same arrays:

1. a plain RSA: per time point, the Euclidean RDM of the trials (``scipy.spatial.distance.
   pdist``) and its Spearman correlation with each feature's model RDM;
2. :func:`mlem_neuro.mlem_array` at the package defaults (``n_null=0``), and at
   ``cv=5, n_repeats=1`` (the defaults before issue 30);
3. the defaults with the single-subject tests, ``n_null=99``, with ``n_jobs`` of
   ``--n-jobs`` (default 2: the two cores of the reference machine);
4. the same tests with ``feature_test="combined"`` (every feature's null models at every
   time point; the staged default fits them only where the test of interactions finds
   interactions), and a RSA with the same number of permutations
   (:func:`mlem_neuro.rsa_array`, ``n_null``: a max statistic over time points), each
   with its ratio to 3;
5. what the default feature test (``feature_test="staged"``; ``"combined"`` alike) adds to
   them: every feature's main effect and its null over the same relabellings
   (:func:`~mlem_neuro.core.scoring.main_effect.main_effect_tests`), timed alone and as a
   fraction of 3.

Wall times (the median of ``--repeats`` runs for 1 and 2, of ``--test-repeats`` for 3) and
their ratios to the RSA.
Targets (issue 30): the analysis at most 30x the RSA; the tests at most 3 min on 2 cores.

    OMP_NUM_THREADS=1 python benchmarks/bench_defaults_cost.py [--n-jobs 2] [--repeats 3] \
        [--test-repeats 3]
"""
import argparse
import os
import time
import warnings

import numpy as np
import scipy.stats
import torch
from scipy.spatial.distance import pdist

import mlem_neuro
from mlem_neuro import rsa
from mlem_neuro.simulation import simulate_epochs


def plain_rsa(data, table):
    models = [rsa.model_rdm(table[f]) for f in table.columns]
    out = np.empty((data.shape[-1], len(models)))
    for t in range(data.shape[-1]):
        neural = pdist(data[:, :, t])
        for j, m in enumerate(models):
            out[t, j] = scipy.stats.spearmanr(neural, m)[0]
    return out


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n-trials", type=int, default=200)
    p.add_argument("--n-channels", type=int, default=64)
    p.add_argument("--n-times", type=int, default=100)
    p.add_argument("--n-null", type=int, default=99)
    p.add_argument("--n-jobs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--test-repeats", type=int, default=1,
                   help="runs of the default tests, their median reported (one run varies "
                        "by 15 %%: worker start-up, the machine's other work)")
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    data, table, times = simulate_epochs(n_trials=args.n_trials, n_channels=args.n_channels,
                                         n_times=args.n_times, sfreq=100.0, tmin=-0.2,
                                         random_state=0)
    print(f"{args.n_trials} trials x {args.n_channels} channels x {args.n_times} time points, "
          f"features {list(table.columns)}; {os.cpu_count()} CPU core(s), torch "
          f"{torch.get_num_threads()} thread(s); load average before: "
          f"{os.getloadavg()[0]:.2f}")
    t_rsa, runs = timed(lambda: plain_rsa(data, table), args.repeats)
    print(f"plain RSA (pdist + Spearman, 3 model RDMs):  {t_rsa:7.2f} s  "
          f"(runs {', '.join(f'{t:.2f}' for t in runs)})")
    rows = [("mlem_array, defaults", {}),
            ("mlem_array, cv=5 n_repeats=1 (old)", dict(cv=5, n_repeats=1))]
    for label, kw in rows:
        res = []
        t, runs = timed(lambda: res.append(mlem_neuro.mlem_array(
            data, table, times=times, random_state=0, verbose="WARNING", **kw)),
            args.repeats)
        s = res[-1].settings
        print(f"{label:<40s} {t:7.2f} s = {t / t_rsa:5.1f}x the RSA  (cv={s['cv']}, "
              f"{s['n_repeats_used']} repeats, {s['n_folds']} folds; runs "
              f"{', '.join(f'{x:.2f}' for x in runs)})")
    def tests(fn, **kw):
        """One run of ``fn`` with the tests: its result, wall time and FWE-significant
        time points per test."""
        t0 = time.perf_counter()
        out = fn(data, table, times=times, n_null=args.n_null, random_state=0,
                 verbose="WARNING", **kw)
        return out, time.perf_counter() - t0, {k: int(out.significant(k).sum())
                                               for k in out.tests}

    runs = [tests(mlem_neuro.mlem_array, n_jobs=args.n_jobs)
            for _ in range(max(1, args.test_repeats))]
    res, _, found = runs[-1]
    t = float(np.median([r[1] for r in runs]))
    print(f"defaults, n_null={args.n_null}, n_jobs={args.n_jobs}: {t:7.1f} s = {t / 60:.2f} min "
          f"(median of runs {', '.join(f'{r[1]:.1f}' for r in runs)}; target <= 3 min on 2 "
          f"cores); FWE-significant time points {found}; the features' "
          f"null models fitted at {res.settings['feature_test_staged_open']} of "
          f"{args.n_times} time points (where interactions are found)")
    _, t_full, found = tests(mlem_neuro.mlem_array, n_jobs=args.n_jobs,
                             feature_test="combined")
    print(f"the same with feature_test='combined' (every feature's null models at every time "
          f"point: what the staged default fitted before it fitted them where interactions "
          f"are found): {t_full:7.1f} s; staged / combined = {t / t_full:.2f}; FWE-significant "
          f"{found}")
    # the yardstick is short and noisy: the median of 2 * repeats + 1 runs
    rsa_runs = [tests(rsa.rsa_array) for _ in range(2 * args.repeats + 1)]
    t_rsa_test = float(np.median([r[1] for r in rsa_runs]))
    found = rsa_runs[-1][2]
    print(f"rsa_array with n_null={args.n_null} (max statistic over time points): "
          f"{t_rsa_test:7.2f} s (median of runs "
          f"{', '.join(f'{r[1]:.2f}' for r in rsa_runs)}); the default tests = "
          f"{t / t_rsa_test:.0f}x it (issue 38 target <= 100x); FWE-significant {found}")
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.core.scoring.main_effect import main_effect_tests
    from mlem_neuro.core.scoring.nulls import null_permutations
    from mlem_neuro.core.stimuli.features import FeatureSpace

    space = FeatureSpace().fit(table)
    enc = space.transform(table)
    null = null_permutations(enc, space.kinds_, args.n_null, np.random.default_rng(0))
    X = (data - data.mean(axis=(0, 2), keepdims=True)) / data.std(axis=(0, 2), keepdims=True)
    source = DenseRDMSource(X.transpose(2, 0, 1), "euclidean")
    t_main, runs = timed(lambda: main_effect_tests(source, enc, null), args.repeats)
    print(f"main effects + {args.n_null} nulls (what feature_test='staged' adds): "
          f"{t_main:7.2f} s = {100 * t_main / t:.2f} % of the tests above")


if __name__ == "__main__":
    main()
