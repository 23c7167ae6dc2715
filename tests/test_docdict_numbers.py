"""The numbers the shared parameter texts state that live in
:mod:`mlem_neuro.core.constants` are filled in from there, so a constant that changes takes
the documentation with it.

The docdict is built when :mod:`mlem_neuro._docs` is imported, so monkeypatching a
constant proves nothing; instead, for each stated number: the rendered entry says the
constant's current value, and the source of ``_docs.py`` does not (the number is not
written there by hand).  Where the text states a number derived from the constants
(repeats with ``cv=2``, the most numeric features on the grid), the function that uses
them is asked too.
"""
import math
from pathlib import Path

import pytest

from mlem_neuro import _docs
from mlem_neuro.core import constants as c
from mlem_neuro.core.training.quantise import choose_levels
from mlem_neuro.crossval import resolve_n_repeats

SOURCE = " ".join(Path(_docs.__file__).read_text().split())


def _pairs(n):
    return f"2**{int(math.log2(n))}"


def _stated():
    """(docdict key, phrase as rendered, the constants it states)."""
    F, S, M = c.AUTO_REFERENCE_FOLDS, c.AUTO_REFERENCE_STIMULI, c.AUTO_REFERENCE_MODELS
    low, high = c.AUTO_FOLDS
    return [
        ("backend", f"at most {c.COMPILED_MAX_FEATURES} features", "COMPILED_MAX_FEATURES"),
        ("batch_size", f"number at most {_pairs(c.FULL_BATCH_PAIRS)},", "FULL_BATCH_PAIRS"),
        ("batch_size", f"up to {_pairs(c.FULL_BATCH_PAIRS)} pairs", "FULL_BATCH_PAIRS"),
        ("batch_size", f"across {c.BATCH_DRAWS} batches", "BATCH_DRAWS"),
        ("batch_size", f"unions of {c.N_BLOCKS} fixed random blocks", "N_BLOCKS"),
        ("chunk_size_spheres", f"at most {c.MAX_CHUNK_MODELS:,}, bounded by memory",
         "MAX_CHUNK_MODELS"),
        ("n_null", f"a polynomial of degree {c.NUMERIC_DEGREE} in its values",
         "NUMERIC_DEGREE"),
        ("n_repeats", f"``{F} ({S} / n)**2 ({M} / M)`` folds in all, between {low} and "
         f"{high},", "AUTO_REFERENCE_*, AUTO_FOLDS"),
        ("n_repeats", f"about what {round(F / 2)} repeats of ``cv=2`` cost for {S} stimuli "
         f"× {M} time points", "AUTO_REFERENCE_*"),
        ("n_repeats", f"{round(high / 2)} repeats for one region", "AUTO_FOLDS"),
        ("n_repeats", f"{round(low / 2)} for a whole-brain searchlight", "AUTO_FOLDS"),
        ("n_repeats", f"At most {c.MAX_REPEATS:,} (refused above)", "MAX_REPEATS"),
        ("n_repeats", f"the permutation tests read the first {c.AUTO_TEST_FOLDS} folds",
         "AUTO_TEST_FOLDS"),
        ("lr", f"takes ``{c.GROUPED_STEP_RULE[0]}`` for categorical designs",
         "GROUPED_STEP_RULE"),
        ("lr", f"and ``{c.PER_PAIR_STEP_RULE[0]}`` otherwise", "PER_PAIR_STEP_RULE"),
        ("patience", f"{c.GROUPED_STEP_RULE[1]} for categorical designs, "
         f"{c.PER_PAIR_STEP_RULE[1]} otherwise", "GROUPED_STEP_RULE, PER_PAIR_STEP_RULE"),
        ("numeric_levels", f"at most {c.MAX_LEVELS} levels", "MAX_LEVELS"),
        ("numeric_levels", f"number at most {c.TARGET_CELLS}, and at least {c.MIN_LEVELS} "
         f"levels while they number at most {c.MAX_CELLS:,};",
         "TARGET_CELLS, MIN_LEVELS, MAX_CELLS"),
        ("numeric_levels", f"up to {c.TARGET_CELLS} rows", "TARGET_CELLS"),
    ]


@pytest.mark.parametrize("key, phrase, constants", _stated(),
                         ids=lambda v: v if isinstance(v, str) and len(v) < 30 else None)
def test_docdict_states_the_constants_current_values(key, phrase, constants):
    rendered = " ".join(_docs.docdict[key].split())
    assert phrase in rendered, f"docdict[{key!r}] does not say {phrase!r} ({constants})"
    assert phrase not in SOURCE, \
        f"_docs.py writes {phrase!r} by hand: fill it in from {constants} (_numbers)"


def test_docdict_derived_numbers_are_what_the_code_does():
    """The repeats with ``cv=2`` and the most numeric features on the grid that
    ``n_repeats`` and ``numeric_levels`` state are those the code chooses."""
    text = " ".join(_docs.docdict["n_repeats"].split())
    M, S = c.AUTO_REFERENCE_MODELS, c.AUTO_REFERENCE_STIMULI
    high_n = int(text.split(f"or for {M} time points of ")[1].split()[0])
    most = resolve_n_repeats("auto", 2, 1, 1)
    assert f"{most} repeats for one region" in text
    assert resolve_n_repeats("auto", 2, high_n, M) == most
    assert resolve_n_repeats("auto", 2, high_n + 1, M) < most
    assert f"; {resolve_n_repeats('auto', 2, S, M)} for {M} time points of {S} stimuli" \
        in text
    text = " ".join(_docs.docdict["numeric_levels"].split())
    many = int(text.split("would leave more (")[1].split()[0])
    numeric = c.MIN_LEVELS + 1                     # distinct values of a numeric column
    assert choose_levels(None, "auto", counts=[numeric] * (many - 1)) is not None
    assert choose_levels(None, "auto", counts=[numeric] * many) is None
