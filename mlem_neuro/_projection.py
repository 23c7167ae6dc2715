"""The cost of an analysis, said before it is paid.

:func:`~mlem_neuro.crossval.run_cv` times its first chunk, cut small on purpose (a
*calibration chunk* of a few models of the first fold, with their null models: the
analysis's own code on its own design, so the machine's load, the design's training path
and the models' steps are in the measure), and before any other chunk runs logs a
projection of the whole analysis: the models to fit (folds x (1 + n_null x tests) x
models, plus the test of interactions' fits), the time they will take (a range), and the
one or two options that would cut it most, each with what it would save by the same cost
model.  Past :data:`LONG_RUN_SECONDS` it is a warning.  The calibration chunk is a chunk
of the analysis (its results are kept), so it costs nothing; results do not depend on the
chunks.  Below :data:`PROJECTION_MIN_FITS` fits the analysis is trivial: no calibration,
no projection.

The cost model: a model of a fold costs what a model of the calibration chunk cost
(training its observed and null rows, scoring them), spread over the workers; options
scale it by the rows they train (``n_null``), the folds (``n_repeats``), the workers
(``n_jobs``) or a measured ratio (``numeric_levels``, ``device``).
"""
from __future__ import annotations

import math

from .core.constants import (  # noqa: F401  (tuning constants, defined there once)
    AUTO_FOLDS,
    CALIBRATION_ROWS,
    CHEAPER_MIN_SAVING,
    GPU_TIME_RATIO,
    LONG_RUN_SECONDS,
    PARALLEL_EFFICIENCY,
    PER_PAIR_TIME_RATIO,
    PROJECTION_MIN_FITS,
    PROJECTION_SPREAD,
)
from .utils import logger, warn_user


def fit_counts(M, n_folds, n_null, n_tests, interactions, n_test_folds=None):
    """``(analysis, interactions)``: the models the fold loop fits (every fold's observed
    models, and their null models in the ``n_test_folds`` folds the tests read, every
    fold when ``None``) and those the test of interactions fits (two fits, with and
    without interactions, of every model and null dataset in those folds; 0 when it does
    not run)."""
    tested = n_folds if n_test_folds is None else n_test_folds
    analysis = n_folds * M + tested * M * n_null * n_tests
    return analysis, (2 * tested * M * (n_null + 1) if interactions else 0)


def wanted(counts):
    """Whether the analysis is worth a projection (not trivial)."""
    return sum(counts) >= PROJECTION_MIN_FITS


def calibration_split(chunk, rows_per_model):
    """``(slices, n)``: ``chunk`` (a slice of models) cut into the calibration chunks, its
    first ``n`` slices, and the rest.  The first calibration chunk (one model) takes what
    a process's first chunk pays once (loading the compiled loop, caches); the next two,
    of one model and of ``k`` (about :data:`CALIBRATION_ROWS` trained rows, models x (1 +
    null rows)), give a chunk's fixed cost and a model's cost.  A chunk too small for them
    is cut in fewer."""
    k = max(2, math.ceil(CALIBRATION_ROWS / max(1, rows_per_model)))
    start, stop = chunk.start, chunk.stop
    size = stop - start
    if size >= 5:           # the rest of the chunk keeps at least one model
        cuts = [start, start + 1, start + 2, start + 2 + min(k, size - 3), stop]
        n = 3
    else:                   # a small chunk: all of it calibrates
        cuts = list(range(start, min(start + 2, stop))) + [stop]
        n = len(cuts) - 1
    return [slice(a, b) for a, b in zip(cuts[:-1], cuts[1:])], n


def chunk_costs(times, sizes):
    """``(fixed, per_model)`` seconds of a chunk, from the calibration chunks' ``times``
    and ``sizes`` (the first, which pays the process's warm-up, left out when there are
    more)."""
    if len(times) == 3 and sizes[2] > 1:
        (_, t1, tk), (_, _, k) = times, sizes
        per_model = max((tk - t1) / (k - 1), tk / k / 4)   # noise can make tk < t1
        return max(0.0, tk - k * per_model), per_model
    if len(times) == 3:
        return 0.0, (times[1] + times[2]) / 2
    return 0.0, times[-1] / sizes[-1]


def _minutes(seconds):
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _range(seconds):
    return f"{_minutes(seconds / PROJECTION_SPREAD)} to {_minutes(seconds * PROJECTION_SPREAD)}"


def cheaper_options(ctx):
    """``[(option, fraction of the time saved, what it costs in results)]``, the options
    that would make this analysis cheaper, best first (those saving at least
    :data:`CHEAPER_MIN_SAVING`).  ``ctx``: the keys :func:`announce` documents."""
    out = []
    n_null, n_tests, folds = ctx["n_null"], ctx["n_tests"], ctx["n_folds"]
    rows = 1 + n_null * n_tests
    if n_null > 19:
        fewer = 99 if n_null > 99 else 19
        saved = 1 - (1 + fewer * n_tests) / rows
        out.append((f"n_null={fewer}", saved,
                    f"the smallest p-value is then {1 / (1 + fewer):.2g}"))
    cv = ctx.get("cv")
    least = AUTO_FOLDS[0]
    if cv is not None and folds > max(cv, least):
        repeats = max(1, math.ceil(least / cv))
        # the observed models in every fold, the null models in the folds the tests read
        tested = ctx.get("n_test_folds") or folds
        fewer = cv * repeats
        cost = folds + tested * (rows - 1)
        out.append((f"n_repeats={repeats}", 1 - (fewer + min(fewer, tested) * (rows - 1)) / cost,
                    f"{fewer} folds instead of {folds}: noisier scores"))
    workers, cores, chunks = ctx["workers"], ctx["cores"], ctx["n_chunks"]
    more = min(cores, chunks)
    if more > workers:
        speedup = more / workers * PARALLEL_EFFICIENCY
        if speedup > 1:
            out.append((f"n_jobs={more}", 1 - 1 / speedup,
                        f"{more} workers on {cores} cores; the same results"))
    if ctx.get("per_pair_numeric"):
        out.append(('numeric_levels="auto"', 1 - 1 / PER_PAIR_TIME_RATIO,
                    "numeric features trained on a grid of distances"))
    # a GPU gains on stacks of hundreds of rows, not on small ones
    if ctx.get("cuda") and ctx.get("device") == "cpu" and ctx["M"] * rows >= CALIBRATION_ROWS:
        out.append(('device="cuda"', 1 - GPU_TIME_RATIO, "a GPU is available"))
    if ctx.get("desc") == "time points" and ctx["M"] >= 20:
        out.append(("decim=2 (or a window)", 0.5, "half the time points"))
    out = [o for o in out if o[1] >= CHEAPER_MIN_SAVING]
    return sorted(out, key=lambda o: -o[1])


def announce(times, sizes, rest, ctx, weights=None):
    """Log (and warn past :data:`LONG_RUN_SECONDS`) the projection of the analysis from
    the ``times`` its calibration chunks of ``sizes`` models took (:func:`chunk_costs`)
    and the sizes of the chunks still to run, ``rest``; returns the projected seconds of
    the fold loop and whether it warned.

    ``ctx``: ``desc``, ``M`` (models), ``n_folds``, ``n_test_folds`` (the first folds, whose
    chunks fit the null models; ``rest`` lists the others' chunks after them, as
    ``weights``, one per chunk of ``rest``, say: 1 for a chunk with null models, the share
    of one without), ``n_null``, ``n_tests``, ``counts``
    (:func:`fit_counts`), ``workers``, ``cores``, ``n_chunks``, ``cv`` (an int, else
    ``None``), ``device``, ``cuda`` (available), ``per_pair_numeric`` (numeric features
    trained pair by pair with ``numeric_levels=None``), ``staged`` (the number of features
    whose null models come only where interactions are found, 0 for none).
    """
    M, folds, counts, desc = ctx["M"], ctx["n_folds"], ctx["counts"], ctx["desc"]
    fixed, per_model = chunk_costs(times, sizes)
    parallel = max(1.0, min(ctx["workers"], len(rest)) * PARALLEL_EFFICIENCY)
    weights = [1.0] * len(rest) if weights is None else weights
    total = sum(times) + (fixed * len(rest) + per_model * sum(
        w * r for w, r in zip(weights, rest))) / parallel
    rows = 1 + ctx["n_null"] * ctx["n_tests"]
    # the test of interactions: its fits at the fold loop's cost per trained row
    extra = per_model / rows * counts[1] / parallel
    tested = ctx.get("n_test_folds") or folds
    if tested < folds:
        message = (f"MLEM ({desc}): {sum(counts):,} models to fit ({folds} fold(s) x {M} "
                   f"{desc}, and the tests' {ctx['n_null']} null(s) x {ctx['n_tests']} "
                   f"test(s) in the first {tested} folds = {counts[0]:,}")
    else:
        message = (f"MLEM ({desc}): {sum(counts):,} models to fit ({folds} fold(s) x "
                   f"(1 + {ctx['n_null']} null(s) x {ctx['n_tests']} test(s)) x {M} {desc} "
                   f"= {counts[0]:,}")
    if counts[1]:
        message += f", and {counts[1]:,} for the test of interactions"
    if ctx.get("staged"):
        # the staged feature tests: the features' null models where interactions are found
        message += (f"; the {ctx['staged']} features' null models ({tested} x "
                    f"{ctx['n_null']} x {ctx['staged']} per {desc.rstrip('s')}) only "
                    f"in the {desc} where interactions are found")
    message += (f"). The first {sum(sizes)} {desc} of fold 1 took {sum(times):.1f} s: the "
                f"analysis will take about {_minutes(total)} (likely {_range(total)})")
    if counts[1]:
        message += f", the test of interactions roughly {_minutes(extra)} more"
    message += "."
    options = cheaper_options(ctx)[:2]
    if options:
        message += " Cheaper: " + "; ".join(
            f"{name} (about {saved:.0%} less time; {what})" for name, saved, what in options
        ) + " (see the performance page)."
    logger.info(message)
    warned = total + extra > LONG_RUN_SECONDS
    if warned:
        warn_user(message)
    return total, warned
