"""Which feature statistic should the default be?  The default test (the main effect, with
the held-out importance where interactions are found), each of its parts, other
combinations of them, the additive model and the max of full and additive, side by side
with Mantel and partial Mantel tests, over a grid of designs (issue 37, item 1).

Before issue 37 the feature test read the importance of the model with interactions
(symmetric positive definite ``W``): on real recordings it missed main effects that a
plain RSA finds, while the additive model (``interactions=False``, diagonal ``W``) finds
them but cannot see an interaction-only (XOR) code.  This script measures, on the same
simulated datasets and the same null datasets:

* ``default``: the feature's test at the defaults (``n_null=99``,
  ``feature_test="staged"``): its main effect, joined by its held-out importance (the
  max of the two, standardised) when the test of interactions has p <= STAGED_GATE
  (:func:`mlem_neuro.core.scoring.main_effect.staged`); recomputed here from the parts
  as a check;
* ``full`` and ``main``: the two parts of that statistic alone, from the same fit and the
  same null datasets (``full`` is the test before issue 37);
* ``combined``, ``sum``, ``min p``, ``Fisher``: the two parts combined here in every
  model: by their standardised maximum (``feature_test="combined"``, the default
  before the staged test), their sum (Stouffer), and the nonparametric combinations of
  their permutation p-values by Tippett (minimum) and Fisher;
* ``gate 0.1``, ``gate 0.2``, ``gate 0.5``: the staged test with other gates;
* ``additive`` (not with ``--no-additive``): ``interactions=False``; the same
  ``random_state`` draws the same folds and null datasets, so the statistics are paired
  dataset by dataset, null by null;
* ``max``: ``max(z_full, z_additive)``, each importance standardised by its own null
  (a single max statistic over the same null datasets);
* ``Mantel`` and ``partial Mantel`` (:func:`mlem_neuro.rsa.mantel_tests`, 999
  permutations, Euclidean neural RDM);
* the test of interactions of the full model (run by default with tests).

``--main-only`` runs the main-effect part and the Mantel tests alone (no training: a
fraction of a second per dataset), e.g. with ``--n-null 999`` to compare it with the
Mantel tests at the same number of permutations; ``--it`` the IT units of the shared
data.

Designs (``--designs``; one time point, ``units`` response units, noise N(0, 1), each
feature level a random pattern N(0, 1) times its amplitude, centred over levels)::

    binary      A (2 levels, amplitude a_A) beside a weak B (2 levels, amplitude a)
    three       A (3 levels) beside a weak B (3 levels)
    seven       object (7 levels, strong) beside a weak position (3 levels): IT-like
    three_feat  A, C strong (2 levels) beside a weak B (2 levels)
    unbalanced  A (2 levels) beside a weak B (2 levels, 25 % / 75 %)
    with_xor    the binary design plus an A x B interaction (XOR pattern, amplitude a_AB)
    xor         A x B interaction only (amplitude a): no main effect
    correlated  A (2 levels) beside B that equals A on a random 70 % of the stimuli (a
                fair coin elsewhere), B encoded with amplitude a (0: a feature that only
                tracks an encoded one)

The weak feature's amplitude ``a`` takes the values of ``AMPLITUDES`` (0: calibration;
for ``xor`` the interaction's).  Rates at alpha = 0.05 with Wilson 95 % intervals; every
dataset's p-values are saved as it finishes (``--out``), so runs resume and split over
processes (``--part k/K``); ``--report`` prints the tables.  One core per process::

    OMP_NUM_THREADS=1 python validation/feature_statistic.py --part 1/2 &
    OMP_NUM_THREADS=1 python validation/feature_statistic.py --part 2/2
    python validation/feature_statistic.py --report
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

from mlem_neuro import rsa
from mlem_neuro.core.constants import STAGED_GATE
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.core.scoring.main_effect import combine
from mlem_neuro.inference import run_analysis

ALPHA = 0.05
N_NULL = 99
N_PERM = 999
#: design: (stimuli, units, {feature: (levels, amplitude or None for the tested one)},
#: tested feature, interaction amplitude or None for the tested one)
DESIGNS = {
    "binary": (48, 24, {"A": (2, 0.5), "B": (2, None)}, "B", 0.0),
    "three": (48, 24, {"A": (3, 0.5), "B": (3, None)}, "B", 0.0),
    "seven": (42, 24, {"object": (7, 0.6), "position": (3, None)}, "position", 0.0),
    "three_feat": (48, 24, {"A": (2, 0.5), "C": (2, 0.5), "B": (2, None)}, "B", 0.0),
    "unbalanced": (48, 24, {"A": (2, 0.5), "B": ((0.25, 0.75), None)}, "B", 0.0),
    "with_xor": (48, 24, {"A": (2, 0.5), "B": (2, None)}, "B", 0.4),
    "xor": (48, 24, {"A": (2, 0.0), "B": (2, 0.0)}, "A", None),
    "correlated": (48, 24, {"A": (2, 0.5), "B": ("A", None)}, "B", 0.0),
}
#: amplitudes of the tested feature (of the interaction for ``xor``)
AMPLITUDES = (0.0, 0.2, 0.3, 0.4)
METHODS = ("default", "full", "main", "combined", "sum", "min p", "Fisher", "gate 0.1",
           "gate 0.2", "gate 0.5", "additive", "max", "Mantel", "partial Mantel")
#: also run the additive model (``--no-additive`` halves the cost per dataset)
ADDITIVE = True
#: the analyses' step rule and repeats (``--lr``, ``--patience``, ``--max-steps``,
#: ``--n-repeats``; default
#: the package's, "auto")
STEP_RULE = {}


def _levels(spec, n, rng):
    """One level per stimulus: balanced over ``spec`` levels, or with the proportions
    ``spec`` (a tuple), in a random order."""
    if isinstance(spec, tuple):
        counts = np.round(np.asarray(spec) * n).astype(int)
        counts[-1] = n - counts[:-1].sum()
        labels = np.repeat(np.arange(len(spec)), counts)
    else:
        labels = np.arange(n) % spec
    return labels[rng.permutation(n)]


def _patterns(n_levels, units, amplitude, rng):
    V = rng.normal(size=(n_levels, units))
    return amplitude * (V - V.mean(axis=0))


def make(design, a, seed):
    """Patterns ``X (n, units)`` and the feature table of one dataset."""
    n, units, features, tested, a_int = DESIGNS[design]
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, units))
    table, codes = {}, {}
    for name, (spec, amp) in features.items():
        if isinstance(spec, str):       # equals that feature on 70 % of the stimuli
            codes[name] = np.where(rng.uniform(size=n) < 0.7, codes[spec],
                                   rng.integers(0, 2, n))
            spec = 2
        else:
            codes[name] = _levels(spec, n, rng)
        n_levels = len(spec) if isinstance(spec, tuple) else spec
        X += _patterns(n_levels, units, a if amp is None else amp, rng)[codes[name]]
        table[name] = np.array([f"{name}{k}" for k in codes[name]])
    a_int = a if a_int is None else a_int
    if a_int:                               # A x B: the XOR of the first two features
        first, second = list(features)[:2]
        xor = (codes[first] % 2) ^ (codes[second] % 2)
        X += _patterns(2, units, a_int, rng)[xor]
    return X, pd.DataFrame(table)


def _zscore(obs, null):
    """Observed and null statistics standardised by the null's mean and deviation."""
    mu, sd = null.mean(axis=0), null.std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    return (obs - mu) / sd, (null - mu) / sd


def _zscore_all(obs, null):
    """Observed and null statistics standardised by the mean and deviation of all of them
    (the observed one included), as :func:`~mlem_neuro.core.scoring.main_effect.combine`
    does for one model."""
    allv = np.concatenate([[obs], null])
    mu, sd = allv.mean(), allv.std()
    sd = sd if sd > 0 else 1.0
    return (obs - mu) / sd, (null - mu) / sd


def _rank_p(obs, null):
    """Each dataset's upper-tail permutation p among all of them (the observed first)."""
    allv = np.concatenate([[obs], null])
    return (allv[None, :] >= allv[:, None] - 1e-12).sum(axis=1) / len(allv)


def _p(obs, null):
    """Permutation p-value; NaN where a null statistic is (with the staged default the
    importance's null models are trained only where the gate opens: elsewhere the
    importance part and every column built on it is not measured, and the report's
    ``n`` counts the datasets where it is)."""
    null = np.asarray(null, float)
    if not np.isfinite(obs) or not np.isfinite(null).all():
        return float("nan")
    return float((1 + (null >= obs - 1e-12).sum()) / (1 + len(null)))


def run_one(design, a, seed):
    X, table = make(design, a, seed)
    X = (X - X.mean(axis=0)) / X.std(axis=0)            # the analyses' channel scaling
    rows = []
    t0 = time.process_time()
    frame = rsa.mantel_tests(X, table, N_PERM, 3 * 10**6 + seed)
    cpu = time.process_time() - t0
    for name in table.columns:
        rows.append(dict(method="Mantel", feature=name, p=frame.loc[name, "p"], cpu=cpu))
        rows.append(dict(method="partial Mantel", feature=name,
                         p=frame.loc[name, "p_partial"], cpu=cpu))
    tests, parts, cpus, p_int = {}, {}, {}, np.nan
    runs = (("default", {}), ("additive", {"interactions": False})) if ADDITIVE else (
        ("default", {}),)
    for label, kw in runs:
        opts = MLEMOptions(n_null=N_NULL, random_state=10**6 + seed, **STEP_RULE, **kw)
        t0 = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = run_analysis(DenseRDMSource(X[None], "euclidean"), table, opts,
                               desc="time points")
        cpus[label] = time.process_time() - t0
        parts[label] = out.parts
        tests[label] = out.tests
        if "interactions" in out.tests:
            obs, null = out.tests["interactions"]
            p_int = _p(obs[0], null[:, 0])
    for name in table.columns:
        stats = {}
        # the default's statistic, and the two it combines (same fit, same null datasets)
        obs, null = tests["default"][name]
        default_row = len(rows)
        rows.append(dict(method="default", feature=name, p=_p(obs[0], null[:, 0]),
                         cpu=cpus["default"]))
        for label, key in (("full", "importance"), ("main", "main_effect")):
            obs, null = parts["default"][name][key]
            stats[label] = (obs[0], null[:, 0])
            rows.append(dict(method=label, feature=name, p=_p(*stats[label]),
                             cpu=cpus["default"]))
        # combinations of the same standardised parts: their sum (Stouffer) and their
        # maximum (the combined test), and the staged test with several gates (the
        # default's, STAGED_GATE, must give the default's p-value)
        zs = [_zscore_all(*stats[k]) for k in ("full", "main")]
        rows.append(dict(method="sum", feature=name,
                         p=_p(zs[0][0] + zs[1][0], zs[0][1] + zs[1][1]),
                         cpu=cpus["default"]))
        p_comb = _p(np.maximum(zs[0][0], zs[1][0]), np.maximum(zs[0][1], zs[1][1]))
        p_main = _p(*stats["main"])
        rows.append(dict(method="combined", feature=name, p=p_comb, cpu=cpus["default"]))
        # where the gate is shut the default reads the main effect on every relabelling
        # drawn for it (MAIN_EFFECT_NULLS: the first N_NULL are the parts')
        d_null = tests["default"][name][1]
        if p_int > STAGED_GATE:
            assert np.array_equal(d_null[:N_NULL, 0], stats["main"][1]), name
            p_main = rows[default_row]["p"]
        for gate in (STAGED_GATE, 0.1, 0.2, 0.5):
            p_gated = p_comb if p_int <= gate else p_main
            if gate == STAGED_GATE:
                assert abs(p_gated - rows[default_row]["p"]) < 1e-9, (p_gated, rows[default_row])
            else:
                rows.append(dict(method=f"gate {gate:g}", feature=name, p=p_gated,
                                 cpu=cpus["default"]))
        # nonparametric combinations of the parts' permutation p-values (each part on the
        # probability scale, whatever the shape of its null): Tippett (their minimum) and
        # Fisher (the sum of their logarithms)
        ps = [_rank_p(*stats[k]) for k in ("full", "main")]
        if not all(np.isfinite(np.r_[stats[k][0], stats[k][1]]).all()
                   for k in ("full", "main")):
            ps = [np.full_like(ps[0], np.nan)] * 2          # a part not measured: NaN
        tip = -np.minimum(ps[0], ps[1])
        fis = -np.log(ps[0]) - np.log(ps[1])
        rows.append(dict(method="min p", feature=name, p=_p(tip[0], tip[1:]),
                         cpu=cpus["default"]))
        rows.append(dict(method="Fisher", feature=name, p=_p(fis[0], fis[1:]),
                         cpu=cpus["default"]))
        if ADDITIVE:
            obs, null = parts["additive"][name]["importance"]
            stats["additive"] = (obs[0], null[:, 0])
            rows.append(dict(method="additive", feature=name, p=_p(*stats["additive"]),
                             cpu=cpus["additive"]))
            (zf, nf), (za, na) = (_zscore(*stats[k]) for k in ("full", "additive"))
            rows.append(dict(method="max", feature=name,
                             p=_p(max(zf, za), np.maximum(nf, na)),
                             cpu=cpus["default"] + cpus["additive"]))
    rows.append(dict(method="interactions", feature="A x B", p=p_int, cpu=cpus["default"]))
    for r in rows:
        r.update(design=design, a=a, seed=seed, tested=DESIGNS[design][3])
    return rows


def run_main_only(design, a, seed):
    """The main-effect part of the default test alone (99 conditional relabellings, as
    the analyses draw them) beside the Mantel tests, on the dataset :func:`run_one`
    analyses: no training, so hundreds of datasets per cell (``--main-only``)."""
    from mlem_neuro.core.scoring.main_effect import main_effect_tests
    from mlem_neuro.core.scoring.nulls import null_permutations
    from mlem_neuro.core.stimuli.features import FeatureSpace

    X, table = make(design, a, seed)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    frame = rsa.mantel_tests(X, table, N_PERM, 3 * 10**6 + seed)
    space = FeatureSpace().fit(table)
    enc = space.transform(table)
    null = null_permutations(enc, space.kinds_, N_NULL, np.random.default_rng(10**6 + seed))
    obs, nul = main_effect_tests(DenseRDMSource(X[None], "euclidean"), enc, null)
    rows = []
    for f, name in enumerate(table.columns):
        rows.append(dict(method="main", feature=name, p=_p(obs[0, f], nul[0, f]), cpu=0.0))
        rows.append(dict(method="Mantel", feature=name, p=frame.loc[name, "p"], cpu=0.0))
        rows.append(dict(method="partial Mantel", feature=name,
                         p=frame.loc[name, "p_partial"], cpu=0.0))
    for r in rows:
        r.update(design=design, a=a, seed=seed, tested=DESIGNS[design][3])
    return rows


def _fwe(obs, null):
    """Family-wise p per model: the null's max over models (``null (n_null, M)``)."""
    top = null.max(axis=1)
    return np.array([(1 + (top >= o - 1e-12).sum()) / (1 + len(top)) for o in obs])


def it_pilot(n_groups=8, window=0.05, step=0.05, seed=0):
    """The shared IT units (part 1): FWE p of ``object`` and ``position`` before onset and
    at 100-450 ms for the full, additive and max statistics and a plain RSA with a max
    statistic over time bins (condition labels permuted, the same permutations for every
    bin); then the importance curves' correlation between two disjoint halves of the
    units (and the RSA curves')."""
    import bench_snr
    from scipy import stats as sstats
    from scipy.spatial.distance import pdist

    rec = bench_snr.it_units(n_groups, window=window, step=step)
    if rec is None:
        print("IT units: not in ../shared/data")
        return
    data, table, centres = rec
    cond = (table.object + "_" + table.position).to_numpy()
    data = (data - data.mean(axis=(0, 2), keepdims=True)) / data.std(axis=(0, 2),
                                                                   keepdims=True)
    pre, post = centres < 0, (centres >= 0.1) & (centres <= 0.45)
    print(f"IT units: {data.shape[0]} pseudo-trials ({n_groups} per condition) x "
          f"{data.shape[1]} units x {len(centres)} bins of {window * 1000:.0f} ms; "
          f"conditions as groups; n_null={N_NULL}")

    def analyse(X, n_null, interactions):
        opts = MLEMOptions(n_null=n_null, interactions=interactions, random_state=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return run_analysis(DenseRDMSource(X.transpose(2, 0, 1), "euclidean"), table,
                                opts, groups=cond, desc="time points")

    outs = {}
    for label, inter in (("default", True), ("additive", False)):
        t0 = time.perf_counter()
        outs[label] = analyse(data, N_NULL, inter)
        print(f"  {label}: {time.perf_counter() - t0:.0f} s")
    gate = outs["default"].gate_open
    if gate is not None:
        print(f"  staged test: interactions found (gate open) in {int(gate.sum())} of "
              f"{len(gate)} bins")
    rng = np.random.default_rng(seed)
    conds = np.unique(cond)
    ranks = np.stack([sstats.rankdata(pdist(data[:, :, t])) for t in range(len(centres))])
    ranks = (ranks - ranks.mean(1, keepdims=True)) / ranks.std(1, keepdims=True)
    perms = [np.arange(len(conds))] + [rng.permutation(len(conds)) for _ in range(N_NULL)]
    for name in ("object", "position"):
        level = dict(zip(cond, table[name]))
        row = {"default": outs["default"].tests[name],
               "combined": combine(*zip(outs["default"].parts[name]["importance"],
                                        outs["default"].parts[name]["main_effect"])),
               "full": outs["default"].parts[name]["importance"],
               "main": outs["default"].parts[name]["main_effect"],
               "additive": outs["additive"].parts[name]["importance"]}
        (zf, nf), (za, na) = (_zscore(*row[k]) for k in ("full", "additive"))
        row["max"] = (np.maximum(zf, za), np.maximum(nf, na))
        rsa_stats = []
        for p in perms:
            relabel = dict(zip(conds, conds[p]))
            codes = pd.factorize(np.array([level[relabel[c]] for c in cond]))[0]
            model = sstats.rankdata(pdist(codes[:, None], "hamming"))
            model = (model - model.mean()) / model.std()
            rsa_stats.append(ranks @ model / len(model))
        rsa_stats = np.array(rsa_stats)
        row["RSA"] = (rsa_stats[0], rsa_stats[1:])
        for label, (obs, null) in row.items():
            if np.isnan(null).all(axis=0).any():
                # the staged default fits the features' null models only where the test
                # of interactions opens the gate: elsewhere the importance has no null
                print(f"  {name:<8s} {label:<8s} no null where the gate is shut (staged "
                      "default): not tested there")
                continue
            p = _fwe(obs, null)
            print(f"  {name:<8s} {label:<8s} smallest FWE p: before onset "
                  f"{p[pre].min():.3g}, 100-450 ms {p[post].min():.3g}")
    # replication between two halves of the units (curves only, no tests)
    units = np.random.default_rng(seed + 1).permutation(data.shape[1])
    halves = [data[:, units[:len(units) // 2]], data[:, units[len(units) // 2:]]]
    half_outs = [(analyse(h, 0, True), analyse(h, 0, False)) for h in halves]
    for name in ("object", "position"):
        codes = pd.factorize(table[name])[0]
        model = sstats.rankdata(pdist(codes[:, None], "hamming"))
        curves = {"full (importance)": [], "main effect": [], "additive": [], "RSA": []}
        for half, (full, add) in zip(halves, half_outs):
            f = full.feature_names.index(name)
            curves["full (importance)"].append(
                full.importance.mean(axis=0)[:, full.terms.index(name)])
            curves["main effect"].append(full.main_effect[:, f])
            curves["additive"].append(add.importance.mean(axis=0)[:, add.terms.index(name)])
            curves["RSA"].append([sstats.spearmanr(pdist(half[:, :, t]), model)[0]
                                  for t in range(len(centres))])
        print(f"  {name:<8s} curve r between halves: " + ", ".join(
            f"{k} {np.corrcoef(v[0], v[1])[0, 1]:.2f}" for k, v in curves.items()))


def report(out):
    files = [os.path.join(out, f) for f in os.listdir(out) if f.endswith(".csv")]
    frame = pd.concat([pd.read_csv(f) for f in files], ignore_index=True)
    for design, sub in frame.groupby("design", sort=False):
        tested = sub.tested.iloc[0]
        print(f"\n{design}: rate of p < {ALPHA} for {tested!r} [Wilson 95 %] by amplitude; "
              "CPU s per dataset (full, combined, sum, min p, Fisher and the looser gates "
              "read the importance, measured only where the default's gate opened: n)")
        for method in (*METHODS, "interactions"):
            m = sub[(sub.method == method)
                    & (sub.feature == ("A x B" if method == "interactions" else tested))]
            cells = []
            for a, g in m.groupby("a"):
                k, N = int((g.p < ALPHA).sum()), int(g.p.notna().sum())
                if N:
                    lo, hi = wilson(k, N)
                    cells.append(f"a={a:g}: {k / N:.2f} [{lo:.2f}, {hi:.2f}] n={N}")
            if cells:
                print(f"  {method:<15s} " + " | ".join(cells) + f" | {m.cpu.mean():.1f} s")


def main():
    global ADDITIVE, N_NULL
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", type=int, default=100)
    p.add_argument("--designs", nargs="+", default=list(DESIGNS))
    p.add_argument("--amplitudes", nargs="+", type=float, default=list(AMPLITUDES))
    p.add_argument("--part", type=part, default=(1, 1),
                   help="k/K: this process runs every K-th dataset, from the k-th (1 <= k <= K)")
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "feature_statistic"))
    p.add_argument("--report", action="store_true")
    p.add_argument("--main-only", action="store_true",
                   help="the main-effect test and the Mantel tests only (no training)")
    p.add_argument("--no-additive", action="store_true",
                   help="skip the additive model (and the max of full and additive)")
    p.add_argument("--it", action="store_true",
                   help="the IT units pilot (../shared/data) instead of simulations")
    p.add_argument("--n-null", type=int, default=N_NULL,
                   help="null datasets of the analyses' tests (default 99, the "
                        "package's usual choice; with --main-only 999 costs seconds)")
    p.add_argument("--lr", default="auto", help="the analyses' lr (default auto)")
    p.add_argument("--patience", default="auto",
                   help="the analyses' patience (default auto)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="the analyses' max_steps (default the package's)")
    p.add_argument("--n-repeats", default="auto",
                   help="the analyses' n_repeats (default auto; an int: every test on "
                        "every fold)")
    args = p.parse_args()
    ADDITIVE = not args.no_additive
    if args.n_repeats != "auto":
        STEP_RULE["n_repeats"] = int(args.n_repeats)
    STEP_RULE.update(lr=args.lr if args.lr == "auto" else float(args.lr),
                     patience=(args.patience if args.patience == "auto"
                               else int(args.patience)))
    if args.max_steps is not None:
        STEP_RULE["max_steps"] = args.max_steps
    N_NULL = args.n_null
    if args.it:
        torch.set_num_threads(1)
        it_pilot()
        return
    if args.report:
        report(args.out)
        return
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    k, K = args.part
    # seed-major: a run stopped early leaves every cell with about as many datasets
    jobs = sorted(((d, a, s) for d in args.designs for a in args.amplitudes
                   for s in range(args.datasets)), key=lambda job: (job[2], job[0], job[1]))
    for i, (design, a, seed) in enumerate(jobs):
        if i % K != k - 1:
            continue
        fname = os.path.join(args.out, f"{design}_{a:g}_{seed}.csv")
        if os.path.exists(fname):
            continue
        run = run_main_only if args.main_only else run_one
        pd.DataFrame(run(design, a, seed)).to_csv(fname, index=False)


if __name__ == "__main__":
    main()
