"""Neural distances: one class per distance, registered in one table.

("Metric" in this package means the learnt ``W`` only; the distance between neural
patterns is a *distance*: ``distance="correlation"``.  The former names
``NeuralMetric``, ``register_metric`` and ``get_metric`` still work for a release, with a
FutureWarning.)

Every metric is a squared Euclidean distance between *preprocessed* rows, followed by a
monotone finishing map:

* ``"euclidean"``: ``||y_i - y_j||`` (rows centred over stimuli, which changes no distance
  but conditions the Gram products better; finish: square root);
* ``"cosine"``: ``1 - cos(y_i, y_j) = ||u_i - u_j||² / 2`` with ``u`` the unit-norm rows
  (finish: halve);
* ``"correlation"``: the same after centring each row over units.

A metric serves the two ways neural data reach the package
(:mod:`mlem_neuro.core.rdms.sources`):

* dense stacks ``Y`` ``(M, n_stimuli, n_units)``: :meth:`NeuralDistance.preprocess` returns
  the rows ``Z`` whose squared Euclidean distances ``d²`` the callers compute (from Gram
  products or row differences), then :meth:`NeuralDistance.finish` maps ``d²`` to distances;
* sparse memberships (spheres or regions ``A`` ``(n_models, n_units)`` over one data
  matrix ``X`` ``(n_stimuli, n_units)``): :meth:`NeuralDistance.membership_sq` returns the
  same ``d²`` for every model and a block of pairs from sparse products, without cutting
  each model's rows out, and :meth:`NeuralDistance.finish` is applied as for dense data.

Adding a metric is one subclass of :class:`NeuralDistance` decorated with
:func:`register_distance`; both sources then accept its name.  The analyses also check
``distance`` against this registry (:func:`mlem_neuro.core.options.registered_distances`).
"""
from __future__ import annotations

import numpy as np
import torch

from ..checks import DISTANCE_REGISTRY, check

#: name -> distance instance (filled by :func:`register_distance`); the dict the checks
#: read (:data:`mlem_neuro.core.checks.DISTANCE_REGISTRY`).
REGISTRY = DISTANCE_REGISTRY


def register_distance(distance_class):
    """Class decorator: add one instance of a distance class to :data:`REGISTRY`.

    It is registered under its ``name``.

    Parameters
    ----------
    distance_class : type
        A subclass of :class:`NeuralDistance` with a new, non-empty ``name``.

    Returns
    -------
    type
        ``distance_class`` itself; its name is then accepted as ``distance=`` everywhere.
    """
    cls = distance_class
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"a distance needs a new, non-empty name; got {cls.name!r}")
    REGISTRY[cls.name] = cls()
    return cls


def get_distance(name, *, extra=(), where=""):
    """The registered distance called ``name`` (a :class:`NeuralDistance` is returned as is).

    ``extra`` lists further names the caller accepts (shown in the error), ``where`` says
    where the distance is used (appended to the list of choices in the error).
    """
    if isinstance(name, NeuralDistance):
        return name
    check("distance", name, allowed=(*REGISTRY, *extra), where=where)
    return REGISTRY[name]


def _clamp0_(x):
    """``max(x, 0)`` in place (torch tensor or numpy array)."""
    return x.clamp_min_(0) if torch.is_tensor(x) else np.maximum(x, 0.0, out=x)


def _sqrt_(x):
    """Square root in place (torch tensor or numpy array).

    Each library keeps its own rounding (torch's vectorised CPU square root differs from
    numpy's by one ulp on ~1 % of values), so dense results stay torch's and sparse
    membership results numpy's, as they always were.
    """
    return x.sqrt_() if torch.is_tensor(x) else np.sqrt(x, out=x)


def _halve_(x):
    """``x / 2`` in place (exact)."""
    return x.mul_(0.5) if torch.is_tensor(x) else np.multiply(x, 0.5, out=x)


class NeuralDistance:
    """A neural distance, computed as ``finish(squared distance between rows)``.

    Subclasses set ``name`` and implement :meth:`preprocess`, :meth:`finish` and
    :meth:`membership_sq`; :meth:`membership_stats` and :meth:`membership_undefined` have
    defaults for metrics that need neither per-model sums nor a definedness check.
    """

    name = ""

    def preprocess(self, Y):
        """Rows ``Z`` (float64 tensor, same shape as ``Y`` ``(..., n_stimuli, n_units)``)
        whose squared Euclidean distances, once finished, give the metric."""
        raise NotImplementedError

    def finish(self, d2):
        """Distances from squared row distances ``d2`` (a torch tensor or numpy array the
        caller owns: it may be overwritten and returned)."""
        raise NotImplementedError

    def membership_stats(self, A, XT, sizes):
        """Per-model statistics over all stimuli that :meth:`membership_sq` needs
        (``XT``: data ``(n_units, n_stimuli)``, ``sizes``: units per model)."""

    def membership_sq(self, A, XT, i, j, sizes, stats):
        """Squared row distances ``(n_models, len(i))`` (numpy) of pairs ``(i, j)``
        (columns of ``XT``) for the models of the 0/1 membership ``A``."""
        raise NotImplementedError

    def membership_undefined(self, A, XT, sizes):
        """Boolean ``(n_models,)``: models where the metric is undefined for some stimulus
        (``None`` when it is defined everywhere)."""

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r}>"

    def __reduce__(self):       # a registered metric pickles as the registered instance
        if REGISTRY.get(self.name) is self:
            return get_distance, (self.name,)
        return type(self), ()


@register_distance
class Euclidean(NeuralDistance):
    """``||y_i - y_j||_2``."""

    name = "euclidean"

    def preprocess(self, Y):
        Y = Y.to(torch.float64)
        return Y - Y.mean(dim=-2, keepdim=True)   # shift-invariant, better conditioned Gram

    def finish(self, d2):
        return _sqrt_(_clamp0_(d2))

    def membership_sq(self, A, XT, i, j, sizes, stats):
        d = XT[:, i] - XT[:, j]
        return A @ (d * d)


class _UnitNormDistance(NeuralDistance):
    """``1 - cos`` of rows (optionally centred over units first): half the squared distance
    of the unit-norm rows.  Not registered itself; see :class:`Correlation`, :class:`Cosine`.
    """

    #: centre each row over units first (the correlation distance)
    centre_units = False

    def preprocess(self, Y):
        Y = Y.to(torch.float64)
        if self.centre_units:
            Y = Y - Y.mean(dim=-1, keepdim=True)
        norm = torch.linalg.vector_norm(Y, dim=-1, keepdim=True)
        if bool((norm == 0).any()):
            raise ValueError(f"distance={self.name!r} is undefined for a stimulus whose "
                             "response is constant across units (zero norm after centring); "
                             "use distance='euclidean'.")
        return Y / norm

    def finish(self, d2):
        return _halve_(_clamp0_(d2))

    def membership_stats(self, A, XT, sizes):
        """Per-model pattern sums ``s1`` and (centred) squared norms ``s2``, ``(S, n)``."""
        s1 = A @ XT
        s2 = A @ (XT * XT)
        if self.centre_units:
            s2 = s2 - s1 * s1 / sizes[:, None]
        return s1, s2

    def membership_sq(self, A, XT, i, j, sizes, stats):
        s1, s2 = stats
        c = A @ (XT[:, i] * XT[:, j])
        if self.centre_units:
            c -= s1[:, i] * s1[:, j] / sizes[:, None]
        # ||u_i - u_j||² = 2 (1 - cos): doubling and the finishing halving are exact
        return 2.0 * (1.0 - c / np.sqrt(s2[:, i] * s2[:, j]))

    def membership_undefined(self, A, XT, sizes):
        _, s2 = self.membership_stats(A, XT, sizes)
        scale = (A @ np.abs(XT)).max(axis=1) ** 2 + 1e-300
        return (s2 <= 1e-12 * scale[:, None]).any(axis=1)


@register_distance
class Correlation(_UnitNormDistance):
    """``1 - r(y_i, y_j)``: the cosine distance of rows centred over units."""

    name = "correlation"
    centre_units = True


@register_distance
class Cosine(_UnitNormDistance):
    """``1 - cos(y_i, y_j)``."""

    name = "cosine"


#: names of the registered metrics, in registration order.
METRICS = tuple(REGISTRY)


#: former names (one release, with a FutureWarning): "metric" now means W only
_RENAMED = {"NeuralMetric": "NeuralDistance", "register_metric": "register_distance",
            "get_metric": "get_distance"}


def __getattr__(name):
    if name in _RENAMED:
        from ..utils import warn_user

        warn_user(f"mlem_neuro.core.rdms.distances.{name} is renamed {_RENAMED[name]} (a neural "
                  f"distance is a distance; 'metric' means W); {name} will be removed in a "
                  "future release.", FutureWarning)
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
