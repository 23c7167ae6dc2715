"""
MLEM and RSA side by side
=========================

Representational similarity analysis (RSA) asks, at each time point, how well one
feature's dissimilarity matrix correlates with the neural one.  MLEM asks how the
features *together* shape the neural distances: it learns a metric ``W`` over the feature
distances (so features are weighted against each other, and their interactions are
modelled), scores it on held-out stimuli, and reports how much each feature adds.

This tutorial runs both on the same arrays with one call each,
:func:`mlem_neuro.rsa.rsa_array` and :func:`mlem_neuro.mlem_array`, to show what MLEM adds
(learnt weights, interactions, a held-out fit) and what it costs (noise, time).  Both
results are the same kind of object, with the same permutation tests, corrections,
tables and plots.  The data are 64 macaque IT
units (Zhang et al., *PNAS* 2011; the rasters distributed with NeuroDecodeR), 7 objects ×
3 positions; where the recordings are absent, a simulated array stands in.
"""
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import scipy.io

import mlem_neuro
from mlem_neuro.rsa import rsa_array


def find_data(name):
    here = [Path(__file__).resolve().parent] if "__file__" in globals() else []
    for start in here + [Path.cwd()]:
        for folder in [start, *start.parents]:
            candidate = folder / "shared" / "data" / name
            if candidate.is_dir():
                return candidate
    return None


# %%
# The same arrays for both methods
# --------------------------------
# Each object × position condition's trials are split into 4 groups and averaged
# (pseudo-trials: 84 stimuli), and the firing rates are averaged in 100 ms windows every
# 25 ms from −0.3 to 0.45 s.
folder = find_data("zhang_desimone_it_units_part1")
centres = np.arange(-0.3, 0.45 + 1e-9, 0.025)

if folder is not None:
    units, conditions = [], None
    for path in sorted((folder / "raster_mat").glob("*.mat")):
        mat = scipy.io.loadmat(path, squeeze_me=True, struct_as_record=False)
        rate = mat["raster_data"].astype(float) * 1000          # spikes/s, 1 ms bins
        labels = np.asarray(mat["raster_labels"].combined_ID_position)
        rows, conds = [], []
        for condition in sorted(set(labels)):
            for group in np.array_split(np.flatnonzero(labels == condition), 4):
                rows.append(rate[group].mean(axis=0))
                conds.append(condition)
        conditions = conds
        units.append(np.array(rows))
    full = np.stack(units, axis=1)                              # (84, 64, 1000 ms)
    onset = 500                                                 # column of t = 0
    data = np.stack([full[:, :, onset + int(round(c * 1000)) - 50:
                          onset + int(round(c * 1000)) + 50].mean(axis=-1)
                     for c in centres], axis=-1)
    features = pd.DataFrame([c.split("_") for c in conditions],
                            columns=["object", "position"])
else:
    print("The IT recordings were not found: a simulated array stands in (3 objects, "
          "3 positions; object encoded from 100 to 450 ms, position from 50 to 200 ms).")
    from mlem_neuro.simulation import simulate_epochs

    data, features, _ = simulate_epochs(
        n_trials=84, n_channels=64, n_times=len(centres), sfreq=40.0, tmin=centres[0],
        windows={"object": (0.1, 0.45), "position": (0.05, 0.2)}, n_levels=3,
        amplitude=0.7, random_state=0)
print(f"{data.shape[0]} stimuli × {data.shape[1]} units × {data.shape[2]} time points")

# %%
# RSA in one call
# ---------------
# Per time point: the Euclidean distance of every pair of stimuli, and its Spearman
# correlation with each feature's model RDM (1 where the two stimuli differ), tested by
# relabelling the stimuli (99 times, the same relabellings for every time point and
# feature, so that ``pvalues_fwe`` is corrected over time points by the maximum
# statistic, as MLEM's).  ``scale=False`` keeps the firing rates in spikes/s, the plain
# RSA curve of the method page's comparisons; with ``scale=True`` (the default of both
# functions) each unit is standardised first, as MLEM's distances are here.
t0 = time.process_time()
res_rsa = rsa_array(data, features, times=centres, scale=False, n_null=99,
                    random_state=0, verbose="WARNING")
rsa_time = time.process_time() - t0
rsa = {name: res_rsa.rho[:, k] for k, name in enumerate(res_rsa.feature_names)}
res_rsa.plot(show=False)

# %%
# MLEM on the same arrays
# -----------------------
# Two folds repeated 50 times (``n_repeats``): with 84 stimuli a single 5-fold split
# leaves 136 held-out pairs per fold, and its noise would dominate the importance curves.
# Halves hold out 861 pairs each, and the repetitions average out which stimuli happen to
# be held out together (see the method page, "Noise in importance", for the settings
# compared on these data).
t0 = time.process_time()
res = mlem_neuro.mlem_array(data, features, times=centres, cv=2, n_repeats=50,
                            random_state=0, verbose="WARNING")
mlem_time = time.process_time() - t0
print(f"RSA (99 nulls): {rsa_time:.2f} s CPU; MLEM (no null): {mlem_time:.1f} s CPU "
      f"({mlem_time / rsa_time:.0f}× the RSA)")

# %%
# The curves, each in units of its own baseline noise (its standard deviation before
# onset), so that their signal-to-noise ratios can be compared directly.
baseline = centres < 0
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharex=True)
snr = {}
for ax, name in zip(axes, features.columns):
    imp = res.importance[:, res.terms.index(name)]
    for label, curve in (("RSA (Spearman with the model RDM)", rsa[name]),
                         ("MLEM importance", imp)):
        z = curve / curve[baseline].std(ddof=1)
        snr[(name, label.split()[0])] = z[~baseline].max()
        ax.plot(centres, z, label=label)
    ax.axvline(0, color="k", lw=0.5)
    ax.set(title=name, xlabel="time (s)")
axes[0].set_ylabel("value / baseline sd")
axes[0].legend(fontsize=8)
fig.tight_layout()

pd.Series(snr, name="peak SNR").unstack().round(1)

# %%
# The RSA result carries its tests as MLEM's does: here the time points where each
# feature's correlation is significant at 0.05, corrected over the time points (maximum
# statistic) and over both features (``corrected="all"``).  An MLEM analysis run with
# ``n_null`` answers ``res.significant(name, corrected="all")`` with the same meaning
# (its statistic is then the held-out importance).
pd.DataFrame({name: res_rsa.significant(name, corrected="all") for name in res_rsa.tests},
             index=pd.Index(np.round(centres, 3), name="time (s)")).iloc[::4]

# %%
# Both find object identity from about 150 ms after onset.
# Object stands out more in MLEM's curve than in RSA's (the repeated folds average its
# noise away); position less: MLEM's importance is what a feature adds to the others on
# held-out stimuli, and once object identity is known, position changes the ranking of
# held-out distances less; the RSA curve of one feature has no such competition (and no
# held-out data).
#
# What MLEM adds
# --------------
# *A learnt metric.*  At the time of the best held-out fit, ``W`` weighs the features
# against each other (its diagonal: object counts more than position).  Its off-diagonal
# term is not evidence of an interaction here: with 0/1 feature distances, adding
# ``λ w wᵀ`` to a diagonal ``W`` ranks every pair alike, so the fit can move weight between
# main effects and the interaction freely (method page, "Identifiability"); the test below
# is the way to ask about interactions.
peak = int(np.argmax(res.score))
W = pd.DataFrame(res.weights[peak], index=res.feature_names, columns=res.feature_names)
print(f"t = {centres[peak]:.3f} s, held-out Spearman ρ = {res.score[peak]:.3f}")
W.round(3)

# %%
# *A held-out fit.*  The RSA correlations are computed on all pairs, with nothing fitted;
# MLEM's score is the Spearman correlation of its predicted distances with the neural
# ones on pairs of stimuli it was not trained on, for both features at once:
pd.DataFrame({"RSA object": rsa["object"], "RSA position": rsa["position"],
              "MLEM held-out ρ": res.score}, index=np.round(centres, 3)).iloc[::4].round(3)

# %%
# *Interactions.*  Whether the two features interact in the geometry (a distance that is
# not the sum of their separate effects) is a question RSA with one model RDM per
# feature cannot ask.  MLEM answers it with a permutation test of non-additivity
# (``n_null``: see the tutorial on significance and the method page).
#
# What it costs
# -------------
# *Noise.*  Held-out pairs are fewer than all pairs, so MLEM's curves are noisier than
# RSA's unless the folds are repeated (``n_repeats``; a single 5-fold split with the same
# ``random_state`` gives object a peak SNR of 9.6 on these data, and position 1.6,
# against 61.9 and 17.3 above).
# *Time.*  Training a metric per fold and time point costs far more than a correlation,
# as printed above (100 folds here), though it still takes about a second.
