"""One memory budget for every allocation that grows with pairs, voxels or spheres.

The budget is ``MLEM_NEURO_MEMORY`` (bytes, or a size such as ``"4GiB"``, ``"500MB"``) when
set, else 4 GiB.  Code that would allocate more than the budget in one piece either chunks
the work (pairs, models) so that each piece fits, or calls :func:`check_memory`, which
raises a :class:`MemoryError` saying what was asked for and what to change, *before* the
allocation is attempted (so nothing is half-built).
"""
from __future__ import annotations

import math
import os
import re

from .constants import (  # noqa: F401  (tuning constants, defined there once)
    MEMORY_BYTES as DEFAULT_BYTES,
)

ENV_VAR = "MLEM_NEURO_MEMORY"
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}


def parse_size(text, name=ENV_VAR):
    """Bytes of a size given as a number or a string such as ``"4GiB"`` or ``"512 MB"``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*",
                         str(text))
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{name} must be a size in bytes or with a unit (e.g. '4GiB', "
                             f"'500MB'); got {text!r}")
        value, unit = float(m.group(1)), m.group(2).lower()
    if not math.isfinite(value * _UNITS[unit]):
        raise ValueError(f"{name} must be a finite size; got {text!r}")
    nbytes = int(value * _UNITS[unit])
    if nbytes <= 0:
        raise ValueError(f"{name} must be a positive size; got {text!r}")
    return nbytes


def memory_budget(environ=None):
    """The budget in bytes (``MLEM_NEURO_MEMORY`` of ``environ``, default ``os.environ``;
    4 GiB when unset).

    An unreadable value raises a ValueError that names the environment variable and its
    value (whatever the call was doing when it read the budget)."""
    env = (os.environ if environ is None else environ).get(ENV_VAR)
    if env in (None, ""):
        return DEFAULT_BYTES
    try:
        return parse_size(env)
    except ValueError as err:
        raise ValueError(f"the environment variable {err}. Set it to a size such as "
                         f"{ENV_VAR}=16GiB, or unset it for the default "
                         f"({format_bytes(DEFAULT_BYTES)}).") from None


def format_bytes(nbytes):
    """``1536`` -> ``'1.5 KiB'``."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover


def check_memory(nbytes, what, fix, budget=None):
    """Raise a MemoryError when one allocation of ``nbytes`` would exceed the budget.

    Parameters
    ----------
    nbytes : int
        Size of the allocation about to be made.
    what : str
        What it holds, e.g. ``"the sphere membership (38,000 spheres x 2,000 voxels)"``.
    fix : str
        What the user can change, e.g. ``"use a smaller radius"``.
    budget : int | None
        The budget in bytes: an analysis's, read once at its entry point
        (:attr:`~mlem_neuro.core.runtime.Runtime.memory_bytes`); ``None`` reads it now
        (:func:`memory_budget`: a check at a public entry point, outside an analysis).
    """
    budget = memory_budget() if budget is None else int(budget)
    if nbytes > budget:
        raise MemoryError(
            f"{what} would need {format_bytes(nbytes)}, more than the memory budget of "
            f"{format_bytes(budget)}: {fix}, or raise the budget with the environment "
            f"variable {ENV_VAR} (e.g. {ENV_VAR}=16GiB) if the machine has the memory.")
    return nbytes
