"""Permutation tests of designs with a numeric feature (issue 28, item 4): the faster
computations give the numbers of the computations they replace."""
import numpy as np
import torch

from mlem_neuro.core import fastnull


def _one_hot_sums(tz, g, U):
    """The previous :func:`fastnull.group_sums`: a product with one-hot rows."""
    R, P = g.shape
    out = torch.empty(tz.shape[0], R, U, dtype=torch.float64)
    for r in range(R):
        onehot = torch.zeros(P, U, dtype=torch.float64)
        onehot[torch.arange(P), g[r]] = 1.0
        out[:, r] = tz.double() @ onehot
    return out


def test_group_sums_are_the_one_hot_products():
    gen = torch.Generator().manual_seed(0)
    M, R, P, U = 3, 5, 200, 40
    tz = torch.randn(M, P, generator=gen, dtype=torch.float64)
    g = torch.randint(0, U - 3, (R, P), generator=gen)           # some rows absent
    sums, counts = fastnull.group_sums(tz, g, U)
    np.testing.assert_allclose(sums.numpy(), _one_hot_sums(tz, g, U).numpy(), atol=1e-12)
    expected = np.stack([np.bincount(row, minlength=U) for row in g.numpy()])
    np.testing.assert_array_equal(counts.numpy(), expected)
    assert (sums[:, :, U - 3:] == 0).all()
