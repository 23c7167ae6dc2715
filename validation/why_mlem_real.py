"""Why MLEM on real recordings: MLEM, FR-RSA-I, FR-RSA and Mantel tests side by side.

On the project's shared recordings (``../shared/data``; a missing one is skipped), one
pattern per stimulus in a window where the recordings carry their known effects:

* IT units (64 macaque IT units, 7 objects x 3 positions, 4 pseudo-trials per condition:
  84 stimuli; firing rates averaged over 100-300 ms after onset): features ``object``
  and ``position``;
* Haxby 2001 subject 1 (25 mm voxels): 96 block betas (12 runs x 8 categories, z-scored
  within run) over the brain mask (129 voxels, one pattern), features ``category`` (8
  levels) and ``animate``; runs are the groups;
* EEGLAB tutorial EEG: 80 trials, 32 channels averaged over 300-500 ms, feature
  ``position`` (attended position 1 / 2).

For each recording and model (MLEM ``constraint="spd"``, FR-RSA-I ``"none"``, FR-RSA
``"diagonal"``), :func:`mlem_neuro.mlem_array` at the package defaults with
``n_null=99`` gives the held-out Spearman (the mean over folds), the p-value of the score
and of each feature (conditional tests) and, for the models with interactions, the test
of interactions; beside them, a Mantel and a partial Mantel test per feature (999
permutations; with runs, the permutations are not restricted to runs: a plain RSA user's
test).  CPU seconds per analysis.  One thread::

    OMP_NUM_THREADS=1 python validation/why_mlem_real.py
"""
import argparse
import time
import warnings
from pathlib import Path

import _common  # noqa: F401  (puts benchmarks/ on sys.path: bench_snr's loaders)
import bench_snr
import numpy as np
import pandas as pd
import torch

import mlem_neuro
from mlem_neuro import rsa

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
MODELS = {"MLEM": "spd", "FR-RSA-I": "none", "FR-RSA": "diagonal"}


def it_units():
    rec = bench_snr.it_units(4, window=0.2, step=0.05)     # 200 ms windows every 50 ms
    if rec is None:
        return None
    data, table, centres = rec
    return data[:, :, int(np.argmin(np.abs(centres - 0.2)))], table, None   # 100-300 ms


def haxby_brain():
    folder = DATA / "haxby2001_sub001_25mm" / "sub001"
    if not folder.is_dir():
        return None
    import nibabel as nib

    from mlem_neuro.fmri import trial_images

    bold = [folder / f"BOLD/task001_run{r:03d}/bold_25mm.nii.gz" for r in range(1, 13)]
    events = [folder / f"BOLD/task001_run{r:03d}/bold_events.tsv" for r in range(1, 13)]
    mask = nib.load(folder / "masks/25mm/brain.nii.gz")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imgs, table = trial_images(bold, events, t_r=2.5, mask_img=mask)
    data = np.asarray(imgs.dataobj)[np.asarray(mask.dataobj).astype(bool)].T
    runs = table.index.get_level_values("run").to_numpy()
    feats = table.reset_index(drop=True)[["trial_type"]].rename(
        columns={"trial_type": "category"})
    animate = {"face", "cat"}
    feats["animate"] = np.where(feats["category"].isin(animate), "animate", "inanimate")
    return data, feats, runs


def eeglab():
    epochs = bench_snr.eeglab_epochs()
    if epochs is None:
        return None
    X = epochs.copy().crop(0.3, 0.5).get_data(copy=True).mean(axis=-1)
    return X, pd.DataFrame({"position": epochs.metadata["position"].astype(str)}), None


def compare(name, X, table, groups):
    print(f"\n{name}: {X.shape[0]} stimuli x {X.shape[1]} units, features "
          f"{list(table.columns)}" + (f", {len(np.unique(groups))} runs as groups"
                                       if groups is not None else ""))
    t0 = time.process_time()
    mantel = rsa.mantel_tests(X, table, 999, random_state=0)
    t_rsa = time.process_time() - t0
    for f in table.columns:
        print(f"  {'Mantel':10s} {f:10s} rho {mantel.loc[f, 'rho']:+.3f}  "
              f"p {mantel.loc[f, 'p']:.3f}  partial p {mantel.loc[f, 'p_partial']:.3f}")
    print(f"  (RSA: {t_rsa:.2f} s CPU for every feature)")
    for label, constraint in MODELS.items():
        t0 = time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = mlem_neuro.mlem_array(X[:, :, None], table, constraint=constraint,
                                        groups=groups, n_null=99, random_state=0,
                                        verbose="ERROR")
        took = time.process_time() - t0
        p = {t: res.pvalues[0, k] for k, t in enumerate(res.tests)}
        tests = "  ".join(f"{t} p {v:.2f}" for t, v in p.items())
        print(f"  {label:10s} held-out rho {float(np.ravel(res.score)[0]):+.3f}  {tests}  "
              f"({res.settings['n_folds']} folds, {took:.1f} s CPU)")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recordings", nargs="+", default=["IT units", "Haxby", "EEGLAB"])
    args = p.parse_args()
    torch.set_num_threads(1)
    loaders = {"IT units": it_units, "Haxby": haxby_brain, "EEGLAB": eeglab}
    for name in args.recordings:
        rec = loaders[name]()
        if rec is None:
            print(f"{name}: data not found, skipped")
            continue
        compare(name, *rec)


if __name__ == "__main__":
    main()
