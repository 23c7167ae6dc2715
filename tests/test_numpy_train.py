"""The numpy training loop of grouped designs (``core/numpy_train.py``) against the torch
loop it replaces on the CPU: the same fits up to float32 rounding.  The compiled loop of
full batches (``core/ctrain.py``, ``tests/test_ctrain.py``) is switched off here so that
full batches run through the numpy loop."""
import numpy as np
import pandas as pd
import pytest
import torch

from mlem_neuro.core import ctrain, numpy_train
from mlem_neuro.core.engine import fit_grouped, fit_stack
from mlem_neuro.core.features import FeatureSpace
from mlem_neuro.core.metric import make_W, predict, term_index, term_matrix, term_weights
from mlem_neuro.core.neural import NeuralTargets
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.sources import DenseRDMSource
from mlem_neuro.core.tied import grouped_soft_spearman
from mlem_neuro.simulation import simulate_representations


@pytest.fixture(autouse=True)
def _numpy_loop(monkeypatch):
    monkeypatch.setattr(ctrain, "USE_C", False)


def _design(n=60, seed=0):
    X, y, _ = simulate_representations(n_stimuli=n, n_features=3, n_units=16, noise=0.5,
                                       random_state=seed)
    rng = np.random.default_rng(seed)
    Y = np.stack([X + 0.4 * rng.standard_normal(X.shape) for _ in range(5)])
    enc = FeatureSpace().fit(y).transform(y)
    targets = NeuralTargets.from_rdm(DenseRDMSource(Y).rdm(np.arange(n)), n, "cpu")
    return enc, targets


@pytest.mark.parametrize("constraint", ["spd", "diagonal", "none"])
def test_gradient_is_the_autograd_gradient(constraint):
    rng = np.random.default_rng(1)
    m, U = 3, 8
    k, l = term_index(m, True)
    D = torch.as_tensor(rng.integers(0, 2, (U, m)), dtype=torch.float64)
    D[0] = 1.0
    P = term_matrix(D, k, l)
    A = torch.as_tensor(rng.standard_normal((5, m, m)), dtype=torch.float64)
    counts = torch.as_tensor(rng.integers(1, 40, U)).double()
    sums = torch.as_tensor(rng.standard_normal((5, U)))
    rho, grad = numpy_train.value_and_grad(A.numpy().copy(), constraint, k, l, P.numpy(),
                                           counts.numpy(), sums.numpy(), 1.0)
    Ag = A.clone().requires_grad_(True)
    q = term_weights(make_W(Ag, constraint), k, l) @ P.T
    ref = grouped_soft_spearman(predict(q, constraint), counts, sums, 1.0)
    ref.sum().backward()
    assert np.abs(grad).max() > 1e-4                     # a gradient worth comparing
    np.testing.assert_allclose(rho, ref.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(grad, Ag.grad.numpy(), atol=1e-10)


@pytest.mark.parametrize("constraint, interactions, batch_size",
                         [("spd", True, "auto"), ("spd", False, 300),
                          ("diagonal", False, "auto"), ("none", True, "auto"),
                          ("none", True, 300)])
def test_numpy_loop_fits_as_the_torch_loop(monkeypatch, constraint, interactions,
                                           batch_size):
    """60 steps without early stopping: W and histories agree to float32 rounding
    (measured: W 6e-8 to 2.3e-6, histories 1.5e-8 to 1e-6), and it is 2-3x faster."""
    enc, targets = _design()
    opts = MLEMOptions(constraint=constraint, interactions=interactions, max_steps=60,
                       patience=1000, tol=0.0, batch_size=batch_size)
    fast = fit_stack(enc, targets, opts, random_state=0)
    monkeypatch.setattr(numpy_train, "available", lambda *a: False)
    slow = fit_stack(enc, targets, opts, random_state=0)
    np.testing.assert_array_equal(fast.n_iter, slow.n_iter)
    np.testing.assert_allclose(fast.W, slow.W, atol=2e-5)
    np.testing.assert_allclose(fast.history, slow.history, atol=1e-5)
    np.testing.assert_allclose(fast.best_score, slow.best_score, atol=1e-5)


def test_early_stopping_matches(monkeypatch):
    """With the default stopping rule the loops stop the models at the same steps (float32
    rounding could flip a decision at exactly ``tol``; not seen here)."""
    enc, targets = _design(seed=2)
    opts = MLEMOptions(max_steps=400)
    fast = fit_stack(enc, targets, opts, random_state=0)
    monkeypatch.setattr(numpy_train, "available", lambda *a: False)
    slow = fit_stack(enc, targets, opts, random_state=0)
    assert fast.converged.all() and fast.n_iter.max() < 400
    np.testing.assert_array_equal(fast.n_iter, slow.n_iter)
    np.testing.assert_allclose(fast.W, slow.W, atol=1e-5)


def test_per_model_counts(monkeypatch):
    rng = np.random.default_rng(3)
    D = torch.as_tensor([[a, b] for a in (0, 1) for b in (0, 1)], dtype=torch.float64)
    counts = torch.as_tensor(rng.integers(1, 50, (7, 4))).double()
    counts[2, 1] = 0.0                                   # a row a model lacks
    sums = torch.as_tensor(rng.standard_normal((7, 4))) * 0.1
    opts = MLEMOptions(max_steps=50, patience=1000, tol=0.0)
    fast = fit_grouped(D, counts, sums, opts)
    monkeypatch.setattr(numpy_train, "available", lambda *a: False)
    slow = fit_grouped(D, counts, sums, opts)
    np.testing.assert_allclose(fast.W, slow.W, atol=1e-5)
    assert fast.history is None and slow.history is None


def test_not_used_for_per_pair_designs():
    rng = np.random.default_rng(0)
    y = pd.DataFrame({"u": rng.random(40), "v": rng.random(40)})
    X = rng.standard_normal((40, 8))
    enc = FeatureSpace().fit(y).transform(y)
    targets = NeuralTargets.from_rdm(DenseRDMSource(X[None]).rdm(np.arange(40)), 40, "cpu")
    seen = []
    real = numpy_train.available

    def spy(data, dev):
        seen.append(real(data, dev))
        return seen[-1]

    numpy_train.available, saved = spy, numpy_train.available
    try:
        fit_stack(enc, targets, MLEMOptions(max_steps=5, numeric_levels=None),
                  random_state=0)
    finally:
        numpy_train.available = saved
    assert seen == [False]
