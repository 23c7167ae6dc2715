"""The training backends behind one table (:data:`BACKENDS`) and one interface.

Each backend is a module with a ``train(data, m, fit_kw, dev, dtype, history)`` that
trains the ``data.M`` models of ``m`` features of a batch object of
:mod:`~mlem_neuro.core.training.engine` and returns a
:class:`~mlem_neuro.core.training.stackfit.StackFit` naming the backend that trained it and
the step rule it used:

* ``"compiled"`` (:mod:`~mlem_neuro.core.training.compiled`): grouped designs on the CPU in
  float32, each model to its own stop in numba kernels;
* ``"torch"`` (:mod:`~mlem_neuro.core.training.torch_loop`): any design on any device;
* ``"reference"`` (:mod:`~mlem_neuro.core.training.reference`): the training written for
  clarity with public building blocks, which the others are tested against; never
  chosen by ``"auto"``.

:func:`choose_backend` reads the table: ``"auto"`` takes the first backend that ``auto``
marks and that can train the design, a named one is taken or refused with its reason.
The names are those that :data:`mlem_neuro.core.checks.BACKENDS` accepts (the lowest layer
imports nothing, so it holds the names and this table is checked against them once, when
it is built); the option is validated there, once.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch

from ..checks import BACKENDS as _NAMES
from ..utils import logger
from . import compiled, reference, torch_loop


@dataclass(frozen=True)
class Backend:
    """One training backend: its module, read when it is used (so that a test can replace
    the module's ``train`` or ``available``).

    Attributes
    ----------
    name : str
        Its value of the ``backend`` option.
    module : module
        Its module: ``NAME`` (what results record, ``{device}`` standing for the
        device's type), ``train(data, m, fit_kw, dev, dtype, history) -> StackFit`` and,
        when it trains only some designs, ``available(data, m, dev, dtype) -> bool``.
    cannot : str
        Why it cannot train a design ``available`` refuses (completes "backend=...
        cannot train this design:").
    auto : bool
        Whether ``backend="auto"`` may pick it (in table order).
    """

    name: str
    module: ModuleType
    cannot: str = ""
    auto: bool = True

    @property
    def recorded(self):
        """What results record for it (``{device}``: the device's type)."""
        return self.module.NAME

    def record(self, dev):
        """Its recorded name on device ``dev``."""
        return self.recorded.format(device=torch.device(dev).type)

    def can_train(self, data, m, dev, dtype):
        """Whether it trains ``data``'s design for models of ``m`` features."""
        available = getattr(self.module, "available", None)
        return True if available is None else bool(available(data, m, dev, dtype))

    def train(self, data, m, fit_kw, dev, dtype, history=True):
        """Train the ``data.M`` models (the module's ``train``): a
        :class:`~mlem_neuro.core.training.stackfit.StackFit`."""
        return self.module.train(data, m, fit_kw, dev, dtype, history)


#: name -> :class:`Backend`, in the order ``"auto"`` tries them.
BACKENDS = {b.name: b for b in (
    Backend("compiled", compiled,
            "it trains grouped designs (categorical features, or numeric ones on the grid) "
            f"on the CPU in float32 with at most {compiled.MAX_FEATURES} features (and "
            "MLEM_NEURO_NO_COMPILED unset)"),
    Backend("torch", torch_loop),
    Backend("reference", reference, auto=False),
)}
if ("auto", *BACKENDS) != _NAMES:          # the option's words are the table's names
    raise RuntimeError(f"the backend table {list(BACKENDS)} and the option's words "
                       f"{_NAMES} (mlem_neuro.core.checks.BACKENDS) disagree")


def choose_backend(data, m, dev, dtype, requested="auto"):
    """The :class:`Backend` that trains ``data`` (a batch object of
    :mod:`~mlem_neuro.core.training.engine`) for models of ``m`` features: one decision,
    logged.

    ``"auto"``: the first backend of :data:`BACKENDS` that may be picked and can train the
    design (the compiled loop where it applies, else torch).  A named backend that
    cannot train the design raises a ValueError saying why.  ``requested`` is an option
    value already checked (:data:`mlem_neuro.core.checks.BACKENDS`).
    """
    if requested == "auto":
        choice = next(b for b in BACKENDS.values()
                      if b.auto and b.can_train(data, m, dev, dtype))
    else:
        choice = BACKENDS[requested]
        if not choice.can_train(data, m, dev, dtype):
            raise ValueError(f"backend={requested!r} cannot train this design: "
                             f"{choice.cannot} (here: device {torch.device(dev).type}, "
                             f"{'grouped' if data.grouped else 'per-pair'} design, {m} "
                             "features). Use backend='auto' or 'torch'.")
    logger.debug("training backend: %s (asked: %s; %d models of %d features on %s)",
                 choice.name, requested, data.M, m, torch.device(dev).type)
    return choice
