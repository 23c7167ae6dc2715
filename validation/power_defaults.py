"""Power and calibration of MLEM's feature test at its defaults, beside a Mantel test.

The design of issue 30: a weak binary feature ``B`` beside a strong independent one
``A`` (balanced, orthogonal: every A x B cell holds a quarter of the stimuli), one time
point, ``X = noise + a_A * A * v_A + a_B * B * v_B`` with unit patterns ``v ~ N(0, 1)``
and noise ``N(0, 1)``.  ``a_B = 0`` measures the false-positive rate of ``B``.  On every
dataset:

* MLEM: :func:`mlem_neuro.mlem_array` with ``n_null=99``, the p-value of ``B`` (its
  conditional test), at each setting of ``--settings`` (``cv:n_repeats``;
  ``default`` = the package defaults, whatever they are);
* a Mantel test of ``B`` (Spearman of the Euclidean neural RDM with ``B``'s model RDM,
  one-sided, 999 permutations) and a partial Mantel test (``A``'s model RDM removed),
  :func:`mlem_neuro.rsa.mantel_tests`.

Rates at alpha = 0.05 with Wilson 95 % intervals; each dataset's p-values are saved as
they come (``--out``), so a run can be stopped, resumed, or split over processes
(``--part k/K``); ``--report`` prints the tables.  One core per process::

    OMP_NUM_THREADS=1 python validation/power_defaults.py --part 1/2 &
    OMP_NUM_THREADS=1 python validation/power_defaults.py --part 2/2
    python validation/power_defaults.py --report
"""
import argparse
import os
import tempfile
import time
import warnings

import numpy as np
import pandas as pd
import torch
from _common import part, wilson

import mlem_neuro
from mlem_neuro import rsa

ALPHA = 0.05
N_NULL = 99
N_PERM = 999
#: (stimuli, units, amplitude of A, amplitudes of B)
SIZES = {"48x24": (48, 24, 0.5, (0.0, 0.2, 0.3, 0.4)),
         "96x48": (96, 48, 0.4, (0.0, 0.1, 0.15, 0.2))}


def make(n, units, a_A, a_B, seed):
    rng = np.random.default_rng(seed)
    cells = np.repeat(np.arange(4), n // 4)[rng.permutation(n)]
    A, B = cells // 2, cells % 2
    X = rng.normal(size=(n, units))
    X += a_A * A[:, None] * rng.normal(size=units) + a_B * B[:, None] * rng.normal(size=units)
    table = pd.DataFrame(dict(A=np.where(A, "a1", "a0"), B=np.where(B, "b1", "b0")))
    return X, table


def parse_setting(text):
    if text == "default":
        return {}
    cv, reps = text.split(":")
    return dict(cv=None if cv == "none" else int(cv),
                n_repeats=reps if reps == "auto" else int(reps))


def run_one(size, a_B, seed, settings):
    n, units, a_A, _ = SIZES[size]
    X, table = make(n, units, a_A, a_B, seed)
    rows = []
    t0 = time.process_time()
    frame = rsa.mantel_tests(X, table, N_PERM, 3 * 10**6 + seed)
    cpu = time.process_time() - t0
    rows.append(dict(method="Mantel", p=frame.loc["B", "p"], cpu=cpu))
    rows.append(dict(method="partial Mantel", p=frame.loc["B", "p_partial"], cpu=cpu))
    for label in settings:
        t0 = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = mlem_neuro.mlem_array(X[:, :, None], table, n_null=N_NULL,
                                        random_state=10**6 + seed, verbose="WARNING",
                                        **parse_setting(label))
        rows.append(dict(method=f"MLEM {label}", p=float(res.pvalues[0, res.tests.index("B")]),
                         cpu=time.process_time() - t0,
                         n_repeats=res.settings.get("n_repeats")))
    for r in rows:
        r.update(size=size, a_B=a_B, seed=seed)
    return rows


def report(out, rst=False):
    files = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".csv")]
    frame = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    if rst:
        return report_rst(frame)
    for size, sub in frame.groupby("size"):
        print(f"\n{size} (stimuli x units), a_A = {SIZES[size][2]}: rate of p < {ALPHA} "
              "for B [Wilson 95 %], datasets; CPU s per dataset")
        for method, m in sub.groupby("method", sort=False):
            cells = []
            for a_B, g in m.groupby("a_B"):
                k, N = int((g.p < ALPHA).sum()), len(g)
                lo, hi = wilson(k, N)
                cells.append(f"a_B={a_B:g}: {k / N:.2f} [{lo:.2f}, {hi:.2f}] n={N}")
            print(f"  {method:<18s} " + " | ".join(cells) + f" | {m.cpu.mean():.2f} s")


def report_rst(frame):
    """One reStructuredText table: rows size x method, columns a_B (rate [interval])."""
    rows = []
    for (size, method), m in frame.groupby(["size", "method"], sort=False):
        cells = [f"{size}", method]
        for a_B, g in m.groupby("a_B"):
            k, N = int((g.p < ALPHA).sum()), len(g)
            lo, hi = wilson(k, N)
            cells.append(f"{k / N:.2f} ({lo:.2f}–{hi:.2f}) n={N}")
        cells.append(f"{m.cpu.mean():.2f}")
        rows.append(cells)
    width = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    sep = "  ".join("=" * w for w in width)
    print(sep)
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, width)).rstrip())
    print(sep)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", type=int, default=100)
    p.add_argument("--null-datasets", type=int, default=100,
                   help="datasets at a_B = 0 (calibration)")
    p.add_argument("--sizes", nargs="+", default=list(SIZES))
    p.add_argument("--settings", nargs="+", default=["5:1", "default"],
                   help="MLEM settings, cv:n_repeats or 'default'")
    p.add_argument("--part", type=part, default=(1, 1),
                   help="k/K: this process runs every K-th dataset, from the k-th (1 <= k <= K)")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "power_defaults"))
    p.add_argument("--report", action="store_true")
    p.add_argument("--rst", action="store_true", help="with --report: one RST table")
    args = p.parse_args()
    if args.report:
        report(args.out, args.rst)
        return
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    k, K = args.part
    # seed-major: a run stopped early leaves every cell with about as many datasets
    jobs = sorted(((size, a_B, seed) for size in args.sizes for a_B in SIZES[size][3]
                   for seed in range(args.null_datasets if a_B == 0 else args.datasets)),
                  key=lambda job: (job[2], job[0], job[1]))
    for i, (size, a_B, seed) in enumerate(jobs):
        if i % K != k - 1:
            continue
        fname = os.path.join(args.out, f"{size}_{a_B:g}_{seed}.csv")
        if os.path.exists(fname):
            continue
        pd.DataFrame(run_one(size, a_B, seed, args.settings)).to_csv(fname, index=False)


if __name__ == "__main__":
    main()
