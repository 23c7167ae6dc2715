"""Importance from held-out pairs pooled over folds, against the fold mean (IT units).

Issue 12 asked whether computing each importance on the held-out pairs of all the folds
of a repeat at once (each fold's model scoring its own held-out pairs, one Spearman over
the union) is less noisy than the mean of the folds' importances.  On the IT units of
``bench_snr.py`` (84 pseudo-trials, features object and position), after
:func:`mlem_neuro.mlem_array` with each setting, both importances are recomputed here from
the fitted metrics of every fold with the *same* importance permutations (10 per feature
and fold), and the script prints the SNR (peak after onset over the baseline standard
deviation, as in ``bench_snr.py``) of the library's curve, the fold mean and the pooled
curve.  Categorical features only (indicator distances); the neural distances are the
analysis's own (its source, captured).

    OMP_NUM_THREADS=1 python validation/pooled_importance.py
"""
import sys
from pathlib import Path

import numpy as np
import scipy.stats
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_snr  # noqa: E402

import mlem_neuro  # noqa: E402
from mlem_neuro import inference  # noqa: E402
from mlem_neuro.core.stimuli.pairs import pair_indices  # noqa: E402

#: the source and cross-validation output of the last analysis (see _spy)
CAPTURED = {}


def _spy(run_cv):
    def wrapper(source, table, options, **kw):
        out = run_cv(source, table, options, **kw)
        CAPTURED.update(source=source, out=out)
        return out
    return wrapper


def spearman_rows(q, d):
    """Spearman correlation of every row of ``q`` with the same row of ``d``."""
    rq = scipy.stats.rankdata(q, axis=-1)
    rd = scipy.stats.rankdata(d, axis=-1)
    rq -= rq.mean(-1, keepdims=True)
    rd -= rd.mean(-1, keepdims=True)
    return (rq * rd).sum(-1) / np.sqrt((rq ** 2).sum(-1) * (rd ** 2).sum(-1))


def importances(data, table, times, cv, n_repeats, K=10, seed=0):
    """The analysis, then (fold mean, pooled) importances ``(M, m)`` recomputed from its
    fitted metrics with the same ``K`` permutations per feature and fold."""
    res = mlem_neuro.mlem_array(data, table, times=times, cv=cv, n_repeats=n_repeats,
                                random_state=seed, verbose="WARNING")
    src, out = CAPTURED["source"], CAPTURED["out"]
    codes = np.column_stack([np.unique(table[c], return_inverse=True)[1]
                             for c in table.columns])
    m = codes.shape[1]
    rng = np.random.default_rng(seed + 1)
    fold_imp = np.zeros((len(out.folds), src.n_models, m))
    per_rep = {}
    for f, (_, test) in enumerate(out.folds):
        i, j = pair_indices(len(test))
        d = src.rdm(np.asarray(test)).numpy()                       # (M, P)

        def predict(c, f=f, i=i, j=j):
            D = (c[i] != c[j]).astype(float)                        # indicator distances
            return np.einsum("pa,mab,pb->mp", D, out.W[f], D)

        q = predict(codes[test])
        base = spearman_rows(q, d)
        entry = per_rep.setdefault(f // cv, dict(q=[], d=[], perm={}))
        entry["q"].append(q)
        entry["d"].append(d)
        for a in range(m):
            drops = []
            for k in range(K):
                c2 = codes[test].copy()
                c2[:, a] = codes[test][rng.permutation(len(test)), a]
                qp = predict(c2)
                entry["perm"].setdefault((a, k), []).append(qp)
                drops.append(base - spearman_rows(qp, d))
            fold_imp[f, :, a] = np.mean(drops, axis=0)
    pooled = np.zeros((len(per_rep), src.n_models, m))
    for r, e in per_rep.items():
        d = np.concatenate(e["d"], axis=1)
        base = spearman_rows(np.concatenate(e["q"], axis=1), d)
        for a in range(m):
            pooled[r, :, a] = np.mean(
                [base - spearman_rows(np.concatenate(e["perm"][a, k], axis=1), d)
                 for k in range(K)], axis=0)
    return res, fold_imp.mean(axis=0), pooled.mean(axis=0)


def main():
    torch.set_num_threads(1)
    inference.run_cv = _spy(inference.run_cv)    # run_analysis calls it
    rec = bench_snr.it_units(4)
    if rec is None:
        print("IT units not found (../shared/data), skipped")
        return
    data, table, times = rec
    for cv, rep in [(5, 1), (3, 10), (5, 5)]:
        res, fold_mean, pooled = importances(data, table, times, cv, rep)
        row = []
        for a, f in enumerate(table.columns):
            lib = res.importance[:, res.terms.index(f)]
            row.append(f"{f}: library {bench_snr.snr(lib, times):.1f}, fold mean "
                       f"{bench_snr.snr(fold_mean[:, a], times):.1f}, pooled "
                       f"{bench_snr.snr(pooled[:, a], times):.1f}")
        print(f"cv={cv} n_repeats={rep}: " + "; ".join(row), flush=True)


if __name__ == "__main__":
    main()
