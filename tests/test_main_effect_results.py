"""Each feature's in-sample main effect (partial rank correlation of its distance with the
neural distance, the other features' held fixed) reaches the results: kept, checked, saved
and read back; ``feature_test`` reaches the options from every analysis and from the
command line."""
import argparse

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro import read_result
from mlem_neuro.results import (
    BrainMapResult,
    SensorMapResult,
    SourceMapResult,
    TimeCourseResult,
)


def _arrays(rng, F, M, m=2, T=3):
    return (rng.standard_normal((F, M, T)), rng.uniform(-1, 1, (F, M)),
            rng.standard_normal((F, M, m, m)), rng.integers(1, 99, (F, M)))


def _timecourse(main_effect=None, M=5, seed=0):
    rng = np.random.default_rng(seed)
    return TimeCourseResult(*_arrays(rng, 2, M), ["a", "b", "a:b"], ["a", "b"],
                            settings={"cv": 2}, times=np.linspace(0, 0.4, M),
                            main_effect=main_effect)


def _brainmap(main_effect=None, seed=0):
    rng = np.random.default_rng(seed)
    ijk = np.argwhere(rng.random((4, 5, 3)) < 0.5)
    return BrainMapResult(*_arrays(rng, 2, len(ijk)), ["a", "b", "a:b"], ["a", "b"],
                          {"cv": 2}, affine=np.eye(4), shape=(4, 5, 3), voxel_indices=ijk,
                          main_effect=main_effect)


def _source(main_effect=None, seed=0):
    rng = np.random.default_rng(seed)
    vertices = [np.arange(3), np.arange(2)]          # 5 locations x 2 times
    return SourceMapResult(*_arrays(rng, 2, 10), ["a", "b", "a:b"], ["a", "b"],
                           {"cv": 2}, times=[0.0, 0.01], vertices=vertices,
                           main_effect=main_effect)


def _sensor(main_effect=None, seed=0):
    mne = pytest.importorskip("mne")
    rng = np.random.default_rng(seed)
    info = mne.create_info(3, 100.0, "eeg")          # 3 locations x 2 times
    return SensorMapResult(*_arrays(rng, 2, 6), ["a", "b", "a:b"], ["a", "b"],
                           {"cv": 2}, times=[0.0, 0.01], info=info,
                           main_effect=main_effect)


MAKERS = {"timecourse": (_timecourse, 5), "brainmap": (_brainmap, None),
          "source": (_source, 10), "sensor": (_sensor, 6)}


def _n_models(make):
    return make().fold_score.shape[1]


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_main_effect_is_saved_and_read_back(kind, tmp_path):
    make = MAKERS[kind][0]
    M = _n_models(make)
    main = np.random.default_rng(1).uniform(-1, 1, (M, 2))
    main[0, 1] = np.nan                                # undefined at a model: kept NaN
    res = make(main_effect=main)
    assert res.main_effect.dtype == float
    np.testing.assert_array_equal(res.main_effect, main)
    back = read_result(res.save(tmp_path / "r.npz"))
    assert type(back) is type(res)
    np.testing.assert_array_equal(back.main_effect, main)
    # an integer array is stored as float
    ints = make(main_effect=np.ones((M, 2), dtype=int))
    assert ints.main_effect.dtype == float


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_without_main_effect_the_file_has_none_and_reads_back_none(kind, tmp_path):
    res = MAKERS[kind][0]()
    assert res.main_effect is None
    fname = res.save(tmp_path / "r.npz")
    with np.load(fname) as f:
        assert "array__main_effect" not in f.files     # as files written before it
    assert read_result(fname).main_effect is None


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_main_effect_of_the_wrong_shape_is_refused(kind):
    make = MAKERS[kind][0]
    M = _n_models(make)
    for shape in [(M, 3), (M + 1, 2), (M,), (2, M, 2)]:
        with pytest.raises(ValueError, match=r"main_effect must have shape \(models, "
                                             rf"features\) = \({M}, 2\)"):
            make(main_effect=np.zeros(shape))
    with pytest.raises(ValueError, match="main_effect holds complex values"):
        make(main_effect=np.zeros((M, 2), dtype=complex))


def test_time_course_frame_has_each_feature_terms_main_effect():
    main = np.arange(10.0).reshape(5, 2)
    df = _timecourse(main_effect=main).to_data_frame()
    np.testing.assert_array_equal(df.loc[df.term == "a", "main_effect"], main[:, 0])
    np.testing.assert_array_equal(df.loc[df.term == "b", "main_effect"], main[:, 1])
    assert df.loc[df.term == "a:b", "main_effect"].isna().all()      # an interaction
    assert "main_effect" not in _timecourse().to_data_frame().columns


# ------------------------------------------------------------------------ analyses
def _simulated(n=40, C=6, T=3, seed=0):
    """Trials whose patterns carry feature ``a`` (not ``b``) at every time point."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 2, n), rng.integers(0, 2, n)
    X = rng.standard_normal((n, C, T))
    X[:, : C // 2, :] += 2.0 * a[:, None, None]
    return X, pd.DataFrame({"a": a.astype(bool), "b": b.astype(bool)})


FAST = dict(cv=2, n_repeats=1, max_steps=20, random_state=0, verbose="ERROR")


def test_analysis_returns_the_main_effects_larger_for_the_encoded_feature():
    X, table = _simulated()
    res = mlem_neuro.mlem_array(X, table, n_null=0, **FAST)
    assert res.main_effect is not None and res.main_effect.shape == (3, 2)
    assert np.isfinite(res.main_effect).all()
    assert res.main_effect[:, 0].mean() > 0.2
    assert res.main_effect[:, 0].mean() > res.main_effect[:, 1].mean() + 0.2
    assert (res.main_effect[:, 0] > np.abs(res.main_effect[:, 1])).all()
    assert res.settings["feature_test_used"] is None          # no tests
    assert res.settings["feature_test"] == "staged"           # the default, recorded


@pytest.mark.parametrize("feature_test", ["staged", "combined", "importance"])
def test_feature_test_reaches_the_analysis_and_is_recorded(feature_test, tmp_path):
    X, table = _simulated(n=30)
    res = mlem_neuro.mlem_array(X, table, n_null=19, interactions=False,
                                feature_test=feature_test, **FAST)
    assert res.settings["feature_test"] == feature_test
    assert res.settings["feature_test_used"] == feature_test
    # the staged test records in how many models the importance joined (none: an additive
    # model has no interaction to find)
    assert res.settings.get("feature_test_staged_open") == (
        0 if feature_test == "staged" else None)
    assert res.tests == ["score", "a", "b"]
    assert res.main_effect.shape == (3, 2)
    back = read_result(res.save(tmp_path / "r.npz"))
    np.testing.assert_array_equal(back.main_effect, res.main_effect)
    assert back.settings["feature_test_used"] == feature_test


def test_a_bad_feature_test_is_refused_by_every_analysis():
    from mlem_neuro.core.options import MLEMOptions

    for call in (lambda: mlem_neuro.mlem_array(object(), object(), feature_test="mantel"),
                 lambda: mlem_neuro.mlem_epochs(object(), feature_test="mantel"),
                 lambda: mlem_neuro.mlem_searchlight(object(), object(), object(),
                                                     feature_test="mantel"),
                 lambda: mlem_neuro.mlem_roi(object(), object(), object(),
                                             feature_test="mantel"),
                 lambda: mlem_neuro.mlem_stcs(object(), object(), feature_test="mantel"),
                 lambda: MLEMOptions(feature_test="mantel")):
        with pytest.raises(ValueError, match=r"feature_test must be one of \['staged', "
                                             r"'combined', 'importance', 'main_effect'\]"):
            call()


def test_every_analysis_takes_feature_test_after_null_and_documents_it():
    import inspect

    for f in (mlem_neuro.mlem_array, mlem_neuro.mlem_epochs, mlem_neuro.mlem_searchlight,
              mlem_neuro.mlem_roi, mlem_neuro.mlem_stcs):
        names = list(inspect.signature(f).parameters)
        assert names[names.index("null") + 1] == "feature_test", f.__name__
        assert inspect.signature(f).parameters["feature_test"].default == "staged"
        assert ('feature_test : {"staged", "combined", "importance", "main_effect"}'
                in f.__doc__), f.__name__


def test_command_line_flag_feature_test(capsys):
    from mlem_neuro.cli import _analysis_kwargs, build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("epochs", "searchlight"):
        p = sub.choices[command]
        actions = {s: a for a in p._actions for s in a.option_strings}
        assert actions["--feature-test"].default == "staged"
        assert actions["--feature-test"].metavar == "{staged,combined,importance,main_effect}"
    args = parser.parse_args(["epochs", "x-epo.fif", "--out", "o"])
    assert _analysis_kwargs(args)["feature_test"] == "staged"
    args = parser.parse_args(["epochs", "x-epo.fif", "--out", "o",
                              "--feature-test", "importance"])
    assert _analysis_kwargs(args)["feature_test"] == "importance"
    with pytest.raises(SystemExit):
        parser.parse_args(["epochs", "x-epo.fif", "--out", "o", "--feature-test", "mantel"])
    assert ("argument --feature-test: must be one of ['staged', 'combined', "
            "'importance', 'main_effect']; got 'mantel'") in capsys.readouterr().err


def test_plot_draws_the_main_effects_of_the_features():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(3)
    res = _timecourse(main_effect=rng.normal(size=(5, 2)))
    fig = res.plot(measure="main_effect", show=False, score=False)
    lines = fig.axes[0].get_lines()
    drawn = [ln for ln in lines if ln.get_label() in res.feature_names]
    assert len(drawn) == 2
    np.testing.assert_allclose(drawn[1].get_ydata(), res.main_effect[:, 1])
    assert "main effect" in fig.axes[0].get_ylabel()
    plt.close(fig)
    with pytest.raises(ValueError, match="measure must be one of"):
        res.plot(measure="rsa", show=False)
    with pytest.raises(ValueError, match="no main_effect"):
        _timecourse().plot(measure="main_effect", show=False)
