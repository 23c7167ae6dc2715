"""Numeric features: the per-pair soft rank, the training grid of distances and its error."""
import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from mlem_neuro import MLEM
from mlem_neuro.core import quantise
from mlem_neuro.core.engine import _StepTargets
from mlem_neuro.core.features import FeatureSpace
from mlem_neuro.core.neural import NeuralTargets
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.pairs import pair_indices
from mlem_neuro.core.spearman import (
    _rank_scale,
    rankdata,
    soft_rank,
    soft_spearman,
    standardize,
)
from mlem_neuro.simulation import simulate_representations


def _torchsort_rank(x):
    import torchsort

    flat = x.reshape(-1, x.shape[-1])
    return torchsort.soft_rank(_rank_scale(flat), regularization_strength=1.0).reshape(x.shape)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_soft_rank_and_spearman_equal_torchsort(dtype, tol):
    """Values and gradients equal torchsort's soft rank (its own sort), ties included."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 300, generator=g, dtype=dtype)
    x[..., :40] = x[..., 40:80]                          # tied predictions
    tz = standardize(rankdata(torch.randn(4, 3, 300, generator=g, dtype=torch.float64)))
    tz = tz.to(dtype)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    ra, rb = soft_rank(a), _torchsort_rank(b)
    np.testing.assert_allclose(ra.detach(), rb.detach(), rtol=tol, atol=tol * 300)
    (ra * tz).sum().backward()
    (rb * tz).sum().backward()
    np.testing.assert_allclose(a.grad, b.grad, atol=tol * 300)
    a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    sa = soft_spearman(a, tz)
    sb = (standardize(_torchsort_rank(b)) * tz).sum(dim=-1)
    assert sa.shape == (4, 3)
    np.testing.assert_allclose(sa.detach(), sb.detach(), atol=tol)
    sa.sum().backward()
    sb.sum().backward()
    np.testing.assert_allclose(a.grad, b.grad, atol=tol)
    assert b.grad.abs().max() > 1e-4                    # a gradient worth comparing


def test_soft_spearman_broadcasts_one_target_over_models():
    g = torch.Generator().manual_seed(1)
    pred = torch.randn(3, 50, generator=g, dtype=torch.float64)
    tz = standardize(rankdata(torch.randn(50, generator=g, dtype=torch.float64)))
    np.testing.assert_allclose(soft_spearman(pred, tz), soft_spearman(pred, tz.expand(3, 50)))


def test_quantise_distances_rounds_numeric_columns_only():
    rng = np.random.default_rng(0)
    D = torch.as_tensor(np.c_[rng.uniform(0, 0.8, 500), rng.integers(0, 2, 500),
                              rng.uniform(0, 2.0, 500)])
    Q = quantise.quantise_distances(D, 5)
    np.testing.assert_array_equal(Q[:, 1], D[:, 1])     # binary: unchanged
    for k, top in ((0, D[:, 0].max()), (2, D[:, 2].max())):
        step = float(top) / 4
        assert torch.unique(Q[:, k]).numel() <= 5
        np.testing.assert_allclose(torch.unique(Q[:, k]) / step,
                                   torch.round(torch.unique(Q[:, k]) / step))
        assert float((Q[:, k] - D[:, k]).abs().max()) <= step / 2 + 1e-12
        assert float(Q[:, k].max()) == pytest.approx(float(top))


@pytest.mark.parametrize("m, expected", [(1, 16), (2, 16), (3, 10), (4, 5), (5, 4), (6, None)])
def test_auto_levels_keep_at_most_1024_cells(m, expected):
    rng = np.random.default_rng(m)
    D = torch.as_tensor(rng.uniform(0, 1, (2000, m)))
    assert quantise.choose_levels(D, "auto") == expected
    assert quantise.choose_levels(D, None) is None
    assert quantise.choose_levels(D, 7) == 7
    # a binary feature doubles the cells: fewer levels for the numeric ones
    Db = torch.cat([D, torch.as_tensor(rng.integers(0, 2, (2000, 1)), dtype=D.dtype)], 1)
    q = quantise.choose_levels(Db, "auto")
    assert q is None or 2 * q ** m <= quantise.MAX_CELLS
    assert quantise.choose_levels(torch.as_tensor(rng.integers(0, 2, (100, 3))), "auto") is None


def _numeric_data(n=100, m=3, seed=0):
    X, y, W = simulate_representations(n, m, noise=1.0, kind="realisable",
                                       feature_type="numeric", random_state=seed)
    return X, y, W


def test_numeric_training_takes_the_grid_by_default_and_the_exact_path_on_request():
    X, y, _ = _numeric_data()
    enc = FeatureSpace().fit_transform(y)
    targets = NeuralTargets.from_rdm(X[np.triu_indices(100, k=1)], 100, "cpu")
    for levels, grouped in (("auto", True), (None, False)):
        kw = MLEMOptions(numeric_levels=levels).fit_kwargs()
        st = _StepTargets(enc, targets, kw, np.random.default_rng(0), torch.device("cpu"),
                          torch.float32)
        assert st.grouped is grouped
        assert (st.levels == 10) is grouped                  # m = 3: 10 levels, 1000 cells


def test_grid_error_is_small_and_held_out_scores_use_exact_distances():
    """The grid moves W little, leaves held-out rho alone, and scoring stays exact.

    Measured here (100 stimuli, m = 3 on 10 levels, full batch, seeds 0-2):
    ||W_grid - W_exact||_F = 0.014-0.033, held-out rho differences <= 0.0003.  Measured by
    benchmarks/numeric_recovery.py (200 stimuli, m = 3, 5 seeds at noise 1 and 0.3):
    at most 0.043, while two exact fits differing only in their seed differ by up to 0.16;
    held-out rho within 0.0008.  Bounds: 0.06 and 0.01.
    """
    for seed in range(3):
        X, y, W_true = _numeric_data(seed=seed)
        train, test = np.arange(80), np.arange(80, 100)
        Xtr, Xte = X[np.ix_(train, train)], X[np.ix_(test, test)]
        grid = MLEM(distance="precomputed", random_state=seed).fit(Xtr, y.iloc[train])
        exact = MLEM(distance="precomputed", numeric_levels=None,
                     random_state=seed).fit(Xtr, y.iloc[train])
        assert np.linalg.norm(grid.W_ - exact.W_) < 0.06
        assert abs(grid.score(Xte, y.iloc[test]) - exact.score(Xte, y.iloc[test])) < 0.01
        # held-out score from the exact distances, computed by hand
        F = y.iloc[test].to_numpy()
        F = (F - y.iloc[train].min().to_numpy()) / np.ptp(y.iloc[train].to_numpy(), axis=0)
        i, j = pair_indices(len(test))
        D = np.abs(F[i] - F[j])
        pred = np.einsum("pa,ab,pb->p", D, grid.W_, D)
        ref = spearmanr(pred, Xte[i, j])[0]
        assert grid.score(Xte, y.iloc[test]) == pytest.approx(ref, abs=1e-10)


def test_mixed_design_keeps_categorical_distances_exact():
    rng = np.random.default_rng(0)
    y = pd.DataFrame({"freq": rng.uniform(0, 1, 60), "cat": rng.choice(["a", "b"], 60)})
    enc = FeatureSpace().fit_transform(y)
    i, j = pair_indices(60)
    D = torch.as_tensor(enc.pair_distances(i, j))
    q = quantise.choose_levels(D, "auto")
    assert q == 16                                         # 16 x 2 = 32 cells
    Q = quantise.quantise_distances(D, q)
    col = [c for c in range(2) if torch.unique(D[:, c]).numel() == 2][0]
    np.testing.assert_array_equal(Q[:, col], D[:, col])


def test_command_line_parses_numeric_levels():
    import argparse

    from mlem_neuro.cli import _numeric_levels

    assert _numeric_levels("auto") == "auto"
    assert _numeric_levels("none") is None
    assert _numeric_levels("8") == 8
    with pytest.raises(argparse.ArgumentTypeError, match="'auto', 'none' or an int"):
        _numeric_levels("fine")
