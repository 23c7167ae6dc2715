"""The group test of a feature's main effect: ``permutation_cluster_test(measure="main_effect")``
tests each subject's in-sample partial Spearman correlation of the feature's distance with
the neural distance (``result.main_effect``) above 0 across subjects.  Its rates over many
simulated groups, beside the importance and a group RSA: validation/calib_group.py."""
import warnings

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import mlem_neuro  # noqa: E402
from mlem_neuro.results import TimeCourseResult  # noqa: E402
from mlem_neuro.simulation import simulate_epochs  # noqa: E402
from mlem_neuro.stats import permutation_cluster_test, plot_clusters  # noqa: E402

WINDOW = (0.1, 0.2)
SIM = dict(n_trials=30, n_channels=6, n_times=12, sfreq=50.0, tmin=-0.04)


@pytest.fixture(scope="module")
def group():
    """8 simulated subjects, B encoded in 0.1-0.2 s (amplitude 1), A never.  The main
    effect needs no training, so the fits are kept short (it is the same at any
    ``max_steps``, ``cv`` or ``n_repeats``)."""
    out = []
    for s in range(8):
        data, table, times = simulate_epochs(windows={"A": None, "B": WINDOW}, amplitude=1.0,
                                             random_state=s, **SIM)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # a flat held-out fold, by chance
            out.append(mlem_neuro.mlem_array(data, table, times=times, n_repeats=1,
                                             max_steps=20, random_state=10**6 + s,
                                             verbose="WARNING"))
    return out


def test_main_effect_cluster_where_the_feature_is_encoded(group):
    times = group[0].times
    inside = (times >= WINDOW[0]) & (times <= WINDOW[1])
    st = permutation_cluster_test(group, "B", measure="main_effect", n_null=256,
                                  random_state=0)
    assert st.measure == "main_effect" and st.term == "B"
    k = group[0].feature_names.index("B")
    np.testing.assert_array_equal(st.data, np.stack([r.main_effect[:, k] for r in group]))
    sig = st.significant(0.05)
    # measured: one cluster, exactly the window's 5 samples, p = 0.008 (8 subjects: all
    # 256 sign flips)
    assert len(sig) == 1 and sig[0][inside].all()
    assert not sig[0][times < 0.04].any()
    # A, never encoded: no cluster (measured: no time point above the t threshold)
    assert permutation_cluster_test(group, "A", measure="main_effect", n_null=256,
                                    random_state=0).significant(0.05) == []
    fig = plot_clusters(group, "B", stats=st, show=False)
    assert "main effect" in fig.axes[0].get_ylabel() and len(fig.axes[0].patches) == 1
    plt.close(fig)


def _subject(seed, main_effect=True, terms=("a", "b", "a:b"), cv=2):
    rng = np.random.default_rng(seed)
    F, M, T = 2, 6, len(terms)
    return TimeCourseResult(rng.normal(0, 0.01, (F, M, T)), rng.uniform(0, 0.2, (F, M)),
                            rng.standard_normal((F, M, 2, 2)), np.full((F, M), 50),
                            list(terms), ["a", "b"], settings=dict(cv=cv),
                            main_effect=rng.normal(0.05, 0.02, (M, 2)) if main_effect
                            else None)


def test_main_effect_measure_refuses_interactions_missing_values_and_unknown_features():
    group = [_subject(s) for s in range(4)]
    kw = dict(measure="main_effect", n_null=8, random_state=0)
    with pytest.raises(ValueError, match="'a:b' is an interaction term.*measure='interactions'"):
        permutation_cluster_test(group, "a:b", **kw)
    with pytest.raises(ValueError, match="unknown feature 'c'"):
        permutation_cluster_test(group, "c", **kw)
    with pytest.raises(ValueError, match="name the feature"):
        permutation_cluster_test(group, **kw)
    # a result without main effects (a file saved before results kept them)
    with pytest.raises(ValueError, match=r"1 of 4 results \(e.g. result 2\) have no "
                                         r"main_effect.*rerun the analysis"):
        permutation_cluster_test(group[:2] + [_subject(9, main_effect=False)] + group[3:],
                                 "a", **kw)
    nan = _subject(5)
    nan.main_effect[2, 0] = np.nan
    with pytest.raises(ValueError, match=r"a \(main effect\) is undefined \(NaN\) in 1 "
                                         r"subject\(s\) \(e.g. result 3\).*index \[2\]"):
        permutation_cluster_test(group[:3] + [nan], "a", **kw)
    # the main effect is in sample by design: no warning about cv=None (the importance
    # of the same results warns)
    in_sample = [_subject(s, cv=None) for s in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        st = permutation_cluster_test(in_sample, "a", **kw)
    assert st.data.shape == (4, 6)
    with pytest.warns(UserWarning, match="cv=None"):
        permutation_cluster_test(in_sample, "a", n_null=8, random_state=0)
