"""The shared cross-validated driver and the result base class."""
import numpy as np
import pytest
from sklearn.model_selection import KFold

from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.core.runtime import Runtime
from mlem_neuro.crossval import run_cv as _run_cv
from mlem_neuro.results import _base
from mlem_neuro.results._base import BaseResult, read_result
from mlem_neuro.simulation import simulate_representations


def run_cv(source, features, groups=None, **kw):
    return _run_cv(source, features, MLEMOptions(**kw), groups=groups)


@pytest.fixture(scope="module")
def stack():
    """4 models on 45 stimuli: clean, noisier, noisier still, pure noise."""
    X, y, _ = simulate_representations(45, 3, 20, noise=0.0, random_state=0)
    rng = np.random.default_rng(0)
    Y = np.stack([X + s * X.std(0) * rng.standard_normal(X.shape) for s in (0.2, 1.0, 3.0)]
                 + [rng.standard_normal(X.shape)])
    return Y, y


FAST = dict(max_steps=150, patience=20)


def test_held_out_scores_and_importance_follow_the_signal(stack):
    Y, y = stack
    out = run_cv(DenseRDMSource(Y), y, cv=3, n_repeats=1, level="term", random_state=0, **FAST)
    F, M, T = out.importance.shape
    assert (F, M, T) == (3, 4, 6) and out.terms == ["f0", "f1", "f2", "f0:f1", "f0:f2",
                                                    "f1:f2"]
    score = out.score.mean(0)
    # measured (data seeds 0, 1, 2): clean 0.96-0.97, then 0.55-0.73, 0.05-0.15, and the
    # pure-noise model -0.055..0.035.  Its importances (-0.086..0.04) are the drop from a
    # baseline ρ near 0, so they scatter around 0 on both sides; clean max 0.54-0.73.
    assert score[0] > score[1] > score[2] > score[3]
    assert score[0] > 0.85 and abs(score[3]) < 0.12
    assert np.abs(out.importance[:, 3].mean(0)).max() < 0.15
    assert out.importance[:, 0].mean(0).max() > 0.3
    # folds: disjoint held-out sets that cover the stimuli
    tests = np.concatenate([te for _, te in out.folds])
    np.testing.assert_array_equal(np.sort(tests), np.arange(45))


def test_results_do_not_depend_on_chunking_or_jobs(stack):
    Y, y = stack
    kw = dict(cv=3, n_repeats=1, random_state=0, batch_size=200, **FAST)
    a = run_cv(DenseRDMSource(Y), y, **kw)
    b = run_cv(DenseRDMSource(Y), y, chunk_size=1, n_jobs=2, **kw)
    np.testing.assert_allclose(a.W, b.W, atol=1e-6)
    np.testing.assert_allclose(a.importance, b.importance, atol=1e-10)
    np.testing.assert_array_equal(a.n_iter, b.n_iter)


def test_cv_options(stack):
    Y, y = stack
    src = DenseRDMSource(Y[:1])
    none = run_cv(src, y, cv=None, random_state=0, **FAST)
    assert len(none.folds) == 1 and len(none.folds[0][1]) == 45
    split = run_cv(src, y, cv=KFold(3), random_state=0, **FAST)
    np.testing.assert_array_equal(split.folds[0][1], np.arange(15))
    feat = run_cv(src, y, cv=3, n_repeats=1, level="feature", random_state=0, **FAST)
    assert feat.terms == ["f0", "f1", "f2"] and feat.importance.shape == (3, 1, 3)
    with pytest.raises(TypeError, match="cv must be"):
        run_cv(src, y, cv=2.5)
    with pytest.raises(ValueError, match="at least 3"):
        run_cv(src, y, cv=[(np.arange(43), np.arange(43, 45))])
    with pytest.raises(ValueError, match="rows"):
        run_cv(src, y.iloc[:40])


# --------------------------------------------------------------------- results base
class _Demo(BaseResult):
    _extra_arrays = ("coords",)

    def __init__(self, *args, coords, label="x", **kwargs):
        super().__init__(*args, **kwargs)
        self.coords = np.asarray(coords)
        self.label = label

    def _extra_meta(self):
        return {"label": self.label}


def _demo(F=2, M=3, m=2):
    rng = np.random.default_rng(0)
    T = m * (m + 1) // 2
    return _Demo(rng.random((F, M, T)), rng.random((F, M)), rng.random((F, M, m, m)),
                 rng.integers(1, 100, (F, M)), ["a", "b", "a:b"], ["a", "b"],
                 settings={"cv": 5, "constraint": "spd"}, coords=np.arange(M) * 0.1,
                 label="demo")


def test_result_summaries_and_frame():
    r = _demo()
    np.testing.assert_allclose(r.importance, r.fold_importance.mean(0))
    np.testing.assert_allclose(r.importance_fold_std, r.fold_importance.std(0, ddof=1))
    np.testing.assert_allclose(r.score, r.fold_score.mean(0))
    df = r._long_frame({"coord": r.coords})
    assert len(df) == 9 and list(df["term"][:3]) == ["a", "b", "a:b"]
    row = df[(df.coord == 0.1) & (df.term == "a:b")].iloc[0]
    assert row.importance == pytest.approx(r.importance[1, 2])
    with pytest.raises(ValueError, match="unknown term"):
        r._term_index("c")
    with pytest.raises(ValueError, match="terms"):
        _Demo(np.zeros((1, 2, 3)), np.zeros((1, 2)), np.zeros((1, 2, 2, 2)), np.zeros((1, 2)),
              ["a", "b"], ["a", "b"], coords=[0, 1])


def test_save_read_round_trip(tmp_path, monkeypatch):
    monkeypatch.setitem(_base.RESULT_MODULES, "_Demo", __name__)
    r = _demo()
    fname = r.save(tmp_path / "sub-01_mlem.npz")
    back = read_result(fname)
    assert type(back) is _Demo
    for name in ("fold_importance", "fold_score", "fold_weights", "n_iter", "coords"):
        np.testing.assert_array_equal(getattr(back, name), getattr(r, name))
        assert getattr(back, name).dtype == getattr(r, name).dtype
    assert back.terms == r.terms and back.feature_names == r.feature_names
    assert back.settings == r.settings and back.label == "demo"
    with pytest.raises(FileExistsError, match="overwrite"):
        r.save(fname)
    r.save(fname, overwrite=True)
    with pytest.raises(ValueError, match=".npz"):
        r.save(tmp_path / "result.h5")
    with pytest.raises(FileNotFoundError):
        read_result(tmp_path / "missing.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="not an mlem_neuro result"):
        read_result(tmp_path / "other.npz")


def test_default_chunks_hold_at_most_max_chunk_models(monkeypatch):
    """Without chunk_size, chunks hold at most MAX_CHUNK_MODELS models (and fewer when the
    memory rule or the workers ask for it); an explicit chunk_size is kept."""
    from mlem_neuro import crossval
    sizes = lambda sl: [s.stop - s.start for s in sl]              # noqa: E731
    budget = Runtime().memory_bytes                                # the default budget
    assert sizes(crossval._chunk_slices(2500, 77, None, None, 1, budget)) == [1000, 1000, 500]
    assert sizes(crossval._chunk_slices(2500, 77, 2500, None, 1, budget)) == [2500]
    monkeypatch.setattr(crossval, "MAX_CHUNK_MODELS", 10**6)
    assert sizes(crossval._chunk_slices(2500, 77, None, None, 1, budget)) == [2500]
    assert sizes(crossval._chunk_slices(2500, 77, None, 2, 1, budget)) == [1250, 1250]


def test_random_splits_with_an_unusable_fold_are_drawn_again():
    """24 stimuli, a feature value held by 3 of them, 5 random folds: the first split of
    seed 0 holds out all 3 in one fold (its training stimuli then all share the value),
    which raised.  A split with an unusable fold is now drawn again; a split that works is
    kept as drawn, so results that ran before do not change."""
    import pandas as pd

    from mlem_neuro.core.stimuli.pairs import kfold_stimuli
    from mlem_neuro.crossval import check_cv, fold_usable

    table = pd.DataFrame({"a": ["x"] * 3 + ["y"] * 21, "b": np.tile(["u", "v"], 12)})
    usable = fold_usable(MLEMOptions(cv=5, n_repeats=1), table)
    first = kfold_stimuli(24, 5, np.random.default_rng(0))
    assert not all(usable(tr, te) for tr, te in first)
    folds = check_cv(5, 24, np.random.default_rng(0), usable=usable)
    assert all(usable(tr, te) for tr, te in folds)
    assert [te.tolist() for _, te in folds] != [te.tolist() for _, te in first]
    # the analysis runs (it raised "fold k of 5: over its 19 training stimuli..." before)
    rng = np.random.default_rng(1)
    res = _run_cv(DenseRDMSource(rng.standard_normal((2, 24, 6))), table,
                  MLEMOptions(cv=5, n_repeats=1, max_steps=20, n_permutations=1, random_state=0))
    assert res.score.shape == (5, 2)
    # a design whose first split works keeps it: the folds of the analysis are that split
    table = pd.DataFrame({"a": np.tile(["x", "y"], 12), "b": np.repeat(["u", "v"], 12)})
    usable = fold_usable(MLEMOptions(cv=5, n_repeats=1), table)
    first = kfold_stimuli(24, 5, np.random.default_rng(0))
    assert all(usable(tr, te) for tr, te in first)
    res = _run_cv(DenseRDMSource(rng.standard_normal((2, 24, 6))), table,
                  MLEMOptions(cv=5, n_repeats=1, max_steps=20, n_permutations=1, random_state=0))
    assert [te.tolist() for _, te in res.folds] == [te.tolist() for _, te in first]
    # a feature no split can use: the fold's own error, as before
    table = pd.DataFrame({"a": ["x"] + ["y"] * 23, "b": np.tile(["u", "v"], 12)})
    with pytest.raises(ValueError, match="rarer values are all held out"):
        _run_cv(DenseRDMSource(rng.standard_normal((1, 24, 6))), table,
                MLEMOptions(cv=5, n_repeats=1, max_steps=20, n_permutations=1, random_state=0))
