"""Calibration and power of the single-subject permutation tests at the default settings.

``validation/calib_null.py`` measured the tests (``n_null``) with short fits (``cv=3,
max_steps=100, patience=20, n_permutations=2``). This script runs
``mlem_array(data, table, n_null=99, random_state=...)`` with every other option at its
default (``cv=2, n_repeats="auto", max_steps=1000, patience=50, lr=0.03,
n_permutations=10``, ``level="feature"``, ``null="conditional"``; the defaults were
``cv=5``, one repeat, before issue 30) on small time-resolved simulated datasets
(40 trials x 8 channels x 10 time points) whose noise is smooth in time: white noise
convolved along time with a Gaussian kernel (sd :data:`SMOOTH_SD` samples, scaled to unit
variance), as sensor data are.

Designs (``--only``):

* ``smooth``: pure noise, two balanced binary features ``A`` and ``B`` (every null true).
* ``unbalanced``: pure noise, binary ``A`` true in 10 of 40 trials (25/75), ``B`` balanced.
* ``levels``: pure noise, categorical ``C`` with 3 levels of 20, 12 and 8 trials, ``B``
  balanced binary.
* ``other``: ``B`` (balanced binary) strongly encoded at every time point, ``A`` (balanced
  binary) not: the rates of ``A``'s conditional null and of the test of interactions (the
  truth is additive).
* ``power``: ``A`` encoded in time points 3-6 (a Hann envelope) at ``--amplitudes``, ``B``
  never encoded: how often ``A`` is FWE-significant inside the window, outside it (false
  positives), and ``B`` anywhere; side by side, on the same data, a plain RSA Mantel test of
  ``A``: Spearman between the Euclidean neural RDM and ``A``'s 0/1 model RDM, 99
  permutations of the stimuli, the maximum over time points for the FWE p-value.

The noise designs also report the Mantel test of their first feature on the same data.

``--main-only`` measures the main-effect part of the staged default test alone (what a
feature's test is where the test of interactions keeps the gate shut): each feature's
partial rank correlation against 99 conditional relabellings, drawn as the analysis draws
them (:func:`~mlem_neuro.core.scoring.nulls.null_permutations`), per time point, the
family-wise p-value against the maximum over time points; no training, so 1000 datasets
of a noise design take a minute::

    python validation/calib_defaults.py --main-only --datasets 1000

Every rate is reported with its Wilson 95 % interval. The pointwise rate (over datasets x
time points) has two: Wilson over all the (dataset, time point) cells, which treats them
as independent and is too narrow (the time points of a dataset share its smooth noise,
design, folds and relabellings), and a bootstrap over datasets. The FWE rate's Wilson
interval is over datasets (independent). With 99 nulls p < 0.05 means p <= 0.04: the
nominal rate is 0.04.

Each dataset's p-values are saved as they come (``--out``), so a run can be stopped and
resumed; ``--report`` prints the tables from what was saved. The method page's run (one
core, about 50 CPU-minutes; the second command adds 100 datasets to each noise design)::

    OMP_NUM_THREADS=1 python validation/calib_defaults.py --datasets 300 --power-datasets 150
    for d in smooth unbalanced levels; do
        OMP_NUM_THREADS=1 python validation/calib_defaults.py --only $d --datasets 400
    done
    python validation/calib_defaults.py --report
"""
import argparse
import os
import tempfile
import time
import warnings

import numpy as np
import pandas as pd
import torch
from scipy import ndimage, stats
from scipy.spatial.distance import pdist

import mlem_neuro

N_TRIALS, N_CHANNELS, N_TIMES = 40, 8, 10
#: options of the analyses other than the defaults (``--patience``: another stopping rule
#: measured side by side; give it its own ``--out``)
OPTIONS = {}
SMOOTH_SD = 2.0                     # samples
N_NULL = 99
WINDOW = np.arange(3, 7)            # time points where A is encoded in ``power``
ENVELOPE = np.hanning(len(WINDOW) + 2)[1:-1]
DESIGNS = ("smooth", "unbalanced", "levels", "other", "power")
OTHER_AMPLITUDE = 1.0


def smooth_noise(rng, n=N_TRIALS, C=N_CHANNELS, T=N_TIMES, sd=SMOOTH_SD):
    """White noise convolved along time with a Gaussian kernel of ``sd`` samples (unit
    L2 norm, so the noise keeps unit variance); computed on a longer epoch and cropped so
    that no edge is treated apart."""
    half = int(np.ceil(4 * sd))
    kernel = np.exp(-0.5 * (np.arange(-half, half + 1) / sd) ** 2)
    kernel /= np.linalg.norm(kernel)
    white = rng.standard_normal((n, C, T + 2 * half))
    return ndimage.convolve1d(white, kernel, axis=2, mode="constant")[:, :, half:half + T]


def balanced(rng, n=N_TRIALS, true=None):
    """Binary feature true in exactly ``true`` trials (default: half), shuffled."""
    true = n // 2 if true is None else true
    return rng.permutation(np.arange(n) < true)


def unit_patterns(rng, k, C=N_CHANNELS):
    """``k`` random spatial patterns of unit RMS over channels."""
    p = rng.standard_normal((k, C))
    return p / np.sqrt((p ** 2).mean(axis=1, keepdims=True))


def make(design, seed, amplitude=0.0):
    """Data (trials x channels x times) and feature table of one dataset."""
    rng = np.random.default_rng([DESIGNS.index(design), int(round(amplitude * 1000)), seed])
    data = smooth_noise(rng)
    if design == "unbalanced":
        table = pd.DataFrame({"A": balanced(rng, true=N_TRIALS // 4), "B": balanced(rng)})
    elif design == "levels":
        codes = rng.permutation(np.repeat(np.arange(3), (20, 12, 8)))
        table = pd.DataFrame({"C": pd.Categorical([f"L{c}" for c in codes]),
                              "B": balanced(rng)})
    else:
        table = pd.DataFrame({"A": balanced(rng), "B": balanced(rng)})
    if design == "other":
        patterns = unit_patterns(rng, 2)
        data += OTHER_AMPLITUDE * patterns[table["B"].to_numpy().astype(int)][:, :, None]
    elif design == "power":
        patterns = unit_patterns(rng, 2)
        signal = patterns[table["A"].to_numpy().astype(int)]           # trials x channels
        data[:, :, WINDOW] += amplitude * signal[:, :, None] * ENVELOPE[None, None]
    return data, table


def mantel(data, labels, n_perm=N_NULL, seed=0):
    """RSA Mantel test of a categorical model RDM (0 same level, 1 different) against the
    Euclidean neural RDM at every time point: Spearman rho, one-sided (greater), stimuli
    permuted (the same permutation at every time point); returns rho, p and FWE p (the
    maximum over time points of each permutation's rho)."""
    codes = pd.factorize(pd.Series(labels))[0]
    ranks = np.stack([stats.rankdata(pdist(data[:, :, t])) for t in range(data.shape[2])])
    ranks = (ranks - ranks.mean(axis=1, keepdims=True)) / ranks.std(axis=1, keepdims=True)
    rng = np.random.default_rng(seed)
    perms = [np.arange(len(codes))] + [rng.permutation(len(codes)) for _ in range(n_perm)]
    model = np.stack([pdist(codes[p][:, None], "hamming") for p in perms]).astype(float)
    # every relabelling keeps the level sizes, so each row has the same two rank values
    model = np.stack([stats.rankdata(m) for m in model])
    model = (model - model.mean(axis=1, keepdims=True)) / model.std(axis=1, keepdims=True)
    rho = model @ ranks.T / ranks.shape[1]                  # (1 + n_perm) x times
    observed, null = rho[0], rho[1:]
    p = (1 + (null >= observed - 1e-12).sum(axis=0)) / (1 + n_perm)
    p_fwe = (1 + (null.max(axis=1)[:, None] >= observed[None] - 1e-12).sum(axis=0)) / (
        1 + n_perm)
    return observed, p, p_fwe


def run_one(design, seed, amplitude=0.0):
    """One dataset: MLEM's p-values (times x tests) and the Mantel test of the first
    feature, and the CPU seconds of the MLEM analysis."""
    data, table = make(design, seed, amplitude)
    t0 = time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = mlem_neuro.mlem_array(data, table, n_null=N_NULL, random_state=10**6 + seed,
                                    verbose="WARNING", **OPTIONS)
    cpu = time.process_time() - t0
    # folds whose held-out stimuli all share a feature's value (importance 0 there)
    constant = sum("every held-out pair has the same distance" in str(w.message)
                   for w in caught)
    first = table.columns[0]
    _, mp, mp_fwe = mantel(data, table[first].to_numpy(), seed=2 * 10**6 + seed)
    return dict(tests=list(res.tests), p=res.pvalues, p_fwe=res.pvalues_fwe,
                mantel_p=mp, mantel_p_fwe=mp_fwe, score=float(res.score.mean()),
                converged=float(res.settings["converged_fraction"]), cpu=cpu,
                constant=constant)


def run_main_only(design, seed, n_null=N_NULL):
    """The main-effect part alone on one dataset, ``n_null`` relabellings: ``(p, p_fwe)``
    (times x features)."""
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.core.scoring.main_effect import main_effect_tests
    from mlem_neuro.core.scoring.nulls import null_permutations, permutation_pvalues
    from mlem_neuro.core.stimuli.features import FeatureSpace

    data, table = make(design, seed)
    space = FeatureSpace().fit(table)
    enc = space.transform(table)
    null = null_permutations(enc, space.kinds_, n_null, np.random.default_rng(10**6 + seed))
    source = DenseRDMSource(np.transpose(data, (2, 0, 1)), "euclidean")   # one per time
    obs, nul = main_effect_tests(source, enc, null)
    _, p, p_fwe = permutation_pvalues({f: (obs[:, j], nul[:, j].T)
                                       for j, f in enumerate(table.columns)})
    return list(table.columns), p, p_fwe


def main_only(n_datasets, designs=("smooth", "unbalanced", "levels"), n_null=N_NULL,
              first_seed=0):
    """Rates of the main-effect part alone (``--main-only``; ``--n-null 999``: as the
    default test reads it where the gate is shut, ``MAIN_EFFECT_NULLS``)."""
    for design in designs:
        runs = [run_main_only(design, seed, n_null)
                for seed in range(first_seed, first_seed + n_datasets)]
        names = runs[0][0]
        p = np.stack([r[1] for r in runs])
        p_fwe = np.stack([r[2] for r in runs])
        print(f"\n{design}: the main effect alone, {n_datasets} datasets (seeds "
              f"{first_seed}-{first_seed + n_datasets - 1}), {n_null} "
              "relabellings")
        for j, name in enumerate(names):
            r = rates(p[:, :, j], p_fwe[:, :, j])
            print(f"  {name:3s} pointwise {r['rate']:.3f} (bootstrap {fmt(r['boot'])}), FWE "
                  f"{r['fwe']:.3f} (Wilson {fmt(r['fwe_wilson'])})   ({verdict(r)})")


KEYS = ("p", "p_fwe", "mantel_p", "mantel_p_fwe", "score", "converged", "cpu", "constant")


def path(out, design, amplitude=0.0):
    name = design if design != "power" else f"power-{amplitude:g}"
    return os.path.join(out, name + ".npz")


def load(file):
    if not os.path.exists(file):
        return None
    z = np.load(file, allow_pickle=False)
    return {k: z[k] for k in z.files}


def save(file, rows):
    arrays = {k: np.stack([np.asarray(r[k]) for r in rows]) for k in KEYS}
    arrays["tests"] = np.array(rows[0]["tests"])
    tmp = file + ".tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, file)


def collect(design, n_datasets, out, amplitude=0.0, first_seed=0):
    """Run datasets until ``n_datasets`` are saved (resuming what is there), seeds from
    ``first_seed`` on."""
    file = path(out, design, amplitude)
    old = load(file)
    rows = []
    if old is not None:
        rows = [dict({k: old[k][i] for k in KEYS}, tests=list(old["tests"]))
                for i in range(len(old["p"]))]
    while len(rows) < n_datasets:
        rows.append(run_one(design, first_seed + len(rows), amplitude))
        save(file, rows)
        if len(rows) % 20 == 0:
            print(f"{os.path.basename(file)}: {len(rows)} datasets, "
                  f"{sum(r['cpu'] for r in rows):.0f} s of MLEM CPU", flush=True)


def wilson(k, n, z=1.959964):
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(hits, n_boot=4000, seed=0):
    """95 % percentile interval of the pointwise rate, resampling datasets (rows)."""
    rng = np.random.default_rng(seed)
    per = hits.mean(axis=1)
    idx = rng.integers(0, len(per), (n_boot, len(per)))
    return tuple(np.percentile(per[idx].mean(axis=1), [2.5, 97.5]))


def rates(p, p_fwe):
    """Pointwise and FWE rates of one test: p and p_fwe are (datasets x times)."""
    hits = p < 0.05
    n, T = hits.shape
    k_fwe = int((p_fwe < 0.05).any(axis=1).sum())
    return dict(n=n, T=T, rate=hits.mean(), wilson=wilson(int(hits.sum()), hits.size),
                boot=bootstrap(hits), fwe=k_fwe / n, fwe_wilson=wilson(k_fwe, n))


def fmt(lo_hi):
    return f"{lo_hi[0]:.3f}-{lo_hi[1]:.3f}"


def verdict(r):
    """Whether 0.05 (and the nominal 0.04) are inside the intervals."""
    out = []
    for name, iv in (("pointwise (boot)", r["boot"]), ("FWE", r["fwe_wilson"])):
        where = [("above " if iv[0] > x else "below " if iv[1] < x else "contains ") + f"{x:g}"
                 for x in (0.04, 0.05)]
        out.append(f"{name}: " + ", ".join(where))
    return "; ".join(out)


def report(out):
    for design in DESIGNS[:-1]:
        z = load(path(out, design))
        if z is None:
            continue
        tests = list(z["tests"])
        print(f"\n{design}: {len(z['p'])} datasets, mean score {z['score'].mean():.3f}, "
              f"converged {z['converged'].mean():.3f}, datasets warned of a fold with "
              f"constant held-out feature {(z['constant'] > 0).mean():.3f}, "
              f"MLEM CPU {z['cpu'].sum():.0f} s "
              f"({z['cpu'].mean():.2f} s per dataset)")
        print(f"  {'test':13s} {'pointwise':>9s} {'Wilson (cells)':>14s} "
              f"{'bootstrap':>12s} {'FWE':>6s} {'Wilson':>12s}")
        rows = [(t, z["p"][:, :, k], z["p_fwe"][:, :, k]) for k, t in enumerate(tests)]
        rows.append((f"Mantel {tests[1]}", z["mantel_p"], z["mantel_p_fwe"]))
        for name, p, p_fwe in rows:
            if design == "other" and name in ("score", "B"):
                continue           # B is encoded: these nulls are false
            if design == "other" and name.startswith("Mantel"):
                continue           # A's unconditional Mantel null is false when B is encoded
            r = rates(p, p_fwe)
            print(f"  {name:13s} {r['rate']:9.3f} {fmt(r['wilson']):>14s} "
                  f"{fmt(r['boot']):>12s} {r['fwe']:6.3f} {fmt(r['fwe_wilson']):>12s}"
                  f"   ({verdict(r)})")
    for file in sorted(f for f in os.listdir(out) if f.startswith("power-")
                       and f.endswith(".npz") and ".tmp" not in f):
        z = load(os.path.join(out, file))
        tests = list(z["tests"])
        a, b = tests.index("A"), tests.index("B")
        n = len(z["p"])
        outside = np.setdiff1d(np.arange(z["p"].shape[1]), WINDOW)
        print(f"\n{file[:-4]}: {n} datasets, mean score {z['score'].mean():.3f}, MLEM CPU "
              f"{z['cpu'].sum():.0f} s")
        sc = tests.index("score")
        for name, p, p_fwe in (("MLEM A", z["p"][:, :, a], z["p_fwe"][:, :, a]),
                               ("MLEM score", z["p"][:, :, sc], z["p_fwe"][:, :, sc]),
                               ("Mantel A", z["mantel_p"], z["mantel_p_fwe"])):
            hit = (p_fwe[:, WINDOW] < 0.05).any(axis=1)
            far = (p_fwe[:, outside] < 0.05).any(axis=1)
            point = (p[:, WINDOW] < 0.05).mean()
            print(f"  {name:10s} FWE power {hit.mean():.3f} ({hit.sum()}/{n}, Wilson "
                  f"{fmt(wilson(hit.sum(), n))}); pointwise rate in window {point:.3f}; "
                  f"FWE outside window {far.mean():.3f} ({far.sum()}/{n})")
        both = ((z["p_fwe"][:, WINDOW, a] < 0.05).any(axis=1),
                (z["mantel_p_fwe"][:, WINDOW] < 0.05).any(axis=1))
        print(f"  datasets: both {np.sum(both[0] & both[1])}, MLEM only "
              f"{np.sum(both[0] & ~both[1])}, Mantel only {np.sum(~both[0] & both[1])}; "
              f"McNemar exact p {mcnemar(both[0], both[1]):.3f}")
        ctrl = (z["p_fwe"][:, :, b] < 0.05).any(axis=1)
        print(f"  B (never encoded) FWE anywhere {ctrl.mean():.3f} ({ctrl.sum()}/{n})")


def mcnemar(x, y):
    b, c = int(np.sum(x & ~y)), int(np.sum(~x & y))
    return 1.0 if b + c == 0 else float(stats.binomtest(b, b + c, 0.5).pvalue)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=DESIGNS, default=None)
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_argument("--amplitudes", type=float, nargs="+", default=[0.5, 0.7])
    parser.add_argument("--power-datasets", type=int, default=150)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "calib_defaults"))
    parser.add_argument("--report", action="store_true")
    parser.add_argument("--main-only", action="store_true",
                        help="the main-effect part of the staged test alone, no training")
    parser.add_argument("--n-null", type=int, default=N_NULL,
                        help="relabellings of --main-only (999: as the default reads the "
                             "main effect alone)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="datasets' seeds from this one on (fresh datasets beside a "
                             "saved run: give another --out)")
    parser.add_argument("--patience", type=int, default=None,
                        help="the analyses' patience (default the package's, auto)")
    args = parser.parse_args()
    if args.patience is not None:
        OPTIONS["patience"] = args.patience
    if args.main_only:
        main_only(args.datasets, (args.only,) if args.only else ("smooth", "unbalanced",
                                                                  "levels"), args.n_null,
                  args.first_seed)
        return
    os.makedirs(args.out, exist_ok=True)
    if args.report:
        report(args.out)
        return
    torch.set_num_threads(1)
    t0 = time.process_time()
    for design in DESIGNS if args.only is None else (args.only,):
        for amp in args.amplitudes if design == "power" else (0.0,):
            n = args.power_datasets if design == "power" else args.datasets
            collect(design, n, args.out, amp, args.first_seed)
    print(f"CPU {time.process_time() - t0:.0f} s")


if __name__ == "__main__":
    main()
