"""Group-level cluster permutation tests on importance time courses."""
import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import mlem_neuro  # noqa: E402
from mlem_neuro.results import TimeCourseResult  # noqa: E402
from mlem_neuro.stats import permutation_cluster_test, plot_clusters  # noqa: E402
from mlem_neuro.stats.timecourse import ClusterTestResult  # noqa: E402

TIMES = np.arange(-5, 25) / 100.0                       # 30 samples, 100 Hz
EFFECT = slice(12, 20)                                  # where "a" matters in every subject


def subject(seed, effect=0.3, noise=0.05, terms=("a", "b", "a:b"), times=TIMES, F=3):
    """A subject whose term "a" has importance ~effect in EFFECT; "b", "a:b" only noise."""
    rng = np.random.default_rng(seed)
    M, T = len(times), len(terms)
    imp = noise * rng.standard_normal((F, M, T))
    imp[:, EFFECT, 0] += effect
    return TimeCourseResult(imp, rng.uniform(-0.1, 0.5, (F, M)),
                            rng.standard_normal((F, M, 2, 2)), np.full((F, M), 50),
                            list(terms), ["a", "b"], times=times)


@pytest.fixture(scope="module")
def group():
    return [subject(s) for s in range(10)]


def test_cluster_found_where_the_effect_is(group):
    st = permutation_cluster_test(group, "a", n_null=512, random_state=0)
    assert isinstance(st, ClusterTestResult) and st.term == "a" and st.n_subjects == 10
    assert st.t_obs.shape == (30,) and st.data.shape == (10, 30)
    np.testing.assert_array_equal(st.times, TIMES)
    sig = st.significant(0.05)
    assert len(sig) == 1
    # the significant cluster is the effect window, exactly (noise sd 0.05 vs effect 0.3)
    expected = np.zeros(30, bool)
    expected[EFFECT] = True
    np.testing.assert_array_equal(sig[0], expected)
    # with 10 subjects the smallest possible p is 1/2**10 (all sign flips <= 512 drawn)
    assert min(st.cluster_p_values) < 0.01
    df = st.to_data_frame()
    row = df[df["p_value"] < 0.05].iloc[0]
    assert row["tstart"] == pytest.approx(TIMES[12]) and row["tstop"] == pytest.approx(TIMES[19])
    assert row["n_times"] == 8
    # the t-threshold defaults to MNE's p = 0.05 one-sided value for N - 1 = 9 dof
    assert st.threshold == pytest.approx(1.833, abs=1e-3)


def test_no_significant_cluster_for_a_null_term(group):
    st = permutation_cluster_test(group, "b", n_null=512, random_state=0)
    assert st.significant(0.05) == []
    st = permutation_cluster_test(group, "a:b", n_null=512, random_state=0)
    assert st.significant(0.05) == []


def test_score_measure_and_tail(group):
    st = permutation_cluster_test(group, measure="score", n_null=256, random_state=0)
    assert st.term == "score" and st.measure == "score"
    np.testing.assert_array_equal(st.data, np.stack([r.score for r in group]))
    # a negative effect is found with tail=-1 and not with tail=1
    neg = [subject(s, effect=-0.3) for s in range(8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")                      # no cluster is not a warning
        st = permutation_cluster_test(neg, "a", tail=1, random_state=0)
    assert st.significant() == [] and st.clusters == []
    assert len(permutation_cluster_test(neg, "a", tail=-1, random_state=0).significant()) == 1


def test_results_must_share_times_and_terms(group):
    with pytest.raises(ValueError, match="different times"):
        permutation_cluster_test(group[:3] + [subject(9, times=TIMES + 0.01)], "a")
    with pytest.raises(ValueError, match="different terms"):
        permutation_cluster_test(group[:3] + [subject(9, terms=("b", "a", "a:b"))], "a")
    with pytest.raises(ValueError, match="unknown term"):
        permutation_cluster_test(group, "c")
    with pytest.raises(ValueError, match="name the term"):
        permutation_cluster_test(group)
    with pytest.raises(ValueError, match="at least 2"):
        permutation_cluster_test(group[:1], "a")
    with pytest.raises(TypeError, match="list of TimeCourseResult"):
        permutation_cluster_test(group[0], "a")
    with pytest.raises(TypeError, match="TimeCourseResult"):
        permutation_cluster_test([group[0], "x"], "a")
    with pytest.raises(ValueError, match="measure"):
        permutation_cluster_test(group, "a", measure="auc")


def test_plot_clusters_marks_significant_windows(group):
    st = permutation_cluster_test(group, "a", n_null=256, random_state=0)
    fig = plot_clusters(group, "a", stats=st, show=False)
    ax = fig.axes[0]
    X = np.stack([r.importance[:, 0] for r in group])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), X.mean(0))
    spans = [p for p in ax.patches]                 # axvspan rectangles
    assert len(spans) == 1
    x0, x1 = spans[0].get_x(), spans[0].get_x() + spans[0].get_width()
    assert x0 == pytest.approx(TIMES[12] - 0.005) and x1 == pytest.approx(TIMES[19] + 0.005)
    assert any("p = " in t.get_text() for t in ax.texts)
    plt.close(fig)
    # no significant cluster: nothing shaded; stats computed on the fly
    fig = plot_clusters(group, "b", n_null=128, random_state=0, show=False)
    assert len(fig.axes[0].patches) == 0
    plt.close(fig)
    with pytest.raises(ValueError, match="other data"):
        plot_clusters(group, "b", stats=st, show=False)


def test_group_analysis_from_simulated_subjects_end_to_end():
    """Six simulated subjects through mlem_array: A's importance forms a significant
    cluster inside its window at the group level."""
    from mlem_neuro.time_resolved import mlem_array

    results = []
    for s in range(6):
        rng = np.random.default_rng(100 + s)
        n, C, T = 45, 6, 16
        a, c = rng.integers(0, 2, n), rng.integers(0, 2, n)
        X = rng.standard_normal((n, C, T))
        p = rng.standard_normal(C)
        X[:, :, 6:11] += 0.8 * (2 * a - 1)[:, None, None] * (p / np.linalg.norm(p)
                                                            * np.sqrt(C))[None, :, None]
        y = pd.DataFrame({"A": a.astype(bool), "C": c.astype(bool)})
        results.append(mlem_array(X, y, sfreq=100.0, cv=3, n_repeats=1, max_steps=100,
                                  random_state=s))
    st = mlem_neuro.stats.permutation_cluster_test(results, "A", random_state=0)
    sig = st.significant(0.05)
    # 6 subjects: smallest p is 1/64; measured p = 0.016 for one cluster = samples 6..10
    assert len(sig) == 1
    assert sig[0][6:11].all() and not sig[0][:5].any() and not sig[0][12:].any()
    assert st.significant(0.05) and permutation_cluster_test(
        results, "C", random_state=0).significant(0.05) == []


def test_in_sample_results_warn_that_the_group_test_is_not_valid(group):
    """Results without cross-validation (cv=None) score and permute on the training
    stimuli: scores and importances sit above 0 even on noise.  Measured: 8 noise subjects
    (mlem_array, 40 trials x 8 channels x 6 times, two binary features, max_steps=50):
    mean score 0.025 and a "significant" score cluster (p = 0.004) in-sample, against
    0.002 and no cluster with cv=3.  The group test says so instead of staying silent."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((20, 4, 5))
    feats = pd.DataFrame({"a": np.arange(20) % 2 == 0, "b": np.arange(20) % 3 == 0})
    kw = dict(sfreq=100.0, max_steps=5, n_permutations=1, random_state=0)
    in_sample = mlem_neuro.mlem_array(data, feats, cv=None, **kw)
    held_out = mlem_neuro.mlem_array(data, feats, cv=2, n_repeats=1, **kw)
    assert in_sample.score_kind == "in-sample"
    for measure in ("score", "importance"):
        with pytest.warns(UserWarning, match=r"1 of 2 results .*cv=None.*not valid"):
            permutation_cluster_test([held_out, in_sample], "a", measure=measure,
                                     n_null=4, random_state=0)
    other = mlem_neuro.mlem_array(data[::-1], feats, cv=2, n_repeats=1, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        permutation_cluster_test([held_out, other], "a", n_null=4, random_state=0)


def test_null_importance_is_centred_on_zero_across_subjects():
    """The group test flips the signs of subjects' importances, so an unencoded feature's
    importance must be centred on 0 in every subject, also when another feature shapes the
    fits. 24 simulated subjects (B encoded, A never), the defaults: A's subject means do
    not differ from 0 (measured with 3 sets of 24 subjects: mean -0.003, 0.000, -0.002,
    standard error 0.003-0.004, t-test p 0.33-1.0; 200 other subjects: +0.0005, standard
    error 0.0011), while B's are far above it. This
    catches a gross bias (a leak of training pairs into the held-out score gives
    importances of several hundredths); the group test's measured rates are on the method
    page (validation/calib_group.py)."""
    from scipy import stats

    from mlem_neuro.simulation import simulate_epochs

    a, b = [], []
    for s in range(24):
        data, table, times = simulate_epochs(n_trials=40, n_channels=8, n_times=10,
                                             sfreq=50.0, tmin=0.0,
                                             windows={"A": None, "B": (0.0, 0.2)},
                                             random_state=s)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # a flat held-out fold, by chance
            res = mlem_neuro.mlem_array(data, table, times=times, random_state=10**6 + s)
        a.append(res.importance[:, res.terms.index("A")].mean())
        b.append(res.importance[:, res.terms.index("B")].mean())
    assert stats.ttest_1samp(a, 0.0).pvalue > 0.001
    assert abs(np.mean(a)) < 0.01
    assert stats.ttest_1samp(b, 0.0, alternative="greater").pvalue < 1e-6


FOLDS = [[0, 1], [2, 3]]


def model_pair(seed, gain=0.0, times=TIMES, folds=FOLDS):
    """One subject's results with interactions (SPD) and additive ones (diagonal): their
    scores differ by ``gain`` in EFFECT plus noise."""
    rng = np.random.default_rng(seed)
    M = len(times)
    base = rng.uniform(0.0, 0.3, (2, M))
    extra = np.zeros(M)
    extra[EFFECT] = gain
    pair = []
    for constraint, score in (("spd", base + extra + 0.01 * rng.standard_normal((2, M))),
                              ("diagonal", base)):
        settings = dict(constraint=constraint, interactions=True, fold_test_indices=folds,
                        n_trials=4)
        pair.append(TimeCourseResult(np.zeros((2, M, 2)), score, np.zeros((2, M, 2, 2)),
                                     np.full((2, M), 50), ["a", "b"], ["a", "b"],
                                     settings=settings, times=times))
    return pair


def test_interactions_measure_tests_the_gain_over_additive_models():
    pairs = [model_pair(s, gain=0.05) for s in range(10)]
    full, additive = [p[0] for p in pairs], [p[1] for p in pairs]
    st = permutation_cluster_test(full, measure="interactions", additive=additive,
                                  n_null=512, random_state=0)
    assert st.term == "interactions" and st.measure == "interactions"
    np.testing.assert_allclose(st.data, np.stack([f.score - a.score
                                                  for f, a in zip(full, additive)]))
    sig = st.significant(0.05)
    expected = np.zeros(len(TIMES), bool)
    expected[EFFECT] = True
    assert len(sig) == 1 and np.array_equal(sig[0], expected)
    # no gain: no cluster (the scores themselves are far above 0)
    pairs = [model_pair(s) for s in range(10)]
    st = permutation_cluster_test([p[0] for p in pairs], measure="interactions",
                                  additive=[p[1] for p in pairs], n_null=512, random_state=0)
    assert st.significant(0.05) == []
    fig = plot_clusters(full, stats=permutation_cluster_test(
        full, measure="interactions", additive=additive, random_state=0), additive=additive,
        show=False)
    assert "additive" in fig.axes[0].get_ylabel()
    plt.close(fig)


def test_interactions_measure_checks_its_pairs():
    pairs = [model_pair(s) for s in range(4)]
    full, additive = [p[0] for p in pairs], [p[1] for p in pairs]
    kw = dict(measure="interactions", n_null=8, random_state=0)
    with pytest.raises(ValueError, match="pass additive="):
        permutation_cluster_test(full, **kw)
    with pytest.raises(ValueError, match="measure='interactions' only"):
        permutation_cluster_test(full, "a", additive=additive)
    with pytest.raises(ValueError, match="tail=1"):
        permutation_cluster_test(full, additive=additive, tail=0, **kw)
    with pytest.raises(ValueError, match="one result per subject"):
        permutation_cluster_test(full, additive=additive[:3], **kw)
    with pytest.raises(ValueError, match="additive result 0 models interactions"):
        permutation_cluster_test(full, additive=full, **kw)
    with pytest.raises(ValueError, match="result 0 has no interactions"):
        permutation_cluster_test(additive, additive=additive, **kw)
    with pytest.raises(ValueError, match="different times"):
        permutation_cluster_test(full, additive=additive[:3] + [model_pair(
            9, times=TIMES + 0.01)[1]], **kw)
    with pytest.raises(TypeError, match="additive must be a list"):
        permutation_cluster_test(full, additive=additive[0], **kw)
    # other folds: valid but noisier, and said
    refolded = additive[:3] + [model_pair(3, folds=[[0, 2], [1, 3]])[1]]
    with pytest.warns(UserWarning, match="1 of 4 subjects .*other folds"):
        permutation_cluster_test(full, additive=refolded, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        permutation_cluster_test(full, additive=additive, **kw)


def _coded_subject(seed, interaction, n_times=8, amplitude=4.0):
    """40 trials x 8 channels: three binary features coded in their own subspaces
    (simulate_codes; f0 x f1 sub-additive with ``interaction`` > 0) in the last half of
    the time points, plus unit noise; returns the analyses with and without interactions."""
    from mlem_neuro.simulation import simulate_codes

    rng = np.random.default_rng(seed)
    code, table = simulate_codes(40, ("binary",) * 3, n_units=8, noise=0.0,
                                 interaction=interaction, random_state=rng)
    rotation = np.linalg.qr(rng.standard_normal((8, 8)))[0]
    env = (np.arange(n_times) >= n_times // 2).astype(float)
    data = (amplitude * code @ rotation.T)[:, :, None] * env
    data = data + rng.standard_normal(data.shape)
    kw = dict(sfreq=100.0, cv=4, n_repeats=1, random_state=10**6 + seed, verbose="WARNING")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # a held-out fold flat in a feature
        return (mlem_neuro.mlem_array(data, table, **kw),
                mlem_neuro.mlem_array(data, table, constraint="diagonal", **kw))


@pytest.mark.parametrize("interaction", [0.0, 0.8])
def test_group_interactions_found_only_where_the_code_interacts(interaction):
    """Known truth: 8 simulated subjects whose features are coded in the last 4 of 8 time
    points, additively (interaction 0) or with f0 x f1 sub-additive (0.8: pairs differing
    in both are 0.63 apart, in one 1 apart; no additive metric orders them).  Measured
    (these seeds): the gain of the models with interactions over the additive ones in the
    coded window averages -0.007 (additive) and +0.104 (sub-additive); the cluster test
    finds the sub-additive code's window at p = 1/256 (every subject's gain positive) and
    nothing in the additive code.  The rates over many groups: method page
    (validation/calib_group_interactions.py)."""
    pairs = [_coded_subject(s, interaction) for s in range(8)]
    full, additive = [p[0] for p in pairs], [p[1] for p in pairs]
    st = permutation_cluster_test(full, measure="interactions", additive=additive, random_state=0)
    gain = st.data[:, 4:].mean()
    sig = st.significant(0.05)
    if interaction == 0:
        assert gain < 0.02 and sig == []
    else:
        assert gain > 0.04
        assert len(sig) == 1 and sig[0][4:].all() and not sig[0][:4].any()


def test_results_at_different_levels_or_with_undefined_values_are_refused(group):
    other = subject(9, terms=("a", "b"))
    mine = [subject(s, terms=("a", "b")) for s in range(3)]
    for r in mine:
        r.settings["level"] = "feature"
    other.settings["level"] = "term"
    with pytest.raises(ValueError, match="level='term' and result 0 at level='feature'"):
        permutation_cluster_test(mine + [other], "a")
    nan = subject(5, terms=("a", "b"))
    nan.settings["level"] = "feature"
    nan.fold_importance[:, 3, 0] = np.nan
    with pytest.raises(ValueError, match=r"a is undefined \(NaN\) in 1 subject\(s\) \(e.g. "
                       r"result 3\) at 1 time point\(s\) \(index \[3\]\)"):
        permutation_cluster_test(mine + [nan], "a")


def test_former_parameter_names_still_work_with_a_future_warning():
    """One name, one meaning: null counts are ``n_null`` and seeds ``random_state``
    everywhere; the cluster test's former ``n_permutations`` / ``seed`` give the same
    result for one release, with a FutureWarning."""
    group = [subject(s) for s in range(6)]
    new = permutation_cluster_test(group, "a", n_null=64, random_state=0)
    with pytest.warns(FutureWarning, match="n_permutations= is renamed n_null="):
        old = permutation_cluster_test(group, "a", n_permutations=64, random_state=0)
    with pytest.warns(FutureWarning, match="seed= is renamed random_state="):
        old_seed = permutation_cluster_test(group, "a", n_null=64, seed=0)
    for other in (old, old_seed):
        np.testing.assert_array_equal(other.H0, new.H0)
    assert new.n_null == 64 and new.n_permutations == 64
