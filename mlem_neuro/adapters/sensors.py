"""Sensor neighbourhoods: the channels within a radius of each channel, from MNE's positions.

A sensor searchlight (:func:`mlem_neuro.mlem_epochs` with ``spatial_radius``) centres a
neighbourhood on every channel; it holds the channels whose positions (MNE's
``info["chs"][k]["loc"][:3]``, set by a montage for EEG and by the acquisition for MEG)
lie within the radius of the centre.  EEG positions are in head coordinates, MEG ones in
device coordinates: a searchlight takes one sensor family at a time.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["channel_neighbourhoods", "channel_positions"]

_MEG = ("mag", "grad", "ref_meg")
_POSITIONED = ("eeg", "mag", "grad", "seeg", "ecog", "dbs")


def channel_positions(info):
    """Positions ``(n_channels, 3)`` in metres of the channels of ``info``.

    Raises a ValueError naming the fix when a channel has no position (no montage), when
    a channel type has none (stimulus, misc...) or when EEG and MEG channels are mixed.
    """
    from mne import channel_type

    types = [channel_type(info, k) for k in range(info["nchan"])]
    bad = sorted({t for t in types if t not in _POSITIONED})
    if bad:
        raise ValueError(f"spatial_radius needs channels with positions; the picked "
                         f"channels include type(s) {bad}. Pick sensors, e.g. picks='eeg' "
                         "or picks='meg'.")
    families = {"meg" if t in _MEG else t for t in types}
    if len(families) > 1:
        raise ValueError(f"spatial_radius takes one sensor family at a time (their "
                         f"positions are in different coordinate frames); the picked "
                         f"channels are {sorted(families)}. Run one analysis per family, "
                         "e.g. picks='eeg', then picks='meg'.")
    pos = np.array([ch["loc"][:3] for ch in info["chs"]], dtype=float)
    missing = ~np.isfinite(pos).all(axis=1) | (np.abs(pos).sum(axis=1) == 0)
    if missing.any():
        names = [info["ch_names"][k] for k in np.flatnonzero(missing)[:5]]
        raise ValueError(f"{int(missing.sum())} channel(s) have no position (e.g. {names}): "
                         "spatial_radius needs a montage. Set one first, e.g. "
                         "epochs.set_montage(mne.channels.make_standard_montage("
                         "'standard_1020')).")
    return pos


def channel_neighbourhoods(info, radius):
    """Sparse 0/1 membership ``(n_channels, n_channels)``: row ``c`` marks the channels
    within ``radius`` metres of channel ``c`` (itself included)."""
    from scipy.spatial import cKDTree

    pos = channel_positions(info)
    tree = cKDTree(pos)
    D = tree.sparse_distance_matrix(tree, radius, output_type="coo_matrix")
    A = sp.csr_matrix((np.ones(D.nnz), (D.row, D.col)), shape=D.shape)
    return ((A + sp.identity(len(pos), format="csr")) > 0).astype(np.float64).tocsr()
