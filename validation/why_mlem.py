"""Why MLEM, measured: MLEM's permutation tests and W recovery beside RSA on the same data.

One time point, one region: each dataset is an array ``(48 stimuli, 24 units, 1)``.  On
every dataset three families of test ask whether each feature is encoded:

* MLEM: ``mlem_array(data, table, n_null=99)``, the p-value of each feature (its
  conditional test), at the package's former defaults (``cv=5, n_repeats=1``: "MLEM")
  and at the setting issue 30 found more powerful (``cv=2, n_repeats=20``: "MLEM 2x20";
  the defaults are now ``cv=2, n_repeats="auto"``, 50 repeats for these designs);
* a Mantel test per feature: Spearman between the Euclidean neural RDM and the feature's
  model RDM (0/1 for a binary feature, ``|difference|`` for a numeric one), one-sided,
  999 permutations of the stimuli;
* a partial Mantel test per feature: Spearman partial correlation (ranks residualised on
  the ranks of the other features' model RDMs), the neural RDM's stimuli permuted (999).

Designs (``--only``), each with its own noise ``X ~ N(0, 1)`` and a random unit pattern
``v ~ N(0, 1)`` (24 units) carrying the code ``X += amplitude * code[:, None] * v``:

* ``one``: one balanced binary feature ``A``, ``code = A`` (RSA should match MLEM);
  ``weak``: the same at a smaller amplitude (power off the ceiling).
* ``correlated``: ``A`` encoded as above; ``B`` equals ``A`` on a random 70 % of the
  stimuli and is a fair coin elsewhere, and is not encoded: the rate at which each method
  declares ``B`` significant is its false-positive rate for a feature that only tracks an
  encoded one (partialling matters).
* ``xor``: ``A`` and ``B`` balanced and orthogonal (12 stimuli per cell), ``code = A xor
  B``: neither feature has a main effect on the geometry; pairs that differ in both are
  as close as pairs that differ in neither.  The power to call ``A`` (or ``B``)
  significant, and MLEM's test of interactions.
* ``saturating``: a numeric feature ``x ~ U(0, 1)``, ``code = 1 - exp(-x / 0.1)`` (most
  of the change below ``x = 0.2``).

Recovery (``--only recovery``): ``simulate_representations(kind="realisable")``, 48
stimuli, 4 features, binary and numeric, one split (a fifth held out), FR-RSA
(``constraint="diagonal"``), FR-RSA-I (``"none"``) and MLEM (``"spd"``): Frobenius
distance of ``W_`` to ``W_true`` and held-out Spearman
(:func:`mlem_neuro.demo.simulation_table`).

Every rate comes with its Wilson 95 % interval.  Each dataset's results are saved as they
come (``--out``), so a run can be stopped and resumed; ``--report`` prints the tables.
Run on one core::

    OMP_NUM_THREADS=1 python validation/why_mlem.py --datasets 60
    python validation/why_mlem.py --report
"""
import argparse
import os
import time
import warnings

import numpy as np
import pandas as pd
from _common import add_out_report, reported, wilson

import mlem_neuro
from mlem_neuro import rsa

N_STIM, N_UNITS = 48, 24
N_NULL = 99            # MLEM's nulls
N_PERM = 999           # Mantel permutations
ALPHA = 0.05
AMPLITUDE = dict(one=0.35, weak=0.22, correlated=0.35, xor=0.5, saturating=1.0)
DESIGNS = ("one", "weak", "correlated", "xor", "saturating")
MLEM_SETTINGS = {"MLEM": dict(cv=5, n_repeats=1),         # the former defaults, as recorded
                 "MLEM 2x20": dict(cv=2, n_repeats=20)}


def make(design, seed, amplitude=None):
    """Data ``(n, units, 1)``, the feature table, and the names of the encoded features."""
    amplitude = AMPLITUDE[design] if amplitude is None else amplitude
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N_STIM, N_UNITS))
    v = rng.normal(size=N_UNITS)
    half = np.repeat([0, 1], N_STIM // 2)
    if design == "xor":
        cells = np.repeat(np.arange(4), N_STIM // 4)[rng.permutation(N_STIM)]
        A, B = cells // 2, cells % 2
        code = (A ^ B).astype(float)
        table = pd.DataFrame(dict(A=np.where(A, "a1", "a0"), B=np.where(B, "b1", "b0")))
        encoded = ()
    elif design == "saturating":
        x = rng.uniform(size=N_STIM)
        code = 1 - np.exp(-x / 0.1)
        table = pd.DataFrame(dict(x=x))
        encoded = ("x",)
    else:
        A = rng.permutation(half)
        code = A.astype(float)
        table = pd.DataFrame(dict(A=np.where(A, "a1", "a0")))
        encoded = ("A",)
        if design == "correlated":
            B = np.where(rng.uniform(size=N_STIM) < 0.7, A, rng.integers(0, 2, N_STIM))
            table["B"] = np.where(B, "b1", "b0")
    X += amplitude * code[:, None] * v
    return X[:, :, None], table, encoded


def mantel_tests(X, table, seed):
    """Mantel and partial Mantel p-values of every feature (one-sided, greater), the same
    ``N_PERM`` permutations of the stimuli for all (:func:`mlem_neuro.rsa.mantel_tests`)."""
    frame = rsa.mantel_tests(X, table, N_PERM, seed)
    out = {}
    for name, row in frame.iterrows():
        out[("Mantel", name)] = row["p"]
        out[("partial Mantel", name)] = row["p_partial"]
    return out


def run_one(design, seed):
    """One dataset: every method's p-value of every feature (and MLEM's interaction test),
    and CPU seconds per method."""
    X, table, _ = make(design, seed)
    rows = []
    t0 = time.process_time()
    mantel = mantel_tests(X[:, :, 0], table, seed=3 * 10**6 + seed)
    cpu = (time.process_time() - t0) / 2
    for (method, name), p in mantel.items():
        rows.append(dict(design=design, seed=seed, method=method, test=name, p=p, cpu=cpu))
    for label, kwargs in MLEM_SETTINGS.items():
        t0 = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = mlem_neuro.mlem_array(X, table, n_null=N_NULL, random_state=10**6 + seed,
                                        verbose="WARNING", **kwargs)
        cpu = time.process_time() - t0
        for name in res.tests:
            if name == "score":
                continue
            rows.append(dict(design=design, seed=seed, method=label, test=name,
                             p=float(res.pvalues[0, res.tests.index(name)]), cpu=cpu))
        rows.append(dict(design=design, seed=seed, method=label, test="(held-out rho)",
                         p=float(np.ravel(res.score)[0]), cpu=cpu))
    return rows


def run_recovery(out, seeds, noise):
    from mlem_neuro.demo import simulation_table as _simulation_table

    for feature_type in ("binary", "numeric"):
        fname = os.path.join(out, f"recovery_{feature_type}.csv")
        if os.path.exists(fname):
            continue
        t0 = time.process_time()
        table = _simulation_table(N_STIM, 4, noise, range(seeds), lambda *a: None,
                                  kind="realisable", feature_type=feature_type)
        table["feature_type"] = feature_type
        table["cpu_total"] = time.process_time() - t0
        table.to_csv(fname, index=False)
        print(f"recovery {feature_type}: {time.process_time() - t0:.0f} s CPU", flush=True)


def report(out):
    fnames = sorted(f for f in os.listdir(out) if f.startswith("tests_"))
    if fnames:
        z = pd.concat([pd.read_csv(os.path.join(out, f)) for f in fnames])
        tests = z[z["test"] != "(held-out rho)"]
        lines = []
        for (design, test, method), g in tests.groupby(["design", "test", "method"],
                                                       sort=False):
            k, n = int((g["p"] < ALPHA).sum()), len(g)
            lo, hi = wilson(k, n)
            lines.append(dict(design=design, feature=test, method=method, n=n,
                              rate=k / n, ci=f"[{lo:.2f}, {hi:.2f}]",
                              cpu_s=g["cpu"].mean()))
        lines = pd.DataFrame(lines)
        order = {d: i for i, d in enumerate(DESIGNS)}
        lines = lines.sort_values(["design", "feature"], key=lambda s: s.map(
            lambda v: order.get(v, v) if s.name == "design" else v), kind="stable")
        print(f"rate of p < {ALPHA} (power, or false positives where the feature is not "
              "encoded), Wilson 95 % intervals, mean CPU s per analysis")
        print(lines.round(3).to_string(index=False))
        rho = z[z["test"] == "(held-out rho)"].groupby(["design", "method"])["p"].mean()
        print("\nmean held-out Spearman of MLEM\n" + rho.round(3).to_string())
    for feature_type in ("binary", "numeric"):
        fname = os.path.join(out, f"recovery_{feature_type}.csv")
        if not os.path.exists(fname):
            continue
        t = pd.read_csv(fname)
        s = t.groupby(["noise", "model"], sort=False).agg(
            n=("seed", "size"), error=("frobenius_error", "mean"),
            error_sd=("frobenius_error", "std"), rho=("test_spearman", "mean"),
            rho_sd=("test_spearman", "std"), seconds=("seconds", "mean"))
        print(f"\nrecovery, {feature_type} features (48 stimuli, 4 features, 9 held out); "
              f"CPU {t['cpu_total'].iloc[0]:.0f} s in all")
        print(s.round(3).to_string())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", type=int, default=60)
    p.add_argument("--only", nargs="+", default=[*DESIGNS, "recovery"])
    p.add_argument("--recovery-seeds", type=int, default=100)
    p.add_argument("--noise", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    add_out_report(p, "why_mlem")
    args = p.parse_args()
    if reported(args, report):
        return
    designs = [d for d in args.only if d != "recovery"]
    for seed in range(args.datasets if designs else 0):   # designs interleaved: balanced
        for design in designs:
            fname = os.path.join(args.out, f"tests_{design}_{seed:04d}.csv")
            if os.path.exists(fname):
                continue
            pd.DataFrame(run_one(design, seed)).to_csv(fname, index=False)
        print(f"dataset {seed + 1} of {args.datasets} done", flush=True)
    if "recovery" in args.only:
        run_recovery(args.out, args.recovery_seeds, args.noise)
    report(args.out)


if __name__ == "__main__":
    main()
