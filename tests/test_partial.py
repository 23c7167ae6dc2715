"""The shared partial-correlation algebra (Mantel tests, RSA analyses, main effects)."""
import numpy as np
import pytest

from mlem_neuro.core.ranks.partial import partial_residuals, span_basis


@pytest.mark.parametrize("seed", range(3))
def test_partial_correlation_matches_regression(seed):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(200, 3))
    A -= A.mean(axis=0)
    y = A @ rng.normal(size=3) + rng.normal(size=200)
    y -= y.mean()
    for k, (Q, e) in enumerate(partial_residuals(A, 1e-9)):
        others = np.delete(A, k, axis=1)
        ry = y - others @ np.linalg.lstsq(others, y, rcond=None)[0]
        rk = A[:, k] - others @ np.linalg.lstsq(others, A[:, k], rcond=None)[0]
        expected = ry @ rk / np.linalg.norm(ry) / np.linalg.norm(rk)
        got = (y @ e) / np.sqrt(y @ y - np.sum((Q.T @ y) ** 2))
        np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_determined_and_zero_columns_have_no_residual():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 50))
    A = np.column_stack([a, b, 2 * a - b, np.zeros(50)])
    out = partial_residuals(A, 1e-9)
    assert all(e is None for _, e in out)                # each a function of the others
    Q, coords = span_basis(A, 1e-9)
    assert Q.shape == (50, 2)                            # the nested columns add nothing
    np.testing.assert_allclose(Q @ coords, A, atol=1e-12)
    assert span_basis(np.zeros((5, 2)), 1e-9)[0].shape == (5, 0)
