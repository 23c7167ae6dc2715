"""One name, one meaning: every renamed parameter, attribute or column still works under its
former name for a release, with a FutureWarning, and gives the same result.

- null counts are ``n_null`` (``n_permutations`` counts the shuffles of the permutation
  importance): :func:`mlem_neuro.rsa.mantel_tests`;
- the spread of importance across permutations is ``importance_perm_std`` (as the spread
  across folds is ``importance_fold_std``): ``MLEM.permutation_importance``'s column;
- "metric" means the learnt ``W``; the neural distance is ``distance``: the RDM sources'
  ``distance=`` / ``.distance``, and :mod:`mlem_neuro.core.rdms.distances`' ``NeuralDistance``,
  ``register_distance``, ``get_distance``;
- seeds are ``random_state``: the command line's ``--random-state`` (``--seed`` still
  works).
"""
import warnings

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from mlem_neuro import MLEM
from mlem_neuro.core.rdms import distances
from mlem_neuro.core.rdms.sources import DenseRDMSource, SphereRDMSource
from mlem_neuro.core.rdms.spacetime import SpaceTimeRDMSource
from mlem_neuro.rsa import mantel_tests


def _data(n=16, seed=0):
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"a": np.tile([0, 1], n // 2), "b": np.repeat([0, 1], n // 2)})
    X = rng.standard_normal((n, 5)) + 2 * table[["a"]].to_numpy()
    return X, table


def test_mantel_tests_n_permutations_is_now_n_null():
    X, table = _data()
    new = mantel_tests(X, table, n_null=49, random_state=0)
    with pytest.warns(FutureWarning, match="n_permutations= is renamed n_null="):
        old = mantel_tests(X, table, n_permutations=49, random_state=0)
    pd.testing.assert_frame_equal(new, old)
    pd.testing.assert_frame_equal(new, mantel_tests(X, table, 49, 0))   # positional


def test_permutation_importance_column_is_importance_perm_std():
    X, table = _data()
    est = MLEM(max_steps=20, random_state=0).fit(X, table)
    imp = est.permutation_importance(X, table, n_permutations=4, random_state=0)
    assert list(imp.columns) == ["importance", "importance_perm_std", "kind"]
    with pytest.warns(FutureWarning, match="'std_permutations' is renamed "
                                           "'importance_perm_std'"):
        old = imp["std_permutations"]
    pd.testing.assert_series_equal(old, imp["importance_perm_std"])
    with pytest.warns(FutureWarning):
        np.testing.assert_array_equal(imp.std_permutations, old)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        derived = imp[["importance"]]                    # a plain DataFrame
    assert type(derived) is pd.DataFrame


@pytest.mark.parametrize("make", [
    pytest.param(lambda **kw: DenseRDMSource(np.random.default_rng(0).standard_normal(
        (2, 8, 4)), **kw), id="dense"),
    pytest.param(lambda **kw: SphereRDMSource(np.random.default_rng(0).standard_normal(
        (8, 4)), sp.csr_matrix(np.array([[1, 1, 0, 1], [0, 1, 1, 1]])), **kw), id="sphere"),
    pytest.param(lambda **kw: SpaceTimeRDMSource(np.random.default_rng(0).standard_normal(
        (8, 2, 4)), sp.csr_matrix(np.array([[1, 1, 0, 1], [0, 1, 1, 1]])), **kw),
        id="spacetime"),
])
def test_rdm_sources_take_distance_not_metric(make):
    new = make(distance="correlation")
    assert new.distance == "correlation"
    with pytest.warns(FutureWarning, match="metric= is renamed distance="):
        old = make(metric="correlation")
    np.testing.assert_array_equal(new.rdm(np.arange(8)).numpy(), old.rdm(np.arange(8)).numpy())
    with pytest.warns(FutureWarning, match=r"\.metric is renamed \.distance"):
        assert old.metric == "correlation"


@pytest.mark.parametrize("old, new", [("NeuralMetric", "NeuralDistance"),
                                      ("register_metric", "register_distance"),
                                      ("get_metric", "get_distance")])
def test_distance_registry_names(old, new):
    with pytest.warns(FutureWarning, match=f"{old} is renamed {new}"):
        assert getattr(distances, old) is getattr(distances, new)
    with pytest.warns(FutureWarning):
        assert distances.get_metric("cosine") is distances.get_distance("cosine")


def test_command_line_seed_is_random_state():
    from mlem_neuro.cli import build_parser

    parser = build_parser()
    argv = ["epochs", "x-epo.fif", "--out", "o"]
    assert parser.parse_args([*argv, "--seed", "3"]).random_state == 3
    assert parser.parse_args([*argv, "--random-state", "3"]).random_state == 3
    assert parser.parse_args(["demo", "--random-state", "4"]).random_state == 4


@pytest.mark.parametrize("argv", [
    ["epochs", "x-epo.fif", "--out", "o", "--seed", "3", "--random-state", "4"],
    ["epochs", "x-epo.fif", "--out", "o", "--random-state", "3", "--seed", "3"],
    ["demo", "--seed", "1", "--random-state", "2"]])
def test_command_line_seed_and_random_state_refused(argv, capsys):
    """Both names on one command line: an error naming both (the last one used to win)."""
    from mlem_neuro.cli import build_parser

    with pytest.raises(SystemExit) as err:
        build_parser().parse_args(argv)
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "--seed" in message and "--random-state" in message


def _cluster_test(**kw):
    from mlem_neuro.stats import permutation_cluster_test

    return permutation_cluster_test([], "a", **kw)


def _second_level(**kw):
    from mlem_neuro.stats import second_level_maps

    return second_level_maps([], "a", **kw)


_Y = np.random.default_rng(0).standard_normal((2, 8, 4))
_A = sp.csr_matrix(np.array([[1, 1, 0, 1], [0, 1, 1, 1]]))


@pytest.mark.parametrize("call, old, new", [
    pytest.param(lambda: mantel_tests(*_data(), n_null=99, n_permutations=9),
                 "n_permutations", "n_null", id="mantel"),
    pytest.param(lambda: mantel_tests(*_data(), 99, n_permutations=99),   # equal, positional
                 "n_permutations", "n_null", id="mantel-equal"),
    pytest.param(lambda: _cluster_test(n_null=16, n_permutations=4, random_state=0, seed=1),
                 "n_permutations", "n_null", id="cluster"),
    pytest.param(lambda: _cluster_test(random_state=None, seed=1),   # new name at its default
                 "seed", "random_state", id="cluster-seed"),
    pytest.param(lambda: _second_level(n_null=10, n_perm=5), "n_perm", "n_null",
                 id="second-level"),
    pytest.param(lambda: DenseRDMSource(_Y, distance="euclidean", metric="correlation"),
                 "metric", "distance", id="dense"),                  # new name at its default
    pytest.param(lambda: DenseRDMSource(_Y, "euclidean", metric="correlation"),
                 "metric", "distance", id="dense-positional"),
    pytest.param(lambda: SphereRDMSource(_Y[0], _A, distance="cosine", metric="correlation"),
                 "metric", "distance", id="sphere"),
    pytest.param(lambda: SpaceTimeRDMSource(_Y.transpose(1, 0, 2), _A, distance="euclidean",
                                            metric="euclidean"),
                 "metric", "distance", id="spacetime-equal"),
])
def test_giving_the_old_and_the_new_name_is_an_error(call, old, new):
    """Neither name silently wins (the old one used to): the call is refused, naming both,
    even with the new name at its default value or both names at one value."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # refused before any FutureWarning
        with pytest.raises(TypeError, match=rf"{old}= is the former name of {new}=; give "
                                            rf"{new}= only"):
            call()


def test_the_old_name_alone_still_reaches_the_function():
    from mlem_neuro.utils import renamed

    @renamed(old="new")
    def f(a, new=1, *, old=None):
        return a, new, old

    assert f(0) == (0, 1, None) and f(0, 2) == (0, 2, None)
    with pytest.warns(FutureWarning, match="f: old= is renamed new="):
        assert f(0, old=3) == (0, 3, None)
    assert f(0, old=None) == (0, 1, None)             # None: the old name not given
    with pytest.raises(RuntimeError, match="keyword-only"):
        renamed(old="new")(lambda new=1, old=None: new)
