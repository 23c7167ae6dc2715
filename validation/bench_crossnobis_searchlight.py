"""Crossnobis in the searchlight: localisation and held-out fit under noise shared by
voxels, and the cost of the per-sphere noise covariances.

1. Localisation: 10 x 10 x 10 voxels of 3 mm, every voxel the centre of a 6 mm sphere
   (up to 33 voxels). 24 items of two conditions, ``--trials`` trial images each; inside
   one sphere the condition adds ``±amp/2`` times a fixed random pattern and every item
   its own pattern (sd 0.3, as ``simulate`` of ``tests/test_crossdist_analyses.py``);
   every trial has unit independent noise per voxel plus ``--shared`` components
   ``z_k(trial) d_k(voxel)`` with ``z`` standard normal and ``d`` a fixed random map of
   standard deviation ``--big`` (noise shared by the voxels of every sphere, e.g. global
   or physiological signals: per-voxel scaling cannot remove it, whitening can).  A second
   feature ``b`` (random halves of the items) is encoded nowhere.  ``mlem_searchlight``
   with ``items="item"``, ``cv=3``, ``n_repeats=2``, the package defaults otherwise, for
   ``distance`` = ``"euclidean"`` (distances between item means), ``"cv_euclidean"`` and
   ``"crossnobis"`` (default partitions) on the same images.  Prints, over ``--seeds``
   datasets, the distance from the encoded centre to the peak of the condition's
   importance map, the held-out ρ of the encoded sphere, and the map contrast (importance
   at the encoded centre minus the mean over spheres whose centre lies more than 4 voxels
   away, divided by their standard deviation).
2. Cost: :func:`crossnobis_membership` against :func:`crossval_sq_distances_membership`
   (and a per-sphere loop over :func:`crossval_sq_distances`, on a subset) on 1,728
   spheres (12 x 12 x 12 voxels of 3 mm, radius 6 and 9 mm), 96 trials of 24 items, and
   on 10 regions of 2,000 voxels (more voxels than trials) against the dense function
   on one region; one thread, process CPU time.

Run: ``OMP_NUM_THREADS=1 python validation/bench_crossnobis_searchlight.py [--seeds 8]``
"""
import argparse
import time
import warnings

import nibabel as nib
import numpy as np
import pandas as pd
import scipy.sparse as sp
import torch

import mlem_neuro
from mlem_neuro.adapters.nifti import sphere_membership
from mlem_neuro.core.rdms.crossdist import (
    crossnobis_membership,
    crossval_sq_distances,
    crossval_sq_distances_membership,
    default_partitions,
)

AFFINE = np.diag([3.0, 3.0, 3.0, 1.0])


def simulate(seed, amp, big, shared, trials, n_items=24, shape=(10, 10, 10),
             centre=(5, 5, 5)):
    rng = np.random.default_rng(seed)
    V = int(np.prod(shape))
    grid = np.indices(shape).reshape(3, -1).T
    inside = np.linalg.norm((grid - np.asarray(centre)) * 3.0, axis=1) <= 6.0
    cond = np.tile([0, 1], n_items // 2)
    b = rng.permutation(np.tile([0, 1], n_items // 2))
    pat = rng.standard_normal(inside.sum())
    mu = np.zeros((n_items, V))
    mu[:, inside] = (amp * np.outer(cond * 2 - 1, pat) / 2
                     + 0.3 * rng.standard_normal((n_items, inside.sum())))
    items = np.repeat(np.arange(n_items), trials)
    d = big * rng.standard_normal((shared, V))
    X = (mu[items] + rng.standard_normal((len(items), V))
         + rng.standard_normal((len(items), shared)) @ d)
    imgs = nib.Nifti1Image(X.T.reshape(shape + (len(items),)).astype(np.float32), AFFINE)
    mask = nib.Nifti1Image(np.ones(shape, np.int8), AFFINE)
    table = pd.DataFrame({"condition": np.where(cond[items], "x", "y"),
                          "b": np.where(b[items], "u", "v"),
                          "item": [f"i{k:02d}" for k in items]})
    return imgs, table, mask, np.asarray(centre)


def localisation(args):
    methods = ("euclidean", "cv_euclidean", "crossnobis")
    rows = {m: [] for m in methods}
    for seed in range(args.seeds):
        imgs, table, mask, centre = simulate(seed, args.amp, args.big, args.shared,
                                             args.trials)
        for m in methods:
            t0 = time.process_time()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                res = mlem_neuro.mlem_searchlight(imgs, table, mask, radius=6.0,
                                                  items="item", distance=m, cv=3,
                                                  n_repeats=2, random_state=seed,
                                                  verbose="WARNING")
            took = time.process_time() - t0
            imp = res.importance[:, res.terms.index("condition")]
            coords = res.model_coords() / 3.0
            dist = np.linalg.norm(coords - centre, axis=1)
            at = int(np.argmin(dist))
            far = dist > 4
            contrast = (imp[at] - imp[far].mean()) / imp[far].std()
            rows[m].append((float(dist[int(np.argmax(imp))]), float(res.score[at]),
                            float(contrast), took))
    print(f"localisation: {args.seeds} datasets, amp {args.amp}, {args.shared} shared "
          f"components of sd {args.big}, 24 items x {args.trials} trials, cv=3 x 2")
    print(f"  {'distance':14s} {'peak dist median':>17s} {'max':>5s} {'<=2 vox':>8s} "
          f"{'centre rho':>11s} {'contrast':>9s} {'CPU s':>6s}")
    for m in methods:
        a = np.array(rows[m])
        print(f"  {m:14s} {np.median(a[:, 0]):17.1f} {a[:, 0].max():5.1f} "
              f"{int((a[:, 0] <= 2).sum()):4d}/{len(a):<3d} "
              f"{a[:, 1].mean():6.3f}±{a[:, 1].std():.3f} {a[:, 2].mean():5.1f}±"
              f"{a[:, 2].std():.1f} {a[:, 3].mean():6.1f}")
    cn, eu, cv = (np.array(rows[m]) for m in ("crossnobis", "euclidean", "cv_euclidean"))
    print(f"  crossnobis centre rho higher than euclidean in {(cn[:, 1] > eu[:, 1]).sum()}"
          f" of {len(cn)}, than cv_euclidean in {(cn[:, 1] > cv[:, 1]).sum()}; contrast "
          f"higher in {(cn[:, 2] > eu[:, 2]).sum()} and {(cn[:, 2] > cv[:, 2]).sum()}")


def cost(args):
    rng = np.random.default_rng(0)
    shape = (12, 12, 12)
    grid = np.indices(shape).reshape(3, -1).T * 3.0
    full = np.ones(shape, bool)
    items = np.repeat(np.arange(24), 4)
    X = rng.standard_normal((len(items), grid.shape[0]))
    parts = default_partitions(items, 2, random_state=0)
    print(f"cost: {grid.shape[0]} spheres, {len(items)} trials of 24 items, 2 partitions")
    A = sphere_membership(grid, full, AFFINE, 6.0)
    crossval_sq_distances_membership(X, A, items, parts)            # warm-up, not timed
    crossnobis_membership(X, A[:50], items, parts)
    for radius in (6.0, 9.0):
        A = sphere_membership(grid, full, AFFINE, radius)
        sizes = np.diff(A.indptr)
        t0 = time.process_time()
        crossval_sq_distances_membership(X, A, items, parts)
        t_cv = time.process_time() - t0
        t0 = time.process_time()
        crossnobis_membership(X, A, items, parts)
        t_cn = time.process_time() - t0
        sub = rng.choice(A.shape[0], 100, replace=False)
        t0 = time.process_time()
        for s in sub:
            crossval_sq_distances(X[None][..., A[s].indices], items, parts,
                                  noise="ledoit-wolf")
        t_loop = (time.process_time() - t0) * A.shape[0] / len(sub)
        print(f"  radius {radius:.0f} mm (sizes {sizes.min()}-{sizes.max()}, median "
              f"{int(np.median(sizes))}): cv_euclidean {t_cv:.2f} s, crossnobis "
              f"{t_cn:.2f} s ({t_cn / t_cv:.1f}x), per-sphere loop of the dense function "
              f"{t_loop:.2f} s (extrapolated from 100 spheres)")
    # regions larger than the number of trials (trials x trials systems)
    V = 20000
    X = rng.standard_normal((len(items), V))
    A = sp.csr_matrix(np.kron(np.eye(10), np.ones(V // 10)))
    t0 = time.process_time()
    crossval_sq_distances_membership(X, A, items, parts)
    t_cv = time.process_time() - t0
    t0 = time.process_time()
    crossnobis_membership(X, A, items, parts)
    t_cn = time.process_time() - t0
    t0 = time.process_time()
    crossval_sq_distances(X[None][..., A[0].indices], items, parts, noise="ledoit-wolf")
    t_one = time.process_time() - t0
    print(f"  10 regions of {V // 10} voxels: cv_euclidean {t_cv:.2f} s, crossnobis "
          f"{t_cn:.2f} s; the dense function ({V // 10} x {V // 10} covariance) "
          f"{t_one:.2f} s for one region")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=8)
    p.add_argument("--amp", type=float, default=0.5)
    p.add_argument("--big", type=float, default=1.0)
    p.add_argument("--shared", type=int, default=2)
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--skip-localisation", action="store_true")
    p.add_argument("--skip-cost", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    if not args.skip_cost:
        cost(args)
    if not args.skip_localisation:
        localisation(args)


if __name__ == "__main__":
    main()
