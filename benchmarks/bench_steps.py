"""What the training steps buy an analysis: held-out scores and importances against fewer steps.

The optimiser sweep (``sweep_optimiser.py``) measures how well ``W`` is recovered on
noiseless data; this script measures what an *analysis* reports as the step budget shrinks.
Each run is :func:`mlem_neuro.mlem_array` (level="feature", cv=5, the same seed and folds)
with the default options except ``--settings`` (``patience:max_steps``; the default is
``50:1000``).  For every setting it prints the CPU time (one torch thread), the mean steps
per model, and how far its fold-mean held-out score and feature importances are from the
default run's: the correlation over time points, the largest absolute difference and,
per feature, the correlation of the importance time courses.

Data: the time-resolved design of ``bench_null.py`` (200 simulated trials x 64 channels x
100 time points, binary features A and B encoded in windows, C never) and, when
``../shared/data`` holds them, the IT units of ``bench_snr.py`` (84 pseudo-trials x 64 units
x 31 time points, object and position).  Serially, in this process.

    OMP_NUM_THREADS=1 python benchmarks/bench_steps.py [--settings 50:1000 20:1000 50:40]
"""
import argparse
import time

import numpy as np
import torch

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs


def designs():
    data, table, times = simulate_epochs(n_trials=200, n_channels=64, n_times=100,
                                         sfreq=100.0, tmin=-0.2, random_state=0)
    yield "simulated, 200 trials x 64 channels x 100 time points", data, table, times
    import bench_snr

    it = bench_snr.it_units(4)
    if it is None:
        print("IT units: data not found, skipped")
    else:
        yield "IT units, 84 pseudo-trials x 64 units x 31 time points", *it


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+",
                        default=["50:1000", "20:1000", "10:1000", "50:80", "50:40", "50:20"],
                        help="patience:max_steps of each run (the first is the reference)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    settings = [tuple(int(v) for v in s.split(":")) for s in args.settings]
    for name, data, table, times in designs():
        print(f"\n{name}, features {list(table.columns)}, level='feature', cv=5")
        ref = None
        for patience, max_steps in settings:
            t0 = time.process_time()
            res = mlem_neuro.mlem_array(data, table, times=times, cv=5, patience=patience,
                                        max_steps=max_steps, random_state=0,
                                        verbose="WARNING")
            took = time.process_time() - t0
            score = res.score
            imp = {f: res.importance[:, res.terms.index(f)] for f in table.columns}
            line = (f"  patience {patience:3d}, max_steps {max_steps:4d}: {took:5.2f} s CPU, "
                    f"{res.n_iter.mean():5.0f} steps per model")
            if ref is None:
                ref = score, imp
                print(line + "  (reference)")
                continue
            r = np.corrcoef(ref[0], score)[0, 1]
            line += (f"; score r {r:.4f}, max |diff| {np.abs(ref[0] - score).max():.4f}; "
                     "importance r " + ", ".join(
                         f"{f} {np.corrcoef(ref[1][f], imp[f])[0, 1]:.3f}" for f in imp))
            print(line)


if __name__ == "__main__":
    main()
