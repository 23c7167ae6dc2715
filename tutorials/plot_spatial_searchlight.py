"""
Where and when: sensor and source-space searchlights
====================================================

:func:`mlem_neuro.mlem_epochs` fits one model per time point over all channels: it says
*when* a feature shapes the neural geometry.  A spatial searchlight also says *where*:
one model per time point and neighbourhood, a group of nearby channels (``spatial_radius``
in :func:`~mlem_neuro.mlem_epochs`) or a patch of source points
(:func:`mlem_neuro.mlem_stcs`).  This tutorial plants a known effect in simulated data,
in a few occipital EEG channels and in one patch of a source space, and finds it with
both searchlights.

Nothing needs an MRI: the sensors sit on MNE's built-in ``biosemi64`` montage and the
source space is a grid inside a sphere (:func:`mne.setup_volume_source_space`).
"""
# %%
import matplotlib.pyplot as plt
import mne
import numpy as np
import pandas as pd

import mlem_neuro

rng = np.random.default_rng(0)

# %%
# A sensor searchlight
# --------------------
# 40 trials of 64 EEG channels, 8 time points at 100 Hz.  Feature ``a`` (binary) adds a
# fixed pattern to O1, Oz and O2 at 0 and 10 ms; feature ``b`` is never encoded (a
# control).  The features live in ``epochs.metadata``.
montage = mne.channels.make_standard_montage("biosemi64")
info = mne.create_info(montage.ch_names, 100.0, "eeg")
info.set_montage(montage)
n = 40
features = pd.DataFrame({"a": rng.permutation(np.arange(n) % 2).astype(bool),
                         "b": rng.permutation(np.arange(n) // 2 % 2).astype(bool)})
data = rng.standard_normal((n, 64, 8))
occipital = [info["ch_names"].index(c) for c in ("O1", "Oz", "O2")]
pattern = rng.standard_normal(3)
data[:, np.array(occipital)[:, None], [3, 4]] += (1.5 * features["a"].to_numpy()[:, None,
                                                                                 None]
                                                  * pattern[None, :, None])
epochs = mne.EpochsArray(data * 1e-6, info, tmin=-0.03, metadata=features, verbose=False)

# %%
# ``spatial_radius=0.045`` (metres) gives each channel a neighbourhood of the channels
# within 4.5 cm (itself included: 2 to 7 channels on this montage, 5 for Oz and for
# about half of them), from MNE's channel positions.  The result holds one model per
# (time point, channel).
res = mlem_neuro.mlem_epochs(epochs, ["a", "b"], spatial_radius=0.045, cv=3,
                             random_state=0)
print(res)
channel, time = res.peak("a")
print(f"importance of 'a' peaks at {res.ch_names[channel]}, t = {time * 1000:.0f} ms")

# %%
# :meth:`~mlem_neuro.results.SensorMapResult.plot_topomap` draws MNE topographies of a
# feature's importance (drop of held-out Spearman ρ) at chosen times: the effect appears
# over the occipital channels at 0 and 10 ms only.
res.plot_topomap("a", times=[-0.01, 0.0, 0.01, 0.02])

# %%
# :meth:`~mlem_neuro.results.SensorMapResult.to_evoked` gives the same values as an
# :class:`mne.Evoked`, so any MNE sensor plot applies; here the control feature ``b``.
res.to_evoked("b").plot_topomap(times=[0.0, 0.01], scalings=1.0, units="Δρ",
                                cbar_fmt="%0.2f")

# %%
# A source-space searchlight
# --------------------------
# A volume source space on a 10 mm grid inside a sphere of 45 mm (no MRI), and one
# :class:`mne.VolSourceEstimate` per stimulus (in a real study: the output of
# :func:`mne.minimum_norm.apply_inverse_epochs`, one per trial, or one per condition).
# Feature ``a`` is encoded in the sources within 15 mm of a point on the right, from 20
# to 30 ms.
src = mne.setup_volume_source_space(pos=10.0, sphere=(0, 0, 0, 0.045), verbose=False)
vertices = src[0]["vertno"]
positions = src[0]["rr"][vertices]
centre = int(np.argmin(np.linalg.norm(positions - [0.03, 0.0, 0.0], axis=1)))
distance = np.linalg.norm(positions - positions[centre], axis=1)
patch = np.flatnonzero(distance <= 0.015)
sources = rng.standard_normal((n, len(vertices), 6))
sources[:, patch[:, None], [2, 3]] += (1.5 * features["a"].to_numpy()[:, None, None]
                                       * rng.standard_normal(len(patch))[None, :, None])
stcs = [mne.VolSourceEstimate(x, [vertices], tmin=0.0, tstep=0.01) for x in sources]
print(f"{len(vertices)} sources, {len(patch)} in the planted patch")

# %%
# Every source is the centre of a patch of ``spatial_radius`` metres (straight-line
# distance between the grid points of a volume source space; geodesic distance along the
# cortex for a surface one, from MNE's ``src[h]["dist"]``).  With ``labels=`` instead,
# there is one model per :class:`mne.Label`.
res = mlem_neuro.mlem_stcs(stcs, features, src, spatial_radius=0.015, cv=3,
                           random_state=0)
print(res)
stc = res.importance_stc("a")
print(stc)

# %%
# ``stc`` is an ordinary source estimate: with an MRI, ``stc.plot(src=src,
# subjects_dir=...)`` shows it in the brain.  Without one, we draw the importance at the
# sources of the patch and far from it over time, and the map at the peak time in the
# horizontal slice of the grid through the patch's centre.
source, time = res.peak("a")
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
for label, mask in (("planted patch", distance <= 0.015), ("> 35 mm away", distance > 0.035)):
    ax1.plot(stc.times * 1000, stc.data[mask].mean(axis=0), label=label)
ax1.plot(stc.times * 1000, res.importance_stc("b").data.mean(axis=0), label="b (control)")
ax1.set(xlabel="time (ms)", ylabel="importance (Δ Spearman ρ)")
ax1.legend()
k = int(np.argmin(np.abs(stc.times - time)))
level = np.abs(positions[:, 2] - positions[centre, 2]) < 1e-3
dots = ax2.scatter(positions[level, 0] * 1000, positions[level, 1] * 1000,
                   c=stc.data[level, k], cmap="RdBu_r", vmin=-0.3, vmax=0.3, s=60)
ax2.plot(*positions[centre, :2] * 1000, "k+", markersize=12)
ax2.set(xlabel="x (mm)", ylabel="y (mm)", aspect="equal",
        title=f"importance of 'a', {time * 1000:.0f} ms, z = "
              f"{positions[centre, 2] * 1000:.0f} mm")
fig.colorbar(dots, ax=ax2)
fig.tight_layout()

# %%
# Cost
# ----
# There is one model per time point and patch: here 6 × the number of sources, trained
# in batched stacks of at most 1,000 models, so the cost grows linearly with both.  Keep
# the time points that matter (``tmin``, ``tmax``, ``decim`` or ``window``) and a coarse
# source space.  The measured costs are on the :doc:`spatial searchlight page
# <../spatial>`.
