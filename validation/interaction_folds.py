"""How many folds does the test of interactions need?  (issue 38: its cost)

The test of interactions is most of the default tests' time (two fits of every null
dataset on every fold it reads; ``doc/performance.rst``).  It reads the analysis's first
:data:`~mlem_neuro.core.constants.AUTO_TEST_FOLDS` folds.  This script measures its power
and its cost on fewer of them, paired: the same datasets (``feature_statistic.py``'s
designs: 48 stimuli x 24 units, one model), the same folds (the analysis's, drawn by
``run_cv`` at the defaults) and the same residual permutations (the analysis's seed of
the test), only the number of folds read changes (whole repeats of ``cv=2``).  Exact by
construction at any number of folds (a permutation test of residuals), so the question
is power, and it is where the staged default's gate comes from: a feature of an XOR
code is found only where the test opens the gate::

    python validation/interaction_folds.py --datasets 100 --folds 4 10 20
    python validation/interaction_folds.py --report

Each dataset's p-values and CPU seconds are saved as they come (``--out``).
"""
import argparse
import dataclasses
import os
import time
import warnings

import pandas as pd
from _common import add_out_report, reported, wilson
from feature_statistic import make

from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.crossval import run_cv
from mlem_neuro.interaction import interaction_test

N_NULL = 99


def rule_options(rule):
    """``"default"`` or ``"name=value"`` (an option of the fits, e.g. ``patience=5``,
    ``max_steps=30``): the keyword arguments of :class:`MLEMOptions`."""
    if rule == "default":
        return {}
    name, value = rule.split("=")
    number = float(value)
    return {name: int(number) if number.is_integer() and name != "lr" else number}


def run_one(design, a, seed, folds_read, rules=("default",)):
    X, table = make(design, a, seed)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    source = DenseRDMSource(X[None], "euclidean")
    opts = MLEMOptions(n_null=N_NULL, random_state=10**6 + seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the analysis's folds (no tests run); one seed of the test per dataset, so
        # every number of folds reads the same residual permutations
        folds = run_cv(source, table, MLEMOptions(random_state=10**6 + seed)).folds
        seed_int = 10**7 + seed
        rows = []
        for rule, k in ((r, k) for r in rules for k in folds_read):
            t0 = time.process_time()
            obs, null = interaction_test(source, table, dataclasses.replace(
                opts, **rule_options(rule)), n_null=N_NULL, random_state=int(seed_int),
                folds=folds[:k])
            cpu = time.process_time() - t0
            p = float((1 + (null[:, 0] >= obs[0] - 1e-12).sum()) / (1 + N_NULL))
            rows.append(dict(design=design, a=a, seed=seed, rule=rule, folds=k, p=p,
                             cpu=cpu))
    return rows


def report(out):
    frame = pd.concat([pd.read_csv(os.path.join(out, f)) for f in os.listdir(out)
                       if f.endswith(".csv")], ignore_index=True)
    for (design, a), sub in frame.groupby(["design", "a"]):
        print(f"\n{design}, a = {a:g}: rate of p <= 0.05 (the gate) [Wilson 95 %], CPU s")
        if "rule" not in sub:
            sub = sub.assign(rule="default")
        sub = sub.fillna({"rule": "default"})
        base = sub[sub.rule == "default"]
        for (rule, k), g in sub.groupby(["rule", "folds"]):
            ref = base[base.folds == (k if rule != "default" else base.folds.max())]
            ref = ref.set_index("seed").p <= 0.05
            hit = g.set_index("seed").p <= 0.05
            lo, hi = wilson(int(hit.sum()), len(hit))
            both = hit.reindex(ref.index)
            print(f"  {rule:<13s} {k:3d} folds: {hit.mean():.2f} [{lo:.2f}, {hi:.2f}] "
                  f"n={len(hit)}, {g.cpu.mean():.2f} s; only here : only the reference "
                  f"{int((both & ~ref).sum())} : {int((~both & ref).sum())}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", type=int, default=100)
    p.add_argument("--designs", nargs="+", default=["xor"])
    p.add_argument("--amplitudes", nargs="+", type=float, default=[0.2])
    p.add_argument("--folds", nargs="+", type=int, default=[4, 10, 20])
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--rules", nargs="+", default=["default"],
                   help="stopping rules of the fits: default, patience=5, max_steps=30, ...")
    add_out_report(p, "interaction_folds")
    args = p.parse_args()
    if reported(args, report):
        return
    for design in args.designs:
        for a in args.amplitudes:
            for seed in range(args.first_seed, args.first_seed + args.datasets):
                file = os.path.join(args.out, f"{design}_{a:g}_{seed}.csv")
                if not os.path.exists(file):
                    pd.DataFrame(run_one(design, a, seed, args.folds, args.rules)).to_csv(
                        file, index=False)


if __name__ == "__main__":
    main()
