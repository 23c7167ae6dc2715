"""How the conditional test of a feature loses power as another feature tracks it.

The measurement behind :data:`mlem_neuro.core.stimuli.design.CORRELATION_THRESHOLD`.  Two
features ``A`` (binary, balanced) and ``B``, each coded in its own subspace of the units
(level distance 1; a numeric value ``x`` along one axis, ``|Δx|`` apart), plus Gaussian
noise (standard deviation ``noise / sqrt(units)`` per unit, as in
:func:`mlem_neuro.simulation.simulate_codes`).  ``B`` tracks ``A`` more and more:

* ``binary``: ``B`` equals ``A`` on a fraction ``q`` of the stimuli (drawn at random) and
  is an independent balanced bit elsewhere;
* ``strength``: a numeric ``B = q · A · v + (1 - q) · u`` with ``v ~ U(0.5, 1)`` and
  ``u ~ U(0, 1)``: at ``q = 1`` an association strength that is 0 for every "unrelated"
  stimulus (``A`` false) and 0.5-1 for every "related" one; ``fas`` is the design of a
  priming study, ``B = A · U(0.05, 1)`` (one point, no ``q``).

For each point: the mean Spearman correlation ``r`` of the two features' pair distances
(:func:`mlem_neuro.core.stimuli.design.pair_distance_correlations`), and the power of ``A``'s
conditional test (share of datasets with p < 0.05; ``n_null=99``, nominal level 0.05;
a NaN p-value, a test whose null cannot move, counts as not significant)
when only ``A`` is encoded (``A alone``) and when both are, with equal weights (``A+B``:
then also ``B``'s power).  :func:`mlem_neuro.mlem_array` with one time point, ``cv=3``,
feature-level importance without interaction terms.

Also the cost of :func:`mlem_neuro.core.stimuli.design.diagnose_design` on 2,000 stimuli and 6
features (median of 7 calls).

Run (about 35 min on one busy core; the numeric designs take the longest)::

    OMP_NUM_THREADS=1 python validation/design_collinearity.py --datasets 200
"""
import argparse
import time
import warnings

import numpy as np
import pandas as pd
import torch

import mlem_neuro
from mlem_neuro.core.stimuli.design import diagnose_design, pair_distance_correlations
from mlem_neuro.core.stimuli.features import FeatureSpace

FIT = dict(cv=3, max_steps=100, patience=20, n_permutations=2, level="feature",
           interactions=False, verbose="ERROR")
N, UNITS = 48, 16
QS = {"binary": (0.0, 0.5, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0),
      "strength": (0.0, 0.4, 0.6, 0.7, 0.8, 0.9, 1.0)}


def design(kind, q, rng, n=N):
    """Feature table (A, B) and the code value of B (numeric) for one dataset."""
    a = rng.permutation(np.arange(n) % 2).astype(bool)
    if kind == "binary":
        b = rng.permutation(np.arange(n) % 2).astype(bool)
        same = rng.permutation(np.arange(n) < round(q * n))
        b = np.where(same, a, b)
        return pd.DataFrame({"A": a, "B": b}), b.astype(float)
    if kind == "strength":
        b = q * a * rng.uniform(0.5, 1.0, n) + (1 - q) * rng.uniform(0.0, 1.0, n)
    else:  # fas
        b = a * rng.uniform(0.05, 1.0, n)
    return pd.DataFrame({"A": a, "B": b}), b


def dataset(kind, q, encoded, amplitude, noise, seed):
    rng = np.random.default_rng(seed)
    table, b = design(kind, q, rng)
    a = table["A"].to_numpy(float)
    code = np.zeros((N, UNITS))
    code[:, 0] = amplitude * a                      # binary: levels 1 apart
    if encoded == "A+B":
        code[:, 1] = amplitude * b
    data = code + noise / np.sqrt(UNITS) * rng.standard_normal((N, UNITS))
    return data[:, :, None], table


def point(kind, q, encoded, n_datasets, n_null, amplitude, noise):
    r, pa, pb = [], [], []
    for s in range(n_datasets):
        data, table = dataset(kind, q, encoded, amplitude, noise, s)
        enc = FeatureSpace().fit_transform(table)
        r.append(pair_distance_correlations(enc)[0][0, 1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = mlem_neuro.mlem_array(data, table, n_null=n_null,
                                        random_state=10**6 + s, **FIT)
        p = res.pvalues[0]
        pa.append(p[res.tests.index("A")])
        pb.append(p[res.tests.index("B")])
    pa, pb = np.array(pa), np.array(pb)
    return dict(kind=kind, q=q, encoded=encoded, r=float(np.nanmean(r)),
                r_sd=float(np.nanstd(r)), power_A=float(np.mean(pa < 0.05)),
                power_B=float(np.mean(pb < 0.05)) if encoded == "A+B" else np.nan,
                median_p_A=float(np.nanmedian(pa)), untestable_A=int(np.isnan(pa).sum()),
                datasets=n_datasets)


def cost(n=2000, repeats=7):
    rng = np.random.default_rng(0)
    table = pd.DataFrame({
        "category": rng.choice([f"c{k}" for k in range(8)], n),
        "animacy": rng.choice(["animate", "inanimate"], n),
        "size": pd.Categorical(rng.choice(["s", "m", "l"], n), ["s", "m", "l"],
                               ordered=True),
        "frequency": rng.normal(size=n), "length": rng.integers(3, 12, n).astype(float),
        "valence": rng.uniform(size=n)})
    space = FeatureSpace().fit(table)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        diagnose_design(table, space)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), float(np.min(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=int, default=100)
    ap.add_argument("--n-null", type=int, default=99)
    ap.add_argument("--amplitude", type=float, default=1.0)
    ap.add_argument("--noise", type=float, default=1.0)
    ap.add_argument("--only", choices=("binary", "strength", "fas", "cost"), default=None)
    ap.add_argument("--csv", default=None, help="write the table here too")
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch threads 1; {N} stimuli, {UNITS} units, amplitude {args.amplitude}, "
          f"noise {args.noise}, n_null {args.n_null}, {args.datasets} datasets per point")
    if args.only in (None, "cost"):
        med, best = cost()
        print(f"diagnose_design on 2,000 stimuli x 6 features: median {med:.3f} s "
              f"(best {best:.3f} s)")
    rows = []
    kinds = ("binary", "strength", "fas") if args.only in (None,) else (args.only,)
    for kind in kinds if args.only != "cost" else ():
        for q in QS.get(kind, (np.nan,)):
            for encoded in ("A alone", "A+B"):
                t0 = time.perf_counter()
                row = point(kind, q, encoded, args.datasets, args.n_null, args.amplitude,
                            args.noise)
                rows.append(row)
                print(f"{kind:8s} q={q:4.2f} {encoded:7s}: r = {row['r']:.3f} "
                      f"(sd {row['r_sd']:.3f}), power A {row['power_A']:.2f}, "
                      f"power B {row['power_B']:.2f}, median p(A) "
                      f"{row['median_p_A']:.3f}, A untestable (NaN) in "
                      f"{row['untestable_A']}  [{time.perf_counter() - t0:.0f} s]",
                      flush=True)
    if rows and args.csv:
        pd.DataFrame(rows).to_csv(args.csv, index=False)


if __name__ == "__main__":
    main()
