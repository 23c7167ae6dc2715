"""Calibration and power of the group-level test of interactions (non-additivity).

:func:`mlem_neuro.stats.permutation_cluster_test` with ``measure="interactions"``: per
subject, the held-out score of :func:`mlem_neuro.mlem_array` with the defaults (SPD metric
with interactions, 5 folds) minus that of the same analysis with ``constraint="diagonal"``
(the additive model, same folds), tested above 0 across subjects by sign-flip cluster
permutations (MNE's :func:`~mne.stats.permutation_cluster_1samp_test`).

Each subject: 40 trials x 8 channels x 30 time points at 50 Hz from -0.1 s.  The trials'
features and noise-free codes come from :func:`mlem_neuro.simulation.simulate_codes` (every
feature in its own subspace, so the truth is known), rotated into the 8 channels at random
and added, inside 0.1-0.3 s with a Hann envelope times ``--amplitude``, to unit Gaussian
noise.  Groups are disjoint (no subject is in two groups).

* ``binary``, ``multi-level``, ``numeric``: additive codes (false-positive rate): three
  binary features; two 3-level categorical features (equidistant levels) and a binary
  one; three numeric features (linear codes).  ``numeric-curved``: the same numeric codes,
  with each feature reported as the cube of the coded value (a main effect that is not
  linear in the reported value).  Feature weights are drawn uniformly in
  [0.5, 1.5] per subject.  The rate of groups with an ``interactions`` cluster at p < 0.05
  anywhere.
* ``noise``: nothing encoded: the same rate.
* ``power``: three binary features, ``f0`` and ``f1`` with the sub-additive code of
  strength ``--interaction`` (pairs differing in both are ``sqrt(2 (1 - s))`` apart, pairs
  differing in one 1 apart), equal weights: the rate of groups with a cluster overlapping
  the window, and with one holding a time at least 0.1 s from it.

The script also prints the mean gain (score with interactions minus additive score) over
every subject, inside the window and before 0 s, with its standard error over subjects.

Brain maps (``maps``, ``maps-power``): :func:`mlem_neuro.stats.second_level_maps` with
``term="interactions"`` (nilearn's ``non_parametric_inference``, voxel-level max-t
family-wise error) on groups of ``--map-subjects`` subjects, each two
:func:`mlem_neuro.mlem_searchlight` runs (defaults, and ``constraint="diagonal"``) on 36
images of 5 x 5 x 5 voxels of 3 mm of unit noise, every voxel a 6 mm sphere centre; the
three binary features' codes (additive for ``maps``, ``f0 x f1`` sub-additive for
``maps-power``) are rotated at random into the voxels of the central sphere, times
``--map-amplitude``.  ``maps``: groups with an FWE-significant voxel anywhere;
``maps-power``: groups with one within 6 mm of the centre (no voxel of this grid is more
than 12 mm from it, so far hits are not measured here).

The runs on the method page: ``--only binary`` (200 groups); ``--only multi-level --groups
60``; ``--only numeric --groups 20``; ``--only numeric-curved --groups 40``; ``--only noise
--groups 100``; ``--only power --groups 40 --amplitude 2`` (and ``2.5``, ``3``); ``--only
maps --groups 100 --map-amplitude 4``; ``--only maps --groups 200 --map-amplitude 0`` (pure
noise); ``--only maps-power --groups 40 --map-amplitude 4`` (and ``6``)::

    OMP_NUM_THREADS=1 python validation/calib_group_interactions.py --only binary
        [--groups 200] [--subjects 12] [--amplitude 3] [--interaction 0.8]
        [--map-subjects 10] [--map-amplitude 2]
"""
import argparse
import time
import warnings

import numpy as np
import torch

import mlem_neuro
from mlem_neuro.simulation import simulate_codes
from mlem_neuro.stats import permutation_cluster_test

N_TRIALS, N_CHANNELS, N_TIMES, SFREQ, TMIN = 40, 8, 30, 50.0, -0.1
WINDOW = (0.1, 0.3)
KINDS = {"binary": ("binary",) * 3, "multi-level": ("categorical", "categorical", "binary"),
         "numeric": ("numeric",) * 3, "numeric-curved": ("numeric",) * 3,
         "noise": ("binary",) * 3, "power": ("binary",) * 3}
MAP_KINDS = ("maps", "maps-power")
MAP_SHAPE, MAP_VOXEL, MAP_RADIUS, MAP_IMAGES = (5, 5, 5), 3.0, 6.0, 36


def times_and_envelope():
    times = TMIN + np.arange(N_TIMES) / SFREQ
    inside = (times >= WINDOW[0]) & (times <= WINDOW[1])
    env = np.zeros(N_TIMES)
    env[inside] = np.hanning(inside.sum() + 2)[1:-1]
    return times, env


def subject(kind, seed, amplitude, interaction):
    """One subject's ``(full, additive)`` results."""
    rng = np.random.default_rng(seed)
    times, env = times_and_envelope()
    power = kind == "power"
    weights = None if power else rng.uniform(0.5, 1.5, 3)
    code, table = simulate_codes(N_TRIALS, KINDS[kind], n_units=N_CHANNELS, noise=0.0,
                                 n_levels=3, interaction=interaction if power else 0.0,
                                 weights=weights, random_state=rng)
    if kind == "numeric-curved":         # codes linear in x, reported as x³
        table = table ** 3
    rotation = np.linalg.qr(rng.standard_normal((N_CHANNELS, N_CHANNELS)))[0]
    amp = 0.0 if kind == "noise" else amplitude
    data = (amp * code @ rotation.T)[:, :, None] * env
    data = data + rng.standard_normal((N_TRIALS, N_CHANNELS, N_TIMES))
    kw = dict(times=times, random_state=10**6 + seed, verbose="WARNING")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # a held-out fold flat in a feature
        full = mlem_neuro.mlem_array(data, table, **kw)
        additive = mlem_neuro.mlem_array(data, table, constraint="diagonal", **kw)
    return full, additive


def study(kind, n_groups, n_subjects, amplitude, interaction, n_permutations):
    times, _ = times_and_envelope()
    inside = (times >= WINDOW[0]) & (times <= WINDOW[1])
    away = (times < WINDOW[0] - 0.1) | (times > WINDOW[1] + 0.1)
    any_sig, hit, far, gains = [], [], [], []
    for g in range(n_groups):
        pairs = [subject(kind, s, amplitude, interaction)
                 for s in range(g * n_subjects, (g + 1) * n_subjects)]
        full, additive = [p[0] for p in pairs], [p[1] for p in pairs]
        st = permutation_cluster_test(full, measure="interactions", additive=additive,
                                      n_permutations=n_permutations, seed=g,
                                      verbose="WARNING")
        sig = st.significant(0.05)
        any_sig.append(bool(sig))
        hit.append(any(c[inside].any() for c in sig))
        far.append(any(c[away].any() for c in sig))
        gains.append(st.data)
    gains = np.concatenate(gains)
    return dict(any=float(np.mean(any_sig)), hit=float(np.mean(hit)),
                far=float(np.mean(far)), gain_window=_mean_se(gains[:, inside].mean(1)),
                gain_baseline=_mean_se(gains[:, times < 0].mean(1)))


def map_subject(seed, amplitude, interaction):
    """One subject's ``(full, additive)`` searchlight results and the encoded centre."""
    import nibabel as nib

    rng = np.random.default_rng(seed)
    code, table = simulate_codes(MAP_IMAGES, ("binary",) * 3, n_units=8, noise=0.0,
                                 interaction=interaction, random_state=rng)
    grid = np.indices(MAP_SHAPE).reshape(3, -1).T * MAP_VOXEL
    centre = np.array(MAP_SHAPE) // 2 * MAP_VOXEL
    inside = np.linalg.norm(grid - centre, axis=1) <= MAP_RADIUS
    rotation = np.linalg.qr(rng.standard_normal((inside.sum(), inside.sum())))[0][:, :8]
    data = rng.standard_normal((len(grid), MAP_IMAGES))
    data[inside] += amplitude * rotation @ code.T
    affine = np.diag([MAP_VOXEL] * 3 + [1.0])
    imgs = nib.Nifti1Image(data.reshape(MAP_SHAPE + (MAP_IMAGES,)).astype(np.float32), affine)
    mask = nib.Nifti1Image(np.ones(MAP_SHAPE, np.int8), affine)
    kw = dict(radius=MAP_RADIUS, random_state=10**6 + seed, verbose="WARNING")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return (mlem_neuro.mlem_searchlight(imgs, table, mask, **kw),
                mlem_neuro.mlem_searchlight(imgs, table, mask, constraint="diagonal", **kw),
                centre)


def map_study(kind, n_groups, n_subjects, amplitude, interaction, n_permutations):
    from mlem_neuro.stats import second_level_maps

    interaction = interaction if kind == "maps-power" else 0.0
    any_sig, hit = [], []
    for g in range(n_groups):
        pairs = [map_subject(s, amplitude, interaction)
                 for s in range(g * n_subjects, (g + 1) * n_subjects)]
        logp = second_level_maps([p[0] for p in pairs], "interactions",
                                 additive=[p[1] for p in pairs], n_perm=n_permutations,
                                 random_state=g)
        significant = 10 ** -np.asarray(logp.dataobj, dtype=float) < 0.05
        grid = np.indices(MAP_SHAPE).reshape(3, -1).T * MAP_VOXEL
        near = (np.linalg.norm(grid - pairs[0][2], axis=1) <= MAP_RADIUS).reshape(MAP_SHAPE)
        any_sig.append(bool(significant.any()))
        hit.append(bool(significant[near].any()))
    return dict(any=float(np.mean(any_sig)), hit=float(np.mean(hit)))


def _mean_se(x):
    return float(np.mean(x)), float(np.std(x, ddof=1) / np.sqrt(len(x)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", required=True, choices=tuple(KINDS) + MAP_KINDS)
    parser.add_argument("--groups", type=int, default=200)
    parser.add_argument("--subjects", type=int, default=12)
    parser.add_argument("--amplitude", type=float, default=3.0)
    parser.add_argument("--interaction", type=float, default=0.8)
    parser.add_argument("--map-subjects", type=int, default=10)
    parser.add_argument("--map-amplitude", type=float, default=2.0)
    parser.add_argument("--n-permutations", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(1)
    t0 = time.process_time()
    if args.only in MAP_KINDS:
        r = map_study(args.only, args.groups, args.map_subjects, args.map_amplitude,
                      args.interaction, args.n_permutations)
        code = ("additive codes" if args.only == "maps"
                else f"f0 x f1 sub-additive (strength {args.interaction:g})")
        print(f"{args.only}: {code} in the central sphere, amplitude {args.map_amplitude:g}; "
              f"{args.groups} groups of {args.map_subjects} subjects; "
              f"{args.n_permutations} sign flips; {time.process_time() - t0:.0f} s CPU")
        print(f"  groups with an FWE-significant interactions voxel: {r['any']:.3f} "
              f"(within 6 mm of the centre {r['hit']:.3f})")
        return
    r = study(args.only, args.groups, args.subjects, args.amplitude, args.interaction,
              args.n_permutations)
    took = time.process_time() - t0
    what = {"noise": "nothing encoded",
            "power": f"f0 x f1 sub-additive (strength {args.interaction:g})"}.get(
                args.only, f"{args.only} additive codes")
    where = "" if args.only == "noise" else f", amplitude {args.amplitude:g} in {WINDOW} s"
    print(f"{args.only}: {what}{where}; "
          f"{args.groups} groups of {args.subjects} subjects; {args.n_permutations} sign "
          f"flips; {took:.0f} s CPU")
    print(f"  groups with an interactions cluster at p < 0.05: {r['any']:.3f} (overlapping "
          f"the window {r['hit']:.3f}, >= 0.1 s away from it {r['far']:.3f})")
    (mw, sw), (mb, sb) = r["gain_window"], r["gain_baseline"]
    print(f"  mean gain over subjects: window {mw:+.4f} (SE {sw:.4f}), before 0 s "
          f"{mb:+.4f} (SE {sb:.4f})")


if __name__ == "__main__":
    main()
