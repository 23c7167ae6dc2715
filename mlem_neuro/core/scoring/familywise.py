"""Family-wise error over the tests of one analysis (and over its models).

A statistic of p-values that the result containers (:mod:`mlem_neuro.results`) and the
group level (:mod:`mlem_neuro.stats`, which exports it) both read, so it lives below both.
"""
import numpy as np


def familywise_over_tests(pvalues_fwe):
    """p-values corrected over models *and* tests (Holm's step-down over the tests).

    An analysis with ``n_null > 0`` runs several tests (``"score"``, one per feature,
    ``"interactions"``); ``pvalues_fwe`` is corrected over the models (time points,
    spheres, regions) of each test separately.  This function corrects over the tests too,
    so that a p-value below ``alpha`` anywhere, in any test, is an ``alpha``-level claim.

    For the p-value of model ``m`` in test ``t``, ``a = pvalues_fwe[m, t]``, every other
    testable test ``u`` is represented by its *largest* p-value ``Q_u = max over models of
    pvalues_fwe[:, u]``; the corrected value is Holm's adjusted p-value of ``a`` among
    ``{a} ∪ {Q_u}``: with ``k`` testable tests and those ``Q_u`` sorted in ascending order
    ``Q_(1) <= Q_(2) <= ...``, ``min(1, max(max over r < r_a of (k - r + 1) Q_(r),
    (k - r_a + 1) a))``, where ``r_a = 1 + #{u : Q_u < a}``.  When every test holds a model
    with a large p-value (e.g. a baseline time point), this is Bonferroni over the tests,
    ``min(1, k a)``; a test leaves the count only when it is significant at every model.

    Validity (closed testing with Bonferroni local tests; Holm 1979, Marcus et al. 1976):
    take any set ``I`` of (test, model) null hypotheses, spread over ``j`` tests, and
    reject their intersection when, in some test, the smallest ``pvalues_fwe`` among its
    members of ``I`` is at most ``alpha / j``; within a test that smallest value is a valid
    p-value for its members (the maximum-statistic correction controls the family-wise
    error over models), so by Bonferroni the local test has level ``alpha`` whatever the
    dependence between tests.  Rejecting ``(t, m)`` only when every such intersection that
    contains it is rejected therefore controls the family-wise error over all tests and
    models, and the intersection hardest to reject pairs ``(t, m)`` with the least
    significant model of each of some of the other tests, which gives the formula above.

    Parameters
    ----------
    pvalues_fwe : array-like (n_models, n_tests)
        p-values corrected over models within each test (a result's ``pvalues_fwe``).
        A column that is all NaN is a test that was not run (not testable): it stays NaN
        and does not count among the ``k`` tests; a NaN entry in another column (a model
        without a statistic) stays NaN and is ignored.

    Returns
    -------
    pvalues_fwe_tests : ndarray (n_models, n_tests)
        Corrected over models and tests; at least ``pvalues_fwe`` (equal to it with one
        test) and at most 1.

    Notes
    -----
    Ranking the other tests by their *smallest* p-value (Holm on the question "is test
    ``u`` significant somewhere?") would control only that question, not where: a test
    with a real effect at one model would lower the correction of the others while its own
    null models are still tested at ``alpha / k``; with two independent tests the chance
    of some false positive then reaches ``1 - (1 - alpha / 2)(1 - alpha)``, about
    ``1.5 alpha``.

    Examples
    --------
    >>> import numpy as np
    >>> p = np.array([[0.01, 0.02, 0.50], [0.04, 0.01, 0.20]])
    >>> familywise_over_tests(p)
    array([[0.03, 0.06, 0.5 ],
           [0.08, 0.03, 0.2 ]])
    """
    p = np.asarray(pvalues_fwe, dtype=float)
    if p.ndim != 2:
        raise ValueError("pvalues_fwe must have shape (n_models, n_tests); got an array "
                         f"of shape {p.shape}")
    if np.any(p[~np.isnan(p)] < 0) or np.any(p[~np.isnan(p)] > 1):
        raise ValueError("pvalues_fwe must lie in [0, 1] (NaN for tests not run)")
    out = np.full(p.shape, np.nan)
    testable = ~np.all(np.isnan(p), axis=0)
    k = int(testable.sum())
    if k == 0:
        return out
    cols = np.flatnonzero(testable)
    # each testable test's largest p-value (its least significant model)
    largest = np.nanmax(p[:, cols], axis=0)
    for i, t in enumerate(cols):
        others = np.sort(np.delete(largest, i))                      # ascending, k - 1
        # Holm's running maximum: steps[r] = max over r' <= r of (k - r' + 1) Q_(r')
        steps = np.concatenate([[0.0], np.maximum.accumulate(
            (k - np.arange(k - 1)) * others)])
        a = p[:, t]
        below = np.searchsorted(others, np.nan_to_num(a), side="left")   # r_a - 1
        adjusted = np.minimum(1.0, np.maximum(steps[below], (k - below) * a))
        out[:, t] = np.where(np.isnan(a), np.nan, adjusted)
    return out
