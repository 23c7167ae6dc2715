"""Calibration and power of the group-level test of importance time courses.

:func:`mlem_neuro.stats.permutation_cluster_test` (a sign-flip cluster permutation test
across subjects, MNE's :func:`~mne.stats.permutation_cluster_1samp_test`) on groups of
simulated subjects, each analysed once by :func:`mlem_neuro.mlem_array` with the
defaults (feature-level importance, 10 importance permutations, no single-subject tests;
today ``cv=2`` and ``n_repeats="auto"``, 50 repeats of 2 folds for these subjects; the
earlier runs below had one split into 5 folds).  Each subject is
:func:`mlem_neuro.simulation.simulate_epochs` (40 trials x 8 channels x 30 time points at
50 Hz from -0.1 s, binary features ``A`` and ``B``); groups are disjoint (no subject is in
two groups).

* ``other``: ``B`` encoded in 0.1-0.3 s (amplitude 1), ``A`` never: the rate of groups
  with a cluster of ``A`` at p < 0.05 (``A``'s null is true; ``B`` shapes the fits).
* ``noise``: nothing encoded: the rates of groups with a cluster of the held-out score
  and of each feature's importance at p < 0.05.
* ``power``: ``A`` encoded in 0.1-0.3 s with ``--amplitude``, ``B`` never: the rate of
  groups with a cluster of ``A`` at p < 0.05 that overlaps the window, with one that holds
  a time at least 0.1 s from it, and with a cluster of ``B``.

With ``--measures`` (``--only noise`` or ``--only power``), each group is tested three
ways side by side, on the same subjects: ``measure="importance"``,
``measure="main_effect"`` (each subject's in-sample partial Spearman correlation of the
feature's distance with the neural distance, the other feature's held fixed) and a group
RSA: per subject and time point, the Spearman correlation between the Euclidean RDM of
the trials' channel patterns (channels scaled to zero mean and unit variance over trials
and times, as ``mlem_array`` does) and the feature's model RDM (1 where two trials
differ), tested by the same MNE call with the same conventions (``threshold=None``: the
one-sided t at p = 0.05; ``tail=1``; the same sign flips and seed).  ``noise``: the rates
of groups with a cluster of ``A`` and of ``B`` at p < 0.05 (and of the score), and each
unencoded feature's subject means (their mean, standard error and skewness: are they
centred on 0?); ``power``: the rate of groups with a cluster of ``A`` overlapping the
window, with one at least 0.1 s from it, and with a cluster of ``B``.  Each group is saved
as one JSON line in ``--out`` as it finishes (a stopped run resumes where it stopped);
``--report`` prints the rates with Wilson 95 % intervals.  ``--only centring``: the main
effect and the group RSA alone (they need no training: one split, one training step) on
``--groups`` noise groups, the first ones the same subjects as ``--measures --only
noise``: the distribution of the unencoded features' values at each time point (mean,
skewness, share above 0) and the rate of groups with a cluster, over more groups than the
full analyses afford.  The runs of 2026-11-29 (about 38 s of CPU per group of 12 at the
defaults)::

    cd validation
    OMP_NUM_THREADS=1 python calib_group.py --measures --only noise --groups 40 --out RUNS
    OMP_NUM_THREADS=1 python calib_group.py --measures --only power --groups 40
        --amplitude 0.3 --out RUNS
    python calib_group.py --report --out RUNS
    OMP_NUM_THREADS=1 python calib_group.py --only centring --groups 200 --out RUNS

Brain maps: :func:`mlem_neuro.stats.second_level_maps` (nilearn's
``non_parametric_inference``, voxel-level max-t family-wise error over the map) on
groups of ``--map-subjects`` subjects, each :func:`mlem_neuro.mlem_searchlight` with the
defaults on 36 simulated images of 5 x 5 x 5 voxels of 3 mm (every voxel a 6 mm sphere
centre; ``calib_null.noise_images``):

* ``maps``: ``B`` adds a random pattern inside the central sphere (amplitude 0.8), ``A``
  never: the rate of groups where ``A``'s map has a voxel at FWE p < 0.05.
* ``maps-power``: ``A`` encoded there with ``--map-amplitude``: groups with an
  FWE-significant voxel within 6 mm of the encoded centre, and with one in ``B``'s map
  (no voxel of this small grid is more than 12 mm from the centre, so a far hit cannot
  be counted here).

The earlier runs on the method page (``--only other``; ``--only noise --groups 100``; ``--only
power --groups 100 --amplitude 0.3`` and ``0.25``; ``--only maps --groups 100``; ``--only
maps-power --groups 40``) took 85 min of CPU on one busy core::

    OMP_NUM_THREADS=1 python validation/calib_group.py [--groups 200] [--subjects 12]
        [--only other|noise|power|maps|maps-power] [--amplitude 0.3]
        [--measures --out DIR] [--report --out DIR]
"""
import argparse
import json
import os
import tempfile
import time
import warnings

import numpy as np
import torch
from _common import scale_channels, wilson

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs
from mlem_neuro.stats import permutation_cluster_test

SIM = dict(n_trials=40, n_channels=8, n_times=30, sfreq=50.0, tmin=-0.1)
WINDOW = (0.1, 0.3)


def subject(seed, windows, amplitude, with_data=False):
    data, table, times = simulate_epochs(windows=windows, amplitude=amplitude,
                                         random_state=seed, **SIM)
    # the analysis is seeded apart from the data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # a flat held-out fold, by chance
        res = mlem_neuro.mlem_array(data, table, times=times, random_state=10**6 + seed,
                                    verbose="WARNING")
    return (res, data, table) if with_data else res


def rsa_curves(data, table, features):
    """Per feature, the RSA time course ``(n_times,)``: Spearman correlation, at each time
    point, between the Euclidean RDM of the trials' channel patterns (channels scaled to
    zero mean and unit variance over trials and times, as ``mlem_array`` does by default)
    and the feature's model RDM (1 where two trials differ in it, 0 where they agree)."""
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr

    x = scale_channels(data)
    neural = [pdist(x[:, :, t], "euclidean") for t in range(x.shape[2])]
    out = {}
    for f in features:
        codes = np.asarray(table[f].astype(str))
        model = pdist(codes[:, None], lambda u, v: float(u[0] != v[0]))
        out[f] = np.array([spearmanr(d, model)[0] for d in neural])
    return out


def rsa_cluster_test(X, seed, n_null):
    """The sign-flip cluster test of ``permutation_cluster_test`` on ``X (n_subjects,
    n_times)``, called the same way (MNE, ``threshold=None``: the one-sided t at p = 0.05,
    ``tail=1``, the same number of sign flips and seed): significant clusters (masks)."""
    import inspect

    from mne.stats import permutation_cluster_1samp_test

    seed_kw = ("rng" if "rng" in inspect.signature(permutation_cluster_1samp_test).parameters
               else "seed")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No clusters found")
        _, clusters, pvals, _ = permutation_cluster_1samp_test(
            X, threshold=None, n_permutations=int(n_null), tail=1, out_type="indices",
            verbose=False, **{seed_kw: seed})
    masks = []
    for c, p in zip(clusters, pvals):
        if p < 0.05:
            mask = np.zeros(X.shape[1], dtype=bool)
            mask[np.asarray(c[0] if isinstance(c, tuple) else c, dtype=int)] = True
            masks.append(mask)
    return masks, (float(np.min(pvals)) if len(pvals) else 1.0)


def clusters(results, term, measure, seed, n_permutations):
    st = permutation_cluster_test(results, term, measure=measure, random_state=seed,
                                  n_null=n_permutations, verbose="WARNING")
    return [c for c, p in zip(st.clusters, st.cluster_p_values) if p < 0.05], st.times


def study(kind, n_groups, n_subjects, amplitude, n_permutations):
    windows = {"other": {"A": None, "B": WINDOW}, "noise": {"A": None, "B": None},
               "power": {"A": WINDOW, "B": None}}[kind]
    amp = {"other": 1.0, "noise": 1.0, "power": amplitude}[kind]
    tests = {"other": [("A", "importance")],
             "noise": [(None, "score"), ("A", "importance"), ("B", "importance")],
             "power": [("A", "importance"), ("B", "importance")]}[kind]
    any_sig = {t: [] for t, _ in tests}
    hit, far = [], []
    for g in range(n_groups):
        seeds = range(g * n_subjects, (g + 1) * n_subjects)
        results = [subject(s, windows, amp) for s in seeds]
        for term, measure in tests:
            sig, times = clusters(results, term, measure, g, n_permutations)
            any_sig[term].append(bool(sig))
            if kind == "power" and term == "A":
                inside = (times >= WINDOW[0]) & (times <= WINDOW[1])
                away = (times < WINDOW[0] - 0.1) | (times > WINDOW[1] + 0.1)
                hit.append(any(c[inside].any() for c in sig))
                far.append(any(c[away].any() for c in sig))
    out = {("score" if t is None else t): float(np.mean(v)) for t, v in any_sig.items()}
    if kind == "power":
        out.update(hit=float(np.mean(hit)), far=float(np.mean(far)))
    return out


MEASURES = ("importance", "main_effect", "rsa")


def measures_path(out, kind, amplitude):
    name = "noise" if kind == "noise" else f"power-{amplitude:g}"
    return os.path.join(out, f"calib_group_{name}.jsonl")


def measures_group(kind, g, n_subjects, amplitude, n_permutations):
    """One group at the defaults: each subject analysed once by ``mlem_array`` (no
    single-subject tests), then the cluster test of A and B with ``measure="importance"``,
    ``measure="main_effect"`` and on the group RSA (and the score, on noise)."""
    windows = {"noise": {"A": None, "B": None}, "power": {"A": WINDOW, "B": None}}[kind]
    amp = 1.0 if kind == "noise" else amplitude
    t0 = time.process_time()
    results, rsa = [], {"A": [], "B": []}
    for s in range(g * n_subjects, (g + 1) * n_subjects):
        res, data, table = subject(s, windows, amp, with_data=True)
        results.append(res)
        for f, curve in rsa_curves(data, table, ("A", "B")).items():
            rsa[f].append(curve)
    t_analysis = time.process_time() - t0
    times = results[0].times
    inside = (times >= WINDOW[0]) & (times <= WINDOW[1])
    away = (times < WINDOW[0] - 0.1) | (times > WINDOW[1] + 0.1)
    row = dict(kind=kind, group=g, amplitude=amp, n_subjects=n_subjects,
               n_repeats=int(results[0].fold_score.shape[0]) // 2,
               cpu_analysis=t_analysis)
    tests = [("A", m) for m in MEASURES] + [("B", m) for m in MEASURES]
    if kind == "noise":
        tests.append((None, "score"))
    for term, measure in tests:
        if measure == "rsa":
            X = np.stack(rsa[term])
            sig, p_min = rsa_cluster_test(X, g, n_permutations)
        else:
            st = permutation_cluster_test(results, term, measure=measure, random_state=g,
                                          n_null=n_permutations, verbose="WARNING")
            X = st.data
            sig = st.significant(0.05)
            p_min = float(st.cluster_p_values.min()) if len(st.cluster_p_values) else 1.0
        key = "score" if term is None else f"{term}/{measure}"
        row[key] = dict(sig=bool(sig), hit=any(bool(c[inside].any()) for c in sig),
                        far=any(bool(c[away].any()) for c in sig), p_min=p_min,
                        # per subject, the mean over all times and over the window
                        mean=X.mean(axis=1).tolist(), window=X[:, inside].mean(axis=1).tolist())
    row["cpu"] = time.process_time() - t0
    return row


def measures_study(kind, n_groups, n_subjects, amplitude, n_permutations, out):
    """Run groups until ``n_groups`` are saved in ``out`` (one JSON line per group, written
    as it finishes: a stopped run resumes where it stopped)."""
    file = measures_path(out, kind, amplitude)
    done = read_rows(file)
    for g in range(len(done), n_groups):
        row = measures_group(kind, g, n_subjects, amplitude, n_permutations)
        with open(file, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        done.append(row)
        print(f"{kind} group {g + 1}/{n_groups}: {row['cpu']:.0f} s CPU; A clusters "
              + ", ".join(f"{m} {row['A/' + m]['sig']:d}" for m in MEASURES), flush=True)
    return done


def read_rows(file):
    if not os.path.exists(file):
        return []
    with open(file) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def report(out, amplitudes):
    """The rates saved in ``out``, with Wilson 95 % intervals."""
    def rate(rows, key, what):
        k, n = sum(r[key][what] for r in rows), len(rows)
        lo, hi = wilson(k, n)
        return f"{k}/{n} = {k / n:.3f} ({lo:.3f}-{hi:.3f})"

    names = {"importance": "importance", "main_effect": "main effect", "rsa": "group RSA"}
    noise = read_rows(measures_path(out, "noise", 0))
    if noise:
        print(f"noise ({len(noise)} groups): groups with a cluster at p < 0.05 "
              f"[score {rate(noise, 'score', 'sig')}]")
        for m in MEASURES:
            print(f"  {names[m]:12s} A {rate(noise, 'A/' + m, 'sig')}   "
                  f"B {rate(noise, 'B/' + m, 'sig')}   A or B "
                  f"{sum(r['A/' + m]['sig'] or r['B/' + m]['sig'] for r in noise)}"
                  f"/{len(noise)}")
        print("  unencoded features' subject means over all times (mean, its standard "
              "error over subjects, skewness of the subject means):")
        from scipy.stats import skew

        for m in MEASURES:
            for f in ("A", "B"):
                v = np.concatenate([r[f"{f}/{m}"]["mean"] for r in noise])
                se = v.std(ddof=1) / np.sqrt(len(v))
                print(f"    {names[m]:12s} {f}: {v.mean():+.5f} (se {se:.5f}, sd "
                      f"{v.std(ddof=1):.5f}, skew {skew(v):+.2f}, {len(v)} subjects)")
        cpu = np.mean([r["cpu"] for r in noise])
        analyses = np.mean([r["cpu_analysis"] for r in noise])
        print(f"  CPU per group {cpu:.0f} s (analyses {analyses:.0f} s)")
    for a in amplitudes:
        power = read_rows(measures_path(out, "power", a))
        if not power:
            continue
        print(f"power, A encoded in {WINDOW} s at amplitude {a:g} ({len(power)} groups):")
        for m in MEASURES:
            print(f"  {names[m]:12s} A overlapping the window {rate(power, 'A/' + m, 'hit')}; "
                  f"A >= 0.1 s away {rate(power, 'A/' + m, 'far')}; "
                  f"B {rate(power, 'B/' + m, 'sig')}")
        cpu = np.array([r["cpu"] for r in power])
        print(f"  CPU per group {cpu.mean():.0f} s")


def centring(n_groups, n_subjects, n_permutations):
    """Noise only, main effect and group RSA only (no training needed): the null
    distribution of both at each time point over ``n_groups x n_subjects`` noise subjects
    (the seeds of ``--measures --only noise``: the first groups are the same subjects) and
    the rate of groups with a cluster at p < 0.05.  The sign-flip test asks an unencoded
    feature's values to be centred on 0 and symmetric across subjects.  The analyses here
    are one split and one training step: the main effect does not depend on the fits (the
    check against the saved subject means of ``--measures`` shows it is the same)."""
    from scipy.stats import skew

    windows = {"A": None, "B": None}
    me, rsa = {"A": [], "B": []}, {"A": [], "B": []}
    sig = {(f, m): [] for f in ("A", "B") for m in ("main_effect", "rsa")}
    t0 = time.process_time()
    for g in range(n_groups):
        results, curves = [], {"A": [], "B": []}
        for s in range(g * n_subjects, (g + 1) * n_subjects):
            data, table, times = simulate_epochs(windows=windows, amplitude=1.0,
                                                 random_state=s, **SIM)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                res = mlem_neuro.mlem_array(data, table, times=times, n_repeats=1,
                                            max_steps=1, random_state=10**6 + s,
                                            verbose="WARNING")
            results.append(res)
            for f, curve in rsa_curves(data, table, ("A", "B")).items():
                me[f].append(res.main_effect[:, res.feature_names.index(f)])
                rsa[f].append(curve)
                curves[f].append(curve)
        for f in ("A", "B"):
            st = permutation_cluster_test(results, f, measure="main_effect", random_state=g,
                                          n_null=n_permutations, verbose="WARNING")
            sig[f, "main_effect"].append(bool(st.significant(0.05)))
            sig[f, "rsa"].append(bool(rsa_cluster_test(np.stack(curves[f]), g,
                                                       n_permutations)[0]))
        if (g + 1) % 20 == 0:
            print(f"  {g + 1}/{n_groups} groups, {time.process_time() - t0:.0f} s CPU",
                  flush=True)
    out = {}
    for name, values in (("main effect", me), ("group RSA", rsa)):
        for f in ("A", "B"):
            v = np.stack(values[f])                         # (subjects, times)
            t = v.mean(axis=0) / (v.std(axis=0, ddof=1) / np.sqrt(len(v)))
            out[f"{name} {f}"] = v
            print(f"{name:12s} {f}: {v.size} values, mean {v.mean():+.5f} (se over subjects "
                  f"{v.mean(axis=1).std(ddof=1) / np.sqrt(len(v)):.5f}), sd {v.std():.4f}, "
                  f"skew {skew(v.ravel()):+.3f}, positive {np.mean(v > 0):.3f}; per time "
                  f"point t over subjects from {t.min():+.2f} to {t.max():+.2f}")
    for (f, m), v in sig.items():
        lo, hi = wilson(sum(v), len(v))
        print(f"{m:12s} {f}: groups with a cluster at p < 0.05 {sum(v)}/{len(v)} = "
              f"{np.mean(v):.3f} ({lo:.3f}-{hi:.3f})")
    print(f"{time.process_time() - t0:.0f} s CPU")
    return out


MAP_SHAPE = (5, 5, 5)


def map_study(kind, n_groups, n_subjects, amplitude, n_permutations):
    from calib_null import SL_RADIUS, noise_images

    from mlem_neuro.stats import second_level_maps

    feature, amp = ("B", 0.8) if kind == "maps" else ("A", amplitude)
    sig = {"A": [], "B": []}
    hit = []
    for g in range(n_groups):
        results = []
        for s in range(g * n_subjects, (g + 1) * n_subjects):
            imgs, table, mask, centre = noise_images(amplitude=amp, seed=s, shape=MAP_SHAPE,
                                                     feature=feature)
            results.append(mlem_neuro.mlem_searchlight(imgs, table, mask, radius=SL_RADIUS,
                                                       random_state=10**6 + s,
                                                       verbose="WARNING"))
        for term in ("A", "B") if kind == "maps-power" else ("A",):
            logp = second_level_maps(results, term, n_null=n_permutations, random_state=g)
            p = 10 ** -np.asarray(logp.dataobj, dtype=float)
            significant = p < 0.05
            sig[term].append(bool(significant.any()))
            if term == "A" and kind == "maps-power":
                grid = np.indices(MAP_SHAPE).reshape(3, -1).T * 3.0
                dist = np.linalg.norm(grid - centre, axis=1).reshape(MAP_SHAPE)
                hit.append(bool(significant[dist <= SL_RADIUS].any()))
    if kind == "maps":
        return {"A": float(np.mean(sig["A"]))}
    return dict(hit=float(np.mean(hit)), B=float(np.mean(sig["B"])))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--subjects", type=int, default=12)
    parser.add_argument("--only", default=None,
                        choices=("other", "noise", "power", "maps", "maps-power",
                                 "centring"))
    parser.add_argument("--map-subjects", type=int, default=10)
    parser.add_argument("--map-amplitude", type=float, default=0.5)
    parser.add_argument("--amplitude", type=float, default=0.3)
    parser.add_argument("--n-permutations", type=int, default=1024)
    parser.add_argument("--measures", action="store_true",
                        help="noise and power: importance, main effect and group RSA side "
                             "by side, one JSON line per group saved in --out")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "calib_group"))
    parser.add_argument("--report", action="store_true",
                        help="print the rates saved in --out (with --measures)")
    parser.add_argument("--report-amplitudes", type=float, nargs="*", default=[0.3, 0.25])
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.report:
        report(args.out, args.report_amplitudes)
        return
    if args.only == "centring":
        print(f"main effect and RSA of unencoded features, {args.groups} noise groups of "
              f"{args.subjects} subjects, {SIM}")
        values = centring(args.groups, args.subjects, args.n_permutations)
        noise = read_rows(measures_path(args.out, "noise", 0))
        if noise:   # the same subjects' means saved by --measures --only noise
            saved = np.concatenate([r["A/main_effect"]["mean"] for r in noise])
            mine = values["main effect A"].mean(axis=1)
            k = min(len(saved), len(mine))
            print(f"main effect of A against the {k} subject means saved by --measures: "
                  f"largest difference {np.abs(saved[:k] - mine[:k]).max():.2g}")
        return
    print(f"{args.groups} groups of {args.subjects} subjects, each {SIM}; mlem_array "
          f"defaults; cluster test with {args.n_permutations} sign flips, p < 0.05")
    if args.measures:
        if args.only not in ("noise", "power"):
            parser.error("--measures runs --only noise or --only power")
        os.makedirs(args.out, exist_ok=True)
        measures_study(args.only, args.groups, args.subjects, args.amplitude,
                       args.n_permutations, args.out)
        report(args.out, [args.amplitude])
        return
    for kind in ("other", "noise", "power"):
        if args.only not in (None, kind):
            continue
        t0 = time.process_time()
        r = study(kind, args.groups, args.subjects, args.amplitude, args.n_permutations)
        took = time.process_time() - t0
        if kind == "other":
            print(f"B encoded in {WINDOW} s, A never: groups with a significant A cluster "
                  f"{r['A']:.3f} ({took:.0f} s CPU)")
        elif kind == "noise":
            print("pure noise: groups with a significant cluster: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r.items()) + f" ({took:.0f} s CPU)")
        else:
            print(f"A encoded in {WINDOW} s (amplitude {args.amplitude:g}), B never: "
                  f"A cluster overlapping the window {r['hit']:.3f}, A cluster >= 0.1 s "
                  f"away {r['far']:.3f}, any B cluster {r['B']:.3f} ({took:.0f} s CPU)")
    for kind in ("maps", "maps-power"):
        if args.only not in (None, kind):
            continue
        t0 = time.process_time()
        r = map_study(kind, args.groups, args.map_subjects, args.map_amplitude,
                      args.n_permutations)
        took = time.process_time() - t0
        print(f"maps, {args.map_subjects} subjects per group, {MAP_SHAPE} voxels: ", end="")
        if kind == "maps":
            print(f"B encoded in the central sphere, A never: groups with an FWE-significant "
                  f"A voxel {r['A']:.3f} ({took:.0f} s CPU)")
        else:
            print(f"A encoded in the central sphere (amplitude {args.map_amplitude:g}): "
                  f"groups with an FWE-significant A voxel within 6 mm {r['hit']:.3f}, "
                  f"any B voxel {r['B']:.3f} "
                  f"({took:.0f} s CPU)")


if __name__ == "__main__":
    main()
