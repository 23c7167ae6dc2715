"""Calibration and power of the single-subject permutation tests (``n_null``).

Simulated time-resolved data (trials x channels x time points) where the truth is known:

* ``noise``: pure noise, two balanced binary features: every test's null is true.  Reports
  the KS test of the pooled p-values against uniform (per test) and the family-wise error
  rate (datasets with any FWE p < 0.05) per test.
* ``other-binary`` / ``other-levels`` / ``other-numeric``: feature ``B`` strongly encoded at
  every time point (binary, 4 levels, or numeric: a 1-D embedding of a uniform value), ``A``
  (binary) not encoded: the false-positive rates of ``A``'s conditional null, pointwise and
  FWE.  ``--unconditional`` also reports what a null that relabels all stimuli would give
  for ``A`` (the score's relabellings used for ``A``'s statistic), the reason for the
  conditional null.
* ``correlated``: two binary features correlated and unbalanced (``B`` true in 30 % of
  trials, ``A == B`` in 75 %): pure noise (every test, as ``noise``), then ``B`` strongly
  encoded at every time point and ``A`` not (``A``'s and the interactions' rates).
* ``levels-numeric``: a categorical feature ``C`` with 4 levels of unequal sizes and a
  numeric feature ``X`` correlated with it; ``X`` encoded (1-D embedding, linear or
  saturating), ``C`` not: ``C``'s rates (its strata are ``X``'s quantile bins) and the
  interactions'.
* ``items``: pure noise, ``items=`` with 1 to 4 trials per item (items analysed by their
  averages), two balanced binary features per item; trial counts drawn independently of
  the features, then (``tied``) 2 trials per item where ``A`` is true and 4 where it is
  false, with the Euclidean distance and with ``distance="cv_euclidean"``.
* ``searchlight``: :func:`mlem_neuro.mlem_searchlight` on simulated images (36 images of
  6 x 6 x 6 voxels of 3 mm, every voxel a 6 mm sphere centre: 216 spheres, two balanced
  binary features): pure noise (every test, family-wise over the spheres), then (with
  ``--amplitude``-scaled ``--sl-amplitude``) ``A`` adding a fixed random pattern inside
  the 6 mm sphere at the grid's centre: the fraction of datasets where ``A`` is
  FWE-significant at a centre within 6 mm of the encoded one, at a centre more than
  12 mm from it (its sphere does not reach the encoded voxels), and ``B`` anywhere.
* ``power``: :func:`mlem_neuro.simulation.simulate_epochs` with ``A`` encoded in 0.1-0.3 s
  and ``B`` a control: the fraction of datasets where ``A``'s corrected p < 0.05 at some
  time inside the window, and where any time at least 0.1 s from it, or ``B`` anywhere, is
  corrected-significant.

Run (about 40 min on one busy core)::

    OMP_NUM_THREADS=1 python validation/calib_null.py --unconditional

The studies of correlated designs, items and the searchlight are run apart (``--only
correlated``, ``--only levels-numeric``, ``--only items``, ``--only searchlight``;
``--datasets`` sets their number of datasets, ``--power-datasets`` the searchlight's
encoded ones).
"""
import argparse
import time
from functools import partial

import numpy as np
import pandas as pd
import torch
from scipy import stats

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs

FIT = dict(cv=3, max_steps=100, patience=20, n_permutations=2, level="feature")


def other_encoded(kind, n=36, C=6, T=8, amplitude=1.0, seed=0):
    """Noise plus feature ``B`` (``kind``) encoded at every time; ``A`` binary, not encoded."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, C, T))
    A = rng.permutation(np.arange(n) % 2).astype(bool)
    if kind == "binary":
        codes = rng.permutation(np.arange(n) % 2)
    elif kind == "levels":
        codes = rng.permutation(np.arange(n) % 4)
    else:
        codes = None
    if codes is not None:
        patterns = rng.standard_normal((codes.max() + 1, C))
        data += amplitude * patterns[codes][:, :, None]
        B = pd.Categorical([f"L{c}" for c in codes])
    else:
        B = rng.uniform(0, 1, n)
        direction = rng.standard_normal(C)
        data += 3 * amplitude * (B[:, None] * direction[None])[:, :, None]
    return data, pd.DataFrame({"A": A, "B": B})


def noise(n=36, C=6, T=8, seed=0):
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"A": rng.permutation(np.arange(n) % 2).astype(bool),
                          "B": rng.permutation(np.arange(n) % 2).astype(bool)})
    return rng.standard_normal((n, C, T)), table


def correlated(n=36, C=6, T=8, encoded=False, amplitude=1.0, seed=0):
    """Binary ``B`` true in 30 % of trials, ``A == B`` in 75 % (both counts exact);
    noise, plus ``B`` at every time point when ``encoded``."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, C, T))
    B = rng.permutation(np.arange(n) < round(0.3 * n))
    A = B ^ rng.permutation(np.arange(n) < round(0.25 * n))
    if encoded:
        patterns = rng.standard_normal((2, C))
        data += amplitude * patterns[B.astype(int)][:, :, None]
    return data, pd.DataFrame({"A": A, "B": B})


LEVEL_SIZES = (16, 10, 6, 4)


def levels_numeric(n=36, C=6, T=8, amplitude=1.0, shape="linear", seed=0):
    """Categorical ``C`` (levels of :data:`LEVEL_SIZES` trials), numeric ``X`` = (level
    index + uniform(0, 1.5)) / 4.5 (correlated with ``C``), ``X`` encoded along one
    direction of the channels at every time point (``shape``: ``X`` itself, or
    ``"saturating"``: ``1 - exp(-4 X)``, which the model's ``|X_i - X_j|`` does not
    express), ``C`` not."""
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, C, T))
    codes = rng.permutation(np.repeat(np.arange(len(LEVEL_SIZES)), LEVEL_SIZES))
    X = (codes + rng.uniform(0, 1.5, n)) / (len(LEVEL_SIZES) + 0.5)
    direction = rng.standard_normal(C)
    code = X if shape == "linear" else 1 - np.exp(-4 * X)
    data += 3 * amplitude * (code[:, None] * direction[None])[:, :, None]
    return data, pd.DataFrame({"C": pd.Categorical([f"L{c}" for c in codes]), "X": X})


def items_noise(n=36, C=6, T=8, tied=False, seed=0):
    """Pure noise, ``n`` items of 1 to 4 trials (random, or 2 where ``A`` else 4 when
    ``tied``), balanced binary ``A`` and ``B`` per item; returns data, table with an
    ``item`` column, and the name of that column."""
    rng = np.random.default_rng(seed)
    A = rng.permutation(np.arange(n) % 2).astype(bool)
    B = rng.permutation(np.arange(n) % 2).astype(bool)
    counts = np.where(A, 2, 4) if tied else rng.integers(1, 5, n)
    item = np.repeat(np.arange(n), counts)
    table = pd.DataFrame({"item": item, "A": A[item], "B": B[item]})
    return rng.standard_normal((len(item), C, T)), table, "item"


SL_SHAPE, SL_VOXEL, SL_RADIUS = (6, 6, 6), 3.0, 6.0


def noise_images(n=36, amplitude=0.0, seed=0, shape=SL_SHAPE, feature="A"):
    """Noise images (``shape``, :data:`SL_VOXEL` mm voxels), balanced binary ``A`` and
    ``B``; with ``amplitude``, ``feature`` adds a fixed random pattern inside the
    :data:`SL_RADIUS` sphere at the grid's centre. Returns images, table, mask and the
    encoded centre (mm)."""
    import nibabel as nib

    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"A": rng.permutation(np.arange(n) % 2).astype(bool),
                          "B": rng.permutation(np.arange(n) % 2).astype(bool)})
    data = rng.standard_normal(tuple(shape) + (n,))
    centre = np.array(shape) // 2 * SL_VOXEL
    if amplitude:
        grid = np.indices(shape).reshape(3, -1).T * SL_VOXEL
        inside = (np.linalg.norm(grid - centre, axis=1) <= SL_RADIUS).reshape(shape)
        data[inside] += (amplitude * rng.standard_normal(shape)[inside][:, None]
                         * table[feature].to_numpy())
    affine = np.diag([SL_VOXEL] * 3 + [1.0])
    return (nib.Nifti1Image(data.astype(np.float32), affine), table,
            nib.Nifti1Image(np.ones(shape, np.int8), affine), centre)


def study_searchlight(n_datasets, n_null, amplitude=0.0):
    """Pure noise (``amplitude`` 0): every test's pooled p-values and FWE rate over the
    spheres; else ``A`` encoded at the centre: hits near it, false hits far from it."""
    pooled, fwe, hit, far, control = [], [], [], [], []
    for s in range(n_datasets):
        imgs, table, mask, centre = noise_images(amplitude=amplitude, seed=s)
        res = mlem_neuro.mlem_searchlight(imgs, table, mask, radius=SL_RADIUS, n_null=n_null,
                                          random_state=10**6 + s, verbose="WARNING", **FIT)
        sig = res.pvalues_fwe < 0.05
        pooled.append(res.pvalues)
        fwe.append(sig.any(axis=0))
        dist = np.linalg.norm(res.model_coords() - centre, axis=1)
        a, b = res.tests.index("A"), res.tests.index("B")
        hit.append(bool(sig[dist <= SL_RADIUS, a].any()))
        far.append(bool(sig[dist > 2 * SL_RADIUS, a].any()))
        control.append(bool(sig[:, b].any()))
    if amplitude:
        return dict(power=float(np.mean(hit)), far=float(np.mean(far)),
                    control_fwe=float(np.mean(control)), spheres=len(dist))
    pooled, fwe = np.concatenate(pooled), np.array(fwe)
    out = {}
    for k, name in enumerate(res.tests):
        tenths = np.histogram(pooled[:, k], bins=np.linspace(0, 1, 11) + 1e-9)[0]
        out[name] = dict(ks_p=stats.kstest(pooled[:, k], "uniform").pvalue,
                         ks_first=stats.kstest(pooled[::len(pooled) // n_datasets, k],
                                               "uniform").pvalue,
                         fpr=float((pooled[:, k] < 0.05).mean()),
                         fwe=float(fwe[:, k].mean()), tenths=tenths / len(pooled))
    return out


def run(data, table, n_null, seed, times=None, items=None, **kwargs):
    # the analysis's seed differs from the data's: folds and relabellings must not be
    # drawn from the bits that made the noise
    return mlem_neuro.mlem_array(data, table, times=times, n_null=n_null, items=items,
                                 random_state=10**6 + seed, **FIT, **kwargs)


def study_noise(n_datasets, n_null, make=noise, **kwargs):
    """Every test on pure-noise datasets from ``make(seed=s)`` (data, table[, items])."""
    pooled, fwe = [], []
    for s in range(n_datasets):
        data, table, *items = make(seed=s)
        res = run(data, table, n_null, s, items=items[0] if items else None, **kwargs)
        pooled.append(res.pvalues)
        fwe.append((res.pvalues_fwe < 0.05).any(axis=0))
    pooled, fwe = np.concatenate(pooled), np.array(fwe)
    out = {}
    for k, name in enumerate(res.tests):
        ks = stats.kstest(pooled[:, k], "uniform").pvalue
        # the time points of a dataset share its design, folds and relabellings, so the
        # pooled p-values are dependent: also the KS test of one time point per dataset
        ks_first = stats.kstest(pooled[::len(pooled) // n_datasets, k], "uniform").pvalue
        # p-values are multiples of 1 / (1 + n_null): tenths of (0, 1] count p <= 0.1 ...
        tenths = np.histogram(pooled[:, k], bins=np.linspace(0, 1, 11) + 1e-9)[0]
        out[name] = dict(ks_p=ks, ks_first=ks_first, fpr=float((pooled[:, k] < 0.05).mean()),
                         fwe=float(fwe[:, k].mean()), tenths=tenths / len(pooled))
    return out


def study_unencoded(n_datasets, n_null, make, tests):
    """Pointwise and FWE rates of ``tests`` (their nulls true) over datasets from
    ``make(seed=s)``, and the mean score."""
    fpr, fwe, score = [], [], []
    for s in range(n_datasets):
        res = run(*make(seed=s), n_null, s)
        cols = [res.tests.index(t) for t in tests]
        fpr.append(res.pvalues[:, cols] < 0.05)
        fwe.append((res.pvalues_fwe[:, cols] < 0.05).any(axis=0))
        score.append(res.score.mean())
    fpr, fwe = np.concatenate(fpr), np.array(fwe)
    return {t: dict(fpr=float(fpr[:, k].mean()), fwe=float(fwe[:, k].mean()))
            for k, t in enumerate(tests)}, float(np.mean(score))


def study_other(kind, n_datasets, n_null, unconditional=False):
    kinds = KINDS if kind is None else (kind,)
    return {k: _study_other(k, n_datasets, n_null, unconditional) for k in kinds}


KINDS = ("binary", "levels", "numeric")


def _study_other(kind, n_datasets, n_null, unconditional=False):
    fpr, fwe, naive_fwe, naive_fpr, score = [], [], [], [], []
    for s in range(n_datasets):
        data, table = other_encoded(kind, seed=s)
        res = run(data, table, n_null, s)
        a = res.tests.index("A")
        fpr.append(res.pvalues[:, a] < 0.05)
        fwe.append(bool((res.pvalues_fwe[:, a] < 0.05).any()))
        score.append(res.score.mean())
        if unconditional:
            naive_fpr.append(_naive_p(data, table, n_null, s) < 0.05)
            naive_fwe.append(bool(naive_fpr[-1].any()))
    out = dict(fpr=float(np.mean(fpr)), fwe=float(np.mean(fwe)), score=float(np.mean(score)))
    if unconditional:
        out.update(naive_fpr=float(np.mean(naive_fpr)), naive_fwe=float(np.mean(naive_fwe)))
    return out


def _naive_p(data, table, n_null, seed):
    """Pointwise p of A's importance against nulls that relabel every stimulus."""
    from mlem_neuro.core.scoring import nulls

    real = nulls.strata
    try:               # every feature's strata: all stimuli (the unconditional null)
        nulls.strata = lambda enc, kinds, feature, n_bins=nulls.NULL_BINS: np.zeros(
            enc.n_stimuli, dtype=np.int64)
        res = run(data, table, n_null, seed)
    finally:
        nulls.strata = real
    return res.pvalues[:, res.tests.index("A")]


def study_power(n_datasets, n_null, amplitude):
    hit, far, control = [], [], []
    for s in range(n_datasets):
        data, table, times = simulate_epochs(
            n_trials=40, n_channels=8, n_times=30, sfreq=50.0, tmin=-0.1,
            windows={"A": (0.1, 0.3), "B": None}, amplitude=amplitude, random_state=s)
        res = run(data, table, n_null, s, times=times)
        sig = res.pvalues_fwe < 0.05
        a, b = res.tests.index("A"), res.tests.index("B")
        inside = (times >= 0.1) & (times <= 0.3)
        away = (times < 0.0) | (times > 0.4)
        hit.append(bool(sig[inside, a].any()))
        far.append(bool(sig[away, a].any()))
        control.append(bool(sig[:, b].any()))
    return dict(power=float(np.mean(hit)), far=float(np.mean(far)),
                control_fwe=float(np.mean(control)))


def print_noise(results, title):
    if title:
        print(f"  {title}:")
    for name, r in results.items():
        print(f"  {name:6s} KS p {r['ks_p']:.3f}  pointwise FPR {r['fpr']:.3f}  "
              f"FWE {r['fwe']:.3f}")
        if r["ks_p"] < 0.01:
            print(f"         KS p of the first time point's p-values {r['ks_first']:.3f}; "
                  "pooled p per tenth of (0, 1]: "
                  + " ".join(f"{v:.3f}" for v in r["tenths"]))


def print_unencoded(results, title):
    print(f"  {title}:")
    for name, r in results.items():
        print(f"  {name:6s} pointwise FPR {r['fpr']:.3f}  FWE {r['fwe']:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", type=int, default=200)
    parser.add_argument("--n-null", type=int, default=99)
    parser.add_argument("--other-datasets", type=int, default=100)
    parser.add_argument("--power-datasets", type=int, default=50)
    parser.add_argument("--amplitude", type=float, default=1.0)
    parser.add_argument("--only", default=None,
                        choices=("noise", "other", "power", "correlated", "levels-numeric",
                                 "items", "searchlight"),
                        help="run one study (correlated, levels-numeric and items run only "
                             "when named)")
    parser.add_argument("--kind", default=None, choices=KINDS,
                        help="with --only other: one kind of encoded feature B")
    parser.add_argument("--unconditional", action="store_true")
    parser.add_argument("--sl-amplitude", type=float, default=0.8,
                        help="searchlight: amplitude of A's pattern in the encoded sphere")
    parser.add_argument("--lr", type=float, default=None,
                        help="the fits' lr (default: the package's)")
    args = parser.parse_args()
    if args.lr is not None:
        FIT["lr"] = args.lr
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    print(f"n_null={args.n_null}, fit {FIT}")
    if args.only in (None, "noise"):
        print(f"noise, {args.datasets} datasets of 36 trials x 6 channels x 8 times:")
        print_noise(study_noise(args.datasets, args.n_null), "")
    if args.only in (None, "other"):
        for kind, r in study_other(args.kind, args.other_datasets, args.n_null,
                                   args.unconditional).items():
            print(f"B {kind} encoded (mean score {r['score']:.2f}), A not, "
                  f"{args.other_datasets} datasets: A pointwise FPR {r['fpr']:.3f}, "
                  f"FWE {r['fwe']:.3f}" + (f"; unconditional null: FPR "
                                            f"{r['naive_fpr']:.3f}, FWE {r['naive_fwe']:.3f}"
                                            if args.unconditional else ""))
    if args.only == "correlated":
        print(f"correlated binary A, B (B in 30 % of trials, A == B in 75 %), "
              f"{args.datasets} datasets of 36 trials x 6 channels x 8 times:")
        print_noise(study_noise(args.datasets, args.n_null, correlated), "pure noise")
        r, score = study_unencoded(args.datasets, args.n_null,
                                   partial(correlated, encoded=True), ("A", "interactions"))
        print_unencoded(r, f"B encoded, A not (mean score {score:.2f})")
    if args.only == "levels-numeric":
        print(f"C 4 levels of {LEVEL_SIZES} trials, X numeric correlated with C, X encoded, "
              f"C not, {args.datasets} datasets of 36 trials x 6 channels x 8 times:")
        for shape in ("linear", "saturating"):
            r, score = study_unencoded(args.datasets, args.n_null,
                                       partial(levels_numeric, shape=shape),
                                       ("C", "interactions"))
            print_unencoded(r, f"X encoded {shape} (mean score {score:.2f})")
    if args.only == "items":
        for tied, distance in ((False, "euclidean"), (True, "euclidean"),
                               (True, "cv_euclidean")):
            print(f"items, pure noise, 36 items of {'2 (A) or 4 (not A)' if tied else '1-4'}"
                  f" trials x 6 channels x 8 times, distance {distance!r}, "
                  f"{args.datasets} datasets:")
            print_noise(study_noise(args.datasets, args.n_null,
                                    partial(items_noise, tied=tied), distance=distance), "")
    if args.only == "searchlight":
        print(f"searchlight, 36 images of {SL_SHAPE} voxels of {SL_VOXEL:g} mm, radius "
              f"{SL_RADIUS:g} mm, every voxel a centre:")
        if args.datasets:
            print_noise(study_searchlight(args.datasets, args.n_null),
                        f"pure noise, {args.datasets} datasets (FWE over the spheres)")
        if args.power_datasets:
            amp = args.sl_amplitude * args.amplitude
            r = study_searchlight(args.power_datasets, args.n_null, amp)
            print(f"  A encoded in the central sphere (amplitude {amp:g}), "
                  f"{args.power_datasets} datasets: A FWE-significant within "
                  f"{SL_RADIUS:g} mm {r['power']:.2f}, more than {2 * SL_RADIUS:g} mm away "
                  f"{r['far']:.2f}, control B anywhere {r['control_fwe']:.2f}")
    if args.only in (None, "power"):
        r = study_power(args.power_datasets, args.n_null, args.amplitude)
        print(f"power, A in 0.1-0.3 s (amplitude {args.amplitude}), 40 trials x 8 channels "
              f"x 30 times, {args.power_datasets} datasets: A FWE-significant in the window "
              f"{r['power']:.2f}, >= 0.1 s away {r['far']:.2f}, control B anywhere "
              f"{r['control_fwe']:.2f}")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
