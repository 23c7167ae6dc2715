"""Calibration and power of the non-additivity test (:func:`interaction_test`).

Simulated datasets (:func:`mlem_neuro.simulation.simulate_codes`): every feature coded in
its own orthogonal subspace of 50 units plus Gaussian noise, so the truth is known.

* **Additive codes** (false-positive rate at alpha = 0.05): ``binary`` (3 binary
  features), ``multi-level`` (two 3-level categorical features with equidistant level
  codes and one binary feature), ``numeric`` (3 numeric features, linear codes) and
  ``binary (tiny folds)`` (3 binary features, 24 stimuli: 4-5 held-out stimuli, 6-10
  held-out pairs per fold).  Feature weights are drawn uniformly in [0.5, 1.5] per design
  and the noise level cycles through 0.5, 1, 2 (in units of the distance between two
  levels of a feature).  Numeric datasets have 32 stimuli and 3 folds (their fits cost
  more), the others 48 stimuli and 5 folds unless said.
* **Sub-additive code** (power): 3 binary features, ``f0`` and ``f1`` share one subspace
  with interaction strength ``s`` (pairs differing in both are ``sqrt(2 (1 - s))`` apart,
  pairs differing in one 1 apart: no farther from ``s = 0.5``), noise 1, equal weights.

Categorical datasets come as designs (one feature table) with 10 noise draws each, tested
together as 10 models of one call (the test treats models independently; they share the
stimulus permutations and folds, as the time points of one analysis do); numeric designs
have one dataset each.  Test: ``MLEMOptions(cv=cv)`` (defaults otherwise: SPD with
interactions vs diagonal), ``n_null = 99``; p = (1 + #null >= observed) / (1 + n_null).

Run: ``OMP_NUM_THREADS=1 .venv/bin/python validation/calib_interactions.py [--scale 1]``
(``--scale 0.2`` for a quick look; ``--cost`` times the test against one ``run_cv``); seeds
are fixed, the output is reproducible.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch

from mlem_neuro import interaction as additivity
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.interaction import interaction_test
from mlem_neuro.simulation import simulate_codes

N_UNITS = 50
NOISES = (0.5, 1.0, 2.0)

#: name -> (feature kinds, n_stimuli, cv folds, datasets per design, n_designs at scale 1,
#: interaction strength)
SETTINGS = {
    "binary": (("binary",) * 3, 48, 5, 10, 20, 0.0),
    "multi-level": (("categorical", "categorical", "binary"), 48, 5, 10, 20, 0.0),
    "numeric": (("numeric",) * 3, 32, 3, 1, 200, 0.0),
    "binary (tiny folds)": (("binary",) * 3, 24, 5, 10, 10, 0.0),
    "sub-additive s=0.5": (("binary",) * 3, 48, 5, 10, 5, 0.5),
    "sub-additive s=0.6": (("binary",) * 3, 48, 5, 10, 5, 0.6),
    "sub-additive s=0.7": (("binary",) * 3, 48, 5, 10, 5, 0.7),
    "sub-additive s=0.8": (("binary",) * 3, 48, 5, 10, 5, 0.8),
    "numeric (curved codes)": (("numeric",) * 3, 32, 3, 1, 200, 0.0),
    "numeric x numeric s=2": (("numeric", "numeric", "binary"), 32, 3, 1, 60, 2.0),
    "numeric x numeric s=3": (("numeric", "numeric", "binary"), 32, 3, 1, 60, 3.0),
    "numeric x numeric s=4": (("numeric", "numeric", "binary"), 32, 3, 1, 60, 4.0),
}
#: additive codes whose numeric features are reported cubed: each code is linear in ``x``
#: but concave in the reported value ``x³`` (a main effect the linear term misses)
CURVED = ("numeric (curved codes)",)
#: numeric x numeric interactions: ``f0``, ``f1`` numeric (uniform on [0, 1], linear codes)
#: and ``f2`` binary, plus one unit coding ``s · 4 (f0 − 0.5)(f1 − 0.5)``, noise 1
PRODUCT = ("numeric x numeric s=2", "numeric x numeric s=3", "numeric x numeric s=4")


def design(kinds, n, per_design, strength, seed):
    """One feature table and ``per_design`` noisy datasets of it, ``(K, n, units)``."""
    rng = np.random.default_rng(seed)
    if strength > 0:
        weights, noises = np.ones(len(kinds)), np.ones(per_design)
    else:
        weights = rng.uniform(0.5, 1.5, len(kinds))
        noises = np.full(per_design, NOISES[seed % len(NOISES)])
    code, table = simulate_codes(n, kinds, n_units=N_UNITS, noise=0.0, n_levels=3,
                                 interaction=strength, weights=weights, random_state=rng)
    noise = rng.standard_normal((per_design, n, N_UNITS)) / np.sqrt(N_UNITS)
    return code[None] + noises[:, None, None] * noise, table


def product_design(n, strength, seed):
    """One dataset of :data:`PRODUCT`'s numeric x numeric interaction, ``(1, n, units)``."""
    rng = np.random.default_rng(seed)
    code, table = simulate_codes(n, ("numeric", "numeric", "binary"), n_units=N_UNITS,
                                 noise=0.0, random_state=rng)
    x, y = table["f0"].to_numpy(), table["f1"].to_numpy()
    code[:, -1] = strength * 4 * (x - 0.5) * (y - 0.5)   # a unit the main effects leave
    noise = rng.standard_normal((1, n, N_UNITS)) / np.sqrt(N_UNITS)
    return code[None] + noise, table


def run_setting(name, scale, n_null, alpha, seed0):
    kinds, n, cv, per_design, n_designs, strength = SETTINGS[name]
    n_designs = max(1, int(round(n_designs * scale)))
    pvals = []
    t0 = time.perf_counter()
    for d in range(n_designs):
        seed = seed0 + 1000 * d
        if name in PRODUCT:
            Y, table = product_design(n, strength, seed)
        else:
            Y, table = design(kinds, n, per_design, strength, seed)
        if name in CURVED:
            table = table.assign(**{c: table[c] ** 3 for c in table.columns
                                    if table[c].dtype.kind == "f"})
        opts = MLEMOptions(cv=cv, random_state=seed)
        obs, null = interaction_test(DenseRDMSource(Y), table, opts, n_null=n_null,
                                     random_state=seed + 1)
        pvals.extend((1 + (null >= obs).sum(axis=0)) / (1 + n_null))
        if (d + 1) % 20 == 0:
            print(f"  {name}: {len(pvals)} datasets, {np.sum(np.asarray(pvals) <= alpha)} "
                  f"rejected", file=sys.stderr, flush=True)
    p = np.asarray(pvals)
    rate = float(np.mean(p <= alpha))
    se = np.sqrt(rate * (1 - rate) / len(p))
    return dict(setting=name, n_stimuli=n, cv=cv, n_datasets=len(p), rate=rate, se=float(se),
                mean_p=float(p.mean()), seconds=time.perf_counter() - t0,
                seconds_per_dataset=(time.perf_counter() - t0) / len(p))


def cost(n_null):
    """Seconds of interaction_test and of one run_cv of the same data, side by side."""
    from mlem_neuro.crossval import run_cv

    print(f"cost (n_null={n_null}; other work was running on the machine):")
    for kinds, n, K, cv in ((("binary",) * 3, 48, 1, 5), (("binary",) * 3, 48, 10, 5),
                            (("numeric",) * 3, 32, 1, 3)):
        Y, table = design(kinds, n, K, 0.0, seed=7)
        source, opts = DenseRDMSource(Y), MLEMOptions(cv=cv, random_state=0)
        t0 = time.perf_counter()
        run_cv(source, table, opts)
        t1 = time.perf_counter()
        interaction_test(source, table, opts, n_null=n_null, random_state=0)
        t2 = time.perf_counter()
        print(f"  {kinds[0]:<8} n={n} M={K:<3} cv={cv}: run_cv {t1 - t0:6.2f} s, "
              f"interaction_test {t2 - t1:6.2f} s ({(t2 - t1) / (t1 - t0):.0f}x)",
              flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="fraction of the designs to run (1: >= 200 additive datasets)")
    parser.add_argument("--n-null", type=int, default=99)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated names among " + ", ".join(SETTINGS))
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--numeric-degree", type=int, default=None,
                        help="degree of the numeric features' main effects in the null "
                             "(default: the package's, additivity.NUMERIC_DEGREE; 1: the "
                             "linear code the model sees)")
    parser.add_argument("--cost", action="store_true",
                        help="only time interaction_test against one run_cv")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.numeric_degree is not None:
        additivity.NUMERIC_DEGREE = args.numeric_degree
    if args.cost:
        return cost(args.n_null)
    print(f"n_null={args.n_null}, alpha={args.alpha}, {N_UNITS} units, numeric main effects "
          f"of degree {additivity.NUMERIC_DEGREE} in the null, "
          f"torch {torch.__version__}, 1 thread")
    print(f"{'setting':<22}{'n':>4}{'cv':>4}{'datasets':>10}{'rejection rate':>16}{'± se':>8}"
          f"{'mean p':>8}{'s/dataset':>11}")
    rows = []
    for name in args.settings.split(","):
        seed0 = 10**6 * (list(SETTINGS).index(name) + 1)
        row = run_setting(name, args.scale, args.n_null, args.alpha, seed0)
        rows.append(row)
        print(f"{name:<22}{row['n_stimuli']:>4}{row['cv']:>4}{row['n_datasets']:>10}{row['rate']:>16.3f}"
              f"{row['se']:>8.3f}{row['mean_p']:>8.3f}{row['seconds_per_dataset']:>11.2f}",
              flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
