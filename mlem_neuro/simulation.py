"""Simulated stimuli with a known metric (the MLEM paper's simulation)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .core.pairs import pair_indices
from .utils import check_random_state


def _spd(m, rng):
    from sklearn.datasets import make_spd_matrix

    return make_spd_matrix(m, random_state=int(rng.integers(2**31 - 1)))


def classical_mds(D, n_components=None):
    """Classical (Torgerson) MDS of a distance matrix: coordinates ``(n, r)``.

    Uses the positive part of the spectrum of the double-centred squared distances; when
    ``D`` is Euclidean the embedding reproduces it exactly.
    """
    n = D.shape[0]
    J = np.eye(n) - 1.0 / n
    B = -0.5 * J @ (D ** 2) @ J
    vals, vecs = np.linalg.eigh(B)
    order = np.argsort(vals)[::-1]
    vals, vecs = vals[order], vecs[:, order]
    keep = vals > 1e-10 * max(vals[0], 1e-300)
    if n_components is not None:
        keep &= np.arange(n) < n_components
    return vecs[:, keep] * np.sqrt(vals[keep])


def simulate_representations(n_stimuli=256, n_features=16, n_units=768, noise=0.1,
                             interactions=True, n_informative=None, random_state=None):
    """Stimuli with binary features and representations whose geometry follows a known W.

    Following the MLEM paper's simulation: each feature is "A" or "B" with probability
    0.5; the ground-truth metric ``W_true`` is scikit-learn's ``make_spd_matrix``
    normalised to Frobenius norm 1; the distances ``sqrt(dᵀ W_true d)`` (``d`` the
    indicator feature distances of a pair) are embedded with classical MDS and rotated into
    ``n_units`` dimensions; Gaussian noise with standard deviation ``noise`` times each
    dimension's standard deviation is added.

    Parameters
    ----------
    n_stimuli, n_features, n_units : int
    noise : float
        Noise level (relative to each unit's standard deviation).
    interactions : bool
        Full SPD ``W_true`` (True) or a diagonal one with random positive weights (False).
    n_informative : int | None
        If set, only the first ``n_informative`` features shape the representations; the
        rows and columns of ``W_true`` for the others are zero.
    random_state : None | int | Generator

    Returns
    -------
    X : ndarray (n_stimuli, n_units)
    y : DataFrame (n_stimuli, n_features)
        Columns ``f0, f1, ...`` of categorical dtype with values "A" / "B".
    W_true : ndarray (n_features, n_features)
        Symmetric positive (semi-)definite, Frobenius norm 1.
    """
    rng = check_random_state(random_state)
    for name, v, low in (("n_stimuli", n_stimuli, 3), ("n_features", n_features, 1),
                         ("n_units", n_units, 1)):
        if int(v) != v or v < low:
            raise ValueError(f"{name} must be an int >= {low}; got {v}")
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"noise must be >= 0; got {noise}")
    k = n_features if n_informative is None else int(n_informative)
    if not 1 <= k <= n_features:
        raise ValueError(f"n_informative must be in [1, n_features]; got {n_informative}")
    B = rng.integers(0, 2, size=(n_stimuli, n_features))
    for f in range(n_features):                       # every feature takes both values
        if B[:, f].min() == B[:, f].max():
            B[rng.integers(n_stimuli), f] ^= 1
    W = np.zeros((n_features, n_features))
    W[:k, :k] = _spd(k, rng) if interactions else np.diag(rng.uniform(0.2, 1.0, k))
    W /= np.linalg.norm(W)
    i, j = pair_indices(n_stimuli)
    D = (B[i] != B[j]).astype(float)
    d = np.sqrt(np.clip(np.einsum("pa,ab,pb->p", D, W, D), 0, None))
    Dm = np.zeros((n_stimuli, n_stimuli))
    Dm[i, j] = Dm[j, i] = d
    E = classical_mds(Dm, n_components=n_units)
    r = E.shape[1]
    Q, _ = np.linalg.qr(rng.standard_normal((n_units, r)))   # isometric lift to n_units
    X = E @ Q.T
    X = X + noise * X.std(axis=0, keepdims=True) * rng.standard_normal(X.shape)
    y = pd.DataFrame({f"f{f}": pd.Categorical(np.where(B[:, f] == 0, "A", "B"),
                                              categories=["A", "B"])
                      for f in range(n_features)})
    return X, y, W


def simulate_epochs(n_trials=120, n_channels=32, n_times=90, sfreq=100.0, tmin=-0.2,
                    windows=None, n_levels=2, amplitude=1.0, noise=1.0, random_state=None):
    """Simulated epochs whose sensor patterns encode features in known time windows.

    Each feature has ``n_levels`` levels (``"L0"``, ``"L1"``, ...) drawn at random per
    trial; each level owns a random spatial pattern over channels.  Inside the feature's
    window the pattern of the trial's level is added with a smooth (Hann) envelope; outside
    it the feature leaves no trace.  Features in ``windows`` with value ``None`` are drawn
    but never encoded (controls).  Gaussian noise (std ``noise``) is added everywhere.

    Parameters
    ----------
    n_trials, n_channels, n_times : int
    sfreq : float
        Sampling frequency (Hz).
    tmin : float
        Time of the first sample (s); samples before 0 form a baseline.
    windows : dict | None
        ``{feature: (start, stop) | None}`` in seconds.  Default
        ``{"A": (0.1, 0.3), "B": (0.4, 0.6), "C": None}``.
    n_levels : int
    amplitude : float
        Pattern amplitude (the pattern has unit RMS over channels).
    noise : float
    random_state : None | int | Generator

    Returns
    -------
    data : ndarray (n_trials, n_channels, n_times)
    features : DataFrame (n_trials, n_features)
    times : ndarray (n_times,)
    """
    rng = check_random_state(random_state)
    if windows is None:
        windows = {"A": (0.1, 0.3), "B": (0.4, 0.6), "C": None}
    if n_levels < 2:
        raise ValueError(f"n_levels must be >= 2; got {n_levels}")
    times = tmin + np.arange(n_times) / float(sfreq)
    data = noise * rng.standard_normal((n_trials, n_channels, n_times))
    table = {}
    for name, win in windows.items():
        codes = rng.permutation(np.arange(n_trials) % n_levels)   # balanced levels
        table[name] = pd.Categorical([f"L{c}" for c in codes],
                                     categories=[f"L{c}" for c in range(n_levels)])
        if win is None:
            continue
        start, stop = win
        if not start < stop:
            raise ValueError(f"window of {name!r} must have start < stop; got {win}")
        inside = (times >= start) & (times <= stop)
        env = np.zeros(n_times)
        env[inside] = np.hanning(inside.sum() + 2)[1:-1]
        patterns = rng.standard_normal((n_levels, n_channels))
        patterns /= np.sqrt((patterns ** 2).mean(axis=1, keepdims=True))
        data += amplitude * patterns[codes][:, :, None] * env[None, None, :]
    return data, pd.DataFrame(table), times
