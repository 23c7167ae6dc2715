"""
fMRI searchlight: importance maps
=================================

A searchlight fits one cross-validated MLEM model per sphere of voxels and maps, at each
sphere's centre, how much each theoretical feature contributes to the neural distances
between stimuli (its permutation importance on held-out pairs).  This tutorial goes from
BOLD runs and their events tables to such maps:

1. one beta image per block with a first-level GLM (:func:`mlem_neuro.fmri.trial_images`),
   z-scored within run;
2. a feature table from the events: the object ``category`` and a coarser feature derived
   from it, ``animacy``;
3. a whole-brain searchlight (:func:`mlem_neuro.mlem_searchlight`) and its maps
   (:class:`~mlem_neuro.results.BrainMapResult`);
4. the category effect in a region of interest (:func:`mlem_neuro.mlem_roi`), with betas
   z-scored within run and raw;
5. a positive control, with a known animacy pattern added to one region.

The data are subject 1 of Haxby et al. (2001), 12 runs in which eight object categories
were shown in blocks, in a copy resampled to 25 mm voxels (129 brain voxels) that ships
with the project's shared test data.  When that copy is not found, simulated noise images
with the same design stand in for it.
"""
# %%
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import nibabel as nib
import numpy as np
import pandas as pd
from nilearn.image import mean_img
from sklearn.model_selection import GroupKFold

import mlem_neuro
from mlem_neuro.fmri import (
    events_from_labels,
    read_fsl_onsets,
    read_openfmri_onsets,
    trial_images,
)


def find_haxby():
    """The shared Haxby copy, searched upwards from this file and the working folder."""
    starts = [Path.cwd()]
    if "__file__" in globals():
        starts.insert(0, Path(__file__).resolve().parent)
    for start in starts:
        for folder in [start, *start.parents]:
            path = folder / "shared" / "data" / "haxby2001_sub001_25mm" / "sub001"
            if path.is_dir():
                return path
    return None


HAXBY = find_haxby()
CATEGORIES = ["bottle", "cat", "chair", "face", "house", "scissors", "scrambledpix", "shoe"]

# sphinx_gallery_start_ignore
# The documentation is built on a small shared machine, where torch's intra-op threads
# compete with other processes and make the engine's small tensor operations several
# times slower; one thread is faster there.
import torch  # noqa: E402

_torch_threads = torch.get_num_threads()
torch.set_num_threads(1)
# sphinx_gallery_end_ignore

# %%
# Beta images, one per block
# --------------------------
# Each run shows every category once, in a 24 s block (22.5 s, 9 volumes, in the events
# tables printed below).  ``model="trial"`` fits one regressor per row of the events
# tables (least squares all), so each block gets its own beta image: 12 runs × 8
# categories = 96 images.  The table that comes back has the events' feature columns and
# a ``(run, trial)`` index.
#
# By default (``standardize="auto"``, which is ``"run"`` for trial images) each voxel's
# betas are z-scored across the blocks of each run: what differs from run to run (drift,
# global signal, head position) shifts all the betas of a run together and would
# otherwise dominate the distances between blocks.  We also keep the raw betas to
# compare.
if HAXBY is not None:
    runs = [HAXBY / f"BOLD/task001_run{r:03d}/bold_25mm.nii.gz" for r in range(1, 13)]
    events = [HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv" for r in range(1, 13)]
    mask = nib.load(HAXBY / "masks/25mm/brain.nii.gz")
    print(pd.read_csv(events[0], sep="\t").head(3))
    imgs, table = trial_images(runs, events, t_r=2.5, mask_img=mask)
    raw, _ = trial_images(runs, events, t_r=2.5, mask_img=mask, standardize=None)
    background = mean_img(runs[0], copy_header=True)
else:
    # Fallback without the shared data: Gaussian noise "betas" with the same design
    # (12 runs × 8 categories) on a small grid; no feature is encoded anywhere.
    print("Shared Haxby data not found: using simulated noise images instead.")
    rng = np.random.default_rng(0)
    affine = np.diag([25.0, 25.0, 25.0, 1.0])
    affine[:3, 3] = -62.5
    grid = np.indices((6, 7, 6)).reshape(3, -1).T
    inside = np.linalg.norm((grid - [2.5, 3.0, 2.5]) / [3.0, 3.6, 3.0], axis=1) <= 1
    mask = nib.Nifti1Image(inside.reshape(6, 7, 6).astype(np.int8), affine)
    imgs = nib.Nifti1Image(rng.standard_normal((6, 7, 6, 96)).astype(np.float32), affine)
    table = pd.DataFrame(
        {"trial_type": [c for _ in range(12) for c in rng.permutation(CATEGORIES)]},
        index=pd.MultiIndex.from_product([range(12), range(8)], names=["run", "trial"]))
    raw = imgs
    background = mask

print(imgs.shape)
table.head()

# %%
# Block designs given as labels per volume or as FSL onset files
# --------------------------------------------------------------
# The events tables above are BIDS-style ``events.tsv`` files.  Two other layouts are
# common for block designs, and each becomes the same list of events tables (one per
# run) in one call.  PyMVPA's ``attributes.txt`` (and the labels table of nilearn's Haxby
# example) gives a label and a run per volume, rest included:
# :func:`~mlem_neuro.fmri.events_from_labels` turns each stretch of consecutive volumes
# with one label into a block, in seconds from the run's first volume, and leaves the
# ``rest`` volumes out.  Here two runs of such labels, 5 rest volumes before each 9-volume
# block, in an order drawn at random (with a file: ``events_from_labels("attributes.txt",
# t_r=2.5)``):
order = np.random.default_rng(2)
labels, chunks = [], []
for chunk in range(2):
    for category in order.permutation(CATEGORIES):
        labels += ["rest"] * 5 + [category] * 9
        chunks += [chunk] * 14
block_events = events_from_labels(labels, chunks, t_r=2.5)
block_events[0].head(3)

# %%
# FSL's three-column onset files (``onset duration weight``, one file per condition) are
# read by :func:`~mlem_neuro.fmri.read_fsl_onsets`, each condition named by a dict or by
# its file's name.  Written from the first run's blocks and read back:
fsl_folder = Path(tempfile.mkdtemp())
for category, blocks in block_events[0].groupby("trial_type"):
    blocks[["onset", "duration"]].assign(weight=1).to_csv(
        fsl_folder / f"{category}.txt", sep=" ", header=False, index=False)
print(read_fsl_onsets(sorted(fsl_folder.glob("*.txt"))).equals(block_events[0]))

# %%
# The OpenFMRI layout keeps such files as ``condNNN.txt``, one folder per run, and names
# the conditions in ``condition_key.txt`` (``task001 cond001 house``):
# :func:`~mlem_neuro.fmri.read_openfmri_onsets` reads a run's folder with it.  The shared
# Haxby copy has this layout too, and its onset files give the runs' events tables again.
# Each of these lists goes to :func:`~mlem_neuro.fmri.trial_images` as its ``events``,
# with the BOLD runs in the same order (``trial_images(runs, fsl_events, t_r=2.5)``).
if HAXBY is not None:
    key = HAXBY.parent / "models/model001/condition_key.txt"
    fsl_events = [read_openfmri_onsets(HAXBY / f"model/model001/onsets/task001_run{r:03d}",
                                       key) for r in range(1, 13)]
    print(all(ev.equals(pd.read_csv(path, sep="\t").sort_values("onset", ignore_index=True))
              for ev, path in zip(fsl_events, events)))

# %%
# Features
# --------
# ``trial_type`` is the category.  ``animacy`` is a higher-level feature derived from it:
# faces and cats are animate, everything else is not.  For a pair of blocks, the category
# distance is 1 when the categories differ, the animacy distance 1 when one is animate and
# the other not.  Animacy is nested in category (pairs that differ in animacy always
# differ in category), so the product of the two distances equals the animacy distance:
# the interaction term would duplicate the animacy term, and we leave interactions out.
table["animacy"] = np.where(table["trial_type"].isin(["face", "cat"]),
                            "animate", "inanimate")
features = table[["trial_type", "animacy"]]
features.value_counts()

# %%
# Searchlight
# -----------
# Blocks of one run share that run's noise and drift, so the folds hold out whole runs:
# 4 folds of 3 runs, passed as a list of (train, test) index pairs.  Not one run per
# fold: a run has one block per category, so every held-out pair would differ in
# category and its importance would be 0 by construction (the analysis warns when folds
# are like that).  With 25 mm voxels a
# 30 mm radius takes a centre and its (up to) 6 face neighbours.  Every brain voxel is a
# centre, each sphere one model, and the batched engine trains them together.
# ``n_permutations=2`` keeps this example
# fast; use the default (10) in a real analysis.
run = table.index.get_level_values("run")
cv = list(GroupKFold(n_splits=4).split(features, groups=run))
settings = dict(cv=cv, n_permutations=2, interactions=False, random_state=0)
res = mlem_neuro.mlem_searchlight(imgs, features, mask, radius=30.0, **settings)
res

# %%
# The maps have one value per sphere centre: held-out Spearman ρ (``score_img``) and the
# importance of each term (``importance_img(term)``, or all terms at once in a 4D image
# with ``to_nifti()``).  The tidy frame has one row per (sphere, term).
frame = res.to_data_frame()
frame.groupby("term")[["importance", "score"]].describe().round(3).T

# %%
# Even at this coarse resolution some spheres predict the distances between held-out
# blocks: the held-out Spearman reaches about 0.16 in spheres of the back half of the
# brain (the six best are centred at y = -37.5 or -62.5 mm, of -87.5 to 87.5 mm), while
# its median over all spheres is about 0.01 (with only 2 permutations per term, the
# importances are noisier than a real analysis would give).  Plot the importance maps and
# the held-out Spearman over the mean EPI image of the first run, on one colour scale
# (±0.15 here, ±0.4 for the positive control below).
# Without ``bg_img``, ``plot`` uses the mean absolute value of the analysed images (the
# brain they come from): these maps are in the subject's native space, where nilearn's
# MNI template would not line up.
CUTS = [-37.5, -12.5, 12.5, 37.5]


def plot_maps(result, title, outline=None, vmax=0.4):
    """The importance of each term and the held-out Spearman (last row)."""
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.9))
    for ax, term in zip(axes, [*result.terms, None]):
        name = "held-out ρ" if term is None else term
        display = result.plot(term, bg_img=background, display_mode="z", cut_coords=CUTS,
                              axes=ax, figure=fig, vmax=vmax, cmap="RdBu_r",
                              draw_cross=False, annotate=False, title=f"{title}: {name}")
        if outline is not None:
            display.add_contours(outline, levels=[0.5], colors="k", linewidths=1.5)
    return fig


plot_maps(res, "Haxby" if HAXBY is not None else "noise", vmax=0.15)

# %%
# Raw betas against betas z-scored within run
# -------------------------------------------
# How much does the z-scoring matter?  :func:`mlem_neuro.mlem_roi` with the whole brain
# mask as one region pools all 129 voxels into one pattern per block; the same folds,
# with the z-scored betas and with the raw ones:
whole = nib.Nifti1Image((np.asarray(mask.dataobj) > 0).astype(np.int16), mask.affine)
compare = {}
for name, images in [("z-scored within run", imgs), ("raw betas", raw)]:
    r = mlem_neuro.mlem_roi(images, features, whole, **settings)
    compare[name] = pd.Series([r.score[0], *r.importance[0]],
                              index=["held-out ρ", *(f"importance: {t}" for t in r.terms)])
pd.DataFrame(compare).round(3)

# %%
# With raw betas the run-to-run shifts dominate the distances and the held-out Spearman
# is close to 0 (-0.02 here); z-scored within run, the category structure shows (0.05
# with these 4 folds).  Over 10 random
# fold assignments (``validation/haxby_standardize.py``), this region's held-out ρ is
# -0.004 (sd 0.015) raw against 0.089 (sd 0.018) z-scored with 4 folds, and its
# permutation test (``n_null=200``, 6 folds) gives p = 0.65 raw and p = 0.005
# z-scored; the options page has the numbers for other regions.

# %%
# Positive control: an animacy pattern in one region
# --------------------------------------------------
# How does a strong effect in a known place look?  We add a fixed random spatial pattern
# to the animate blocks only, inside a ball of radius 40 mm, with an amplitude of twice
# each voxel's across-block standard deviation, and run the same searchlight.  The ball
# is outlined in black.
data = imgs.get_fdata()
ijk = np.argwhere(np.asarray(mask.dataobj) > 0)
xyz = ijk @ mask.affine[:3, :3].T + mask.affine[:3, 3]
centre = xyz[np.argmin(xyz[:, 1])] + [0.0, 50.0, 0.0]     # 50 mm in from the back
region = ijk[np.linalg.norm(xyz - centre, axis=1) <= 40.0]
rng = np.random.default_rng(1)
animate = (table["animacy"] == "animate").to_numpy()
vox = tuple(region.T)
pattern = rng.standard_normal(len(region)) * data[vox].std(axis=1)
data[vox] += 2.0 * pattern[:, None] * animate[None, :]
planted = nib.Nifti1Image(data, imgs.affine)
in_region = np.zeros(mask.shape, bool)
in_region[vox] = True
outline = nib.Nifti1Image(in_region.astype(np.int8), mask.affine)
print(f"pattern added to {len(region)} voxels around {centre} mm")

res_planted = mlem_neuro.mlem_searchlight(planted, features, mask, radius=30.0, **settings)
plot_maps(res_planted, "positive control", outline)

# %%
# The animacy importance now peaks in and around the region, while the category term
# stays near zero: the pattern separates animate from inanimate blocks but not faces from
# cats, and MLEM assigns the distances it explains to the feature that predicts them.
centres_in = in_region[tuple(res_planted.voxel_indices.T)]
summary = pd.DataFrame({
    f"{name}, {where}": np.append(r.importance[sel].mean(axis=0), r.score[sel].mean())
    for name, r in [("Haxby" if HAXBY is not None else "noise", res),
                    ("positive control", res_planted)]
    for where, sel in [("in region", centres_in), ("elsewhere", ~centres_in)]
}, index=[*res.terms, "held-out ρ"]).T
summary.round(3)

# %%
# Permutation tests that respect the runs
# ---------------------------------------
# Is the category map more than chance?  ``n_null`` adds permutation tests.  Pass the
# runs as ``groups``: the folds then hold out whole runs, every null relabels blocks only
# *within* their run (per-run z-scoring makes the blocks of a run sum to zero, and every
# pair of blocks of one run differs in category: a null across runs would not keep that),
# and the folds are scored on pairs of blocks from different runs
# (``held_out_pairs="auto"``), so the runs cannot pass for a category effect.  Animacy is
# left out: nested in the category, its test given the category could never move (the
# analysis would say so and report NaN p-values; ``null="marginal"`` asks the other
# question).  Repeated two-fold splits of the runs are more sensitive than 4 folds.
#
# The control: the same analysis with the category labels shuffled within each run keeps
# the design and removes the information.
category = features[["trial_type"]].reset_index(drop=True)
run_labels = np.asarray(run)
test_settings = dict(groups=run_labels, cv=2, n_repeats=10, n_null=99,
                     interactions=False, random_state=0)
tested = mlem_neuro.mlem_searchlight(imgs, category, mask, radius=30.0, **test_settings)
shuffled = category.copy()
shuffle_rng = np.random.default_rng(0)
for r in np.unique(run_labels):
    rows = np.flatnonzero(run_labels == r)
    shuffled.iloc[rows, 0] = category.iloc[shuffle_rng.permutation(rows), 0].to_numpy()
control = mlem_neuro.mlem_searchlight(imgs, shuffled, mask, radius=30.0, **test_settings)
pd.DataFrame({name: {"median importance": np.median(r.importance[:, 0]),
                     "spheres with p < 0.05": np.mean(r.pvalues[:, 1] < 0.05),
                     "FWE-significant spheres": int(r.significant("trial_type").sum())}
              for name, r in [("real labels", tested), ("shuffled within run", control)]})

# %%
# The p-values side by side: spheres where the real labels' category test is below 0.05
# (left), none of which the shuffle control should repeat except by chance (right).
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
for ax, (name, r) in zip(axes, [("real labels", tested), ("shuffled within run", control)]):
    p = r.pvalues[:, r.tests.index("trial_type")]
    ax.hist(p, bins=np.linspace(0, 1, 21), color="0.6", edgecolor="k")
    ax.axvline(0.05, color="r", lw=1)
    ax.set(title=f"{name}: {np.mean(p < 0.05):.0%} of spheres below 0.05",
           xlabel="category test, uncorrected p")
axes[0].set_ylabel("spheres")
fig.tight_layout()

# %%
# With the shared data the real labels give 26 of 129 spheres at p < 0.05 and 5
# family-wise significant ones, the shuffled labels 7 and none (the default test: with
# one feature there is no interaction to find, so it is the category's main effect;
# method page).  Over 200 within-run shuffles (``validation/haxby_shuffle.py
# --main-only``) 3.9 % of spheres reached p < 0.05 on average (nominal 4 % with 99
# nulls) and 6 shuffles (3.0 %) had a family-wise significant sphere, as a calibrated
# test should.
# Without ``groups`` (nulls across runs) the same folds put 27.9 % of the spheres of the
# real labels below 0.05, far more than with them (13.2 %; both with the former test):
# that excess was the runs, not the categories.
# The method page has the simulations behind these choices.

# %%
# Regions of interest
# -------------------
# :func:`mlem_neuro.mlem_roi` fits one model per region of an atlas (integer labels,
# 0 = background).  Here the atlas has two regions: the ball of the positive control (1)
# and the rest of the brain mask (2).  A region pools all its voxels into one pattern, so
# a weak but distributed effect gains from it; on the other hand it cannot say where
# inside the region the information lies.
labels = np.where(np.asarray(mask.dataobj) > 0, 2, 0).astype(np.int16)
labels[vox] = 1
atlas = nib.Nifti1Image(labels, mask.affine)
rois = {name: mlem_neuro.mlem_roi(images, features, atlas, mask, **settings)
        for name, images in [("original", imgs), ("positive control", planted)]}

fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=True)
for ax, (name, r) in zip(axes, rois.items()):
    roi_frame = r.to_data_frame().replace({"region": {1: "ball (1)",
                                                      2: "rest of brain (2)"}})
    values, spread = (roi_frame.pivot(index="region", columns="term", values=v)[r.terms]
                      for v in ("importance", "importance_fold_std"))
    values.plot.bar(ax=ax, rot=0, yerr=spread.to_numpy().T)
    ax.axhline(0, color="k", lw=0.8)
    ax.set(title=name, xlabel="", ylabel="importance (drop of held-out ρ)")
fig.tight_layout()

# %%
# Error bars are the standard deviation across the 4 folds.
#
# The results save to one ``.npz`` file (``res.save(fname)``, read back with
# :func:`mlem_neuro.read_result`).  The command line runs the same steps on BIDS-style
# files, with the events' columns named in ``--features`` as features (add a derived
# column such as ``animacy`` to the ``events.tsv`` files first), the runs as groups
# (``--group-runs``: folds and nulls respect them) and one importance volume per term in
# ``importance.nii.gz``:
#
# .. code-block:: bash
#
#    mlem-neuro searchlight --imgs run-*_bold.nii.gz --events run-*_events.tsv \
#        --mask brain_mask.nii.gz --t-r 2.5 --radius 30 --features trial_type \
#        --group-runs --cv 2 --n-repeats 10 --n-null 99 --out results/

# sphinx_gallery_start_ignore
torch.set_num_threads(_torch_threads)
# sphinx_gallery_end_ignore
