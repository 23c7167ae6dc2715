"""Soft Spearman per training step: per-pair torchsort vs grouped (table, expansion, PAV).

With categorical features the pairs of a batch fall into ``U`` groups of identical term rows.
For ``M`` models and a batch of ``b`` pairs this script times one forward + backward pass of
the soft Spearman three ways, side by side in one run:

* per pair: :func:`mlem_neuro.core.ranks.spearman.soft_spearman` on the ``M × b`` predictions
  (torchsort sorts them);
* grouped, interval table: :func:`mlem_neuro.core.ranks.grouped.grouped_soft_spearman` with the
  ``O(U²)`` min-max solution of the weighted isotonic regression;
* grouped, expansion: the same with torchsort's pool-adjacent-violators kernel on the sorted
  groups expanded to the ``b`` pairs (``O(b)``, no sort of the pairs);
* grouped, PAV: scipy's weighted pool-adjacent-violators over the ``U`` groups (``O(U)``),
  inside torch's autograd chain;
* grouped, fused (CPU only): the same solver inside one numpy pass with the gradient written
  by hand (:class:`mlem_neuro.core.ranks.grouped._SoftSpearmanPAV`), the engine's CPU path.

It also prints which one the engine picks (:func:`mlem_neuro.core.ranks.grouping._isotonic_method`,
then the fused pass on the CPU).  All give the same values and gradients
(``tests/test_engine.py``).

``--device cuda`` runs the three on the GPU (each timing waits for the GPU to finish).

Run: ``.venv/bin/python benchmarks/internals/bench_soft_rank.py [--models 100] [--repeats 10]
[--device cpu]``
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # benchmarks/_common.py
from _common import add_device_argument, clock, describe  # noqa: E402

import mlem_neuro.core.ranks.grouped as grouping  # noqa: E402
from mlem_neuro.core.ranks.spearman import soft_spearman  # noqa: E402


def timed(fn, repeats, device):
    fn()
    t0 = clock(device)
    for _ in range(repeats):
        fn()
    return (clock(device) - t0) / repeats * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=int, default=100)
    p.add_argument("--repeats", type=int, default=10)
    add_device_argument(p)
    args = p.parse_args()
    dev = args.device
    M = args.models
    print(f"{describe(dev)}; {M} models; ms per step (forward + backward)")
    names = ["table", "expansion", "pav"] + (["fused"] if dev == "cpu" else [])
    print(f"{'pairs b':>8} {'groups U':>9} {'per pair':>9} "
          + " ".join(f"{n:>9}" for n in names) + f" {'engine uses':>12} {'speed-up':>9}")
    g = torch.Generator().manual_seed(0)
    real, fused = grouping._isotonic_method, grouping.USE_FUSED
    try:
        for b in (1000, 2850, 8496):
            for U in (16, 32, 64, 128, 256):
                counts = torch.full((U,), b // U)
                counts[: b - int(counts.sum())] += 1
                counts = counts.to(dev)
                pred = torch.randn(M, U, dtype=torch.float64, generator=g).to(dev)
                pred.requires_grad_(True)
                sums = torch.randn(M, U, dtype=torch.float64, generator=g).to(dev)
                pairs = torch.randn(M, b, generator=g).to(dev).requires_grad_(True)
                target = torch.randn(M, b, generator=g).to(dev)

                def per_pair():
                    soft_spearman(pairs, target).sum().backward()

                def grouped():
                    grouping.grouped_soft_spearman(pred, counts, sums, 1.0).sum().backward()

                t_pair = timed(per_pair, args.repeats, dev)
                times = {}
                for name in names:
                    grouping.USE_FUSED = name == "fused"
                    grouping._isotonic_method = (lambda *a, m=name: "pav" if m == "fused"
                                             else m)
                    if name == "pav" and dev != "cpu":
                        times[name] = float("nan")
                        continue
                    times[name] = timed(grouped, args.repeats, dev)
                grouping._isotonic_method, grouping.USE_FUSED = real, fused
                choice = real(U, b, M, torch.device(dev).type)
                if choice == "pav" and fused and dev == "cpu":
                    choice = "fused"
                print(f"{b:>8} {U:>9} {t_pair:>9.2f} "
                      + " ".join(f"{times[n]:>9.2f}" for n in names)
                      + f" {choice:>12} {t_pair / times[choice]:>8.1f}x")
    finally:
        grouping._isotonic_method, grouping.USE_FUSED = real, fused


if __name__ == "__main__":
    main()
