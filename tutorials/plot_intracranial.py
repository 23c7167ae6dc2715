"""
ECoG / intracranial arrays with ``mlem_array``
==============================================

Intracranial recordings (ECoG contacts, depth electrodes, single units) often come as a
plain array of trials rather than as :class:`mne.Epochs`.
:func:`mlem_neuro.mlem_array` takes that array, ``(n_trials, n_channels, n_times)``,
together with a feature table with one row per trial, and returns the same importance time
courses as :func:`mlem_neuro.mlem_epochs`.  When several trials show one stimulus,
``items=`` averages them into one stimulus (last section).

The example uses 64 single units from macaque inferior temporal (IT) cortex (Zhang et al.,
"Object decoding with attention in inferior temporal cortex", *PNAS* 2011; rasters as
distributed with NeuroDecodeR): 7 objects shown at 3 positions, about 20 trials per
object × position.  The
question is one MLEM is built for: how much do object identity and retinal position each
shape the population's geometry, and when?  Where the recordings are not available the
tutorial runs on a simulated array instead.
"""
# %%
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.io

import mlem_neuro


def find_data(name):
    here = [Path(__file__).resolve().parent] if "__file__" in globals() else []
    for start in here + [Path.cwd()]:
        for folder in [start, *start.parents]:
            candidate = folder / "shared" / "data" / name
            if candidate.is_dir():
                return candidate
    return None


folder = find_data("zhang_desimone_it_units_part1")

# %%
# From spike rasters to a pseudo-population
# -----------------------------------------
# Each unit has its own file: a 0/1 raster (trials × 1000 ms, stimulus onset at 500 ms)
# and the object and position of every trial.  The 64 units were recorded in different
# sessions, so their trials cannot be matched one to one.  We build a *pseudo-population*: for each
# of the 21 object × position conditions, each unit's trials (19 or 20) are split in order
# into 4 groups, and the ``g``-th group of every unit forms pseudo-trial ``g``.  Averaging
# about 5 trials raises the signal-to-noise ratio; keeping 4 pseudo-trials per condition
# leaves pairs of stimuli that share a condition, as real trials would.
#
# The array keeps the rasters' 1 ms resolution (firing rate in spikes/s, from 500 ms before
# to 500 ms after onset); ``mlem_array`` does the binning below.
n_groups = 4                                               # pseudo-trials per condition
times = np.arange(-500, 500) / 1000                        # seconds from onset
positions = ["lower", "middle", "upper"]


def unit_rates(path):
    """(conditions × groups, 1000 ms) firing rates of one unit, and the condition labels."""
    mat = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
    rate = mat["raster_data"].astype(float) * 1000             # spikes/s in 1 ms bins
    labels = np.asarray(mat["raster_labels"].combined_ID_position)
    rows, conditions = [], []
    for condition in sorted(set(labels)):
        for group in np.array_split(np.flatnonzero(labels == condition), n_groups):
            rows.append(rate[group].mean(axis=0))
            conditions.append(condition)
    return np.array(rows), conditions


if folder is not None:
    files = sorted((folder / "raster_mat").glob("*.mat"))
    units = [unit_rates(f) for f in files]
    conditions = units[0][1]
    assert all(u[1] == conditions for u in units)          # rows aligned across units
    data = np.stack([u[0] for u in units], axis=1)         # (trials, units, times)
    ch_names = [f.stem.removesuffix("_raster_data") for f in files]
    features = pd.DataFrame([c.split("_") for c in conditions],
                            columns=["object", "position"])
else:
    print("The IT recordings were not found: running on a simulated array instead (3 "
          "objects, 3 positions), in which 'object' is encoded from 100 to 450 ms and "
          "'position' from 50 to 200 ms.")
    from mlem_neuro.simulation import simulate_epochs

    data, features, _ = simulate_epochs(
        n_trials=84, n_channels=64, n_times=len(times), sfreq=1000.0, tmin=times[0],
        windows={"object": (0.1, 0.45), "position": (0.05, 0.2)}, n_levels=3,
        amplitude=0.7, random_state=0)
    features["position"] = features["position"].cat.rename_categories(positions)
    ch_names = [f"unit{k:02d}" for k in range(data.shape[1])]

# %%
# ``object`` is categorical: two stimuli differ (distance 1) or not (0).  ``position`` is
# categorical too, although the three positions are ordered in space.  An ordinal code
# (``ordered=True``, or ``feature_kinds={"position": "ordinal"}``) would make lower–upper
# twice as far as lower–middle: it claims that the population's distance grows with the
# distance between positions.  That is a stronger hypothesis than "the positions differ",
# and these IT units do not follow it: coded as ordinal, ``position`` stays near zero
# (mean importance 0.004 from 100 ms on, against 0.04–0.05 as categorical; seeds 0–2)
# and the peak held-out ρ drops from 0.22 to 0.14; its permutation test (with the
# settings of :ref:`sphx_glr_auto_tutorials_plot_significance.py`) passes only at 400 ms
# (corrected p = 0.04; 0.50 and 0.12 at 200 and 300 ms), against 0.02 from 200 ms on as
# categorical.  Choosing the
# code is part of the question: see ``feature_kinds`` on the :doc:`/options` page.
features["position"] = pd.Categorical(features["position"], categories=positions)
print(f"{data.shape[0]} pseudo-trials × {data.shape[1]} units × {data.shape[2]} samples")
features.value_counts().head()

# %%
# Time-resolved MLEM
# ------------------
# ``window=0.1`` averages each sample with its neighbours within ±50 ms (a 100 ms rate),
# ``decim=50`` then keeps one sample in 50, and ``tmin`` / ``tmax`` the part of the trial
# analysed: rates over 100 ms windows every 50 ms, centred from 150 ms before to 450 ms
# after onset.  Each unit is standardised over trials and times (``scale=True``, the
# default), so that units with high firing rates do not dominate the distances.  Folds
# split the pseudo-trials.
res = mlem_neuro.mlem_array(data, features, times=times, ch_names=ch_names, window=0.1,
                            decim=50, tmin=-0.15, tmax=0.45, random_state=0)
print(f"{res.n_times} time points: {res.times[0]:.2f} to {res.times[-1]:.2f} s")
fig = res.plot()

# %%
# The peak of each term, and the held-out Spearman ρ at that time:
df = res.to_data_frame()
df.loc[df.groupby("term")["importance"].idxmax(), ["term", "time", "importance", "score"]]

# %%
# On the IT recordings, object identity shapes the population's distances from about
# 150 ms after onset (peak importance 0.16 at 200 ms), and the held-out score rises with
# it (0.22 at 200 ms).  Retinal position shapes them too, from the same time and for
# longer, but less (0.03–0.06 from 150 ms to the end): in this sample of IT units the
# geometry is dominated by what the object is, and where it is adds a smaller, lasting
# difference.  Small negative importances (both terms before onset: −0.01 to 0, well
# within the spread over folds, about 0.02) come from weights learnt from noise in the
# training pairs: they rank held-out pairs slightly worse than none, so permuting a term
# helps.
#
# Before onset, every term should stay near zero: a useful check that the folds leak no
# stimulus identity (a leak would show as a positive importance; object's small negative
# mean is the effect just described).
baseline = res.times < 0
pd.Series(res.importance[baseline].mean(axis=0), index=res.terms,
          name="mean importance before onset").round(3)

# %%
# Main effects: what each feature does on its own
# -----------------------------------------------
# The importance is what permuting a feature costs the learnt metric on held-out pairs,
# interactions included; once ``object`` is known, ``position`` changes the ranking of
# held-out distances little, and its importance curve is noisy.  Every result also holds
# each feature's *main effect* (``res.main_effect``): the partial Spearman correlation
# between the feature's distance and the neural distance, the other features' held fixed,
# over all pairs (the curve a partial RSA draws).  On these units the ``position`` main
# effect curve replicates between two disjoint halves of the units as well as a RSA curve
# (r = 0.95 against 0.94; the importance curve 0.39: ``validation/feature_statistic.py
# --it``).  With tests (``n_null``), each feature's test is its main effect, as
# sensitive as a partial Mantel test to a feature's own effect, and where the test of
# interactions finds interactions the importance joins it, which keeps what only an
# interaction carries (``feature_test="staged"``, the default;
# :ref:`sphx_glr_auto_tutorials_plot_interactions.py`).
fig = res.plot(measure="main_effect", score=False)

# %%
# Pseudo-trials of one condition: ``items=``
# ------------------------------------------
# Above, each of the 4 pseudo-trials of an object × position condition is a stimulus of
# its own: pairs of pseudo-trials of one condition all sit at feature distance 0, the
# folds put pseudo-trials of one condition on both sides, and the noise left in each
# pseudo-trial inflates every neural distance.  The stimuli of this experiment are the 21
# conditions, so we name them with ``items=``: the pseudo-trials of each condition are
# averaged into one response (every recorded trial of the condition), folds split
# conditions and pairs are between conditions.  The column named by ``items`` is an
# identifier, not a feature.
#
# Two folds (the default, given here explicitly because it matters) hold out 10 or 11 of
# the 21 items, so at least two share an object and every feature varies.  5 folds would
# hold out 4 or 5 conditions, often all of different objects: ``object`` would then be
# flat over the held-out pairs and its importance 0 by construction (the analysis warns).
features["condition"] = [f"{o}_{p}" for o, p in zip(features["object"],
                                                     features["position"])]
res_items = mlem_neuro.mlem_array(data, features, items="condition", cv=2, times=times,
                                  ch_names=ch_names, window=0.1, decim=50, tmin=-0.15,
                                  tmax=0.45, random_state=0)
print(f"{res_items.settings['n_items']} items of "
      f"{min(res_items.settings['trials_per_item'])}-"
      f"{max(res_items.settings['trials_per_item'])} pseudo-trials; peak held-out ρ "
      f"{res_items.score.max():.3f} (pseudo-trials as stimuli: {res.score.max():.3f})")
fig = res_items.plot()

# %%
# On the IT recordings the held-out ρ between conditions peaks higher than between
# pseudo-trials (0.33 against 0.22 here; 0.32 and 0.30 against 0.22 with
# ``random_state=1`` and ``2``): the averaged responses are much less noisy, and no pair
# ties at feature distance 0.  But the score swings more (from −0.06 to 0.03 up to onset
# here, against −0.01 to 0.00; its peak is at the last time point), and the importance
# curves are not reliably cleaner (object's peak importance over the standard deviation
# of its values before onset: 44 against 58 here; 74 against 65 and 63 against 82 with
# ``random_state=1`` and ``2``): 21 conditions in 2 folds leave 45 or 55 held-out pairs
# per fold, against 861 pairs of the 42 held-out pseudo-trials of a fold above.
# ``items=`` answers the question about stimuli; with few items, the price is fewer
# pairs to score on.
