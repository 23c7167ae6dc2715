"""What a result was computed with: versions, platform, device (``result.provenance``).

Recorded when a result is created and saved with it, so a result read back says which
software and machine made it, and what trained its models: the backends and step rules
that the fits returned (:class:`~mlem_neuro.core.training.stackfit.StackFit`), gathered
by the analysis from the values its chunks and tests return (no side channel: fits that
run in worker processes are recorded too).  A package already imported reports its own
``__version__`` (what runs, also from a source checkout or beside an older installed
copy); the others are read from the installed distributions (``importlib.metadata``),
without importing optional packages.
"""
from __future__ import annotations

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


def collect(device=None, training=None, compiled=None):
    """The provenance of a result computed now on ``device`` (a dict of JSON values).

    Keys: ``versions`` (each of :data:`PACKAGES`), ``python``, ``platform``, ``machine``,
    ``device`` (as the analysis was asked to run), ``torch_cuda`` (the CUDA version torch
    was built with, ``None`` for a CPU build), ``compiled_training`` (whether the
    package's compiled kernels, numba, were switched on: ``compiled``, the analysis's
    :attr:`~mlem_neuro.core.runtime.Runtime.compiled`, which ``MLEM_NEURO_NO_COMPILED``
    set when the analysis started switches off; ``None``: whether numba is installed, the
    default of a call outside an analysis), ``training`` (the backends that actually
    trained the analysis's models, its tests' included, e.g.
    ``["compiled loop (numba)", "torch (cpu)"]``) and
    ``step_rules`` (the step rules they trained with, ``lr="auto"`` and
    ``patience="auto"`` resolved, e.g. ``[{"lr": 0.1, "patience": 20}]``); both ``None``
    when not recorded.

    Parameters
    ----------
    device : str | torch.device | None
    training : iterable of (str, float, int) | None
        What trained the models: ``(backend, lr, patience)`` of each fit
        (:meth:`~mlem_neuro.core.training.stackfit.StackFit.trained_with`), repeats
        allowed; ``None``: not recorded.
    compiled : bool | None
        Whether the compiled kernels were on (the runtime's); ``None``: numba installed.
    """
    from .core import kernels

    torch_cuda = None
    if "torch" in sys.modules:
        torch_cuda = getattr(sys.modules["torch"].version, "cuda", None)
    used = None if training is None else {(str(b), float(lr), int(p))
                                          for b, lr, p in training}
    return dict(versions={name: _version(name) for name in PACKAGES},
                python=platform.python_version(), platform=platform.platform(),
                machine=platform.machine(),
                device=None if device is None else str(device), torch_cuda=torch_cuda,
                compiled_training=bool(kernels.built() if compiled is None
                                       else compiled and kernels.built()),
                training=None if used is None else sorted({b for b, _, _ in used}),
                step_rules=None if used is None else [
                    dict(lr=lr, patience=p) for lr, p in sorted({u[1:] for u in used})])


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
    rules = provenance.get("step_rules")
    if rules is not None and not (isinstance(rules, list) and all(
            isinstance(r, dict) and set(r) == {"lr", "patience"} for r in rules)):
        raise ValueError("'provenance' field 'step_rules' is not a list of "
                         f"{{'lr': ..., 'patience': ...}} objects ({_short(rules)})")
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
    rules = provenance.get("step_rules")
    if trained and rules:
        trained += " (" + ", ".join(f"lr {r['lr']:g}, patience {r['patience']}"
                                    for r in rules) + ")"
    return (f"mlem_neuro {versions.get('mlem_neuro')}, torch {versions.get('torch')} "
            f"({device}), numpy {versions.get('numpy')}, python {provenance.get('python')} "
            f"on {provenance.get('platform')}{trained}")
