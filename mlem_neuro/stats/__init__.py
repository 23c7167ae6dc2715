"""Group-level statistics on MLEM results."""
import importlib

_LAZY = {
    "familywise_over_tests": "mlem_neuro.core.scoring.familywise",
    "permutation_cluster_test": "mlem_neuro.stats.timecourse",
    "plot_clusters": "mlem_neuro.stats.timecourse",
    "second_level_maps": "mlem_neuro.stats.maps",
}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mlem_neuro.stats' has no attribute {name!r}")
