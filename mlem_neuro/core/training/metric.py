"""Parametrisations of the metric ``W`` and the term representation of the quadratic form.

``W`` is built from an unconstrained tensor ``A`` of shape ``(M, m, m)``:

* ``"spd"`` (MLEM): ``L = tril(A, -1) + diag(softplus(diag(A)))``, ``W = L Lᵀ``.
* ``"diagonal"`` (FR-RSA): ``W = diag(softplus(diag(A)))``, positive weights.
* ``"none"`` (FR-RSA with interactions): ``W = (A + Aᵀ) / 2``, symmetric, no SPD constraint.

Each ``W`` is divided by its Frobenius norm.  The prediction for a pair with feature
distances ``d`` is ``sqrt(dᵀ W d)``; written over terms it is ``sqrt(Σ_t w_t P_t)`` with
``P_kk = d_k²`` (weight ``W_kk``) and ``P_kl = 2 d_k d_l`` (weight ``W_kl``, ``k < l``), so the
``W`` reported is exactly the ``W`` used.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..checks import CONSTRAINTS, check  # noqa: F401  (CONSTRAINTS: defined there once)

_SOFTPLUS_INV_1 = math.log(math.e - 1.0)


def term_index(m, interactions=True):
    """Row/column indices ``(k, l)`` of each term: the m diagonal terms, then ``k < l``."""
    k = list(range(m))
    l = list(range(m))
    if interactions:
        for a in range(m):
            for b in range(a + 1, m):
                k.append(a)
                l.append(b)
    return np.array(k, dtype=np.int64), np.array(l, dtype=np.int64)


def term_names(names, interactions=True):
    """``"f"`` for a feature's own term, ``"f:g"`` for the interaction of f and g."""
    k, l = term_index(len(names), interactions)
    return [names[a] if a == b else f"{names[a]}:{names[b]}" for a, b in zip(k, l)]


def term_matrix(D, k, l):
    """``P`` of shape ``(n_pairs, n_terms)`` from feature distances ``D (n_pairs, m)``."""
    kt = torch.as_tensor(k, device=D.device)
    lt = torch.as_tensor(l, device=D.device)
    P = D[:, kt] * D[:, lt]
    off = np.flatnonzero(np.asarray(k) != np.asarray(l))
    if off.size:
        P[:, off] *= 2.0
    return P


def init_params(M, m, constraint, device, dtype):
    """Start every model at ``W ∝ I``: equal weights, no interactions."""
    A = torch.zeros(M, m, m, device=device, dtype=dtype)
    diag = _SOFTPLUS_INV_1 if constraint in ("spd", "diagonal") else 1.0
    A.diagonal(dim1=-2, dim2=-1).fill_(diag)
    return A


def make_W(A, constraint):
    """Frobenius-normalised ``W`` ``(M, m, m)`` from parameters ``A`` ``(M, m, m)``."""
    if constraint == "spd":
        L = torch.tril(A, diagonal=-1) + torch.diag_embed(F.softplus(A.diagonal(dim1=-2,
                                                                                 dim2=-1)))
        W = L @ L.transpose(-1, -2)
    elif constraint == "diagonal":
        W = torch.diag_embed(F.softplus(A.diagonal(dim1=-2, dim2=-1)))
    elif constraint == "none":
        W = 0.5 * (A + A.transpose(-1, -2))
    else:
        check("constraint", constraint)         # raises: not a constraint
    norm = torch.linalg.matrix_norm(W, ord="fro", keepdim=True)
    return W / norm.clamp_min(1e-12)


def term_weights(W, k, l):
    """Weights ``w_t = W[k_t, l_t]`` of each term, shape ``(M, n_terms)`` (``k, l``: arrays,
    or index tensors already on ``W``'s device, which are used as they are)."""
    return W[:, torch.as_tensor(k, device=W.device), torch.as_tensor(l, device=W.device)]


def quadratic_forms(tw, Pt):
    """``q = tw @ Pt.T`` ``(M, P)``: each model's ``dᵀ W d`` over the pairs' term rows
    ``Pt (P, n_terms)``, from its term weights ``tw (M, n_terms)``.

    On the CPU each model's row is computed by the same operations whatever the number of
    models ``M`` (one term at a time, in order): a matrix product picks its kernel, and so
    its rounding, by the shape, and float32 training turns a last-bit difference into a
    different fit, so that the models of one analysis would depend on how many of them
    share a chunk.  On a GPU (never bit-reproducible across shapes) it is the product.
    """
    if tw.device.type != "cpu":
        return tw @ Pt.T
    return _RowwiseForms.apply(tw, Pt)


class _RowwiseForms(torch.autograd.Function):
    """:func:`quadratic_forms` on the CPU: the forms and their gradient by term, each
    row by the same operations whatever the number of rows."""

    @staticmethod
    def forward(ctx, tw, Pt):
        cols = Pt.T.contiguous()
        ctx.save_for_backward(cols)
        q = tw[:, :1] * cols[0]
        for t in range(1, cols.shape[0]):
            q.addcmul_(tw[:, t:t + 1], cols[t])
        return q

    @staticmethod
    def backward(ctx, grad):
        (cols,) = ctx.saved_tensors
        out = torch.empty(grad.shape[0], cols.shape[0], dtype=grad.dtype, device=grad.device)
        for t in range(cols.shape[0]):
            out[:, t] = (grad * cols[t]).sum(dim=1)
        return out, None


def predict(q, constraint, eps=1e-12):
    """Predicted distance from the quadratic form ``q = dᵀ W d``.

    ``sqrt(q)`` for SPD/diagonal ``W``; for an unconstrained ``W`` (``q`` may be negative) a
    signed square root ``q / sqrt(|q| + eps)``, which is monotone in ``q``.  Ranks (hence
    Spearman scores) only depend on ``q``'s order.
    """
    if constraint == "none":
        return q / torch.sqrt(q.abs() + eps)
    return torch.sqrt(q.clamp_min(eps))
