"""RSA results in MLEM's containers: the same tests, frames, files and plots.

:func:`mlem_neuro.rsa.rsa_array`, :func:`~mlem_neuro.rsa.rsa_epochs` and
:func:`~mlem_neuro.rsa.rsa_searchlight` return these.  Each is the MLEM container of its
layout (:class:`~mlem_neuro.results.TimeCourseResult`,
:class:`~mlem_neuro.results.BrainMapResult`) with one "fold" (RSA fits nothing and holds
nothing out) whose ``importance`` column of a feature is its RSA statistic: the Spearman
correlation (or, with ``partial=True``, the partial Spearman correlation) between the
neural RDM of the model (time point, sphere) and the feature's model RDM.  There is no
held-out score and no metric ``W``: ``score`` and ``weights`` are NaN.  The tests,
``pvalues``, ``pvalues_fwe``, ``pvalues_fwe_tests``, :meth:`significant`,
``to_data_frame``, ``save`` and :func:`~mlem_neuro.read_result` are those of MLEM's
results, so the two analyses of the same data line up column for column.
"""
from __future__ import annotations

from .._docs import fill_doc
from .brainmap import BrainMapResult
from .timecourse import TimeCourseResult


def _statistic(settings):
    return ("partial Spearman ρ" if settings.get("partial") else "Spearman ρ")


@fill_doc
class RSATimeCourseResult(TimeCourseResult):
    """RSA time courses: per time point, each feature's RDM correlation and its tests.

    Made by :func:`mlem_neuro.rsa.rsa_array` and :func:`mlem_neuro.rsa.rsa_epochs`; read
    back with :func:`mlem_neuro.read_result`.  A :class:`TimeCourseResult` whose
    ``importance`` is the RSA statistic (see :mod:`mlem_neuro.results.rsa`).

    Parameters
    ----------
    fold_importance : ndarray (1, n_times, n_features)
        The RSA statistic of each feature at each time point.
    fold_score : ndarray (1, n_times)
        NaN (RSA has no held-out score).
    fold_weights : ndarray (1, n_times, m, m)
        NaN (RSA learns no metric).
    n_iter : ndarray (1, n_times)
        Zeros (nothing is trained).
    %(terms)s
    %(feature_names)s
    %(settings)s
    times : ndarray (n_times,) | None
        Time of each model in seconds (default: sample indices ``0, 1, ...``).
    ch_names : list of str | None
        Channels the distances were computed on.
    fold_importance_perm_std : ndarray (1, n_times, n_features) | None
        Unused by RSA (NaN).
    converged : ndarray of bool (1, n_times) | None
        Unused by RSA.
    %(tests)s
    %(pvalues)s
    %(pvalues_fwe)s
    main_effect : None
        Unused by RSA (its statistic is already each feature's RDM correlation).
    gate_open : None
        Unused by RSA (no staged feature test).
    training : None
        Unused by RSA (nothing is trained).
    compiled : None
        Unused by RSA (recorded as whether numba is installed).

    Attributes
    ----------
    rho : ndarray (n_times, n_features)
        The RSA statistic (the same array as ``importance``).
    %(pvalues_fwe_tests)s

    Examples
    --------
    >>> res = mlem_neuro.rsa.rsa_epochs(epochs, n_null=999)      # doctest: +SKIP
    >>> res.significant("side").any()                           # doctest: +SKIP
    >>> res.plot()                                              # doctest: +SKIP
    """

    @property
    def rho(self):
        """The RSA statistic of each feature ``(n_times, n_features)`` (``importance``)."""
        return self.importance

    def plot(self, terms=None, axes=None, show=True, alpha=0.05, corrected=True):
        """The RSA statistic of each feature over time, significant times marked.

        Parameters
        ----------
        terms : str | list of str | None
            Features to draw (default all).
        axes : matplotlib Axes | None
            Where to draw (default: a new figure).
        show : bool
            Call ``plt.show()``.
        alpha : float
            Level of the tests that are marked.
        corrected : bool | "models" | "all"
            Which p-values mark significance, as in :meth:`significant`.

        Returns
        -------
        matplotlib.figure.Figure
        """
        import matplotlib.pyplot as plt

        fig = super().plot(terms=terms, axes=axes, show=False, score=False, alpha=alpha,
                           corrected=corrected)
        ax = fig.axes[0] if axes is None else list(_flat(axes))[0]
        ax.set_ylabel(f"{_statistic(self.settings)} (neural vs model RDM)")
        ax.set_title(f"RSA: {_statistic(self.settings)} of each feature's model RDM")
        if show:
            plt.show()
        return fig


@fill_doc
class RSABrainMapResult(BrainMapResult):
    """RSA searchlight maps: per sphere, each feature's RDM correlation and its tests.

    Made by :func:`mlem_neuro.rsa.rsa_searchlight`; read back with
    :func:`mlem_neuro.read_result`.  A :class:`BrainMapResult` whose ``importance`` is the
    RSA statistic (see :mod:`mlem_neuro.results.rsa`).

    Parameters
    ----------
    fold_importance : ndarray (1, n_models, n_features)
        The RSA statistic of each feature in each sphere.
    fold_score : ndarray (1, n_models)
        NaN (RSA has no held-out score).
    fold_weights : ndarray (1, n_models, m, m)
        NaN (RSA learns no metric).
    n_iter : ndarray (1, n_models)
        Zeros (nothing is trained).
    %(terms)s
    %(feature_names)s
    %(settings)s
    affine : ndarray (4, 4)
        Affine of the map grid.
    shape : tuple of int
        Shape of the map grid.
    voxel_indices : ndarray (n_voxels, 3)
        Grid indices of the voxels painted.
    voxel_model : ndarray (n_voxels,) | None
        The model (sphere) of each voxel (default: one voxel per model).
    kind : str
        ``"searchlight"``.
    region_labels : list | None
        Unused by the searchlight.
    background : ndarray | None
        Background image on the map grid.
    %(tests)s
    %(pvalues)s
    %(pvalues_fwe)s
    main_effect : None
        Unused by RSA (its statistic is already each feature's RDM correlation).
    gate_open : None
        Unused by RSA (no staged feature test).
    training : None
        Unused by RSA (nothing is trained).
    compiled : None
        Unused by RSA (recorded as whether numba is installed).

    Attributes
    ----------
    rho : ndarray (n_models, n_features)
        The RSA statistic (the same array as ``importance``).
    %(pvalues_fwe_tests)s

    Examples
    --------
    >>> res = mlem_neuro.rsa.rsa_searchlight(imgs, table, mask, radius=6.0)  # doctest: +SKIP
    >>> res.plot("category")                                     # doctest: +SKIP
    """

    @property
    def rho(self):
        """The RSA statistic of each feature ``(n_models, n_features)`` (``importance``)."""
        return self.importance

    def plot(self, term, alpha=0.05, corrected=True, **kwargs):
        """Plot the RSA map of feature ``term`` with nilearn, significant voxels outlined.

        Parameters
        ----------
        term : str
            A feature of :attr:`terms`.
        alpha : float
            Level of the tests that are outlined.
        corrected : bool | "models" | "all"
            Which p-values, as in :meth:`significance_img`.
        **kwargs
            Passed to :func:`nilearn.plotting.plot_stat_map`.

        Returns
        -------
        display : nilearn display object
        """
        if term is None:
            raise ValueError("an RSA result has no score map: pass a feature, one of "
                             f"{self.terms}.")
        self._one_term(term)
        kwargs.setdefault("title", f"RSA {_statistic(self.settings)}: {term}")
        return super().plot(term, alpha=alpha, corrected=corrected, **kwargs)


def _flat(axes):
    import numpy as np

    return np.atleast_1d(axes).ravel()
