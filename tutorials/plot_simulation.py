"""
MLEM on the paper's simulation
==============================

Simulated stimuli with 8 binary features and a known metric ``W_true``. We fit MLEM
(``constraint="spd"``) and FR-RSA-I (``constraint="none"``) and compare the learnt metrics to
the ground truth, look at permutation importance on held-out stimuli, then measure how
well each constraint (``"spd"``, ``"none"``, ``"diagonal"``) recovers ``W_true`` as the
noise grows.
"""
# %%
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from mlem_neuro import MLEM
from mlem_neuro.simulation import simulate_representations

X, y, W_true = simulate_representations(n_stimuli=128, n_features=8, n_units=256,
                                        noise=0.5, random_state=0)
train, test = np.arange(100), np.arange(100, 128)

# %%
# Fit both models on the training stimuli.
models = {c: MLEM(constraint=c, random_state=0).fit(X[train], y.iloc[train])
          for c in ("spd", "none")}

fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
for ax, (title, W) in zip(axes, [("ground truth", W_true), ("MLEM (spd)", models["spd"].W_),
                                 ("FR-RSA-I (none)", models["none"].W_)]):
    lim = np.abs(W).max()
    ax.imshow(W, cmap="RdBu_r", vmin=-lim, vmax=lim)
    err = "" if W is W_true else f"\n|W - W_true| = {np.linalg.norm(W - W_true):.2f}"
    ax.set(title=title + err, xticks=[], yticks=[])
fig.tight_layout()

# %%
# Permutation importance on held-out stimuli: features and interactions.
imp = models["spd"].permutation_importance(X[test], y.iloc[test], random_state=0)
imp.sort_values("importance", ascending=False).head(10)

# %%
# Recovery across noise levels
# ----------------------------
# The same simulation at four noise levels and three seeds each, fitted with the three
# constraints: ``"spd"`` (MLEM), ``"none"`` (FR-RSA-I: symmetric ``W``, no positivity) and
# ``"diagonal"`` (FR-RSA: one positive weight per feature, no interactions).  A diagonal
# ``W`` cannot represent the off-diagonal part of ``W_true``, so its error has a floor:
# the norm of that part (dotted line).
rows = []
for noise in (0.1, 0.5, 1.0, 2.0):
    for seed in range(3):
        X, y, W_true = simulate_representations(n_stimuli=128, n_features=8, n_units=256,
                                                noise=noise, random_state=seed)
        for constraint in ("spd", "none", "diagonal"):
            est = MLEM(constraint=constraint, random_state=seed).fit(X[train], y.iloc[train])
            rows.append(dict(noise=noise, seed=seed, constraint=constraint,
                             error=np.linalg.norm(est.W_ - W_true),
                             held_out=est.score(X[test], y.iloc[test]),
                             floor=np.linalg.norm(W_true - np.diag(np.diag(W_true)))))
table = pd.DataFrame(rows)
summary = table.groupby(["constraint", "noise"])[["error", "held_out"]].agg(["mean", "std"])
summary.round(3)

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
for constraint, sub in summary.groupby(level="constraint", sort=False):
    noise = sub.index.get_level_values("noise")
    for ax, col in zip(axes, ("error", "held_out")):
        ax.errorbar(noise, sub[(col, "mean")], yerr=sub[(col, "std")], fmt="o-", capsize=3,
                    label=constraint)
axes[0].plot(*table.groupby("noise")["floor"].mean().reset_index().to_numpy().T, "k:",
             label="diagonal floor")
axes[0].set(xlabel="noise level", ylabel="|W - W_true| (Frobenius)",
            title="distance to the ground truth")
axes[1].set(xlabel="noise level", ylabel="Spearman ρ", title="held-out prediction")
axes[0].legend()
fig.tight_layout()

# %%
# Only the diagonal model is clearly set apart: it stays above its floor (the off-diagonal
# part of ``W_true`` it cannot represent) whatever the noise, and at low noise it predicts
# held-out distances a little worse, since the interactions carry part of the order of the
# pairs.  MLEM and the unconstrained ``W`` land at similar distances from ``W_true``, within
# their spread over seeds, and predict equally well (ρ only sees the order of the
# predictions); the SPD constraint makes the estimate steadier from one dataset to the next
# (smaller standard deviation over seeds at every noise level here).  ``mlem-neuro demo``
# repeats the MLEM vs FR-RSA-I comparison over more seeds.
