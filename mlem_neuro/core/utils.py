"""Logging, ``verbose`` handling, devices and random states shared by the package."""
from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import numbers
import os
import sys
import warnings

import numpy as np

logger = logging.getLogger("mlem_neuro")
if not logger.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR, "critical": logging.CRITICAL}


def _parse_level(verbose):
    if verbose is None:
        return None
    if isinstance(verbose, bool):
        return logging.INFO if verbose else logging.WARNING
    if isinstance(verbose, str):
        try:
            return _LEVELS[verbose.lower()]
        except KeyError:
            raise ValueError(f"verbose must be one of {sorted(_LEVELS)}, a bool, an int or "
                             f"None; got {verbose!r}") from None
    if isinstance(verbose, numbers.Integral):
        return int(verbose)
    raise TypeError(f"verbose must be a bool, str, int or None; got {type(verbose).__name__}")


def set_log_level(verbose=None):
    """Set the package's logging level (``"INFO"`` shows progress; default ``"WARNING"``)."""
    level = _parse_level(verbose)
    logger.setLevel(logging.WARNING if level is None else level)


@contextlib.contextmanager
def use_log_level(verbose):
    """Temporarily set the package's logging level (``None`` keeps the current one)."""
    level = _parse_level(verbose)
    old = logger.level
    if level is not None:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(old)


def verbose(function):
    """Decorate a function whose ``verbose`` argument sets the log level for its call."""
    sig = inspect.signature(function)
    if "verbose" not in sig.parameters:
        raise RuntimeError(f"{function.__name__} has no verbose parameter")

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        with use_log_level(bound.arguments.get("verbose")):
            return function(*args, **kwargs)

    return wrapper


def check_random_state(random_state):
    """Return a :class:`numpy.random.Generator` from None, an int or a Generator (checked
    by :data:`mlem_neuro.core.checks.CHECKS` ``["random_state"]``)."""
    from .checks import check

    random_state = check("random_state", random_state)
    if random_state is None or isinstance(random_state, (numbers.Integral, np.integer)):
        return np.random.default_rng(random_state)
    if isinstance(random_state, np.random.Generator):
        return random_state
    return np.random.default_rng(random_state.randint(0, 2**31 - 1))


def check_device(device):
    """Return a :class:`torch.device`, with a clear error when CUDA is asked for but absent
    (checked by :data:`mlem_neuro.core.checks.CHECKS` ``["device"]``)."""
    import torch

    from .checks import check

    return torch.device(check("device", device))


def renamed(**old_to_new):
    """Decorate a function (or an ``__init__``) whose parameters were renamed: each keyword
    ``old="new"`` keeps the keyword-only ``old`` working for one release, so that one name
    has one meaning across the package (``n_null`` for null permutations,
    ``random_state`` for seeds).

    A call with ``old=`` (not ``None``) alone gets a FutureWarning and runs with the value
    under ``new``; the function then sees ``old=None``.  A call that gives both names is a
    TypeError naming both, whatever the values (equal ones too, as in MNE): the call is
    read from the arguments actually passed (:meth:`inspect.Signature.bind_partial`), so
    ``new`` given at its default value counts as given, and neither name silently wins.
    """
    def decorate(function):
        sig = inspect.signature(function)
        name = function.__qualname__.removesuffix(".__init__")
        for old, new in old_to_new.items():
            if sig.parameters[old].kind is not inspect.Parameter.KEYWORD_ONLY or \
                    sig.parameters[old].default is not None or new not in sig.parameters:
                raise RuntimeError(f"{name}: the former name {old!r} must be keyword-only "
                                   f"with default None, and {new!r} a parameter")

        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            for old, new in old_to_new.items():
                if kwargs.get(old) is None:
                    continue
                given = sig.bind_partial(*args, **kwargs).arguments
                if new in given:
                    raise TypeError(f"{name}: {old}= is the former name of {new}=; give "
                                    f"{new}= only (got {old}={kwargs[old]!r} and "
                                    f"{new}={given[new]!r}).")
                warn_user(f"{name}: {old}= is renamed {new}= (one name across the package); "
                          f"{old}= will be removed in a future release.", FutureWarning)
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper
    return decorate


#: the package's folder (this module lives in its ``core``)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def warn_user(message, category=UserWarning):
    """``warnings.warn`` pointing at the first caller outside mlem_neuro (whatever path of
    public functions and wrappers led here)."""
    frame, level = sys._getframe(1), 2     # stacklevel 2: the caller of warn_user
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
            _PACKAGE_DIR + os.sep):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def check_real(values, name):
    """Refuse complex data (``values``: an array, or anything with a numpy ``dtype``):
    MLEM compares real patterns, and casting would silently drop the imaginary part."""
    dtype = values if isinstance(values, np.dtype) else getattr(values, "dtype", None)
    if dtype is None:
        dtype = np.asarray(values).dtype
    if np.issubdtype(dtype, np.complexfloating):
        raise ValueError(f"Complex data not supported: {name} holds complex values "
                         f"({dtype}); MLEM compares real "
                         "patterns, and keeping only the real part would drop the rest "
                         "silently. Pass the magnitude (np.abs(x), e.g. an amplitude "
                         "envelope) or the part you mean (x.real, x.imag) explicitly.")


def normalise_magnitude(values, name):
    """``values`` times the power of two that brings their largest magnitude to [0.5, 1)
    when it is extreme (beyond 2^±500, about 1e±150: squared distances would overflow to
    inf or underflow to 0), else ``values`` unchanged.  Exact (a power of two), so every
    distance keeps its order and ties; logged at INFO."""
    top = float(np.max(np.abs(values))) if np.size(values) else 0.0
    if top == 0 or not np.isfinite(top) or 2.0 ** -500 <= top <= 2.0 ** 500:
        return values
    exponent = int(np.frexp(top)[1])
    logger.info("%s: values up to %.3g rescaled by 2^%d (exact) so that their distances "
                "neither overflow nor underflow", name, top, -exponent)
    return np.ldexp(np.asarray(values, dtype=float), -exponent)
