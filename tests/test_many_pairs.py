"""Work linear in pairs: the fast paths give the results of the computations they replace.

Groups of identical pair rows from stimulus codes (vs ``torch.unique`` over every pair's
row), RDMs of all pairs read off the Gram matrix (vs gathering every pair), pair sampling
by sort (vs ``np.unique``), distinct permuted values without a sort, and a fold's training
setup computed once for all its chunks of models.  Each is checked bit for bit.
"""
import numpy as np
import pandas as pd
import pytest
import torch

from mlem_neuro.core.ranks import grouped
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.core.training.metric import term_index


def _designs():
    rng = np.random.default_rng(0)
    n = 90
    cat = pd.DataFrame({"a": rng.choice(list("xyz"), n), "b": rng.choice(list("pq"), n),
                        "c": rng.choice(list("uvw"), n)})
    cat.loc[rng.choice(n, 9, replace=False), "b"] = None          # missing values
    ordinal = pd.DataFrame({"o": pd.Categorical(rng.choice(["lo", "mid", "hi"], n),
                                                categories=["lo", "mid", "hi"],
                                                ordered=True),
                            "a": rng.choice(list("xy"), n)})
    numeric = pd.DataFrame({"x": rng.choice([0.0, 0.3, 1.0], n),
                            "u": rng.choice([0.0, 1.0], n), "v": rng.choice([0.0, 2.0], n),
                            "a": rng.choice(list("xyz"), n)})
    numeric.loc[rng.choice(n, 5, replace=False), "x"] = np.nan
    return [(cat, FeatureSpace(missing_distance=0.5)),
            (ordinal, FeatureSpace()),
            (numeric, FeatureSpace(groups={"uv": ["u", "v"]}))]


@pytest.mark.parametrize("design", range(3))
@pytest.mark.parametrize("interactions", [True, False])
def test_groups_from_codes_equal_unique_over_all_pairs(design, interactions):
    """Term rows of all pairs (the engine's float32): same distinct rows, same labels."""
    from mlem_neuro.core.training.engine import PairTerms
    table, space = _designs()[design]
    enc = space.fit_transform(table)
    k, l = term_index(enc.n_features, interactions)
    terms = PairTerms(enc.to_torch("cpu", torch.float32), len(table), k, l)
    codes = terms.codes()
    assert codes.pays() and codes.n_codes < len(table)
    fast = grouped.distinct_rows(None, codes)
    ref = grouped.distinct_rows(terms.all)
    assert ref is not None
    assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1])


@pytest.mark.parametrize("design", range(3))
def test_groups_from_codes_on_a_list_of_pairs(design, monkeypatch):
    """Feature distances (float64) of an explicit list of pairs in any order, read in
    several blocks: the same as ``torch.unique`` over the list's rows."""
    from mlem_neuro.core.scoring.importance import PairFeatures
    table, space = _designs()[design]
    enc = space.fit_transform(table)
    i, j = pair_indices(len(table))
    pick = np.random.default_rng(1).permutation(len(i))[:2000]
    i, j = i[pick], j[pick]
    flip = np.arange(len(i)) % 3 == 0                               # some pairs as (j, i)
    i, j = np.where(flip, j, i), np.where(flip, i, j)
    pairs = PairFeatures(enc.to_torch("cpu", torch.float64), i, j)
    monkeypatch.setattr(grouped.PairCodes, "BLOCK", 333)
    fast = grouped.distinct_rows(None, pairs.codes())
    ref = grouped.distinct_rows(pairs.distances(slice(0, len(i))))
    assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1])


def test_groups_from_codes_read_in_row_blocks(monkeypatch):
    """Every pair of the stimuli generated a few rows at a time gives the same labels."""
    from mlem_neuro.core.training.engine import PairTerms
    table, space = _designs()[0]
    enc = space.fit_transform(table)
    k, l = term_index(enc.n_features)
    terms = PairTerms(enc.to_torch("cpu", torch.float32), len(table), k, l)
    monkeypatch.setattr(grouped.PairCodes, "BLOCK", 200)      # 2 rows of 90 stimuli per block
    fast = grouped.distinct_rows(None, terms.codes())
    ref = grouped.distinct_rows(terms.all)
    assert torch.equal(fast[0], ref[0]) and torch.equal(fast[1], ref[1])


def test_codes_do_not_pay_for_numeric_features():
    """All-distinct numeric values: as many codes as stimuli, the rows are sorted instead."""
    from mlem_neuro.core.training.engine import PairTerms
    rng = np.random.default_rng(2)
    enc = FeatureSpace().fit_transform(pd.DataFrame({"x": rng.random(40)}))
    terms = PairTerms(enc.to_torch("cpu", torch.float32), 40, *term_index(1))
    assert not terms.codes().pays()
    assert grouped.distinct_rows(terms.all, terms.codes()) is None     # 780 distinct rows


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("metric", ["euclidean", "correlation", "cosine"])
def test_rdm_of_all_pairs_equals_the_gathered_rdm(metric, compiled, monkeypatch,
                                                   watch_compiled):
    """Bit for bit, with the Gram products split over models and rows, whether the
    compiled pass or torch reads the pairs off the Gram matrices."""
    import mlem_neuro.core.rdms.neural as neural

    seen = watch_compiled("condensed", compiled)
    Y = torch.as_tensor(np.random.default_rng(3).standard_normal((5, 47, 9)))
    i, j = pair_indices(47)
    ref = neural.rdm_from_rows(Y, i, j, metric)
    assert torch.equal(neural.rdm_all_pairs(Y, metric, compiled), ref)
    monkeypatch.setattr(neural, "CHUNK_BYTES", 8 * 47 * 47 * 2)    # 2 models, 1 row a block
    assert torch.equal(neural.rdm_all_pairs(Y, metric, compiled), ref)
    assert len(seen) == 4 and all((d is not None) is compiled for d in seen)


def _sample_pairs_before(rng, n_total, size):
    """The sampler as it was (``np.unique`` / ``np.union1d``)."""
    if size >= n_total:
        return rng.permutation(n_total)
    if size * 4 > n_total:
        return rng.permutation(n_total)[:size]
    out = np.unique(rng.integers(0, n_total, size=int(size * 1.1) + 16))
    while out.size < size:
        extra = rng.integers(0, n_total, size=size - out.size + 16)
        out = np.union1d(out, extra)
    return rng.permutation(out)[:size]


def test_sample_pairs_draws_what_it_drew_before():
    from mlem_neuro.core.stimuli.pairs import sample_pairs
    for seed in range(20):
        for total, size in ((100, 30), (5000, 4096), (10**6, 4096), (10**5, 20000),
                            (300, 10)):
            a = sample_pairs(np.random.default_rng(seed), total, size)
            b = _sample_pairs_before(np.random.default_rng(seed), total, size)
            np.testing.assert_array_equal(a, b)


def test_distinct_permuted_values_equal_unique():
    from mlem_neuro.core.scoring.importance import _distinct_values
    g = torch.Generator().manual_seed(4)
    likely = torch.tensor([0.0, 0.5, 1.0, 0.5], dtype=torch.float64)
    for values in (likely[torch.randint(0, 4, (6, 50), generator=g)],
                   torch.zeros(3, 7, dtype=torch.float64),              # one value used
                   torch.tensor([[0.0, 2.0], [1.0, 0.5]], dtype=torch.float64)):  # unlisted
        got, ref = _distinct_values(values, likely), torch.unique(values, return_inverse=True)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])


def test_grouped_path_when_the_term_rows_do_not_fit(monkeypatch):
    """Past MAX_TERM_ELEMENTS the engine used to train per pair; groups from codes keep the
    grouped path (no row of every pair is built).  The two paths differ by their soft-rank
    precision only (float64 grouped, float32 per pair), as in test_engine."""
    import mlem_neuro.core.training.engine as engine
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.rdms.neural import NeuralTargets
    rng = np.random.default_rng(5)
    n = 60
    y = pd.DataFrame({"a": rng.choice(list("xy"), n), "b": rng.choice(list("pqr"), n)})
    code = np.eye(2)[(y["a"] == "x").to_numpy().astype(int)]
    Y = np.stack([np.hstack([code * s, rng.standard_normal((n, 4))]) for s in (1.0, 3.0)])
    enc = FeatureSpace().fit_transform(y)
    opts = MLEMOptions(batch_size=400, max_steps=60)
    object.__setattr__(opts, "tol", -np.inf)                   # no early stopping
    monkeypatch.setattr(engine, "MAX_TERM_ELEMENTS", 0)
    built = []
    real = engine.PairTerms.build
    monkeypatch.setattr(engine.PairTerms, "build",
                        lambda self, **kw: built.append(1) or real(self, **kw))
    by_group = engine.fit_stack(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), opts,
                                random_state=0)
    assert not built                                           # grouped: no rows built
    monkeypatch.setattr(grouped.PairCodes, "pays", lambda self: False)   # the old behaviour
    per_pair = engine.fit_stack(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), opts,
                                random_state=0)
    assert built and by_group.batch_size == per_pair.batch_size
    np.testing.assert_allclose(by_group.history, per_pair.history, atol=1e-5)
    np.testing.assert_allclose(by_group.W, per_pair.W, atol=5e-6)


def test_fold_setup_once_per_fold_gives_the_same_results(monkeypatch):
    """Chunks of one fold share its setup (groups, batch size, the random stream after the
    selection): computed once per fold, and bit for bit what each chunk computed alone."""
    import mlem_neuro.crossval as crossval
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.training.engine import PairSetup
    rng = np.random.default_rng(6)
    n, M = 200, 3                          # 4,950 training pairs, mini-batches of 1,000
    y = pd.DataFrame({"a": rng.choice(list("xy"), n), "b": rng.choice(list("pqr"), n)})
    code = np.eye(2)[(y["a"] == "x").to_numpy().astype(int)]
    Y = np.stack([np.hstack([code * s, rng.standard_normal((n, 5))]) for s in (1, 2, 4)])
    opts = MLEMOptions(cv=2, n_repeats=1, chunk_size=1, max_steps=30, batch_size=1000,
                       random_state=0)
    made = []

    class Counted(PairSetup):
        def __init__(self, *a, **kw):
            made.append(1)
            super().__init__(*a, **kw)

    monkeypatch.setattr(crossval, "PairSetup", Counted)
    shared = crossval.run_cv(crossval.DenseRDMSource(Y), y, opts)
    assert len(made) == 2                                       # one per fold, not per chunk
    monkeypatch.setattr(crossval, "_fold_setup", lambda *a: None)     # each chunk alone
    alone = crossval.run_cv(crossval.DenseRDMSource(Y), y, opts)
    assert shared.batch_size == alone.batch_size and shared.batch_size[0] < 4950
    np.testing.assert_array_equal(shared.W, alone.W)
    np.testing.assert_array_equal(shared.n_iter, alone.n_iter)
    np.testing.assert_array_equal(shared.importance, alone.importance)
    assert M == shared.W.shape[1]


@pytest.mark.parametrize("design", range(3))
def test_permuted_feature_keys_from_codes_equal_computed_distances(design, monkeypatch):
    """Block-wise feature importance (tiny memory budget): the permuted pairs' groups read
    from a table of stimulus codes give the drops of computing every permuted distance."""
    from mlem_neuro.core.memory import parse_size
    from mlem_neuro.core.runtime import Runtime
    from mlem_neuro.core.scoring import importance
    from mlem_neuro.core.training.metric import make_W
    table, space = _designs()[design]
    enc = space.fit_transform(table)
    m = enc.n_features
    i, j = pair_indices(len(table))
    rng = np.random.default_rng(7)
    W = make_W(torch.as_tensor(rng.standard_normal((2, m, m))), "spd")
    target = torch.as_tensor(rng.random((2, len(i))))
    runtime = Runtime(memory_bytes=parse_size("400KB"))          # the block-wise path
    used = []
    real = importance.PairFeatures.value_index
    monkeypatch.setattr(importance.PairFeatures, "value_index",
                        lambda self, f, vals: used.append(f) or real(self, f, vals))

    def run():
        return importance.feature_importance(W, enc.to_torch("cpu", torch.float64), i, j,
                                             target, 3, np.random.default_rng(8),
                                             runtime=runtime)

    fast = run()
    assert used == list(range(m))
    monkeypatch.setattr(importance.PairFeatures, "value_index", lambda self, f, vals: None)
    slow = run()
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
