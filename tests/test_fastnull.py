"""Null models that relabel the features (``core/scoring/fastnull.py``): the code universe, the
grouped sums, per-model counts in the soft Spearman, and the null statistics against the
analysis of a relabelled feature table."""
import numpy as np
import pandas as pd
import pytest
import torch

from mlem_neuro import crossval
from mlem_neuro.core.constants import MEMORY_BYTES
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.ranks import grouped
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.core.scoring import fastnull
from mlem_neuro.core.stimuli.features import FeatureSpace, feature_space
from mlem_neuro.core.training.engine import GroupedTargets
from mlem_neuro.crossval import run_cv

SMALL = dict(cv=3, n_repeats=1, max_steps=40, patience=10, n_permutations=3, level="feature")


def _table(n, seed, missing=False):
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({
        "A": rng.permutation(np.arange(n) % 2).astype(bool),
        "B": pd.Categorical(rng.choice(["x", "y", "z"], n)),
        "C": rng.permutation(np.arange(n) % 2).astype(bool)})
    if missing:
        table["B"] = table["B"].astype(object)
        table.loc[[1, 5], "B"] = np.nan
    return table


@pytest.mark.parametrize("missing", [False, True])
def test_universe_rows_are_the_pairs_distances(missing):
    """Every pair's row, and every row with one feature taken from other stimuli, is the
    distance row the encoding computes for it."""
    table = _table(30, 0, missing)
    enc = FeatureSpace().fit(table).transform(table)
    u = fastnull.code_universe(enc)
    et = enc.to_torch("cpu", torch.float64)
    rng = np.random.default_rng(1)
    i, j = (torch.as_tensor(rng.integers(0, 30, 200)) for _ in range(2))
    rows = u.pair_row[torch.as_tensor(u.codes)[i], torch.as_tensor(u.codes)[j]]
    np.testing.assert_array_equal(u.D_uniq[rows], et.pair_distances(i, j))
    for f in range(enc.n_features):
        perm = torch.as_tensor(rng.permutation(30))
        codes = torch.as_tensor(u.codes)
        swapped = torch.as_tensor(u.swap[f])[codes, codes[perm]]
        got = u.D_uniq[u.table[swapped[i], swapped[j]]]
        expected = et.pair_distances(i, j).clone()
        expected[:, f] = et.feature_distance(f, i, j, perm=perm)
        np.testing.assert_array_equal(got, expected)


def test_universe_refuses_too_many_rows():
    table = pd.DataFrame({"x": np.arange(300.0)})
    assert fastnull.code_universe(FeatureSpace().fit(table).transform(table)) is None


def test_group_sums_are_scatter_sums():
    rng = np.random.default_rng(2)
    tz = torch.as_tensor(rng.standard_normal((5, 40)))
    g = torch.as_tensor(rng.integers(0, 6, (7, 40)))
    sums, counts = fastnull.group_sums(tz, g, 6)
    for r in range(7):
        expected = torch.zeros(5, 6, dtype=torch.float64).index_add_(1, g[r], tz)
        np.testing.assert_allclose(sums[:, r], expected, atol=1e-12)
        np.testing.assert_array_equal(counts[r], torch.bincount(g[r], minlength=6))


@pytest.mark.parametrize("compiled", [True, False])
def test_rank_sums_are_sums_of_standardised_ranks(monkeypatch, watch_compiled, compiled):
    """rank_sums' sorted walk (compiled, or in torch) gives the sums of ranking each
    subset on its own, for rows with and without ties, large and small subsets and across
    row blocks."""
    from mlem_neuro.core.ranks.spearman import rankdata, standardize

    walked = watch_compiled("rank_walk", compiled)
    monkeypatch.setattr(fastnull, "RANK_WALK_ELEMENTS", 3 * 200)   # blocks of 3 rows
    rng = np.random.default_rng(3)
    D = torch.as_tensor(rng.random((8, 200)))
    D[2, 10] = D[2, 50]                                  # one tie
    D[5] = torch.round(D[5] * 5)                         # many ties
    sets = [(torch.as_tensor(np.sort(rng.choice(200, k, replace=False))), None)
            for k in (150, 120, 30, 2)]
    sets = [(lin, torch.as_tensor(rng.integers(0, 4, len(lin)))) for lin, _ in sets]
    sets[1] = (sets[1][0], torch.full((120,), 2))        # rows with no pairs in a set
    out = fastnull.rank_sums(D, sets, 4, compiled)
    for (lin, g), got in zip(sets, out):
        expected = torch.zeros(8, 4, dtype=torch.float64).index_add_(
            1, g, standardize(rankdata(D[:, lin])))
        np.testing.assert_allclose(got, expected, atol=1e-12)
    # compiled: one walk of every set per block of rows; in torch the library is not called
    assert len(walked) == (3 if compiled else 0) and all(w is not None for w in walked)


@pytest.mark.parametrize("U", [4, 300])
def test_compiled_rank_walk_sums_ranks_within_each_set(U):
    """Sets that share no pair share a channel; one-byte labels (up to 255 labels a
    channel) and four-byte ones give the sums of ranking each set on its own; a row with a
    tie, or with values too close for the packed keys, is marked for the caller."""
    from mlem_neuro.core import kernels
    from mlem_neuro.core.ranks.spearman import rankdata

    if not kernels.built():
        pytest.skip("the compiled library is not built")
    rng = np.random.default_rng(4)
    D = rng.random((5, 500))
    D[3, 7] = D[3, 100]
    D[1, 50] = 0.5
    D[1, 20] = np.nextafter(0.5, 1.0)     # kept bits equal, the index order wrong
    split = rng.permutation(500)
    lins = [np.sort(split[:300]), np.sort(split[300:340]),       # disjoint: one channel
            np.sort(rng.choice(500, 200, replace=False))]          # overlaps: another
    sets = [(torch.as_tensor(lin), torch.as_tensor(rng.integers(0, U, len(lin))))
            for lin in lins]
    labels, J, where = fastnull._walk_plan(sets, 500, U)
    assert where == [(0, 0), (0, 1), (1, 0)] and J == 2 and labels.shape == (2, 500)
    acc, redo = kernels.rank_walk(D, labels, J, U, compiled=True)
    np.testing.assert_array_equal(redo, [False, True, False, True, False])
    for (lin, g), (c, j) in zip(sets, where):
        expected = torch.zeros(5, U, dtype=torch.float64).index_add_(
            1, g, rankdata(torch.as_tensor(D[:, lin.numpy()])))
        got = acc[c, :, j * U:(j + 1) * U]
        np.testing.assert_array_equal(got[~redo], expected[~redo].numpy())


def test_rank_sums_on_random_designs(monkeypatch):
    """On random sets (nested, disjoint and overlapping, so channels of one to several
    sets; up to 300 distance rows, so one- and four-byte labels), rows with ties or an
    infinite distance (the compiled walk declines, torch walks) and blocks of rows, both
    paths give the sums of ranking each set on its own."""
    from mlem_neuro.core import kernels
    from mlem_neuro.core.ranks.spearman import rankdata, standardize

    rng = np.random.default_rng(5)
    for _ in range(40):
        P, M = int(rng.integers(2, 300)), int(rng.integers(1, 6))
        U = int(rng.choice([1, 8, 300]))
        D = torch.as_tensor(rng.random((M, P)))
        if rng.random() < 0.3:
            D = torch.round(D * 5) / 7                          # ties
        if rng.random() < 0.1:
            D[0, 0] = float("inf")
        perm, sets = rng.permutation(P), []
        for _ in range(int(rng.integers(1, 6))):
            if rng.random() < 0.5:
                a, b = sorted(rng.integers(0, P, 2))
                lin = np.sort(perm[a:b + 1])
            else:
                lin = np.sort(rng.choice(P, int(rng.integers(1, P + 1)), replace=False))
            sets.append((torch.as_tensor(lin), torch.as_tensor(rng.integers(0, U, len(lin)))))
        monkeypatch.setattr(fastnull, "RANK_WALK_ELEMENTS", int(rng.integers(1, 4)) * P)
        for compiled in ([True, False] if kernels.built() else [False]):
            for (lin, g), got in zip(sets, fastnull.rank_sums(D, sets, U, compiled)):
                expected = torch.zeros(M, U, dtype=torch.float64).index_add_(
                    1, g, standardize(rankdata(D[:, lin])))
                np.testing.assert_allclose(got, expected, atol=1e-10)


def test_per_model_counts_give_the_shared_counts_values_and_gradients():
    rng = np.random.default_rng(3)
    pred = torch.as_tensor(rng.random((6, 9)), dtype=torch.float64)
    counts = torch.as_tensor(rng.integers(1, 50, 9))
    sums = torch.as_tensor(rng.standard_normal((6, 9)))
    out = []
    for c in (counts, counts[None].expand(6, 9)):
        p = pred.clone().requires_grad_(True)
        rho = grouped.grouped_soft_spearman(p, c, sums, 1.0)
        rho.sum().backward()
        out.append((rho.detach(), p.grad))
    np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out[1][1], out[0][1], rtol=1e-10, atol=1e-12)


def test_a_missing_row_weighs_nothing():
    """A row a model lacks (count ABSENT_COUNT) changes its soft Spearman by < 1e-8."""
    rng = np.random.default_rng(4)
    pred = torch.as_tensor(rng.random((4, 8)), dtype=torch.float64)
    counts = torch.as_tensor(rng.integers(1, 50, 8)).double()
    sums = torch.as_tensor(rng.standard_normal((4, 8)))
    sums[:, 3] = 0.0
    with_row = counts.clone()
    with_row[3] = GroupedTargets.ABSENT_COUNT
    keep = [u for u in range(8) if u != 3]
    a = grouped.grouped_soft_spearman(pred, with_row[None].expand(4, 8), sums, 1.0)
    b = grouped.grouped_soft_spearman(pred[:, keep], counts[keep], sums[:, keep], 1.0)
    np.testing.assert_allclose(a, b, atol=1e-8)


def _data(seed, n=27, C=5, T=3):
    rng = np.random.default_rng(seed)
    table = _table(n, seed)
    Y = rng.standard_normal((T, n, C))
    Y += 0.8 * np.asarray(table["A"], float)[None, :, None] * rng.standard_normal(C)
    return Y, table


@pytest.mark.parametrize("interactions", [True, False])
def test_null_statistics_are_those_of_the_relabelled_table(monkeypatch, interactions):
    """Null replicate r of test t is the analysis of the table whose row s is row
    perms[t, r, s] (same folds, same training stream, same importance permutations)."""
    Y, table = _data(5)
    n = len(table)
    rng = np.random.default_rng(6)
    perms = np.stack([np.stack([rng.permutation(n) for _ in range(2)]) for _ in range(4)])
    monkeypatch.setattr(crossval, "_draw_nulls", lambda opts, enc, design, rng: perms)
    calls = []
    real = fastnull.null_statistics
    monkeypatch.setattr(fastnull, "null_statistics",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    source = DenseRDMSource(Y)
    opts = MLEMOptions(**SMALL, interactions=interactions, n_null=2, random_state=0)
    out = run_cv(source, table, opts)
    assert calls                                           # the fast path ran
    plain = MLEMOptions(**SMALL, interactions=interactions, random_state=0)
    names = out.feature_names
    for t in range(4):
        for r in range(2):
            ref = run_cv(source, table.iloc[perms[t, r]].reset_index(drop=True), plain)
            expected = ref.score if t == 0 else ref.importance[:, :, ref.terms.index(
                names[t - 1])]
            # measured: equal to 1e-16 (float32 training of the same numbers)
            np.testing.assert_allclose(out.fold_null[:, :, t, r], expected, atol=1e-6)


def test_the_fast_path_is_used_only_where_it_applies():
    Y, table = _data(7)
    numeric = table.assign(A=np.random.default_rng(0).random(len(table)))
    layout = []
    for name, tab, level in [("categorical", table, "feature"), ("term", table, "term"),
                             ("numeric", numeric, "feature")]:
        opts = MLEMOptions(**{**SMALL, "level": level}, n_null=2, random_state=0)
        null = np.zeros((4, 2, len(tab)), dtype=int)
        rows = []
        folds = crossval.check_cv(3, len(tab), np.random.default_rng(0))
        for f, (train, test) in enumerate(folds):
            space = feature_space(opts).fit(tab.iloc[train])
            rows.append(crossval.FoldPlan(f, train, test, space.transform(tab.iloc[train]),
                                          space.transform(tab.iloc[test]), 1 + f))
        plans = crossval._null_plans(rows, tab, opts, null, MEMORY_BYTES)
        layout.append((name, [p is not None for p in plans]))
    assert layout == [("categorical", [True] * 3), ("term", [False] * 3),
                      ("numeric", [False] * 3)]


def test_interaction_test_scores_are_those_of_run_cv(monkeypatch):
    """The non-additivity test's shared-rank path gives the statistics of fitting the
    null datasets through run_cv (measured: equal to 1e-17)."""
    from mlem_neuro import interaction as additivity

    Y, table = _data(8, n=30)
    source = DenseRDMSource(Y)
    opts = MLEMOptions(cv=3, n_repeats=1, max_steps=60, patience=10, random_state=0)
    fast = additivity.interaction_test(source, table, opts, n_null=3, random_state=1)
    monkeypatch.setattr(fastnull, "interaction_scores", lambda *a, **k: None)
    slow = additivity.interaction_test(source, table, opts, n_null=3, random_state=1)
    np.testing.assert_allclose(fast[0], slow[0], atol=1e-9)
    np.testing.assert_allclose(fast[1], slow[1], atol=1e-9)


def test_interaction_scores_do_not_depend_on_n_jobs():
    """With n_jobs=2 the test's blocks of models train in two worker processes; the
    statistics are the same as in one process (each model trains on its own)."""
    from mlem_neuro import interaction as additivity

    Y, table = _data(8, n=30)
    source = DenseRDMSource(Y)
    out = [additivity.interaction_test(
        source, table, MLEMOptions(cv=3, n_repeats=1, max_steps=60, patience=10, random_state=0,
                                   n_jobs=jobs), n_null=3, random_state=1)
        for jobs in (1, 2)]
    np.testing.assert_allclose(out[0][0], out[1][0], atol=1e-9)
    np.testing.assert_allclose(out[0][1], out[1][1], atol=1e-9)


def test_interaction_scores_decline_mini_batches():
    Y, table = _data(9)
    opts = MLEMOptions(cv=3, n_repeats=1, batch_size=50)
    folds = crossval.check_cv(3, len(table), np.random.default_rng(0))
    assert fastnull.interaction_scores(DenseRDMSource(Y), table, opts, folds,
                                       ("spd", "diagonal")) is None


@pytest.mark.parametrize("method", ["table", "pav"])
def test_per_model_counts_on_the_torch_path(monkeypatch, method):
    """The chain of torch operations (used on a GPU) gives the fused CPU pass's values and
    gradients with a row of counts per model (measured: 3e-16)."""
    g = torch.Generator().manual_seed(5)
    counts = torch.randint(1, 90, (6, 20), generator=g).double()
    pred = torch.randn(6, 20, dtype=torch.float64, generator=g)
    sums = torch.randn(6, 20, dtype=torch.float64, generator=g)
    out = []
    for fused in (True, False):
        monkeypatch.setattr(grouped, "USE_FUSED", fused)
        monkeypatch.setattr(grouped, "_isotonic_method", lambda *a: method)
        p = pred.clone().requires_grad_(True)
        rho = grouped.grouped_soft_spearman(p, counts, sums, 1.0)
        rho.sum().backward()
        out.append((rho.detach(), p.grad))
    assert out[0][1].abs().max() > 1e-3                  # a gradient worth comparing
    np.testing.assert_allclose(out[1][0], out[0][0], atol=1e-12)
    np.testing.assert_allclose(out[1][1], out[0][1], atol=1e-12)
