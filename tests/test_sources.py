"""RDM sources and neural distance metrics: the protocol, one class per metric (checked
against scipy for dense and sphere sources), a custom metric and a custom source."""
import doctest
import pickle

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
import torch
from scipy.spatial.distance import pdist

from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms import distances, sources
from mlem_neuro.core.rdms.distances import (
    METRICS,
    REGISTRY,
    NeuralDistance,
    get_distance,
    register_distance,
)
from mlem_neuro.core.rdms.neural import NeuralTargets, rdm_from_rows
from mlem_neuro.core.rdms.sources import DenseRDMSource, RDMSource, SphereRDMSource
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.crossval import run_cv

ALL = ["euclidean", "correlation", "cosine"]


def random_membership(rng, n_models, n_units, size=(2, 9)):
    rows = [rng.choice(n_units, rng.integers(*size), replace=False) for _ in range(n_models)]
    r = np.concatenate([np.full(len(c), k) for k, c in enumerate(rows)])
    c = np.concatenate(rows)
    return sp.csr_matrix((np.ones(len(r)), (r, c)), shape=(n_models, n_units))


# ----------------------------------------------------------------------- metrics
def test_registry_lists_every_metric_once():
    assert list(METRICS) == ALL
    assert all(REGISTRY[name].name == name for name in ALL)
    assert all(isinstance(m, NeuralDistance) for m in REGISTRY.values())


@pytest.mark.parametrize("metric", ALL)
def test_dense_source_matches_scipy_for_every_metric(metric):
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((4, 15, 6)) * 3 + 7.0      # offset: tests the centring
    src = DenseRDMSource(Y, metric)
    stim = np.array([14, 0, 3, 8, 9, 2, 11])
    got = src.rdm(stim)
    assert got.dtype == torch.float64 and got.shape == (4, 21)
    want = np.stack([pdist(y[stim], metric=metric) for y in Y])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-9, atol=1e-12)
    # a subset of models is the same rows
    assert torch.equal(src.subset(slice(1, 3)).rdm(stim), got[1:3])


@pytest.mark.parametrize("metric", ALL)
def test_sphere_source_matches_scipy_for_every_metric(metric):
    rng = np.random.default_rng(1)
    A = random_membership(rng, 30, 40)
    X = rng.standard_normal((18, 40)) + 4.0
    src = SphereRDMSource(X, A, metric)
    stim = rng.permutation(18)[:10]
    got = src.rdm(stim).numpy()
    for s in range(A.shape[0]):
        want = pdist(X[stim][:, A[s].indices], metric=metric)
        np.testing.assert_allclose(got[s], want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("metric", ALL)
def test_gather_path_matches_scipy(metric, monkeypatch):
    """Targets too large to keep whole are computed from the rows, same metric class."""
    from mlem_neuro.core.rdms import neural

    rng = np.random.default_rng(2)
    Y = rng.standard_normal((3, 12, 5)) + 2.0
    monkeypatch.setattr(neural, "MAX_FULL_ELEMENTS", 0)
    t = NeuralTargets.from_data(Y, metric, "cpu")
    assert t.full is None
    i, j = pair_indices(12)
    got = t.take(np.arange(len(i)), i, j).numpy()
    want = np.stack([pdist(y, metric=metric) for y in Y])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_finish_is_the_same_on_numpy_and_torch_and_clamps_negatives():
    d2 = np.array([[4.0, -1e-17, 2.25, 0.0]])
    for name in ALL:
        metric = get_distance(name)
        a = metric.finish(d2.copy())
        b = metric.finish(torch.as_tensor(d2.copy())).numpy()
        np.testing.assert_array_equal(a, b)
        assert (a >= 0).all()
    np.testing.assert_array_equal(get_distance("euclidean").finish(d2.copy()), [[2, 0, 1.5, 0]])
    np.testing.assert_array_equal(get_distance("cosine").finish(d2.copy()),
                                  [[2, 0, 1.125, 0]])


class SqEuclidean(NeuralDistance):
    """A test metric: squared Euclidean distance, defined as one small class."""

    name = "sqeuclidean"

    def preprocess(self, Y):
        return Y.to(torch.float64)

    def finish(self, d2):
        return d2.clip(0)

    def membership_sq(self, A, XT, i, j, sizes, stats):
        d = XT[:, i] - XT[:, j]
        return A @ (d * d)


def test_a_new_metric_is_one_class_used_by_both_sources(monkeypatch):
    monkeypatch.setitem(REGISTRY, "sqeuclidean", SqEuclidean())
    rng = np.random.default_rng(3)
    Y = rng.standard_normal((2, 9, 4))
    got = DenseRDMSource(Y, "sqeuclidean").rdm(np.arange(9)).numpy()
    np.testing.assert_allclose(got, [pdist(y, "sqeuclidean") for y in Y], rtol=1e-10)
    A = random_membership(rng, 5, 12)
    X = rng.standard_normal((9, 12))
    got = SphereRDMSource(X, A, "sqeuclidean").rdm(np.arange(9)).numpy()
    for s in range(5):
        np.testing.assert_allclose(got[s], pdist(X[:, A[s].indices], "sqeuclidean"),
                                   rtol=1e-10)


def test_register_metric_refuses_a_taken_or_empty_name():
    class Again(SqEuclidean):
        name = "euclidean"

    class Nameless(SqEuclidean):
        name = ""

    for cls in (Again, Nameless):
        with pytest.raises(ValueError, match="new, non-empty name"):
            register_distance(cls)
    assert type(REGISTRY["euclidean"]).__name__ == "Euclidean"


def test_unknown_metric_names_the_choices():
    Y = np.zeros((1, 4, 3))
    with pytest.raises(ValueError, match=r"distance must be one of \['euclidean', "
                                         r"'correlation', 'cosine'\]; got 'manhattan'"):
        DenseRDMSource(Y, "manhattan")
    with pytest.raises(ValueError, match="for searchlight and ROI analyses; got 'l1'"):
        SphereRDMSource(np.zeros((4, 3)), sp.eye(3), "l1")
    with pytest.raises(ValueError, match="'precomputed'"):
        rdm_from_rows(torch.zeros(1, 4, 3), *pair_indices(4), "nope")


def test_metrics_pickle_as_the_registered_instance():
    for name in ALL:
        assert pickle.loads(pickle.dumps(get_distance(name))) is get_distance(name)
    # an unregistered metric instance is accepted by a source and pickles with it
    rng = np.random.default_rng(8)
    src = pickle.loads(pickle.dumps(DenseRDMSource(rng.standard_normal((1, 6, 3)),
                                                   SqEuclidean())))
    assert isinstance(src.metric, SqEuclidean)
    np.testing.assert_allclose(src.rdm(np.arange(6))[0].numpy(),
                               pdist(src.Y[0], "sqeuclidean"), rtol=1e-10)


@pytest.mark.parametrize("metric", ["correlation", "cosine"])
def test_undefined_patterns_are_refused_by_both_sources(metric):
    rng = np.random.default_rng(4)
    X = rng.standard_normal((6, 10))
    # constant over sphere 0's voxels in one image (cosine: zero, as it does not centre)
    X[2, :3] = 5.0 if metric == "correlation" else 0.0
    A = sp.csr_matrix(np.array([[1, 1, 1] + [0] * 7, [0] * 5 + [1] * 5], dtype=float))
    with pytest.raises(ValueError, match=rf"distance='{metric}' is undefined for 1 of 2"):
        SphereRDMSource(X, A, metric).check_patterns()
    SphereRDMSource(X, A, "euclidean").check_patterns()          # defined everywhere
    SphereRDMSource(X, A[1:], metric).check_patterns()
    Y = X[None, :, :3].copy()
    with pytest.raises(ValueError, match=rf"distance='{metric}' is undefined for a stimulus"):
        DenseRDMSource(Y, metric).rdm(np.arange(6))


# ---------------------------------------------------------------------- sources
def test_sphere_source_pair_blocks_do_not_change_distances(monkeypatch):
    rng = np.random.default_rng(5)
    A = random_membership(rng, 20, 30)
    for metric in ALL:
        src = SphereRDMSource(rng.standard_normal((16, 30)), A, metric)
        full = src.rdm(np.arange(16))
        with monkeypatch.context() as m:
            m.setattr(sources, "BLOCK_BYTES", 8 * 30 * 7)    # 7 pairs per block
            assert torch.equal(src.rdm(np.arange(16)), full)


def test_sources_follow_the_protocol_and_pickle():
    rng = np.random.default_rng(6)
    dense = DenseRDMSource(rng.standard_normal((3, 8, 4)), "correlation")
    sphere = SphereRDMSource(rng.standard_normal((8, 12)), random_membership(rng, 6, 12))
    for src in (dense, sphere):
        assert isinstance(src, RDMSource)
        part = pickle.loads(pickle.dumps(src.subset(np.array([2, 0]))))
        assert part.n_models == 2 and part.n_stimuli == 8
        assert torch.equal(part.rdm(np.arange(8)), src.rdm(np.arange(8))[[2, 0]])
    assert not isinstance(object(), RDMSource)


def test_old_import_paths_still_work():
    from mlem_neuro import crossval
    from mlem_neuro.adapters import nifti

    assert crossval.DenseRDMSource is sources.DenseRDMSource
    assert nifti.SphereRDMSource is sources.SphereRDMSource


def test_module_docstring_example_runs():
    result = doctest.testmod(sources, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 5 and result.failed == 0
    result = doctest.testmod(distances)
    assert result.failed == 0


class PrecomputedRDMSource:
    """Square RDMs computed elsewhere (the module docstring's example)."""

    def __init__(self, rdms):
        self.rdms = np.asarray(rdms, dtype=np.float64)

    @property
    def n_models(self):
        return self.rdms.shape[0]

    @property
    def n_stimuli(self):
        return self.rdms.shape[1]

    def subset(self, models):
        return PrecomputedRDMSource(self.rdms[models])

    def rdm(self, stimuli, device="cpu"):
        s = np.asarray(stimuli)
        i, j = pair_indices(len(s))
        return torch.as_tensor(self.rdms[:, s[i], s[j]], device=device)


def test_a_custom_source_runs_through_run_cv_like_the_dense_one():
    """Square Euclidean RDMs served by a custom class give the dense source's results."""
    from scipy.spatial.distance import squareform

    rng = np.random.default_rng(7)
    n = 24
    table = pd.DataFrame({"a": np.tile(["x", "y"], n // 2),
                          "b": rng.permutation(np.tile(["u", "v", "w"], n // 3))})
    code = np.column_stack([table["a"] == "x", table["b"] == "u", table["b"] == "v"])
    Y = np.stack([code * [3.0, 1.0, 0.5] + 0.3 * rng.standard_normal((n, 3)),
                  rng.standard_normal((n, 3))])
    square = np.stack([squareform(pdist(y)) for y in Y])
    opts = MLEMOptions(cv=3, n_repeats=1, max_steps=60, patience=10, n_permutations=3,
                       random_state=0,
                       chunk_size=1)
    custom = run_cv(PrecomputedRDMSource(square), table, opts)
    dense = run_cv(DenseRDMSource(Y), table, opts)
    np.testing.assert_allclose(custom.score, dense.score, atol=1e-9)
    np.testing.assert_allclose(custom.W, dense.W, atol=1e-6)
    assert custom.score[:, 0].mean() > 0.5 > abs(custom.score[:, 1].mean())


def test_condensed_source_serves_any_subset_of_stimuli():
    from mlem_neuro.core.rdms.sources import CondensedRDMSource, RDMSource

    rng = np.random.default_rng(5)
    X = rng.standard_normal((3, 7, 4))
    full = np.stack([np.linalg.norm(x[:, None] - x[None], axis=-1) for x in X])
    i, j = pair_indices(7)
    source = CondensedRDMSource(full[:, i, j])
    assert isinstance(source, RDMSource) and source.n_stimuli == 7 and source.n_models == 3
    stim = np.array([5, 1, 3])
    a, b = pair_indices(3)
    np.testing.assert_array_equal(source.subset([0, 2]).rdm(stim).numpy(),
                                  full[[0, 2]][:, stim[a], stim[b]])
    for bad, match in ((np.zeros((2, 4)), "number of pairs"), (np.zeros(3), "n_models"),
                       (np.full((1, 3), np.nan), "NaN")):
        with pytest.raises(ValueError, match=match):
            CondensedRDMSource(bad)


def test_ranked_source_gives_the_ranks_and_the_analysis_of_the_distances():
    """RankedRDMSource serves the ranks of any subset's distances (ties included), its
    subsets (slices or indices, pickled) share the rows' sort, and an analysis of it
    equals the analysis of the distances (training sees only their ranks)."""
    from mlem_neuro.core.ranks.spearman import rankdata
    from mlem_neuro.core.rdms.sources import CondensedRDMSource, RankedRDMSource

    rng = np.random.default_rng(8)
    n = 24
    table = pd.DataFrame({"a": np.tile(["x", "y"], n // 2), "b": rng.uniform(size=n)})
    Y = np.stack([np.column_stack([table["a"] == "x", table["b"]]) * [2.0, 3.0]
                  + 0.4 * rng.standard_normal((n, 2)) for _ in range(3)])
    d = np.round(DenseRDMSource(Y).rdm(np.arange(n)).numpy(), 1)     # with ties
    dist, ranked = CondensedRDMSource(d), RankedRDMSource(d)
    assert isinstance(ranked, RDMSource) and ranked.ranked and ranked.n_models == 3
    stim = rng.permutation(n)[:10]
    assert torch.equal(ranked.rdm(stim), rankdata(dist.rdm(stim)))
    for models in (slice(1, 3), np.array([2, 0])):
        part = pickle.loads(pickle.dumps(ranked.subset(models)))
        assert torch.equal(part.rdm(stim), rankdata(dist.subset(models).rdm(stim)))
    assert torch.equal(ranked.rdm(stim), rankdata(dist.rdm(stim)))   # left alone
    with pytest.raises(ValueError, match="distinct stimuli"):
        ranked.rdm(np.array([1, 4, 1]))
    # a pickled slice holds its own rows only (joblib sends chunks to workers)
    one, whole = (len(pickle.dumps(x)) for x in (ranked.subset(slice(0, 1)), ranked))
    assert one < 0.5 * whole
    opts = MLEMOptions(cv=3, n_repeats=1, max_steps=40, patience=10, n_permutations=2,
                       random_state=0)
    a, b = run_cv(dist, table, opts), run_cv(ranked, table, opts)
    np.testing.assert_array_equal(a.W, b.W)
    np.testing.assert_array_equal(a.score, b.score)
    np.testing.assert_array_equal(a.importance, b.importance)
