"""Torch's intra-op threads during the package's work: never more than the cores allow.

The policy and the cores it reads live in :mod:`mlem_neuro.core.runtime` (the bottom
layer), resolved once per analysis into a :class:`~mlem_neuro.core.runtime.Runtime`; this
module keeps the names the package always had and the decorator of the estimator's
methods that score in this process.
"""
from __future__ import annotations

import functools

from .core.constants import (  # noqa: F401  (tuning constants, defined there once)
    DEFAULT_THREADS,
)
from .core.runtime import (  # noqa: F401  (the policy, under the names it always had)
    CGROUP_ROOT,
    ENV_VAR,
    Runtime,
    available_cores,
    cgroup_cpu_limit,
    requested_threads,
    run_with,
    torch_threads,
    worker_cores,
    worker_threads,
)


def limit_threads(method):
    """Decorate a method that scores in this process: it runs on the torch threads of one
    worker (:func:`worker_threads`, read at each call)."""
    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        with torch_threads(worker_threads(1)):
            return method(*args, **kwargs)

    return wrapper
