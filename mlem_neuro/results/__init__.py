"""Result containers: time courses (MEG/EEG/ECoG) and brain maps (fMRI)."""
import importlib

from ._base import RESULT_MODULES, BaseResult, read_result

__all__ = ["BaseResult", "read_result", *RESULT_MODULES]


def __getattr__(name):
    if name in RESULT_MODULES:
        return getattr(importlib.import_module(RESULT_MODULES[name]), name)
    raise AttributeError(f"module 'mlem_neuro.results' has no attribute {name!r}")
