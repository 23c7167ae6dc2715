"""Torch's intra-op threads during the package's work: never more than the cores allow.

The engine's work is many small serial kernels (sorts, small matrix products, scatters),
which gain little from torch's intra-op threads, and OpenMP threads spin at barriers when
another process holds a core: on a busy machine torch's default (one thread per core) made
analyses several times slower than one thread (see "Threads and parallel work" on the
performance page).  So every analysis runs each worker with

    ``threads = min(requested, max(1, available_cores() // n_workers))``

intra-op threads, where ``requested`` is :data:`DEFAULT_THREADS` (1) unless the
environment variable ``MLEM_NEURO_NUM_THREADS`` says otherwise, and restores the caller's
setting afterwards.  ``MLEM_NEURO_NUM_THREADS`` is a positive int (threads per worker,
still capped so that workers x threads never exceeds the cores) or ``"off"`` (the package
leaves torch's threads as the caller set them: the behaviour before this policy).

The compiled training loop (:mod:`mlem_neuro.core.training.compiled`) is different: it
splits a stack's models between threads once per stack (numba's ``prange``), with no
barrier per operation to spin at, and each model's fit is the same on any thread.  It
takes every core the worker may use, ``available_cores() // n_workers``
(:func:`worker_cores`; ``MLEM_NEURO_NUM_THREADS`` caps it), for stacks of at least
``COMPILED_PARALLEL_MODELS`` models: measured on the whole-brain
benchmark, 2,000 spheres on 2 cores, 2 threads took 38 s against 59-61 s for one (1.6x),
at the memory of one process (``n_jobs=2``: 35 s, twice the memory).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os

from .core.constants import (  # noqa: F401  (tuning constants, defined there once)
    DEFAULT_THREADS,
)

ENV_VAR = "MLEM_NEURO_NUM_THREADS"
#: where the cgroup CPU quota is read (v2 ``cpu.max``; v1 ``cpu.cfs_quota_us`` and
#: ``cpu.cfs_period_us`` under ``cpu/`` or ``cpu,cpuacct/``).
CGROUP_ROOT = "/sys/fs/cgroup"


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def cgroup_cpu_limit(root=None):
    """CPUs allowed by the cgroup quota (``ceil(quota / period)``, at least 1), or ``None``
    when there is no quota (``"max"`` / ``-1``) or no readable cgroup file."""
    root = CGROUP_ROOT if root is None else root
    text = _read(os.path.join(root, "cpu.max"))                         # cgroup v2
    if text is not None:
        fields = text.split()
        if len(fields) != 2 or fields[0] == "max":
            return None
        quota, period = fields
    else:                                                               # cgroup v1
        for sub in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            quota = _read(os.path.join(root, sub, "cpu.cfs_quota_us"))
            period = _read(os.path.join(root, sub, "cpu.cfs_period_us"))
            if quota is not None and period is not None:
                break
        else:
            return None
    try:
        quota, period = int(quota), int(period)
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return max(1, math.ceil(quota / period))


def available_cores():
    """Cores this process may use: its CPU affinity (``os.sched_getaffinity``, else
    ``os.cpu_count()``), capped by the cgroup CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):      # not on Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    return max(1, cores if limit is None else min(cores, limit))


def requested_threads():
    """``MLEM_NEURO_NUM_THREADS`` parsed: an int >= 1, ``None`` for ``"off"``, or
    :data:`DEFAULT_THREADS` when unset or empty."""
    text = os.environ.get(ENV_VAR)
    if text is None or text.strip() == "":
        return DEFAULT_THREADS
    text = text.strip()
    if text.lower() == "off":
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_VAR} must be a positive int (intra-op threads per worker) "
                         f"or 'off' (leave torch's threads as they are); got {text!r}. "
                         f"Unset it for the default ({DEFAULT_THREADS}).")
    return value


#: threads of the compiled training loop in the current block (:func:`torch_threads`)
_COMPILED_THREADS = contextvars.ContextVar("mlem_neuro_compiled_threads", default=1)


def compiled_threads():
    """Threads the compiled training loop may use here: what the enclosing
    :func:`torch_threads` block allows (1 outside the package's work)."""
    return _COMPILED_THREADS.get()


def worker_cores(n_workers=1):
    """Threads of the compiled training loop for each of ``n_workers`` workers: the cores
    each may use (``available_cores() // n_workers``, at least 1), capped by
    ``MLEM_NEURO_NUM_THREADS`` when it is set (``"off"``: one)."""
    cores = max(1, available_cores() // max(1, int(n_workers)))
    text = os.environ.get(ENV_VAR)
    if text is None or text.strip() == "":
        return cores
    requested = requested_threads()
    return 1 if requested is None else min(requested, cores)


def worker_threads(n_workers=1):
    """Torch intra-op threads for each of ``n_workers`` workers, or ``None`` to leave them
    alone (``MLEM_NEURO_NUM_THREADS=off``): workers x threads never exceeds
    :func:`available_cores` (each worker gets at least one)."""
    requested = requested_threads()
    if requested is None:
        return None
    return min(requested, max(1, available_cores() // max(1, int(n_workers))))


@contextlib.contextmanager
def torch_threads(n, compiled=None):
    """Run the block with ``torch.set_num_threads(n)`` and ``compiled`` threads for the
    compiled training loop (:func:`compiled_threads`), then restore the caller's settings
    (also on error); ``None`` changes nothing."""
    if compiled is not None:
        token = _COMPILED_THREADS.set(max(1, int(compiled)))
        try:
            with torch_threads(n):
                yield
        finally:
            _COMPILED_THREADS.reset(token)
        return
    if n is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    if old != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != old:
            torch.set_num_threads(old)


def policy(n_workers=1):
    """``(torch threads, compiled-loop threads)`` for each of ``n_workers`` workers."""
    return worker_threads(n_workers), worker_cores(n_workers)


def call_with_threads(threads, function, *args):
    """``function(*args)`` under ``torch_threads(*threads)`` (``threads``: a
    :func:`policy`, or torch's threads alone) — what a joblib job runs: a worker is a
    process of its own, so it sets its threads itself."""
    with torch_threads(*(threads if isinstance(threads, tuple) else (threads,))):
        return function(*args)


def limit_threads(method):
    """Decorate a method that trains or scores in this process: it runs under
    ``torch_threads(worker_threads(1))``."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with torch_threads(*policy(1)):
            return method(*args, **kwargs)

    return wrapper
