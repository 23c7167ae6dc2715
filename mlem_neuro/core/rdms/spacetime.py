"""Searchlights over time and space: one model per (time point, neighbourhood).

Source estimates and sensor data are ``(n_stimuli, n_times, n_locations)``; a searchlight
over them has one model per time point and neighbourhood (a patch of source points, a
group of nearby channels, a label).  :class:`SpaceTimeRDMSource` is a
:class:`~mlem_neuro.core.rdms.sources.SphereRDMSource` whose units are (time, location) cells
and whose membership is block diagonal over time: model ``t * S + s`` holds the locations
of neighbourhood ``s`` at time ``t`` (time-major order).  That membership is never built
whole: :meth:`SpaceTimeRDMSource.subset` cuts, for one chunk of models, the (time,
location) cells the chunk touches and the chunk's rows of the membership, and returns a
plain :class:`~mlem_neuro.core.rdms.sources.SphereRDMSource`.  A chunk of ``k`` models then
holds at most ``k`` neighbourhoods' cells of data, whatever the number of time points, and
:func:`~mlem_neuro.crossval.run_cv` (chunks of at most 1,000 models) keeps the stack's
memory bounded.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from ..utils import renamed
from .sources import SphereRDMSource

__all__ = ["SpaceTimeRDMSource"]


class SpaceTimeRDMSource(SphereRDMSource):
    """Neural RDMs of every (time point, neighbourhood) model of a spatial searchlight.

    Parameters
    ----------
    data : ndarray (n_stimuli, n_times, n_locations)
        Stimulus × time × location data (source points or channels).
    neighbourhoods : scipy.sparse matrix (n_neighbourhoods, n_locations)
        0/1 membership: row ``s`` marks the locations of neighbourhood ``s``.
    distance : {"euclidean", "correlation", "cosine"}
        Neural distance between the patterns of a neighbourhood at one time point.
    metric : str | None
        Former name of ``distance`` (deprecated; a FutureWarning; both names: a TypeError).

    Notes
    -----
    Model ``t * n_neighbourhoods + s`` is neighbourhood ``s`` at time point ``t``.  The
    attributes :attr:`X` (a view of ``data``) and :attr:`A` (the block-diagonal
    membership, built on access: ``n_times`` times the entries of ``neighbourhoods``) make
    this a :class:`~mlem_neuro.core.rdms.sources.SphereRDMSource` over (time, location) cells,
    so every tool written for one (e.g. the non-additivity test) works on it; the
    analyses only ever use :meth:`subset` and :meth:`rdm`.
    """

    @renamed(metric="distance")
    def __init__(self, data, neighbourhoods, distance="euclidean", *, metric=None):
        from .distances import get_distance

        get_distance(distance, where=" for searchlight and ROI analyses")
        data = np.asarray(data, dtype=np.float64)
        if data.ndim != 3:
            raise ValueError("data must be 3-D (n_stimuli, n_times, n_locations); got shape "
                             f"{data.shape}")
        A = sp.csr_matrix(neighbourhoods, dtype=np.float64)
        A.sort_indices()
        if A.shape[1] != data.shape[2]:
            raise ValueError(f"neighbourhoods have {A.shape[1]} location columns but the "
                             f"data have {data.shape[2]} locations")
        self.data = np.ascontiguousarray(data)
        self.neighbourhoods = A
        self.distance = distance

    @property
    def n_times(self):
        """Number of time points."""
        return self.data.shape[1]

    @property
    def n_neighbourhoods(self):
        """Number of neighbourhoods (models per time point)."""
        return self.neighbourhoods.shape[0]

    @property
    def n_models(self):
        """Number of models, ``n_times × n_neighbourhoods``."""
        return self.n_times * self.n_neighbourhoods

    @property
    def n_stimuli(self):
        """Number of stimuli."""
        return self.data.shape[0]

    @property
    def X(self):
        """Data over (time, location) cells ``(n_stimuli, n_times * n_locations)`` (a
        view)."""
        return self.data.reshape(self.n_stimuli, -1)

    @property
    def A(self):
        """Block-diagonal membership ``(n_models, n_times * n_locations)`` (built on each
        access)."""
        return sp.kron(sp.identity(self.n_times, format="csr"), self.neighbourhoods,
                       format="csr")

    @property
    def sizes(self):
        """Locations per model ``(n_models,)``."""
        return np.tile(np.diff(self.neighbourhoods.indptr), self.n_times)

    def subset(self, models):
        """The source of ``models`` only, holding just the (time, location) cells they touch.

        Parameters
        ----------
        models : slice | array of int
            Model indices (``t * n_neighbourhoods + s``).

        Returns
        -------
        SphereRDMSource
        """
        models = np.arange(self.n_models)[models] if isinstance(models, slice) \
            else np.asarray(models, dtype=int).ravel()
        S, L = self.n_neighbourhoods, self.data.shape[2]
        t, s = np.divmod(models, S)
        rows = self.neighbourhoods[s]                       # (k, L), one row per model
        counts = np.diff(rows.indptr)
        cells = np.repeat(t, counts) * L + rows.indices     # flat (time, location) cells
        touched, local = np.unique(cells, return_inverse=True)
        A = sp.csr_matrix((rows.data, local.ravel(), rows.indptr),
                          shape=(len(models), len(touched)))
        return SphereRDMSource(self.X[:, touched], A, self.distance)

    def rdm(self, stimuli, device="cpu"):
        """Distances between ``stimuli`` for every model at once.

        The analyses ask for chunks of models through :meth:`subset` instead.

        Parameters
        ----------
        stimuli : array of int
            Stimulus indices.
        device : str
            Torch device of the result.

        Returns
        -------
        rdm : torch.Tensor, float64, ``(n_models, n_pairs)``
        """
        return self.subset(slice(None)).rdm(stimuli, device)

    def check_patterns(self):
        """Raise when the metric is undefined for some model (one time point at a time)."""
        S = self.n_neighbourhoods
        for t in range(self.n_times):
            self.subset(slice(t * S, (t + 1) * S)).check_patterns()
