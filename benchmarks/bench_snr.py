"""Signal-to-noise of importance time courses against a plain RSA curve, on real recordings.

For each recording, the same arrays go to

* a plain RSA written here with numpy/scipy: per time point, the Spearman correlation of
  the Euclidean RDM of the stimuli's patterns with a feature's RDM (1 where the stimuli
  differ in that feature, else 0);
* :func:`mlem_neuro.mlem_array` at level ``"feature"`` with each setting of ``--settings``
  (``cv`` folds, ``n_repeats``, ``n_permutations``); with ``--items``, the IT units'
  pseudo-trials of one object x position are the trials of one item (``items=``; folds split
  items, pairs are between items) and ``--distance`` chooses how the items' distances are
  computed (``euclidean`` between trial means, ``cv_euclidean`` or ``crossnobis`` across
  the pseudo-trials).

The SNR of a curve is its peak after stimulus onset divided by the standard deviation of
its values before onset (the baseline).  For the IT units, each curve is also computed on
two disjoint halves of the units (even and odd files) and the script prints the Pearson
correlation of the two halves' post-onset curves (replication).

Recordings (``../shared/data``; a missing one is skipped):

* ``zhang_desimone_it_units_part1``: 64 IT units, 7 objects x 3 positions; pseudo-trials
  (the trials of each object x position split into ``--groups`` groups, averaged), firing
  rates averaged in 100 ms windows every 25 ms from -0.3 s to 0.45 s;
* ``eeglab_tutorial_eeg``: 80 EEG trials, attended position 1 / 2 (one binary feature),
  62.5 ms windows every 15.6 ms from -0.2 s to 0.6 s.

    OMP_NUM_THREADS=1 python benchmarks/bench_snr.py [--settings 5:1:10 5:5:10]
        [--items [--distance cv_euclidean]] [--lr 0.03 --patience 50 --tol 1e-4]
"""
import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.io
import scipy.stats
import torch
from _common import add_optimiser_arguments

import mlem_neuro

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def it_units(n_groups, window=0.1, step=0.025):
    """(stimuli, units, times) rates, the feature table and the time grid, or None."""
    folder = DATA / "zhang_desimone_it_units_part1"
    if not folder.is_dir():
        return None
    rows, conditions = [], None
    for path in sorted((folder / "raster_mat").glob("*.mat")):
        mat = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
        rate = mat["raster_data"].astype(float) * 1000
        labels = np.asarray(mat["raster_labels"].combined_ID_position)
        unit, conds = [], []
        for condition in sorted(set(labels)):
            for group in np.array_split(np.flatnonzero(labels == condition), n_groups):
                unit.append(rate[group].mean(axis=0))
                conds.append(condition)
        assert conditions is None or conds == conditions
        conditions = conds
        rows.append(np.array(unit))
    data = np.stack(rows, axis=1)                       # (stimuli, units, 1000 ms)
    times = np.arange(-500, 500) / 1000
    centres = np.arange(-0.3, 0.45 + 1e-9, step)
    half = int(round(window * 1000 / 2))
    idx = [int(np.argmin(np.abs(times - c))) for c in centres]
    binned = np.stack([data[:, :, k - half:k + half].mean(axis=-1) for k in idx], axis=-1)
    table = pd.DataFrame([c.split("_") for c in conditions], columns=["object", "position"])
    return binned, table, centres


def eeglab_epochs():
    """The EEGLAB recording's 80 target trials (-0.2 to 0.6 s, baseline corrected), with
    their metadata, or None."""
    folder = DATA / "eeglab_tutorial_eeg"
    if not folder.is_dir():
        return None
    import mne

    raw = mne.io.read_raw_eeglab(folder / "test_raw.set", preload=True, verbose=False)
    events, event_id = mne.events_from_annotations(raw, verbose=False)
    squares = events[events[:, 2] == event_id["square"]]
    meta = pd.read_csv(folder / "square_trials.csv")
    return mne.Epochs(raw, squares, tmin=-0.2, tmax=0.6, baseline=(None, 0),
                      metadata=meta, preload=True, verbose=False)


def eeglab_trials():
    epochs = eeglab_epochs()
    if epochs is None:
        return None
    meta = epochs.metadata
    x = epochs.get_data(copy=True)
    width, step = 8, 2                                  # 62.5 ms windows every 15.6 ms
    starts = np.arange(0, x.shape[-1] - width + 1, step)
    binned = np.stack([x[..., s:s + width].mean(axis=-1) for s in starts], axis=-1)
    times = np.array([epochs.times[s:s + width].mean() for s in starts])
    table = pd.DataFrame({"position": meta["position"].astype(str)})
    return binned, table, times


def n400_simulation(seed, amplitude=0.25):
    """Simulated EEG with an N400-like effect: 120 word pairs x 32 channels, 10 ms samples
    from -0.2 to 0.7 s; a binary ``length`` feature encoded at 100-200 ms and a binary
    ``related`` feature at 300-500 ms (the effect whose curve is measured), each with a
    random channel pattern of unit RMS, amplitude ``amplitude``, white noise of sd 1."""
    from mlem_neuro.simulation import simulate_epochs

    data, table, times = simulate_epochs(
        n_trials=120, n_channels=32, n_times=91, sfreq=100.0, tmin=-0.2,
        windows={"length": (0.1, 0.2), "related": (0.3, 0.5)}, amplitude=amplitude,
        random_state=seed)
    return data, table, times


def weak_searchlight(seed, n=60, shape=(10, 10, 10), centre=(5, 5, 5), amp=0.3):
    """Simulated images: noise everywhere, binary feature "a" adds a fixed random pattern
    inside one 6 mm sphere (3 mm voxels), "b" encoded nowhere."""
    import nibabel as nib

    rng = np.random.default_rng(seed)
    a = np.tile([0, 1], n // 2)
    b = rng.permutation(np.tile([0, 1], n // 2))
    data = rng.standard_normal(shape + (n,))
    grid = np.indices(shape).reshape(3, -1).T
    inside = (np.linalg.norm((grid - np.asarray(centre)) * 3.0, axis=1) <= 6.0).reshape(shape)
    data[inside] += amp * rng.standard_normal(shape)[inside][:, None] * a[None, :]
    affine = np.diag([3.0, 3.0, 3.0, 1.0])
    imgs = nib.Nifti1Image(data.astype(np.float32), affine)
    mask = nib.Nifti1Image(np.ones(shape, np.int8), affine)
    table = pd.DataFrame({"a": np.where(a, "on", "off"), "b": np.where(b, "u", "v")})
    return imgs, table, mask, np.asarray(centre)


def searchlight_peaks(settings, seeds, **optimiser):
    """Distance (voxels) of the peak of "a"'s importance map from the encoded sphere."""
    print(f"\nweak searchlight: 60 images of 10x10x10 voxels, every voxel a 6 mm sphere "
          f"centre, 'a' encoded at amplitude 0.3 in one sphere; seeds {list(seeds)}")
    from mlem_neuro.searchlight import sphere_membership

    dist = []
    for seed in seeds:
        imgs, table, mask, centre = weak_searchlight(seed)
        x = imgs.get_fdata().reshape(-1, imgs.shape[-1]).T          # (images, voxels)
        grid = np.indices(imgs.shape[:3]).reshape(3, -1).T
        A = sphere_membership(grid * 3.0, np.ones(imgs.shape[:3], bool), imgs.affine, 6.0)
        i, j = np.triu_indices(x.shape[0], 1)
        model = (table["a"].to_numpy()[i] != table["a"].to_numpy()[j]).astype(float)
        r = [scipy.stats.spearmanr(np.linalg.norm(x[i][:, row.indices] - x[j][:, row.indices],
                                                  axis=1), model)[0]
             for row in (A.getrow(k) for k in range(A.shape[0]))]
        dist.append(float(np.linalg.norm(grid[int(np.argmax(r))] - centre)))
    print(f"  RSA (Euclidean RDM, by hand):{'':4s} peak distance median "
          f"{np.median(dist):.1f}, max {max(dist):.1f} voxels, within 2 voxels in "
          f"{sum(d <= 2 for d in dist)} of {len(dist)}")
    for cv, rep, K in settings:
        dist, took = [], 0.0
        for seed in seeds:
            imgs, table, mask, centre = weak_searchlight(seed)
            t0 = time.process_time()
            res = mlem_neuro.mlem_searchlight(imgs, table, mask, radius=6.0, cv=cv,
                                              n_repeats=rep, n_permutations=K,
                                              random_state=seed, verbose="WARNING",
                                              **optimiser)
            took += time.process_time() - t0
            imp = res.importance[:, res.terms.index("a")]
            peak = res.model_coords()[np.argmax(imp)] / 3.0      # voxel units
            dist.append(float(np.linalg.norm(peak - centre)))
        print(f"  MLEM cv={cv} x{rep} K={K}:{'':6s} peak distance median {np.median(dist):.1f}, "
              f"max {max(dist):.1f} voxels, within 2 voxels in "
              f"{sum(d <= 2 for d in dist)} of {len(dist)} ({took:.1f} s CPU)")


def rsa_curve(data, column):
    """Spearman of the Euclidean RDM with the feature RDM, per time point."""
    i, j = np.triu_indices(data.shape[0], 1)
    model = (np.asarray(column)[i] != np.asarray(column)[j]).astype(float)
    out = []
    for t in range(data.shape[-1]):
        x = data[:, :, t]
        d = np.sqrt(((x[i] - x[j]) ** 2).sum(axis=1))
        out.append(scipy.stats.spearmanr(d, model)[0])
    return np.array(out)


def snr(curve, times):
    base = curve[times < 0]
    return float(curve[times > 0].max() / base.std(ddof=1))


def mlem_curves(data, table, times, cv, n_repeats, n_permutations, seed, items=None,
                distance="euclidean", **optimiser):
    res = mlem_neuro.mlem_array(data, table, times=times, cv=cv, n_repeats=n_repeats,
                                n_permutations=n_permutations, random_state=seed,
                                items=items, distance=distance, verbose="WARNING",
                                **optimiser)
    return {f: res.importance[:, res.terms.index(f)] for f in table.columns}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", default=["5:1:10", "5:5:10", "5:5:50"],
                        help="cv:n_repeats:n_permutations of each MLEM run (n_repeats may be "
                             "'auto')")
    parser.add_argument("--groups", type=int, default=4,
                        help="pseudo-trials per object x position (IT units)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--items", action="store_true",
                        help="IT units: one item per object x position (its pseudo-trials)")
    parser.add_argument("--distance", default="euclidean",
                        choices=["euclidean", "cv_euclidean", "crossnobis"],
                        help="distance between items (with --items)")
    parser.add_argument("--recordings", nargs="+", default=["IT units", "EEGLAB"],
                        choices=["IT units", "EEGLAB", "N400 simulation", "searchlight"])
    parser.add_argument("--n-sims", type=int, default=10,
                        help="simulated datasets of the weak searchlight")
    add_optimiser_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = [tuple(v if v == "auto" else int(v) for v in s.split(":"))
                for s in args.settings]
    loaders = {"IT units": lambda: it_units(args.groups), "EEGLAB": eeglab_trials,
               "N400 simulation": lambda: n400_simulation(args.seed)}
    recordings = {name: loaders[name]() for name in args.recordings if name in loaders}
    if "searchlight" in args.recordings:
        searchlight_peaks(settings, range(args.n_sims), lr=args.lr, patience=args.patience,
                          tol=args.tol)
    for name, rec in recordings.items():
        if rec is None:
            print(f"{name}: data not found, skipped")
            continue
        data, table, times = rec
        halves = ([("all", slice(None)), ("even", slice(0, None, 2)),
                   ("odd", slice(1, None, 2))] if name == "IT units" else [("all", slice(None))])
        print(f"\n{name}: {data.shape[0]} stimuli x {data.shape[1]} units x {len(times)} "
              f"time points, features {list(table.columns)}; MLEM lr={args.lr}, "
              f"patience={args.patience}, tol={args.tol:g}")
        curves = {}
        items = None
        if args.items and name == "IT units":
            items = (table["object"] + "_" + table["position"]).to_numpy()
            print(f"  MLEM: items= one per object x position ({len(set(items))} items), "
                  f"distance={args.distance!r}")
        for half, sl in halves:
            for f in table.columns:
                curves[("RSA", half, f)] = rsa_curve(data[:, sl], table[f])
            for cv, rep, K in settings:
                t0 = time.process_time()
                out = mlem_curves(data[:, sl], table, times, cv, rep, K, args.seed,
                                  items=items,
                                  distance=args.distance if items is not None else "euclidean",
                                  lr=args.lr, patience=args.patience, tol=args.tol)
                took = time.process_time() - t0
                for f, c in out.items():
                    curves[(f"MLEM cv={cv} x{rep} K={K}", half, f)] = c
                if half == "all":
                    print(f"  MLEM cv={cv} n_repeats={rep} n_permutations={K}: {took:.1f} s CPU")
        methods = ["RSA"] + [f"MLEM cv={cv} x{rep} K={K}" for cv, rep, K in settings]
        for f in table.columns:
            print(f"  feature {f!r}:")
            for m in methods:
                line = f"    {m:28s} SNR {snr(curves[(m, 'all', f)], times):6.1f}"
                if len(halves) > 1:
                    post = times > 0
                    r = np.corrcoef(curves[(m, "even", f)][post],
                                    curves[(m, "odd", f)][post])[0, 1]
                    line += (f"   halves SNR {snr(curves[(m, 'even', f)], times):5.1f} / "
                             f"{snr(curves[(m, 'odd', f)], times):5.1f}, replication r = "
                             f"{r:.2f}")
                print(line)


if __name__ == "__main__":
    main()
