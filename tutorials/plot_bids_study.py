"""
A BIDS study: every participant, then the group
===============================================

A study stored as a `BIDS <https://bids.neuroimaging.io>`_ dataset can be analysed in
one command per level, as a BIDS App: ``mlem-neuro bids BIDS_ROOT OUTPUT_DIR
participant`` analyses each participant and writes a BIDS derivatives dataset, then
``mlem-neuro bids BIDS_ROOT OUTPUT_DIR group`` tests the participants' results across
the group.  The same runs from Python with :func:`mlem_neuro.bids.run_bids`.

This tutorial writes two small simulated studies (nothing is downloaded) and runs both
levels on each:

1. an EEG study (read with `mne-bids <https://mne.tools/mne-bids>`_, epoched around the
   onsets of each recording's ``events.tsv``), from Python;
2. an fMRI study with a derivatives folder in fMRIPrep's layout (preprocessed runs,
   brain masks, confounds), from the command line, with one model per region of an
   atlas;
3. a study with a broken participant: the others still run, and a second run redoes only
   what is missing.

In both studies every trial has two features in its ``events.tsv``: ``category`` (A or
B), which every participant's brain encodes, and ``size`` (small or large), which none
does.  The training settings are cut down (few steps, one split into two folds) so that
the whole tutorial runs in seconds; a real study keeps the defaults.
"""
# %%
import json
import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

import mlem_neuro
from mlem_neuro.bids import run_bids
from mlem_neuro.cli import main
from mlem_neuro.simulation import simulate_bids_study
from mlem_neuro.stats import plot_clusters

work = Path(tempfile.mkdtemp(prefix="mlem_bids_"))
FAST = dict(cv=2, n_repeats=1, max_steps=40, random_state=0)

# %%
# An EEG study
# ------------
# :func:`~mlem_neuro.simulation.simulate_bids_study` writes six participants' EEG
# recordings with :func:`mne_bids.write_raw_bids` (40 trials each, 8 channels at 100 Hz):
# ``category`` adds a participant-specific channel pattern around 0.2 s after each
# onset.  The dataset is an ordinary BIDS folder.
eeg = simulate_bids_study(work / "eeg_study", "eeg", n_subjects=6, n_trials=40,
                          effect=1.0, random_state=0)["bids_root"]
print(sorted(str(p.relative_to(eeg)) for p in (eeg / "sub-01").rglob("*")))
print(pd.read_csv(eeg / "sub-01" / "eeg" / "sub-01_task-objects_events.tsv",
                  sep="\t").head())

# %%
# The participant level: each participant's recordings are found with mne-bids, epoched
# from ``tmin`` to ``tmax`` around the onsets of its ``events.tsv`` (whose rows become the
# epochs' metadata: its columns are the features), and analysed with
# :func:`mlem_neuro.mlem_epochs`.  Any option of the analyses passes through
# (``n_null``, ``cv``, ``random_state``...).  The report has one row per participant.
out = work / "eeg_study" / "derivatives" / "mlem"
report = run_bids(eeg, out, "participant", task="objects", features=["category", "size"],
                  tmin=-0.1, tmax=0.4, **FAST)
print(report[["participant", "status"]])

# %%
# The outputs form a BIDS derivatives dataset: a ``dataset_description.json`` naming the
# package, its version and the settings of each task, and per participant the saved
# result (:func:`mlem_neuro.read_result`), its table and its figure, under BIDS-style
# names.
print(sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()))
description = json.loads((out / "dataset_description.json").read_text())
print(description["GeneratedBy"], description["MLEMSettings"]["task-objects"]["features"])
res = mlem_neuro.read_result(out / "sub-01" / "eeg" / "sub-01_task-objects_desc-mlem_result.npz")
res.plot()

# %%
# The group level tests each term's importance time course across the participants with
# a cluster-based permutation test (:func:`mlem_neuro.stats.permutation_cluster_test`)
# and writes the clusters, the group t values and a figure to ``derivatives/mlem/group``.
tests = run_bids(eeg, out, "group", task="objects")
for term in ("category", "size"):
    print(term, tests[term].to_data_frame().round(3).to_dict("records"))
results = [mlem_neuro.read_result(p) for p in sorted(out.glob("sub-*/eeg/*_result.npz"))]
fig, axes = plt.subplots(2, 1, sharex=True, figsize=(6, 4))
for ax, term in zip(axes, ("category", "size")):
    plot_clusters(results, term, stats=tests[term], ax=ax, show=False)
fig.tight_layout()

# %%
# ``category`` is found after the onset, around 0.2 s where it was simulated; ``size``,
# encoded by no one, is not.  (With six participants the sign-flip test has 64
# permutations, so the smallest possible p-value is 1/64.)
#
# An fMRI study, from the command line
# ------------------------------------
# For fMRI, the participant level reads a derivatives folder in fMRIPrep's layout:
# the preprocessed runs in one ``--space``, their brain masks and confounds tables (the
# six head-motion parameters by default), and the raw dataset's ``events.tsv``.  The
# repetition time comes from the sidecars and is checked against the NIfTI headers and
# between runs.  Betas per trial come from :func:`mlem_neuro.fmri.trial_images`, then a
# searchlight or, here, one model per region of an atlas (``--analysis roi``).  The
# command line takes the same options as ``mlem-neuro epochs`` and ``searchlight``
# (shown here through :func:`mlem_neuro.cli.main`, the function behind the
# ``mlem-neuro`` command).
fmri = simulate_bids_study(work / "fmri_study", "func", n_subjects=6, n_trials=16,
                           effect=1.0, random_state=0)
root = fmri["bids_root"]
print(sorted(str(p.relative_to(root)) for p in (root / "derivatives" / "fmriprep"
                                                / "sub-01").rglob("*run-1_*")))
command = ["bids", str(root), str(root / "derivatives" / "mlem"), "participant",
           "--task", "objects", "--features", "category,size",
           "--space", "MNI152NLin2009cAsym", "--analysis", "roi",
           "--labels-img", str(fmri["labels_img"]),
           "--cv", "2", "--n-repeats", "1", "--max-steps", "40", "--random-state", "0"]
print("mlem-neuro " + " ".join(command))
assert main(command) == 0

# %%
# The group level tests the participants' maps with
# :func:`mlem_neuro.stats.second_level_maps` (voxel-wise, family-wise corrected): a map
# of ``-log10 p`` per term, and a table.
assert main(["bids", str(root), str(root / "derivatives" / "mlem"), "group",
             "--task", "objects"]) == 0
group = root / "derivatives" / "mlem" / "group"
print(pd.read_csv(group / "task-objects_space-MNI152NLin2009cAsym_desc-mlem_summary.csv"))

# %%
# The encoded half of the grid (region 1, x < 0 mm) is significant for ``category``
# (its 108 voxels), nothing for ``size``.
#
# A broken participant, and resuming
# ----------------------------------
# A participant whose files are missing fails with the file named; the others are
# analysed and written, and the command ends with exit code 1 listing the failed ones.
# Each participant is written into a hidden folder and moved into place only once
# complete, so nothing half-written is left.  Running the same command again skips the
# participants already done (``--overwrite`` redoes them) and redoes the failed ones.
events = root / "sub-03" / "func" / "sub-03_task-objects_run-02_events.tsv"
shutil.move(events, work / events.name)
out2 = root / "derivatives" / "mlem_resume"
command[2] = str(out2)
print("exit code:", main(command))

# %%
# With the file back, the second run analyses sub-03 only.
shutil.move(work / events.name, events)
print("exit code:", main(command))
shutil.rmtree(work, ignore_errors=True)

# %%
# Parallel participants, and a cluster
# ------------------------------------
# Participants are dispatched with joblib: ``n_jobs`` (``--n-jobs``) runs several at
# once, and inside ``joblib.parallel_config(backend="dask")`` they run on a
# ``dask.distributed`` cluster (the files are read and written by the workers, so the
# dataset and the output folder must be on a file system they share)::
#
#     from dask.distributed import Client
#     client = Client("scheduler-address:8786")
#     with joblib.parallel_config(backend="dask"):
#         run_bids("study", "study/derivatives/mlem", "participant", task="objects",
#                  features=["category", "size"], n_null=99, random_state=0)
