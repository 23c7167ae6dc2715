"""The runtime of an analysis: threads, memory budget, compiled kernels on or off, device.

One :class:`Runtime` is resolved at the entry point of the work (:meth:`Runtime.resolve`:
:func:`mlem_neuro.inference.run_analysis`, under every analysis; :meth:`mlem_neuro.MLEM.fit`;
:func:`mlem_neuro.crossval.run_cv` and :func:`mlem_neuro.interaction.interaction_test`
when called without one), which reads the environment variables once, and travels with
the work as an argument: in every chunk job (joblib workers are processes of their own
and set their threads from it), down to the fits
(:func:`~mlem_neuro.core.training.engine.fit_stack`,
:func:`~mlem_neuro.core.training.engine.fit_grouped`), whose compiled training loop takes its
threads from it, and its batches, scores and null statistics, whose compiled kernels
(``compiled``) and sizes (``memory_bytes``: chunks of models, blocks of pairs) are the
runtime's.
Changing an environment variable while an analysis runs changes nothing in that
analysis.  A test sets one explicitly (``Runtime(compiled_threads=2)``) instead of the
environment.

Threads.  The engine's work is many small serial kernels (sorts, small matrix products,
scatters), which gain little from torch's intra-op threads, and OpenMP threads spin at
barriers when another process holds a core: on a busy machine torch's default (one thread
per core) made analyses several times slower than one thread (see "Threads and parallel
work" on the performance page).  So every analysis runs each worker with

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
``COMPILED_PARALLEL_MODELS`` models: measured on the whole-brain benchmark, 2,000 spheres
on 2 cores, 2 threads took 38 s against 59-61 s for one (1.6x), at the memory of one
process (``n_jobs=2``: 35 s, twice the memory).

Memory: ``MLEM_NEURO_MEMORY`` (:func:`mlem_neuro.core.memory.memory_budget`, default 4
GiB).  Compiled kernels: on where numba is installed
(:data:`mlem_neuro.core.kernels._numba.AVAILABLE`) and ``MLEM_NEURO_NO_COMPILED`` is not
a true word; each kernel's wrapper takes the switch as ``compiled=``
(:mod:`mlem_neuro.core.kernels`), so ``Runtime(compiled=False)`` runs an analysis on the
torch and numpy paths.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field

from .constants import (  # noqa: F401  (tuning constants, defined there once)
    DEFAULT_THREADS,
    MEMORY_BYTES,
)

#: the environment variable of the threads per worker
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


def requested_threads(environ=None):
    """``MLEM_NEURO_NUM_THREADS`` parsed (from ``environ``, default ``os.environ``): an int
    >= 1, ``None`` for ``"off"``, or :data:`DEFAULT_THREADS` when unset or empty."""
    text = (os.environ if environ is None else environ).get(ENV_VAR)
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


def _split(cores, n_workers):
    """Cores of each of ``n_workers`` workers: ``cores // n_workers``, at least 1."""
    return max(1, cores // max(1, int(n_workers)))


def worker_cores(n_workers=1, environ=None, cores=None):
    """Threads of the compiled training loop for each of ``n_workers`` workers: the cores
    each may use (``available_cores() // n_workers``, at least 1; ``cores``: the available
    cores when already known), capped by ``MLEM_NEURO_NUM_THREADS`` when it is set
    (``"off"``: one)."""
    each = _split(available_cores() if cores is None else cores, n_workers)
    text = (os.environ if environ is None else environ).get(ENV_VAR)
    if text is None or text.strip() == "":
        return each
    requested = requested_threads(environ)
    return 1 if requested is None else min(requested, each)


def worker_threads(n_workers=1, environ=None, cores=None):
    """Torch intra-op threads for each of ``n_workers`` workers, or ``None`` to leave them
    alone (``MLEM_NEURO_NUM_THREADS=off``): workers x threads never exceeds
    :func:`available_cores` (``cores`` when given; each worker gets at least one)."""
    requested = requested_threads(environ)
    if requested is None:
        return None
    return min(requested, _split(available_cores() if cores is None else cores, n_workers))


@contextlib.contextmanager
def torch_threads(n):
    """Run the block with ``torch.set_num_threads(n)``, then restore the caller's setting
    (also on error); ``None`` changes nothing."""
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


def _numba_installed():
    """Whether numba is installed (:data:`mlem_neuro.core.kernels._numba.AVAILABLE`,
    known once the kernels' module is imported): the default of
    :attr:`Runtime.compiled`."""
    from .kernels import _numba

    return _numba.AVAILABLE


@dataclass(frozen=True)
class Runtime:
    """Where and how an analysis runs, resolved once at its entry point
    (:meth:`resolve`) and passed down with the work.

    The defaults (``Runtime()``) are those of a call outside an analysis: one torch
    thread, one thread of the compiled loop, the default memory budget, the compiled
    kernels on where numba is installed (:func:`_numba_installed`), the CPU; they read no
    environment variable.

    Attributes
    ----------
    threads : int | None
        Torch intra-op threads of each worker (and of the main process while the workers
        run); ``None`` leaves torch's threads as the caller set them
        (``MLEM_NEURO_NUM_THREADS=off``).
    compiled_threads : int
        Threads of the compiled training loop in each worker (:func:`worker_cores`).
    memory_bytes : int
        The memory budget (``MLEM_NEURO_MEMORY``).
    compiled : bool
        Whether the compiled kernels are on (numba installed, ``MLEM_NEURO_NO_COMPILED``
        not a true word); every kernel wrapper takes it as ``compiled=``.
    device : str
        The torch device of the work (the ``device`` option).
    n_workers : int
        Workers the work is split between (joblib's ``effective_n_jobs(n_jobs)``).
    cores : int | None
        The cores the process may use (:func:`available_cores`; ``None``: not read).
    """

    threads: int | None = DEFAULT_THREADS
    compiled_threads: int = 1
    memory_bytes: int = MEMORY_BYTES
    compiled: bool = field(default_factory=_numba_installed)
    device: str = "cpu"
    n_workers: int = 1
    cores: int | None = None

    @classmethod
    def resolve(cls, n_workers=1, device="cpu", environ=None):
        """The runtime of work split between ``n_workers`` workers on ``device``: the
        environment variables (``environ``, default ``os.environ``) and the cores read
        now, once.  A bad value raises the ValueError naming its variable."""
        from .kernels._numba import NO_COMPILED_VAR, env_flag
        from .memory import memory_budget

        budget = memory_budget() if environ is None else memory_budget(environ)
        environ = os.environ if environ is None else environ
        compiled = _numba_installed() and not env_flag(NO_COMPILED_VAR, environ)
        n_workers = max(1, int(n_workers))
        cores = available_cores()
        return cls(threads=worker_threads(n_workers, environ, cores),
                   compiled_threads=max(1, worker_cores(n_workers, environ, cores)),
                   memory_bytes=budget, compiled=compiled, device=str(device),
                   n_workers=n_workers, cores=cores)

    def torch_threads(self):
        """A context running its block on :attr:`threads` torch threads (then the
        caller's again)."""
        return torch_threads(self.threads)


def run_with(runtime, function, *args):
    """``function(*args)`` on ``runtime``'s torch threads (:meth:`Runtime.torch_threads`):
    what a joblib job runs (a worker is a process of its own, so it sets its threads
    itself)."""
    with runtime.torch_threads():
        return function(*args)
