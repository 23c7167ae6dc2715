"""The batched engine: same answers as single fits, torch's AdamW, masking by model."""
import contextlib

import numpy as np
import pandas as pd
import pytest
import torch

from mlem_neuro import MLEM
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.ranks.spearman import rankdata, soft_spearman, standardize
from mlem_neuro.core.rdms.neural import NeuralTargets
from mlem_neuro.core.stimuli.features import FeatureSpace
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.core.training.engine import fit_stack
from mlem_neuro.core.training.metric import (
    init_params,
    make_W,
    predict,
    quadratic_forms,
    term_index,
    term_matrix,
    term_weights,
)
from mlem_neuro.simulation import simulate_representations


def _fit(enc, targets, random_state=None, tol=1e-4, **kw):
    """fit_stack with options; ``tol=-inf`` (never stop early; the best state is kept) is set
    past the public validation, which refuses it, to test the engine itself."""
    opts = MLEMOptions(**kw)
    object.__setattr__(opts, "tol", tol)
    return fit_stack(enc, targets, opts, random_state=random_state)


def _stack(M=4, n=40, units=12, m=3, seed=0):
    X, y, _ = simulate_representations(n, m, units, noise=0.0, random_state=seed)
    rng = np.random.default_rng(seed)
    Y = np.stack([X + s * X.std(0) * rng.standard_normal(X.shape)
                  for s in np.linspace(0.1, 2.0, M)])
    return Y, y


@pytest.mark.parametrize("constraint", ["spd", "none", "diagonal"])
def test_update_matches_torch_adamw(constraint):
    """Full batch, no early stop: W after 7 steps equals a torch.optim.AdamW loop."""
    Y, y = _stack(M=3)
    enc = FeatureSpace().fit_transform(y)
    res = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), constraint=constraint,
                    max_steps=7, patience=100, batch_size="full", tol=-np.inf, lr=0.1)
    # reference: the plain loop a user would write with torch.optim.AdamW
    n, m = Y.shape[1], 3
    i, j = pair_indices(n)
    k, l = term_index(m, constraint != "diagonal")
    Pt = term_matrix(torch.as_tensor(enc.pair_distances(i, j), dtype=torch.float32), k, l)
    tz = standardize(rankdata(torch.as_tensor(np.stack(
        [np.linalg.norm(Yt[i] - Yt[j], axis=1) for Yt in Y])))).float()
    A = init_params(3, m, constraint, "cpu", torch.float32).requires_grad_(True)
    opt = torch.optim.AdamW([A], lr=0.1, weight_decay=0.0)
    states = []
    for _ in range(7):
        states.append(A.detach().clone())
        rho = soft_spearman(predict(term_weights(make_W(A, constraint), k, l) @ Pt.T,
                                    constraint), tz)
        opt.zero_grad()
        (-rho.sum()).backward()
        opt.step()
    # the kept state is the one that scored best (each score is taken before its update)
    best = np.argmax(res.history, axis=1)
    W_ref = np.stack([make_W(states[s][[r]], constraint)[0].detach().numpy()
                      for r, s in enumerate(best)])
    np.testing.assert_allclose(res.W, W_ref, atol=2e-5)
    assert np.all(res.n_iter == 7) and not res.converged.any()


def test_best_state_seen_is_kept_and_patience_counts_from_tol_improvements():
    """The restored state is the best one seen, even when it improved on the previous best
    by less than ``tol``; patience is reset only by improvements larger than ``tol``.

    (Before this rule the kept state was the last one that improved by more than ``tol``:
    with ``tol=0.02`` here that left training scores 0.002-0.03 below the best seen.)
    """
    Y, y = _stack(M=3)
    enc = FeatureSpace().fit_transform(y)
    tol, patience = 0.02, 15
    res = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), batch_size="full",
               patience=patience, max_steps=400, tol=tol)
    n, m = Y.shape[1], 3
    i, j = pair_indices(n)
    k, l = term_index(m)
    Pt = term_matrix(torch.as_tensor(enc.pair_distances(i, j), dtype=torch.float32), k, l)
    for r in range(3):
        h = res.history[r, :res.n_iter[r]]
        assert res.best_score[r] == pytest.approx(h.max(), abs=1e-7)
        # the best step improved on the one before it by less than tol: the old rule missed it
        assert 0 < h.max() - h[np.argmax(h) - 1] < tol
        # replay the patience rule on the recorded scores
        ref, since = -np.inf, 0
        for t, score in enumerate(h):
            ref, since = (score, 0) if score > ref + tol else (ref, since + 1)
            if since >= patience:
                break
        assert res.n_iter[r] == t + 1 and res.converged[r]
        # the returned W scores the best training value
        tz = standardize(rankdata(torch.as_tensor(np.linalg.norm(Y[r][i] - Y[r][j], axis=1))))
        W = torch.as_tensor(res.W[r], dtype=torch.float32)
        rho = soft_spearman(predict(term_weights(W[None], k, l) @ Pt.T, "spd"),
                            tz.float()[None])
        assert rho.item() == pytest.approx(h.max(), abs=1e-5)


def test_stack_equals_independent_fits():
    """Each model of a stack is fitted as if alone (early stopping per model)."""
    Y, y = _stack(M=4)
    enc = FeatureSpace().fit_transform(y)
    # tol=0: with a threshold, float32 rounding differences between the batched and the
    # single computation (~1e-7) can flip an "improved by more than tol" decision
    res = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), batch_size="full",
                    patience=15, max_steps=400, tol=0.0)
    assert len(set(res.n_iter.tolist())) > 1          # models stopped at different steps
    for t in range(4):
        est = MLEM(batch_size="full", patience=15, max_steps=400, tol=0.0).fit(Y[t], y)
        assert est.n_iter_ == res.n_iter[t]
        np.testing.assert_allclose(est.W_, res.W[t], atol=1e-5)
        # history is NaN after a model stopped
        assert np.isnan(res.history[t, res.n_iter[t]:]).all()
        np.testing.assert_allclose(res.history[t, :res.n_iter[t]], est.history_, atol=1e-5)


@pytest.mark.parametrize("batch_size", ["full", 150])
@pytest.mark.parametrize("categorical", [False, True])
def test_fits_do_not_depend_on_how_often_the_host_checks_the_stops(categorical, batch_size,
                                                                   monkeypatch):
    """The torch loop checks which models still train every step on the CPU and every
    ``GPU_CHECK_EVERY`` steps on a GPU; a model that stopped between checks is held (its
    step computed, not applied), so the fits, their steps and their histories are those
    of a check at every step (measured: identical, bit for bit, on these designs and on
    per-pair, grid and mini-batch analyses).  The grouped soft ranks are solved row by row
    here (the interval table): the CPU's pool-adjacent-violators pass lays the rows end to
    end, so its rounding depends on which rows share the call, held ones included."""
    from mlem_neuro.core.ranks import grouped
    from mlem_neuro.core.training import torch_loop
    monkeypatch.setattr(grouped, "USE_FUSED", False)
    monkeypatch.setattr(grouped, "_isotonic_method", lambda *args: "table")
    Y, y = _stack(M=6)
    kw = {}
    if not categorical:            # numeric features, trained pair by pair (no grid)
        y = pd.DataFrame(np.random.default_rng(1).standard_normal((len(y), 3)),
                         columns=["f0", "f1", "f2"])
        kw = {"numeric_levels": None}
    enc = FeatureSpace().fit_transform(y)
    fits = {}
    for every in (1, 7):
        monkeypatch.setattr(torch_loop, "check_every", lambda dev, every=every: every)
        fits[every] = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"),
                           batch_size=batch_size, patience=10, max_steps=300,
                           backend="torch", random_state=0, **kw)
    a, b = fits[1], fits[7]
    assert len(set(a.n_iter.tolist())) > 1            # the models stopped at different steps
    assert a.n_iter.max() % 7 != 0                     # the last stop fell between checks
    np.testing.assert_array_equal(b.n_iter, a.n_iter)
    np.testing.assert_array_equal(b.converged, a.converged)
    np.testing.assert_allclose(b.W, a.W, rtol=0, atol=1e-12)
    np.testing.assert_allclose(b.best_score, a.best_score, rtol=0, atol=1e-12)
    # the histories: NaN once a model stopped, up to the steps the last model ran
    np.testing.assert_array_equal(np.isnan(b.history[:, :a.history.shape[1]]),
                                  np.isnan(a.history))
    np.testing.assert_allclose(b.history[:, :a.history.shape[1]], a.history, atol=1e-12)
    assert np.isnan(b.history[:, a.history.shape[1]:]).all()


def test_cuda_graph_runner_keeps_the_eager_steps(monkeypatch):
    """The CUDA graph runner's bookkeeping, on the CPU with the capture replaced by the
    step itself (replayed by calling it) and no side stream: the warm-up steps, the step
    count as a tensor, the rows written back into their own tensors, a new capture after
    each check that drops rows.  The fits are the eager loop's (AdamW's step count as a
    float64 tensor instead of a Python number: measured equal here, W within 1e-7
    allowed) and every model stops at the same step.  The capture itself needs a GPU
    (``tests/test_cuda.py``)."""
    from mlem_neuro.core.training import graphs, torch_loop
    monkeypatch.setattr(graphs, "capture", lambda fn, dev: fn)
    monkeypatch.setattr(graphs, "side_stream", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(torch_loop, "check_every", lambda dev: 10)
    Y, y = _stack(M=8)
    enc = FeatureSpace().fit_transform(y)
    made, fits = [], {}
    for on in (False, True):
        if on:
            monkeypatch.setattr(graphs, "runner", lambda data, f, lr, dev: made.append(
                graphs.GraphRunner(f, lr, dev)) or made[-1])
        fits[on] = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"),
                        batch_size="full", patience=10, max_steps=300, backend="torch")
    runner = made[0]
    a, b = fits[False], fits[True]
    assert len(made) == 1 and runner.failed is None
    assert len(set(a.n_iter.tolist())) > 2
    assert runner.captures >= 2 and runner.replays >= a.n_iter.max() // 2, (
        runner.captures, runner.replays)
    np.testing.assert_array_equal(b.n_iter, a.n_iter)
    np.testing.assert_array_equal(b.converged, a.converged)
    np.testing.assert_allclose(b.W, a.W, rtol=0, atol=1e-7)
    np.testing.assert_allclose(b.history, a.history, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_quadratic_forms_of_a_row_do_not_depend_on_the_stack(dtype):
    """Each model's forms and their gradient are the same bits in a stack of any size
    (a matrix product's rounding depends on its shape), and equal the product's up to
    rounding."""
    rng = np.random.default_rng(0)
    Pt = torch.as_tensor(rng.random((190, 6)), dtype=dtype)
    tw = torch.as_tensor(rng.standard_normal((9, 6)), dtype=dtype)
    g = torch.as_tensor(rng.standard_normal((9, 190)), dtype=dtype)

    def forms(rows):
        t = tw[rows].clone().requires_grad_(True)
        q = quadratic_forms(t, Pt)
        (q * g[rows]).sum().backward()
        return q.detach(), t.grad

    q_all, grad_all = forms(slice(0, 9))
    for size in (1, 2, 3, 5, 7):
        for lo in range(0, 9, size):
            q, grad = forms(slice(lo, min(lo + size, 9)))
            assert torch.equal(q, q_all[lo:lo + size])
            assert torch.equal(grad, grad_all[lo:lo + size])
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(q_all, tw @ Pt.T, rtol=0, atol=100 * eps)
    torch.testing.assert_close(grad_all, g @ Pt, rtol=0, atol=1000 * eps)


def test_per_pair_fits_do_not_depend_on_the_chunk_size():
    """An analysis whose models train on per-pair term rows in torch (a numeric feature,
    40 stimuli, two folds) gives the same numbers whatever the chunks; with a matrix
    product for the forms, one chunk a model moved importances by 4e-4."""
    import pandas as pd

    from mlem_neuro import mlem_array

    rng = np.random.default_rng(0)
    n = 40
    table = pd.DataFrame({"A": np.arange(n) % 2, "B": (np.arange(n) // 2) % 2,
                          "C": rng.uniform(size=n)})
    data = rng.standard_normal((n, 6, 8))
    data[:, :2, 3:6] += table[["A", "C"]].to_numpy()[:, :, None]
    ref = mlem_array(data, table, cv=2, n_repeats=1, random_state=1)
    for chunk_size in (1,):
        res = mlem_array(data, table, cv=2, n_repeats=1, random_state=1, chunk_size=chunk_size)
        np.testing.assert_array_equal(res.fold_importance, ref.fold_importance)
        np.testing.assert_array_equal(res.fold_score, ref.fold_score)


def test_minibatch_stack_runs_and_uses_distinct_pairs():
    Y, y = _stack(M=3, n=60)
    enc = FeatureSpace().fit_transform(y)
    res = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), batch_size=300,
                    max_steps=60, patience=20, random_state=0)
    assert res.batch_size == 300 and not res.full_batch
    assert np.isfinite(res.W).all()
    np.testing.assert_allclose(np.linalg.norm(res.W, axis=(1, 2)), 1.0, rtol=1e-5)
    # the noisiest model learns a worse metric than the cleanest one
    assert res.best_score[0] > res.best_score[-1]


# ---------------------------------------------------------------- grouped soft ranks

def _weighted_pav(y, c):
    """Reference: non-increasing weighted isotonic regression by pool-adjacent-violators."""
    blocks = []                                    # [value, weight, size]
    for v, w in zip(y, c):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] <= blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return np.concatenate([[v] * n for v, _, n in blocks])


@pytest.mark.parametrize("solver", ["table", "pav"])
def test_weighted_isotonic_matches_pool_adjacent_violators(solver, monkeypatch):
    """The interval table and the one-call scipy solver (rows laid end to end) equal a
    row-by-row pool-adjacent-violators reference, rows with very different scales included
    (no block pools across two rows)."""
    from mlem_neuro.core.ranks.grouped import _minmax_isotonic, _pav_isotonic
    solve = _minmax_isotonic if solver == "table" else _pav_isotonic
    monkeypatch.setattr("mlem_neuro.core.ranks.grouped.PAV_ROWS", 2)      # 5 rows: 3 solver calls
    rng = np.random.default_rng(0)
    for U in (1, 2, 7, 40):
        y = rng.standard_normal((5, U)).cumsum(axis=1) * rng.choice([-1, 1], (5, 1))
        y *= np.array([1.0, 1e3, 1e-3, 1.0, 50.0])[:, None]
        c = rng.integers(1, 50, (5, U)).astype(float)
        v = solve(torch.as_tensor(y), torch.as_tensor(c)).numpy()
        ref = np.stack([_weighted_pav(a, b) for a, b in zip(y, c)])
        # the scipy path shifts rows apart: absolute error ~1e-16 x rows x spread
        np.testing.assert_allclose(v, ref, rtol=1e-12, atol=1e-9)
        assert (np.diff(v, axis=1) <= 1e-9).all()


def test_sort_order_and_its_inverse():
    from mlem_neuro.core.ranks.spearman import inverse_order, sort_order
    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 300, dtype=torch.float64, generator=g)
    for descending in (False, True):
        order = sort_order(x, descending)
        assert torch.equal(x.gather(1, order), torch.sort(x, dim=-1, descending=descending)
                           .values)
        assert torch.equal(order.gather(1, inverse_order(order)),
                           torch.arange(300).expand(7, 300))


@pytest.mark.parametrize("path", ["table", "expansion", "pav", "fused"])
@pytest.mark.parametrize("cross_ties", [False, True])
def test_grouped_soft_spearman_equals_torchsort_on_the_expanded_batch(cross_ties, path,
                                                                      monkeypatch):
    """Values and gradients equal torchsort's soft rank on every repeated pair, with the
    weighted isotonic regression solved by the interval table, by expansion or by
    weighted pool-adjacent-violators, through torch's autograd or (``"fused"``, the CPU
    default) in one numpy pass with the gradient written by hand."""
    import mlem_neuro.core.ranks.grouped as grouped
    from mlem_neuro.core.ranks.grouped import grouped_soft_rank, grouped_soft_spearman
    from mlem_neuro.core.ranks.spearman import soft_rank
    monkeypatch.setattr(grouped, "_isotonic_method",
                        lambda *a: "pav" if path == "fused" else path)
    monkeypatch.setattr(grouped, "USE_FUSED", path == "fused")
    monkeypatch.setattr(grouped, "PAV_ROWS", 4)              # 6 models: 2 calls of the solver
    g = torch.Generator().manual_seed(1)
    M, U = 6, 24
    counts = torch.randint(1, 200, (U,), generator=g)
    uid = torch.repeat_interleave(torch.arange(U), counts)
    uid = uid[torch.randperm(len(uid), generator=g)]
    pred = torch.randn(M, U, dtype=torch.float64, generator=g)
    if cross_ties:                                 # two groups predicted equal
        pred[:, 3] = pred[:, 11]
    target = pred[:, uid] + torch.randn(M, len(uid), dtype=torch.float64, generator=g)
    tz = standardize(rankdata(target))
    # expanded: torchsort on all pairs
    pe = pred.clone().requires_grad_(True)
    rho_ref = soft_spearman(pe[:, uid], tz)
    rho_ref.sum().backward()
    # grouped
    pg = pred.clone().requires_grad_(True)
    sums = torch.zeros(M, U, dtype=torch.float64).scatter_add_(1, uid.expand(M, -1), tz)
    rho = grouped_soft_spearman(pg, counts, sums, 1.0)
    rho.sum().backward()
    np.testing.assert_allclose(rho.detach(), rho_ref.detach(), atol=1e-12)
    np.testing.assert_allclose(pg.grad, pe.grad, atol=1e-12)
    assert pe.grad.abs().max() > 1e-4                  # a gradient worth comparing
    ranks = grouped_soft_rank(pred, counts, 1.0)[:, uid]
    np.testing.assert_allclose(ranks, soft_rank(pred[:, uid]), rtol=1e-10)


def test_subset_ranks_equal_rankdata_with_and_without_ties():
    from mlem_neuro.core.ranks.spearman import SubsetRanks
    g = torch.Generator().manual_seed(0)
    for ties in (False, True):
        v = torch.rand(5, 300, dtype=torch.float64, generator=g)
        if ties:
            v = torch.round(v * 12)
        sr = SubsetRanks(v)
        assert sr.ties == ties
        for size in (2, 57, 300):
            cols = torch.randperm(300, generator=g)[:size]
            assert torch.equal(sr.ranks(cols), rankdata(v[:, cols]))
        sr.keep(torch.tensor([True, False, True, True, False]))
        cols = torch.randperm(300, generator=g)[:80]
        assert torch.equal(sr.ranks(cols), rankdata(v[[0, 2, 3]][:, cols]))


@pytest.mark.parametrize("path", ["table", "expansion", "pav", "fused"])
@pytest.mark.parametrize("batch_size", ["full", 400])
def test_grouped_and_expanded_engines_learn_the_same_metrics(batch_size, path, monkeypatch):
    """The grouped path (few distinct term rows) and the per-pair torchsort path agree."""
    import mlem_neuro.core.ranks.grouped as grouped
    import mlem_neuro.core.training.engine as engine
    monkeypatch.setattr(grouped, "_isotonic_method",
                        lambda *a: "pav" if path == "fused" else path)
    monkeypatch.setattr(grouped, "USE_FUSED", path == "fused")
    Y, y = _stack(M=4, n=60)
    enc = FeatureSpace().fit_transform(y)
    # no early stopping (tol=-inf): the paths compute the soft ranks in float64 vs float32,
    # and a 1e-7 difference could flip one "improved by more than tol" decision; one step
    # size for both (lr="auto" gives the grouped full batch a larger one)
    kw = dict(batch_size=batch_size, max_steps=80, tol=-np.inf, random_state=0, lr=0.03)
    fast = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), **kw)
    monkeypatch.setattr(grouped, "MAX_GROUPS", 0)             # every batch expanded
    monkeypatch.setattr(engine, "MAX_RANKER_ELEMENTS", 0)  # targets sorted at every step
    slow = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), **kw)
    assert (fast.n_iter == 80).all() and (slow.n_iter == 80).all()
    np.testing.assert_allclose(fast.history, slow.history, atol=1e-5)   # measured: 1.2e-6
    np.testing.assert_allclose(fast.W, slow.W, atol=5e-6)   # measured: 2.5e-7


def test_subset_rank_group_sums_equal_summed_standardized_ranks():
    from mlem_neuro.core.ranks.spearman import SubsetRanks
    g = torch.Generator().manual_seed(2)
    groups = torch.randint(0, 9, (400,), generator=g)
    for ties in (False, True):
        v = torch.rand(4, 400, dtype=torch.float64, generator=g)
        if ties:
            v = torch.round(v * 15)
        sr = SubsetRanks(v, groups)
        cols = torch.randperm(400, generator=g)[:150]
        counts = torch.bincount(groups[cols], minlength=9)
        ref = torch.zeros(4, 9, dtype=torch.float64).scatter_add_(
            1, groups[cols].expand(4, -1), standardize(rankdata(v[:, cols])))
        np.testing.assert_allclose(sr.group_sums(cols, counts), ref, atol=1e-12)


def test_early_stopping_with_target_ranks_from_one_sort(monkeypatch):
    """Models stopping at different steps keep their own target ranks (bulk row drops)."""
    import mlem_neuro.core.training.engine as engine
    Y, y = _stack(M=8, n=60)
    enc = FeatureSpace().fit_transform(y)
    kw = dict(batch_size=400, patience=8, max_steps=300, random_state=0)
    fast = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), **kw)
    monkeypatch.setattr(engine, "MAX_RANKER_ELEMENTS", 0)  # targets sorted at every step
    slow = _fit(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), **kw)
    assert len(set(fast.n_iter.tolist())) >= 4               # several bulk drops happened
    np.testing.assert_array_equal(fast.n_iter, slow.n_iter)
    np.testing.assert_allclose(fast.W, slow.W, atol=1e-6)
    np.testing.assert_allclose(fast.history, slow.history, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("batch_size", ["full", 400])
def test_grouped_engine_with_tied_targets(batch_size, monkeypatch):
    """Targets with many ties (an integer-valued RDM) give the same fit on both paths."""
    import mlem_neuro.core.ranks.grouped as grouped
    import mlem_neuro.core.training.engine as engine
    from mlem_neuro.core.rdms.neural import rdm_from_rows
    Y, y = _stack(M=3, n=60)
    enc = FeatureSpace().fit_transform(y)
    i, j = pair_indices(60)
    rdm = rdm_from_rows(torch.as_tensor(Y), i, j, "euclidean")
    rdm = torch.round(rdm / rdm.std() * 2)                     # about 10 distinct values
    assert len(torch.unique(rdm)) < 20
    kw = dict(batch_size=batch_size, max_steps=60, tol=-np.inf, random_state=0, lr=0.03)
    fast = _fit(enc, NeuralTargets.from_rdm(rdm, 60, "cpu"), **kw)
    monkeypatch.setattr(grouped, "MAX_GROUPS", 0)
    monkeypatch.setattr(engine, "MAX_RANKER_ELEMENTS", 0)
    slow = _fit(enc, NeuralTargets.from_rdm(rdm, 60, "cpu"), **kw)
    np.testing.assert_allclose(fast.history, slow.history, atol=1e-5)   # measured: 1.5e-6
    np.testing.assert_allclose(fast.W, slow.W, atol=5e-6)               # measured: 4.2e-7


def test_grouped_soft_ranks_without_torchsorts_kernel_fall_back_to_the_table(monkeypatch):
    """If torchsort's internal kernel table is unavailable, the same values come from the
    interval table."""
    import mlem_neuro.core.ranks.grouped as grouped
    g = torch.Generator().manual_seed(4)
    counts = torch.randint(1, 60, (40,), generator=g)
    pred = torch.randn(3, 40, dtype=torch.float64, generator=g)
    monkeypatch.setattr(grouped, "_isotonic_method", lambda *a: "expansion")
    expanded = grouped.grouped_soft_rank(pred, counts, 1.0)
    monkeypatch.setattr(grouped, "_pav_kernel", lambda device_type: None)
    np.testing.assert_allclose(grouped.grouped_soft_rank(pred, counts, 1.0), expanded,
                               rtol=1e-10)


def test_auto_batch_size_is_the_full_batch_for_grouped_designs_up_to_the_cap(monkeypatch):
    """``"auto"`` trains grouped (categorical) designs on every pair up to
    FULL_BATCH_PAIRS, and runs the paper's selection for ungrouped ones and above it."""
    from types import SimpleNamespace

    import mlem_neuro.core.training.engine as engine
    calls = []

    def selection(take, n, rng, groups=None):
        calls.append(n)
        return 4096
    monkeypatch.setattr(engine, "select_batch_size", selection)
    groups = (torch.zeros(3, 2), torch.zeros(10, dtype=torch.long))
    terms = SimpleNamespace(take=None)
    assert engine.resolve_batch_size("auto", terms, 200, None, groups) == 19900
    assert calls == []
    assert engine.resolve_batch_size("auto", terms, 200, None, None) == 4096
    monkeypatch.setattr(engine, "FULL_BATCH_PAIRS", 19899)
    assert engine.resolve_batch_size("auto", terms, 200, None, groups) == 4096
    assert calls == [200, 200]
    assert engine.resolve_batch_size("full", terms, 200, None, None) == 19900


@pytest.mark.parametrize("design", ["binary full", "numeric grid", "numeric pairs"])
def test_targets_given_as_their_ranks_train_alike(design):
    """Training sees the target distances only through their ranks: rows that already hold
    their average ranks (``ranked=True``, as the null models that relabel the data pass
    them) train to the same metrics on every path (full batches of groups, the grid's
    blocks, mini-batches of pairs), with ties; and the flag is read (distances passed as if
    they were ranks train differently, except on mini-batches of pairs, ranked within each
    batch)."""
    rng = np.random.default_rng(4)
    n = 120
    if design == "binary full":
        table = {f: rng.integers(0, 2, n).astype(bool) for f in "abc"}
        kw = dict(batch_size="full")
    else:
        table = {"a": rng.integers(0, 2, n).astype(bool), "x": rng.uniform(size=n),
                 "y": rng.uniform(size=n)}
        kw = (dict(batch_size="auto") if design == "numeric grid"   # the grid's blocks
              else dict(batch_size=600, numeric_levels=None))
    import pandas as pd
    enc = FeatureSpace().fit_transform(pd.DataFrame(table))
    Y = rng.standard_normal((3, n, 6))
    values = NeuralTargets.from_data(Y, "euclidean", "cpu").full
    values = torch.round(values, decimals=1)                # ties in every row
    ranks = rankdata(values)
    opts = dict(max_steps=40, random_state=0, **kw)
    ref = _fit(enc, NeuralTargets.from_rdm(values, n, "cpu"), **opts)
    fit = _fit(enc, NeuralTargets.from_rdm(ranks, n, "cpu", ranked=True), **opts)
    np.testing.assert_array_equal(fit.W, ref.W)
    np.testing.assert_array_equal(fit.n_iter, ref.n_iter)
    lied = _fit(enc, NeuralTargets.from_rdm(values, n, "cpu", ranked=True), **opts)
    assert np.array_equal(lied.W, ref.W) == (design == "numeric pairs")


@pytest.mark.parametrize("compiled", [True, False])
def test_ranks_of_many_subsets_equal_rankdata(compiled, monkeypatch):
    """Ranks of many column subsets at once (the null rows of permutation tests), in the
    compiled pass and in torch, with and without ties, after keeping some rows; written
    into a view when one is given."""
    from mlem_neuro.core import kernels
    from mlem_neuro.core.ranks.spearman import SubsetRanks
    if compiled and not kernels.built():
        pytest.skip("the compiled library is not built")
    g = torch.Generator().manual_seed(5)
    for ties in (False, True):
        v = torch.rand(6, 500, dtype=torch.float64, generator=g)
        if ties:
            v = torch.round(v * 9)
        sr = SubsetRanks(v, compiled=compiled)
        assert (sr._compiled() is not None) == compiled
        cols = torch.stack([torch.randperm(500, generator=g)[:120] for _ in range(7)])
        out = sr.ranks_of_subsets(cols)
        for r in range(7):
            assert torch.equal(out[:, r], rankdata(v[:, cols[r]]))
        sr.keep(torch.tensor([4, 1, 5]))
        big = torch.full((3, 9, 120), -1.0, dtype=torch.float64)
        sr.ranks_of_subsets(cols, out=big[:, 1:8])
        assert (big[:, 0] == -1).all() and (big[:, 8] == -1).all()
        for r in range(7):
            assert torch.equal(big[:, 1 + r], rankdata(v[[4, 1, 5]][:, cols[r]]))
