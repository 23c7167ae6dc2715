"""The batched engine: same answers as single fits, torch's AdamW, masking by model."""
import numpy as np
import pytest
import torch

from mlem_neuro import MLEM
from mlem_neuro.core.engine import fit_stack
from mlem_neuro.core.features import FeatureSpace
from mlem_neuro.core.metric import make_W, predict, term_index, term_matrix, term_weights, \
    init_params
from mlem_neuro.core.neural import NeuralTargets
from mlem_neuro.core.pairs import pair_indices
from mlem_neuro.core.spearman import rankdata, soft_spearman, standardize
from mlem_neuro.simulation import simulate_representations


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
    res = fit_stack(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), constraint=constraint,
                    max_steps=7, patience=100, batch_size="full", tol=-np.inf)
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
    # with tol=-inf every step "improves": the kept state is the one before the last step
    W_ref = make_W(states[-1], constraint).detach().numpy()
    np.testing.assert_allclose(res.W, W_ref, atol=2e-5)
    assert np.all(res.n_iter == 7) and not res.converged.any()


def test_stack_equals_independent_fits():
    """Each model of a stack is fitted as if alone (early stopping per model)."""
    Y, y = _stack(M=4)
    enc = FeatureSpace().fit_transform(y)
    # tol=0: with a threshold, float32 rounding differences between the batched and the
    # single computation (~1e-7) can flip an "improved by more than tol" decision
    res = fit_stack(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), batch_size="full",
                    patience=15, max_steps=400, tol=0.0)
    assert len(set(res.n_iter.tolist())) > 1          # models stopped at different steps
    for t in range(4):
        est = MLEM(batch_size="full", patience=15, max_steps=400, tol=0.0).fit(Y[t], y)
        assert est.n_iter_ == res.n_iter[t]
        np.testing.assert_allclose(est.W_, res.W[t], atol=1e-5)
        # history is NaN after a model stopped
        assert np.isnan(res.history[t, res.n_iter[t]:]).all()
        np.testing.assert_allclose(res.history[t, :res.n_iter[t]], est.history_, atol=1e-5)


def test_minibatch_stack_runs_and_uses_distinct_pairs():
    Y, y = _stack(M=3, n=60)
    enc = FeatureSpace().fit_transform(y)
    res = fit_stack(enc, NeuralTargets.from_data(Y, "euclidean", "cpu"), batch_size=300,
                    max_steps=60, patience=20, random_state=0)
    assert res.batch_size == 300 and not res.full_batch
    assert np.isfinite(res.W).all()
    np.testing.assert_allclose(np.linalg.norm(res.W, axis=(1, 2)), 1.0, rtol=1e-5)
    # the noisiest model learns a worse metric than the cleanest one
    assert res.best_score[0] > res.best_score[-1]
