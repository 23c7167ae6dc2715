"""
MLEM on the paper's simulation
==============================

Simulated stimuli with 8 binary features and a known metric ``W_true``. We fit MLEM
(``constraint="spd"``) and FR-RSA-I (``constraint="none"``) and compare the learnt metrics to
the ground truth, then look at permutation importance on held-out stimuli.
"""
# %%
import matplotlib.pyplot as plt
import numpy as np

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
