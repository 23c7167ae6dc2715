"""Exact ranks and held-out scores of float64 rows: argsort against packed integer keys.

:func:`mlem_neuro.core.ranks.spearman.sort_with_ties` sorts finite float64 rows on the CPU by
numpy's integer sort of packed keys (each value's order-preserving bit pattern with its
index in the low bits; rows the keys leave out of order are sorted again), where it used
``numpy.argsort``.  The importance score of a row
(:func:`mlem_neuro.core.scoring.importance._score`) is then taken from the sorted
order, by the compiled keys and scores where the kernels are on.  Side by side in this
process, one thread, best of ``--repeats`` runs of each, on
random rows of the sizes the analyses meet (held-out pairs of 80 stimuli, training pairs of
400, held-out pairs of 40 with many permutations):

* ``argsort``: ``numpy.argsort`` and the gather of the sorted rows (the previous path);
* ``packed``: :func:`sort_with_ties` (packed keys, the check, the gather);
* ``score, torch``: ``standardize(rankdata(q)) · tz`` (the previous importance score);
* ``score, compiled``: :func:`_score` as the analyses call it.

    OMP_NUM_THREADS=1 python benchmarks/internals/bench_ranks.py [--repeats 10]
"""
import argparse
import time

import numpy as np
import torch

from mlem_neuro.core import kernels
from mlem_neuro.core.ranks.spearman import rankdata, sort_with_ties, standardize
from mlem_neuro.core.scoring.importance import _score


def best(f, repeats):
    out = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        out = min(out, time.perf_counter() - t0)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    print(f"torch {torch.__version__}, numpy {np.__version__}, 1 thread, best of "
          f"{args.repeats}; compiled kernels on: {kernels.built()}")
    for rows, n in [(200, 3160), (20, 63840), (800, 780)]:
        q = torch.as_tensor(rng.standard_normal((rows, n)))
        tz = standardize(rankdata(torch.as_tensor(rng.standard_normal((rows, n)))))

        def argsort_path():
            order = torch.from_numpy(np.argsort(q.numpy(), axis=-1))
            s = q.gather(-1, order)
            return order, s, (s[:, 1:] == s[:, :-1]).any(dim=-1)

        t_arg = best(argsort_path, args.repeats)
        t_pack = best(lambda: sort_with_ties(q), args.repeats)
        assert torch.equal(argsort_path()[0], sort_with_ties(q)[0])
        t_old = best(lambda: (standardize(rankdata(q)) * tz).sum(dim=-1), args.repeats)
        t_new = best(lambda: _score(q, tz), args.repeats)
        diff = float((_score(q, tz) - (standardize(rankdata(q)) * tz).sum(dim=-1)).abs().max())
        print(f"{rows:4d} rows x {n:6d}: argsort {t_arg * 1e3:6.2f} ms, packed "
              f"{t_pack * 1e3:6.2f} ms ({t_arg / t_pack:4.2f}x); score, torch "
              f"{t_old * 1e3:6.2f} ms, compiled {t_new * 1e3:6.2f} ms "
              f"({t_old / t_new:4.2f}x, max |diff| {diff:.1e})")


if __name__ == "__main__":
    main()
