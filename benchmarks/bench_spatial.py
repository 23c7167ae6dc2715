"""Source-space searchlight over time (``mlem_stcs``): wall time and peak memory.

A volume source space without MRI (``mne.setup_volume_source_space`` with a sphere: grid
``--pos`` mm inside a sphere of ``--sphere`` mm), ``--n`` simulated source estimates of
``--times`` time points (Gaussian noise, plus a binary feature ``a`` encoded by a random
pattern in one patch during the middle two time points), 3 binary features with
interactions, ``--cv`` folds, the default training settings, one process, one torch
thread.  Every source is a patch centre (``--radius`` m), so there are ``sources x
times`` models, trained through ``run_cv`` in chunks of at most 1,000 models.

Peak memory is the process's peak resident set size (``ru_maxrss``: monotone, it includes
Python, torch and MNE); the data and the result sizes are printed beside it.

Run: ``.venv/bin/python benchmarks/bench_spatial.py`` (defaults: 1,189 sources x 10 time
points = 11,890 models, 48 stimuli, 5 folds).
"""
import argparse
import time

import mne
import numpy as np
import pandas as pd
import torch
from _common import peak_rss_mib

import mlem_neuro


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pos", type=float, default=10.0, help="grid spacing (mm)")
    p.add_argument("--sphere", type=float, default=70.0, help="sphere radius (mm)")
    p.add_argument("--radius", type=float, default=0.015, help="patch radius (m)")
    p.add_argument("--n", type=int, default=48, help="stimuli")
    p.add_argument("--times", type=int, default=10, help="time points")
    p.add_argument("--cv", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    src = mne.setup_volume_source_space(pos=args.pos, sphere=(0, 0, 0, args.sphere / 1000),
                                        verbose=False)
    v = src[0]["vertno"]
    rr = src[0]["rr"][v]
    rng = np.random.default_rng(0)
    table = pd.DataFrame({f: rng.permutation(np.arange(args.n) % 2).astype(bool)
                          for f in "abc"})
    data = rng.standard_normal((args.n, len(v), args.times))
    patch = np.linalg.norm(rr - rr[len(v) // 3], axis=1) <= args.radius
    mid = [args.times // 2 - 1, args.times // 2]
    data[:, np.flatnonzero(patch)[:, None], mid] += (1.5 * table["a"].to_numpy()[:, None, None]
                                                     * rng.standard_normal(patch.sum())[
                                                         None, :, None])
    stcs = [mne.VolSourceEstimate(x, [v], tmin=0.0, tstep=0.01) for x in data]
    print(f"{len(v)} sources x {args.times} time points = {len(v) * args.times} models, "
          f"{args.n} stimuli, {args.cv} folds, radius {args.radius * 1000:g} mm; data "
          f"{data.nbytes / 2**20:.1f} MiB; peak RSS before the analysis "
          f"{peak_rss_mib():.0f} MiB")
    t0 = time.perf_counter()
    res = mlem_neuro.mlem_stcs(stcs, table, src, spatial_radius=args.radius, cv=args.cv,
                               random_state=0)
    wall = time.perf_counter() - t0
    loc, t = res.peak("a")
    print(f"wall {wall:.1f} s ({1000 * wall / (len(v) * args.times * args.cv):.2f} ms per "
          f"model and fold); peak RSS {peak_rss_mib():.0f} MiB; median patch "
          f"{res.settings['median_patch_size']:g} sources; result W "
          f"{res.fold_weights.nbytes / 2**20:.1f} MiB")
    print(f"peak of 'a': {np.linalg.norm(rr[loc] - rr[len(v) // 3]) * 1000:.1f} mm from the "
          f"planted patch's centre, t = {t:.2f} s (planted at "
          f"{[round(k * 0.01, 2) for k in mid]})")


if __name__ == "__main__":
    main()
