"""Searchlights over time and space: importance per (location, time point).

A sensor searchlight (:func:`mlem_neuro.mlem_epochs` with ``spatial_radius``) gives a
:class:`SensorMapResult` (importance topographies over time, as :class:`mne.Evoked`); a
source-space searchlight or label analysis (:func:`mlem_neuro.mlem_stcs`) gives a
:class:`SourceMapResult` (importance as :class:`mne.SourceEstimate`).  Both hold one model
per (time point, location), in time-major order: model ``t * n_locations + s``.
"""
from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np

from .._docs import fill_doc
from ._base import BaseResult

__all__ = ["SensorMapResult", "SourceMapResult"]


class _SpaceTimeResult(BaseResult):
    """Results of ``n_times × n_locations`` models (time-major)."""

    _extra_arrays = ("times",)

    def __init__(self, fold_importance, fold_score, fold_weights, n_iter, terms,
                 feature_names, settings=None, *, times, n_locations, tests=None,
                 pvalues=None, pvalues_fwe=None, main_effect=None, gate_open=None, training=None,
                 compiled=None):
        super().__init__(fold_importance, fold_score, fold_weights, n_iter, terms,
                         feature_names, settings, tests=tests, pvalues=pvalues,
                         pvalues_fwe=pvalues_fwe, main_effect=main_effect, gate_open=gate_open,
                         training=training, compiled=compiled)
        self.times = np.asarray(times, dtype=float).ravel()
        self._n_locations = int(n_locations)
        M = self.fold_score.shape[1]
        if len(self.times) * self._n_locations != M:
            raise ValueError(f"{M} models is not n_times x n_locations = {len(self.times)} "
                             f"x {self._n_locations}")

    @property
    def n_times(self):
        """Number of time points."""
        return len(self.times)

    @property
    def n_locations(self):
        """Number of locations per time point (channels, source points or labels)."""
        return self._n_locations

    def _grid(self, values):
        """Per-model values ``(M,)`` as ``(n_locations, n_times)``."""
        return np.asarray(values).reshape(self.n_times, self.n_locations).T

    def _one_term(self, term):
        if not isinstance(term, str):
            raise TypeError(f"term must be one term name (a str); got {term!r}; terms are "
                            f"{self.terms}")
        return self._term_index(term)[0]

    def importance_data(self, term):
        """Fold-mean importance of ``term`` as ``(n_locations, n_times)``.

        Parameters
        ----------
        term : str
            A name of :attr:`terms`.

        Returns
        -------
        ndarray (n_locations, n_times)
        """
        return self._grid(self.importance[:, self._one_term(term)])

    def score_data(self):
        """Fold-mean held-out Spearman ρ as ``(n_locations, n_times)``.

        Returns
        -------
        ndarray (n_locations, n_times)
        """
        return self._grid(self.score)

    def peak(self, term=None):
        """Location index and time of the largest importance of ``term`` (``None``: of
        the score).

        Returns
        -------
        location : int
            Row of :meth:`importance_data` (a channel, source point or label).
        time : float
            Seconds.
        """
        data = self.score_data() if term is None else self.importance_data(term)
        s, t = np.unravel_index(int(np.argmax(data)), data.shape)
        return int(s), float(self.times[t])

    def _location_columns(self):     # pragma: no cover - every subclass overrides it
        return {"location": np.arange(self.n_locations)}

    def to_data_frame(self, terms=None):
        """Tidy long table: one row per (time, location, term).

        Parameters
        ----------
        terms : str | list of str | None
            Keep these terms only (default all).

        Returns
        -------
        DataFrame
            ``time``, the location's columns, ``term``, ``importance``,
            ``importance_fold_std`` and ``score`` (with tests: the p-values; with
            :attr:`gate_open`, the staged feature test, a ``gate_open`` column: whether
            its gate was open in the row's model).
        """
        coords = {"time": np.repeat(self.times, self.n_locations)}
        for name, values in self._location_columns().items():
            coords[name] = np.tile(np.asarray(values), self.n_times)
        df = self._long_frame(coords)
        if terms is not None:
            keep = [self.terms[k] for k in self._term_index(terms)]
            df = df[df["term"].isin(keep)].reset_index(drop=True)
        return df

    @property
    def _tstep(self):
        if self.n_times < 2:
            return float(self.settings.get("tstep") or 1.0)
        dt = np.diff(self.times)
        if not np.allclose(dt, dt.mean(), rtol=1e-3, atol=0):
            raise ValueError("the time points are not evenly spaced; MNE objects need "
                             "evenly spaced times.")
        return float(dt.mean())


@fill_doc
class SourceMapResult(_SpaceTimeResult):
    """Cross-validated MLEM importance over source space and time.

    Made by :func:`mlem_neuro.mlem_stcs`: one model per (time point, searchlight patch)
    or per (time point, label).  :meth:`importance_stc` returns a term's importance as an
    :class:`mne.SourceEstimate` (or :class:`mne.VolSourceEstimate`), which MNE plots
    (``stc.plot(subjects_dir=...)``), morphs and saves.

    Parameters
    ----------
    %(fold_importance)s
    %(fold_score)s
    %(fold_weights)s
    %(n_iter)s
    %(terms)s
    %(feature_names)s
    %(settings)s
    times : ndarray (n_times,)
        Time of each time point (seconds).
    vertices : list of ndarray
        Vertices of the result's estimates (per hemisphere, or of the volume).
    n_locations : int
        Models per time point (patches or labels).
    vertex_model : ndarray of int (n_vertices,) | None
        Which model (location) each vertex shows; default one per vertex (a searchlight:
        each patch's value at its centre).
    kind : {"surface", "volume"}
        Kind of source estimate.
    subject : str | None
        Subject of the estimates.
    label_names : list of str | None
        Name of each label (one model per label and time point).
    %(tests)s
    %(pvalues)s
    %(pvalues_fwe)s
    %(main_effect)s
    %(gate_open)s
    %(training)s
    %(compiled)s

    Attributes
    ----------
    %(pvalues_fwe_tests)s

    Examples
    --------
    >>> res = mlem_neuro.mlem_stcs(stcs, table, src, spatial_radius=0.01)  # doctest: +SKIP
    >>> stc = res.importance_stc("animacy")                           # doctest: +SKIP
    >>> stc.plot(subjects_dir=subjects_dir, initial_time=0.2)         # doctest: +SKIP
    """

    _extra_arrays = ("times", "vertex_model")

    def __init__(self, fold_importance, fold_score, fold_weights, n_iter, terms,
                 feature_names, settings=None, *, times, vertices, n_locations=None,
                 vertex_model=None, kind="surface", subject=None, label_names=None,
                 tests=None, pvalues=None, pvalues_fwe=None, main_effect=None, gate_open=None,
                 training=None, compiled=None):
        self.vertices = [np.asarray(v, dtype=np.int64).ravel() for v in vertices]
        n_vertices = sum(len(v) for v in self.vertices)
        if n_locations is None:
            n_locations = n_vertices if label_names is None else len(label_names)
        super().__init__(fold_importance, fold_score, fold_weights, n_iter, terms,
                         feature_names, settings, times=times, n_locations=n_locations,
                         tests=tests, pvalues=pvalues, pvalues_fwe=pvalues_fwe,
                         main_effect=main_effect, gate_open=gate_open,
                         training=training, compiled=compiled)
        if kind not in ("surface", "volume"):
            raise ValueError(f"kind must be 'surface' or 'volume'; got {kind!r}")
        self.kind = kind
        self.subject = subject
        self.label_names = None if label_names is None else [str(n) for n in label_names]
        if vertex_model is None:
            vertex_model = np.arange(n_vertices)
        self.vertex_model = np.asarray(vertex_model, dtype=np.int64).ravel()
        if len(self.vertex_model) != n_vertices:
            raise ValueError(f"vertex_model has {len(self.vertex_model)} entries for "
                             f"{n_vertices} vertices")
        if n_vertices and (self.vertex_model.min() < 0
                           or self.vertex_model.max() >= self.n_locations):
            raise ValueError(f"vertex_model refers to locations outside 0.."
                             f"{self.n_locations - 1}")
        if self.label_names is not None and len(self.label_names) != self.n_locations:
            raise ValueError(f"{len(self.label_names)} label names for {self.n_locations} "
                             "locations")

    def _extra_meta(self):
        return dict(kind=self.kind, subject=self.subject, label_names=self.label_names,
                    n_locations=self.n_locations)

    def _state(self):
        arrays, meta = super()._state()
        arrays["vertices_flat"] = np.concatenate(self.vertices) if self.vertices \
            else np.zeros(0, dtype=np.int64)
        arrays["vertex_parts"] = np.array([len(v) for v in self.vertices], dtype=np.int64)
        return arrays, meta

    @classmethod
    def _from_state(cls, arrays, meta):
        cuts = np.cumsum(arrays["vertex_parts"])[:-1]
        meta = dict(meta, extra=dict(meta["extra"],
                                     vertices=np.split(arrays["vertices_flat"], cuts)))
        return super()._from_state(arrays, meta)

    def _location_columns(self):
        if self.label_names is not None:
            return {"label": self.label_names}
        vertex = np.concatenate(self.vertices)
        if self.kind == "surface":
            hemi = np.repeat(["lh", "rh"][:len(self.vertices)],
                             [len(v) for v in self.vertices])
            return {"hemi": hemi, "vertex": vertex}
        return {"vertex": vertex}

    def _stc(self, data):
        import mne

        cls = mne.SourceEstimate if self.kind == "surface" else mne.VolSourceEstimate
        return cls(np.ascontiguousarray(data[self.vertex_model]), vertices=self.vertices,
                   tmin=float(self.times[0]), tstep=self._tstep, subject=self.subject,
                   verbose=False)

    def importance_stc(self, term):
        """Fold-mean importance of ``term`` as a source estimate.

        Parameters
        ----------
        term : str
            A name of :attr:`terms`.

        Returns
        -------
        stc : mne.SourceEstimate | mne.VolSourceEstimate
            Values in Δ Spearman ρ; a label's value is painted over its vertices.
        """
        return self._stc(self.importance_data(term))

    def score_stc(self):
        """Fold-mean held-out Spearman ρ as a source estimate.

        Returns
        -------
        stc : mne.SourceEstimate | mne.VolSourceEstimate
        """
        return self._stc(self.score_data())

    def significance_stc(self, test, alpha=0.05, corrected=True):
        """Where ``test`` is significant, as a source estimate (1 where it is, else 0).

        Parameters
        ----------
        test : str
            A name of :attr:`tests` (``"score"`` or a feature).
        alpha : float
            Level of the test.
        corrected : bool | "models" | "all"
            ``True`` or ``"models"`` (default): family-wise corrected over the models of
            this test, every time point and patch (:attr:`pvalues_fwe`, maximum
            statistic); ``"all"``: over those and all the tests
            (:attr:`pvalues_fwe_tests`); ``False``: uncorrected (:attr:`pvalues`).

        Returns
        -------
        stc : mne.SourceEstimate | mne.VolSourceEstimate
        """
        return self._stc(self._grid(self.significant(test, alpha, corrected)).astype(float))

    def to_stcs(self, include_score=True):
        """Every term's importance (and the score) as source estimates.

        Parameters
        ----------
        include_score : bool
            Add the held-out Spearman ρ under the key ``"score"``.

        Returns
        -------
        dict
            Term name → source estimate.
        """
        out = {term: self.importance_stc(term) for term in self.terms}
        if include_score:
            if "score" in out:
                raise ValueError("a term is named 'score'; use include_score=False.")
            out["score"] = self.score_stc()
        return out


@fill_doc
class SensorMapResult(_SpaceTimeResult):
    """Cross-validated MLEM importance topographies over time (sensor searchlight).

    Made by :func:`mlem_neuro.mlem_epochs` with ``spatial_radius``: one model per (time
    point, channel neighbourhood), its value shown at the neighbourhood's centre channel.
    :meth:`to_evoked` returns a term's importance as an :class:`mne.EvokedArray` over the
    analysed channels (so every MNE sensor plot applies) and :meth:`plot_topomap` draws it
    at chosen times.

    Parameters
    ----------
    %(fold_importance)s
    %(fold_score)s
    %(fold_weights)s
    %(n_iter)s
    %(terms)s
    %(feature_names)s
    %(settings)s
    times : ndarray (n_times,)
        Time of each time point (seconds).
    info : mne.Info
        Measurement info of the analysed channels (one per location), its ``sfreq`` that
        of the time points.
    %(tests)s
    %(pvalues)s
    %(pvalues_fwe)s
    %(main_effect)s
    %(gate_open)s
    %(training)s
    %(compiled)s

    Attributes
    ----------
    %(pvalues_fwe_tests)s

    Examples
    --------
    >>> res = mlem_neuro.mlem_epochs(epochs, ["side"], picks="eeg",
    ...                              spatial_radius=0.04)              # doctest: +SKIP
    >>> res.plot_topomap("side", times=[0.1, 0.2])                    # doctest: +SKIP
    """

    def __init__(self, fold_importance, fold_score, fold_weights, n_iter, terms,
                 feature_names, settings=None, *, times, info, tests=None, pvalues=None,
                 pvalues_fwe=None, main_effect=None, gate_open=None, training=None,
                 compiled=None):
        import mne

        if not isinstance(info, mne.Info):
            raise TypeError(f"info must be an mne.Info; got {type(info).__name__}")
        self.info = info
        super().__init__(fold_importance, fold_score, fold_weights, n_iter, terms,
                         feature_names, settings, times=times, n_locations=info["nchan"],
                         tests=tests, pvalues=pvalues, pvalues_fwe=pvalues_fwe,
                         main_effect=main_effect, gate_open=gate_open,
                         training=training, compiled=compiled)

    @property
    def ch_names(self):
        """Channel of each location."""
        return list(self.info["ch_names"])

    def _location_columns(self):
        return {"channel": self.ch_names}

    def _state(self):
        import mne

        arrays, meta = super()._state()
        with tempfile.TemporaryDirectory() as tmp:
            fname = os.path.join(tmp, "result-info.fif")
            mne.io.write_info(fname, self.info)
            with open(fname, "rb") as f:
                arrays["info_fif"] = np.frombuffer(f.read(), dtype=np.uint8)
        return arrays, meta

    @classmethod
    def _from_state(cls, arrays, meta):
        import mne

        with tempfile.TemporaryDirectory() as tmp:
            fname = os.path.join(tmp, "result-info.fif")
            with open(fname, "wb") as f:
                f.write(np.asarray(arrays["info_fif"], dtype=np.uint8).tobytes())
            info = mne.io.read_info(fname, verbose=False)
        meta = dict(meta, extra=dict(meta["extra"], info=info))
        return super()._from_state(arrays, meta)

    def to_evoked(self, term=None):
        """A term's importance (``None``: the held-out score) as an evoked response.

        Parameters
        ----------
        term : str | None
            A name of :attr:`terms`; ``None`` gives the fold-mean held-out Spearman ρ.

        Returns
        -------
        mne.EvokedArray
            One channel per analysed channel, values in Spearman ρ units (``nave`` is
            the number of folds).
        """
        import mne

        data = self.score_data() if term is None else self.importance_data(term)
        if abs(self.info["sfreq"] * self._tstep - 1) > 1e-3:
            raise ValueError(f"info['sfreq'] = {self.info['sfreq']:g} Hz does not match "
                             f"the spacing of the time points ({self._tstep:g} s)")
        return mne.EvokedArray(data, self.info, tmin=float(self.times[0]),
                               nave=self.n_folds, verbose=False,
                               comment="score" if term is None else term)

    def plot_topomap(self, term=None, times="peaks", *, ch_type=None, alpha=0.05,
                     corrected=True, show=True, **kwargs):
        """Topographies of a term's importance at chosen times (MNE's topomaps).

        With tests (``n_null > 0``), the channels whose neighbourhood's p-value (by
        default corrected over every time point and channel of the test) is below
        ``alpha`` at a time are marked (MNE's ``mask``).

        Parameters
        ----------
        term : str | None
            A name of :attr:`terms`; ``None`` draws the held-out score.
        times : float | list of float | "peaks" | "auto"
            Times in seconds, as :meth:`mne.Evoked.plot_topomap` takes them.
        ch_type : str | None
            Sensor type to draw (MNE's default: the first of the data).  Gradiometer
            pairs are combined as MNE does (root mean square).
        alpha : float
            Level of the tests that are marked.
        corrected : bool | "models" | "all"
            Which p-values (as in :meth:`significant`): ``True`` or ``"models"``
            (default) corrected over the time points and channels of the drawn test,
            ``"all"`` over them and all the tests, ``False`` uncorrected.
        show : bool
            Show the figure.
        **kwargs
            Passed to :meth:`mne.Evoked.plot_topomap` (``vlim``, ``cmap``, ``axes``,
            ``mask``...).

        Returns
        -------
        matplotlib.figure.Figure
        """
        evoked = self.to_evoked(term)
        test = "score" if term is None else term
        if self.tests is not None and test in self.tests and "mask" not in kwargs:
            kwargs["mask"] = self._grid(self.significant(test, alpha, corrected))
        kwargs.setdefault("cbar_fmt", "%0.3f")
        kwargs.setdefault("time_unit", "s")
        return evoked.plot_topomap(times=times, ch_type=ch_type, scalings=1.0, units="Δρ",
                                   show=show, **kwargs)


def _decimated_info(info, sfreq):
    """``info`` with its sampling rate set to ``sfreq`` (after decimation), through MNE's
    own :meth:`mne.Evoked.decimate` on a placeholder."""
    import mne

    ratio = info["sfreq"] / sfreq
    if abs(ratio - 1) < 1e-6:
        return info
    decim = int(round(ratio))
    if abs(ratio - decim) > 1e-6:
        raise ValueError(f"sfreq {sfreq:g} Hz is not info['sfreq'] / an integer")
    probe = mne.EvokedArray(np.zeros((info["nchan"], decim)), info, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return probe.decimate(decim, verbose=False).info

