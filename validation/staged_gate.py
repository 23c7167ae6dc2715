"""Where the staged feature test opens its gate: rules side by side on the same datasets.

The default feature test (``feature_test="staged"``) reads a feature's main effect alone,
and adds its held-out importance in the models where the test of interactions finds
interactions (the gate).  The gate is read on the observed data, so where a chance
interaction opens it the importance, which sees the same chance structure, rejects more
often than its nominal rate.  This script measures the gate rules side by side on
``calib_defaults``' time-resolved datasets (40 trials x 8 channels x 10 time points of
noise smooth in time, two balanced binary features ``A`` and ``B``, ``n_null=99``, every
other option at its default):

* ``smooth``: pure noise (``calib_defaults.make("smooth", seed)``, the same datasets and
  analysis seeds as ``calib_defaults.py --only smooth``): false-positive rates;
* ``xor``: ``A XOR B`` encoded in time points 3-6 (a unit-RMS pattern per value of the
  XOR, times ``--amplitude`` and the Hann envelope of ``calib_defaults``' power design):
  no main effect, so a feature is found only through the importance.

Each dataset is analysed once with ``feature_test="combined"`` (every feature's null
models fitted in every model) and its parts are saved: each feature's importance and
main effect (observed and null, the same null datasets) and the test of interactions
(observed and null).  The staged statistic of any gate is then
:func:`mlem_neuro.core.scoring.main_effect.staged` of those parts, so every rule is read
on the same data, folds and relabellings:

* the main effect alone (the gate never opens);
* the gate at p <= 0.05 per model (the default until 2026-11-29);
* the gate at p <= 0.01 per model;
* the gate at a family-wise p <= 0.05 over the models (the default since);
* the combined test (the gate always open).

False-positive rates are the pointwise rate (p < 0.05 over datasets x time points, a
bootstrap interval over datasets) and the family-wise rate (datasets with any
``p_fwe < 0.05``, Wilson interval); power is the fraction of datasets with ``p_fwe <
0.05`` inside the window.  With 99 nulls p < 0.05 means p <= 0.04 (nominal 0.04).  The
main effect alone needs no training and is measured on 1000 datasets per design by
``calib_defaults.py --main-only``.

Run (one process per design, each dataset saved as it comes; about 75 s of CPU per
dataset)::

    OMP_NUM_THREADS=1 python validation/staged_gate.py --design smooth --datasets 300
    OMP_NUM_THREADS=1 python validation/staged_gate.py --design xor --amplitude 0.45 --datasets 200
    python validation/staged_gate.py --report
"""
import argparse
import glob
import os
import tempfile
import warnings

import calib_defaults as cd
import numpy as np
import pandas as pd
import torch
from _common import save_each

import mlem_neuro
import mlem_neuro.inference as inference
from mlem_neuro.core.scoring.main_effect import staged
from mlem_neuro.core.scoring.nulls import permutation_pvalues

FEATURES = ("A", "B")
RULES = {
    "main effect alone": lambda p, p_fwe: np.zeros_like(p, bool),
    "gate p <= 0.05": lambda p, p_fwe: p <= 0.05,
    "gate p <= 0.01": lambda p, p_fwe: p <= 0.01,
    "gate FWE p <= 0.05": lambda p, p_fwe: p_fwe <= 0.05,
    "combined (always)": lambda p, p_fwe: np.ones_like(p, bool),
}


def make(design, seed, amplitude):
    """Data (trials x channels x times) and feature table of one dataset."""
    if design == "smooth":
        return cd.make("smooth", seed)
    rng = np.random.default_rng([99, int(round(amplitude * 1000)), seed])
    data = cd.smooth_noise(rng)
    table = pd.DataFrame({"A": cd.balanced(rng), "B": cd.balanced(rng)})
    patterns = cd.unit_patterns(rng, 2)
    code = (table["A"].to_numpy() ^ table["B"].to_numpy()).astype(int)
    data[:, :, cd.WINDOW] += amplitude * patterns[code][:, :, None] * cd.ENVELOPE[None, None]
    return data, table


def folder(out, design, amplitude):
    return os.path.join(out, f"parts_{design}_{amplitude:g}")


def run_one(design, seed, amplitude):
    """The parts of one dataset's analysis (``feature_test="combined"``)."""
    data, table = make(design, seed, amplitude)
    captured = {}
    original = inference._stage_feature_tests

    def capture(out, gate):                 # the fold loop's output, before staging
        captured["out"] = out
        return original(out, gate)

    inference._stage_feature_tests = capture
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = mlem_neuro.mlem_array(data, table, n_null=cd.N_NULL,
                                        random_state=10**6 + seed,
                                        feature_test="combined", verbose="WARNING")
    finally:
        inference._stage_feature_tests = original
    out = captured["out"]
    arrays = {}
    for name, parts in out.parts.items():
        for kind in ("importance", "main_effect"):
            arrays[f"{name}|{kind}|obs"] = np.asarray(parts[kind][0])
            arrays[f"{name}|{kind}|null"] = np.asarray(parts[kind][1])
    obs, null = out.tests["interactions"]
    arrays["interactions|obs"], arrays["interactions|null"] = np.asarray(obs), np.asarray(null)
    arrays["combined_p"], arrays["combined_p_fwe"] = res.pvalues, res.pvalues_fwe
    arrays["tests"] = np.array(res.tests)
    return arrays


def collect(design, n_datasets, out, amplitude):
    save_each(folder(out, design, amplitude), range(n_datasets),
              lambda seed: run_one(design, seed, amplitude), design)


def saved(where):
    """The datasets saved in ``where``, in seed order (files being written left out)."""
    files = [f for f in glob.glob(os.path.join(where, "*.npz")) if ".tmp" not in f]
    return sorted(files, key=lambda f: int(os.path.basename(f).split(".")[0]))


def read_rules(where):
    """Per rule and feature the (p, p_fwe) of every saved dataset (datasets x times),
    the test of interactions' (p, p_fwe) and each rule's open cells."""
    files = saved(where)
    p = {r: {f: [] for f in FEATURES} for r in RULES}
    p_fwe = {r: {f: [] for f in FEATURES} for r in RULES}
    opened = {r: [] for r in RULES}
    inter = ([], [])
    for file in files:
        z = np.load(file)
        _, pi, pi_fwe = permutation_pvalues({"i": (z["interactions|obs"],
                                                   z["interactions|null"])})
        inter[0].append(pi[:, 0])
        inter[1].append(pi_fwe[:, 0])
        for rule, gate_of in RULES.items():
            with np.errstate(invalid="ignore"):
                gate = gate_of(pi[:, 0], pi_fwe[:, 0])
            opened[rule].append(gate)
            tests = {f: staged((z[f"{f}|importance|obs"], z[f"{f}|importance|null"]),
                               (z[f"{f}|main_effect|obs"], z[f"{f}|main_effect|null"]),
                               gate) for f in FEATURES}
            _, pr, pr_fwe = permutation_pvalues(tests)
            for j, f in enumerate(FEATURES):
                p[rule][f].append(pr[:, j])
                p_fwe[rule][f].append(pr_fwe[:, j])
    stack = np.stack
    return (len(files), {r: {f: (stack(p[r][f]), stack(p_fwe[r][f])) for f in FEATURES}
                         for r in RULES} if files else {},
            tuple(stack(x) for x in inter) if files else None,
            {r: stack(g) for r, g in opened.items()} if files else {})


def report(out):
    for where in sorted(glob.glob(os.path.join(out, "parts_*"))):
        n, rules, inter, opened = read_rules(where)
        if not n:
            continue
        power = "parts_xor" in where
        print(f"\n{os.path.basename(where)}: {n} datasets")
        pi, pi_fwe = inter
        if power:
            k = int((pi_fwe[:, cd.WINDOW] < 0.05).any(axis=1).sum())
            print(f"  test of interactions: FWE power in the window {k / n:.3f} ({k}/{n})")
        else:
            r = cd.rates(pi, pi_fwe)
            print(f"  test of interactions: pointwise {r['rate']:.3f}, FWE {r['fwe']:.3f}")
        for rule in RULES:
            g = opened[rule]
            line = (f"  {rule:20s} open cells {int(g.sum()):4d} "
                    f"(in {int(g.any(axis=1).sum()):3d} datasets)")
            for f in FEATURES:
                p, p_fwe = rules[rule][f]
                if power:
                    k = int((p_fwe[:, cd.WINDOW] < 0.05).any(axis=1).sum())
                    line += f" | {f} FWE power {k / n:.3f} ({k}/{n})"
                else:
                    r = cd.rates(p, p_fwe)
                    line += (f" | {f} pointwise {r['rate']:.3f} ({cd.fmt(r['boot'])}) "
                             f"FWE {r['fwe']:.3f} ({cd.fmt(r['fwe_wilson'])})")
            print(line)
        if not power:
            print("  analyses of more models, emulated from these null datasets:")
            many_models(where)
            main = rules["main effect alone"]
            for rule in RULES:
                added = [int(((rules[rule][f][1] < 0.05).any(axis=1)
                              & ~(main[f][1] < 0.05).any(axis=1)).sum()) for f in FEATURES]
                print(f"  {rule:20s} datasets family-wise significant that the main "
                      f"effect alone is not: A {added[0]}, B {added[1]}")


def many_models(where, sizes=(1, 5, 20), n_analyses=300, seed=0):
    """How often each gate opens somewhere in an analysis of many models, emulated from
    the saved null datasets: ``k`` datasets drawn without replacement, their 10 time
    points each, make one analysis of ``10 k`` models (the test of interactions'
    family-wise p over all of them).  The pseudo-analyses share datasets, so only the
    fractions where the gate opens are read from them, not the features' rates."""
    files = saved(where)
    inter = [np.load(f) for f in files]
    obs = [z["interactions|obs"] for z in inter]
    null = [z["interactions|null"] for z in inter]
    rng = np.random.default_rng(seed)
    for k in sizes:
        n = len(files) if k == 1 else n_analyses
        counts = {"gate p <= 0.05": 0, "gate FWE p <= 0.05": 0}
        for rep in range(n):
            idx = [rep] if k == 1 else rng.choice(len(files), k, replace=False)
            _, p, p_fwe = permutation_pvalues({"i": (
                np.concatenate([obs[i] for i in idx]),
                np.concatenate([null[i] for i in idx], axis=1))})
            counts["gate p <= 0.05"] += bool((p[:, 0] <= 0.05).any())
            counts["gate FWE p <= 0.05"] += bool((p_fwe[:, 0] <= 0.05).any())
        print(f"  {10 * k:4d} models ({n} analyses): the gate opens somewhere in "
              + ", ".join(f"{c / n:.2f} ({rule})" for rule, c in counts.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--design", choices=("smooth", "xor"), default="smooth")
    parser.add_argument("--amplitude", type=float, default=None,
                        help="of the XOR code (default 0.45; 0 for smooth)")
    parser.add_argument("--datasets", type=int, default=100)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "staged_gate"))
    parser.add_argument("--report", action="store_true")
    args = parser.parse_args()
    if args.report:
        report(args.out)
        return
    amplitude = args.amplitude if args.amplitude is not None else (
        0.45 if args.design == "xor" else 0.0)
    torch.set_num_threads(1)
    collect(args.design, args.datasets, args.out, amplitude)


if __name__ == "__main__":
    main()
