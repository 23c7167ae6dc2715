"""Spread of the numeric grid's error, for the bounds of
``tests/test_numeric.py::test_grid_error_is_small_and_held_out_scores_use_exact_distances``.

For each seed (100 stimuli, 3 numeric features, noise 1, the first 80 stimuli trained):
the grid fit against the exact fit (``numeric_levels=None``), the exact fit against itself
with the stimuli listed in another order (the float-order spread), and the exact fit
against ``W_true`` (the estimation error); held-out rho differences on the last 20.

Usage: ``python validation/grid_spread.py [first_seed] [last_seed]`` (default 0 30).
"""
import sys

import numpy as np
import torch

from mlem_neuro import MLEM
from mlem_neuro.simulation import simulate_representations


def main(first=0, last=30):
    torch.set_num_threads(1)
    rows = []
    for seed in range(first, last):
        X, y, W = simulate_representations(100, 3, noise=1.0, kind="realisable",
                                           feature_type="numeric", random_state=seed)
        tr, te = np.arange(80), np.arange(80, 100)
        Xtr, Xte = X[np.ix_(tr, tr)], X[np.ix_(te, te)]
        g = MLEM(distance="precomputed", random_state=seed).fit(Xtr, y.iloc[tr])
        e = MLEM(distance="precomputed", numeric_levels=None,
                 random_state=seed).fit(Xtr, y.iloc[tr])
        p = np.random.default_rng(seed).permutation(80)
        o = MLEM(distance="precomputed", numeric_levels=None,
                 random_state=seed).fit(Xtr[np.ix_(p, p)], y.iloc[tr].iloc[p])
        score = e.score(Xte, y.iloc[te])
        rows.append((np.linalg.norm(g.W_ - e.W_), np.linalg.norm(o.W_ - e.W_),
                     np.linalg.norm(e.W_ - W), abs(g.score(Xte, y.iloc[te]) - score),
                     abs(o.score(Xte, y.iloc[te]) - score)))
        print("seed %2d  grid-exact %.4f  order %.4f  exact-true %.4f  "
              "d_rho grid %.5f order %.5f" % ((seed,) + rows[-1]), flush=True)
    r = np.array(rows)
    print("grid-exact mean %.4f sd %.4f max %.4f | float-order max %.4f | exact-true mean "
          "%.4f | d_rho grid max %.5f order max %.5f" % (
              r[:, 0].mean(), r[:, 0].std(ddof=1), r[:, 0].max(), r[:, 1].max(),
              r[:, 2].mean(), r[:, 3].max(), r[:, 4].max()))


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
