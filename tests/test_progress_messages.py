"""Progress messages say what runs: the test of interactions is mentioned (in the
projected time and when it starts) only where it runs, i.e. with tests (``n_null``) of a
model with interactions between at least two features."""
import logging

import pytest

import mlem_neuro
from mlem_neuro.simulation import simulate_epochs

FAST = dict(cv=2, n_repeats=1, n_null=3, n_permutations=1, max_steps=20, patience=5,
            chunk_size=1, random_state=0, verbose="INFO")


@pytest.fixture(scope="module")
def epochs_data():
    data, features, times = simulate_epochs(
        n_trials=24, n_channels=6, n_times=3, sfreq=100.0, tmin=0.0,
        windows={"A": (0.0, 0.03), "B": None}, random_state=0)
    return data, features, times


def _messages(data, features, times, **kwargs):
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = logging.getLogger("mlem_neuro")
    logger.addHandler(handler)
    try:
        mlem_neuro.mlem_array(data, features, times=times, **{**FAST, **kwargs})
    finally:
        logger.removeHandler(handler)
    return messages


def _mentions(messages):
    return [m for m in messages if "interaction" in m.lower()]


def test_two_features_mention_the_test_of_interactions(epochs_data):
    data, features, times = epochs_data
    messages = _messages(data, features[["A", "B"]], times)
    # the projection after the first chunk, and the test's own start
    assert any("chunks took" in m for m in messages)
    assert any("test of interactions comes on top" in m for m in messages)
    assert any(m.startswith("MLEM: test of interactions") for m in messages)


@pytest.mark.parametrize("case", ["one feature", "interactions=False", "diagonal"])
def test_no_test_of_interactions_no_mention(epochs_data, case):
    data, features, times = epochs_data
    table, kwargs = features[["A", "B"]], {}
    if case == "one feature":
        table = features[["A"]]
    elif case == "interactions=False":
        kwargs = dict(interactions=False)
    else:
        kwargs = dict(constraint="diagonal")
    messages = _messages(data, table, times, **kwargs)
    assert any("chunks took" in m for m in messages)      # the projection was logged
    assert not _mentions(messages), _mentions(messages)


def test_no_tests_no_mention(epochs_data):
    data, features, times = epochs_data
    messages = _messages(data, features[["A", "B"]], times, n_null=0)
    assert not _mentions(messages), _mentions(messages)
