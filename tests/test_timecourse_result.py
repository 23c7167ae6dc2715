"""TimeCourseResult: summaries, tidy frame, Evoked export, plots, save / read_result."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import mlem_neuro  # noqa: E402
from mlem_neuro.results import TimeCourseResult, read_result  # noqa: E402
from mlem_neuro.time_resolved import mlem_array  # noqa: E402

ARRAYS = ("fold_importance", "fold_score", "fold_weights", "n_iter", "times",
          "fold_importance_perm_std", "converged")


@pytest.fixture(scope="module")
def result():
    """A real (small) analysis: f encoded in channels 0-2 from sample 5 on."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 6, 10))
    f = rng.integers(0, 2, 30)
    X[:, :3, 5:] += 2 * f[:, None, None]
    y = pd.DataFrame({"f": f.astype(bool), "g": rng.integers(0, 2, 30).astype(bool)})
    return mlem_array(X, y, sfreq=50.0, ch_names=[f"ch{k}" for k in range(6)], window=0.02,
                      cv=3, n_repeats=1, max_steps=30, level="term", random_state=0)


def synthetic(F=2, M=5, terms=("a", "b", "a:b"), times=None, seed=0):
    rng = np.random.default_rng(seed)
    T = len(terms)
    return TimeCourseResult(
        fold_importance=rng.standard_normal((F, M, T)), fold_score=rng.uniform(-1, 1, (F, M)),
        fold_weights=rng.standard_normal((F, M, 2, 2)), n_iter=rng.integers(1, 99, (F, M)),
        terms=list(terms), feature_names=["a", "b"], settings={"cv": F, "note": "x"},
        times=np.linspace(-0.1, 0.3, M) if times is None else times, ch_names=["c1", "c2"],
        fold_importance_perm_std=rng.uniform(0, 1, (F, M, T)),
        converged=rng.integers(0, 2, (F, M)).astype(bool))


def assert_same(a, b):
    assert type(b) is type(a)
    for name in ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert b.terms == a.terms and b.feature_names == a.feature_names
    assert b.settings == a.settings
    assert b.ch_names == a.ch_names
    for prop in ("importance", "importance_fold_std", "score", "score_std", "weights"):
        np.testing.assert_array_equal(getattr(a, prop), getattr(b, prop), err_msg=prop)


# -------------------------------------------------------------------------- summaries
def test_summaries_are_fold_means_and_spreads():
    res = synthetic()
    np.testing.assert_allclose(res.importance, res.fold_importance.mean(0))
    np.testing.assert_allclose(res.importance_fold_std, res.fold_importance.std(0, ddof=1))
    np.testing.assert_allclose(res.score, res.fold_score.mean(0))
    np.testing.assert_allclose(res.weights, res.fold_weights.mean(0))
    assert res.importance.shape == (5, 3) and res.weights.shape == (5, 2, 2)
    assert res.sfreq == pytest.approx(10.0)
    assert "5 models, 3 terms, 2 fold(s)" in repr(res)


def test_constructor_checks_shapes():
    with pytest.raises(ValueError, match="times"):
        synthetic(times=np.arange(4.0))
    res = synthetic()
    with pytest.raises(ValueError, match="converged"):
        TimeCourseResult(res.fold_importance, res.fold_score, res.fold_weights, res.n_iter,
                         res.terms, res.feature_names, converged=np.ones((1, 5), bool))
    plain = TimeCourseResult(res.fold_importance, res.fold_score, res.fold_weights,
                             res.n_iter, res.terms, res.feature_names)
    np.testing.assert_array_equal(plain.times, np.arange(5.0))     # sample indices
    assert np.isnan(plain.fold_importance_perm_std).all()


# ----------------------------------------------------------------------------- I/O
def test_save_read_round_trip_of_a_real_analysis(result, tmp_path):
    fname = result.save(tmp_path / "sub-01_mlem.npz")
    back = mlem_neuro.read_result(fname)
    assert_same(result, back)
    assert back.settings["window"] == 0.02 and back.settings["cv"] == 3
    assert back.ch_names == [f"ch{k}" for k in range(6)]
    # saving the read-back object gives the same file content
    again = read_result(back.save(tmp_path / "again.npz"))
    assert_same(result, again)


def test_save_read_round_trip_of_synthetic_values(tmp_path):
    res = synthetic(F=1, M=7, terms=("a", "b"))
    res.ch_names = None
    back = read_result(res.save(str(tmp_path / "x.npz")))
    assert_same(res, back)
    np.testing.assert_array_equal(back.importance_fold_std, 0.0)          # one fold


def test_save_refuses_to_overwrite_and_bad_names(result, tmp_path):
    f = result.save(tmp_path / "r.npz")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        result.save(f)
    result.save(f, overwrite=True)
    with pytest.raises(ValueError, match=".npz"):
        result.save(tmp_path / "r.fif")


# ---------------------------------------------------------------------- conversions
def test_to_data_frame_is_tidy(result):
    df = result.to_data_frame()
    M, T = result.importance.shape
    assert len(df) == M * T
    assert list(df.columns) == ["time", "term", "importance", "importance_fold_std", "score",
                                "score_std", "main_effect"]
    for k, term in enumerate(result.terms):
        sub = df[df["term"] == term]
        np.testing.assert_array_equal(sub["time"], result.times)
        np.testing.assert_array_equal(sub["importance"], result.importance[:, k])
        np.testing.assert_array_equal(sub["importance_fold_std"], result.importance_fold_std[:, k])
        np.testing.assert_array_equal(sub["score"], result.score)
        if term in result.feature_names:      # a feature's main effect; NaN for f:g
            np.testing.assert_array_equal(
                sub["main_effect"], result.main_effect[:, result.feature_names.index(term)])
        else:
            assert sub["main_effect"].isna().all()
    only = result.to_data_frame(terms="f")
    assert set(only["term"]) == {"f"} and len(only) == M
    with pytest.raises(ValueError, match="unknown term"):
        result.to_data_frame(terms="nope")


def test_to_evoked_one_misc_channel_per_term(result):
    ev = result.to_evoked()
    assert ev.ch_names == result.terms
    assert set(ev.get_channel_types()) == {"misc"}
    assert ev.info["sfreq"] == pytest.approx(50.0)
    np.testing.assert_allclose(ev.times, result.times, atol=1e-12)
    np.testing.assert_array_equal(ev.data, result.importance.T)
    assert ev.nave == 3
    with_score = result.to_evoked(include_score=True)
    assert with_score.ch_names[-1] == "score"
    np.testing.assert_array_equal(with_score.data[-1], result.score)


def test_evoked_plots_importance_without_scaling(result):
    fig = result.to_evoked().plot(show=False)
    lines = [ln.get_ydata() for ax in fig.axes for ln in ax.lines
             if len(np.atleast_1d(ln.get_ydata())) == len(result.times)]
    # the drawn values are the importances themselves (misc scaling 1)
    for k in range(len(result.terms)):
        assert any(np.allclose(y, result.importance[:, k]) for y in lines)
    plt.close(fig)


def test_to_evoked_needs_even_times():
    res = synthetic(times=np.array([0.0, 0.1, 0.15, 0.3, 0.4]))
    assert res.sfreq is None
    with pytest.raises(ValueError, match="evenly spaced"):
        res.to_evoked()


# ---------------------------------------------------------------------------- plots
def test_plot_draws_mean_and_fold_spread(result):
    fig = result.plot(show=False)
    assert isinstance(fig, matplotlib.figure.Figure)
    ax_imp, ax_score = fig.axes
    # one line per term (+ the zero line); shaded bands = mean ± fold std
    assert [ln.get_label() for ln in ax_imp.lines[:3]] == result.terms
    np.testing.assert_allclose(ax_imp.lines[0].get_ydata(), result.importance[:, 0])
    assert len(ax_imp.collections) == 3
    band = ax_imp.collections[0].get_paths()[0].vertices[:, 1]
    lo = result.importance[:, 0] - result.importance_fold_std[:, 0]
    hi = result.importance[:, 0] + result.importance_fold_std[:, 0]
    assert band.min() == pytest.approx(lo.min()) and band.max() == pytest.approx(hi.max())
    np.testing.assert_allclose(ax_score.lines[0].get_ydata(), result.score)
    plt.close(fig)


def test_plot_subset_and_given_axes(result):
    fig, ax = plt.subplots()
    out = result.plot(terms="f", axes=ax, show=False)
    assert out is fig and len(fig.axes) == 1
    assert [ln.get_label() for ln in ax.lines[:1]] == ["f"] and len(ax.collections) == 1
    plt.close(fig)
    fig = result.plot(terms=["g", "f:g"], score=False, show=False)
    assert len(fig.axes) == 1
    plt.close(fig)
    with pytest.raises(ValueError, match="unknown term"):
        result.plot(terms=["zz"], show=False)
    with pytest.raises(ValueError, match="one or two"):
        result.plot(axes=plt.subplots(3)[1], show=False)
    plt.close("all")


def test_to_evoked_warns_when_times_are_off_mnes_sample_grid():
    """MNE puts an Evoked's samples at multiples of 1 / sfreq: times between sample
    instants (bin centres 0.005, 0.015... s at 100 Hz) came back 5 ms early, silently.
    A warning names the shift; on-grid times give none."""
    import warnings

    res = synthetic(times=0.005 + np.arange(5) / 100.0)
    with pytest.warns(UserWarning, match=r"shifts them by [+-]0.005 s"):
        ev = res.to_evoked()              # half a sample: MNE rounds either way
    np.testing.assert_allclose(abs(ev.times - res.times), 0.005, atol=1e-9)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ev = synthetic(times=-0.02 + np.arange(5) / 100.0).to_evoked()
    np.testing.assert_allclose(ev.times, -0.02 + np.arange(5) / 100.0, atol=1e-9)


def test_to_evoked_warns_when_times_are_sample_numbers():
    """mlem_array without times or sfreq numbers the samples 0, 1, ...: the Evoked reads
    them as seconds at 1 Hz, which a warning says; times in seconds give none."""
    import warnings

    rng = np.random.default_rng(0)
    X = rng.standard_normal((24, 3, 4))
    y = pd.DataFrame({"f": rng.integers(0, 2, 24).astype(bool),
                      "g": rng.integers(0, 2, 24).astype(bool)})
    res = mlem_array(X, y, cv=3, n_repeats=1, max_steps=5, random_state=0)
    with pytest.warns(UserWarning, match="sample numbers"):
        ev = res.to_evoked()
    assert ev.info["sfreq"] == 1.0
    res = mlem_array(X, y, sfreq=100.0, cv=3, n_repeats=1, max_steps=5, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        res.to_evoked()


@pytest.mark.parametrize("n_null, alpha, warns", [(19, 0.05, True), (20, 0.05, False),
                                                  (99, 0.01, True), (100, 0.01, False)])
def test_significant_warns_when_alpha_cannot_be_reached(n_null, alpha, warns):
    import warnings

    res = synthetic(M=4)
    smallest = 1.0 / (1 + n_null)                  # p = (1 + #null >= obs) / (1 + n_null)
    p = np.array([[smallest], [smallest], [0.5], [1.0]])
    res = TimeCourseResult(**{k: getattr(res, k) for k in (
        "fold_importance", "fold_score", "fold_weights", "n_iter", "terms", "feature_names",
        "times", "fold_importance_perm_std", "converged")},
        settings={"n_null": n_null}, tests=["score"], pvalues=p, pvalues_fwe=p)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mask = res.significant("score", alpha=alpha)
    said = [w for w in caught if "smallest p-value" in str(w.message)]
    assert bool(said) == warns
    np.testing.assert_array_equal(mask, [not warns, not warns, False, False])
    if warns:
        assert f"n_null >= {n_null + 1}" in str(said[0].message)
    with pytest.raises(ValueError, match="alpha"):
        res.significant("score", alpha=0)
