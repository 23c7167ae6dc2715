"""Running the chunks of an analysis: joblib jobs in order, a progress bar, and a
projection of the total time after the first chunk (warned past
:data:`LONG_RUN_SECONDS`).  Used by the fold loop (:mod:`mlem_neuro.crossval`), the
fast nulls (:mod:`mlem_neuro.core.scoring.fastnull`) and the RSA tests."""
from __future__ import annotations

import warnings

from joblib import effective_n_jobs

from .constants import (  # noqa: F401  (tuning constants, defined there once)
    LONG_RUN_SECONDS,
)
from .utils import logger


def timed(results, n_total, workers, desc, then=None, warned=False, weights=None):
    """``results`` passed through; after the first, the projected time of all ``n_total``
    (logged at INFO, and as a warning when it exceeds :data:`LONG_RUN_SECONDS` unless the
    projection made before the first chunk already ``warned``: this one refines it,
    :mod:`mlem_neuro._projection`); ``weights`` (one per job, ``None``: equal) say what
    each costs relative to the others (e.g. the chunks of folds whose null models the
    tests do not read); ``then`` names what runs after them and is not projected (the
    test of interactions), said only when it runs."""
    import time

    start = time.perf_counter()
    for k, result in enumerate(results):
        if k == 0:
            first = time.perf_counter() - start
            share = 1.0 if not weights else sum(weights) / max(weights[0], 1e-12) / n_total
            total = first * n_total * share / max(1, min(workers, n_total))
            message = (f"MLEM ({desc}): the first of {n_total} chunks took {first:.1f} s; "
                       f"all of them will take about {total / 60:.1f} min"
                       + (f" ({then} comes on top)" if then else ""))
            if total > LONG_RUN_SECONDS and not warned:
                warnings.warn(message + " (fewer nulls, n_jobs or a categorical design "
                              "make permutation tests cheaper: see the performance page).",
                              UserWarning, stacklevel=2)
            else:
                logger.info(message)
        yield result


def run_jobs(Parallel, jobs, n_total, n_jobs, desc, show=None, estimate=False, then=None,
             warned=False, weights=None):
    """Run joblib jobs in order, with a progress bar at INFO (``show``: with one or not,
    whatever the level; a bar needs more than one job); ``estimate`` projects the total
    time from the first job (:func:`timed`, which says that ``then`` comes on top, and
    warns only if the projection before the first chunk has not: ``warned``; ``weights``,
    the jobs' relative costs)."""
    import logging

    show = (logger.isEnabledFor(logging.INFO) if show is None else show) and n_total > 1
    parallel = Parallel(n_jobs=n_jobs, return_as="generator")
    if estimate and n_total > 1:
        jobs = timed(parallel(jobs), n_total, effective_n_jobs(n_jobs), desc, then,
                     warned, weights)
        parallel = iter
    if show:
        from mne.utils import ProgressBar

        # iterate the bar itself: used as a context manager it resets on exit and prints
        # a spurious "0/N" line after the run
        return list(ProgressBar(parallel(jobs), max_value=n_total,
                                mesg=f"MLEM chunks ({desc})"))
    return list(parallel(jobs))
