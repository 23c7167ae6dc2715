"""The algebra of partial rank correlations, shared by the Mantel tests, the RSA analyses
and MLEM's main effects.

The partial correlation of ``y`` with column ``k`` of ``A`` (centred columns), the other
columns held fixed, is ``(y . e_k) / sqrt(|y|^2 - |Q_k.T y|^2)`` for centred ``y``, with
``Q_k`` an orthonormal basis of the other columns' span and ``e_k`` the unit residual of
column ``k`` on it.  Both come from :func:`partial_residuals`, once per design.
"""
import numpy as np


def span_basis(A, rtol):
    """Orthonormal basis ``(P, r)`` of the span of ``A (P, m)``'s columns and their
    coordinates ``(r, m)`` in it, from the SVD: the left singular vectors of the singular
    values above ``rtol`` times the largest (nested or identical columns add no
    spurious direction; an all-zero ``A`` spans nothing)."""
    if A.shape[1] == 0:
        return A[:, :0], np.zeros((0, 0))
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    r = int((s > rtol * s[0]).sum()) if s[0] > 0 else 0
    return U[:, :r], s[:r, None] * Vt[:r]


def partial_residuals(A, rtol):
    """Per column ``k`` of ``A (P, m)``: ``(Q_k, e_k)``, ``Q_k (P, q)`` an orthonormal basis
    of the other columns' span (:func:`span_basis`) and ``e_k (P,)`` the unit residual of
    column ``k`` on it, ``None`` when that residual is at most ``rtol`` times the column's
    norm (a column the others determine, or a zero column: no partial correlation)."""
    out = []
    for k in range(A.shape[1]):
        Q, _ = span_basis(np.delete(A, k, axis=1), rtol)
        col = A[:, k]
        res = col - Q @ (Q.T @ col)
        size, scale = float(np.linalg.norm(res)), float(np.linalg.norm(col))
        out.append((Q, None if scale == 0 or size <= rtol * scale else res / size))
    return out
