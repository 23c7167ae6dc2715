"""numba for the kernels: the import (and its stand-in without numba), whether it is
installed (:data:`AVAILABLE`), the name of the switch ``MLEM_NEURO_NO_COMPILED`` and where
the compiled kernels are cached on disk.

Part of the bottom layer (:mod:`mlem_neuro.core.kernels`): it imports nothing of the
package.  The kernels are compiled by numba on first use and cached on disk: the first
call of a fresh install compiles them (seconds, see the performance page), later
processes load them.  The cache goes where numba puts it (``NUMBA_CACHE_DIR`` when set,
else the package's ``__pycache__`` folders, else ``~/.cache/numba``); where none of them
can be written (a shared read-only install, a read-only home), it goes to a private folder
of the user's in the temporary directory (:func:`fallback_cache_dir`, quietly: a log
message at INFO), else to a folder of the process's (the kernels then compile in every
process), else nowhere; these last two say so once, with a :class:`RuntimeWarning` at
import.  The fallback folder is numba's cache folder for the whole process, so that other
packages' cached kernels (MNE's) run there too.

Whether an analysis runs the compiled kernels is its runtime's
(:attr:`mlem_neuro.core.runtime.Runtime.compiled`, resolved once at its entry point: on
where numba is installed, off where ``MLEM_NEURO_NO_COMPILED`` is a true word, ``1``,
``true``, ``yes``, ``on``), passed down to each kernel's wrapper as ``compiled=``; off,
the callers train with torch and score in numpy instead.  Nothing here reads the variable
when the kernels run: this module only names it and parses it (:func:`env_flag`).

numba does not see a change of another file than the kernel's own when it loads a cached
kernel: a kernel and the helpers it inlines or calls live in one module.
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import stat
import tempfile
import threading
import warnings

import numpy as np

try:
    import numba
    from numba import njit, prange
except ImportError:        # numba is a dependency; without it torch trains, numpy scores
    numba = None
    prange = range

    def njit(*args, **kwargs):
        """No numba: the functions stay Python (never called: the kernels are off)."""
        return args[0] if args and callable(args[0]) else (lambda f: f)

__all__ = ["numba", "njit", "prange"]

#: the environment variable that switches the compiled kernels off
NO_COMPILED_VAR = "MLEM_NEURO_NO_COMPILED"
_TRUE_WORDS = ("1", "true", "yes", "on")
_FALSE_WORDS = ("", "0", "false", "no", "off")


def env_flag(name, environ=None):
    """The boolean environment variable ``name``: ``True`` for ``1 / true / yes / on``,
    ``False`` for ``0 / false / no / off`` or unset (any case, spaces ignored); any
    other word is a ``ValueError`` naming the variable."""
    text = (os.environ if environ is None else environ).get(name, "").strip().lower()
    if text in _TRUE_WORDS:
        return True
    if text in _FALSE_WORDS:
        return False
    raise ValueError(f"{name}={text!r} is not a yes/no word: use one of "
                     f"{', '.join(_TRUE_WORDS)} (on) or {', '.join(_FALSE_WORDS[1:])} "
                     f"(off), or unset it.")


#: whether numba is installed: a fact of the install, not a switch (whether an analysis
#: runs the compiled kernels is its runtime's, :attr:`~mlem_neuro.core.runtime.Runtime.compiled`)
AVAILABLE = numba is not None


def built():
    """Whether the compiled kernels can run: numba is installed (:data:`AVAILABLE`)."""
    return AVAILABLE


def on(compiled):
    """Whether a kernel asked to run compiled (``compiled``: the runtime's
    :attr:`~mlem_neuro.core.runtime.Runtime.compiled`) runs compiled: asked, and numba
    installed."""
    return bool(compiled) and AVAILABLE


def numba_version():
    """numba's version, ``None`` when it is not installed."""
    return None if numba is None else numba.__version__


def _f64(a):
    """``a`` as a C-contiguous float64 numpy array (no copy when it is one)."""
    return np.ascontiguousarray(a, dtype=np.float64)


# ------------------------------------------------------------- the kernels' disk cache

_CACHE_LOCK = threading.Lock()
#: where the kernels are cached: "numba" (numba's own places), a folder (the fallback,
#: numba's ``CACHE_DIR`` for the process), or None (no disk cache); decided by the first
#: kernel and kept for the others
_CACHE_PLAN = []


def fallback_cache_dir():
    """The user's private cache folder in the temporary directory
    (``<tmp>/mlem_neuro-numba-<uid>``, made with mode 0700), or ``None`` when it cannot be
    made or is not safe: not a folder of this user's, or writable by others (numba's
    cache is loaded as code, so nobody else may write there)."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    name = "mlem_neuro-numba" + ("" if uid is None else f"-{uid}")
    path = os.path.join(tempfile.gettempdir(), name)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            return None
        if uid is not None and (info.st_uid != uid
                                or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            return None
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return None
    return path


def _private_cache_dir():
    """A new private folder (mode 0700) for this process's kernels, removed at exit, or
    ``None`` when the temporary directory cannot be written."""
    try:
        path = tempfile.mkdtemp(prefix="mlem_neuro-numba-")
    except OSError:
        return None
    atexit.register(shutil.rmtree, path, True)
    return path


def _fallback_cache():
    """Where numba caches when none of its own places can be written: the user's private
    folder (:func:`fallback_cache_dir`), quietly; else a folder of this process's, with a
    warning; else nowhere, with a warning.  The folder becomes numba's ``CACHE_DIR`` for
    the whole process: other packages' kernels with ``cache=True`` (MNE's, which numba,
    a dependency of this package, switches on) would otherwise raise "cannot cache" where
    ours did.  With no folder at all MNE is told not to use numba (``MNE_USE_NUMBA``)."""
    logger = logging.getLogger("mlem_neuro")       # the package's logger (mlem_neuro.utils)
    folder = fallback_cache_dir()
    if folder is not None:
        logger.info("numba cannot write its cache next to the package or in the home "
                    "folder: the compiled kernels are cached in %s (set NUMBA_CACHE_DIR to "
                    "choose where)", folder)
    else:
        folder = _private_cache_dir()
        if folder is not None:
            warnings.warn(
                "mlem_neuro: numba cannot write its cache next to the package, in the home "
                "folder or in a private folder of yours in the temporary directory (it "
                "belongs to someone else, or others may write it): the compiled kernels "
                f"are cached in {folder} for this process only and compile in every "
                "process (seconds at its first analysis). Set NUMBA_CACHE_DIR to a "
                "writable folder to keep them.", RuntimeWarning, stacklevel=3)
    if folder is None:
        os.environ.setdefault("MNE_USE_NUMBA", "false")
        warnings.warn(
            "mlem_neuro: no writable place for numba's cache (next to the package, in the "
            "home folder or in the temporary directory): the compiled kernels compile in "
            "every process (seconds at its first analysis), and MNE is told not to use "
            "numba (MNE_USE_NUMBA=false). Set NUMBA_CACHE_DIR to a writable folder.",
            RuntimeWarning, stacklevel=3)
        return None
    numba.config.CACHE_DIR = folder      # read when each kernel's cache is located
    return folder


def _kernel(**options):
    """numba's ``njit(**options)`` with an on-disk cache where one can be written: numba's
    own places, else :func:`_fallback_cache`'s.  The first kernel decides for all."""
    def decorate(func):
        if numba is None:
            return func
        with _CACHE_LOCK:
            if not _CACHE_PLAN:
                try:
                    kernel = njit(cache=True, **options)(func)
                    _CACHE_PLAN.append("numba")
                    return kernel
                except RuntimeError as err:      # numba: "cannot cache function ..."
                    if "cannot cache" not in str(err):
                        raise
                _CACHE_PLAN.append(_fallback_cache())
            plan = _CACHE_PLAN[0]
        return njit(cache=plan is not None, **options)(func)
    return decorate


_jit = _kernel(nogil=True, error_model="numpy")
#: the step's parts, inlined into the loops that call them (no call overhead per step)
_inline = _kernel(nogil=True, error_model="numpy", inline="always")
