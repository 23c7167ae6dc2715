"""Simulated stimuli with a known metric (the MLEM paper's simulation)."""
from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from .core.stimuli.pairs import pair_indices
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


#: kinds of :func:`simulate_representations`
SIMULATION_KINDS = ("paper", "realisable")
#: feature types of :func:`simulate_representations`
FEATURE_TYPES = ("binary", "numeric")


def _well_conditioned_spd(m, rng):
    """Random SPD matrix with eigenvalues uniform in ``[1, 4]`` (condition number <= 4)."""
    Q, _ = np.linalg.qr(rng.standard_normal((m, m)))
    return (Q * rng.uniform(1.0, 4.0, m)) @ Q.T


def simulate_representations(n_stimuli=256, n_features=16, n_units=768, noise=0.1,
                             interactions=True, n_informative=None, random_state=None, *,
                             kind="paper", feature_type="binary"):
    """Stimuli with features and neural data whose geometry follows a known metric.

    Two kinds of simulation:

    ``kind="paper"`` (default) follows the MLEM paper: each feature is "A" or "B" with
    probability 0.5; ``W_true`` is scikit-learn's ``make_spd_matrix`` normalised to
    Frobenius norm 1; the distances ``sqrt(dᵀ W_true d)`` (``d`` the indicator feature
    distances of a pair) are embedded with classical MDS and rotated into ``n_units``
    dimensions; Gaussian noise with standard deviation ``noise`` times each dimension's
    standard deviation is added.  ``X`` holds representations (stimuli × units).  These
    target distances are not Euclidean (classical MDS drops the negative part of the
    spectrum: 27-42 % of the eigen-mass, measured over 10 seeds), so the embedding only
    approximates them: even without noise the distances of ``X`` reach a Spearman
    correlation of 0.80 on average with ``sqrt(dᵀ W_true d)`` at the paper's size (256
    stimuli, 16 features; 0.63-0.90 over 10 seeds) and 0.87 at 128 stimuli and 8 features
    (0.71-0.97), and ``W_true`` is not the best metric for ``X``.  Use it to reproduce the
    paper, not to measure recovery.

    ``kind="realisable"`` makes ``W_true`` the population optimum: the neural distance of
    every pair is generated directly as ``sqrt(dᵀ W_true d) + noise · s · ε`` (``s`` the
    standard deviation of the noiseless distances, ``ε`` standard normal, independent per
    pair), and ``X`` is that ``(n_stimuli, n_stimuli)`` dissimilarity matrix, to be fitted
    with ``MLEM(distance="precomputed")``.  ``W_true`` is a well-conditioned SPD matrix
    (eigenvalues drawn uniformly in ``[1, 4]``, then normalised to Frobenius norm 1).
    With ``feature_type="numeric"`` each feature is uniform on ``[0, 1]``, rescaled so
    that its minimum is exactly 0 and its maximum exactly 1 (the scaling
    :class:`~mlem_neuro.MLEM` fits), and ``W`` is identifiable from the ranks of the
    distances.  With ``feature_type="binary"`` it is not: indicator distances leave
    families of metrics that rank every pair alike (see :doc:`/method`), so recovery has a
    floor above 0 whatever the fit.

    Parameters
    ----------
    n_stimuli : int
        Number of stimuli (>= 3).
    n_features : int
        Number of features (>= 1).
    n_units : int
        Dimensions of the representations (``kind="paper"``; unused otherwise).
    noise : float
        Noise level (>= 0): relative to each unit's standard deviation
        (``kind="paper"``), or to the standard deviation of the noiseless distances
        (``kind="realisable"``).
    interactions : bool
        Full SPD ``W_true`` (True) or a diagonal one with random positive weights in
        ``[0.2, 1]`` (False).
    n_informative : int | None
        If set, only the first ``n_informative`` features shape the neural data; the rows
        and columns of ``W_true`` for the others are zero.
    random_state : None | int | Generator
        Seed of every random draw.
    kind : {"paper", "realisable"}
        The MLEM paper's MDS embedding, or distances generated from ``W_true`` directly.
    feature_type : {"binary", "numeric"}
        Binary features (values "A" / "B") or numeric ones in ``[0, 1]``
        (``kind="realisable"`` only).

    Returns
    -------
    X : ndarray (n_stimuli, n_units) or (n_stimuli, n_stimuli)
        Representations (``kind="paper"``) or a symmetric dissimilarity matrix with a zero
        diagonal (``kind="realisable"``; fit it with ``distance="precomputed"``).
    y : DataFrame (n_stimuli, n_features)
        Columns ``f0, f1, ...``: categorical with values "A" / "B", or floats in
        ``[0, 1]``.
    W_true : ndarray (n_features, n_features)
        Symmetric positive (semi-)definite, Frobenius norm 1.

    Examples
    --------
    >>> from mlem_neuro import MLEM
    >>> from mlem_neuro.simulation import simulate_representations
    >>> X, y, W = simulate_representations(60, 3, noise=0.0, kind="realisable",
    ...                                    feature_type="numeric", random_state=0)
    >>> X.shape, y.shape, W.shape
    ((60, 60), (60, 3), (3, 3))
    >>> est = MLEM(distance="precomputed", random_state=0).fit(X, y)
    """
    rng = check_random_state(random_state)
    for name, v, low in (("n_stimuli", n_stimuli, 3), ("n_features", n_features, 1),
                         ("n_units", n_units, 1)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int >= {low}; got {v!r}")
        if v < low:
            raise ValueError(f"{name} must be an int >= {low}; got {v}")
    if isinstance(noise, (bool, np.bool_)) or not isinstance(noise, (int, float, np.number)):
        raise TypeError(f"noise must be a number >= 0; got {noise!r}")
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"noise must be a finite number >= 0; got {noise}")
    if kind not in SIMULATION_KINDS:
        raise ValueError(f"kind must be one of {list(SIMULATION_KINDS)}; got {kind!r}")
    if feature_type not in FEATURE_TYPES:
        raise ValueError(f"feature_type must be one of {list(FEATURE_TYPES)}; got "
                         f"{feature_type!r}")
    if kind == "paper" and feature_type != "binary":
        raise ValueError("the paper's simulation has binary features only; use "
                         "kind='realisable' for numeric features")
    if n_informative is not None and (isinstance(n_informative, (bool, np.bool_))
                                      or not isinstance(n_informative, (int, np.integer))):
        raise TypeError(f"n_informative must be None or an int in [1, n_features]; got "
                        f"{n_informative!r}")
    k = n_features if n_informative is None else int(n_informative)
    if not 1 <= k <= n_features:
        raise ValueError(f"n_informative must be in [1, n_features]; got {n_informative}")
    if feature_type == "binary":
        F = rng.integers(0, 2, size=(n_stimuli, n_features))
        for f in range(n_features):                   # every feature takes both values
            if F[:, f].min() == F[:, f].max():
                F[rng.integers(n_stimuli), f] ^= 1
    else:
        F = rng.random((n_stimuli, n_features))
        F = (F - F.min(axis=0)) / (F.max(axis=0) - F.min(axis=0))
    W = np.zeros((n_features, n_features))
    if not interactions:
        W[:k, :k] = np.diag(rng.uniform(0.2, 1.0, k))
    elif kind == "paper":
        W[:k, :k] = _spd(k, rng)
    else:
        W[:k, :k] = _well_conditioned_spd(k, rng)
    W /= np.linalg.norm(W)
    i, j = pair_indices(n_stimuli)
    D = (F[i] != F[j]).astype(float) if feature_type == "binary" else np.abs(F[i] - F[j])
    d = np.sqrt(np.clip(np.einsum("pa,ab,pb->p", D, W, D), 0, None))
    if feature_type == "binary":
        y = pd.DataFrame({f"f{f}": pd.Categorical(np.where(F[:, f] == 0, "A", "B"),
                                                  categories=["A", "B"])
                          for f in range(n_features)})
    else:
        y = pd.DataFrame(F, columns=[f"f{f}" for f in range(n_features)])
    Dm = np.zeros((n_stimuli, n_stimuli))
    if kind == "realisable":
        Dm[i, j] = Dm[j, i] = d + noise * d.std() * rng.standard_normal(len(d))
        return Dm, y, W
    Dm[i, j] = Dm[j, i] = d
    E = classical_mds(Dm, n_components=n_units)
    r = E.shape[1]
    Q, _ = np.linalg.qr(rng.standard_normal((n_units, r)))   # isometric lift to n_units
    X = E @ Q.T
    X = X + noise * X.std(axis=0, keepdims=True) * rng.standard_normal(X.shape)
    return X, y, W


def simulate_epochs(n_trials=120, n_channels=32, n_times=90, sfreq=100.0, tmin=-0.2,
                    windows=None, n_levels=2, amplitude=1.0, noise=1.0, random_state=None):
    """Simulated epochs whose sensor patterns encode features in known time windows.

    Each feature has ``n_levels`` levels (``"L0"``, ``"L1"``, ...) drawn at random per
    trial; each level owns a random spatial pattern over channels.  Inside the feature's
    window the pattern of the trial's level is added with a smooth (Hann) envelope; outside
    it the feature leaves no trace.  Features in ``windows`` with value ``None`` are drawn
    but never encoded (controls); a window that holds none of the ``times`` leaves its
    feature unencoded too, with a warning (the default windows reach 0.6 s).  Gaussian
    noise (std ``noise``) is added everywhere.

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
    for name, v in (("n_trials", n_trials), ("n_channels", n_channels),
                    ("n_times", n_times)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must be an int >= 1; got {v!r}")
        if v < 1:
            raise ValueError(f"{name} must be an int >= 1; got {v}")
    if n_levels < 2:
        raise ValueError(f"n_levels must be >= 2; got {n_levels}")
    for name, v, low in (("sfreq", sfreq, "> 0"), ("tmin", tmin, None),
                         ("amplitude", amplitude, None), ("noise", noise, ">= 0")):
        if not np.isfinite(v) or (low == "> 0" and v <= 0) or (low == ">= 0" and v < 0):
            raise ValueError(f"{name} must be a finite number{' ' + low if low else ''}; "
                             f"got {v}")
    for name, win in windows.items():
        if win is not None and (np.ndim(win) != 1 or len(win) != 2):
            raise ValueError(f"window of {name!r} must be None or (start, stop) in "
                             f"seconds; got {win!r}")
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
        if not inside.any():
            warnings.warn(f"window of {name!r} {tuple(win)} holds no time sample (times "
                          f"{times[0]:g} to {times[-1]:g} s): {name!r} is not encoded. "
                          "Pass windows= inside the epoch, or more n_times.", stacklevel=2)
        env = np.zeros(n_times)
        env[inside] = np.hanning(inside.sum() + 2)[1:-1]
        patterns = rng.standard_normal((n_levels, n_channels))
        patterns /= np.sqrt((patterns ** 2).mean(axis=1, keepdims=True))
        data += amplitude * patterns[codes][:, :, None] * env[None, None, :]
    return data, pd.DataFrame(table), times


def simulate_item_trials(n_items=40, n_trials=8, n_units=16, n_times=1, n_conditions=2,
                         amplitude=0.5, item_sd=0.0, noise=1.0, random_state=None):
    """Repeated trials of items that belong to conditions: the setting of ``items=``.

    Each of ``n_conditions`` conditions owns a random pattern over units (unit RMS); the
    items are split evenly between the conditions; an item's response is ``amplitude``
    times its condition's pattern plus ``item_sd`` times a pattern of its own (unit RMS),
    the same at every time point; each of its ``n_trials`` trials adds independent
    Gaussian noise (std ``noise``) on every unit and time point.  Trials come in a random
    order.

    Parameters
    ----------
    n_items : int
        Number of items (split evenly between the conditions).
    n_trials : int
        Trials per item.
    n_units : int
        Units (channels, voxels).
    n_times : int
        Time points (the responses do not change over time; the noise does).
    n_conditions : int
        Number of conditions (>= 2).
    amplitude : float
        Condition pattern amplitude.
    item_sd : float
        Amplitude of each item's own pattern (0: items of a condition differ only by
        trial noise).
    noise : float
        Trial noise std.
    random_state : None | int | Generator
        Seed or generator.

    Returns
    -------
    data : ndarray (n_items * n_trials, n_units, n_times)
        The trials.
    table : DataFrame
        ``"condition"`` (categorical ``"c0"``, ``"c1"``...) and ``"item"`` (``"i00"``...),
        one row per trial.
    """
    rng = check_random_state(random_state)
    if n_items < n_conditions or n_conditions < 2:
        raise ValueError(f"need n_conditions >= 2 and n_items >= n_conditions; got "
                         f"{n_conditions} conditions, {n_items} items")

    def unit_rms(x):
        return x / np.sqrt((x ** 2).mean(axis=-1, keepdims=True))

    condition = np.arange(n_items) % n_conditions
    centre = (amplitude * unit_rms(rng.standard_normal((n_conditions, n_units)))[condition]
              + item_sd * unit_rms(rng.standard_normal((n_items, n_units))))
    item = rng.permutation(np.repeat(np.arange(n_items), n_trials))
    data = centre[item][:, :, None] + noise * rng.standard_normal(
        (len(item), n_units, n_times))
    width = len(str(n_items - 1))
    table = pd.DataFrame({
        "condition": pd.Categorical([f"c{c}" for c in condition[item]],
                                    categories=[f"c{c}" for c in range(n_conditions)]),
        "item": [f"i{k:0{width}d}" for k in item]})
    return data, table


CODE_KINDS = ("binary", "categorical", "numeric")


def _interaction_cells(strength):
    """3-D codes of the four cells ``(a, b)`` of two binary features.

    Pairs differing in one feature are always 1 apart; pairs differing in both are
    ``sqrt(2 (1 - strength))`` apart (``sqrt(2)``: additive, a square; ``1``: a regular
    tetrahedron; ``0``: the code of ``a XOR b``).  Rows: cells 00, 01, 10, 11.
    """
    x = np.sqrt(2.0 * (1.0 - strength)) / 2.0
    z = np.sqrt(strength) / 2.0
    return np.array([[x, 0.0, z], [0.0, x, -z], [0.0, -x, -z], [-x, 0.0, z]])


def simulate_codes(n_stimuli=48, features=("binary", "binary"), n_units=50, noise=1.0,
                   interaction=0.0, n_levels=3, weights=None, random_state=None):
    """Stimuli whose representations code each feature in its own subspace (known truth).

    Each feature is coded in its own orthogonal subspace of the units, so the squared
    noise-free distance between two stimuli is the sum of one term per feature (an
    additive code):

    * ``"binary"``: two balanced levels, 1 apart;
    * ``"categorical"``: ``n_levels`` balanced levels at the vertices of a regular simplex
      (every two levels 1 apart: equidistant level codes);
    * ``"numeric"``: a value uniform on ``[0, 1]`` coded linearly (distance ``|Δx|``).

    Feature ``k``'s code is multiplied by ``weights[k]``.  With ``interaction > 0`` the
    first two features (both binary) share one 3-D subspace instead (scaled by
    ``sqrt(weights[0] * weights[1])``): pairs differing in one of them stay 1 apart, pairs
    differing in both are ``sqrt(2 (1 - interaction))`` apart.  This code is sub-additive:
    ``sqrt(2)`` at 0 is additive, ``1`` at 0.5 puts pairs differing in both no farther
    than pairs differing in one, and at 1 the code is that of ``a XOR b``.  Each stimulus
    gets Gaussian noise of standard deviation ``noise / sqrt(n_units)`` per unit, so the
    expected squared noise distance between two stimuli is ``2 noise²``.

    Parameters
    ----------
    n_stimuli : int
        Number of stimuli (at least 4).
    features : sequence of str
        Kind of each feature, among ``"binary"``, ``"categorical"`` and ``"numeric"``;
        features are named ``f0, f1, ...``.
    n_units : int
        Number of units; must hold every feature's subspace.
    noise : float
        Noise level (>= 0), in units of the distance between two levels of a feature.
    interaction : float
        Strength of the sub-additive interaction of ``f0`` and ``f1``, in ``[0, 1]``.
    n_levels : int
        Levels of the ``"categorical"`` features (at least 2).
    weights : sequence of float | None
        Scale of each feature's code (default 1 for all).
    random_state : None | int | numpy Generator
        Seeds the feature values and the noise.

    Returns
    -------
    X : ndarray (n_stimuli, n_units)
        Representations.
    table : DataFrame (n_stimuli, n_features)
        Binary and categorical features as categoricals (levels ``"L0"``, ``"L1"``...),
        numeric ones as floats.
    """
    rng = check_random_state(random_state)
    features = [features] if isinstance(features, str) else list(features)
    bad = [k for k in features if k not in CODE_KINDS]
    if not features or bad:
        raise ValueError(f"features must be a non-empty list of kinds among "
                         f"{list(CODE_KINDS)}; got {features!r}.")
    if int(n_stimuli) != n_stimuli or n_stimuli < 4:
        raise ValueError(f"n_stimuli must be an int >= 4; got {n_stimuli!r}.")
    if int(n_levels) != n_levels or n_levels < 2:
        raise ValueError(f"n_levels must be an int >= 2; got {n_levels!r}.")
    if not np.isfinite(noise) or noise < 0:
        raise ValueError(f"noise must be a finite number >= 0; got {noise!r}.")
    if not 0 <= interaction <= 1:
        raise ValueError(f"interaction must be in [0, 1]; got {interaction!r}.")
    if interaction > 0 and features[:2] != ["binary", "binary"]:
        raise ValueError("interaction > 0 needs the first two features to be 'binary'; got "
                         f"{features[:2]!r}.")
    w = np.ones(len(features)) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (len(features),) or not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError(f"weights must hold one finite number >= 0 per feature "
                         f"({len(features)}); got {weights!r}.")
    n = int(n_stimuli)
    blocks, table = [], {}
    for k, kind in enumerate(features):
        if kind == "numeric":
            x = rng.uniform(0.0, 1.0, n)
            table[f"f{k}"] = x
            blocks.append(w[k] * x[:, None])
            continue
        levels = 2 if kind == "binary" else int(n_levels)
        codes = rng.permutation(np.arange(n) % levels)             # balanced levels
        table[f"f{k}"] = pd.Categorical([f"L{c}" for c in codes],
                                        categories=[f"L{c}" for c in range(levels)])
        blocks.append(w[k] * np.eye(levels)[codes] / np.sqrt(2.0))  # simplex, edges 1
    if interaction > 0:
        a = table["f0"].codes.astype(int)
        b = table["f1"].codes.astype(int)
        cells = _interaction_cells(float(interaction))
        blocks[:2] = [np.sqrt(w[0] * w[1]) * cells[2 * a + b]]
    code = np.concatenate(blocks, axis=1)
    if code.shape[1] > n_units:
        raise ValueError(f"n_units must be at least {code.shape[1]} to hold every "
                         f"feature's subspace; got {n_units}.")
    X = np.zeros((n, int(n_units)))
    X[:, :code.shape[1]] = code
    X += noise / np.sqrt(n_units) * rng.standard_normal(X.shape)
    return X, pd.DataFrame(table)


#: the datatypes :func:`simulate_bids_study` writes
BIDS_STUDY_DATATYPES = ("eeg", "meg", "func")


def _bids_trials(n_trials, rng):
    """A balanced table of trials: ``category`` (A/B, the encoded feature) and ``size``
    (small/large, not encoded), in random order."""
    category = np.repeat(["A", "B"], n_trials // 2)
    size = np.tile(["small", "large"], n_trials // 2)
    order = rng.permutation(len(category))
    return pd.DataFrame({"category": category[order], "size": size[order]})


def _write_tsv(table, path):
    table.to_csv(path, sep="\t", index=False, na_rep="n/a")


def _simulated_meeg_subject(root, label, task, n_trials, effect, rng, datatype="eeg"):
    """One subject's EEG (8 channels, BrainVision) or MEG (4 magnetometers and 8
    gradiometers, FIF) recording, written with mne-bids, and its events.tsv."""
    import mne
    from mne_bids import BIDSPath, write_raw_bids

    sfreq, gap = 100.0, 1.0
    if datatype == "eeg":
        names = [f"EEG{k:02d}" for k in range(8)]
        types, scale = ["eeg"] * 8, {"eeg": 1e-6}
    else:                         # Neuromag-like triplets: one magnetometer, two gradiometers
        names = [f"MEG{k:03d}{c}" for k in range(1, 5) for c in "123"]
        types = ["mag" if n.endswith("1") else "grad" for n in names]
        scale = {"mag": 1e-13, "grad": 1e-11}
    n_channels = len(names)
    trials = _bids_trials(n_trials, rng)
    onsets = 1.0 + gap * np.arange(n_trials)
    n_samples = int((onsets[-1] + 2.0) * sfreq)
    data = rng.standard_normal((n_channels, n_samples))
    patterns = {c: rng.standard_normal(n_channels) for c in ("A", "B")}
    t = np.arange(int(0.5 * sfreq)) / sfreq
    bump = np.exp(-0.5 * ((t - 0.2) / 0.05) ** 2)      # peaks 0.2 s after onset
    for onset, cat in zip(onsets, trials["category"]):
        start = int(round(onset * sfreq))
        data[:, start:start + len(t)] += effect * patterns[cat][:, None] * bump
    info = mne.create_info(names, sfreq, types)
    data *= np.array([scale[k] for k in types])[:, None]      # volts, teslas, T/m
    raw = mne.io.RawArray(data, info, verbose="ERROR")
    raw.set_meas_date(1_700_000_000 + int(label) * 86_400)
    raw.info["line_freq"] = 50.0
    events = np.column_stack([np.round(onsets * sfreq).astype(int),
                              np.zeros(n_trials, dtype=int), np.ones(n_trials, dtype=int)])
    path = BIDSPath(subject=label, task=task, datatype=datatype, root=root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_raw_bids(raw, path, events=events, event_id={"stimulus": 1},
                       format="BrainVision" if datatype == "eeg" else "FIF",
                       allow_preload=True, overwrite=True, verbose="ERROR")
    fname = path.copy().update(suffix="events", extension=".tsv").fpath
    written = pd.read_csv(fname, sep="\t")
    _write_tsv(pd.concat([written, trials], axis=1), fname)


def _simulated_fmri_subject(root, deriv, label, task, n_trials, effect, rng, n_runs, t_r,
                            space):
    import json

    import nibabel as nib
    from nilearn.glm.first_level import make_first_level_design_matrix

    shape, gap = (6, 6, 6), 8.0
    affine = np.diag([4.0, 4.0, 4.0, 1.0])
    affine[:3, 3] = -10.0
    region = np.zeros(shape, dtype=bool)
    region[:3] = True                                 # the encoded region: x < 0 mm
    n_vox = region.sum()
    patterns = {c: rng.standard_normal(n_vox) for c in ("A", "B")}
    mask = np.ones(shape, dtype=np.uint8)
    for run in range(1, n_runs + 1):
        trials = _bids_trials(n_trials, rng)
        onsets = 4.0 + gap * np.arange(n_trials)
        n_scans = int(np.ceil((onsets[-1] + 20.0) / t_r))
        events = pd.DataFrame({"onset": onsets, "duration": 1.0, **trials})
        names = [f"t{k:03d}" for k in range(n_trials)]
        design = make_first_level_design_matrix(
            t_r * np.arange(n_scans), events.assign(trial_type=names)[
                ["onset", "duration", "trial_type"]], drift_model=None)[names].to_numpy()
        betas = rng.standard_normal((n_trials, int(np.prod(shape))))
        for k, cat in enumerate(trials["category"]):
            betas[k, region.ravel()] += effect * patterns[cat]
        bold = 100.0 + design @ betas + 0.5 * rng.standard_normal((n_scans, betas.shape[1]))
        img = nib.Nifti1Image(bold.T.reshape(*shape, n_scans).astype(np.float32), affine)
        img.header.set_xyzt_units("mm", "sec")
        img.header["pixdim"][4] = t_r
        img.header.set_sform(affine, code=4)
        raw_func = root / f"sub-{label}" / "func"
        der_func = deriv / f"sub-{label}" / "func"
        raw_func.mkdir(parents=True, exist_ok=True)
        der_func.mkdir(parents=True, exist_ok=True)
        img.to_filename(raw_func / f"sub-{label}_task-{task}_run-{run:02d}_bold.nii.gz")
        _write_tsv(events, raw_func / f"sub-{label}_task-{task}_run-{run:02d}_events.tsv")
        stem = f"sub-{label}_task-{task}_run-{run}"
        img.to_filename(der_func / f"{stem}_space-{space}_desc-preproc_bold.nii.gz")
        (der_func / f"{stem}_space-{space}_desc-preproc_bold.json").write_text(
            json.dumps({"RepetitionTime": t_r, "SkullStripped": False}))
        nib.Nifti1Image(mask, affine).to_filename(
            der_func / f"{stem}_space-{space}_desc-brain_mask.nii.gz")
        motion = 0.01 * rng.standard_normal((n_scans, 6)).cumsum(axis=0)
        confounds = pd.DataFrame(motion, columns=["trans_x", "trans_y", "trans_z",
                                                  "rot_x", "rot_y", "rot_z"])
        confounds.insert(0, "framewise_displacement",
                         np.r_[np.nan, np.abs(np.diff(motion, axis=0)).sum(axis=1)])
        _write_tsv(confounds, der_func / f"{stem}_desc-confounds_timeseries.tsv")
    return region, affine


def simulate_bids_study(root, datatype="eeg", *, n_subjects=5, n_trials=40, effect=1.0,
                        task="objects", n_runs=2, t_r=2.0, space="MNI152NLin2009cAsym",
                        random_state=None):
    """Write a small simulated BIDS study: raw data and events of several subjects.

    Every trial has two features in its ``events.tsv``: ``category`` (``"A"`` / ``"B"``)
    and ``size`` (``"small"`` / ``"large"``); only ``category`` is encoded, in every
    subject, with ``effect`` (0: no subject encodes anything).

    * ``datatype="eeg"``: one recording per subject (8 EEG channels at 100 Hz, written
      with :func:`mne_bids.write_raw_bids` in BrainVision format, which needs the
      ``pybv`` package); one trial per second; ``category`` adds a subject-specific
      channel pattern around 0.2 s after each onset.
    * ``datatype="meg"``: the same, recorded by 4 magnetometers and 8 planar
      gradiometers (channel types ``mag`` and ``grad``, in teslas and T/m, written in FIF
      format; no sensor positions).
    * ``datatype="func"``: ``n_runs`` BOLD runs per subject on a 6 x 6 x 6 grid of 4 mm
      voxels, one trial every 8 s, raw runs and events plus a derivatives folder in
      fMRIPrep's layout (``derivatives/fmriprep``: preprocessed runs in ``space``, brain
      masks, confounds tables with head motion, sidecars giving ``t_r``); ``category``
      adds a subject-specific pattern to the trial betas of the voxels at x < 0 mm; an
      atlas of two regions (that half, and the other) is written to
      ``derivatives/atlas``.

    Parameters
    ----------
    root : path-like
        The dataset's folder (created; files already there are replaced).
    datatype : "eeg" | "meg" | "func"
        The recordings written.
    n_subjects : int
        Subjects ``sub-01``, ``sub-02``...
    n_trials : int
        Trials per recording (per run for fMRI), an even number.
    effect : float
        Amplitude of the ``category`` code, in units of the noise's standard deviation.
    task : str
        The task label.
    n_runs : int
        fMRI: runs per subject.
    t_r : float
        fMRI: repetition time in seconds.
    space : str
        fMRI: the space label of the preprocessed runs.
    random_state : None | int
        Seeds the simulation.

    Returns
    -------
    paths : dict
        ``"bids_root"``; for fMRI also ``"derivatives"`` and ``"labels_img"`` (the atlas,
        region 1 the encoded half).

    Examples
    --------
    >>> from mlem_neuro.simulation import simulate_bids_study
    >>> paths = simulate_bids_study("study", "eeg", n_subjects=5,
    ...                             random_state=0)                  # doctest: +SKIP
    """
    import json
    from pathlib import Path

    from .core.checks import check

    check("datatype", datatype, allowed=BIDS_STUDY_DATATYPES)
    if n_trials < 4 or n_trials % 2:
        raise ValueError(f"n_trials must be an even number >= 4; got {n_trials}.")
    rng = check_random_state(random_state)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / "dataset_description.json").write_text(json.dumps(
        {"Name": "mlem_neuro simulated study", "BIDSVersion": "1.10.0",
         "DatasetType": "raw"}, indent=2))
    out = {"bids_root": root}
    labels = [f"{k:02d}" for k in range(1, n_subjects + 1)]
    pd.DataFrame({"participant_id": [f"sub-{s}" for s in labels]}).to_csv(
        root / "participants.tsv", sep="\t", index=False)
    if datatype in ("eeg", "meg"):
        for label in labels:
            _simulated_meeg_subject(root, label, task, n_trials, effect, rng, datatype)
        return out
    import nibabel as nib

    deriv = root / "derivatives" / "fmriprep"
    deriv.mkdir(parents=True, exist_ok=True)
    (deriv / "dataset_description.json").write_text(json.dumps(
        {"Name": "simulated preprocessing", "BIDSVersion": "1.10.0",
         "DatasetType": "derivative", "GeneratedBy": [{"Name": "simulation"}]}, indent=2))
    (root / f"task-{task}_bold.json").write_text(json.dumps(
        {"TaskName": task, "RepetitionTime": t_r}))
    for label in labels:
        region, affine = _simulated_fmri_subject(root, deriv, label, task, n_trials, effect,
                                                 rng, n_runs, t_r, space)
    atlas = root / "derivatives" / "atlas"
    atlas.mkdir(parents=True, exist_ok=True)
    labels_img = atlas / f"space-{space}_desc-halves_dseg.nii.gz"
    nib.Nifti1Image(np.where(region, 1, 2).astype(np.int16), affine).to_filename(labels_img)
    out.update(derivatives=deriv, labels_img=labels_img)
    return out
