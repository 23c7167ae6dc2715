"""How many folds the permutation tests read: the first 20 (``n_repeats="auto"``) or all.

``n_repeats="auto"`` gives small designs up to 100 folds (50 repeats of ``cv=2``), and
the tests' null models, most of an analysis's cost, were fitted in every one of them.
Since 2026-11-29 the tests read the first :data:`~mlem_neuro.core.constants.AUTO_TEST_FOLDS`
(20) folds, in whole repeats, while the scores and importances the analysis reports use
every fold (:func:`mlem_neuro.crossval.tested_folds`).  This script measures what that
costs in power, side by side on the same datasets, folds and null relabellings: each
dataset is analysed twice at the defaults (``n_null=99``), once with ``n_repeats="auto"``
(the tests on the first 20 folds) and once with ``n_repeats`` the same number of repeats
given as an int (the tests on all of them; an int ``n_repeats`` draws the same folds and,
after them, the same relabellings).

Designs (``calib_defaults``' time-resolved datasets: 40 trials x 8 channels x 10 time
points of noise smooth in time, two balanced binary features ``A`` and ``B``; 100 folds):

* ``xor``: ``A XOR B`` in time points 3-6 at ``--amplitude`` (``staged_gate.make``): no
  main effect, found only through the importance and the test of interactions;
* ``power``: ``A`` encoded in time points 3-6 at ``--amplitude`` (``calib_defaults.make``);
* ``smooth``: pure noise (false-positive rates).

Power: the fraction of datasets with ``p_fwe < 0.05`` inside the window (3-6), per test;
on noise, the family-wise rate (datasets with any ``p_fwe < 0.05``) and the pointwise
rate.  Each dataset is saved as it comes; ``--report`` prints the table.

    OMP_NUM_THREADS=1 python validation/test_folds.py --design xor --amplitude 0.45 --datasets 100
    OMP_NUM_THREADS=1 python validation/test_folds.py --design power --amplitude 0.5 --datasets 100
    python validation/test_folds.py --report
"""
import argparse
import glob
import os
import tempfile
import warnings

import calib_defaults as cd
import numpy as np
import staged_gate as sg
import torch
from _common import save_each

import mlem_neuro
from mlem_neuro.crossval import resolve_n_repeats

ARMS = ("first 20 folds (auto)", "every fold")


def make(design, seed, amplitude):
    if design == "xor":
        return sg.make("xor", seed, amplitude)
    if design == "power":
        return cd.make("power", seed, amplitude)
    return cd.make("smooth", seed)


def run_one(design, seed, amplitude):
    data, table = make(design, seed, amplitude)
    repeats = resolve_n_repeats("auto", 2, data.shape[0], data.shape[2])
    out = {}
    for arm, n_repeats in zip(ARMS, ("auto", repeats)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = mlem_neuro.mlem_array(data, table, n_null=cd.N_NULL,
                                        random_state=10**6 + seed, n_repeats=n_repeats,
                                        verbose="WARNING")
        out[f"{arm}|p"], out[f"{arm}|p_fwe"] = res.pvalues, res.pvalues_fwe
        out[f"{arm}|folds"] = np.array([res.settings["n_folds"],
                                        res.settings["n_test_folds"]])
        out["tests"] = np.array(res.tests)
    return out


def folder(out, design, amplitude):
    return os.path.join(out, f"folds_{design}_{amplitude:g}")


def collect(design, n_datasets, out, amplitude, part):
    k, n_parts = part
    save_each(folder(out, design, amplitude), range(k - 1, n_datasets, n_parts),
              lambda seed: run_one(design, seed, amplitude), design)


def report(out):
    for where in sorted(glob.glob(os.path.join(out, "folds_*"))):
        files = [f for f in glob.glob(os.path.join(where, "*.npz")) if ".tmp" not in f]
        if not files:
            continue
        power = "smooth" not in where
        tests = list(np.load(files[0])["tests"])
        print(f"\n{os.path.basename(where)}: {len(files)} datasets "
              f"({'power in time points 3-6' if power else 'family-wise / pointwise rate'})")
        for arm in ARMS:
            rows = []
            for f in files:
                z = np.load(f)
                p, p_fwe = z[f"{arm}|p"], z[f"{arm}|p_fwe"]
                if power:
                    rows.append((p_fwe[cd.WINDOW] < 0.05).any(axis=0))
                else:
                    rows.append(np.concatenate([(p_fwe < 0.05).any(axis=0),
                                                (p < 0.05).mean(axis=0)]))
            r = np.mean(rows, axis=0)
            cells = ", ".join(f"{t} {r[i]:.3f}" + ("" if power else f" / {r[len(tests) + i]:.3f}")
                              for i, t in enumerate(tests))
            print(f"  {arm:>22}: {cells}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--design", choices=("xor", "power", "smooth"), default="xor")
    parser.add_argument("--amplitude", type=float, default=0.0)
    parser.add_argument("--datasets", type=int, default=100)
    parser.add_argument("--part", default="1/1", help="k/n: every n-th dataset from k")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "test_folds"))
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.report:
        report(args.out)
        return
    torch.set_num_threads(1)
    k, n = (int(x) for x in args.part.split("/"))
    collect(args.design, args.datasets, args.out, args.amplitude, (k, n))


if __name__ == "__main__":
    main()
