"""
Interactions: when two features combine non-additively
=======================================================

MLEM predicts the distance between two stimuli as ``sqrt(dᵀ W d)``, where ``d`` holds their
per-feature distances.  A diagonal ``W`` adds the features' contributions; an off-diagonal
``W_kl`` says that pairs differing on *both* ``k`` and ``l`` are farther apart
(``W_kl > 0``) or closer (``W_kl < 0``) than the sum predicts.  Permutation importance scores
each such interaction as a term of its own (``"k:l"``).

Note what an interaction is here: a property of *distances*, not of response amplitudes.
A "conjunction" in the responses (say, a unit firing only for plural *and* animate nouns)
does not by itself make pairs that differ on both features systematically farther apart.

We simulate stimuli varying in horizontal ``position`` and ``size`` (graded) and in
``category`` (two levels), with a neural geometry in which position and size interact.
"""
# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mlem_neuro import MLEM
from mlem_neuro.core.stimuli.pairs import pair_indices

rng = np.random.default_rng(0)
n = 120
stimuli = pd.DataFrame({"position": rng.uniform(0, 1, n), "size": rng.uniform(0, 1, n),
                        "category": rng.choice(["face", "house"], n)})

# %%
# Ground-truth metric: position and size interact (W[0, 1] > 0), category does not.
W_true = np.array([[1.0, 0.7, 0.0], [0.7, 1.0, 0.0], [0.0, 0.0, 0.8]])
W_true /= np.linalg.norm(W_true)
i, j = pair_indices(n)
d = np.column_stack([np.abs(stimuli["position"].to_numpy()[i] - stimuli["position"].to_numpy()[j]),
                     np.abs(stimuli["size"].to_numpy()[i] - stimuli["size"].to_numpy()[j]),
                     (stimuli["category"].to_numpy()[i] != stimuli["category"].to_numpy()[j])])
dist = np.zeros((n, n))
dist[i, j] = dist[j, i] = np.sqrt(np.einsum("pa,ab,pb->p", d, W_true, d))

# %%
# Neural dissimilarities with that geometry, measured with noise — as a dissimilarity
# matrix from another toolbox would come (``distance="precomputed"``).
#
# Why not simulate responses and take their Euclidean distances?  A positive interaction
# between ``|Δposition|`` and ``|Δsize|`` makes the metric partly city-block-like, which no
# Euclidean configuration of points reproduces exactly: embedding these distances with
# multidimensional scaling keeps their ranks (ρ ≈ 0.99) but flattens most of the
# interaction (the learnt ``W[0, 1]``, about 0.4 here, drops below 0.2).
noise = np.exp(0.1 * rng.standard_normal((n, n)))
X = dist * np.sqrt(noise * noise.T)          # symmetric multiplicative noise

# %%
# Fit on 90 stimuli, evaluate on the 30 others (their own dissimilarity sub-matrix).
train, test = np.arange(90), np.arange(90, n)
est = MLEM(distance="precomputed", random_state=0).fit(X[np.ix_(train, train)],
                                                       stimuli.iloc[train])
X_test = X[np.ix_(test, test)]
print(f"held-out Spearman: {est.score(X_test, stimuli.iloc[test]):.3f}")

fig, axes = plt.subplots(1, 2, figsize=(7, 3.2))
names = list(est.feature_names_in_)
for ax, (title, W) in zip(axes, [("ground truth", W_true), ("learnt W", est.W_)]):
    lim = np.abs(W).max()
    ax.imshow(W, cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set(xticks=range(3), xticklabels=names, yticks=range(3), yticklabels=names,
           title=title)
fig.tight_layout()

# %%
# Term-level permutation importance on held-out pairs (``level="term"``; the default is
# ``"feature"``): ``position:size`` carries weight, the interactions with ``category``
# little (under a fifth of it; their true weight is 0, and the learnt ``W`` gives them
# small positive entries).  Term importances are meaningful here because ``position`` and
# ``size`` are graded.
imp = est.permutation_importance(X_test, stimuli.iloc[test], level="term", random_state=0)
fig, ax = plt.subplots(figsize=(5, 3))
ax.barh(imp.index, imp["importance"], xerr=imp["importance_perm_std"],
        color=["C0" if k == "feature" else "C1" for k in imp["kind"]])
ax.invert_yaxis()
ax.set(xlabel="drop of Spearman ρ when permuted", title="term importance")
fig.tight_layout()
imp

# %%
# The total effect of each feature (its own term and its interactions together) comes
# from permuting the feature's values across stimuli, the default (``level="feature"``):
est.permutation_importance(X_test, stimuli.iloc[test], random_state=0)

# %%
# A caution on identifiability: Spearman only sees the *order* of predicted distances.
# When every feature distance takes two values (categorical features),
# ``W = diag(w) + λ w wᵀ`` orders every pair alike for all ``λ >= 0``, so term-level
# interaction importances are not identifiable there (``level="term"`` then warns);
# feature-level importance is.  Evidence for an interaction is a geometry that *no*
# additive metric explains: the permutation test of interactions (``n_null``) asks that
# for one subject, and :func:`mlem_neuro.stats.permutation_cluster_test` with
# ``measure="interactions"`` (or :func:`~mlem_neuro.stats.second_level_maps` with
# ``"interactions"``) across subjects, on each subject's held-out gain over an additive
# (``constraint="diagonal"``) analysis.
