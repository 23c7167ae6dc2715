"""Haxby 2001 (subject 1, 25 mm): held-out Spearman with raw betas vs betas z-scored within run.

96 block betas from :func:`mlem_neuro.fmri.trial_images` (12 runs x 8 categories), feature
``trial_type``.  Prints, for several regions and GroupKFold(4 / 6) over runs, the mean
(sd) held-out Spearman and category importance over fold seeds 0-9 with
``standardize=None`` and ``"run"``; then the permutation test of the whole-brain region's
score (``n_null=200``) and a coarse searchlight (radius 30 mm, ``n_null=100``).  The
numbers are on the options page (``standardize``).  Needs the shared data
(``../shared/data`` from the repository root); about 4 minutes on a busy 2-core machine.

    python validation/haxby_standardize.py
"""
import time

import nibabel as nib
import numpy as np
import torch
from _common import HAXBY, haxby_runs

import mlem_neuro
from mlem_neuro.fmri import trial_images


def main():
    torch.set_num_threads(1)
    bold, events, mask = haxby_runs()
    brain = np.asarray(mask.dataobj) > 0
    raw, table = trial_images(bold, events, t_r=2.5, mask_img=mask, standardize=None)
    run = table.index.get_level_values("run").to_numpy()
    feats = table[["trial_type"]]

    rois = {name: np.asarray(nib.load(HAXBY / f"masks/25mm/{name}.nii.gz").dataobj) > 0
            for name in ("brain", "hoc", "gray")}
    # the vt mask is a single voxel at 25 mm: a 30 mm ball of brain voxels around it
    vt = np.argwhere(np.asarray(nib.load(HAXBY / "masks/25mm/vt.nii.gz").dataobj) > 0)[0]
    ijk = np.argwhere(brain)
    ball = np.zeros_like(brain)
    ball[tuple(ijk[np.linalg.norm((ijk - vt) * 25.0, axis=1) <= 30.0].T)] = True
    rois["vt+30mm"] = ball

    for name, roi in rois.items():
        labels = nib.Nifti1Image(roi.astype(np.int16), mask.affine)
        for k in (4, 6):
            parts = []
            for label, standardize in (("raw", None), ("z", "run")):
                score, imp = [], []
                for seed in range(10):
                    res = mlem_neuro.mlem_roi(raw, feats, labels, groups=run, cv=k,
                                              standardize=standardize, random_state=seed,
                                              verbose="ERROR")
                    score.append(res.score[0])
                    imp.append(res.importance[0, 0])
                parts.append(f"{label} rho {np.mean(score):+.3f} (sd {np.std(score):.3f}) "
                             f"importance {np.mean(imp):+.3f}")
            print(f"{name:8s} {int(roi.sum()):3d} voxels, GroupKFold({k}) over runs, seeds "
                  f"0-9: " + " | ".join(parts), flush=True)

    labels = nib.Nifti1Image(brain.astype(np.int16), mask.affine)
    for label, standardize in (("raw", None), ("z", "run")):
        res = mlem_neuro.mlem_roi(raw, feats, labels, groups=run, cv=6, n_null=200,
                                  standardize=standardize, random_state=0, verbose="ERROR")
        print(f"brain region, {label}: rho {res.score[0]:.3f}, permutation p "
              f"{res.pvalues[0, 0]:.4f} (n_null=200)", flush=True)
    for label, standardize in (("raw", None), ("z", "run")):
        t0 = time.perf_counter()
        res = mlem_neuro.mlem_searchlight(raw, feats, mask, radius=30.0, groups=run, cv=6,
                                          n_null=100, standardize=standardize,
                                          random_state=0, verbose="ERROR")
        print(f"searchlight 30 mm, {label}: {len(res.score)} spheres, rho max "
              f"{res.score.max():.3f}, median {np.median(res.score):.3f}, "
              f"{int(res.significant('score').sum())} spheres with FWE p < 0.05 "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        # where the significant spheres are: voxel offsets from the vt voxel, scanner mm
        centres = np.rint(nib.affines.apply_affine(np.linalg.inv(mask.affine),
                                                   res.model_coords())).astype(int)
        for k in np.flatnonzero(res.significant("score")):
            print(f"  sphere at voxel {centres[k].tolist()} (vt voxel "
                  f"{(centres[k] - vt).tolist()} away), scanner mm "
                  f"{np.round(res.model_coords()[k], 1).tolist()}: rho {res.score[k]:.3f}")


if __name__ == "__main__":
    main()
