"""mlem_neuro: Metric Learning Encoding Models for neuroimaging.

MLEM learns a metric ``W`` over theoretical feature distances whose predicted distances
rank stimulus pairs as the brain's do, then measures how much each feature and each
interaction matters with permutation importance.
"""
from ._version import __version__
from .core.features import FeatureSpace
from .estimator import MLEM
from .utils import set_log_level

__all__ = ["MLEM", "FeatureSpace", "set_log_level", "__version__"]
