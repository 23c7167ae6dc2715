"""The features' main effects (partial rank correlations) and the combined feature test:
exact against a direct computation, their permutation tests calibrated and powered on
simulated data where the truth is known, and wired into the analyses."""
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from mlem_neuro.core.constants import MAIN_EFFECT_NULLS, STAGED_GATE
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.core.runtime import Runtime
from mlem_neuro.core.scoring.main_effect import (
    MainEffects,
    combine,
    main_effect_tests,
    pair_columns,
    staged,
)
from mlem_neuro.core.scoring.nulls import null_permutations, permuted_pairs
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.crossval import run_cv
from mlem_neuro.inference import run_analysis


def _table(n, rng):
    return pd.DataFrame({"a": rng.choice(["x", "y", "z"], n),
                         "b": rng.choice(["u", "v"], n),
                         "c": rng.normal(size=n)})


def _direct(D, y, f):
    """Partial Spearman of feature f's distance with y, the others' held fixed (numpy)."""
    R = np.column_stack([stats.rankdata(col) for col in D.T])
    ry = stats.rankdata(y)
    others = np.column_stack([np.ones(len(y))] + [R[:, g] for g in range(R.shape[1])
                                                    if g != f])

    def resid(v):
        return v - others @ np.linalg.lstsq(others, v, rcond=None)[0]

    a, b = resid(R[:, f]), resid(ry)
    return a @ b / np.sqrt((a @ a) * (b @ b))


@pytest.mark.parametrize("grouped", [False, True])
def test_observed_and_null_equal_a_direct_computation(grouped):
    rng = np.random.default_rng(0)
    n = 18
    table = _table(n, rng)
    space = FeatureSpace().fit(table)
    enc = space.transform(table)
    X = rng.normal(size=(3, n, 5))
    source = DenseRDMSource(X, "euclidean")
    groups = np.repeat([0, 1, 2], 6) if grouped else None
    cols = pair_columns(n, groups)
    effects = MainEffects(enc, cols)
    i, j = pair_indices(n)
    D = enc.pair_distances(i, j)
    rdm = source.rdm(np.arange(n))
    keep = slice(None) if cols is None else cols
    obs = effects.observed(rdm).numpy()
    for model in range(3):
        for f in range(3):
            want = _direct(D[keep], rdm[model].numpy()[keep], f)
            assert obs[model, f] == pytest.approx(want, abs=1e-10)
    # a null dataset is the relabelled data: its statistic is the observed one of the
    # relabelled RDM (within groups when grouped)
    perms = null_permutations(enc, space.kinds_, 4, rng, groups=groups)[2]
    got = effects.null(rdm, perms, 1).numpy()
    for r, perm in enumerate(perms):
        moved = rdm[:, torch.as_tensor(permuted_pairs(perm[None], np.arange(n), n)[0])]
        assert got[:, r] == pytest.approx(effects.observed(moved)[:, 1].numpy(), abs=1e-10)


def test_a_feature_whose_distance_the_others_give_has_no_main_effect():
    n = 12
    table = pd.DataFrame({"a": np.repeat(["p", "q", "r", "s"], 3)})
    table["b"] = table.a.map({"p": "u", "q": "v", "r": "w", "s": "x"})   # a renamed
    table["c"] = np.tile(["k", "l", "m"], 4)
    space = FeatureSpace().fit(table)
    effects = MainEffects(space.transform(table))
    rdm = torch.as_tensor(np.random.default_rng(1).random((2, n * (n - 1) // 2)))
    obs = effects.observed(rdm).numpy()
    # neither duplicate has an effect of its own; the third feature has
    assert np.isnan(obs[:, :2]).all() and np.isfinite(obs[:, 2]).all()


def test_combine_is_a_permutation_test_of_the_max():
    """Statistics exchangeable with their nulls give uniform p-values after combining
    (2,000 simulated tests, two correlated parts): the rate at 0.05 stays within its
    99.9 % binomial interval; one part alone keeps its own p-values; a part that is NaN
    for a model leaves the other's p-value, and two NaN parts give NaN."""
    rng = np.random.default_rng(2)
    n_null, N = 99, 2000
    hits = 0
    for _ in range(N):
        z = rng.normal(size=(n_null + 1, 1))
        a = z + 0.5 * rng.normal(size=(n_null + 1, 1))
        b = 3 * (z ** 2) + rng.normal(size=(n_null + 1, 1))          # another scale
        obs, null = combine([a[0], b[0]], [a[1:], b[1:]])
        p = (1 + (null[:, 0] >= obs[0] - 1e-12).sum()) / (1 + n_null)
        hits += p <= 0.05
    lo, hi = stats.binom.ppf([0.0005, 0.9995], N, 0.05)
    assert lo <= hits <= hi
    a = rng.normal(size=(n_null + 1, 4))
    obs, null = combine([a[0]], [a[1:]])
    assert ((null >= obs - 1e-12).sum(0) == (a[1:] >= a[0]).sum(0)).all()
    b = rng.normal(size=(n_null + 1, 4))
    b[:, 1] = np.nan
    a[:, 2] = b[:, 2] = np.nan
    obs, null = combine([a[0], b[0]], [a[1:], b[1:]])
    assert ((null[:, 1] >= obs[1] - 1e-12).sum() == (a[1:, 1] >= a[0, 1]).sum())
    assert np.isnan(obs[2]) and np.isnan(null[:, 2]).all()
    assert np.isfinite(obs[[0, 1, 3]]).all()


def _simulate(n, amp_b, rng, units=8):
    a = rng.integers(0, 3, n)
    b = rng.integers(0, 2, n)
    X = rng.normal(size=(n, units))
    X += 1.0 * rng.normal(size=(3, units))[a] + amp_b * rng.normal(size=(2, units))[b]
    # b correlated with nothing here; a strong beside it
    return X, pd.DataFrame({"a": [f"a{k}" for k in a], "b": [f"b{k}" for k in b]})


def _p_main(X, table, rng, n_null=99):
    space = FeatureSpace().fit(table)
    enc = space.transform(table)
    null = null_permutations(enc, space.kinds_, n_null, rng)
    obs, nul = main_effect_tests(DenseRDMSource(X[None], "euclidean"), enc, null)
    return (1 + (nul[0, 1] >= obs[0, 1] - 1e-12).sum()) / (1 + n_null)


def test_main_effect_test_is_calibrated_and_finds_an_injected_effect():
    """A non-encoded feature beside a strong one: p < 0.05 in at most the upper 99.9 %
    binomial bound of 300 null datasets (nominal 15); an encoded one (amplitude 1.0,
    24 stimuli, 8 units) is found in most (measured 0.90-1.0 over 20 seeds of 40, mean
    0.95: the bound 0.80 fails with probability below 0.001 at 0.95)."""
    rng = np.random.default_rng(3)
    null_hits = sum(_p_main(*_simulate(24, 0.0, rng), rng) <= 0.05 for _ in range(300))
    lo, hi = stats.binom.ppf([0.0005, 0.9995], 300, 0.05)
    assert lo <= null_hits <= hi
    power = np.mean([_p_main(*_simulate(24, 1.0, rng), rng) <= 0.05 for _ in range(40)])
    assert power >= 0.80


def _xor(n, amp, rng, units=16):
    a, b = np.arange(n) % 2, (np.arange(n) // 2) % 2
    X = rng.normal(size=(n, units)) + amp * rng.normal(size=(2, units))[a ^ b]
    return X, pd.DataFrame({"A": [f"a{k}" for k in a], "B": [f"b{k}" for k in b]})


def test_run_cv_combines_the_two_parts_and_importance_keeps_the_former_test():
    rng = np.random.default_rng(4)
    X, table = _simulate(24, 0.5, rng)
    source = DenseRDMSource(X[None], "euclidean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        comb = run_cv(source, table, MLEMOptions(n_null=9, random_state=0, max_steps=50,
                                                 feature_test="combined"))
        imp = run_cv(source, table, MLEMOptions(n_null=9, random_state=0, max_steps=50,
                                                feature_test="importance"))
        main = run_cv(source, table, MLEMOptions(n_null=9, random_state=0, max_steps=50,
                                                 feature_test="main_effect"))
    assert comb.main_effect.shape == (1, 2) and imp.parts == {}
    assert (comb.feature_test, imp.feature_test, main.feature_test) == (
        "combined", "importance", "main_effect")
    for name in ("a", "b"):             # the main effect alone: its own null
        np.testing.assert_allclose(main.tests[name][0], main.parts[name]["main_effect"][0])
        np.testing.assert_allclose(main.parts[name]["main_effect"][1],
                                   comb.parts[name]["main_effect"][1])
        # ... on every relabelling drawn for it: the trained tests' 9 first, then more
        assert main.tests[name][1].shape == (MAIN_EFFECT_NULLS, 1)
        assert comb.tests[name][1].shape == imp.tests[name][1].shape == (9, 1)
        np.testing.assert_allclose(main.tests[name][1][:9], comb.parts[name]["main_effect"][1])
    for name in ("a", "b"):
        part, main = comb.parts[name]["importance"], comb.parts[name]["main_effect"]
        # the importance part is the former test, fit for fit
        np.testing.assert_allclose(part[0], imp.tests[name][0])
        np.testing.assert_allclose(part[1], imp.tests[name][1])
        obs, null = combine([part[0], main[0]], [part[1], main[1]])
        np.testing.assert_allclose(comb.tests[name][0], obs)
        np.testing.assert_allclose(comb.tests[name][1], null)
    # its main effect is the partial rank correlation of the whole data set
    enc = FeatureSpace().fit(table).transform(table)
    np.testing.assert_allclose(comb.main_effect,
                               MainEffects(enc).observed(source.rdm(np.arange(24))).numpy())


def test_combined_test_keeps_what_only_interactions_carry():
    """An XOR code (no main effect of either feature): the main effects are near zero,
    and the combined test still finds both features through the importance (measured over
    12 seeds of data and relabellings: max |main effect| 0.015-0.045, both features at the
    smallest p-value 1/20 in all 12)."""
    rng = np.random.default_rng(5)
    X, table = _xor(32, 1.5, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_cv(DenseRDMSource(X[None], "euclidean"), table,
                     MLEMOptions(n_null=19, random_state=1, feature_test="combined"))
    names, p, _ = out.pvalues()
    assert np.abs(out.main_effect).max() < 0.1
    for name in ("A", "B"):
        assert p[0, names.index(name)] <= 0.1


def test_main_effects_between_groups_use_pairs_of_different_groups():
    n, groups = 12, np.repeat([0, 1, 2], 4)
    cols = pair_columns(n, groups)
    i, j = pair_indices(n)
    assert (groups[i[cols]] != groups[j[cols]]).all()
    assert len(cols) == 3 * 16
    table = _table(n, np.random.default_rng(6))
    effects = MainEffects(FeatureSpace().fit(table).transform(table), cols)
    rdm = torch.as_tensor(np.random.default_rng(7).random((1, len(i))))
    # a relabelling across groups moves a between-group pair onto a within-group pair
    swap = np.arange(n)
    swap[[3, 4]] = 4, 3                 # stimulus 3 (group 0) takes 4's data (group 1)
    with pytest.raises(ValueError, match="within groups"):
        effects.null(rdm, swap[None], 0)


def test_combine_keeps_a_strong_model_strong_over_models():
    """One model far above its nulls among 30 noise models (19 nulls): its family-wise
    p-value stays the smallest possible after combining with a noise part; standardising
    model by model would cap its value near sqrt(19) and let the other models' extreme
    nulls reach it."""
    from mlem_neuro.core.scoring.nulls import permutation_pvalues

    rng = np.random.default_rng(8)
    for _ in range(20):
        imp = rng.normal(size=(20, 30))
        imp[0, 0] = 10.0
        main = rng.normal(size=(20, 30))
        obs, null = combine([imp[0], main[0]], [imp[1:], main[1:]])
        _, _, p_fwe = permutation_pvalues({"f": (obs, null)})
        assert p_fwe[0, 0] == pytest.approx(1 / 20)


def test_null_in_blocks_of_relabellings_equals_one_operator(monkeypatch):
    """A small memory budget builds the relabelled residuals in blocks (one relabelling
    per block here) and gives the same statistics as one operator for all."""
    import mlem_neuro.core.scoring.main_effect as me

    rng = np.random.default_rng(9)
    n = 14
    table = _table(n, rng)
    space = FeatureSpace().fit(table)
    enc = space.transform(table)
    effects = MainEffects(enc)
    rdm = torch.as_tensor(rng.random((3, n * (n - 1) // 2)))
    perms = null_permutations(enc, space.kinds_, 6, rng)[1]
    whole = effects.null(rdm, perms, 0, effects.null_operator(perms, 0)).numpy()
    monkeypatch.setattr(me, "CHUNK_BYTES", 1)
    np.testing.assert_allclose(effects.null(rdm, perms, 0).numpy(), whole, atol=1e-12)
    source = DenseRDMSource(rng.normal(size=(3, n, 4)), "euclidean")
    null = null_permutations(enc, space.kinds_, 6, rng)
    small = main_effect_tests(source, enc, null)[1]
    monkeypatch.undo()
    np.testing.assert_allclose(small, main_effect_tests(source, enc, null)[1], atol=1e-12)


def test_main_effects_that_do_not_fit_in_memory_leave_the_importance_said(caplog):
    import dataclasses

    from mlem_neuro.core.runtime import Runtime

    rng = np.random.default_rng(10)
    X, table = _simulate(16, 0.5, rng)
    # set, not patched: too small for the RDM of all 16 stimuli (11,520 B for 120 pairs
    # x 3 x 8 B in a quarter of it), enough for every step's own pieces, which read it too
    tiny = dataclasses.replace(Runtime.resolve(1), memory_bytes=8000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with caplog.at_level("WARNING", logger="mlem_neuro"):
            out = run_cv(DenseRDMSource(X[None], "euclidean"), table,
                         MLEMOptions(n_null=4, random_state=0, max_steps=20, chunk_size=1),
                         runtime=tiny)
    assert out.main_effect is None and out.feature_test == "importance"
    assert "held-out importance alone" in caplog.text
    # the test reads the first folds (n_repeats="auto": at most AUTO_TEST_FOLDS of them)
    k = out.n_test_folds
    assert 0 < k < len(out.folds)
    np.testing.assert_allclose(out.tests["a"][0], out.importance[:k].mean(axis=0)[:, 0])


def test_both_parts_of_a_null_dataset_are_computed_on_the_same_dataset(monkeypatch):
    """The combined statistic adds two statistics per null dataset, so both must come from
    one dataset.  Null models that relabel the features (categorical designs: stimulus s
    takes the features of perm[s]) and those that relabel the data (a numeric feature:
    stimulus a takes the data of perm[a]) see different datasets for one perm; the main
    effect of null r equals the main effect computed on the dataset null model r was
    trained on, on both paths (it failed on the first before the main effect took the
    inverse relabelling there: its p-values alone were right, the sum was not)."""
    import mlem_neuro.crossval as cv

    rng = np.random.default_rng(11)
    n = 24
    source = DenseRDMSource(rng.normal(size=(1, n, 6)), "euclidean")
    draw, null_plans = cv._draw_nulls, cv._null_plans
    for table, fast in ((_table(n, rng)[["a", "b"]], True), (_table(n, rng), False)):
        seen = {}
        monkeypatch.setattr(cv, "_draw_nulls",
                            lambda *a: seen.setdefault("null", draw(*a)))
        monkeypatch.setattr(cv, "_null_plans",
                            lambda *a: seen.setdefault("plans", null_plans(*a)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = run_cv(source, table, MLEMOptions(n_null=5, random_state=0, max_steps=20))
        assert all((p is not None) == fast for p in seen["plans"])
        space = FeatureSpace().fit(table)
        rdm = source.rdm(np.arange(n))
        for f, name in enumerate(out.feature_names):
            for r, perm in enumerate(seen["null"][1 + f]):
                # stimulus s of null dataset r has the features of stimulus sigma[s]
                sigma = perm if fast else np.argsort(perm)
                enc = space.transform(table.iloc[sigma].reset_index(drop=True))
                expected = MainEffects(enc).observed(rdm).numpy()[0, f]
                np.testing.assert_allclose(out.parts[name]["main_effect"][1][r, 0],
                                           expected, rtol=1e-5, atol=1e-7)


def _perm_p(obs, null):
    return (1 + (null >= obs - 1e-12).sum(axis=0)) / (1 + len(null))


def _z(values, models):
    """Standardised by the mean and sd of ``values (n_null + 1, M)`` over ``models``."""
    sub = values[:, models]
    return (values - sub.mean()) / sub.std()


def test_staged_is_the_main_effect_where_the_gate_is_shut_and_the_max_where_open():
    """Per model: where the gate is shut the p-value is the main effect's own, where it
    is open the maximum of the importance standardised over the open models and the main
    effect standardised over every model; the importance's values elsewhere (which a
    staged analysis does not compute) are not read."""
    rng = np.random.default_rng(6)
    n_null, M = 99, 6
    imp, main = rng.normal(size=(2, n_null + 1, M))
    imp[0] += [0, 4, 0, 4, 0, 0]                 # observed: an importance in models 1 and 3
    main[0] += [0, 0, 4, 4, 0, 0]                # a main effect in models 2 and 3
    gate = np.array([False, False, True, True, True, False])
    obs, null = staged((imp[0], imp[1:]), (main[0], main[1:]), gate)
    p = _perm_p(obs, null)
    both = np.maximum(_z(imp, gate), _z(main, slice(None)))
    np.testing.assert_array_equal(p[~gate], _perm_p(main[0], main[1:])[~gate])
    np.testing.assert_allclose(obs[gate], both[0, gate])
    np.testing.assert_allclose(null[:, gate], both[1:, gate])
    # the importance where the gate is shut is not read (NaN there: the same statistic)
    unread = imp.copy()
    unread[:, ~gate] = np.nan
    again = staged((unread[0], unread[1:]), (main[0], main[1:]), gate)
    np.testing.assert_array_equal(again[0], obs)
    np.testing.assert_array_equal(again[1], null)
    cobs, cnull = combine([imp[0], main[0]], [imp[1:], main[1:]])
    assert p[1] > 0.05 and p[3] <= 0.05          # the importance counts only where open
    assert p[2] <= 0.05                          # a main effect counts everywhere
    # every gate shut: the main effect's p-values; every gate open: the combined test's
    shut = staged((imp[0], imp[1:]), (main[0], main[1:]), np.zeros(M, bool))
    np.testing.assert_array_equal(_perm_p(*shut), _perm_p(main[0], main[1:]))
    opened = staged((imp[0], imp[1:]), (main[0], main[1:]), np.ones(M, bool))
    np.testing.assert_allclose(opened[0], cobs)
    np.testing.assert_allclose(opened[1], cnull)


def test_staged_default_reads_the_test_of_interactions():
    """The default (``"staged"``) on known truths: in each model the gate is open exactly
    where the test of interactions has p <= STAGED_GATE; where it is shut a feature's
    p-value is its main effect's, where open the combined test's.  Additive codes (a
    strong feature beside a weaker one, four noise draws as four models) leave it shut in
    most models; an XOR code opens it and both features are found through the importance
    (their main effects near 0: the main effect alone misses them).  Measured over 8 other
    seeds of data and relabellings: the gate shut in 3-4 of the 4 additive models, ``a``
    at the smallest p (0.05) in every model; the XOR code opened it every time (test of
    interactions p = 0.05), both features at p = 0.05, their main effects at p 0.25-1.0."""
    rng = np.random.default_rng(7)
    table = _simulate(24, 0.8, rng)[1]
    a = pd.factorize(table["a"])[0]
    b = pd.factorize(table["b"])[0]
    X = rng.normal(size=(4, 24, 8)) + 1.0 * rng.normal(size=(4, 3, 8))[:, a] \
        + 0.8 * rng.normal(size=(4, 2, 8))[:, b]
    opts = MLEMOptions(n_null=19, random_state=0, max_steps=60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_analysis(DenseRDMSource(X, "euclidean"), table, opts)
    names, p, p_fwe = out.pvalues()
    assert out.feature_test == "staged"
    np.testing.assert_array_equal(out.gate_open,
                                  p_fwe[:, names.index("interactions")] <= STAGED_GATE)
    shut = ~out.gate_open
    assert shut.sum() >= 2
    for name in ("a", "b"):
        imp = np.vstack([out.parts[name]["importance"][0][None],
                         out.parts[name]["importance"][1]])
        main = np.vstack([out.parts[name]["main_effect"][0][None],
                          out.parts[name]["main_effect"][1]])
        # the features' null models were fitted where the gate is open only
        assert np.isnan(imp[1:, shut]).all() and np.isfinite(imp[:, ~shut]).all()
        both = np.maximum(_z(imp, ~shut), _z(main, slice(None)))
        if shut.all():      # the main effect alone: on every relabelling drawn for it
            obs, null = out.tests[name]
            assert null.shape[0] == MAIN_EFFECT_NULLS
            np.testing.assert_array_equal(null[:19], main[1:])
            np.testing.assert_array_equal(p[:, names.index(name)], _perm_p(obs, null))
            continue
        # a gate open somewhere: every model reads the trained tests' 19 null datasets
        assert out.tests[name][1].shape[0] == 19
        np.testing.assert_array_equal(p[shut, names.index(name)],
                                      _perm_p(main[0], main[1:])[shut])
        np.testing.assert_array_equal(p[~shut, names.index(name)],
                                      _perm_p(both[0], both[1:])[~shut])
    assert (p[:, names.index("a")] <= 0.05).all()
    X, table = _xor(32, 1.5, np.random.default_rng(5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_analysis(DenseRDMSource(X[None], "euclidean"), table,
                           MLEMOptions(n_null=19, random_state=1))
    names, p, _ = out.pvalues()
    assert out.gate_open.all() and p[0, names.index("interactions")] <= 0.05
    for name in ("A", "B"):
        assert p[0, names.index(name)] <= 0.1
        assert _perm_p(*out.parts[name]["main_effect"])[0] > 0.1


def test_staged_fits_the_null_models_of_a_full_run_where_the_gate_is_open():
    """The staged analysis fits the features' null models only where the test of
    interactions opens the gate, and those are the null models a run fitting all of them
    fits (``feature_test="combined"``, same seed: same folds, relabellings and training):
    the same score and interaction nulls everywhere, the same feature nulls where open,
    and each feature's staged statistic is the one :func:`staged` gives from the full
    run's parts.  On grouped (categorical) and pair-by-pair (numeric) null models."""
    rng = np.random.default_rng(11)
    n, M = 32, 4
    a, b = rng.integers(0, 2, n), rng.integers(0, 3, n)
    X = rng.normal(size=(M, n, 10))
    X[:2] += 2.0 * rng.normal(size=(2, 2, 10))[:, a ^ (b > 0)]  # XOR in models 0 and 1
    X[2:] += 1.5 * rng.normal(size=(2, 2, 10))[:, a]            # a alone in 2 and 3
    for extra in (None, rng.normal(size=n)):
        table = pd.DataFrame({"a": a.astype(str), "b": b.astype(str)})
        if extra is not None:
            table["c"] = extra
        outs = {}
        for test in ("staged", "combined"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs[test] = run_analysis(
                    DenseRDMSource(X, "euclidean"), table,
                    MLEMOptions(n_null=19, random_state=3, max_steps=60, n_repeats=2,
                                feature_test=test))
        s, c = outs["staged"], outs["combined"]
        g = s.gate_open
        assert g.any() and not g.all()
        np.testing.assert_array_equal(s.tests["interactions"][1], c.tests["interactions"][1])
        np.testing.assert_array_equal(s.fold_null[:, :, 0], c.fold_null[:, :, 0])
        np.testing.assert_array_equal(s.fold_null[:, g, 1:], c.fold_null[:, g, 1:])
        assert np.isnan(s.fold_null[:, ~g, 1:]).all()
        for name in s.parts:
            obs, null = staged(c.parts[name]["importance"], c.parts[name]["main_effect"], g)
            np.testing.assert_allclose(s.tests[name][0], obs, rtol=1e-12)
            np.testing.assert_allclose(s.tests[name][1], null, rtol=1e-12)


def test_staged_without_interactions_to_find_is_the_main_effect():
    """An additive model (``interactions=False``) has no test of interactions and no
    interaction to find: each feature's test is its main effect's."""
    rng = np.random.default_rng(8)
    X, table = _simulate(24, 0.5, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_analysis(DenseRDMSource(X[None], "euclidean"), table,
                           MLEMOptions(n_null=9, random_state=0, max_steps=40,
                                       interactions=False))
    names, p, _ = out.pvalues()
    assert "interactions" not in names and not out.gate_open.any()
    for name in ("a", "b"):
        obs, null = out.tests[name]
        # the main effect alone, on its 9 null datasets and MAIN_EFFECT_NULLS - 9 more
        np.testing.assert_array_equal(obs, out.parts[name]["main_effect"][0])
        np.testing.assert_array_equal(null[:9], out.parts[name]["main_effect"][1])
        assert null.shape[0] == MAIN_EFFECT_NULLS
        np.testing.assert_array_equal(p[:, names.index(name)], _perm_p(obs, null))


def test_staged_without_a_test_of_interactions_combines_everywhere(caplog):
    """A source that cannot take the test of interactions (no response patterns): an
    interaction cannot be ruled out, so every model's test is the combined one, said."""
    rng = np.random.default_rng(9)
    X, table = _simulate(24, 0.5, rng)

    class NoPatterns(DenseRDMSource):
        supports_interaction_test = False

    opts = MLEMOptions(n_null=9, random_state=0, max_steps=40)
    with warnings.catch_warnings(), caplog.at_level("INFO", logger="mlem_neuro"):
        warnings.simplefilter("ignore")
        out = run_analysis(NoPatterns(X[None], "euclidean"), table, opts)
    assert out.gate_open.all()
    assert "no test of interactions to stage them" in caplog.text
    for name in ("a", "b"):
        obs, null = combine(*zip(out.parts[name]["importance"],
                                 out.parts[name]["main_effect"]))
        np.testing.assert_allclose(out.tests[name][0], obs)
        np.testing.assert_allclose(out.tests[name][1], null)


def test_staged_gate_reads_the_family_wise_p_of_the_test_of_interactions(monkeypatch,
                                                                          caplog):
    """The gate opens where the test of interactions is family-wise significant over the
    models, not where a model's own p-value is: read per model, a chance interaction opens
    it in about 5 % of the models of any analysis, and there the importance, which sees
    the same chance structure, rejects far more often than its level
    (``validation/staged_gate.py``).  With a test of interactions whose statistics are
    set here: model 0 reaches p = 0.05 alone but not the maximum over models (family-wise
    p > 0.05), model 1 beats every null maximum; only model 1 opens, and only there are
    the features' null models fitted."""
    import mlem_neuro.inference as inference

    rng = np.random.default_rng(3)
    X, table = _simulate(24, 0.5, rng)
    X = np.stack([X, X[:, rng.permutation(X.shape[1])], X[::-1].copy()])
    n_null = 19
    null = np.tile(np.linspace(0.0, 1.0, n_null)[:, None], (1, 3))
    null[:, 2] = np.linspace(0.0, 2.0, n_null)        # model 2 holds the null maxima

    def fake_test(source, features, opts, groups, seed, folds, runtime=None):
        return np.array([1.5, 3.0, 0.0]), null.copy(), set()

    monkeypatch.setattr(inference, "_interaction_test", fake_test)
    opts = MLEMOptions(n_null=n_null, random_state=0, max_steps=40)
    with warnings.catch_warnings(), caplog.at_level("INFO", logger="mlem_neuro"):
        warnings.simplefilter("ignore")
        out = run_analysis(DenseRDMSource(X, "euclidean"), table, opts)
    names, p, p_fwe = out.pvalues()
    k = names.index("interactions")
    assert p[0, k] <= STAGED_GATE < p_fwe[0, k]       # the premise: the rules differ
    assert p_fwe[1, k] <= STAGED_GATE
    np.testing.assert_array_equal(out.gate_open, [False, True, False])
    assert "family-wise p <= 0.05 over the 3 models) in 1 of them" in caplog.text
    for name in ("a", "b"):
        imp_null = out.parts[name]["importance"][1]
        assert np.isnan(imp_null[:, [0, 2]]).all() and np.isfinite(imp_null[:, 1]).all()


def test_the_main_effect_alone_reads_more_relabellings_than_the_trained_tests(monkeypatch):
    """Ground truth: ``a`` strongly encoded, ``b`` not.  Where a feature's test is its
    main effect alone (the staged default with the gate shut), it reads
    ``MAIN_EFFECT_NULLS`` relabellings, the trained tests' ``n_null`` first: ``a``
    reaches ``p = 1 / (1 + MAIN_EFFECT_NULLS)`` where the score test stops at ``1 / (1 +
    n_null)``.  When their null statistics do not fit in their share of the memory
    budget, the main effect reads the trained tests' ``n_null``."""
    from mlem_neuro import crossval

    rng = np.random.default_rng(2)
    X, table = _simulate(24, 0.0, rng)
    source = DenseRDMSource(X[None], "euclidean")
    opts = MLEMOptions(n_null=19, random_state=0, max_steps=40)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = run_analysis(source, table, opts)
    names, p, _ = out.pvalues()
    assert not out.gate_open.any()
    assert p[0, names.index("score")] == pytest.approx(1 / 20)
    assert p[0, names.index("a")] == pytest.approx(1 / (1 + MAIN_EFFECT_NULLS))
    assert p[0, names.index("b")] > 0.05
    assert out.tests["a"][1].shape == (MAIN_EFFECT_NULLS, 1)
    np.testing.assert_array_equal(out.tests["a"][1][:19], out.parts["a"]["main_effect"][1])
    # a share of the budget too small for 1 model x 2 features x MAIN_EFFECT_NULLS
    budget = Runtime.resolve().memory_bytes
    monkeypatch.setattr(crossval, "MAIN_EFFECT_NULLS_SHARE",
                        budget // (8 * 2 * MAIN_EFFECT_NULLS) + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        small = run_analysis(source, table, opts)
    names, p, _ = small.pvalues()
    assert small.tests["a"][1].shape == (19, 1)
    assert p[0, names.index("a")] == pytest.approx(1 / 20)
    np.testing.assert_array_equal(small.tests["a"][0], out.tests["a"][0])


def test_staged_features_read_every_fold_where_the_gate_opens():
    """With ``n_repeats="auto"`` the score test and the test of interactions read the
    first folds, while the staged features' null models, fitted only where the gate
    opens, read every fold (an XOR code is found through their importance: measured on
    100 paired XOR datasets, the first 20 of 100 folds found A in 0.47 against 0.55,
    B 0.43 against 0.49).  Ground truth: an XOR code opens the gate; there each feature's
    importance part (observed and null) is the one a run reading every fold gives (an int
    ``n_repeats``, the same folds and relabellings, ``feature_test="combined"``)."""
    X, table = _xor(24, 1.5, np.random.default_rng(5))
    source = DenseRDMSource(X[None], "euclidean")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        auto = run_analysis(source, table, MLEMOptions(n_null=19, random_state=1))
        n_rep = len(auto.folds) // 2
        every = run_analysis(source, table, MLEMOptions(n_null=19, random_state=1,
                                                        n_repeats=n_rep,
                                                        feature_test="combined"))
    assert auto.gate_open.all()
    assert auto.n_test_folds < len(auto.folds) == auto.n_feature_test_folds
    for (tr, te), (tr2, te2) in zip(auto.folds, every.folds):
        np.testing.assert_array_equal(te, te2)
    for name in ("A", "B"):
        np.testing.assert_allclose(auto.parts[name]["importance"][0],
                                   every.parts[name]["importance"][0], rtol=1e-12)
        np.testing.assert_allclose(auto.parts[name]["importance"][1],
                                   every.parts[name]["importance"][1], rtol=1e-12)
    # the score test still reads the first folds only
    assert auto.tests["score"][1].shape == (19, 1)
    np.testing.assert_allclose(auto.tests["score"][0],
                               auto.score[:auto.n_test_folds].mean(axis=0))
