"""Helpers shared by the benchmark scripts: the ``--device`` option and honest clocks.

CUDA kernels run asynchronously, so every clock reading on a GPU is taken after
``torch.cuda.synchronize()``; the first CUDA call of a process also pays for the context
and kernel loading, so :func:`warm_up` runs a tiny fit first (not timed).
"""
import resource
import time
from pathlib import Path

import numpy as np
import torch


def add_device_argument(parser):
    parser.add_argument("--device", default="cpu",
                        help="'cpu' (default) or 'cuda': where the models are trained")


def add_optimiser_arguments(parser):
    """``--lr``, ``--patience``, ``--tol``: the package defaults unless given (so that old
    and new defaults can be timed side by side)."""
    from mlem_neuro.core.options import MLEMOptions

    d = MLEMOptions()
    parser.add_argument("--lr", type=float, default=d.lr, help=f"default {d.lr:g}")
    parser.add_argument("--patience", type=int, default=d.patience,
                        help=f"default {d.patience}")
    parser.add_argument("--tol", type=float, default=d.tol, help=f"default {d.tol:g}")


def peak_rss_mib():
    """Peak resident set size of this process so far (``ru_maxrss``, MiB; monotone)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def clock(device):
    """``time.perf_counter()`` once the device has finished its queued work."""
    sync(device)
    return time.perf_counter()


def describe(device):
    """torch version, threads and (on CUDA) the GPU's name, for the benchmark's header."""
    text = f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {device}"
    if str(device).startswith("cuda"):
        text += f" ({torch.cuda.get_device_name(torch.device(device))})"
    return text


def warm_up(device):
    """Run one small fit on ``device`` so that start-up costs stay out of the timings."""
    from mlem_neuro import MLEM
    from mlem_neuro.simulation import simulate_representations

    X, y, _ = simulate_representations(20, 3, 8, noise=0.1, random_state=0)
    MLEM(device=device, max_steps=5, random_state=0).fit(X, y).score(X, y)
    Xn = X[:, :3] + np.arange(20)[:, None]                   # numeric: per-pair path too
    MLEM(device=device, max_steps=5, random_state=0).fit(X, Xn)
    sync(device)


def wilson(count, n):
    """Wilson 95 % interval ``(low, high)`` of a rate ``count / n`` (scipy's binomial test;
    NaN when ``n`` is 0)."""
    from scipy.stats import binomtest

    if n == 0:
        return float("nan"), float("nan")
    ci = binomtest(int(count), int(n)).proportion_ci(method="wilson")
    return float(ci.low), float(ci.high)


#: the shared Haxby 2001 copy (subject 1, 25 mm), beside the repository
HAXBY = (Path(__file__).resolve().parents[2] / "shared" / "data" / "haxby2001_sub001_25mm"
         / "sub001")


def haxby_runs():
    """``(bold, events, mask)`` of the shared Haxby copy: the 12 runs' BOLD and events
    paths and the brain mask image; exits with a message when the copy is absent."""
    import nibabel as nib

    if not HAXBY.exists():
        raise SystemExit(f"shared Haxby data not found at {HAXBY}")
    bold = [HAXBY / f"BOLD/task001_run{r:03d}/bold_25mm.nii.gz" for r in range(1, 13)]
    events = [HAXBY / f"BOLD/task001_run{r:03d}/bold_events.tsv" for r in range(1, 13)]
    return bold, events, nib.load(HAXBY / "masks/25mm/brain.nii.gz")
