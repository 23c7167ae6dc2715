"""Group statistics on importance time courses: cluster-based permutation tests over time.

One :class:`~mlem_neuro.results.timecourse.TimeCourseResult` per subject; the importance
time course of a term (or a feature's in-sample main effect, the held-out score, or the
held-out gain of a model with interactions over an additive one) is tested against zero
across subjects with
:func:`mne.stats.permutation_cluster_1samp_test` (sign flips, clusters of adjacent time
points, max cluster-mass statistic).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .._docs import fill_doc
from ..core.checks import check
from ..utils import logger, renamed, verbose
from ._additive import NO_ADDITIVE, check_pairs
from ._main_effect import check_main_effect_term


@dataclass
class ClusterTestResult:
    """Outcome of :func:`permutation_cluster_test`.

    The fields are also its attributes.

    Parameters
    ----------
    term : str
        The term (with ``measure="main_effect"``, the feature) tested (``"score"`` when
        ``measure="score"``, ``"interactions"`` when ``measure="interactions"``).
    times : ndarray (n_times,)
        Time of each point, in seconds.
    t_obs : ndarray (n_times,)
        One-sample t statistic at each time point.
    clusters : list of ndarray of bool (n_times,)
        Time masks of the clusters.
    cluster_p_values : ndarray (n_clusters,)
        Permutation p-value of each cluster.
    H0 : ndarray (n_null,)
        Max cluster statistic of each permutation.
    data : ndarray (n_subjects, n_times)
        The time courses tested.
    threshold : float
        Cluster-forming t threshold used.
    tail : {1, 0, -1}
        Tail of the test (``1``: above zero, ``0``: two-sided).
    n_null : int
        Sign-flip permutations asked for (``n_permutations``: its former name).
    measure : {"importance", "main_effect", "score", "interactions"}
        What was tested: a term's importance, a feature's in-sample main effect, the
        held-out score, or the held-out score's gain over the additive models.
    extra : dict
        Room for further outputs (empty by default).
    """

    term: str
    times: np.ndarray
    t_obs: np.ndarray
    clusters: list
    cluster_p_values: np.ndarray
    H0: np.ndarray
    data: np.ndarray
    threshold: float
    tail: int
    n_null: int
    measure: str = "importance"
    extra: dict = field(default_factory=dict)

    @property
    def n_permutations(self):
        """Former name of :attr:`n_null` (deprecated)."""
        return self.n_null

    @property
    def n_subjects(self):
        """Number of subjects tested."""
        return self.data.shape[0]

    def significant(self, alpha=0.05):
        """Clusters with ``p < alpha``.

        Parameters
        ----------
        alpha : float
            Significance level.

        Returns
        -------
        masks : list of ndarray of bool (n_times,)
            The time mask of each significant cluster.
        """
        return [c for c, p in zip(self.clusters, self.cluster_p_values) if p < alpha]

    def to_data_frame(self):
        """One row per cluster, with its time span and p-value.

        Returns
        -------
        df : DataFrame
            Columns ``term``, ``tstart``, ``tstop`` (first and last time of the cluster,
            in seconds), ``n_times`` (its time points) and ``p_value``.
        """
        rows = []
        for c, p in zip(self.clusters, self.cluster_p_values):
            t = self.times[c]
            rows.append(dict(term=self.term, tstart=float(t[0]), tstop=float(t[-1]),
                             n_times=int(c.sum()), p_value=float(p)))
        return pd.DataFrame(rows, columns=["term", "tstart", "tstop", "n_times", "p_value"])

    def __repr__(self):
        sig = sum(p < 0.05 for p in self.cluster_p_values)
        return (f"<ClusterTestResult | {self.term!r}, {self.n_subjects} subjects, "
                f"{len(self.clusters)} cluster(s), {sig} with p < 0.05>")


def _as_results(results, what):
    from ..results.timecourse import TimeCourseResult

    if isinstance(results, TimeCourseResult) or not hasattr(results, "__iter__"):
        raise TypeError(f"{what} must be a list of TimeCourseResult, one per subject; got "
                        f"{type(results).__name__}")
    results = list(results)
    bad = [type(r).__name__ for r in results if not isinstance(r, TimeCourseResult)]
    if bad:
        raise TypeError(f"every result of {what} must be a TimeCourseResult; got {bad[:3]}")
    return results


def _same_times(r, ref, what):
    if r.times.shape != ref.times.shape or not np.allclose(r.times, ref.times, rtol=0,
                                                          atol=1e-9):
        raise ValueError(f"{what} has different times ({r.times.shape[0]} vs "
                         f"{ref.times.shape[0]} samples, from {r.times[0]:g} s vs "
                         f"{ref.times[0]:g} s); analyse every subject with the same tmin, "
                         "tmax, decim.")


def _interaction_gain(results, additive):
    """``(n_subjects, n_times)`` held-out score of ``results`` (models with interactions)
    minus that of ``additive`` (the same subjects' additive models), checked pair by pair."""
    if additive is None:
        raise ValueError(NO_ADDITIVE)
    check_pairs(results, additive, _same_times)
    return np.stack([f.score - a.score for f, a in zip(results, additive)])


def _check_results(results, term, measure, additive=None):
    results = _as_results(results, "results")
    if len(results) < 2:
        raise ValueError(f"a group test needs at least 2 subjects' results; got {len(results)}")
    ref = results[0]
    for k, r in enumerate(results[1:], start=1):
        _same_times(r, ref, f"result {k}")
        if list(r.terms) != list(ref.terms):
            raise ValueError(f"result {k} has different terms from result 0 ({r.terms} vs "
                             f"{ref.terms}); use the same features for every subject.")
        levels = (r.settings.get("level"), ref.settings.get("level"))
        if levels[0] != levels[1] and measure != "main_effect":
            raise ValueError(f"result {k} measured importance at level={levels[0]!r} and "
                             f"result 0 at level={levels[1]!r}: a feature's total effect "
                             "and its own term are different quantities even under one "
                             "name; analyse every subject at the same level.")
    if additive is not None:
        additive = _as_results(additive, "additive")
    every = results + (additive or [])
    in_sample = [k for k, r in enumerate(every) if r.score_kind == "in-sample"]
    if in_sample and measure != "main_effect":          # in-sample by design, centred on 0
        warnings.warn(f"{len(in_sample)} of {len(every)} results (e.g. result "
                      f"{in_sample[0]}) were computed without cross-validation (cv=None): "
                      "their scores and importances are in-sample, above 0 even on noise, "
                      "so a test against 0 is not valid. Analyse every subject with cv "
                      "(e.g. cv=5).", UserWarning, stacklevel=4)
    if measure == "interactions":
        return results, "interactions", _interaction_gain(results, additive)
    if additive is not None:
        raise ValueError(f"additive is used by measure='interactions' only; got "
                         f"measure={measure!r}")
    if measure == "score":
        return results, "score", _finite(np.stack([r.score for r in results]), "score")
    if measure == "main_effect":
        return results, term, _main_effects(results, term)
    if term is None:
        raise ValueError(f"name the term to test; terms are {ref.terms}")
    if term not in ref.terms:
        raise ValueError(f"unknown term {term!r}; terms are {ref.terms}")
    k = ref.terms.index(term)
    return results, term, _finite(np.stack([r.importance[:, k] for r in results]), term)


def _main_effects(results, term):
    """``(n_subjects, n_times)`` in-sample main effect of feature ``term`` (partial
    Spearman correlation of its distance with the neural distance, the other features'
    held fixed), checked: a feature, the same features in every subject, computed."""
    k = check_main_effect_term(results, term, "measure='interactions'")
    return _finite(np.stack([r.main_effect[:, k] for r in results]), f"{term} (main effect)",
                   "their neural distances were all equal there, or the feature's "
                   "distance is a function of the other features' (no main effect of its "
                   "own)")


_EQUAL_DISTANCES = "their neural distances were all equal there"


def _finite(data, what, why=_EQUAL_DISTANCES):
    """Refuse undefined (NaN) values of subjects' results: a group test cannot read them
    as 0 or drop them silently."""
    bad = np.isnan(data)
    if bad.any():
        subjects, times = np.flatnonzero(bad.any(axis=1)), np.flatnonzero(bad.any(axis=0))
        raise ValueError(f"{what} is undefined (NaN) in {len(subjects)} subject(s) (e.g. "
                         f"result {subjects[0]}) at {len(times)} time point(s) (index "
                         f"{times[:5].tolist()}): {why}. Crop those times from every "
                         "result, or leave those subjects out.")
    return data


@verbose
@fill_doc
@renamed(n_permutations="n_null", seed="random_state")
def permutation_cluster_test(results, term=None, *, measure="importance", additive=None,
                             n_null=1024, threshold=None, tail=1, random_state=None,
                             n_jobs=None, verbose=None, n_permutations=None, seed=None):
    """Cluster-based permutation test of a term's importance time course across subjects.

    Tests, at the group level, whether the importance of ``term`` (or its main effect, the
    held-out score, or the gain of the models with interactions over additive ones) is
    above zero, using :func:`mne.stats.permutation_cluster_1samp_test` on the
    ``(n_subjects, n_times)`` time courses (fold-mean importance of each subject, or its
    ``main_effect`` column).

    Parameters
    ----------
    results : list of TimeCourseResult
        One per subject, with the same times and terms, cross-validated (results of
        ``cv=None`` are in-sample, above 0 even on noise: a warning says so; not with
        ``measure="main_effect"``, which is in sample by design).
    term : str | None
        Term to test (a feature ``"f"`` or an interaction ``"f:g"``; a feature with
        ``measure="main_effect"``).  A term-level interaction's importance is not evidence
        of an interaction (with binary features it is not identifiable: method page); test
        ``measure="interactions"`` instead.
    measure : {"importance", "main_effect", "score", "interactions"}
        Test the term's importance; (``"main_effect"``) the feature's in-sample main
        effect, each subject's ``main_effect[:, feature_names.index(term)]``: the partial
        Spearman correlation of the feature's distance with the neural distance, the
        other features' distances held fixed (a partial-RSA statistic; results without it,
        e.g. files saved before results kept it, are refused: rerun their analysis); the
        held-out Spearman score; or (``"interactions"``) the held-out score of
        ``results`` minus that of ``additive``: do the features interact in the neural
        geometry, i.e. do models with interactions predict held-out pairs better than the
        best additive metric (FR-RSA)?  ``term`` is ignored for the last two.
    additive : list of TimeCourseResult | None
        With ``measure="interactions"`` only: the same subjects in the same order, analysed
        like ``results`` but with ``constraint="diagonal"`` (no interactions), with the same
        ``cv`` and an int ``random_state`` so that each subject's two scores come from the
        same folds (a warning says when they do not).
    n_null : int
        Sign-flip permutations (all ``2 ** n_subjects`` when fewer): the null
        distribution's size, named as in the single-subject tests.
    threshold : float | None
        Cluster-forming t threshold; ``None``: the t value at p = 0.05 (MNE's default).
    tail : {1, 0, -1}
        ``1`` tests importance (or the main effect) > 0 (the usual question: stimuli
        that differ in the feature are further apart), ``0`` two-sided.  Only ``1`` with
        ``measure="interactions"``: a model with interactions that predicts worse than the
        additive one is over-fitted, not evidence of anything.
    random_state : None | int
        Seeds the permutations.
    n_jobs : int | None
        Passed to MNE.
    %(verbose)s
    n_permutations : int | None
        Former name of ``n_null`` (deprecated; a FutureWarning; both names: a TypeError).
    seed : None | int
        Former name of ``random_state`` (deprecated; a FutureWarning; both names: a TypeError).

    Returns
    -------
    ClusterTestResult
        ``t_obs``, ``clusters`` (boolean time masks), ``cluster_p_values``, ``times``;
        ``.significant(alpha)`` and ``.to_data_frame()``.  Pass it to
        :func:`plot_clusters`.

    Notes
    -----
    Measured on simulated subjects analysed with the defaults (method page, "Group
    level"): groups of 12 with a cluster of an unencoded feature at p < 0.05 in 0.045 of
    200 groups (another feature encoded) and 0.030 of 100 (pure noise), at the former
    defaults (one split into 5 folds).  At the current defaults, on pure noise: 0 and 1 of
    40 groups for the importance of two unencoded features, 0.020 of 200 for each one's
    main effect (``measure="main_effect"``; Wilson 0.008-0.050); a feature encoded at
    amplitude 0.2 found in 15 of 20 groups by its importance and 20 of 20 by its main
    effect.  The main effect of an unencoded feature was measured centred on 0 across
    subjects but right-skewed, so the sign flips are approximately valid and the
    one-sided test conservative.  With ``measure="interactions"`` ("Interactions across
    subjects"): a cluster in 0.020 of 200 groups with additive codes of three binary
    features (0.050 of 100 on pure noise), and a sub-additive code found in 0.15, 0.90
    and 1.00 of 40 groups at three amplitudes.

    Examples
    --------
    >>> results = [mlem_neuro.read_result(f"sub-{s:02d}_mlem.npz") for s in range(1, 21)]
    ...                                                       # doctest: +SKIP
    >>> st = mlem_neuro.stats.permutation_cluster_test(results, "side", random_state=0)
    ...                                                       # doctest: +SKIP
    >>> st.to_data_frame()                                    # doctest: +SKIP
    >>> mlem_neuro.stats.plot_clusters(results, "side", stats=st)   # doctest: +SKIP
    """
    from mne.stats import permutation_cluster_1samp_test

    check("measure", measure)
    check("tail", tail)
    if measure == "interactions" and tail != 1:
        raise ValueError(f"measure='interactions' is tested with tail=1 (models with "
                         f"interactions predicting better than additive ones); got "
                         f"tail={tail}")
    n_null = check("n_null", n_null, low=1, hint=" (sign-flip permutations of the cluster "
                                                 "test)")
    seed = check("random_state", random_state)
    results, name, X = _check_results(results, term, measure, additive)
    if not np.isfinite(X).all():
        raise ValueError(f"the time courses of {name!r} hold NaN or infinite values.")
    # MNE >= 1.12 names the seed ``rng`` (``seed`` still works but logs a notice)
    import inspect

    seed_kw = ("rng" if "rng" in inspect.signature(permutation_cluster_1samp_test).parameters
               else "seed")
    with warnings.catch_warnings():
        # no supra-threshold cluster is a result here (an empty ``clusters``), not a problem
        warnings.filterwarnings("ignore", message="No clusters found")
        t_obs, clusters, pvals, H0 = permutation_cluster_1samp_test(
            X, threshold=threshold, n_permutations=int(n_null), tail=tail,
            n_jobs=n_jobs, out_type="indices", verbose=False, **{seed_kw: seed})
    n_times = X.shape[1]
    masks = []
    for c in clusters:                       # indices of the time points of each cluster
        mask = np.zeros(n_times, dtype=bool)
        mask[np.asarray(c[0] if isinstance(c, tuple) else c, dtype=int)] = True
        masks.append(mask)
    if threshold is None:
        from scipy import stats

        # MNE's default: the t value at p = 0.05 (two-sided: 0.025 per side)
        threshold = float(stats.t.ppf(1 - 0.05 / (2 if tail == 0 else 1), X.shape[0] - 1))
        threshold = -threshold if tail == -1 else threshold
    out = ClusterTestResult(term=name, times=results[0].times.copy(),
                            t_obs=np.asarray(t_obs, dtype=float).reshape(n_times),
                            clusters=masks, cluster_p_values=np.asarray(pvals, dtype=float),
                            H0=np.asarray(H0, dtype=float), data=X, threshold=float(threshold),
                            tail=int(tail), n_null=int(n_null), measure=measure)
    logger.info("cluster test %r: %d subjects, %d cluster(s), p = %s", name, X.shape[0],
                len(masks), np.round(out.cluster_p_values, 4).tolist())
    return out


def plot_clusters(results, term=None, stats=None, alpha=0.05, ax=None, show=True,
                  **test_kwargs):
    """Group mean ± SEM of a term's importance over time, significant clusters shaded.

    Parameters
    ----------
    results : list of TimeCourseResult
        One per subject.
    term : str | None
        The term (ignored when ``stats`` was computed on the score).
    stats : ClusterTestResult | None
        Output of :func:`permutation_cluster_test`; computed (with ``test_kwargs``) when
        None.
    alpha : float
        Clusters with ``p < alpha`` are shaded and annotated with their p-value.
    ax : matplotlib Axes | None
        Where to draw; a new figure when None.
    show : bool
        Call ``plt.show()``.
    **test_kwargs
        Passed to :func:`permutation_cluster_test` when ``stats`` is None (with ``stats``
        of ``measure="interactions"``, give its ``additive`` here too).

    Returns
    -------
    matplotlib.figure.Figure
    """
    import matplotlib.pyplot as plt

    if stats is None:
        stats = permutation_cluster_test(results, term, **test_kwargs)
    elif not isinstance(stats, ClusterTestResult):
        raise TypeError(f"stats must be a ClusterTestResult; got {type(stats).__name__}")
    else:
        results, name, X = _check_results(results, term if term is not None else stats.term,
                                          stats.measure, test_kwargs.get("additive"))
        if name != stats.term or not np.allclose(X, stats.data):
            raise ValueError(f"stats were computed for {stats.term!r} on other data than "
                             f"these results' {name!r}.")
    X, t = stats.data, stats.times
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3.5))
    else:
        fig = ax.figure
    mean = X.mean(axis=0)
    sem = X.std(axis=0, ddof=1) / np.sqrt(X.shape[0])
    line, = ax.plot(t, mean, label=f"{stats.term} (mean ± SEM, N={X.shape[0]})")
    ax.fill_between(t, mean - sem, mean + sem, color=line.get_color(), alpha=0.25,
                    linewidth=0)
    ax.axhline(0, color="k", linewidth=0.8)
    dt = np.median(np.diff(t)) if len(t) > 1 else 1.0
    for c, p in zip(stats.clusters, stats.cluster_p_values):
        if p < alpha:
            t0, t1 = t[c][0] - dt / 2, t[c][-1] + dt / 2
            ax.axvspan(t0, t1, color="0.6", alpha=0.3, linewidth=0)
            ax.annotate(f"p = {p:.3g}", xy=((t0 + t1) / 2, 1.0),
                        xycoords=("data", "axes fraction"), ha="center", va="bottom",
                        fontsize="small")
    ylabel = {"score": "held-out ρ", "interactions": "held-out ρ gain over additive",
              "main_effect": "main effect (partial Spearman ρ, in sample)"}.get(
        stats.measure, "importance (Δ Spearman ρ)")
    ax.set_ylabel(ylabel)
    ax.set_xlabel("time (s)")
    ax.legend(loc="upper right", fontsize="small")
    if show:
        plt.show()
    return fig
