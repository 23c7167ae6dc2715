"""The cost is visible before it is paid: the projection of an analysis (models to fit,
a time range, the options that would cut it) is logged before any chunk but the small
calibration chunks runs, scales with ``n_null``, names a cheaper option, and is not made
for a trivial analysis (:mod:`mlem_neuro._projection`)."""
import logging
import re
import warnings

import numpy as np
import pytest

import mlem_neuro
from mlem_neuro import _projection, crossval
from mlem_neuro.simulation import simulate_epochs

FAST = dict(cv=2, n_repeats=2, n_permutations=1, max_steps=10, patience=3,
            random_state=0, verbose="INFO", interactions=False)


@pytest.fixture(scope="module")
def epochs_data():
    data, features, times = simulate_epochs(
        n_trials=16, n_channels=4, n_times=12, sfreq=100.0, tmin=0.0,
        windows={"A": (0.0, 0.05), "B": None}, random_state=0)
    return data, features[["A", "B"]], times


def _run(epochs_data, monkeypatch, min_fits=100, **kwargs):
    """The log lines of one analysis, with a marker logged as every chunk starts."""
    data, features, times = epochs_data
    monkeypatch.setattr(_projection, "PROJECTION_MIN_FITS", min_fits)
    original = crossval._fit_chunk

    def marked(source, *args, **kw):
        logging.getLogger("mlem_neuro").info("CHUNK %d models", source.n_models)
        return original(source, *args, **kw)

    monkeypatch.setattr(crossval, "_fit_chunk", marked)
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("mlem_neuro")
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            mlem_neuro.mlem_array(data, features, times=times, **{**FAST, **kwargs})
    finally:
        logger.removeHandler(handler)
    return messages, [str(w.message) for w in caught if "models to fit" in str(w.message)]


def _projection_line(messages):
    found = [m for m in messages if "models to fit" in m]
    assert len(found) == 1, found
    return found[0]


def _seconds(line):
    value, unit = re.search(r"will take about ([\d.]+) (s|min|h)", line).groups()
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


def test_projection_before_the_chunks(epochs_data, monkeypatch):
    messages, _ = _run(epochs_data, monkeypatch, n_null=9)
    at = messages.index(_projection_line(messages))
    chunks = [i for i, m in enumerate(messages) if m.startswith("CHUNK")]
    # only the calibration chunks (3, of 1, 1 and a few models of 12) run before it
    before = [messages[i] for i in chunks if i < at]
    assert 1 <= len(before) <= 3, before
    assert sum(int(m.split()[1]) for m in before) < 12
    assert len(chunks) > len(before)          # the rest of the analysis runs after it
    # the models counted: 4 folds x (1 + 9 nulls x 3 tests) x 12 time points
    assert f"{4 * (1 + 9 * 3) * 12:,} models to fit" in messages[at]
    assert re.search(r"likely .+ to .+\)", messages[at])          # a range


def test_projection_of_the_staged_tests(epochs_data, monkeypatch):
    """With the staged default and a model with interactions, the fold loop fits the
    score's null models, and the features' only where the test of interactions finds
    interactions: the projection counts the first and says the second."""
    messages, _ = _run(epochs_data, monkeypatch, n_null=9, interactions=True)
    line = _projection_line(messages)
    assert f"(1 + 9 null(s) x 1 test(s)) x 12 time points = {4 * (1 + 9) * 12:,}" in line
    assert ("the 2 features' null models (4 x 9 x 2 per time point) only in the time "
            "points where interactions are found") in line


def test_projection_names_a_cheaper_option(epochs_data, monkeypatch):
    messages, _ = _run(epochs_data, monkeypatch, n_null=99, n_repeats=10)
    line = _projection_line(messages)
    assert "Cheaper: " in line
    named = re.findall(r"(n_null=\d+|n_repeats=\d+|decim=2|n_jobs=\d+)", line)
    assert named and "n_null=19" in named, line
    # the options are ranked by what they save, from the same cost model
    saved = [int(s) for s in re.findall(r"about (\d+)% less time", line)]
    assert saved == sorted(saved, reverse=True)


def test_cheaper_options_computed_from_the_design():
    ctx = dict(n_null=99, n_tests=5, n_folds=20, cv=2, workers=1, cores=1, n_chunks=40,
               M=5, desc="spheres", device="cpu", cuda=False, per_pair_numeric=False)
    options = dict((name, saved) for name, saved, _ in _projection.cheaper_options(ctx))
    assert options["n_null=19"] == pytest.approx(1 - (1 + 19 * 5) / (1 + 99 * 5))
    assert options["n_repeats=6"] == pytest.approx(1 - 12 / 20)
    assert not any(name.startswith(("n_jobs", "decim", "device")) for name in options)
    more = _projection.cheaper_options({**ctx, "cores": 4, "n_null": 19, "n_folds": 12,
                                        "per_pair_numeric": True})
    assert [name for name, _, _ in more] == ['numeric_levels="auto"', "n_jobs=4"]


def test_projection_scales_with_n_null(epochs_data, monkeypatch):
    counts = [_projection.fit_counts(12, 4, n, 3, False)[0] for n in (9, 99)]
    assert counts[1] > 9 * counts[0]
    few, _ = _run(epochs_data, monkeypatch, n_null=3)
    many, _ = _run(epochs_data, monkeypatch, n_null=99)
    # 99 nulls against 3: the models said are exact.  The seconds are not compared: on
    # this small design they are tenths of a second, dominated by a chunk's fixed cost
    # and the machine's load (seen: 0.2 s projected for 99 nulls, 0.4 s for 3); the
    # projection is checked against a real run on the performance page
    said = [int(re.search(r"([\d,]+) models to fit", _projection_line(m)).group(1)
                .replace(",", "")) for m in (few, many)]
    assert said == [_projection.fit_counts(12, 4, n, 3, False)[0] for n in (3, 99)]


def test_long_projection_warns_once(epochs_data, monkeypatch):
    monkeypatch.setattr(_projection, "LONG_RUN_SECONDS", 0)
    from mlem_neuro.core import jobs as _jobs
    monkeypatch.setattr(_jobs, "LONG_RUN_SECONDS", 0)
    messages, warned = _run(epochs_data, monkeypatch, n_null=9)
    assert len(warned) == 1                     # before the chunks, not again after one
    assert any("chunks took" in m for m in messages)        # the refinement, logged


def test_trivial_analysis_no_projection(epochs_data, monkeypatch):
    # the default threshold: 4 folds x (1 + 3 x 3) x 12 models are trivial
    messages, warned = _run(epochs_data, monkeypatch, min_fits=_projection.PROJECTION_MIN_FITS,
                            n_null=3)
    assert not [m for m in messages if "models to fit" in m] and not warned
    messages, warned = _run(epochs_data, monkeypatch, n_null=0)
    assert not [m for m in messages if "models to fit" in m] and not warned


def test_calibration_chunks_do_not_change_results(epochs_data, monkeypatch):
    data, features, times = epochs_data
    kwargs = {**FAST, "n_null": 9, "verbose": "WARNING"}
    plain = mlem_neuro.mlem_array(data, features, times=times, **kwargs)
    monkeypatch.setattr(_projection, "PROJECTION_MIN_FITS", 100)
    cut = mlem_neuro.mlem_array(data, features, times=times, **kwargs)
    np.testing.assert_array_equal(plain.score, cut.score)
    np.testing.assert_array_equal(plain.importance, cut.importance)
    np.testing.assert_array_equal(plain.pvalues, cut.pvalues)


def test_the_refined_projection_weighs_the_chunks_without_null_models(caplog):
    """With n_repeats="auto" the tests read the first folds only, so the chunks of the
    other folds fit their observed models alone: the projection after the first chunk
    counts them at their share, not at the first chunk's cost."""
    import time

    from mlem_neuro.core.jobs import timed

    def results():
        time.sleep(0.3)
        yield 0
        yield from range(1, 100)

    def said(weights):
        caplog.clear()
        with caplog.at_level("INFO", logger="mlem_neuro"):
            list(timed(results(), 100, 1, "time points", weights=weights))
        return float(re.search(r"will take about ([\d.]+) min", caplog.text).group(1))

    equal = said(None)
    assert equal >= 0.5                            # 100 chunks x 0.3 s at least
    assert said([1.0] * 20 + [0.01] * 80) < equal / 3
