"""
Recovering a known metric
=========================

Can MLEM find the metric that generated the data? To ask this we need data whose true
metric ``W_true`` is the best one possible. ``simulate_representations(kind="realisable")``
generates the neural distance of every pair of stimuli directly as
``sqrt(dᵀ W_true d)`` plus Gaussian noise, and serves it as a dissimilarity matrix
(``MLEM(distance="precomputed")``). We compare MLEM (``constraint="spd"``), FR-RSA-I
(``"none"``: symmetric ``W``, no positivity) and FR-RSA (``"diagonal"``: one weight per
feature) as the noise grows, then look at why the MLEM paper's own simulation cannot answer
this question.
"""
# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

from mlem_neuro import MLEM
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.simulation import simulate_representations

MODELS = {"MLEM": "spd", "FR-RSA-I": "none", "FR-RSA": "diagonal"}
N, M = 64, 6                                  # stimuli, numeric features


def split(y, rng):
    """Hold out a fifth of the stimuli, never a feature's minimum or maximum: the
    training stimuli then fix the features' min-max scaling to that of W_true."""
    extremes = np.r_[y.to_numpy().argmin(0), y.to_numpy().argmax(0)]
    test = rng.choice(np.setdiff1d(np.arange(len(y)), extremes), len(y) // 5,
                      replace=False)
    return np.setdiff1d(np.arange(len(y)), test), np.sort(test)


X, y, W_true = simulate_representations(N, M, noise=0.5, kind="realisable",
                                        feature_type="numeric", random_state=0)
train, test = split(y, np.random.default_rng(0))
X_train, X_test = X[np.ix_(train, train)], X[np.ix_(test, test)]

# %%
# Fit the three models on the training stimuli and compare their metrics with the truth.
models = {label: MLEM(constraint=c, distance="precomputed", random_state=0).fit(
    X_train, y.iloc[train]) for label, c in MODELS.items()}

fig, axes = plt.subplots(1, 4, figsize=(12, 3.2))
lim = np.abs(W_true).max()
for ax, (title, W) in zip(axes, [("ground truth", W_true)]
                          + [(label, est.W_) for label, est in models.items()]):
    ax.imshow(W, cmap="RdBu_r", vmin=-lim, vmax=lim)
    err = "" if W is W_true else f"\n|W - W_true| = {np.linalg.norm(W - W_true):.2f}"
    ax.set(title=title + err, xticks=[], yticks=[])
fig.tight_layout()

# %%
# Recovery across noise levels
# ----------------------------
# Ten datasets per noise level (``noise`` is the noise standard deviation relative to that
# of the true distances), each split once.  For every model: the Frobenius distance of
# ``W_`` to ``W_true`` and the Spearman correlation on pairs of held-out stimuli.  The
# held-out Spearman of ``W_true`` itself is the ceiling of that score.  A diagonal ``W``
# cannot represent the off-diagonal part of ``W_true``: its error has a floor, the norm of
# that part (dotted line).
rows = []
for noise in (0.0, 0.5, 1.0, 2.0):
    for seed in range(10):
        X, y, W_true = simulate_representations(N, M, noise=noise, kind="realisable",
                                                feature_type="numeric", random_state=seed)
        train, test = split(y, np.random.default_rng(seed))
        X_train, X_test = X[np.ix_(train, train)], X[np.ix_(test, test)]
        for label, c in MODELS.items():
            est = MLEM(constraint=c, distance="precomputed", random_state=seed)
            est.fit(X_train, y.iloc[train])
            rows.append(dict(noise=noise, seed=seed, model=label,
                             error=np.linalg.norm(est.W_ - W_true),
                             held_out=est.score(X_test, y.iloc[test]), steps=est.n_iter_))
        i, j = pair_indices(len(test))
        d = est.feature_space_.transform(y.iloc[test]).pair_distances(i, j)
        truth = np.sqrt(np.einsum("pa,ab,pb->p", d, W_true, d))
        rows.append(dict(noise=noise, seed=seed, model="W_true", error=0.0,
                         held_out=spearmanr(truth, X_test[i, j])[0], steps=0,
                         floor=np.linalg.norm(W_true - np.diag(np.diag(W_true)))))
table = pd.DataFrame(rows)
summary = table.groupby(["model", "noise"], sort=False)[["error", "held_out", "steps"]].agg(
    ["mean", "std"])
summary.round(3)

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
for label, sub in summary.groupby(level="model", sort=False):
    noise = sub.index.get_level_values("noise")
    for ax, col in zip(axes, ("error", "held_out")):
        if label == "W_true" and col == "error":
            continue
        ax.errorbar(noise, sub[(col, "mean")], yerr=sub[(col, "std")], capsize=3,
                    fmt="k:" if label == "W_true" else "o-", label=label)
floor = table.groupby("noise")["floor"].mean()
axes[0].plot(floor.index, floor.to_numpy(), "k:", label="diagonal floor")
axes[0].set(xlabel="noise level", ylabel="|W - W_true| (Frobenius)",
            title="distance to the ground truth")
axes[1].set(xlabel="noise level", ylabel="Spearman ρ", title="held-out prediction")
axes[0].legend()
axes[1].legend(fontsize="small")
fig.tight_layout()

# %%
# What this shows, here (64 stimuli, 6 numeric features, a well-conditioned ``W_true``):
#
# * Without noise MLEM and FR-RSA-I recover ``W_true`` closely (Frobenius error about
#   0.03); their error grows with the noise, roughly in proportion to it.
# * Up to noise 1, MLEM and FR-RSA-I land at about the same distance from ``W_true``: on
#   this truth the unconstrained estimate mostly comes out positive definite anyway (in
#   every dataset up to noise 0.5, 8 of 10 at noise 1), so the SPD constraint has little
#   to correct.  At noise 2 the unconstrained estimate turns indefinite in 7 of the 10
#   datasets and MLEM is closer (about 0.51 vs 0.57, in all 10).  So the paper's claim
#   that MLEM is closer to ``W_true`` than FR-RSA-I holds at high noise only, and its
#   claim that MLEM converges in fewer steps does not reproduce (at noise 2 it takes
#   more).
# * FR-RSA stays near its floor at every noise level; at noise 2 its few parameters make
#   it the closest to ``W_true``.
# * All three predict held-out pairs about as well as ``W_true`` does (the paper's
#   "similar test Spearman" reproduces): the ranks of held-out pairs hardly tell the models
#   apart; the distance to ``W_true`` does.
#
# The method page (:doc:`/method`, "Recovery of a known metric") has the same comparison
# at 128 stimuli and 8 features, numeric and binary, and ``mlem-neuro demo`` runs it at
# 96 stimuli.
#
# The paper's simulation
# ----------------------
# The MLEM paper instead embeds the distances ``sqrt(dᵀ W_true d)`` of binary features
# in a Euclidean space with classical MDS (``kind="paper"``, the default).  Those
# distances are not Euclidean, so even without noise the embedded representations only
# approximate them:
rho = []
for seed in range(5):
    Xp, yp, Wp = simulate_representations(N, M, 128, noise=0.0, random_state=seed)
    B = (yp.to_numpy() == "B").astype(float)
    i, j = pair_indices(N)
    D = (B[i] != B[j]).astype(float)
    rho.append(spearmanr(np.sqrt(np.einsum("pa,ab,pb->p", D, Wp, D)), pdist(Xp))[0])
print(f"noiseless paper simulation: Spearman(embedded, target) = {np.mean(rho):.2f} "
      f"(range {min(rho):.2f}-{max(rho):.2f}, 5 seeds)")

# %%
# A model fitted there learns the embedding, not ``W_true`` (it can even predict held-out
# pairs better than ``W_true`` does), so the distance to ``W_true`` measures the
# embedding as much as the method. Use ``kind="realisable"`` for recovery studies.
