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
    assert parser.parse_args([*argv, "--seed", "3"]).seed == 3
    assert parser.parse_args([*argv, "--random-state", "3"]).seed == 3
    assert parser.parse_args(["demo", "--random-state", "4"]).seed == 4
