"""Scientific claims on simulated data with known answers.

Tolerances come from measurements (noted next to each assertion), with margin.
"""
import numpy as np
import pandas as pd
import pytest
import torch
from scipy.spatial.distance import pdist
from scipy.stats import spearmanr

from mlem_neuro import MLEM
from mlem_neuro.core.ranks.spearman import rankdata, soft_spearman, standardize
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.core.training.metric import predict, term_index, term_matrix
from mlem_neuro.simulation import simulate_representations


def exact_numeric(n, W, seed, noise=0.1):
    """Precomputed distances from continuous features, with multiplicative noise."""
    rng = np.random.default_rng(seed)
    F = rng.random((n, W.shape[0]))
    i, j = pair_indices(n)
    D = np.abs(F[i] - F[j])
    d = np.sqrt(np.einsum("pa,ab,pb->p", D, W, D)) * np.exp(noise * rng.standard_normal(len(i)))
    X = np.zeros((n, n))
    X[i, j] = X[j, i] = d
    return X, pd.DataFrame(F, columns=list("abc")[: W.shape[0]])


def test_default_fit_recovers_a_realisable_numeric_metric():
    """Realisable simulation, n = 128, m = 8 numeric features, no noise: ||W_ - W_true||_F
    <= 0.04 with the default options (the target of the optimiser sweep).

    Measured (benchmarks/sweep_optimiser.py, seeds 0-5): 0.019 ± 0.005 (max 0.027) with
    the defaults (lr 0.03, patience 50, tol 1e-4); here seeds 0-2: 0.024, 0.015, 0.016.
    """
    errors = []
    for seed in range(3):
        X, y, W = simulate_representations(128, 8, noise=0.0, kind="realisable",
                                           feature_type="numeric", random_state=seed)
        est = MLEM(distance="precomputed", random_state=0).fit(X, y)
        errors.append(np.linalg.norm(est.W_ - W))
    assert max(errors) < 0.04, errors


def test_binary_features_leave_w_unidentified():
    """Binary features, no noise: the fit ranks the pairs (almost) exactly as W_true does,
    yet lands far from it (metrics that order the 2^m distinct distances alike).

    Measured with the defaults, seeds 0-2: exact training ρ 0.9994-0.9996 at
    ||W_ - W_true||_F 0.22-0.34 (seed 0: 0.9994, 0.275).
    """
    X, y, W = simulate_representations(128, 8, noise=0.0, kind="realisable",
                                       feature_type="binary", random_state=0)
    est = MLEM(distance="precomputed", random_state=0).fit(X, y)
    i, j = pair_indices(128)
    assert spearmanr(est.predict_rdm(y)[i, j], X[i, j])[0] > 0.995
    assert np.linalg.norm(est.W_ - W) > 0.2


def test_unrelated_features_get_no_importance():
    """Only f0, f1 shape the representations; f2, f3 (and their interactions) get ≈ 0.

    Importance on held-out stimuli.  Measured with the defaults (lr 0.03), seeds 0 / 1: f0
    0.80 / 1.08, f1 0.17 / 0.14, terms involving f2/f3 |.| ≤ 0.011 (with lr 0.1, over 3
    seeds: f0 0.65–0.92, f1 0.075–0.11, |.| ≤ 0.008).
    """
    for seed in range(2):
        X, y, W = simulate_representations(80, 4, 50, noise=0.5, n_informative=2,
                                           random_state=seed)
        train, test = np.arange(60), np.arange(60, 80)
        est = MLEM(random_state=0, max_steps=400).fit(X[train], y.iloc[train])
        imp = est.permutation_importance(X[test], y.iloc[test], random_state=0)["importance"]
        assert imp["f0"] > 0.3 and imp["f1"] > 0.03, imp
        unrelated = [t for t in imp.index if "f2" in t or "f3" in t]
        assert imp[unrelated].abs().max() < 0.03, imp
        feat = est.permutation_importance(X[test], y.iloc[test], level="feature",
                                          random_state=0)["importance"]
        assert feat["f0"] > 0.3 and abs(feat["f2"]) < 0.03 and abs(feat["f3"]) < 0.03, feat


def test_interactions_appear_in_W_and_importance():
    """Continuous features a, b interact (W_ab > 0), c does not.

    Measured with the defaults (lr 0.03): W_ab 0.361 (true 0.387), ||W_ - W_true|| 0.067,
    importance a:b 0.142, a:c and b:c ≤ 0.001; without the interaction in the truth,
    off-diagonal |W| ≤ 0.016 and interaction importances 0.0 (with lr 0.1: W_ab 0.371 /
    0.374, a:b 0.149 / 0.157, |W_ab| ≤ 0.008).
    (With only a few *binary* features W is not identifiable from ranks: e.g. with equal
    weights ``(Σ d)²`` ranks pairs exactly as ``Σ d``; continuous features avoid that.)
    """
    W_int = np.array([[1, 0.8, 0], [0.8, 1, 0], [0, 0, 1.0]])
    W_int /= np.linalg.norm(W_int)
    X, y = exact_numeric(60, W_int, seed=0)
    est = MLEM(distance="precomputed", random_state=0, max_steps=500).fit(X, y)
    imp = est.permutation_importance(X, y, level="term", random_state=0)["importance"]
    assert est.W_[0, 1] > 0.25 and abs(est.W_[0, 2]) < 0.08 and abs(est.W_[1, 2]) < 0.08
    assert imp["a:b"] > 0.08 and imp["a:c"] < 0.01 and imp["b:c"] < 0.01, imp
    assert np.linalg.norm(est.W_ - W_int) < 0.15
    # predict_rdm is sqrt(dᵀ W_ d) with the fitted scaling
    i, j = pair_indices(60)
    D = est.feature_space_.transform(y).pair_distances(i, j)
    rdm = est.predict_rdm(y)
    np.testing.assert_allclose(rdm[i, j], np.sqrt(np.einsum("pa,ab,pb->p", D, est.W_, D)))
    np.testing.assert_allclose(rdm, rdm.T)

    W_diag = np.eye(3) / np.sqrt(3)
    X, y = exact_numeric(60, W_diag, seed=0)
    est = MLEM(distance="precomputed", random_state=0, max_steps=500).fit(X, y)
    imp = est.permutation_importance(X, y, level="term", random_state=0)["importance"]
    assert np.abs(est.W_[np.triu_indices(3, 1)]).max() < 0.05
    assert imp[["a:b", "a:c", "b:c"]].abs().max() < 0.01, imp
    assert imp[["a", "b", "c"]].min() > 0.1, imp


def test_early_stopping_restores_the_best_state():
    """W_ is the best training state (a copy), not the last one; patience is honoured."""
    X, y = exact_numeric(40, np.eye(3) / np.sqrt(3), seed=1, noise=0.5)
    # exact per-pair training (numeric_levels=None), whose soft Spearman is recomputed below
    est = MLEM(distance="precomputed", batch_size="full", patience=10, lr=0.3, tol=0.0,
               numeric_levels=None, random_state=0).fit(X, y)
    assert est.converged_
    best = int(np.argmax(est.history_))
    assert est.n_iter_ == best + 1 + est.patience
    assert est.train_score_ == pytest.approx(est.history_.max())
    # recompute the soft Spearman of the returned W_ on all pairs
    i, j = pair_indices(40)
    D = torch.as_tensor(est.feature_space_.transform(y).pair_distances(i, j),
                        dtype=torch.float32)
    k, l = term_index(3)
    W = torch.as_tensor(est.W_, dtype=torch.float32)
    q = (W[k, l][None] * term_matrix(D, k, l)).sum(-1)
    tz = standardize(rankdata(torch.as_tensor(X[i, j]))).float()
    rho = soft_spearman(predict(q, "spd")[None], tz[None]).item()
    assert rho == pytest.approx(est.train_score_, abs=1e-4)
    assert est.history_[-1] < est.train_score_          # the last state was worse


def test_simulation_matches_its_contract():
    X, y, W = simulate_representations(n_stimuli=64, n_features=5, n_units=100, noise=0.1,
                                       random_state=0)
    assert X.shape == (64, 100) and y.shape == (64, 5) and W.shape == (5, 5)
    assert list(y.columns) == [f"f{k}" for k in range(5)]
    assert all(set(y[c]) == {"A", "B"} for c in y)
    assert np.linalg.norm(W) == pytest.approx(1.0)
    np.testing.assert_allclose(W, W.T)
    assert np.linalg.eigvalsh(W).min() > 0
    X2, y2, W2 = simulate_representations(64, 5, 100, noise=0.1, random_state=0)
    np.testing.assert_array_equal(X, X2)
    pd.testing.assert_frame_equal(y, y2)
    # the representations follow W (the MDS embedding only approximates the target
    # distances: with binary features they are not Euclidean); measured ρ = 0.81 here
    i, j = pair_indices(64)
    B = (y.to_numpy() == "B").astype(float)
    D = (B[i] != B[j]).astype(float)
    true = np.sqrt(np.einsum("pa,ab,pb->p", D, W, D))
    assert spearmanr(true, pdist(X))[0] > 0.6
    _, _, Wp = simulate_representations(30, 6, 10, n_informative=3, random_state=0)
    assert np.all(Wp[3:] == 0) and np.all(Wp[:, 3:] == 0)


@pytest.mark.parametrize("feature_type", ["numeric", "binary"])
def test_realisable_simulation_is_generated_from_w_true(feature_type):
    """kind="realisable": X is sqrt(dᵀ W_true d) (+ noise) at the pair level, so W_true is
    the population optimum; W_true is SPD with condition number <= 4."""
    X, y, W = simulate_representations(50, 4, noise=0.0, kind="realisable",
                                       feature_type=feature_type, random_state=1)
    assert X.shape == (50, 50) and y.shape == (50, 4)
    np.testing.assert_array_equal(X, X.T)
    assert np.all(np.diag(X) == 0)
    assert np.linalg.norm(W) == pytest.approx(1.0)
    ev = np.linalg.eigvalsh(W)
    assert ev.min() > 0 and ev.max() / ev.min() <= 4
    i, j = pair_indices(50)
    if feature_type == "numeric":
        F = y.to_numpy()
        assert (F.min(0) == 0).all() and (F.max(0) == 1).all()
    else:
        F = (y.to_numpy() == "B").astype(float)
        assert all(set(y[c]) == {"A", "B"} for c in y)
    D = np.abs(F[i] - F[j])
    np.testing.assert_allclose(X[i, j], np.sqrt(np.einsum("pa,ab,pb->p", D, W, D)))
    # noise: relative to the spread of the noiseless distances, independent per pair
    Xn, _, _ = simulate_representations(50, 4, noise=0.5, kind="realisable",
                                        feature_type=feature_type, random_state=1)
    assert np.std(Xn[i, j] - X[i, j]) / np.std(X[i, j]) == pytest.approx(0.5, rel=0.1)
    # fitted as a precomputed dissimilarity matrix
    est = MLEM(distance="precomputed", random_state=0, max_steps=50).fit(X, y)
    assert est.W_.shape == (4, 4)


def test_paper_simulation_has_a_ceiling_the_realisable_one_does_not():
    """Without noise the paper's MDS embedding only approximates sqrt(dᵀ W_true d).

    Measured (validation/recovery.py, 10 seeds): Spearman 0.71-0.97 at n = 128, m = 8,
    0.63-0.90 at n = 256, m = 16.  The realisable kind is exact (ρ = 1).
    """
    i, j = pair_indices(64)
    for seed in range(3):
        X, y, W = simulate_representations(64, 6, 64, noise=0.0, random_state=seed)
        B = (y.to_numpy() == "B").astype(float)
        D = (B[i] != B[j]).astype(float)
        assert spearmanr(np.sqrt(np.einsum("pa,ab,pb->p", D, W, D)), pdist(X))[0] < 0.95
        Xr, yr, Wr = simulate_representations(64, 6, noise=0.0, kind="realisable",
                                              feature_type="binary", random_state=seed)
        Br = (yr.to_numpy() == "B").astype(float)
        Dr = (Br[i] != Br[j]).astype(float)
        target = np.sqrt(np.einsum("pa,ab,pb->p", Dr, Wr, Dr))
        assert spearmanr(target, Xr[i, j])[0] == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(kind="exact"), ValueError, r"kind must be one of \['paper', 'realisable'\]"),
    (dict(feature_type="float"), ValueError, r"feature_type must be one of"),
    (dict(feature_type="numeric"), ValueError, r"binary features only; use kind='realisable'"),
    (dict(noise=-1.0), ValueError, r"noise must be a finite number >= 0"),
    (dict(noise="high"), TypeError, r"noise must be a number"),
    (dict(n_stimuli=2), ValueError, r"n_stimuli must be an int >= 3"),
    (dict(n_stimuli=40.0), TypeError, r"n_stimuli must be an int >= 3"),
    (dict(n_informative=9), ValueError, r"n_informative must be in \[1, n_features\]"),
])
def test_simulation_refuses_bad_parameters(kwargs, error, match):
    kw = dict(n_stimuli=40, n_features=3, n_units=8) | kwargs
    with pytest.raises(error, match=match):
        simulate_representations(**kw)


def test_simulation_refuses_a_fractional_n_informative():
    """n_informative=1.7 was truncated to 1 informative feature silently."""
    with pytest.raises(TypeError, match="n_informative must be None or an int"):
        simulate_representations(n_stimuli=40, n_features=3, n_units=8, n_informative=1.7)
    _, _, W = simulate_representations(n_stimuli=40, n_features=3, n_units=8,
                                       n_informative=np.int64(2), random_state=0)
    assert np.allclose(W[2:], 0) and not np.allclose(W[:2, :2], 0)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(sfreq=0.0), ValueError, r"sfreq must be a finite number > 0"),
    (dict(sfreq=-100.0), ValueError, r"sfreq must be a finite number > 0"),
    (dict(n_trials=0), ValueError, r"n_trials must be an int >= 1"),
    (dict(n_times=2.0), TypeError, r"n_times must be an int >= 1"),
    (dict(n_channels=0), ValueError, r"n_channels must be an int >= 1"),
    (dict(noise=-1.0), ValueError, r"noise must be a finite number >= 0"),
    (dict(amplitude=np.nan), ValueError, r"amplitude must be a finite number"),
    (dict(windows={"A": 0.2}), ValueError, r"window of 'A' must be None or \(start, stop\)"),
    (dict(windows={"A": (0.3, 0.1)}), ValueError, r"must have start < stop"),
])
def test_simulate_epochs_refuses_bad_parameters(kwargs, error, match):
    """sfreq=0 gave NaN times and no encoding, a negative sfreq decreasing times, a
    negative noise was taken as given: all silently."""
    from mlem_neuro.simulation import simulate_epochs

    with pytest.raises(error, match=match):
        simulate_epochs(**(dict(n_trials=20, n_channels=4, n_times=10) | kwargs))


def test_simulate_epochs_warns_about_a_window_outside_the_epoch():
    """The default windows reach 0.6 s: with 50 samples at 100 Hz from -0.1 s (to 0.39 s)
    'B' was silently never encoded."""
    from mlem_neuro.simulation import simulate_epochs

    with pytest.warns(UserWarning, match=r"window of 'B' \(0.4, 0.6\) holds no time "
                                         r"sample.*'B' is not encoded"):
        data, _, times = simulate_epochs(n_trials=20, n_channels=4, n_times=50, sfreq=100.0,
                                         tmin=-0.1, noise=0.0, random_state=0)
    inside = (times >= 0.1) & (times <= 0.3)
    assert np.abs(data[:, :, ~inside]).max() == 0 and np.abs(data[:, :, inside]).max() > 0
