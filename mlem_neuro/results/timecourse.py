"""Time courses of MLEM results: one model per time point (MEG, EEG, ECoG...)."""
from __future__ import annotations

import warnings

import numpy as np

from .._docs import fill_doc
from ..core.checks import choice
from ._base import BaseResult


@fill_doc
class TimeCourseResult(BaseResult):
    """Cross-validated MLEM results over time points.

    Made by :func:`mlem_neuro.mlem_epochs` and :func:`mlem_neuro.mlem_array`; read back
    with :func:`mlem_neuro.read_result`.

    Parameters
    ----------
    fold_importance : ndarray (n_folds, n_times, n_terms)
        Permutation importance of each term (mean drop of held-out Spearman ρ).
    fold_score : ndarray (n_folds, n_times)
        Held-out Spearman ρ.
    fold_weights : ndarray (n_folds, n_times, m, m)
        Learnt metric ``W`` of each fold and time point.
    n_iter : ndarray (n_folds, n_times)
        Training steps.
    %(terms)s
    %(feature_names)s
    %(settings)s
    times : ndarray (n_times,) | None
        Time of each model in seconds (default: sample indices ``0, 1, ...``).
    ch_names : list of str | None
        Channels the distances were computed on.
    fold_importance_perm_std : ndarray (n_folds, n_times, n_terms) | None
        Standard deviation of the importance across permutations (NaN when unknown).
    converged : ndarray of bool (n_folds, n_times) | None
        Whether training early-stopped (``patience``) rather than hitting ``max_steps``.
    %(tests)s
    %(pvalues)s
    %(pvalues_fwe)s
    %(main_effect)s
    %(gate_open)s
    %(training)s
    %(compiled)s

    Attributes
    ----------
    times : ndarray (n_times,)
    importance : ndarray (n_times, n_terms)
        Fold-mean importance; :attr:`importance_fold_std` is its spread across folds.
    score : ndarray (n_times,)
        Fold-mean held-out Spearman ρ; :attr:`score_std` is its spread.
    weights : ndarray (n_times, m, m)
        Fold-mean ``W``.
    %(pvalues_fwe_tests)s

    Examples
    --------
    >>> res = mlem_neuro.mlem_epochs(epochs, cv=5)              # doctest: +SKIP
    >>> res.to_data_frame().query("term == 'side'").head()      # doctest: +SKIP
    >>> res.plot(terms=["modality", "side"])                    # doctest: +SKIP
    >>> res.save("sub-01_mlem.npz"); mlem_neuro.read_result("sub-01_mlem.npz")  # doctest: +SKIP
    """

    _extra_arrays = ("times", "fold_importance_perm_std", "converged")

    def __init__(self, fold_importance, fold_score, fold_weights, n_iter, terms,
                 feature_names, settings=None, times=None, ch_names=None,
                 fold_importance_perm_std=None, converged=None, tests=None, pvalues=None,
                 pvalues_fwe=None, *, main_effect=None, gate_open=None, training=None,
                 compiled=None):
        super().__init__(fold_importance, fold_score, fold_weights, n_iter, terms,
                         feature_names, settings, tests=tests, pvalues=pvalues,
                         pvalues_fwe=pvalues_fwe, main_effect=main_effect, gate_open=gate_open,
                         training=training, compiled=compiled)
        F, M, T = self.fold_importance.shape
        times = np.arange(M, dtype=float) if times is None else np.asarray(times, dtype=float)
        if times.shape != (M,):
            raise ValueError(f"times has shape {times.shape} but the results hold {M} time "
                             "points.")
        self.times = times
        self.ch_names = None if ch_names is None else [str(c) for c in ch_names]
        if fold_importance_perm_std is None:
            fold_importance_perm_std = np.full((F, M, T), np.nan)
        self.fold_importance_perm_std = np.asarray(fold_importance_perm_std, dtype=float)
        if self.fold_importance_perm_std.shape != (F, M, T):
            raise ValueError("fold_importance_perm_std must have the shape of "
                             f"fold_importance {(F, M, T)}; got "
                             f"{self.fold_importance_perm_std.shape}")
        if converged is None:
            converged = np.zeros((F, M), dtype=bool)
        self.converged = np.asarray(converged, dtype=bool)
        if self.converged.shape != (F, M):
            raise ValueError(f"converged must have shape {(F, M)}; got {self.converged.shape}")

    def _extra_meta(self):
        return {"ch_names": self.ch_names}

    # ------------------------------------------------------------------ views
    @property
    def n_times(self):
        """Number of time points (models)."""
        return len(self.times)

    @property
    def sfreq(self):
        """Sampling rate of the time points (Hz), or None when they are not evenly spaced."""
        if self.n_times < 2:
            return None
        dt = np.diff(self.times)
        if dt.min() <= 0 or not np.allclose(dt, dt.mean(), rtol=1e-3, atol=0):
            return None
        return float(1.0 / dt.mean())

    def to_data_frame(self, terms=None):
        """Tidy long table: one row per (time, term).

        Parameters
        ----------
        terms : str | list of str | None
            Keep these terms only (default all).

        Returns
        -------
        DataFrame
            Columns ``time``, ``term``, ``importance`` (fold mean), ``importance_fold_std``
            (fold spread), ``score`` and ``score_std`` (held-out Spearman ρ at that time);
            with tests (``n_null > 0``) also ``pvalue``, ``pvalue_fwe`` (corrected over
            time points) and ``pvalue_fwe_tests`` (over time points and tests) of the
            term's test (NaN for a term without one), then ``score_pvalue``,
            ``score_pvalue_fwe``, ``score_pvalue_fwe_tests``, and the same three
            ``interactions_*`` columns when the test of interactions ran; with
            :attr:`main_effect`, a ``main_effect`` column: the in-sample main effect of
            the row's term when it is a feature (NaN for an interaction term); with
            :attr:`gate_open` (the staged feature test), a ``gate_open`` column: whether
            the staged test's gate was open at that time (its features' tests there rest
            on the interactions found).
        """
        df = self._long_frame({"time": self.times})
        df["score_std"] = np.repeat(self.score_std, len(self.terms))
        if self.main_effect is not None:
            col = np.full((self.n_times, len(self.terms)), np.nan)
            for k, term in enumerate(self.terms):
                if term in self.feature_names:
                    col[:, k] = self.main_effect[:, self.feature_names.index(term)]
            df["main_effect"] = col.ravel()
        if terms is not None:
            keep = [self.terms[k] for k in self._term_index(terms)]
            df = df[df["term"].isin(keep)].reset_index(drop=True)
        return df

    def to_evoked(self, include_score=False):
        """Importance time courses as an :class:`mne.EvokedArray`.

        One ``misc`` channel per term (named after it), values in Spearman ρ units, so
        ``evoked.plot()`` shows them without scaling.  ``nave`` is the number of folds.

        Parameters
        ----------
        include_score : bool
            Add a ``"score"`` channel with the held-out Spearman ρ.

        Returns
        -------
        mne.EvokedArray
        """
        import mne

        sfreq = self.sfreq
        if sfreq is None:
            raise ValueError("to_evoked needs evenly spaced times (at least two); these "
                             f"times are not: {self.times[:5]}...")
        if self.settings.get("times_in_seconds") is False:
            warnings.warn("these times are sample numbers (the analysis had neither times "
                          "nor sfreq), so the Evoked reads them as seconds at 1 Hz; run "
                          "the analysis with times= or sfreq= for an Evoked in seconds.",
                          UserWarning, stacklevel=2)
        data = self.importance.T
        names = list(self.terms)
        if include_score:
            if "score" in names:
                raise ValueError("a term is already named 'score'; use include_score=False.")
            data = np.vstack([data, self.score[None]])
            names.append("score")
        info = mne.create_info(names, sfreq, ch_types="misc")
        evoked = mne.EvokedArray(data, info, tmin=float(self.times[0]), nave=self.n_folds,
                                 comment="MLEM importance", verbose=False)
        shift = float(evoked.times[0] - self.times[0])
        if abs(shift) > 1e-3 / sfreq:
            # MNE rounds tmin to a multiple of 1 / sfreq (e.g. bin centres at 5, 15 ms)
            warnings.warn(f"these times ({self.times[0]:g}, {self.times[1]:g} s...) lie "
                          "between MNE's sample instants (multiples of 1 / sfreq), so the "
                          f"Evoked shifts them by {shift:+.3g} s; use to_data_frame() for "
                          "the exact times.", UserWarning, stacklevel=2)
        return evoked

    def plot(self, terms=None, axes=None, show=True, score=True, alpha=0.05,
             corrected=True, measure="importance"):
        """Importance over time, fold mean ± fold spread (std), and the held-out score.

        ``measure="main_effect"`` draws each feature's main effect instead (its in-sample
        partial Spearman correlation, :attr:`main_effect`: the curve a partial RSA draws,
        which replicates between halves of the data as a RSA curve does); the marks are
        the same tests either way.

        With tests (``n_null > 0``), the time points whose p-value (by default corrected
        over the time points of each test) is below ``alpha`` are marked by a bar under
        the curves (one row per term, in its colour; black for the score).

        Parameters
        ----------
        terms : str | list of str | None
            Terms to draw (default all).
        axes : matplotlib Axes | list of two Axes | None
            Where to draw: one Axes (importance only) or two (importance, score).
        show : bool
            Call ``plt.show()``.
        score : bool
            Add a panel with the held-out Spearman ρ (when ``axes`` is None).
        alpha : float
            Level of the tests that are marked.
        corrected : bool | "models" | "all"
            Which p-values mark significance (as in :meth:`significant`): ``True`` or
            ``"models"`` (default) corrected over the time points of each test
            (:attr:`pvalues_fwe`); ``"all"`` over the time points and all the tests
            (:attr:`pvalues_fwe_tests`: no false mark anywhere in the figure with
            probability ``1 - alpha``); ``False`` uncorrected (:attr:`pvalues`).
        measure : {"importance", "main_effect"}
            The curves drawn: the held-out permutation importance of each term, or the
            main effect of each feature (interaction terms have none).

        Returns
        -------
        matplotlib.figure.Figure
        """
        import matplotlib.pyplot as plt

        measure = choice(("importance", "main_effect"))("measure", measure)
        idx = self._term_index(terms)
        if measure == "main_effect":
            if self.main_effect is None:
                raise ValueError("this result has no main_effect (saved before it was "
                                 "computed): run the analysis again.")
            if terms is None:
                idx = [k for k in idx if self.terms[k] in self.feature_names]
            bad = [self.terms[k] for k in idx if self.terms[k] not in self.feature_names]
            if bad:
                raise ValueError(f"main effects are per feature; {bad[0]!r} is an "
                                 f"interaction term. Features: {self.feature_names}")
        if self.tests is not None:
            self._corrected_pvalues(corrected)          # a bad value fails before drawing
        if axes is None:
            n_ax = 2 if score else 1
            fig, axs = plt.subplots(n_ax, 1, sharex=True, squeeze=False,
                                    figsize=(7, 3.2 * n_ax),
                                    gridspec_kw={"height_ratios": [2, 1][:n_ax]})
            axs = list(axs[:, 0])
        else:
            axs = list(np.atleast_1d(axes).ravel())
            if len(axs) not in (1, 2):
                raise ValueError(f"axes must be one or two matplotlib Axes; got {len(axs)}")
            fig = axs[0].figure
        t, mean, std = self.times, self.importance, self.importance_fold_std
        ax = axs[0]
        marks = []
        for k in idx:
            if measure == "main_effect":
                f = self.feature_names.index(self.terms[k])
                line, = ax.plot(t, self.main_effect[:, f], label=self.terms[k])
            else:
                line, = ax.plot(t, mean[:, k], label=self.terms[k])
                ax.fill_between(t, mean[:, k] - std[:, k], mean[:, k] + std[:, k],
                                color=line.get_color(), alpha=0.25, linewidth=0)
            if self.tests is not None and self.terms[k] in self.tests:
                marks.append((self.significant(self.terms[k], alpha, corrected),
                              line.get_color()))
        _mark_significant(ax, t, marks)
        ax.axhline(0, color="k", linewidth=0.8)
        if measure == "main_effect":
            ax.set_ylabel("main effect (partial Spearman ρ)")
            ax.set_title("Main effects (in sample, other features held fixed)")
        else:
            ax.set_ylabel("importance (Δ Spearman ρ)")
            spread = "std over folds" if self.n_folds > 1 else "single fit, cv=None"
            ax.set_title(f"MLEM permutation importance (mean ± {spread})")
        ax.legend(loc="best", fontsize="small", ncol=2 if len(idx) > 6 else 1)
        if len(axs) > 1:
            ax2 = axs[1]
            line, = ax2.plot(t, self.score, color="k")
            ax2.fill_between(t, self.score - self.score_std, self.score + self.score_std,
                             color="k", alpha=0.2, linewidth=0)
            ax2.axhline(0, color="k", linewidth=0.8, linestyle=":")
            if self.tests is not None and "score" in self.tests:
                _mark_significant(ax2, t, [(self.significant("score", alpha, corrected),
                                            "k")])
            ax2.set_ylabel(f"{self.score_kind} ρ{self._no_cv_note}")
        axs[-1].set_xlabel("time (s)" if self.settings.get("times_in_seconds", True)
                           else "sample")
        if show:
            plt.show()
        return fig


def _mark_significant(ax, t, marks):
    """Bars under the data of ``ax`` at the times where each mask of ``marks`` is True."""
    if not any(mask.any() for mask, _ in marks):
        return
    lo, hi = ax.get_ylim()
    step = 0.03 * (hi - lo)
    half = np.diff(t).min() / 2 if len(t) > 1 else 0.5
    for row, (mask, color) in enumerate(marks):
        y = lo - step * (row + 1)
        for k in np.flatnonzero(mask):
            ax.plot([t[k] - half, t[k] + half], [y, y], color=color, linewidth=3,
                    solid_capstyle="butt")
    ax.set_ylim(lo - step * (len(marks) + 1), hi)
