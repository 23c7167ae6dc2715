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

    def auto_or(number):
        return lambda text: text if text == "auto" else number(text)

    parser.add_argument("--lr", type=auto_or(float), default=d.lr, help=f"default {d.lr}")
    parser.add_argument("--patience", type=auto_or(int), default=d.patience,
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


def part(text):
    """``--part k/K`` (an ``argparse`` type): ``(k, K)``, this process being the k-th of K
    that split a run's jobs, ``1 <= k <= K``."""
    import argparse

    try:
        k, K = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected k/K, e.g. 1/2; got {text!r}") from None
    if not 1 <= k <= K:
        raise argparse.ArgumentTypeError(f"k/K needs 1 <= k <= K (the k-th of K processes); "
                                         f"got {text!r}")
    return k, K


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


def scale_channels(data):
    """Zero mean and unit variance per channel over trials and times (a flat channel is only
    centred): the scaling ``mlem_epochs`` / ``mlem_array`` apply to ``(trials, channels,
    times)`` data by default (``scale=True``), written here so that the benchmarks use no
    private name of the package."""
    data = np.asarray(data, dtype=float)
    mean = data.mean(axis=(0, 2), keepdims=True)
    std = data.std(axis=(0, 2), keepdims=True)
    return (data - mean) / np.where(std > 0, std, 1.0)


#: the environment variable of the package's thread policy (documented on the options page)
THREADS_ENV = "MLEM_NEURO_NUM_THREADS"


def available_cores():
    """Cores this process may use: its CPU affinity (else ``os.cpu_count()``), capped by the
    cgroup CPU quota (``cpu.max``, or cgroup v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``)
    when there is one: the count the package's thread policy divides among workers."""
    import math
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    root = Path("/sys/fs/cgroup")

    def read(path):
        try:
            return path.read_text().strip()
        except OSError:
            return None

    quota = period = None
    text = read(root / "cpu.max")
    if text is not None:
        fields = text.split()
        if len(fields) == 2 and fields[0] != "max":
            quota, period = fields
    else:
        for sub in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            q, p = read(root / sub / "cpu.cfs_quota_us"), read(root / sub / "cpu.cfs_period_us")
            if q is not None and p is not None:
                quota, period = q, p
                break
    try:
        quota, period = int(quota), int(period)
    except (TypeError, ValueError):
        return max(1, cores)
    if quota <= 0 or period <= 0:
        return max(1, cores)
    return max(1, min(cores, math.ceil(quota / period)))
