"""Stopping rules measured against the fits they stop (issue 38: the steps are the cost).

The whole-brain benchmark's data (:mod:`bench_wholebrain`: MNI152 grey matter at 3 mm, 96
images, 8 binary features, f0 and f1 encoded in a region) on ``--spheres`` random centres
(a quarter in the region), ``mlem_searchlight`` with the benchmark's settings (5 folds,
10 permutations), run in this process one after the other:

* the defaults (``lr="auto"``: 0.1 and patience 10 on these categorical fits since
  2026-11-30; 20 when the performance page's figures were measured), twice:
  ``random_state=0`` (the reference) and ``random_state=1`` (the spread of a change of
  seed: what "the same answer" can mean);
* shorter rules on ``random_state=0``: ``--patience`` values, ``--max-steps`` caps.

For each: wall time, median and 90th percentile of the steps per fit, and against the
reference the correlation and largest difference of the held-out score map and of the
importance maps of the encoded features (f0, f1) and of a null one (f2), and the mean
importance of f0 and f1 inside the region.  A rule gives "the same answer" where its
differences from the reference lie within the seed's::

    OMP_NUM_THREADS=1 python benchmarks/bench_stopping.py --spheres 1000
"""
import argparse
import time
import warnings

import numpy as np
from bench_wholebrain import centres_img, make_data

import mlem_neuro


def run(imgs, table, mask_img, process, **kw):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        res = mlem_neuro.mlem_searchlight(imgs, table, mask_img, process_mask_img=process,
                                          radius=6.0, cv=5, n_permutations=10, n_jobs=1,
                                          verbose="WARNING", **kw)
    return res, time.perf_counter() - t0


def compare(res, ref, inside):
    out = {}
    for name, a, b in [("score", res.score, ref.score)] + [
            (f, res.importance[:, res.terms.index(f)], ref.importance[:, ref.terms.index(f)])
            for f in ("f0", "f1", "f2")]:
        out[name] = (np.corrcoef(a, b)[0, 1], np.abs(a - b).max())
    out["inside"] = tuple(res.importance[inside, res.terms.index(f)].mean()
                          for f in ("f0", "f1"))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spheres", type=int, default=1000)
    p.add_argument("--patience", type=int, nargs="+", default=[5, 20])
    p.add_argument("--max-steps", type=int, nargs="+", default=[30, 60])
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    imgs, table, mask_img, region = make_data(96, 0.5, seed=0)
    process = centres_img(mask_img, region, args.spheres, np.random.default_rng(4))
    ref, t_ref = run(imgs, table, mask_img, process, random_state=0)
    inside = region[tuple(ref.voxel_indices.T)]
    rows = [("default, random_state=1 (seed spread)", dict(random_state=1))]
    rows += [(f"patience={k}", dict(random_state=0, patience=k)) for k in args.patience]
    rows += [(f"max_steps={k}", dict(random_state=0, max_steps=k)) for k in args.max_steps]
    print(f"{len(ref.score)} centres ({int(inside.sum())} in the region); reference "
          f"(defaults, random_state=0): {t_ref:.1f} s, steps median "
          f"{np.median(ref.n_iter):.0f}, 90th percentile {np.percentile(ref.n_iter, 90):.0f}; "
          f"mean importance in the region f0 {ref.importance[inside, 0].mean():.4f}, f1 "
          f"{ref.importance[inside, 1].mean():.4f}")
    print("rule                                    time    x ref  steps med/p90   "
          "score r / max|d|     f0 r / max|d|       f1 r / max|d|       f2 r / max|d|"
          "       f0, f1 inside")
    for label, kw in rows:
        res, t = run(imgs, table, mask_img, process, **kw)
        c = compare(res, ref, inside)
        cells = "  ".join(f"{c[k][0]:.4f} / {c[k][1]:.1e}" for k in ("score", "f0", "f1",
                                                                      "f2"))
        print(f"{label:<38s} {t:6.1f} s {t / t_ref:5.2f}  {np.median(res.n_iter):5.0f} / "
              f"{np.percentile(res.n_iter, 90):4.0f}   {cells}   {c['inside'][0]:.4f}, "
              f"{c['inside'][1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
