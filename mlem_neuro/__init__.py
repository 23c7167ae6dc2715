"""mlem_neuro: Metric Learning Encoding Models for neuroimaging.

MLEM learns a metric ``W`` over theoretical feature distances whose predicted distances
rank stimulus pairs as the brain's do, then measures how much each feature and each
interaction matters with permutation importance.
"""
import importlib

from ._version import __version__
from .core.stimuli.features import FeatureSpace
from .estimator import MLEM
from .results import read_result
from .utils import set_log_level

# analyses are imported on first use (they pull in MNE / nilearn)
_LAZY = {
    "mlem_epochs": "mlem_neuro.time_resolved",
    "mlem_array": "mlem_neuro.time_resolved",
    "features_from_events": "mlem_neuro.adapters.epochs",
    "mlem_searchlight": "mlem_neuro.searchlight",
    "mlem_roi": "mlem_neuro.searchlight",
    "mlem_stcs": "mlem_neuro.spatial",
}
_SUBMODULES = ("stats", "fmri", "simulation", "results", "adapters", "crossval", "rsa",
               "bids")

__all__ = ["MLEM", "FeatureSpace", "read_result", "set_log_level", "__version__",
           *_LAZY, *_SUBMODULES]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"mlem_neuro.{name}")
    raise AttributeError(f"module 'mlem_neuro' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
