"""Permutation tests of designs with a numeric feature (issue 28, item 4): the faster
computations give the numbers of the computations they replace."""
import numpy as np
import pytest
import torch

from mlem_neuro.core.constants import MEMORY_BYTES
from mlem_neuro.core.scoring import fastnull
from mlem_neuro.core.stimuli.features import feature_space


def _one_hot_sums(tz, g, U):
    """The previous :func:`fastnull.group_sums`: a product with one-hot rows."""
    R, P = g.shape
    out = torch.empty(tz.shape[0], R, U, dtype=torch.float64)
    for r in range(R):
        onehot = torch.zeros(P, U, dtype=torch.float64)
        onehot[torch.arange(P), g[r]] = 1.0
        out[:, r] = tz.double() @ onehot
    return out


def test_group_sums_are_the_one_hot_products():
    gen = torch.Generator().manual_seed(0)
    M, R, P, U = 3, 5, 200, 40
    tz = torch.randn(M, P, generator=gen, dtype=torch.float64)
    g = torch.randint(0, U - 3, (R, P), generator=gen)           # some rows absent
    sums, counts = fastnull.group_sums(tz, g, U)
    np.testing.assert_allclose(sums.numpy(), _one_hot_sums(tz, g, U).numpy(), atol=1e-12)
    expected = np.stack([np.bincount(row, minlength=U) for row in g.numpy()])
    np.testing.assert_array_equal(counts.numpy(), expected)
    assert (sums[:, :, U - 3:] == 0).all()


def _fas_design(n=36, seed=0):
    """A binary relatedness and a numeric association strength with few values (> 0 for
    most related stimuli, 0 for the others), and data that depend on both."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    related = rng.permutation(np.arange(n) % 2)
    fas = np.where(related == 1, rng.choice([0.0, 0.1, 0.25, 0.4, 0.7, 1.0], n), 0.0)
    table = pd.DataFrame({"relatedness": related.astype(str), "FAS": fas})
    Y = rng.normal(size=(2, n, 6))
    Y[:, :, 0] += 2.0 * related + 3.0 * fas
    return Y, table


@pytest.mark.parametrize("cv", [3, 6])
def test_numeric_null_statistics_are_those_of_the_relabelled_table(monkeypatch, cv):
    """With a numeric feature of few values the null models relabel the features: null
    replicate r of test t is the analysis of the table whose row s is row perms[t, r, s],
    each null model trained on its own rows (several stacks); held-out scores grouped by
    rows (cv=3: 24 rows, 66 held-out pairs) or pair by pair (cv=6: 15 pairs)."""
    from mlem_neuro import crossval
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.crossval import run_cv

    Y, table = _fas_design()
    n = len(table)
    rng = np.random.default_rng(1)
    perms = np.stack([np.stack([rng.permutation(n) for _ in range(3)]) for _ in range(3)])
    monkeypatch.setattr(crossval, "_draw_nulls",
                        lambda opts, enc, design, rng: perms)
    stacks = []
    real = fastnull.fit_grouped
    monkeypatch.setattr(fastnull, "fit_grouped",
                        lambda *a, **k: stacks.append(a[1].shape) or real(*a, **k))
    small = dict(cv=cv, n_repeats=1, max_steps=60, patience=10, n_permutations=3, interactions=True)
    source = DenseRDMSource(Y)
    out = run_cv(source, table, MLEMOptions(**small, n_null=3, random_state=0))
    assert len(stacks) > 3                       # the fast path, a stack per row set
    names = out.feature_names
    compared = 0
    for t in range(3):
        for r in range(3):
            ref = run_cv(source, table.iloc[perms[t, r]].reset_index(drop=True),
                         MLEMOptions(**small, random_state=0))
            if any(not np.array_equal(a[1], b[1]) for a, b in zip(ref.folds, out.folds)):
                continue        # the table's own folds (a split usable for its values)
            compared += 1
            expected = ref.score if t == 0 else ref.importance[:, :, ref.terms.index(
                names[t - 1])]
            # measured: equal to 3e-17 (float32 training of the same numbers)
            np.testing.assert_allclose(out.fold_null[:, :, t, r], expected, atol=1e-6)
    assert compared >= 7


@pytest.mark.parametrize("U", [7, 300])
def test_held_out_scores_are_spearman_of_the_pairs(U):
    """Grouped by rows (fewer rows than pairs) or pair by pair (more): the tie-aware
    Spearman of each grouping's pair predictions against the targets."""
    from scipy.stats import spearmanr

    from mlem_neuro.core.ranks.spearman import rankdata, standardize

    gen = torch.Generator().manual_seed(1)
    M, R, K, P = 2, 3, 4, 40
    q = torch.randint(0, 5, (M, R, U), generator=gen).double()     # many ties
    target = torch.randn(M, P, generator=gen, dtype=torch.float64)
    tzt = standardize(rankdata(target))
    g = torch.randint(0, U, (R, K, P), generator=gen)
    got = fastnull._held_out_scores(q, g, tzt, P)
    assert got.shape == (M, R, K)
    for m in range(M):
        for r in range(R):
            for k in range(K):
                expected = spearmanr(q[m, r, g[r, k]].numpy(), target[m].numpy())[0]
                np.testing.assert_allclose(got[m, r, k], expected, atol=1e-12)


def _rare_maximum_design(n=36, seed=0):
    """:func:`_fas_design` with the largest association held by one stimulus only: the
    relabelled tables whose training stimuli lack it scale ``FAS`` by another range."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    related = rng.permutation(np.arange(n) % 2)
    fas = np.where(related == 1, rng.choice([0.0, 0.1, 0.25, 0.4, 0.7], n), 0.0)
    fas[np.flatnonzero(related == 1)[0]] = 1.0
    table = pd.DataFrame({"relatedness": related.astype(str), "FAS": fas})
    Y = rng.normal(size=(2, n, 6))
    Y[:, :, 0] += 2.0 * related + 3.0 * fas
    return Y, table


def test_null_models_scale_numeric_features_as_their_relabelled_tables(monkeypatch):
    """A relabelled table whose training stimuli lack the largest value fits another
    min-max scale: its null model trains and scores on its own encoding's distances, as
    the analysis of that table does (the fold's scale gave differences up to 0.1 here),
    and the identity's null statistics are the observed statistics."""
    from mlem_neuro import crossval
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.crossval import run_cv

    Y, table = _rare_maximum_design()
    n = len(table)
    rng = np.random.default_rng(0)
    perms = np.stack([np.stack([np.arange(n)] + [rng.permutation(n) for _ in range(4)])
                      for _ in range(3)])
    monkeypatch.setattr(crossval, "_draw_nulls", lambda opts, enc, design, rng: perms)
    calls = []
    real = fastnull.null_statistics
    monkeypatch.setattr(fastnull, "null_statistics",
                        lambda *a, **k: calls.append(a[-1]) or real(*a, **k))
    small = dict(cv=3, n_repeats=1, max_steps=60, patience=10, n_permutations=3,
                 interactions=True)
    source = DenseRDMSource(Y)
    out = run_cv(source, table, MLEMOptions(**small, n_null=5, random_state=0))
    assert len(calls) == 3                                 # every fold's nulls relabel features
    # the identity: the observed fits, scored grouped (equal up to the order of the sums)
    np.testing.assert_allclose(out.fold_null[:, :, 0, 0], out.score, atol=1e-12)
    for f, name in enumerate(out.feature_names):
        np.testing.assert_allclose(out.fold_null[:, :, 1 + f, 0],
                                   out.importance[:, :, out.terms.index(name)], atol=1e-12)
    top = np.flatnonzero(table["FAS"].to_numpy() == 1.0)[0]
    rescaled = compared = 0
    for t in range(3):
        for r in range(1, 5):
            ref = run_cv(source, table.iloc[perms[t, r]].reset_index(drop=True),
                         MLEMOptions(**small, random_state=0))
            assert all(np.array_equal(a[1], b[1]) for a, b in zip(ref.folds, out.folds))
            compared += 1
            # folds where the relabelled training stimuli lack the maximum and the
            # fold's own have it, or the reverse: another scale
            rescaled += sum((top in perms[t, r][tr]) != (top in tr) for tr, _ in out.folds)
            expected = ref.score if t == 0 else ref.importance[:, :, ref.terms.index(
                out.feature_names[t - 1])]
            # measured: equal to 1e-16 (float32 training of the same numbers)
            np.testing.assert_allclose(out.fold_null[:, :, t, r], expected, atol=1e-6)
    assert compared == 12 and rescaled >= 6


def test_refit_scales_are_those_of_fitting_on_the_rows():
    """The scales of a fit on other stimuli, to the bit: floats with missing values,
    integers (taken minus their own minimum), a multi-column feature, an ordinal
    categorical, a categorical; None where such a fit would change more than scales."""
    import pandas as pd

    from mlem_neuro.core.stimuli.features import FeatureSpace

    rng = np.random.default_rng(2)
    n = 30
    table = pd.DataFrame({
        "x": rng.gamma(2.0, 0.1, n), "k": rng.integers(3, 40, n),
        "u": rng.random(n), "v": rng.random(n) * 7.0,
        "o": pd.Categorical(rng.choice(["lo", "mid", "hi"], n), categories=["lo", "mid", "hi"],
                            ordered=True),
        "c": rng.choice(["a", "b", "c"], n)})
    table.loc[[2, 7], "x"] = np.nan
    groups = {"uv": ["u", "v"]}
    space = FeatureSpace(groups=groups).fit(table.iloc[:20])
    rows = np.stack([rng.permutation(n)[:20] for _ in range(8)])
    got = space.refit_scales(table, rows)
    assert got.shape == (8, 6)
    for r, row in enumerate(rows):
        expected = FeatureSpace(groups=groups).fit(table.iloc[row]).transform(table)
        np.testing.assert_array_equal(got[r], expected.column_scale())
    assert len({tuple(s) for s in got}) == 8                    # the scales differ
    # ordinal levels taken from the values present: a set without "hi" has other levels
    plain = table[["k"]].assign(level=np.where(np.arange(n) < 3, 2, np.arange(n) % 2))
    space = FeatureSpace(kinds={"level": "ordinal"}).fit(plain.iloc[:20])
    assert space.refit_scales(plain, np.arange(20)[None]) is not None
    assert space.refit_scales(plain, np.arange(3, 23)[None]) is None
    # a numeric feature constant over a set: its fit refuses it
    flat = table[["x"]].assign(x=np.where(np.arange(n) < 20, 1.0, 2.0))
    space = FeatureSpace().fit(flat)
    assert space.refit_scales(flat, np.arange(20)[None]) is None


def test_universe_rows_at_refitted_scales_are_the_refitted_distances():
    """The universe's rows at another fit's scales are that fit's distances of the
    stimuli's pairs (up to the offset's rounding, far below the distances' 2**-30
    grid); at the encoding's own scales they are its rows."""
    import pandas as pd

    from mlem_neuro.core.stimuli.features import FeatureSpace

    rng = np.random.default_rng(3)
    n = 40
    table = pd.DataFrame({"related": rng.integers(0, 2, n).astype(str),
                          "FAS": 0.2 + rng.choice([0.0, 0.15, 0.3, 0.55, 1.1], n)})
    space = FeatureSpace().fit(table.iloc[:25])
    u = fastnull.code_universe(space.transform(table))
    np.testing.assert_array_equal(u.rows_at(u.encoded.column_scale()), u.D_uniq)
    i, j = (torch.as_tensor(x) for x in np.triu_indices(n, 1))
    codes = torch.as_tensor(u.codes)
    rows = u.pair_row[codes[i], codes[j]]
    for keep in (np.flatnonzero(table["FAS"] > 0.2), np.flatnonzero(table["FAS"] < 1.0)):
        refit = FeatureSpace().fit(table.iloc[keep]).transform(table)
        assert not np.array_equal(refit.scale, space.transform(table).scale)
        got = u.rows_at(refit.scale)[rows]
        expected = torch.as_tensor(refit.pair_distances(i.numpy(), j.numpy()))
        assert (got - expected).abs().max() <= 2.0 ** -30


def _plans(table, opts, folds, null):
    from mlem_neuro import crossval

    rows = []
    for f, (train, test) in enumerate(folds):
        space = feature_space(opts).fit(table.iloc[train])
        rows.append(crossval.FoldPlan(f, train, test, space.transform(table.iloc[train]),
                                      space.transform(table.iloc[test]), 1 + f))
    return [p is not None for p in crossval._null_plans(rows, table, opts, null,
                                                         MEMORY_BYTES)]


def test_numeric_null_models_relabel_features_only_where_their_tables_train_grouped():
    """The null models of a numeric feature relabel the features where the fold and every
    relabelled table train grouped on exact rows: few values (yes); many values, trained
    on the grid or, with ``numeric_levels=None``, pair by pair (no); a fold of few rows
    whose relabelled tables have too many (no: their analyses train on the grid)."""
    import pandas as pd

    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.crossval import check_cv

    rng = np.random.default_rng(4)
    n = 45
    few = pd.DataFrame({"related": (np.arange(n) % 2).astype(str),
                        "FAS": rng.choice([0.0, 0.1, 0.25, 0.5, 1.0], n)})
    many = few.assign(FAS=rng.random(n))
    folds = check_cv(3, n, np.random.default_rng(0))
    null = np.stack([np.stack([rng.permutation(n) for _ in range(3)]) for _ in range(3)])
    opts = MLEMOptions(cv=3, n_null=3)
    assert _plans(few, opts, folds, null) == [True] * 3
    assert _plans(many, opts, folds, null) == [False] * 3                   # the grid
    exact = MLEMOptions(cv=3, n_null=3, numeric_levels=None)
    assert _plans(many, exact, folds, null) == [False] * 3                  # pair by pair
    # 25 stimuli at 0 and 20 distinct values: training on the zeros and 5 values takes 16
    # rows (of 435 pairs), on 10 zeros and the 20 values 211 (more than a quarter)
    zeros = pd.DataFrame({"FAS": np.r_[np.zeros(25), 0.05 * np.arange(1, 21) ** 1.3]})
    train, test = np.r_[np.arange(25), 25 + np.arange(5)], 30 + np.arange(15)
    keep = np.arange(n)
    keep[train[:15]], keep[test] = test, train[:15]      # 15 zeros <-> the held-out values
    assert _plans(zeros, opts, [(train, test)], keep[None, None]) == [False]
    assert _plans(zeros, opts, [(train, test)], np.arange(n)[None, None]) == [True]


def _repeating_design(n=60, distinct=25, seed=5):
    """A covariate that is 0 for most stimuli and takes ``distinct`` values on the others
    (as ``FAS`` in ``benchmarks/bench_numeric_null.py``), beside a binary feature: its
    pairs fall into a few hundred exact distance rows."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    fas = np.zeros(n)
    fas[:distinct] = rng.gamma(2.0, 0.08, distinct)
    fas = fas[rng.permutation(n)]
    return pd.DataFrame({"related": np.where(fas > 0, "yes", "no"), "FAS": fas})


def test_many_exact_rows_train_on_the_grid():
    """Pairs of a numeric covariate whose values repeat fall into hundreds of exact rows:
    beyond TARGET_CELLS they train on the grid's fewer cells (``"auto"``), exactly with
    ``numeric_levels=None``; a covariate of few values keeps its exact rows."""
    from mlem_neuro.core.constants import TARGET_CELLS
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.stimuli.features import FeatureSpace
    from mlem_neuro.core.training.engine import PairSetup

    def setup(table, levels):
        enc = FeatureSpace().fit_transform(table)
        return PairSetup(enc, MLEMOptions(numeric_levels=levels).fit_kwargs(),
                         np.random.default_rng(0), "cpu", torch.float32)

    table = _repeating_design()
    exact = setup(table, None)
    assert exact.levels is None and exact.groups[0].shape[0] > TARGET_CELLS
    grid = setup(table, "auto")
    assert grid.levels == 16 and grid.groups[0].shape[0] < TARGET_CELLS
    few = table.assign(FAS=np.round(table["FAS"] * 20) / 20)    # a few values
    assert setup(few, "auto").levels is None


def test_tables_relabelled_onto_many_rows_relabel_the_data_and_interactions_refit():
    """A fold of few exact rows whose relabelled tables have more than TARGET_CELLS (their
    analyses train on the grid) relabels the data; the test of interactions of a design
    of many rows fits its null datasets through run_cv (which trains on the grid)."""
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.rdms.sources import DenseRDMSource

    table = _repeating_design(n=90, distinct=30)
    n = len(table)
    order = np.argsort(table["FAS"].to_numpy())           # the 60 zeros, then the values
    train, test = np.sort(order[:70]), np.sort(order[70:])  # training: 10 values, 55 rows
    swap = np.arange(n)
    swap[train[:20]], swap[test] = test, train[:20]         # training: 30 values, 496 rows
    opts = MLEMOptions(cv=3, n_null=1)
    assert _plans(table, opts, [(train, test)], np.arange(n)[None, None]) == [True]
    assert _plans(table, opts, [(train, test)], swap[None, None]) == [False]
    exact = MLEMOptions(cv=3, n_null=1, numeric_levels=None)
    assert _plans(table, exact, [(train, test)], swap[None, None]) == [True]
    # 120 training stimuli: 932 rows in the universe, at most a quarter of the 7,140 pairs
    table = _repeating_design(n=150, distinct=30)
    rng = np.random.default_rng(1)
    split = rng.permutation(len(table))
    folds = [(np.sort(split[:120]), np.sort(split[120:]))]
    source = DenseRDMSource(rng.normal(size=(1, len(table), 4)))
    assert fastnull.interaction_scores(source, table, opts, folds,
                                       ("spd", "diagonal")) is None
    few = table.assign(FAS=np.round(table["FAS"] * 20) / 20)   # a few values
    assert fastnull.interaction_scores(source, few, opts, folds,
                                       ("spd", "diagonal")) is not None


@pytest.mark.parametrize("design", ["few values", "continuous"])
def test_numeric_tests_are_calibrated_on_null_data(monkeypatch, design):
    """Data unrelated to the features: each test's p-values reach 0.05 at the nominal
    rate (1 in 20 with 19 nulls), within a 99.99 % binomial interval over 60 datasets of
    4 independent models (time points) and 3 tests (720 p-values: 16 to 61 at 0.05; a
    test at twice the rate gives about 72).  ``"few values"``: the null models relabel
    the features, each with its own numeric scale; ``"continuous"``: the folds train on
    the grid and the null models relabel the data.  The features' tests read the held-out
    importance (the null models' statistic).  Measured over 240 datasets (960 p-values a
    test): 0.038-0.047 per test (few values), 0.041-0.045 (continuous); seeds 0-59 give
    31 and 23 of 720."""
    from scipy.stats import binom

    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.crossval import run_cv

    fast = []
    real = fastnull.null_statistics
    monkeypatch.setattr(fastnull, "null_statistics",
                        lambda *a, **k: fast.append(1) or real(*a, **k))
    n_data = 60
    # the features' tests read the held-out importance: the null models' statistic (the
    # default, staged, test reads the main effect alone in an additive model)
    opts = dict(cv=2, n_repeats=1, max_steps=30, patience=5, n_permutations=2, n_null=19,
                interactions=False, null="marginal", feature_test="importance")
    hits = trials = 0
    for seed in range(n_data):
        rng = np.random.default_rng(100 + seed)
        _, table = _rare_maximum_design(n=24 if design == "few values" else 40, seed=seed)
        if design == "continuous":
            table = table.assign(FAS=rng.random(len(table)))
        Y = rng.normal(size=(4, len(table), 5))
        out = run_cv(DenseRDMSource(Y), table, MLEMOptions(**opts, random_state=seed))
        _, p, _ = out.pvalues()
        hits += int((p <= 0.05).sum())
        trials += p.size
    assert trials == 4 * 3 * n_data
    assert (len(fast) > 0) == (design == "few values")     # the path the design takes
    low, high = binom.interval(0.9999, trials, 1 / 20)
    assert low <= hits <= high, (hits, trials)
