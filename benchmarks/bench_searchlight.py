"""Searchlight MLEM: batched ``mlem_searchlight`` vs nilearn ``SearchLight(estimator=MLEM())``,
and the cost of a whole-brain-sized searchlight, in one run.

1. Small image: a ball of 968 voxels at 3 mm = 968 spheres (radius 6 mm), 32 images, 3
   binary features with interactions, the same 5 folds and the same (default) training
   settings on both paths.  ``mlem_searchlight`` runs on every sphere and also computes
   10-permutation importances (which the nilearn path does not); nilearn's ``SearchLight``
   fits one ``MLEM`` per sphere and fold, so it is timed on a random subset of spheres and
   extrapolated linearly to all spheres.
2. Whole-brain-sized case: 38,104 voxels at 3 mm, 96 images, radius 6 mm, 8 binary
   features + 28 interactions, 5 folds, the default training settings (max 1000 steps;
   ``--lr``, ``--patience``, ``--tol`` override the package defaults).  Masking and sphere
   memberships run on the whole brain (measured).  The training is measured through the
   same driver (``run_cv``) for one fold on random spheres, then extrapolated to every
   sphere and fold, two ways:
   (a) one chunk of ``--wb-spheres`` spheres run to the end (real step counts), scaled by
   spheres x folds: pessimistic, since small chunks cost more per sphere-step;
   (b) the costs of a production-sized chunk (``--wb-chunk`` spheres) run for 10 and for
   30 steps: their difference gives the training cost per sphere-step, the rest the fixed
   cost per sphere (RDMs, importances); estimate = (fixed + per-step x mean steps of (a))
   x spheres x folds.
   With ``n_jobs=None`` chunks run one after another, so a full run's peak memory is that of
   its largest chunk: the peak measured around (b) is that of a full run with
   ``chunk_size=--wb-chunk``.

After the analysis, the features' main effects (which every result keeps, with or without
tests: :mod:`mlem_neuro.core.scoring.main_effect`) are timed alone on the same spheres, as a
fraction of the analysis.

Peak memory is the process's peak resident set size (``resource.getrusage(RUSAGE_SELF)
.ru_maxrss``, monotone: it includes Python, torch, nilearn and every earlier step).

``--device cuda`` trains every path on the GPU (sphere RDMs are computed on the CPU either
way); clocks are read after ``torch.cuda.synchronize()``, after an untimed warm-up fit.

With ``--n-null N...`` the small case also times ``mlem_searchlight`` with ``n_null=N``
(the single-subject tests of every sphere, family-wise over the spheres) against the
analysis without tests.

Run: ``.venv/bin/python benchmarks/bench_searchlight.py`` (a few minutes on 2 CPU cores;
``--full-whole-brain`` runs every sphere and fold instead, a few hours on 2 cores).
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
from mlem_neuro import MLEM
from mlem_neuro.adapters.nifti import (
    SphereRDMSource,
    load_images,
    load_mask,
    mask_coords,
    mask_data,
    sphere_membership,
)
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.stimuli.pairs import kfold_stimuli
from mlem_neuro.crossval import run_cv as _run_cv

AFFINE_3MM = np.diag([3.0, 3.0, 3.0, 1.0])


def run_cv(source, table, **options):
    """The shared driver with keyword options."""
    return _run_cv(source, table, MLEMOptions(**options))


def make_data(shape, radii, n_images, n_features, seed):
    """Ellipsoid 'brain' mask; images = noise + features encoded with smooth amplitudes."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    grid = np.indices(shape).reshape(3, -1).T
    centre = (np.asarray(shape) - 1) / 2
    mask = ((((grid - centre) / np.asarray(radii)) ** 2).sum(1) <= 1).reshape(shape)
    table = pd.DataFrame({f"f{k}": rng.permutation(np.tile(["a", "b"], n_images // 2))
                          for k in range(n_features)})
    data = rng.standard_normal(shape + (n_images,)).astype(np.float32)
    for k in range(n_features):
        amp = gaussian_filter(rng.standard_normal(shape), 3.0)
        amp = np.clip(amp / amp.std() - 0.5, 0, None).astype(np.float32)  # sparse blobs
        code = (table[f"f{k}"] == "a").to_numpy(np.float32)
        data += (amp * rng.standard_normal(shape).astype(np.float32))[..., None] * code
    data[~mask] = 0
    aff = AFFINE_3MM.copy()
    aff[:3, 3] = -3.0 * centre
    return (nib.Nifti1Image(data, aff), table,
            nib.Nifti1Image(mask.astype(np.int8), aff), mask)


def small_case(args):
    print("== 1. mlem_searchlight vs nilearn SearchLight(estimator=MLEM()) ==")
    dev = args.device
    imgs, table, mask_img, mask = make_data((12, 12, 12), (6.2, 6.2, 6.2), 32, 3, seed=0)
    n = imgs.shape[3]
    folds = kfold_stimuli(n, 5, np.random.default_rng(0))
    train_kw = dict(constraint="spd", interactions=True, max_steps=args.small_steps,
                    patience=args.patience, lr=args.lr, tol=args.tol, batch_size="auto")
    S = int(mask.sum())
    print(f"image {mask.shape} at 3 mm, {S} spheres (radius 6 mm), {n} images, "
          f"{table.shape[1]} binary features + interactions, 5 folds, max_steps="
          f"{args.small_steps}; {describe(dev)}")

    t0 = clock(dev)
    res = mlem_neuro.mlem_searchlight(imgs, table, mask_img, radius=6.0, cv=folds,
                                      n_permutations=10, random_state=0, device=dev,
                                      **train_kw)
    t_ours = clock(dev) - t0
    print(f"mlem_searchlight, all {S} spheres   : {t_ours:8.1f} s  (measured; median steps "
          f"{int(np.median(res.n_iter))}; includes term importances, 10 permutations)")
    main_effects_cost(imgs, table, mask_img, t_ours, dev)

    from nilearn.decoding import SearchLight

    rng = np.random.default_rng(1)
    ijk = np.argwhere(mask)
    pick = ijk[rng.choice(len(ijk), args.nilearn_spheres, replace=False)]
    process = np.zeros(mask.shape, np.int8)
    process[tuple(pick.T)] = 1
    sl = SearchLight(mask_img, process_mask_img=nib.Nifti1Image(process, mask_img.affine),
                     radius=6.0, estimator=MLEM(random_state=0, device=dev, **train_kw),
                     cv=folds, n_jobs=1)
    t0 = clock(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sl.fit(imgs, table)
    t_sub = clock(dev) - t0
    t_nl = t_sub / args.nilearn_spheres * S
    print(f"nilearn SearchLight, {args.nilearn_spheres} spheres    : {t_sub:8.1f} s  (measured)")
    print(f"nilearn SearchLight, all {S} spheres: {t_nl:8.1f} s  (EXTRAPOLATED linearly from "
          f"the {args.nilearn_spheres} measured spheres)")
    print(f"speed-up                              : {t_nl / t_ours:8.1f} x  (target >= 20 x)")
    ours = res.score[[np.flatnonzero((res.voxel_indices == p).all(1))[0] for p in pick]]
    print(f"held-out Spearman on those {args.nilearn_spheres} spheres: nilearn mean "
          f"{sl.masked_scores_.mean():.4f}, mlem_searchlight mean {ours.mean():.4f}, max "
          f"|diff| {np.abs(np.sort(sl.masked_scores_) - np.sort(ours)).max():.1e}")
    print(f"peak RSS so far: {peak_rss_mib():.0f} MiB")
    for n_null in args.n_null:
        t0 = clock(dev)
        tested = mlem_neuro.mlem_searchlight(imgs, table, mask_img, radius=6.0, cv=folds,
                                             n_permutations=10, random_state=0, device=dev,
                                             n_null=n_null, **train_kw)
        t_null = clock(dev) - t0
        found = {t: int(tested.significant(t).sum()) for t in tested.tests}
        print(f"mlem_searchlight with n_null={n_null:<4d}: {t_null:8.1f} s  "
              f"({t_null / t_ours:.1f}x the analysis; FWE-significant spheres {found})")


def main_effects_cost(imgs, table, mask_img, t_analysis, dev):
    """What every analysis spends on the features' main effects (results keep them, with
    or without tests): the same computation timed alone on the same spheres, as a fraction
    of the analysis that includes it."""
    from mlem_neuro.core.scoring.main_effect import main_effect_tests
    from mlem_neuro.core.stimuli.features import FeatureSpace

    img4d = load_images(imgs)
    m = load_mask(mask_img, img4d)
    _, seeds = mask_coords(m, img4d.affine)
    source = SphereRDMSource(mask_data(img4d, m), sphere_membership(seeds, m, img4d.affine,
                                                                    6.0))
    enc = FeatureSpace().fit(table).transform(table)
    t0 = clock(dev)
    main_effect_tests(source, enc, None)
    t_main = clock(dev) - t0
    print(f"  of which the main effects         : {t_main:8.2f} s  (timed alone: "
          f"{100 * t_main / t_analysis:.1f} % of the analysis, "
          f"{1000 * t_main / source.n_models:.2f} ms per sphere, sphere RDMs included)")


def whole_brain(args):
    print("\n== 2. whole-brain-sized searchlight ==")
    dev = args.device
    t0 = clock(dev)
    imgs, table, mask_img, _ = make_data((52, 62, 52), (20.5, 24.0, 18.5), 96, 8, seed=1)
    t_make = clock(dev) - t0
    n = imgs.shape[3]
    t0 = clock(dev)
    img4d = load_images(imgs)
    m = load_mask(mask_img, img4d)
    _, seeds = mask_coords(m, img4d.affine)
    A = sphere_membership(seeds, m, img4d.affine, 6.0)
    X = mask_data(img4d, m)
    t_setup = clock(dev) - t0
    S = A.shape[0]
    sizes = np.diff(A.indptr)
    F = 5
    print(f"{X.shape[1]} voxels at 3 mm in mask, {S} spheres of median {int(np.median(sizes))} "
          f"voxels (radius 6 mm), {n} images, {table.shape[1]} binary features "
          f"(+ {table.shape[1] * (table.shape[1] - 1) // 2} interactions), {F} folds; "
          f"simulated in {t_make:.1f} s (not counted)")
    print(f"masking + sphere memberships, all {S} spheres: {t_setup:8.1f} s  (measured)")

    source = SphereRDMSource(X, A)
    folds = kfold_stimuli(n, F, np.random.default_rng(0))
    kw = dict(n_permutations=10, constraint="spd", interactions=True, patience=args.patience,
              lr=args.lr, tol=args.tol, batch_size="auto", random_state=0, device=dev)
    rng = np.random.default_rng(2)
    if args.full_whole_brain:
        t0 = clock(dev)
        out = run_cv(source, table, cv=folds, chunk_size=args.wb_chunk, max_steps=1000, **kw)
        t_full = clock(dev) - t0
        print(f"training + importance, all spheres x {F} folds: {t_full:8.1f} s  (FULL RUN, "
              f"median steps {int(np.median(out.n_iter))})")
        print(f"whole-brain total: {t_setup + t_full:.0f} s = {(t_setup + t_full) / 3600:.2f} h "
              f"(FULL RUN); peak RSS {peak_rss_mib():.0f} MiB")
        return

    K = min(args.wb_spheres, S)
    sub = source.subset(np.sort(rng.choice(S, K, replace=False)))
    t0 = clock(dev)
    out = run_cv(sub, table, cv=folds[:1], chunk_size=K, max_steps=1000, **kw)
    t_a = clock(dev) - t0
    steps = float(np.median(out.n_iter))
    est_a = t_setup + t_a / K * S * F
    print(f"(a) {K} random spheres, 1 fold, max 1000 steps: {t_a:8.1f} s measured (steps: "
          f"median {steps:.0f}, mean {np.mean(out.n_iter):.0f}; "
          f"{100 * out.converged.mean():.0f}% early-stopped; batch {out.batch_size[0]} pairs "
          "= all training pairs)")
    print(f"    -> whole brain, {S} spheres x {F} folds: {est_a:9.0f} s = {est_a / 3600:.1f} h "
          f"(EXTRAPOLATED; pessimistic: a chunk of {K} costs more per sphere than big ones)")

    C = min(args.wb_chunk, S)
    sub = source.subset(np.sort(rng.choice(S, C, replace=False)))
    rss0 = peak_rss_mib()
    t_b = {}
    for n_steps in (10, 30):
        t0 = clock(dev)
        run_cv(sub, table, cv=folds[:1], chunk_size=C, max_steps=n_steps, **kw)
        t_b[n_steps] = clock(dev) - t0
    per_step = (t_b[30] - t_b[10]) / (20 * C)              # training, per sphere-step
    fixed = max(t_b[10] - 10 * C * per_step, 0.0) / C      # RDMs + importances, per sphere
    mean_steps = float(np.mean(out.n_iter))
    est_b = t_setup + (fixed + per_step * mean_steps) * S * F
    print(f"(b) {C} random spheres, 1 fold, 10 and 30 steps: {t_b[10]:.1f} s and "
          f"{t_b[30]:.1f} s measured -> {1e3 * per_step:.3f} ms per sphere-step (training) + "
          f"{1e3 * fixed:.2f} ms per sphere (RDMs, importances)")
    print(f"    -> whole brain: ({1e3 * fixed:.2f} ms + {1e3 * per_step:.3f} ms x "
          f"{mean_steps:.0f} mean steps from (a)) x {S} spheres x {F} folds + setup = "
          f"{est_b:.0f} s = {est_b / 3600:.1f} h (EXTRAPOLATED)")
    print(f"    on {describe(dev)}; chunks are independent, so n_jobs or "
          "a dask cluster divide the training time by the number of workers")
    print(f"peak RSS: {peak_rss_mib():.0f} MiB (ru_maxrss of the process; {rss0:.0f} MiB "
          f"before the chunks of {C} spheres) = peak of a full run with chunk_size={C}")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nilearn-spheres", type=int, default=16,
                   help="spheres timed on the nilearn path (then extrapolated)")
    p.add_argument("--small-steps", type=int, default=1000,
                   help="max_steps of both paths in the comparison")
    p.add_argument("--wb-spheres", type=int, default=100,
                   help="(a): spheres trained to the end for one fold")
    p.add_argument("--wb-chunk", type=int, default=1000,
                   help="(b): spheres per engine call (chunk_size)")
    p.add_argument("--full-whole-brain", action="store_true",
                   help="run every sphere and fold of the whole-brain case (hours on 2 CPUs)")
    p.add_argument("--n-null", type=int, nargs="*", default=[],
                   help="small case: also time mlem_searchlight with these n_null "
                        "(single-subject tests), against the analysis without")
    p.add_argument("--skip-small", action="store_true")
    p.add_argument("--skip-whole-brain", action="store_true")
    add_optimiser_arguments(p)
    add_device_argument(p)
    args = p.parse_args()
    warm_up(args.device)
    t0 = clock(args.device)
    if not args.skip_small:
        small_case(args)
    if not args.skip_whole_brain:
        whole_brain(args)
    print(f"\nbenchmark wall time: {clock(args.device) - t0:.0f} s")


if __name__ == "__main__":
    main()
