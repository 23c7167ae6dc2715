"""Permutation tests of designs with a numeric feature (issue 28, item 4): the faster
computations give the numbers of the computations they replace."""
import numpy as np
import pytest
import torch

from mlem_neuro.core.scoring import fastnull


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


def _fas_design(n=36, seed=0):
    """A binary relatedness and a numeric association strength with few values (> 0 for
    most related stimuli, 0 for the others), and data that depend on both."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    related = rng.permutation(np.arange(n) % 2)
    fas = np.where(related == 1, rng.choice([0.0, 0.1, 0.25, 0.4, 0.7, 1.0], n), 0.0)
    table = pd.DataFrame({"relatedness": related.astype(str), "FAS": fas})
    Y = rng.normal(size=(2, n, 6))
    Y[:, :, 0] += 2.0 * related + 3.0 * fas
    return Y, table


@pytest.mark.parametrize("cv", [3, 6])
def test_numeric_null_statistics_are_those_of_the_relabelled_table(monkeypatch, cv):
    """With a numeric feature of few values the null models relabel the features: null
    replicate r of test t is the analysis of the table whose row s is row perms[t, r, s],
    each null model trained on its own rows (several stacks); held-out scores grouped by
    rows (cv=3: 24 rows, 66 held-out pairs) or pair by pair (cv=6: 15 pairs)."""
    from mlem_neuro import crossval
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.crossval import run_cv

    Y, table = _fas_design()
    n = len(table)
    rng = np.random.default_rng(1)
    perms = np.stack([np.stack([rng.permutation(n) for _ in range(3)]) for _ in range(3)])
    monkeypatch.setattr(crossval, "_draw_nulls",
                        lambda opts, enc, design, rng: perms)
    stacks = []
    real = fastnull.fit_grouped
    monkeypatch.setattr(fastnull, "fit_grouped",
                        lambda *a, **k: stacks.append(a[1].shape) or real(*a, **k))
    small = dict(cv=cv, n_repeats=1, max_steps=60, patience=10, n_permutations=3, interactions=True)
    source = DenseRDMSource(Y)
    out = run_cv(source, table, MLEMOptions(**small, n_null=3, random_state=0))
    assert len(stacks) > 3                       # the fast path, a stack per row set
    names = out.feature_names
    compared = 0
    for t in range(3):
        for r in range(3):
            ref = run_cv(source, table.iloc[perms[t, r]].reset_index(drop=True),
                         MLEMOptions(**small, random_state=0))
            if any(not np.array_equal(a[1], b[1]) for a, b in zip(ref.folds, out.folds)):
                continue        # the table's own folds (a split usable for its values)
            compared += 1
            expected = ref.score if t == 0 else ref.importance[:, :, ref.terms.index(
                names[t - 1])]
            # measured: equal to 3e-17 (float32 training of the same numbers)
            np.testing.assert_allclose(out.fold_null[:, :, t, r], expected, atol=1e-6)
    assert compared >= 7


@pytest.mark.parametrize("U", [7, 300])
def test_held_out_scores_are_spearman_of_the_pairs(U):
    """Grouped by rows (fewer rows than pairs) or pair by pair (more): the tie-aware
    Spearman of each grouping's pair predictions against the targets."""
    from scipy.stats import spearmanr

    from mlem_neuro.core.ranks.spearman import rankdata, standardize

    gen = torch.Generator().manual_seed(1)
    M, R, K, P = 2, 3, 4, 40
    q = torch.randint(0, 5, (M, R, U), generator=gen).double()     # many ties
    target = torch.randn(M, P, generator=gen, dtype=torch.float64)
    tzt = standardize(rankdata(target))
    g = torch.randint(0, U, (R, K, P), generator=gen)
    got = fastnull._held_out_scores(q, g, tzt, P)
    assert got.shape == (M, R, K)
    for m in range(M):
        for r in range(R):
            for k in range(K):
                expected = spearmanr(q[m, r, g[r, k]].numpy(), target[m].numpy())[0]
                np.testing.assert_allclose(got[m, r, k], expected, atol=1e-12)
