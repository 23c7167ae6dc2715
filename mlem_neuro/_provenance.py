"""What a result was computed with: versions, platform, device (``result.provenance``).

Recorded when a result is created and saved with it, so a result read back says which
software and machine made it.  A package already imported reports its own
``__version__`` (what runs, also from a source checkout or beside an older installed
copy); the others are read from the installed distributions (``importlib.metadata``),
without importing optional packages.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import platform
import sys
from importlib import metadata

#: distributions whose version a result records (``None`` when not installed).
PACKAGES = ("mlem_neuro", "numpy", "scipy", "torch", "torchsort", "numba", "pandas",
            "scikit-learn", "joblib", "mne", "nilearn", "nibabel")


#: import names of the distributions whose names differ
_MODULES = {"scikit-learn": "sklearn"}


def _version(name):
    if name == "mlem_neuro":
        from ._version import __version__
        return __version__
    module = sys.modules.get(_MODULES.get(name, name))
    version = getattr(module, "__version__", None)
    return str(version) if isinstance(version, str) else _installed_version(name)


@functools.lru_cache(maxsize=None)
def _installed_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


#: the training paths used in the current analysis chunk (:func:`recording`)
_TRAINING = contextvars.ContextVar("mlem_neuro_training_paths", default=None)


@contextlib.contextmanager
def recording():
    """Collect the training paths used inside the block: yields a set that
    :func:`note_training` fills (per thread / task: a context variable)."""
    used = set()
    token = _TRAINING.set(used)
    try:
        yield used
    finally:
        _TRAINING.reset(token)


def note_training(path):
    """Record that ``path`` (e.g. ``"compiled loop (C)"``) trained models, when an
    analysis is recording (:func:`recording`); otherwise nothing."""
    used = _TRAINING.get()
    if used is not None:
        used.add(path)


def collect(device=None, training=None):
    """The provenance of a result computed now on ``device`` (a dict of JSON values).

    Keys: ``versions`` (each of :data:`PACKAGES`), ``python``, ``platform``, ``machine``,
    ``device`` (as the analysis was asked to run), ``torch_cuda`` (the CUDA version torch
    was built with, ``None`` for a CPU build), ``compiled_training`` (whether the
    package's compiled kernels, numba, were switched on; ``MLEM_NEURO_NO_COMPILED``
    switches them off) and ``training`` (the training paths that actually trained the
    analysis's models, e.g. ``["compiled loop (numba)", "torch (cpu)"]``; ``None`` when
    not recorded).
    """
    from .core import kernels

    torch_cuda = None
    if "torch" in sys.modules:
        torch_cuda = getattr(sys.modules["torch"].version, "cuda", None)
    return dict(versions={name: _version(name) for name in PACKAGES},
                python=platform.python_version(), platform=platform.platform(),
                machine=platform.machine(),
                device=None if device is None else str(device), torch_cuda=torch_cuda,
                compiled_training=bool(kernels.built()),
                training=None if training is None else sorted(training))


def check_recorded(provenance):
    """``provenance`` read from a result file, checked to be what :func:`collect` writes
    (``None``: a file written before provenance was recorded, ``{}``); ``ValueError``
    naming the field that is not (the file was written by other means).

    Keys :func:`collect` does not write are kept: a newer version may record more.
    """
    if provenance is None:
        return {}
    if not isinstance(provenance, dict):
        raise ValueError(f"'provenance' is a {type(provenance).__name__} "
                         f"({_short(provenance)}), not a JSON object")
    versions = provenance.get("versions", {})
    if not isinstance(versions, dict) or not all(
            v is None or isinstance(v, str) for v in versions.values()):
        raise ValueError("'provenance' field 'versions' is not an object of version "
                         f"strings ({_short(versions)})")
    training = provenance.get("training")
    if training is not None and not (isinstance(training, list)
                                     and all(isinstance(t, str) for t in training)):
        raise ValueError("'provenance' field 'training' is not a list of strings "
                         f"({_short(training)})")
    return provenance


def _short(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(provenance):
    """One line for a summary: ``"mlem_neuro 0.x, torch 2.y (cpu), python 3.z"``."""
    if not provenance:
        return "provenance not recorded (a file written before it was)"
    versions = provenance.get("versions", {})
    device = provenance.get("device") or "cpu"
    trained = provenance.get("training")
    trained = f"; trained by {', '.join(trained)}" if trained else ""
    return (f"mlem_neuro {versions.get('mlem_neuro')}, torch {versions.get('torch')} "
            f"({device}), numpy {versions.get('numpy')}, python {provenance.get('python')} "
            f"on {provenance.get('platform')}{trained}")
