"""Logging, warnings, devices and random states (:mod:`mlem_neuro.core.utils`, where
they live at the bottom of the package, re-exported here for users and the top level)."""
from .core.utils import (  # noqa: F401  (the public helpers)
    check_device,
    check_random_state,
    check_real,
    logger,
    normalise_magnitude,
    renamed,
    set_log_level,
    use_log_level,
    verbose,
    warn_user,
)
