"""The compiled CPU kernels, in numba: grouped training one model at a time, exact scores
of importance predictions, rank sums of the fast null, pair distances and subset ranks.

**Training.**  With categorical features and full batches (every training pair each step)
a model's steps depend on that model alone: its grouped predictions, counts and target
sums; so do they with the grid of numeric distances, whose mini-batches are unions of
fixed blocks of pairs drawn at random, the same blocks for every model at a step
(:class:`~mlem_neuro.core.stimuli.quantise.GridBlocks`): every step's blocks are drawn first, from
the same stream.  :func:`train` runs each model to its own stop: the metric ``W`` from
the parameters and AdamW in float32, the predictions and the grouped soft Spearman in
float64 (a weighted pool-adjacent-violators,
:class:`~mlem_neuro.core.ranks.grouped._SoftSpearmanPAV`'s forward and backward), the
gradient by hand and the stopping rule of :mod:`mlem_neuro.core.training.engine`.
Gradient, for ``W = W0 / ‖W0‖_F`` and the term weights
``w_t = W[k_t, l_t]``, ``q = P w``: ``∂/∂W0 = (G − W ⟨G, W⟩) / ‖W0‖`` with ``G`` the
gradient scattered to ``(k_t, l_t)``; ``spd``: ``W0 = L Lᵀ``, ``∂/∂L = (G0 + G0ᵀ) L``,
strict lower part to ``A``, diagonal times ``sigmoid`` (softplus); ``diagonal``:
``W0 = diag(softplus(a))``; ``none``: ``W0 = (A + Aᵀ) / 2``.  ``tests/test_compiled.py``
compares it with torch's autograd, ``tests/test_backends.py`` with the reference backend.

The kernels are compiled by numba on first use and cached on disk: the first call of a
fresh install compiles them (seconds, see the performance page), later processes load
them.  The cache goes where numba puts it (``NUMBA_CACHE_DIR`` when set, else the
package's ``__pycache__`` folders, else ``~/.cache/numba``); where none of them can be
written (a shared read-only install, a read-only home), it goes to a private folder of
the user's in the temporary directory (:func:`fallback_cache_dir`, quietly: a log message
at INFO), else to a folder of the process's (the kernels then compile in every process),
else nowhere; these last two say so once, with a :class:`RuntimeWarning` at import.  The
fallback folder is numba's cache folder for the whole process, so that other packages'
cached kernels (MNE's) run there too.  Set ``MLEM_NEURO_NO_COMPILED``
to a true word (``1``, ``true``, ``yes``, ``on``; :data:`USE_COMPILED` to ``False``) to
train with torch and score in numpy instead.
"""
from __future__ import annotations

import atexit
import functools
import os
import shutil
import stat
import tempfile
import threading
import warnings

import numpy as np
import torch

try:
    import numba
    from numba import njit, prange
except ImportError:        # numba is a dependency; without it torch trains, numpy scores
    numba = None
    prange = range

    def njit(*args, **kwargs):
        """No numba: the functions stay Python (never called: the kernels are off)."""
        return args[0] if args and callable(args[0]) else (lambda f: f)

from ..._threads import compiled_threads
from ..constants import (
    ADAM_BETA1,
    ADAM_BETA2,
    ADAM_EPS,
    BLOCK_VAR_EPS,
    COMPILED_COUNT_CACHE,
    COMPILED_MAX_FEATURES,
    COMPILED_PARALLEL_MODELS,
    NORM_EPS,
    PREDICT_EPS,
    SOFT_RANK_STRENGTH,
)

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


#: whether the CPU uses the compiled kernels (training, scores, rank sums): numba is
#: installed and ``MLEM_NEURO_NO_COMPILED`` is not a true word.
USE_COMPILED = numba is not None and not env_flag(NO_COMPILED_VAR)

CONSTRAINT_CODES = {"spd": 0, "diagonal": 1, "none": 2}
#: the most features the compiled loop trains
MAX_FEATURES = COMPILED_MAX_FEATURES
#: models from which a stack may train on several threads
PARALLEL_MODELS = COMPILED_PARALLEL_MODELS
_SPD, _DIAGONAL, _NONE = CONSTRAINT_CODES.values()
_EPS = NORM_EPS
_Q_EPS = PREDICT_EPS
_F0 = np.float32(0.0)
_F_HALF = np.float32(0.5)
_F_TWENTY = np.float32(20.0)            # torch's softplus threshold (x itself above it)
_F_NORM_EPS = np.float32(NORM_EPS)
_B1 = np.float32(ADAM_BETA1)
_B2 = np.float32(ADAM_BETA2)
_ONE_B1 = np.float32(1.0 - ADAM_BETA1)
_ONE_B2 = np.float32(1.0 - ADAM_BETA2)
_ADAM_EPS = np.float32(ADAM_EPS)
_TOP = np.uint64(1) << np.uint64(63)
_ONE = np.uint64(1)
_INT64_MIN = np.int64(-(2 ** 63))

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
    from ...utils import logger

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


def built():
    """Whether the compiled kernels are in use: numba is installed and
    :data:`USE_COMPILED` is on."""
    return USE_COMPILED


def available(data, m, dev, dtype):
    """Whether :func:`train` runs ``data``'s steps: grouped full batches, or the grid's
    mini-batches of blocks, on the CPU in float32, with 1 to :data:`MAX_FEATURES`
    features and :data:`USE_COMPILED` set (without numba: a warning, once)."""
    applies = (dev.type == "cpu" and dtype == torch.float32 and data.grouped
               and (data.full or getattr(data, "blocks", None) is not None)
               and 1 <= m <= MAX_FEATURES)
    if applies and numba is None:
        _warn_no_numba()
    return USE_COMPILED and applies


@functools.lru_cache(maxsize=None)
def _warn_no_numba():
    warnings.warn("numba is not installed: the CPU trains categorical designs with torch "
                  "(several times slower; the same models). Install numba (a dependency "
                  "of mlem_neuro) for the compiled loop.", RuntimeWarning, stacklevel=4)


# ---------------------------------------------------------------------------- training

@_inline
def _softplus(x):
    # torch's softplus (beta 1, threshold 20), in float32
    if x > _F_TWENTY:
        return x
    return np.log1p(np.exp(min(x, _F_TWENTY)))


@_inline
def _sigmoid(x):
    return np.float32(1.0 / (1.0 + np.exp(-np.float64(x))))


# rows of the float64 workspace (U + 1 columns each)
(_XHAT, _S, _CS, _Y, _V, _WV, _T, _RC, _GR, _GS, _GP, _CC, _TC, _KEY, _PRED,
 _DPRED) = range(16)
_N_FLOAT_ROWS = 16
# rows of the int64 workspace (U + 1 columns each)
_ORDER, _BSTART, _PIDX, _POS, _OFULL = range(5)
_N_INT_ROWS = 5


@_jit
def _block_batch(i, step, new_model, draws, Cb, Tb, S1, S2, cached, counts_all, done, total,
                 part, out, F, I):
    """The batch of model ``i`` at a step on the grid's blocks: compact counts
    (``F[_CC]``) and standardised target sums (``F[_TC]``) of the present groups
    (``quantise._BlockTargets.draw``, then the groups with a positive count, listed in
    ``I[_PIDX]``, ``I[_POS]``).  A group's sum over the drawn blocks is taken over the
    fewer of the drawn blocks and the blocks left out (then subtracted from its total over
    all blocks).  The step's counts are computed by the first model to reach it and kept
    when ``cached``.  Returns ``(b, present groups)``."""
    U, K = Cb.shape
    nb = draws.shape[1]
    row = step if cached else 0
    if not cached or not done[step]:
        for u in range(U):
            acc = 0.0
            for j in range(nb):
                acc += Cb[u, draws[step, j]]
            counts_all[row, u] = acc
        if cached:
            done[step] = 1
    if new_model:
        for u in range(U):
            total[u] = 0.0
        for r in range(K):
            for u in range(U):
                total[u] += Tb[i, r, u]
    b = 0.0
    for u in range(U):
        b += counts_all[row, u]
    s1 = 0.0
    s2 = 0.0
    for j in range(nb):
        s1 += S1[i, draws[step, j]]
        s2 += S2[i, draws[step, j]]
    mean = s1 / b
    var = s2 - b * mean * mean
    norm = np.sqrt(var if var > BLOCK_VAR_EPS else BLOCK_VAR_EPS)
    Up = 0
    for u in range(U):
        if counts_all[row, u] > 0.0:
            I[_PIDX, Up] = u
            I[_POS, u] = Up
            Up += 1
        else:
            I[_POS, u] = -1
    use_out = 2 * nb > K
    n_sel = nb
    if use_out:
        mask = np.uint64(0)
        for j in range(nb):
            mask |= _ONE << np.uint64(draws[step, j])
        n_sel = 0
        for r in range(K):
            if not ((mask >> np.uint64(r)) & _ONE):
                out[n_sel] = r
                n_sel += 1
    for u in range(U):
        part[u] = 0.0
    for r in range(n_sel):
        blk = out[r] if use_out else draws[step, r]
        for u in range(U):
            part[u] += Tb[i, blk, u]
    inv_norm = 1.0 / norm
    for j in range(Up):
        g = I[_PIDX, j]
        tt = total[g] - part[g] if use_out else part[g]
        F[_CC, j] = counts_all[row, g]
        F[_TC, j] = (tt - counts_all[row, g] * mean) * inv_norm
    return b, Up


@_jit
def _train_models(A, k, l, dense, P, rowptr, col, val, counts, targets, use_blocks, draws,
                  Cb, Tb, S1, S2, constraint, strength, tol, patience, corr, n_iter,
                  converged, best_score, history, keep_history, first_rho, first_grad):
    """Train the models of ``A (M, m, m)`` (float32; the start, overwritten by the best
    state seen), each to its own stop.  Full batches: ``counts (1 or M, U)``, ``targets
    (M, U)``; blocks (``use_blocks``): ``draws (max_steps, nb)``, ``Cb (U, K)``, ``Tb (M,
    K, U)``, ``S1``, ``S2 (M, K)``.  ``corr (max_steps, 2)``: AdamW's bias corrections.
    ``first_rho (M,)`` and ``first_grad (M, m, m)`` (or empty) get each model's first
    soft Spearman and gradient (for tests).

    One step, in order: the metric ``W`` (float32), the predictions of the present
    groups, their soft Spearman (standardise, sort from the previous order, a weighted
    pool-adjacent-violators, centre and normalise the soft ranks) and its gradient back
    to the parameters, the stopping rule and AdamW.  The step is written out in this one
    function: a helper taking arrays costs numba two atomic reference counts per array
    and call, which doubled the cost of a step of few groups."""
    M, m = A.shape[0], A.shape[1]
    T = k.shape[0]
    U = rowptr.shape[0] - 1
    max_steps = corr.shape[0]
    keep_first = first_rho.shape[0] > 0
    L = np.zeros((m, m), np.float32)
    W = np.zeros((m, m), np.float32)
    G = np.zeros((m, m), np.float32)
    G0 = np.zeros((m, m), np.float32)
    cur = np.zeros((m, m), np.float32)
    mom = np.zeros((m, m), np.float32)
    vel = np.zeros((m, m), np.float32)
    grad = np.zeros((m, m), np.float32)
    tw = np.zeros(T + 1)
    F = np.zeros((_N_FLOAT_ROWS, U + 1))
    I = np.zeros((_N_INT_ROWS, U + 1), np.int64)
    # the workspace's rows, bound once (a row taken inside the loop costs numba a
    # reference count per step)
    f_xhat, f_s, f_cs, f_y, f_v, f_wv, f_t, f_rc = (
        F[_XHAT], F[_S], F[_CS], F[_Y], F[_V], F[_WV], F[_T], F[_RC])
    f_gr, f_gs, f_gp, f_cc, f_tc, f_key, f_pred, f_dpred = (
        F[_GR], F[_GS], F[_GP], F[_CC], F[_TC], F[_KEY], F[_PRED], F[_DPRED])
    i_order, i_bstart, i_pidx, i_pos, i_ofull = (
        I[_ORDER], I[_BSTART], I[_PIDX], I[_POS], I[_OFULL])
    ftol = np.float32(tol)
    if use_blocks:
        cached = max_steps * U <= COMPILED_COUNT_CACHE   # the steps' counts, kept
        counts_all = np.zeros((max_steps if cached else 1, U))
        done = np.zeros(max_steps if cached else 1, np.uint8)
        total = np.zeros(U)
        part = np.zeros(U)
        out = np.zeros(Cb.shape[1] + 1, np.int64)
    for i in range(M):
        b = 0.0
        Up = U
        if not use_blocks:                           # full batch: every group, each step
            ci = i if counts.shape[0] > 1 else 0
            for u in range(U):
                f_cc[u] = counts[ci, u]
                f_tc[u] = targets[i, u]
                b += counts[ci, u]
                i_pidx[u] = u
                i_pos[u] = u
        for u in range(U):
            i_ofull[u] = u                         # a model's first sort: group order
        for a in range(m):
            for e in range(m):
                cur[a, e] = A[i, a, e]
                mom[a, e] = _F0
                vel[a, e] = _F0
        best = np.float32(-np.inf)
        ref = np.float32(-np.inf)
        since = 0
        n = 0
        for step in range(max_steps):
            if use_blocks:
                b, Up = _block_batch(i, step, step == 0, draws, Cb, Tb, S1, S2, cached,
                                     counts_all, done, total, part, out, F, I)
            # -- the metric W (float32, Frobenius-normalised) and the norm of W0
            if constraint == _SPD:
                for a in range(m):
                    for e in range(m):
                        if e < a:
                            L[a, e] = cur[a, e]
                        elif e == a:
                            L[a, e] = _softplus(cur[a, a])
                        else:
                            L[a, e] = _F0
                for a in range(m):
                    for e in range(m):
                        acc = _F0
                        for r in range(min(a, e) + 1):
                            acc += L[a, r] * L[e, r]
                        W[a, e] = acc
            elif constraint == _DIAGONAL:
                for a in range(m):
                    for e in range(m):
                        W[a, e] = _F0
                    W[a, a] = _softplus(cur[a, a])
            else:
                for a in range(m):
                    for e in range(m):
                        W[a, e] = _F_HALF * (cur[a, e] + cur[e, a])
            ss32 = _F0
            for a in range(m):
                for e in range(m):
                    ss32 += W[a, e] * W[a, e]
            norm = np.sqrt(ss32)
            dnorm = norm if norm > _F_NORM_EPS else _F_NORM_EPS
            for a in range(m):
                for e in range(m):
                    W[a, e] /= dnorm
            # -- predictions of the present groups (sparse rows: the same sums)
            for t in range(T):
                tw[t] = np.float64(W[k[t], l[t]])
            for u in range(Up):
                q = 0.0
                row = i_pidx[u]
                if dense:
                    for t in range(T):
                        q += tw[t] * P[row, t]
                else:
                    for e in range(rowptr[row], rowptr[row + 1]):
                        q += tw[col[e]] * val[e]
                if constraint == _NONE:
                    aq = abs(q)
                    root = np.sqrt(aq + _Q_EPS)
                    f_pred[u] = q / root
                    f_dpred[u] = (0.5 * aq + _Q_EPS) / (root * root * root)
                else:
                    pr = np.sqrt(q if q > _Q_EPS else _Q_EPS)
                    f_pred[u] = pr
                    f_dpred[u] = 0.5 / pr if q >= _Q_EPS else 0.0
            # -- soft Spearman of the predictions (F[_CC] counts, F[_TC] target sums)
            mean = 0.0
            for u in range(Up):
                mean += f_pred[u] * f_cc[u]
            mean /= b
            ss = 0.0
            for u in range(Up):
                x = f_pred[u] - mean
                f_xhat[u] = x
                ss += x * x * f_cc[u]
            sigma = np.sqrt(ss if ss > _EPS * _EPS else _EPS * _EPS)
            inv_sigma = 1.0 / sigma
            for u in range(Up):
                f_xhat[u] *= inv_sigma
            kappa = np.sqrt(b) * b / np.sqrt(12.0) / strength
            # order: decreasing xhat, by insertion sort from the model's previous order of
            # the present groups (predictions move little between steps: nearly sorted)
            j = 0
            for a in range(U):
                cc = i_pos[i_ofull[a]]
                if cc >= 0:
                    i_order[j] = cc
                    f_key[j] = f_xhat[cc]
                    j += 1
            for a in range(1, Up):
                cur_o = i_order[a]
                kc = f_key[a]
                j = a
                while j > 0 and f_key[j - 1] < kc:
                    i_order[j] = i_order[j - 1]
                    f_key[j] = f_key[j - 1]
                    j -= 1
                i_order[j] = cur_o
                f_key[j] = kc
            j = 0
            for a in range(U):
                if i_pos[i_ofull[a]] >= 0:
                    i_ofull[a] = i_pidx[i_order[j]]
                    j += 1
            start = 0.0
            tsum_all = 0.0
            for a in range(Up):
                o = i_order[a]
                ca = f_cc[o]
                f_s[a] = kappa * f_xhat[o]
                f_cs[a] = ca
                f_y[a] = f_s[a] - (b - start - (ca - 1.0) / 2.0)
                f_t[a] = f_tc[o]
                tsum_all += f_t[a]
                start += ca
            # weighted pool-adjacent-violators, non-increasing, of F[_Y] with weights
            # F[_CS]: blocks hold their weighted sums and weights, compared by
            # cross-multiplication (weights are positive), so no merge divides
            nb = 0
            for a in range(Up):
                f_v[nb] = f_cs[a] * f_y[a]
                f_wv[nb] = f_cs[a]
                i_bstart[nb] = a
                nb += 1
                while nb > 1 and f_v[nb - 2] * f_wv[nb - 1] < f_v[nb - 1] * f_wv[nb - 2]:
                    f_v[nb - 2] += f_v[nb - 1]
                    f_wv[nb - 2] += f_wv[nb - 1]
                    nb -= 1
            for a in range(nb):
                f_v[a] /= f_wv[a]
            i_bstart[nb] = Up
            rsum = 0.0
            for jb in range(nb):
                for a in range(i_bstart[jb], i_bstart[jb + 1]):
                    f_rc[a] = f_s[a] - f_v[jb]              # sorted soft ranks
                    rsum += f_rc[a] * f_cs[a]
            nr = 0.0
            for a in range(Up):
                f_rc[a] -= rsum / b
                nr += f_cs[a] * f_rc[a] * f_rc[a]
            nr = np.sqrt(nr if nr > _EPS * _EPS else _EPS * _EPS)
            rho = 0.0
            inv_nr = 1.0 / nr
            for a in range(Up):
                f_rc[a] *= inv_nr
                rho += f_rc[a] * f_t[a]
            # -- backward: d rho / d predictions
            for a in range(Up):
                f_gr[a] = (f_t[a] - f_cs[a] * (tsum_all / b)
                             - f_cs[a] * f_rc[a] * rho) * inv_nr
            for jb in range(nb):
                gsum = 0.0
                csum = 0.0
                for a in range(i_bstart[jb], i_bstart[jb + 1]):
                    gsum += f_gr[a]
                    csum += f_cs[a]
                for a in range(i_bstart[jb], i_bstart[jb + 1]):
                    f_gs[i_order[a]] = (f_gr[a] - f_cs[a] * (gsum / csum)) * kappa
            gsum = 0.0
            gdot = 0.0
            for u in range(Up):
                gsum += f_gs[u]
                gdot += f_gs[u] * f_xhat[u]
            for u in range(Up):
                f_gp[u] = (f_gs[u] - f_cc[u] * (gsum / b)
                             - f_cc[u] * f_xhat[u] * gdot) * inv_sigma
            # -- back to the term weights, W0 and the parameters
            for a in range(m):
                for e in range(m):
                    G[a, e] = _F0
            for t in range(T):
                tw[t] = 0.0
            for u in range(Up):
                g = f_gp[u] * f_dpred[u]
                row = i_pidx[u]
                if dense:
                    for t in range(T):
                        tw[t] += g * P[row, t]
                else:
                    for e in range(rowptr[row], rowptr[row + 1]):
                        tw[col[e]] += g * val[e]
            for t in range(T):
                G[k[t], l[t]] = np.float32(tw[t])
            gdotw = _F0
            for a in range(m):
                for e in range(m):
                    gdotw += G[a, e] * W[a, e]
            for a in range(m):
                for e in range(m):
                    G0[a, e] = (G[a, e] - W[a, e] * gdotw) / dnorm
            for a in range(m):
                for e in range(m):
                    grad[a, e] = _F0
            if constraint == _SPD:
                for a in range(m):
                    for e in range(a + 1):
                        acc = _F0
                        for r in range(m):
                            acc += (G0[a, r] + G0[r, a]) * L[r, e]
                        grad[a, e] = acc * _sigmoid(cur[a, a]) if a == e else acc
            elif constraint == _DIAGONAL:
                for a in range(m):
                    grad[a, a] = G0[a, a] * _sigmoid(cur[a, a])
            else:
                for a in range(m):
                    for e in range(m):
                        grad[a, e] = _F_HALF * (G0[a, e] + G0[e, a])
            if keep_first and step == 0:
                first_rho[i] = rho
                for a in range(m):
                    for e in range(m):
                        first_grad[i, a, e] = grad[a, e]
            # -- the stopping rule (engine._EarlyStopping) and AdamW
            rf = np.float32(rho)
            if rf > best:
                for a in range(m):
                    for e in range(m):
                        A[i, a, e] = cur[a, e]
                best = rf
            if rf > ref + ftol:
                ref = rf
                since = 0
            else:
                since += 1
            n += 1
            if keep_history:
                history[i, step] = rf
            bc2 = corr[step, 0]
            step_size = corr[step, 1]
            for a in range(m):
                for e in range(m):
                    g32 = -grad[a, e]
                    mom[a, e] = mom[a, e] * _B1 + _ONE_B1 * g32
                    vel[a, e] = vel[a, e] * _B2 + _ONE_B2 * g32 * g32
                    denom = np.sqrt(vel[a, e]) / bc2 + _ADAM_EPS
                    cur[a, e] = cur[a, e] - step_size * mom[a, e] / denom
            if since >= patience:
                break
        if keep_history:
            for step in range(n, max_steps):
                history[i, step] = np.float32(np.nan)
        n_iter[i] = n
        converged[i] = since >= patience
        best_score[i] = np.float64(best)


@_kernel(nogil=True, error_model="numpy", parallel=True)
def _train_models_parallel(n_chunks, A, k, l, dense, P, rowptr, col, val, counts, targets,
                           use_blocks, draws, Cb, Tb, S1, S2, constraint, strength, tol,
                           patience, corr, n_iter, converged, best_score, history,
                           keep_history, first_rho, first_grad):
    """:func:`_train_models` on ``n_chunks`` chunks of the models, in parallel (numba's
    ``prange``): each model's steps depend on that model alone, so the fits are those of
    one thread, bit for bit."""
    M = A.shape[0]
    for c in prange(n_chunks):
        s = c * M // n_chunks
        e = (c + 1) * M // n_chunks
        # the per-model arrays are cut to the chunk; shared (or placeholder) ones are not
        _train_models(A[s:e], k, l, dense, P, rowptr, col, val, _rows(counts, s, e, M),
                      _rows(targets, s, e, M), use_blocks, draws, Cb, _rows(Tb, s, e, M),
                      _rows(S1, s, e, M), _rows(S2, s, e, M), constraint, strength, tol,
                      patience, corr, n_iter[s:e], converged[s:e], best_score[s:e],
                      _rows(history, s, e, M) if keep_history else history, keep_history,
                      _rows(first_rho, s, e, M), _rows(first_grad, s, e, M))


@_inline
def _rows(x, s, e, M):
    """Rows ``s:e`` of a per-model array (``M`` rows), else all of ``x``."""
    return x[s:e] if x.shape[0] == M else x[0:x.shape[0]]


def threads_for(M):
    """Threads the compiled loop trains ``M`` models with: what the package's thread
    policy gives the worker (:func:`mlem_neuro._threads.compiled_threads`: its cores,
    capped by ``MLEM_NEURO_NUM_THREADS``; one outside an analysis), at most one per model,
    and one outside the main thread (numba's thread pool is not entered from two
    threads at once: joblib's threading backend and dask run chunks in threads) or for
    fewer than :data:`~mlem_neuro.core.constants.COMPILED_PARALLEL_MODELS` models."""
    if (numba is None or threading.current_thread() is not threading.main_thread()
            or M < PARALLEL_MODELS):
        return 1
    return max(1, min(compiled_threads(), numba.config.NUMBA_NUM_THREADS, M))


def _run(*args):
    """:func:`_train_models` (``args``), on :func:`threads_for` threads."""
    M = args[0].shape[0]
    threads = threads_for(M)
    if threads == 1:
        return _train_models(*args)
    old = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        # several chunks a thread: models stop at different steps
        _train_models_parallel(min(M, 4 * threads), *args)
    finally:
        numba.set_num_threads(old)


def _sparse_rows(P):
    """The term rows ``P (U, T)`` as sparse rows (their nonzero terms, in term order):
    with categorical features most terms of a row are 0 (a pair differs in few features),
    and skipping them leaves every sum unchanged (adding ``0 * x`` is exact for finite
    ``x``).  Returns ``(dense, rowptr, col, val)``."""
    nz = P != 0.0
    rowptr = np.zeros(P.shape[0] + 1, dtype=np.int64)
    np.cumsum(nz.sum(axis=1), out=rowptr[1:])
    rows, col = np.nonzero(nz)
    return (bool(nz.all()), rowptr.astype(np.uint64), col.astype(np.uint64),
            P[rows, col].astype(np.float64))


def _corrections(lr, max_steps):
    """AdamW's bias corrections of each step, float32 of float64 values: ``(sqrt(1 −
    β2^t), lr / (1 − β1^t))``."""
    t = np.arange(1, max(max_steps, 1) + 1, dtype=np.float64)
    corr = np.stack([np.sqrt(1.0 - ADAM_BETA2 ** t), lr / (1.0 - ADAM_BETA1 ** t)], axis=1)
    return np.ascontiguousarray(corr[:max_steps], dtype=np.float32)


_NO_BLOCKS = (np.zeros((1, 1), np.int64), np.zeros((1, 1)), np.zeros((1, 1, 1)),
              np.zeros((1, 1)), np.zeros((1, 1)))


def _f64(a):
    return np.ascontiguousarray(a, dtype=np.float64)


def value_and_grad(A, constraint, k, l, P, counts, targets, strength):
    """The first step of :func:`train` (for tests): soft Spearman ``(M,)`` and gradient
    ``(M, m, m)`` (float32) of models ``A`` on a grouped batch: ``P (U, T)`` term rows,
    ``counts (U,)`` or ``(M, U)``, ``targets (M, U)``."""
    A = np.array(A, dtype=np.float32, order="C")
    M = A.shape[0]
    P = _f64(P)
    U = P.shape[0]
    counts = _f64(counts).reshape(-1, U)
    targets = _f64(np.broadcast_to(targets, (M, U)))
    k = np.ascontiguousarray(k, dtype=np.int64)
    l = np.ascontiguousarray(l, dtype=np.int64)
    rho = np.empty(M)
    grad = np.empty_like(A)
    dense, rowptr, col, val = _sparse_rows(P)
    _train_models(A, k, l, dense, P, rowptr, col, val, counts, targets, False, *_NO_BLOCKS,
                  CONSTRAINT_CODES[constraint], float(strength), 0.0, 1, _corrections(1e-3, 1),
                  np.zeros(M, np.int64), np.zeros(M, np.bool_), np.zeros(M),
                  np.zeros((1, 1), np.float32), False, rho, grad)
    return rho, grad


def train(data, m, fit_kw, dev, dtype, history=True):
    """:func:`mlem_neuro.core.training.engine._train` for grouped designs on the CPU, compiled;
    returns the same :class:`~mlem_neuro.core.training.stackfit.StackFit`."""
    from .metric import init_params, make_W
    from .stackfit import StackFit

    constraint = fit_kw["constraint"]
    M = int(data.M)
    A = np.ascontiguousarray(init_params(M, m, constraint, dev, dtype).numpy(),
                             dtype=np.float32)
    n_iter = np.zeros(M, dtype=np.int64)
    converged = np.zeros(M, dtype=np.bool_)
    best = np.full(M, -np.inf)
    max_steps = int(fit_kw["max_steps"])
    hist = np.empty((M, max_steps) if history else (1, 1), dtype=np.float32)
    if M:
        k = np.ascontiguousarray(np.asarray(data.k), dtype=np.int64)
        l = np.ascontiguousarray(np.asarray(data.l), dtype=np.int64)
        corr = _corrections(float(fit_kw["lr"]), max_steps)
        common = (CONSTRAINT_CODES[constraint], float(SOFT_RANK_STRENGTH),
                  float(fit_kw["tol"]), int(fit_kw["patience"]), corr, n_iter, converged,
                  best, hist, bool(history), np.zeros(0), np.zeros((0, m, m), np.float32))
        if data.full:
            P, counts, targets = data.numpy_batch()
            P, targets = _f64(P), _f64(targets)
            U = P.shape[0]
            counts = _f64(counts).reshape(-1, U)
            if targets.shape != (M, U) or counts.shape[0] not in (1, M):
                raise RuntimeError(f"compiled: unexpected batch shapes {P.shape}, "
                                   f"{counts.shape}, {targets.shape} for {M} models")
            dense, rowptr, col, val = _sparse_rows(P)
            _run(A, k, l, dense, P, rowptr, col, val, counts, targets, False, *_NO_BLOCKS,
                 *common)
        else:
            _train_blocks(data, A, k, l, max_steps, n_iter, common)
    with torch.no_grad():
        W = make_W(torch.from_numpy(A), constraint)
    if history:
        hist = hist[:, :int(n_iter.max()) if M else 0].astype(np.float64)
    return StackFit(W=W.double().numpy(), n_iter=n_iter, converged=converged,
                    history=hist if history else None, best_score=best,
                    batch_size=int(data.b), full_batch=bool(data.full))


def _train_blocks(data, A, k, l, max_steps, n_iter, common):
    """The grid's mini-batches of blocks (:class:`~mlem_neuro.core.stimuli.quantise.GridBlocks`):
    every step's blocks are drawn before training, from the stream the torch loop draws
    them from; the stream is then left where that loop leaves it (one draw per step of
    the longest-training model)."""
    bt = data.blocks
    grid = bt.blocks
    M = A.shape[0]
    P = _f64(data.P_uniq.numpy())
    U = P.shape[0]
    Cb = _f64(grid.C.cpu().numpy())
    Tb = _f64(bt.T.cpu().numpy().transpose(0, 2, 1))
    S1 = _f64(bt.S1.cpu().numpy())
    S2 = _f64(bt.S2.cpu().numpy())
    K = Cb.shape[1]
    if Cb.shape[0] != U or Tb.shape != (M, K, U) or S1.shape != (M, K) or K > 64:
        raise RuntimeError(f"compiled: unexpected block tables {Cb.shape}, {Tb.shape}, "
                           f"{S1.shape} for {M} models and {U} groups")
    rng = bt.rng
    state = rng.bit_generator.state
    draws = np.ascontiguousarray(grid.draw_blocks(rng, max_steps), dtype=np.int64)
    dense, rowptr, col, val = _sparse_rows(P)
    _run(A, k, l, dense, P, rowptr, col, val, np.zeros((1, U)), np.zeros((1, U)), True,
         draws, Cb, Tb, S1, S2, *common)
    rng.bit_generator.state = state
    grid.draw_blocks(rng, int(n_iter.max()))


# ---------------------------------------------------------------------- exact scores

@_jit
def _packed_keys_kernel(x, bits, keys):
    """Each value of ``x (R, n)`` as a 64-bit key whose signed order is the value's order,
    with its low ``bits`` bits replaced by the value's index in its row.  Returns 1 (and
    stops) at a value that is not finite, else 0."""
    R, n = x.shape
    low = (_ONE << np.uint64(bits)) - _ONE
    ux = x.view(np.uint64)
    uk = keys.view(np.uint64)
    for r in range(R):
        for i in range(n):
            if not np.isfinite(x[r, i]):
                return 1
            u = ux[r, i]
            u = ~u if (u & _TOP) else (u | _TOP)           # unsigned order = value order
            u = (u & ~low) | np.uint64(i)
            uk[r, i] = u ^ _TOP                            # signed order = unsigned order
    return 0


@_jit
def _feature_keys_kernel(A, B, Wff, d, bits, q, keys):
    """``q[m, r, p] = A[m, p] + d[r, p] (2 B[m, p] + Wff[m] d[r, p])`` and its packed keys
    (rows ``m * R + r``).  Returns 1 at a value that is not finite, else 0."""
    M, n = A.shape
    R = d.shape[0]
    low = (_ONE << np.uint64(bits)) - _ONE
    uk = keys.view(np.uint64)
    uq = q.view(np.uint64)
    for m in range(M):
        w = Wff[m]
        for r in range(R):
            row = m * R + r
            for i in range(n):
                x = A[m, i] + d[r, i] * (2.0 * B[m, i] + w * d[r, i])
                if not np.isfinite(x):
                    return 1
                q[row, i] = x
                u = uq[row, i]
                u = ~u if (u & _TOP) else (u | _TOP)
                u = (u & ~low) | np.uint64(i)
                uk[row, i] = u ^ _TOP
    return 0


@_inline
def _order_flag(x, prev):
    """Of a sorted row's value ``x`` after ``prev``: 1 when out of order (values that
    differ only in the packed keys' dropped bits), 2 when equal (ranks to average)."""
    if x < prev:
        return 1
    if x == prev:
        return 2
    return 0


@_jit
def _sorted_scores_kernel(q, keys, bits, tz, tz_div, c, rho, flags):
    """After each row of keys is sorted: ``rho[r] = Σ_pos c[pos] tz[r // tz_div][order]``;
    ``flags[r]`` bit 1: the row is not in order (values that differ only in the dropped
    bits), bit 2: it holds equal values (ranks to average)."""
    R, n = q.shape
    mask = (1 << bits) - 1
    for r in range(R):
        t = tz[r // tz_div]
        acc = 0.0
        prev = -np.inf
        flag = 0
        for p in range(n):
            idx = keys[r, p] & mask
            x = q[r, idx]
            flag |= _order_flag(x, prev)
            prev = x
            acc += c[p] * t[idx]
        rho[r] = acc
        flags[r] = flag


def _packed_keys(x):
    """``(keys, bits)``: each value of the rows of ``x`` (float64, C-contiguous) as an
    integer key of its order with its index in the low ``bits`` bits, or ``None`` when a
    value is not finite."""
    R, n = x.shape
    bits = max(int(n - 1).bit_length(), 1)
    keys = np.empty((R, n), dtype=np.int64)
    if _packed_keys_kernel(x, bits, keys):
        return None
    return keys, bits


def sorted_scores(q, tz, tz_div):
    """Spearman of the rows of ``q (R, n)`` (float64, C-contiguous numpy) against the
    standardised target ranks ``tz (R // tz_div, n)`` (row ``r`` against ``tz[r //
    tz_div]``), for rows without ties; ``None`` when :data:`USE_COMPILED` is off or ``q``
    holds a value that is not finite.

    Returns ``(rho (R,), redo (R,) bool)``: ``redo`` marks the rows whose score the caller
    must compute another way (ties, whose ranks are averaged, or values too close for the
    packed keys).  The sort is numpy's, of integer keys that pack each value's order with
    its index.
    """
    packed = _packed_keys(q) if USE_COMPILED else None
    if packed is None:
        return None
    return _finish(q, *packed, tz, tz_div)


def feature_scores(A, B, Wff, d):
    """Predictions of feature importance and their packed keys, computed together:
    ``q[m, r] = A[m] + d[r] * (2 B[m] + Wff[m] d[r])`` for ``A, B (M, n)``, ``Wff (M,)``
    and the permuted distances ``d (R, n)`` (float64, C-contiguous numpy).  Returns the
    function that scores them (``tz (M, n)`` → ``(rho (M * R,), redo)``, as
    :func:`sorted_scores`) and ``q (M * R, n)``, or ``None`` (:data:`USE_COMPILED` off,
    or a value not finite)."""
    if not USE_COMPILED:
        return None
    (M, n), R = A.shape, d.shape[0]
    bits = max(int(n - 1).bit_length(), 1)
    q = np.empty((M * R, n))
    keys = np.empty((M * R, n), dtype=np.int64)
    if _feature_keys_kernel(A, B, np.ascontiguousarray(Wff, dtype=np.float64), d, bits, q,
                            keys):
        return None
    return (lambda tz: _finish(q, keys, bits, tz, R)), q


def _finish(q, keys, bits, tz, tz_div):
    """Sort the packed keys and score the rows (:func:`sorted_scores`)."""
    R, n = q.shape
    keys.sort(axis=-1)
    c = np.arange(1, n + 1, dtype=np.float64)
    c -= c.mean()
    c /= max(np.linalg.norm(c), 1e-12)
    rho = np.empty(R)
    flags = np.empty(R, dtype=np.uint8)
    _sorted_scores_kernel(q, keys, bits, _f64(tz), int(tz_div), c, rho, flags)
    return rho, flags != 0


# ------------------------------------------------------------- rank sums of the null

@_jit
def _rank_walk_kernel(x, keys, bits, J, U, labels, rsum, flags):
    """Rank sums of sets of pairs from one sort per row (keys sorted): per channel, row and
    label ``j * U + g`` the sum of the ranks of the set's pairs within their set; a pair
    labelled ``J * U`` is in none of the channel's sets (it adds to a spare)."""
    R, P = x.shape
    C = labels.shape[1]
    mask = (1 << bits) - 1
    Lb = J * U
    V = Lb + 1
    count = np.zeros((C, J + 1), np.int64)
    acc = np.zeros((C, V))
    set_of = np.empty(V, np.int64)
    for code in range(V):
        set_of[code] = code // (U if U > 0 else 1)
    for r in range(R):
        prev_hi = _INT64_MIN
        prev_idx = 0
        flag = 0
        count[:] = 0
        acc[:] = 0.0
        for p in range(P):
            kp = keys[r, p]
            idx = kp & mask
            hi = kp >> bits
            if hi == prev_hi:        # same kept bits: only the values can tell the order
                flag |= _order_flag(x[r, idx], x[r, prev_idx])
            prev_hi = hi
            prev_idx = idx
            for c in range(C):
                code = np.int64(labels[idx, c])
                s = set_of[code]
                count[c, s] += 1
                acc[c, code] += np.float64(count[c, s])
        for c in range(C):
            for e in range(Lb):
                rsum[c, r, e] = acc[c, e]
        flags[r] = flag


def rank_walk(D, labels, J, U):
    """Rank sums of sets of pairs within each set, from one sort of each row of ``D (R,
    P)`` (float64, C-contiguous numpy) for all sets.  The sets come in ``C`` channels of
    up to ``J`` sets that share no pair: ``labels (C, P)`` holds ``j * U + g`` for a pair of
    the channel's ``j``-th set in distance row ``g < U``, or ``J * U`` for a pair in none
    (:func:`mlem_neuro.core.scoring.fastnull._walk_plan`).  The sort is numpy's, of integer keys
    packing each value's order with its index (:func:`sorted_scores`); one compiled pass
    walks each sorted row for every channel.

    Returns ``(rsum (C, R, J * U) float64, redo (R,) bool)``: per channel, row and label,
    the exact sum (of integers) of the ranks of its pairs within their set, for the rows
    not marked ``redo``; a row marked (tied values, whose ranks are averaged, or values
    too close for the packed keys) is the caller's to rank another way.  ``None`` when
    :data:`USE_COMPILED` is off or ``D`` holds a value that is not finite.
    """
    packed = _packed_keys(D) if USE_COMPILED else None
    if packed is None:
        return None
    keys, bits = packed
    R, P = D.shape
    keys.sort(axis=-1)
    narrow = J * U < 256                  # one byte a label: all labels stay in the cache
    lab = np.ascontiguousarray(np.asarray(labels).T,
                               dtype=np.uint8 if narrow else np.int32)     # (P, C)
    C = lab.shape[1]
    out = np.empty((C, R, J * U))
    flags = np.empty(R, dtype=np.uint8)
    _rank_walk_kernel(D, keys, bits, int(J), int(U), lab, out, flags)
    return out, flags != 0


# -------------------------------------------------------------------- pair distances

@_jit
def _condensed_kernel(G, out):
    M, n = G.shape[0], G.shape[1]
    sq = np.empty(n)
    for m in range(M):
        g = G[m]
        o = out[m]
        for i in range(n):
            sq[i] = g[i, i]
        p = 0
        for i in range(n - 1):
            si = sq[i]
            row = g[i, i + 1:]
            rest = sq[i + 1:]
            dst = o[p:p + n - 1 - i]
            for j in range(n - 1 - i):
                dst[j] = (si + rest[j]) - 2.0 * row[j]
            p += n - 1 - i


def condensed(G):
    """Squared distances ``(M, n (n - 1) / 2)`` of every pair ``i < j`` (pair order of
    :func:`~mlem_neuro.core.stimuli.pairs.pair_indices`) from Gram matrices ``G (M, n, n)``
    (float64, C-contiguous numpy): ``(G_ii + G_jj) - 2 G_ij``, bit for bit as
    :func:`~mlem_neuro.core.rdms.neural.rdm_all_pairs` computes it; ``None`` when
    :data:`USE_COMPILED` is off."""
    if not USE_COMPILED:
        return None
    M, n, _ = G.shape
    out = np.empty((M, n * (n - 1) // 2))
    _condensed_kernel(G, out)
    return out


@_jit
def _subset_ranks_kernel(pos, first, last, ties, cols, out):
    M, N = pos.shape
    R, P = cols.shape
    cnt = np.zeros(max(N, 1), np.int32)
    for m in range(M):
        pm = pos[m]
        for r in range(R):
            cnt[:] = 0
            for p in range(P):
                cnt[pm[cols[r, p]]] = 1
            run = 0
            for q in range(N):
                run += cnt[q]
                cnt[q] = run
            if not ties:
                for p in range(P):
                    out[m, r, p] = np.float64(cnt[pm[cols[r, p]]])
            else:
                for p in range(P):
                    q = pm[cols[r, p]]
                    f = first[m, q]
                    before = cnt[f - 1] if f > 0 else 0
                    upto = cnt[last[m, q]]
                    out[m, r, p] = np.float64(before) + np.float64(upto - before + 1) / 2


def subset_ranks(pos, first, last, cols, out):
    """Average ranks of the column subsets ``cols (R, P)`` (int64) of every row, from the
    rows' sorted positions ``pos (M, N)`` and tie groups ``first``, ``last`` (int32, or
    ``None`` without ties; :class:`~mlem_neuro.core.ranks.spearman.SubsetRanks`), written into
    ``out (M, R, P)`` (a float64 numpy array or view); ``False`` when
    :data:`USE_COMPILED` is off."""
    if not USE_COMPILED:
        return False
    M, N = pos.shape
    assert out.shape == (M, cols.shape[0], cols.shape[1])
    ties = first is not None
    dummy = np.zeros((1, 1), np.int32)
    _subset_ranks_kernel(pos, first if ties else dummy, last if ties else dummy, ties,
                         cols, out)
    return True


@_jit
def _block_tables_kernel(key, block, ranks, T, S1, S2):
    M, P = ranks.shape
    for m in range(M):
        for p in range(P):
            v = ranks[m, p]
            T[m, key[p]] += v
            S1[m, block[p]] += v
            S2[m, block[p]] += v * v


def block_tables(key, block, ranks, n_keys, K):
    """The grid's per-block target tables of ``ranks (M, P)`` (float64 numpy): ``T (M,
    n_keys)``, ``S1`` and ``S2 (M, K)``, the sums of the ranks per key (cell and block)
    and of the ranks and squared ranks per block, added pair by pair in order as
    :class:`~mlem_neuro.core.stimuli.quantise._BlockTargets` does in torch; ``None`` when
    :data:`USE_COMPILED` is off."""
    if not USE_COMPILED:
        return None
    M, P = ranks.shape
    key, block = (np.ascontiguousarray(a, dtype=np.int64) for a in (key, block))
    ranks = _f64(ranks)
    T, S1, S2 = np.zeros((M, n_keys)), np.zeros((M, K)), np.zeros((M, K))
    _block_tables_kernel(key, block, ranks, T, S1, S2)
    return T, S1, S2


def numba_version():
    """numba's version, ``None`` when it is not installed."""
    return None if numba is None else numba.__version__
