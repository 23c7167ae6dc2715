"""Patience of categorical fits: what it does to an analysis's ``W``, scores and
importances, and to the cost of its tests (the options page, "Patience 10 since
2026-11-30").

``bench_defaults_cost.py``'s design (200 trials x 64 channels x 100 time points, three
binary features, ``lr="auto"``: 0.1 on these grouped fits), one process, one thread:

1. the analysis without tests at ``patience`` 20 with ``random_state=0`` (the reference)
   and ``random_state=1`` (other folds: the spread of a change of seed), then each of
   ``--patience`` with ``random_state=0``.  Per rule: the median steps per fit; the
   largest change of a time point's fold-mean ``W`` from the reference, its median over
   the strong time points (the top quarter of the reference's scores) and its largest
   there; the correlation of the score curve and of each feature's importance curve with
   the reference's;
2. with ``--tests R``: the analysis with ``n_null=99`` at patience 20 and at each of
   ``--patience``, alternating, ``R`` rounds; CPU seconds of each run and the time points
   family-wise significant per test.

    OMP_NUM_THREADS=1 python benchmarks/bench_patience.py [--patience 10 5 50] [--tests 2]
"""
import argparse
import time
import warnings

import numpy as np
import torch

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs

REFERENCE = 20


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--patience", type=int, nargs="+", default=[10, 5, 50])
    p.add_argument("--tests", type=int, default=0,
                   help="rounds of the analysis with tests (0: none)")
    args = p.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    data, table, times = simulate_epochs(n_trials=200, n_channels=64, n_times=100,
                                         sfreq=100.0, tmin=-0.2, random_state=0)

    def analysis(patience, random_state=0, **kw):
        return mlem_neuro.mlem_array(data, table, times=times, random_state=random_state,
                                     verbose="WARNING", n_jobs=1, patience=patience, **kw)

    ref = analysis(REFERENCE)
    W0 = ref.fold_weights.mean(axis=0)
    strong = ref.score > np.percentile(ref.score, 75)
    print(f"reference: patience {REFERENCE}, random_state=0, median {np.median(ref.n_iter):.0f}"
          f" steps per fit; strong time points: {int(strong.sum())}")
    rows = [(f"patience {REFERENCE}, random_state=1", analysis(REFERENCE, 1))]
    rows += [(f"patience {k}", analysis(k)) for k in args.patience]
    for label, res in rows:
        dW = np.abs(res.fold_weights.mean(axis=0) - W0).max(axis=(1, 2))
        r_imp = " / ".join(f"{np.corrcoef(res.importance[:, k], ref.importance[:, k])[0, 1]:.4f}"
                           for k in range(len(res.terms)))
        print(f"{label:<30s} steps {np.median(res.n_iter):4.0f}; max|dW| {dW.max():.3f}, "
              f"strong times median {np.median(dW[strong]):.3f} (max {dW[strong].max():.3f}); "
              f"score r {np.corrcoef(res.score, ref.score)[0, 1]:.4f}; importance r "
              f"{r_imp} ({', '.join(res.terms)})", flush=True)
    for _ in range(args.tests):
        for k in [REFERENCE, *args.patience]:
            t0 = time.process_time()
            res = analysis(k, n_null=99)
            found = {t: int(res.significant(t).sum()) for t in res.tests}
            print(f"tests, patience {k}: {time.process_time() - t0:.1f} CPU-s; "
                  f"family-wise significant {found}", flush=True)


if __name__ == "__main__":
    main()
