"""Source estimates and their neighbourhoods: ``mne.SourceEstimate`` lists → arrays + patches.

* :func:`check_stcs`: a list of source estimates (one per stimulus) with the same
  vertices, times and subject; :func:`stcs_array` their data ``(n_stimuli, n_times,
  n_sources)`` at the time points kept, in one copy;
* :func:`src_neighbourhoods`: a searchlight patch around every source point, from MNE's
  own distances: geodesic distances along the cortical surface for a surface source space
  (``src[h]["dist"]``, computed by :func:`mne.add_source_space_distances` when the source
  space does not hold them up to the radius), straight-line distances between the grid
  points of a volume source space (``src[0]["rr"]``);
* :func:`label_neighbourhoods`: one neighbourhood per :class:`mne.Label`.

The neighbourhoods are sparse 0/1 matrices ``(n_neighbourhoods, n_sources)`` whose columns
follow the estimates' vertices (hemisphere by hemisphere), ready for
:class:`~mlem_neuro.core.rdms.spacetime.SpaceTimeRDMSource`.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..utils import check_real, logger, normalise_magnitude

__all__ = ["check_spatial_radius", "check_stcs", "label_neighbourhoods",
           "src_neighbourhoods", "stcs_array"]


def check_spatial_radius(radius, name="spatial_radius"):
    """``radius`` (metres) as a float; refuses non-numbers and non-positive values
    (:data:`mlem_neuro.core.checks.CHECKS`)."""
    from ..core.checks import CHECKS

    return CHECKS["spatial_radius"](name, radius)


def _stc_kind(stc):
    from mne import SourceEstimate, VolSourceEstimate

    if type(stc) is SourceEstimate:
        return "surface"
    if type(stc) is VolSourceEstimate:
        return "volume"
    raise TypeError("stcs must hold mne.SourceEstimate (cortical surface) or "
                    "mne.VolSourceEstimate (volume) objects with one value per source; got "
                    f"{type(stc).__name__}. For vector estimates use stc.magnitude() or "
                    "the normal component (pick_ori='normal').")


def check_stcs(stcs):
    """A list of source estimates (one per stimulus) with the same vertices, times and
    subject.

    Parameters
    ----------
    stcs : list of SourceEstimate | list of VolSourceEstimate
        One estimate per stimulus (a generator, e.g. from
        :func:`mne.minimum_norm.apply_inverse_epochs` with ``return_generator=True``, is
        read once).

    Returns
    -------
    stcs : list
    vertices : list of ndarray
        The vertices of each hemisphere (surface) or of each volume.
    times : ndarray (n_times,)
    kind : {"surface", "volume"}
    subject : str | None
    tstep : float
        Seconds between samples.
    """
    if hasattr(stcs, "data") and hasattr(stcs, "vertices"):
        raise TypeError("stcs must be a list of source estimates, one per stimulus; got a "
                        f"single {type(stcs).__name__}.")
    try:
        stcs = list(stcs)
    except TypeError:
        raise TypeError("stcs must be a list of mne.SourceEstimate (one per stimulus); got "
                        f"{type(stcs).__name__}.") from None
    if len(stcs) < 3:
        raise ValueError(f"MLEM needs at least 3 source estimates (pairs of stimuli are "
                         f"compared); got {len(stcs)}.")
    first = stcs[0]
    kind = _stc_kind(first)
    vertices = [np.asarray(v) for v in first.vertices]
    times = np.asarray(first.times, dtype=float)
    for k, stc in enumerate(stcs[1:], start=1):
        if _stc_kind(stc) != kind:
            raise TypeError(f"stcs[{k}] is a {type(stc).__name__} but stcs[0] is a "
                            f"{type(first).__name__}; give estimates of one kind.")
        if len(stc.vertices) != len(vertices) or any(
                len(a) != len(b) or not np.array_equal(a, b)
                for a, b in zip(stc.vertices, vertices)):
            raise ValueError(f"stcs[{k}] has other vertices than stcs[0] "
                             f"({[len(v) for v in stc.vertices]} vs "
                             f"{[len(v) for v in vertices]} per hemisphere/volume); every "
                             "estimate must come from the same source space (same inverse "
                             "operator, or restricted alike, e.g. stc.in_label(label) for "
                             "all).")
        if len(stc.times) != len(times) or not np.allclose(stc.times, times, rtol=0,
                                                           atol=1e-3 * _step(times)):
            raise ValueError(f"stcs[{k}] has other times than stcs[0] ({len(stc.times)} "
                             f"samples from {stc.times[0]:.4g} s vs {len(times)} from "
                             f"{times[0]:.4g} s); crop / resample them alike "
                             "(stc.crop, stc.resample).")
        if stc.subject != first.subject:
            raise ValueError(f"stcs[{k}] belongs to subject {stc.subject!r} but stcs[0] "
                             f"to {first.subject!r}; analyse one subject at a time (or "
                             "morph them to a common subject first).")
    return stcs, vertices, times, kind, first.subject, float(first.tstep)


def stcs_array(stcs, keep, sfreq=None, window=None):
    """The estimates' data ``(n_stimuli, n_kept_times, n_sources)``, one copy.

    Parameters
    ----------
    stcs : list of SourceEstimate | list of VolSourceEstimate
        Checked estimates (:func:`check_stcs`).
    keep : ndarray of bool (n_times,)
        Time samples kept.
    sfreq : float | None
        Sampling rate (Hz), for ``window``.
    window : float | None
        Moving average over ``window`` seconds, on the full-rate data, before ``keep``
        (:func:`mlem_neuro.times.window_average`).

    Returns
    -------
    data : ndarray (n_stimuli, n_kept_times, n_sources)
        Time-major per stimulus, as :class:`~mlem_neuro.core.rdms.spacetime.SpaceTimeRDMSource`
        takes it.
    """
    from ..times import window_average

    first = stcs[0].data
    for k, stc in enumerate(stcs):
        check_real(stc.data, f"stcs[{k}].data")
    data = np.empty((len(stcs), int(np.sum(keep)), first.shape[0]))
    for k, stc in enumerate(stcs):
        x = stc.data if window is None else window_average(stc.data, sfreq, window)
        data[k] = x[:, keep].T
    if not np.isfinite(data).all():
        raise ValueError(f"the source estimates hold {int((~np.isfinite(data)).sum())} NaN "
                         "or infinite values.")
    return normalise_magnitude(data, "the source estimates")


def _step(times):
    return float(np.min(np.diff(times))) if len(times) > 1 else 1.0


def _other_subject(what, theirs, subject):
    """A ValueError when ``theirs`` and the estimates' ``subject`` are both known and
    differ (vertex numbers index one subject's surface); ``None`` otherwise."""
    if theirs is None or subject is None or theirs == subject:
        return None
    return ValueError(f"{what} belongs to subject {theirs!r} but the estimates to "
                      f"{subject!r}: vertex numbers of one subject's source space pick "
                      "other places in another's. Use the labels / source space of the "
                      "estimates' subject (or morph the estimates, mne.compute_source_morph).")


def _check_src(src, kind, vertices, subject=None):
    from mne import SourceSpaces

    if not isinstance(src, SourceSpaces):
        raise TypeError("src must be the mne.SourceSpaces the estimates were computed on "
                        "(e.g. inverse_operator['src'] or mne.read_source_spaces(...)); got "
                        f"{type(src).__name__}.")
    want = "surface" if kind == "surface" else ("volume", "discrete")
    if src.kind not in ((want,) if isinstance(want, str) else want) \
            or len(src) != len(vertices):
        raise ValueError(f"src is a {src.kind} source space with {len(src)} part(s) but the "
                         f"estimates are {kind} estimates with {len(vertices)} part(s); pass "
                         "the source space they were computed on.")
    err = _other_subject("src", src[0].get("subject_his_id"), subject)
    if err is not None:
        raise err
    for h, (s, v) in enumerate(zip(src, vertices)):
        missing = np.setdiff1d(v, s["vertno"])
        if missing.size:
            raise ValueError(f"{missing.size} vertices of the estimates (part {h}, e.g. "
                             f"vertex {int(missing[0])}) are not sources of src; pass the "
                             "source space the estimates were computed on.")


def _surface_distances(src, radius, n_jobs):
    """Surface source spaces holding geodesic distances up to at least ``radius``."""
    limits = [s.get("dist_limit") for s in src]
    have = all(s.get("dist") is not None and lim is not None
               and float(np.max(lim)) >= radius for s, lim in zip(src, limits))
    if have:
        return src
    import mne

    logger.info("computing geodesic distances along the cortical surface up to %.1f mm "
                "(mne.add_source_space_distances; pass a src that holds them to skip this)",
                1000 * radius)
    src = src.copy()
    mne.add_source_space_distances(src, dist_limit=radius, n_jobs=n_jobs, verbose=False)
    return src


def src_neighbourhoods(src, vertices, kind, radius, n_jobs=None, subject=None):
    """Searchlight patches around every source of the estimates, from MNE's distances.

    Parameters
    ----------
    src : mne.SourceSpaces
        The source space the estimates were computed on.
    vertices : list of ndarray
        The estimates' vertices (:func:`check_stcs`).
    kind : {"surface", "volume"}
        Kind of the estimates.
    radius : float
        Patch radius in metres.
    n_jobs : int | None
        Jobs for :func:`mne.add_source_space_distances` (surface, when computed).
    subject : str | None
        The estimates' subject: a source space of another subject is refused (not
        checked when either is ``None``).

    Returns
    -------
    A : scipy.sparse.csr_matrix (n_sources, n_sources)
        Row ``c``: the sources within ``radius`` of source ``c`` (itself included); on a
        surface, geodesic distance within the hemisphere (``src[h]["dist"]``); in a volume,
        straight-line distance between the grid points (``src[0]["rr"]``).
    """
    _check_src(src, kind, vertices, subject)
    blocks = []
    if kind == "surface":
        src = _surface_distances(src, radius, n_jobs)
        for s, v in zip(src, vertices):
            D = sp.csr_matrix(s["dist"])[v][:, v]
            D.data = (D.data <= radius).astype(np.float64)
            D.eliminate_zeros()
            blocks.append(((D + sp.identity(len(v), format="csr")) > 0).astype(np.float64))
    else:
        from scipy.spatial import cKDTree

        for s, v in zip(src, vertices):
            tree = cKDTree(s["rr"][v])
            D = tree.sparse_distance_matrix(tree, radius, output_type="coo_matrix")
            D = sp.csr_matrix((np.ones(D.nnz), (D.row, D.col)), shape=D.shape)
            blocks.append(((D + sp.identity(len(v), format="csr")) > 0).astype(np.float64))
    return sp.csr_matrix(sp.block_diag(blocks, format="csr"))


def label_neighbourhoods(labels, vertices, kind, subject=None):
    """One neighbourhood per label: the label's vertices among the estimates' vertices.

    Parameters
    ----------
    labels : list of mne.Label | mne.BiHemiLabel
        Non-overlapping labels (e.g. a parcellation from :func:`mne.read_labels_from_annot`).
    vertices : list of ndarray
        The surface estimates' vertices (left, right hemisphere).
    kind : str
        Kind of the estimates (labels need ``"surface"``).
    subject : str | None
        The estimates' subject: labels of another subject are refused (not checked when
        either is ``None``).

    Returns
    -------
    A : scipy.sparse.csr_matrix (n_labels, n_sources)
    names : list of str
    """
    from mne import BiHemiLabel, Label

    if kind != "surface":
        raise ValueError("labels are surface labels (mne.Label): they need surface source "
                         "estimates (mne.SourceEstimate), not volume ones.")
    if isinstance(labels, (Label, BiHemiLabel)):
        labels = [labels]
    labels = list(labels)
    if not labels:
        raise ValueError("labels is empty; give at least one mne.Label.")
    offsets = np.cumsum([0] + [len(v) for v in vertices])
    rows, cols, names = [], [], []
    for k, label in enumerate(labels):
        if not isinstance(label, (Label, BiHemiLabel)):
            raise TypeError(f"labels[{k}] must be an mne.Label; got {type(label).__name__}.")
        parts = [label.lh, label.rh] if isinstance(label, BiHemiLabel) else [label]
        idx = []
        for part in parts:
            err = _other_subject(f"label {label.name or f'label {k}'!r}", part.subject,
                                 subject)
            if err is not None:
                raise err
            h = {"lh": 0, "rh": 1}[part.hemi]
            hit = np.flatnonzero(np.isin(vertices[h], part.vertices))
            idx.append(offsets[h] + hit)
        idx = np.concatenate(idx)
        name = label.name or f"label {k}"
        if idx.size == 0:
            raise ValueError(f"label {name!r} holds none of the estimates' vertices; is it "
                             "a label of this subject, and do the estimates cover it?")
        rows.append(np.full(idx.size, k))
        cols.append(idx)
        names.append(name)
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    A = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(len(labels), offsets[-1]))
    shared = np.flatnonzero(np.asarray(A.sum(axis=0)).ravel() > 1)
    if shared.size:
        raise ValueError(f"labels overlap at {shared.size} vertices: give non-overlapping "
                         "labels (a parcellation), or analyse overlapping ones in separate "
                         "calls.")
    if len(set(names)) != len(names):
        raise ValueError(f"labels must have distinct names; got {names}.")
    return A, names
