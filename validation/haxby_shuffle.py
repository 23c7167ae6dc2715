"""Haxby 2001 (subject 1, 25 mm): the within-run shuffle control of the searchlight tests.

96 block betas (12 runs x 8 categories) from :func:`mlem_neuro.fmri.trial_images`, z-scored
within run (the default), feature ``trial_type``; ``mlem_searchlight(radius=30 mm, cv=4,
groups=runs, n_null=99)``.  The category labels are shuffled *within* each run (which keeps
the design, one block per category per run, and removes the information) ``--shuffles``
times; for each shuffle and for the real labels the script prints the median category
importance over the spheres, the fraction of spheres with uncorrected p < 0.05 and the
number with FWE-corrected p < 0.05.  ``--pairs all`` also runs every analysis with
``held_out_pairs="all"`` (nulls within runs, every held-out pair), ``--no-groups`` with
the same folds but without ``groups`` (nulls across runs: the behaviour before the nulls
respected runs).  ``--cv 2 --n-repeats 10``: repeated two-fold splits of the runs (more
power: with 4 folds the real labels' map had no FWE-significant sphere).  ``--main-only``
computes the category's main-effect test alone (what the default, staged, test reads with
one feature; no training, so 40 shuffles take minutes) and prints the mean fraction of
spheres at p < 0.05 and the rate of shuffles with a family-wise significant sphere.  Needs
the shared data (``../shared/data`` beside the repository).

    OMP_NUM_THREADS=1 python validation/haxby_shuffle.py --shuffles 6
    OMP_NUM_THREADS=1 python validation/haxby_shuffle.py --main-only --shuffles 40
"""
import argparse
import time
import warnings

import numpy as np
import torch
from _common import haxby_runs
from sklearn.model_selection import GroupKFold

import mlem_neuro
from mlem_neuro.fmri import trial_images


def run_one(imgs, feats, mask, run, args, label, **kw):
    start = time.time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = mlem_neuro.mlem_searchlight(imgs, feats, mask, radius=30.0, n_null=args.n_null,
                                          random_state=0, verbose="ERROR", **kw)
    k = res.tests.index("trial_type")
    imp = res.importance[:, res.terms.index("trial_type")]
    print(f"{label:34s} spheres {len(imp)}  median importance {np.median(imp):+.4f}  "
          f"p<0.05 {np.mean(res.pvalues[:, k] < 0.05):.3f}  "
          f"FWE<0.05 {int(np.sum(res.pvalues_fwe[:, k] < 0.05))}  "
          f"median score {np.median(res.score):+.4f}  ({time.time() - start:.0f} s)",
          flush=True)
    return res


def main_only(imgs, mask, run, labels, n_null, rng):
    """The main-effect test of ``trial_type`` in every sphere (the searchlight's spheres
    and run-standardised patterns, its relabellings within runs, between-run pairs as
    with ``groups``), per set of labels."""
    from mlem_neuro.adapters.nifti import SphereRDMSource, load_images, load_mask
    from mlem_neuro.core.scoring.main_effect import main_effect_tests, pair_columns
    from mlem_neuro.core.scoring.nulls import null_permutations, permutation_pvalues
    from mlem_neuro.core.stimuli.features import FeatureSpace
    from mlem_neuro.searchlight import spheres

    img4d = load_images(imgs)
    # the searchlight's own spheres and patterns, z-scored within run as it does
    *_, A, X = spheres(img4d, load_mask(mask, img4d), None, 30.0, run, "groups")
    source = SphereRDMSource(X, A)
    cols = pair_columns(len(run), run)
    frac, fwe = [], []
    for name, f in labels:
        space = FeatureSpace().fit(f)
        enc = space.transform(f)
        null = null_permutations(enc, space.kinds_, n_null, rng, groups=run)
        obs, nul = main_effect_tests(source, enc, null, cols)
        _, p, p_fwe = permutation_pvalues({"t": (obs[:, 0], nul[:, 0].T)})
        print(f"{name:34s} spheres {len(p)}  main effect p<0.05 {np.mean(p < 0.05):.3f}  "
              f"FWE<0.05 {int(np.sum(p_fwe < 0.05))}", flush=True)
        if name != "real labels":
            frac.append(np.mean(p < 0.05))
            fwe.append(bool(np.any(p_fwe < 0.05)))
    if frac:
        print(f"{len(frac)} shuffles: mean fraction of spheres at p < 0.05 "
              f"{np.mean(frac):.3f} ({np.min(frac):.3f}-{np.max(frac):.3f}); shuffles with a "
              f"family-wise significant sphere {np.sum(fwe)} ({np.mean(fwe):.3f})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shuffles", type=int, default=6)
    parser.add_argument("--n-null", type=int, default=99)
    parser.add_argument("--pairs", choices=("auto", "all"), nargs="+", default=["auto"])
    parser.add_argument("--no-groups", action="store_true")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--cv", type=int, default=4,
                        help="folds over the runs (GroupKFold; with --n-repeats > 1, "
                             "shuffled group folds drawn anew each repeat)")
    parser.add_argument("--n-repeats", type=int, default=1)
    parser.add_argument("--main-only", action="store_true",
                        help="the main-effect test alone (no training)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bold, events, mask = haxby_runs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imgs, table = trial_images(bold, events, t_r=2.5, mask_img=mask)
    run = table.index.get_level_values("run").to_numpy()
    feats = table[["trial_type"]].reset_index(drop=True)
    folds = (list(GroupKFold(args.cv).split(feats, groups=run)) if args.n_repeats == 1
             else args.cv)
    repeats = dict(n_repeats=args.n_repeats)
    rng = np.random.default_rng(0)
    labels = ([("real labels", feats)] if not args.skip_real else [])
    for s in range(args.shuffles):
        shuffled = feats.copy()
        for r in np.unique(run):
            rows = np.flatnonzero(run == r)
            shuffled.iloc[rows, 0] = feats.iloc[rng.permutation(rows), 0].to_numpy()
        labels.append((f"shuffle {s} within run", shuffled))
    if args.main_only:
        main_only(imgs, mask, run, labels, args.n_null, rng)
        return
    for name, f in labels:
        for pairs in args.pairs:
            run_one(imgs, f, mask, run, args, f"{name}, groups, pairs={pairs}", cv=folds,
                    groups=run, held_out_pairs=pairs, **repeats)
        if args.no_groups and args.n_repeats == 1:
            run_one(imgs, f, mask, run, args, f"{name}, no groups", cv=folds)


if __name__ == "__main__":
    main()
