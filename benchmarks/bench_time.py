"""Time-resolved MLEM: ``mlem_epochs`` vs one ``MLEM().fit`` per time point, in one run.

Simulated epochs (:func:`mlem_neuro.simulation.simulate_epochs`): 200 trials, 64 EEG
channels, 100 time points (100 Hz, -0.2 to 0.79 s), 5 two-level features A-E modelled with
all interactions (15 terms).  Feature A shapes the sensor patterns in 0.10-0.25 s only, B in
0.35-0.50 s only (Hann envelopes); C, D, E are never encoded.

Both paths do the same work: the same 5 folds of trials, the same training settings
(AdamW with the package's default ``lr``, ``patience`` and ``tol`` unless ``--lr``,
``--patience``, ``--tol`` say otherwise, at most 1000 steps, the paper's batch-size
selection), the same
scaled data, and 10 permutations per term on pairs of held-out trials.  The fast path is
one ``mlem_epochs`` call (every time point of a fold trained as one batched stack); the slow
path is what a user would write with the estimator, as ``SlidingEstimator`` does: one
``MLEM().fit`` + ``permutation_importance`` per time point and fold.

The slow path is slow, so by default it runs on a subset of time points (``--slow-times``,
evenly spaced, all 5 folds) and its time for all 100 points is *extrapolated* linearly;
the output says so.  ``--slow-times 100`` times it in full.

``--device cuda`` trains both paths on the GPU (clocks read after
``torch.cuda.synchronize()``, after an untimed warm-up fit).

Run: ``.venv/bin/python benchmarks/bench_time.py [--slow-times 10] [--device cpu]``
"""
import argparse
import warnings

import numpy as np
from _common import add_device_argument, add_optimiser_arguments, clock, describe, warm_up
from _common import scale_channels as _scale_channels

import mlem_neuro
from mlem_neuro import MLEM
from mlem_neuro.core.stimuli.pairs import kfold_stimuli
from mlem_neuro.simulation import simulate_epochs

SFREQ = 100.0
WINDOWS = {"A": (0.10, 0.25), "B": (0.35, 0.50)}


def simulate(n=200, n_channels=64, n_times=100, n_features=5, amplitude=0.5, seed=0):
    """EpochsArray + feature table from :func:`mlem_neuro.simulation.simulate_epochs`."""
    import mne

    names = "ABCDEFGH"[:n_features]
    windows = {f: WINDOWS.get(f) for f in names}     # A, B encoded; the others never
    data, meta, times = simulate_epochs(n_trials=n, n_channels=n_channels, n_times=n_times,
                                        sfreq=SFREQ, tmin=-0.2, windows=windows,
                                        amplitude=amplitude, random_state=seed)
    info = mne.create_info([f"EEG{k:03d}" for k in range(n_channels)], SFREQ, "eeg")
    epochs = mne.EpochsArray(data * 1e-6, info, tmin=times[0], metadata=meta, verbose=False)
    return epochs, meta


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--times", type=int, default=100)
    p.add_argument("--features", type=int, default=5)
    p.add_argument("--slow-times", type=int, default=10,
                   help="time points timed on the slow path (extrapolated to all)")
    p.add_argument("--n-jobs", type=int, default=None)
    add_optimiser_arguments(p)
    add_device_argument(p)
    args = p.parse_args()
    dev = args.device
    warm_up(dev)

    epochs, meta = simulate(args.trials, args.channels, args.times, args.features)
    seed = 0
    folds = kfold_stimuli(args.trials, 5, np.random.default_rng(seed))
    kw = dict(constraint="spd", interactions=True, max_steps=1000, patience=args.patience,
              lr=args.lr, tol=args.tol, batch_size="auto")
    n_perm = 10
    print(f"{describe(dev)}; {args.trials} "
          f"trials, {args.channels} channels, {args.times} time points, {args.features} "
          f"features + interactions, 5 folds, {n_perm} permutations")

    # ---------------------------------------------------------------- fast path
    t0 = clock(dev)
    res = mlem_neuro.mlem_epochs(epochs, cv=folds, n_permutations=n_perm, n_jobs=args.n_jobs,
                                 device=dev, random_state=seed, **kw)
    t_fast = clock(dev) - t0

    # ---------------------------------------------------------------- slow path
    data = _scale_channels(epochs.get_data())           # what mlem_epochs analyses
    Y = data.transpose(2, 0, 1)
    k = min(args.slow_times, args.times)
    sub = np.unique(((np.arange(k) + 0.5) * args.times / k).astype(int))  # segment centres
    slow_imp = np.zeros((len(folds), len(sub), len(res.terms)))
    slow_iter = []
    t0 = clock(dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for f, (train, test) in enumerate(folds):
            for s, t in enumerate(sub):
                est = MLEM(random_state=seed, device=dev, **kw).fit(Y[t, train],
                                                                   meta.iloc[train])
                imp = est.permutation_importance(Y[t, test], meta.iloc[test],
                                                 n_permutations=n_perm, random_state=seed)
                slow_imp[f, s] = imp.loc[res.terms, "importance"].to_numpy()
                slow_iter.append(est.n_iter_)
    t_slow_sub = clock(dev) - t0
    t_slow = t_slow_sub * args.times / len(sub)
    slow_mean = slow_imp.mean(axis=0)

    # ---------------------------------------------------------------- report
    print(f"mlem_epochs (all {args.times} time points x 5 folds): {t_fast:8.1f} s  "
          f"(steps per model: median {int(np.median(res.n_iter))}, batch "
          f"{res.settings['batch_size_used']} pairs per fold)")
    exact = len(sub) == args.times
    label = "measured" if exact else (f"EXTRAPOLATED from {len(sub)} of {args.times} time "
                                      f"points ({t_slow_sub:.1f} s measured)")
    print(f"per-time-point MLEM().fit x {args.times} x 5 folds: {t_slow:8.1f} s  ({label}; "
          f"steps per model: median {int(np.median(slow_iter))})")
    print(f"speed-up: {t_slow / t_fast:.1f} x")

    fast_sub = res.importance[sub]
    r = np.corrcoef(fast_sub.ravel(), slow_mean.ravel())[0, 1]
    print(f"importance on the {len(sub)} shared time points: correlation fast vs slow "
          f"r = {r:.3f}, max |diff| = {np.abs(fast_sub - slow_mean).max():.3f}")
    times = res.times

    def mean(x):
        return f"{x.mean():.3f}" if x.size else "n/a"

    for f, (t0_, t1_) in WINDOWS.items():
        k_f = res.terms.index(f)
        inside = (times >= t0_ - 1e-9) & (times <= t1_ + 1e-9)
        peak = times[int(np.argmax(res.importance[:, k_f]))]
        sub_in = inside[sub]
        print(f"  {f}: window {t0_:.2f}-{t1_:.2f} s | fast, all points: peak at {peak:.2f} s, "
              f"mean inside {mean(res.importance[inside, k_f])}, outside "
              f"{mean(res.importance[~inside, k_f])} | on the {len(sub)} shared points "
              f"(inside: {np.round(times[sub][sub_in], 2).tolist()} s): fast inside "
              f"{mean(fast_sub[sub_in, k_f])} / outside {mean(fast_sub[~sub_in, k_f])}, "
              f"slow inside {mean(slow_mean[sub_in, k_f])} / outside "
              f"{mean(slow_mean[~sub_in, k_f])}")
    others = [res.terms.index(f) for f in "CDEFGH"[:max(0, args.features - 2)]]
    if others:
        print(f"  unencoded C-E: fast max |importance| "
              f"{np.abs(res.importance[:, others]).max():.3f}, slow "
              f"{np.abs(slow_mean[:, others]).max():.3f}")


if __name__ == "__main__":
    main()
