"""The whole brain on one GPU, measured on chunks: the torch loop's variants side by side.

Issue 41's setting, on the ``--spheres`` centres (default 8,000: two chunks of 4,000 a
fold) nearest the encoded region's centre in ``bench_wholebrain.py``'s data (MNI152 grey
matter at 3 mm, 64,292 centres, radius 6 mm, 96 images, 8 binary features with their
interactions, 5 folds, 10 permutations of each feature), each variant run in turn in
this one process:

* ``check every step``: the host reads which models still train after every step (the
  rule before 2026-11-30, whose loop also read four more values per step; each read
  waits for the GPU);
* ``check every N``: :data:`~mlem_neuro.core.constants.GPU_CHECK_EVERY` (the GPU default);
* ``table``: checks every N steps, the grouped soft ranks solved by the interval table
  whatever its size (on a GPU the package takes torchsort's kernel on the groups
  expanded to the pairs, one sequential thread per model, when ``M x U^2`` exceeds
  ``MAX_TABLE_ELEMENTS``: 4,000 spheres of about 256 groups need 2.6e8 elements, about
  13 GB of float64 intermediates, which an H200 holds);
* ``graphs``: checks every N steps with ``MLEM_NEURO_CUDA_GRAPHS=1`` (the full-batch
  steps replayed from a captured CUDA graph).

Each prints its wall time (the device synchronised), the part spent training
(``fit_stack``), in the spheres' RDMs (``SphereRDMSource.rdm``, on the CPU) and the rest
(ranks, importances, the tests' setup), the steps, the
whole brain extrapolated by centres (64,292 / ``--spheres``; chunks are alike), and the
largest difference of its maps from the first variant's.  ``--profile`` also profiles one
chunk's training (first fold) of the first variant: the operations taking most device
time (CPU time on the CPU).  The variants run in the order given (``--variants``; by
default the GPU default first, the former rule last, so that a run cut short keeps the
most telling ones).

Run on a GPU: ``python benchmarks/bench_gpu_chunks.py --device cuda [--profile]``; on the
CPU, to check that it runs: ``--device cpu --spheres 200 --chunk-size 100``.
"""
import argparse
import os
import time
import warnings

import numpy as np
import torch
from _common import add_device_argument, clock, describe, warm_up
from bench_wholebrain import CENTRE_MM, make_data

import mlem_neuro
import mlem_neuro.crossval as crossval
from mlem_neuro.core import constants
from mlem_neuro.core.ranks import grouped
from mlem_neuro.core.training import graphs, torch_loop

WHOLE_BRAIN = 64_292


class TimedRDMs:
    """``SphereRDMSource.rdm`` timed (device synchronised): the spheres' RDMs, part of
    what is not training."""

    def __init__(self, device):
        from mlem_neuro.core.rdms.sources import SphereRDMSource
        self.cls, self.real, self.device, self.seconds = SphereRDMSource, None, device, 0.0

    def __enter__(self):
        self.real = self.cls.rdm
        timer = self

        def rdm(source, *args, **kwargs):
            t0 = clock(timer.device)
            out = timer.real(source, *args, **kwargs)
            timer.seconds += clock(timer.device) - t0
            return out
        self.cls.rdm = rdm
        return self

    def __exit__(self, *exc):
        self.cls.rdm = self.real


class Timed:
    """``crossval.fit_stack`` timed (device synchronised), optionally profiling its first
    call on ``profile`` models or more (a whole chunk)."""

    def __init__(self, device, profile=0):
        self.device, self.profile, self.seconds, self.calls = device, profile, 0.0, 0
        self.real = crossval.fit_stack
        self.table = None

    def __call__(self, *args, **kwargs):
        t0 = clock(self.device)
        if self.profile and self.table is None and args[1].n_models >= self.profile:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU]
            if str(self.device).startswith("cuda"):
                acts.append(ProfilerActivity.CUDA)
            with profile(activities=acts) as prof:
                out = self.real(*args, **kwargs)
                clock(self.device)
            key = "cuda_time_total" if len(acts) > 1 else "cpu_time_total"
            self.table = prof.key_averages().table(sort_by=key, row_limit=15)
        else:
            out = self.real(*args, **kwargs)
        self.seconds += clock(self.device) - t0
        self.calls += 1
        return out


def nearest_centres(mask_img, n):
    """The ``n`` mask voxels nearest the encoded region's centre: a contiguous block, whose
    spheres share voxels as those of a whole-brain chunk do (random centres would make
    each sphere's RDM cost more)."""
    import nibabel as nib
    mask = np.asarray(mask_img.dataobj) > 0
    ijk = np.argwhere(mask)
    dist = np.linalg.norm(nib.affines.apply_affine(mask_img.affine, ijk) - CENTRE_MM, axis=1)
    pick = ijk[np.argsort(dist, kind="stable")[:n]]
    out = np.zeros(mask.shape, np.int8)
    out[tuple(pick.T)] = 1
    return nib.Nifti1Image(out, mask_img.affine)


def run(name, args, data, every=None, graphs_on=False, table_always=False, profile=False):
    imgs, table, mask_img, process = data
    os.environ[graphs.ENV] = "1" if graphs_on else "0"
    real_every, real_method = torch_loop.check_every, grouped._isotonic_method
    if every is not None:
        torch_loop.check_every = lambda dev: every
    if table_always:
        grouped._isotonic_method = lambda U, b, M, device_type="cpu": (
            "table" if device_type == "cuda" else real_method(U, b, M, device_type))
    timed = Timed(args.device, args.chunk_size if profile else 0)
    crossval.fit_stack = timed
    try:
        t0 = clock(args.device)
        with warnings.catch_warnings(), TimedRDMs(args.device) as rdms:
            warnings.simplefilter("ignore", UserWarning)
            res = mlem_neuro.mlem_searchlight(
                imgs, table, mask_img, process_mask_img=process, radius=6.0, cv=5,
                n_permutations=10, n_jobs=1, chunk_size=args.chunk_size,
                device=args.device, random_state=0)
        wall = clock(args.device) - t0
    finally:
        crossval.fit_stack = timed.real
        torch_loop.check_every = real_every
        grouped._isotonic_method = real_method
        os.environ.pop(graphs.ENV, None)
    S = len(res.score)
    print(f"{name:18s} wall {wall:7.1f} s: training {timed.seconds:7.1f} s in {timed.calls} "
          f"fits, the spheres' RDMs {rdms.seconds:6.1f} s, the rest "
          f"{wall - timed.seconds - rdms.seconds:6.1f} s; steps median "
          f"{np.median(res.n_iter):.0f}, max {res.n_iter.max()} -> whole brain "
          f"{wall * WHOLE_BRAIN / S:6.0f} s (EXTRAPOLATED from {S} centres)", flush=True)
    if timed.table is not None:
        print(f"-- profile of one chunk's training (first fold), {name}:\n{timed.table}")
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spheres", type=int, default=8000)
    p.add_argument("--chunk-size", type=int, default=4000)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--variants", nargs="*",
                   default=["every-n", "graphs", "table", "every-step"])
    add_device_argument(p)
    args = p.parse_args()
    torch.set_num_threads(1)
    warm_up(args.device)
    imgs, table, mask_img, _ = make_data(96, 0.5, seed=0)
    process = nearest_centres(mask_img, args.spheres)
    print(f"the {args.spheres} centres of MNI152 grey matter at 3 mm nearest the encoded "
          f"region's centre, chunks of {args.chunk_size}, 96 images, 8 binary features, 5 "
          f"folds, 10 permutations; {describe(args.device)}; GPU_CHECK_EVERY = "
          f"{constants.GPU_CHECK_EVERY}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    data = (imgs, table, mask_img, process)
    settings = {"every-step": dict(every=1),
                "every-n": dict(every=None),
                "table": dict(every=None, table_always=True),
                "graphs": dict(every=None, graphs_on=True)}
    first = None
    for i, name in enumerate(args.variants):
        label = {"every-step": "check every step",
                 "every-n": f"check every {torch_loop.check_every(args.device)}",
                 "table": "table", "graphs": "graphs"}[name]
        res = run(label, args, data, profile=args.profile and i == 0, **settings[name])
        if first is None:
            first = res
            continue
        d_imp = np.nanmax(np.abs(res.importance - first.importance))
        d_score = np.nanmax(np.abs(res.score - first.score))
        steps = int((res.n_iter != first.n_iter).sum())
        print(f"{'':18s} against {args.variants[0]}: max |d importance| {d_imp:.2e}, "
              f"max |d score| {d_score:.2e}, steps differ in {steps} of {res.n_iter.size}")


if __name__ == "__main__":
    main()
