"""What the staged test's gate adds to a feature's false positives, and what a stricter
gate would cost: read from runs already saved.

The default feature test reads a feature's main effect alone, and joins its held-out
importance in the models where the test of interactions is family-wise significant (the
gate, ``STAGED_GATE``).  On null data the gate opens when the test of interactions is a
false positive, and the importance, which sees the same chance interaction, then often
rejects too.  This script splits a feature's family-wise rate on null data into the two
branches, and reads the rates that a stricter gate would give, on:

* a ``calib_defaults.py`` run at the defaults (``--calib``: its ``.npz``, e.g.
  ``smooth.npz``; ``--first-seed``: the seed of its first dataset): the family-wise
  p-values of every test per dataset and time point;
* the main effect alone on the same datasets, 999 relabellings (what the default reads
  where the gate is shut; computed here, no training, about a minute for 300 datasets);
* a ``feature_statistic.py`` run on an XOR code (``--xor``: its ``--out`` folder, e.g.
  ``--no-additive --designs xor --amplitudes 0.2``): each dataset's p-values of the
  default, its combined statistic, its main effect and the test of interactions (one
  model), so that the gate at any level is read from them.

A stricter gate is emulated on the null runs per dataset: where the test of interactions'
smallest family-wise p-value is above the gate the dataset reads the main effect alone,
elsewhere the default's decision (exact for the gate's openings; the main effect is on
relabellings of its own, so a dataset near p = 0.05 may differ by the draw).  The rate
over the tests (Holm's step-down over the score, the features and the interactions, as
``corrected="all"``) is read from the default's p-values.

    python validation/gate_frontier.py --calib RUNS/smooth.npz --first-seed 5000 \\
        --xor FS_XOR_DIR
"""
import argparse
import glob
import os

import calib_defaults as cd
import numpy as np
import pandas as pd
from _common import wilson

from mlem_neuro.core.scoring.familywise import familywise_over_tests

GATES = (0.05, 0.04, 0.03, 0.02, 0.01)


def rate(k, n):
    return f"{k / n:.3f} ({cd.fmt(wilson(int(k), n))})"


def null_frontier(file, first_seed, design):
    """The branches of each feature's family-wise rate, and the rate at stricter gates."""
    run = np.load(file)
    tests, p_fwe = list(run["tests"]), run["p_fwe"]            # (datasets, times, tests)
    n = len(p_fwe)
    main = np.stack([cd.run_main_only(design, seed, 999)[2]
                     for seed in range(first_seed, first_seed + n)])
    features = [t for t in tests if t not in ("score", "interactions")]
    p_int = np.nanmin(p_fwe[:, :, tests.index("interactions")], axis=1)
    print(f"{os.path.basename(file)}: {n} null datasets (seeds {first_seed}-"
          f"{first_seed + n - 1}); the test of interactions family-wise "
          f"{rate((p_int < 0.05).sum(), n)}, the gate open (p <= 0.05) in "
          f"{int((p_int <= 0.05).sum())}")
    for j, name in enumerate(features):
        default = np.nanmin(p_fwe[:, :, tests.index(name)], axis=1) < 0.05
        alone = np.nanmin(main[:, :, j], axis=1) < 0.05
        gate = p_int <= 0.05
        print(f"  {name}: default {rate(default.sum(), n)}; main effect alone (999) "
              f"{rate(alone.sum(), n)}; rejected where the gate opened "
              f"{int((default & gate).sum())} of {int(gate.sum())} "
              f"(share {(default & gate).sum() / n:.3f})")
        print("     gate  " + "  ".join(f"{g:<22g}" for g in GATES))
        print("     rate  " + "  ".join(
            f"{rate(np.where(p_int <= g, default, alone).sum(), n):<22s}" for g in GATES))
    over = [(familywise_over_tests(p_fwe[i]) < 0.05).any() for i in range(n)]
    print(f"  over the tests (Holm's step-down over {', '.join(tests)}): "
          f"{rate(np.sum(over), n)}")


def xor_frontier(folder):
    """Each feature's rate of p < 0.05 on the XOR datasets with the gate at each level."""
    df = pd.concat([pd.read_csv(f) for f in sorted(glob.glob(os.path.join(folder,
                                                                          "*.csv")))])
    p_int = df[df.method == "interactions"].groupby("seed").p.first()
    table = df.pivot_table(index=["seed", "feature"], columns="method", values="p")
    print(f"{folder}: {len(p_int)} XOR datasets; the test of interactions "
          f"{(p_int < 0.05).mean():.2f}")
    for name in sorted(set(df.feature) - {"A x B"}):
        x = table.xs(name, level="feature")
        gate = p_int.reindex(x.index)
        cells = [((gate <= g) & (x["combined"] < 0.05)
                  | (gate > g) & (x["main"] < 0.05)).mean() for g in GATES]
        print(f"  {name}: default {(x['default'] < 0.05).mean():.2f}; at gates "
              + " / ".join(f"{g:g}" for g in GATES) + ": "
              + " / ".join(f"{c:.2f}" for c in cells))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calib", nargs="*", default=[],
                        help="calib_defaults.py .npz files at the defaults")
    parser.add_argument("--first-seed", type=int, nargs="*", default=[],
                        help="the first seed of each --calib file (default 0)")
    parser.add_argument("--xor", nargs="*", default=[],
                        help="feature_statistic.py --out folders of XOR datasets")
    args = parser.parse_args()
    seeds = args.first_seed + [0] * (len(args.calib) - len(args.first_seed))
    for file, seed in zip(args.calib, seeds):
        design = os.path.basename(file).split(".")[0]
        null_frontier(file, seed, design)
    for folder in args.xor:
        xor_frontier(folder)


if __name__ == "__main__":
    main()
