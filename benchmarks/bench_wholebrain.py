"""Whole-brain searchlight, end to end: every grey-matter voxel of MNI152 at 3 mm a centre.

The setting of issue 11's target:

* mask: nilearn's MNI152 grey-matter mask at 3 mm (``load_mni152_gm_mask(resolution=3)``,
  64,292 voxels, shipped with nilearn: no download), every voxel a sphere centre, radius
  6 mm;
* 96 simulated images (stimuli) described by 8 binary categorical features ``f0`` ... ``f7``
  (each "a" for 48 stimuli, "b" for the others, drawn independently): think of animacy,
  size, colour, ... of pictured objects;
* an encoded region: a ball of radius 12 mm centred at MNI (-42, -58, -12) (left ventral
  occipito-temporal cortex), where each voxel responds to ``f0`` and ``f1`` with its own
  random weights (unit-variance noise everywhere, signal ``--signal`` times the noise);
  the other features and the rest of the brain carry no signal;
* ``mlem_searchlight`` with its defaults (``level="feature"``, interactions modelled, 5
  folds) and 10 permutations.

It prints the wall time, the peak memory (this process and its joblib workers, sampled
from ``/proc``) and whether the
encoded region is recovered: the importance maps of ``f0`` and ``f1`` peak inside the region
and the null features do not exceed them.

``--compare`` first runs a subset of ``--compare-spheres`` centres (2,000; a quarter of them
inside the region) twice, with the engine's grouped soft ranks solved as before this
benchmark existed (torchsort's kernel on the groups expanded to the pairs) and as now, and
correlates the held-out rho and importance maps of the two runs.

Run: ``.venv/bin/python benchmarks/bench_wholebrain.py [--compare] [--n-jobs 2]`` (minutes on
2 CPU cores; ``--spheres N`` runs N random centres instead of the whole brain).
"""
import argparse
import warnings

import nibabel as nib
import numpy as np
import pandas as pd
from _common import (
    add_device_argument,
    add_optimiser_arguments,
    clock,
    describe,
    peak_rss_mib,
    warm_up,
)

import mlem_neuro
import mlem_neuro.core.ranks.grouped as grouped

CENTRE_MM = np.array([-42.0, -58.0, -12.0])
REGION_MM = 12.0


class TreeMemory:
    """Peak resident memory of this process and its children (joblib workers), summed,
    sampled every 0.5 s from ``/proc`` in a background thread."""

    def __init__(self):
        import os
        import threading

        self.peak, self.pid, self._stop = 0, os.getpid(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _tree(self):
        import os

        pids, frontier = {self.pid}, [self.pid]
        while frontier:
            pid = frontier.pop()
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
            except OSError:
                kids = []
            frontier += [k for k in kids if k not in pids]
            pids.update(kids)
        total = 0
        for pid in pids:
            try:
                with open(f"/proc/{pid}/statm") as fh:
                    total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except OSError:
                pass
        return total

    def _run(self):
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self._tree())

    def stop(self):
        self._stop.set()
        self.thread.join()
        return self.peak / 2**20


def make_data(n_images, signal, seed):
    """MNI152 grey matter at 3 mm, 96 images, 8 binary features, an encoded region."""
    from nilearn.datasets import load_mni152_gm_mask

    rng = np.random.default_rng(seed)
    mask_img = load_mni152_gm_mask(resolution=3)
    mask = np.asarray(mask_img.dataobj) > 0
    aff = mask_img.affine
    table = pd.DataFrame({f"f{k}": rng.permutation(np.tile(["a", "b"], n_images // 2))
                          for k in range(8)})
    ijk = np.argwhere(mask)
    xyz = nib.affines.apply_affine(aff, ijk)
    region = np.linalg.norm(xyz - CENTRE_MM, axis=1) <= REGION_MM
    X = rng.standard_normal((n_images, len(ijk))).astype(np.float32)
    for f in ("f0", "f1"):
        code = (table[f] == "a").to_numpy(np.float32) - 0.5
        weights = rng.standard_normal(int(region.sum())).astype(np.float32)
        X[:, region] += signal * np.outer(code, weights)
    data = np.zeros(mask.shape + (n_images,), np.float32)
    data[mask] = X.T
    region_img = np.zeros(mask.shape, bool)
    region_img[tuple(ijk[region].T)] = True
    return (nib.Nifti1Image(data, aff), table, nib.Nifti1Image(mask.astype(np.int8), aff),
            region_img)


def recovered(res, region):
    """Peak of each feature's map, and whether f0/f1 peak in the region above the nulls."""
    inside = region[tuple(res.voxel_indices.T)]
    lines, ok = [], True
    peaks = {}
    for f in res.terms:
        imp = res.importance[:, res.terms.index(f)]
        top = np.argsort(imp)[::-1][:50]
        peaks[f] = imp.max()
        lines.append(f"{f}: peak {imp.max():.3f}, {inside[top].mean():.0%} of its 50 highest "
                     f"centres in the region; mean inside {imp[inside].mean():.3f}, outside "
                     f"{imp[~inside].mean():.4f}")
        if f in ("f0", "f1"):
            ok &= bool(inside[np.argmax(imp)]) and inside[top].mean() >= 0.9
    null_peak = max(v for f, v in peaks.items() if f not in ("f0", "f1"))
    ok &= min(peaks["f0"], peaks["f1"]) > null_peak
    return ok, lines


def centres_img(mask_img, region, n, rng):
    """``n`` random centres of the mask, a quarter of them in the encoded region."""
    mask = np.asarray(mask_img.dataobj) > 0
    inside = np.argwhere(mask & region)
    outside = np.argwhere(mask & ~region)
    k = min(n // 4, len(inside))
    pick = np.concatenate([inside[rng.choice(len(inside), k, replace=False)],
                           outside[rng.choice(len(outside), n - k, replace=False)]])
    out = np.zeros(mask.shape, np.int8)
    out[tuple(pick.T)] = 1
    return nib.Nifti1Image(out, mask_img.affine)


def run(imgs, table, mask_img, process, args):
    t0 = clock(args.device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = mlem_neuro.mlem_searchlight(imgs, table, mask_img, process_mask_img=process,
                                          radius=6.0, cv=5, n_permutations=10,
                                          n_jobs=args.n_jobs, chunk_size=args.chunk_size,
                                          device=args.device, random_state=0,
                                          lr=args.lr, patience=args.patience,
                                          verbose=args.verbose)
    return res, clock(args.device) - t0


def compare(imgs, table, mask_img, region, args):
    process = centres_img(mask_img, region, args.compare_spheres, np.random.default_rng(3))
    real = grouped._isotonic_method
    old = lambda U, b, M, dev="cpu": ("table" if U * U <= float(b) + 1024  # noqa: E731
                                       and M * U * U <= grouped.MAX_TABLE_ELEMENTS
                                       else "expansion")
    try:
        grouped._isotonic_method, grouped.USE_FUSED = old, False
        before, t_before = run(imgs, table, mask_img, process, args)
    finally:
        grouped._isotonic_method, grouped.USE_FUSED = real, True
    after, t_after = run(imgs, table, mask_img, process, args)
    print(f"== same maps: {args.compare_spheres} centres, grouped soft ranks by expansion "
          "(before) vs now ==")
    print(f"wall time: before {t_before:.1f} s, now {t_after:.1f} s "
          f"({t_before / t_after:.1f}x); median steps {np.median(before.n_iter):.0f} / "
          f"{np.median(after.n_iter):.0f}")
    r = np.corrcoef(before.score, after.score)[0, 1]
    print(f"held-out rho maps: r = {r:.4f} (max |diff| "
          f"{np.abs(before.score - after.score).max():.2e})")
    for f in before.terms:
        a = before.importance[:, before.terms.index(f)]
        b = after.importance[:, after.terms.index(f)]
        print(f"importance {f}: r = {np.corrcoef(a, b)[0, 1]:.4f} (max |diff| "
              f"{np.abs(a - b).max():.2e})")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--signal", type=float, default=0.5,
                   help="signal amplitude in the region (noise sd 1)")
    p.add_argument("--spheres", type=int, default=None,
                   help="random centres instead of the whole brain (a quarter in the region)")
    p.add_argument("--compare", action="store_true",
                   help="first compare the maps with the previous algorithm on a subset")
    p.add_argument("--compare-spheres", type=int, default=2000)
    p.add_argument("--skip-whole-brain", action="store_true")
    p.add_argument("--n-jobs", type=int, default=None)
    p.add_argument("--chunk-size", type=int, default=None)
    p.add_argument("--verbose", default="WARNING")
    add_optimiser_arguments(p)
    add_device_argument(p)
    args = p.parse_args()
    warm_up(args.device)
    imgs, table, mask_img, region = make_data(96, args.signal, seed=0)
    print(f"MNI152 grey matter at 3 mm: {int(np.asarray(mask_img.dataobj).sum())} voxels, "
          f"{int(region.sum())} in the encoded region; 96 images, features f0..f7 (binary), "
          f"f0 and f1 encoded; radius 6 mm, 5 folds, 10 permutations; {describe(args.device)}"
          f"; n_jobs={args.n_jobs}")
    if args.compare:
        compare(imgs, table, mask_img, region, args)
    if args.skip_whole_brain:
        return
    process = None
    if args.spheres:
        process = centres_img(mask_img, region, args.spheres, np.random.default_rng(4))
    memory = TreeMemory()
    res, wall = run(imgs, table, mask_img, process, args)
    tree = memory.stop()
    print(f"== whole brain: {len(res.score)} spheres ==")
    print(f"wall time {wall:.0f} s = {wall / 60:.1f} min (target < 15 min); peak memory "
          f"{tree:.0f} MiB (this process and its workers, sampled; ru_maxrss of this process "
          f"{peak_rss_mib():.0f} MiB); median steps {np.median(res.n_iter):.0f}")
    ok, lines = recovered(res, region)
    print("\n".join(lines))
    print(f"encoded region recovered: {'yes' if ok else 'NO'}")


if __name__ == "__main__":
    main()
