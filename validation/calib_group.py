"""Calibration and power of the group-level test of importance time courses.

:func:`mlem_neuro.stats.permutation_cluster_test` (a sign-flip cluster permutation test
across subjects, MNE's :func:`~mne.stats.permutation_cluster_1samp_test`) on groups of
simulated subjects, each analysed by :func:`mlem_neuro.mlem_array` with the defaults
(feature-level importance, 5 folds, 10 importance permutations).  Each subject is
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

The runs on the method page (``--only other``; ``--only noise --groups 100``; ``--only
power --groups 100 --amplitude 0.3`` and ``0.25``; ``--only maps --groups 100``; ``--only
maps-power --groups 40``) took 85 min of CPU on one busy core::

    OMP_NUM_THREADS=1 python validation/calib_group.py [--groups 200] [--subjects 12]
        [--only other|noise|power|maps|maps-power] [--amplitude 0.3]
"""
import argparse
import time

import numpy as np
import torch

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs
from mlem_neuro.stats import permutation_cluster_test

SIM = dict(n_trials=40, n_channels=8, n_times=30, sfreq=50.0, tmin=-0.1)
WINDOW = (0.1, 0.3)


def subject(seed, windows, amplitude):
    data, table, times = simulate_epochs(windows=windows, amplitude=amplitude,
                                         random_state=seed, **SIM)
    # the analysis is seeded apart from the data
    return mlem_neuro.mlem_array(data, table, times=times, random_state=10**6 + seed,
                                 verbose="WARNING")


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
                        choices=("other", "noise", "power", "maps", "maps-power"))
    parser.add_argument("--map-subjects", type=int, default=10)
    parser.add_argument("--map-amplitude", type=float, default=0.5)
    parser.add_argument("--amplitude", type=float, default=0.3)
    parser.add_argument("--n-permutations", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.groups} groups of {args.subjects} subjects, each {SIM}; mlem_array "
          f"defaults; cluster test with {args.n_permutations} sign flips, p < 0.05")
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
