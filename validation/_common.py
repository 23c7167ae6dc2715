"""Helpers of the validation scripts: those of ``benchmarks/_common.py``, re-exported.

The scripts of this folder import ``_common`` as the benchmarks do (``from _common import
wilson``); this module loads ``benchmarks/_common.py`` under another name and exposes its
names here, and it puts ``benchmarks/`` on ``sys.path`` so that a validation script can
reuse a benchmark's data loaders (``import bench_snr``).
"""
import importlib.util
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.append(str(BENCHMARKS))

_spec = importlib.util.spec_from_file_location("_benchmarks_common", BENCHMARKS / "_common.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})


def save_each(where, seeds, run, label):
    """Run ``run(seed) -> dict of arrays`` for each of ``seeds`` not yet saved in the
    folder ``where`` (``{seed}.npz``), saving each dataset as it comes (written aside,
    then renamed: a run stopped midway leaves no partial file), so a stopped run resumes
    where it stopped."""
    import os

    import numpy as np

    os.makedirs(where, exist_ok=True)
    for seed in seeds:
        file = os.path.join(where, f"{seed}.npz")
        if os.path.exists(file):
            continue
        np.savez(file + ".tmp.npz", **run(seed))
        os.replace(file + ".tmp.npz", file)
        print(f"{label} {seed}", flush=True)


def add_out_report(parser, name):
    """``--out`` (default a folder ``name`` in the temporary directory) and ``--report``:
    the options of a script that saves each dataset as it comes and reports from what was
    saved."""
    import os
    import tempfile

    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), name))
    parser.add_argument("--report", action="store_true")


def reported(args, report):
    """Make ``args.out``; with ``--report`` print ``report(args.out)`` and return True
    (the script then stops), else set torch to one thread for the runs and return False."""
    import os

    import torch

    os.makedirs(args.out, exist_ok=True)
    if args.report:
        report(args.out)
        return True
    torch.set_num_threads(1)
    return False
