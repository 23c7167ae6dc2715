"""Time-resolved and searchlight RSA (:mod:`mlem_neuro.rsa`): exact statistics and nulls
against a direct computation, ground truth found, calibrated family-wise tests, groups,
MLEM's result containers (files, frames, plots), Epochs and images, clear errors."""
import time
import warnings

import matplotlib
import nibabel as nib
import numpy as np
import pandas as pd
import pytest
from scipy import stats
from scipy.spatial.distance import pdist

import mlem_neuro
from mlem_neuro import rsa
from mlem_neuro.results import RSABrainMapResult, RSATimeCourseResult
from mlem_neuro.utils import check_random_state

matplotlib.use("Agg")


def _spearman(x, y):
    return stats.spearmanr(x, y)[0]


def _partial(neural, models, k):
    """Partial Spearman of ``neural`` with ``models[k]``, the other models' ranks removed
    (with an intercept) from both ranks."""
    ranks = [stats.rankdata(m) for m in models]
    others = np.column_stack([np.ones(len(neural))] + [r for j, r in enumerate(ranks)
                                                       if j != k])
    def residual(v):
        return v - others @ np.linalg.lstsq(others, v, rcond=None)[0]
    return np.corrcoef(residual(stats.rankdata(neural)), residual(ranks[k]))[0, 1]


def small(seed=0, n=14, C=3, T=4):
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, C, T))
    num = rng.normal(size=n)
    num[2] = np.nan                                    # a missing value: distance 0
    table = pd.DataFrame({"cat": rng.choice(["x", "y", "z"], n), "num": num})
    data[:, 0, 2:] += 2.0 * (table["cat"] == "x").to_numpy()[:, None]
    return data, table


def direct(data, table, distance="euclidean"):
    """Spearman of every time point's RDM with every model RDM, by scipy."""
    models = [rsa.model_rdm(table[c]) for c in table.columns]
    return np.array([[_spearman(pdist(data[:, :, t], distance), m) for m in models]
                     for t in range(data.shape[2])])


# ---------------------------------------------------------------- exact statistics
@pytest.mark.parametrize("distance", ["euclidean", "correlation"])
def test_statistics_are_spearman_of_the_rdms(distance):
    data, table = small()
    res = rsa.rsa_array(data, table, scale=False, distance=distance, n_null=0)
    assert isinstance(res, RSATimeCourseResult) and res.tests is None
    np.testing.assert_allclose(res.rho, direct(data, table, distance), atol=1e-12)
    np.testing.assert_array_equal(res.rho, res.importance)
    assert np.isnan(res.score).all() and np.isnan(res.weights).all()


def test_partial_statistics_and_one_feature():
    data, table = small(1)
    table["bin"] = np.tile([0, 1], 7).astype(bool)
    res = rsa.rsa_array(data, table, scale=False, partial=True, n_null=0)
    models = [rsa.model_rdm(table[c]) for c in table.columns]
    want = [[_partial(pdist(data[:, :, t]), models, k) for k in range(3)]
            for t in range(data.shape[2])]
    np.testing.assert_allclose(res.rho, want, atol=1e-10)
    one = rsa.rsa_array(data, table[["cat"]], scale=False, partial=True, n_null=0)
    plain = rsa.rsa_array(data, table[["cat"]], scale=False, n_null=0)
    np.testing.assert_allclose(one.rho, plain.rho)


def test_one_time_point_matches_mantel_tests():
    data, table = small(2)
    res = rsa.rsa_array(data[:, :, :1], table, scale=False, n_null=0)
    mantel = rsa.mantel_tests(data[:, :, 0], table, n_null=9, random_state=0)
    np.testing.assert_allclose(res.rho[0], mantel["rho"].to_numpy(), atol=1e-12)


@pytest.mark.parametrize("partial", [False, True])
def test_nulls_are_the_direct_relabellings(partial):
    """The p-values are those of relabelling the trials' data directly (stimulus a takes
    the data of perm[a]), the same relabellings for every time point and feature, and
    the FWE p-values those of the maximum over time points."""
    data, table = small(3)
    n_null, seed = 19, 5
    res = rsa.rsa_array(data, table, scale=False, n_null=n_null, partial=partial,
                        random_state=seed)
    perms, _, _ = rsa._rsa_nulls(table, None, n_null, check_random_state(seed))
    models = [rsa.model_rdm(table[c]) for c in table.columns]

    def statistic(x):
        return np.array([[(_partial(pdist(x[:, :, t]), models, k) if partial else
                           _spearman(pdist(x[:, :, t]), models[k]))
                          for k in range(len(models))] for t in range(x.shape[2])])

    obs = statistic(data)
    null = np.stack([statistic(data[p]) for p in perms])          # (R, T, K)
    np.testing.assert_allclose(res.rho, obs, atol=1e-10)
    p = (1 + (null >= obs - 1e-9).sum(0)) / (1 + n_null)
    p_fwe = (1 + (null.max(1)[:, None] >= obs - 1e-9).sum(0)) / (1 + n_null)
    np.testing.assert_allclose(res.pvalues, p)
    np.testing.assert_allclose(res.pvalues_fwe, p_fwe)
    assert res.tests == list(table.columns)
    np.testing.assert_allclose(res.pvalues_fwe_tests,
                               mlem_neuro.stats.familywise_over_tests(p_fwe))


# ----------------------------------------------------------- ground truth, calibration
def encoded(seed=0, n=60, C=8, T=20, amp=0.8):
    """Feature "a" encoded from sample 10 on; "b" nowhere."""
    rng = np.random.default_rng(seed)
    a = rng.permutation(np.tile([0, 1], n // 2))
    b = rng.permutation(np.tile([0, 1], n // 2))
    data = rng.standard_normal((n, C, T))
    pattern = rng.standard_normal(C)
    data[:, :, 10:] += amp * a[:, None, None] * pattern[None, :, None]
    return data, pd.DataFrame({"a": a.astype(bool), "b": np.where(b, "u", "v")})


def test_an_encoded_feature_is_found_where_it_is_encoded():
    data, table = encoded(3)
    res = rsa.rsa_array(data, table, sfreq=100.0, n_null=199, random_state=0)
    sig = res.significant("a")
    assert sig[12:].all() and not sig[:10].any()
    assert not res.significant("b").any()
    assert not res.significant("a", corrected="all")[:10].any()
    df = res.to_data_frame()
    assert {"pvalue", "pvalue_fwe", "pvalue_fwe_tests"} <= set(df.columns)
    assert len(df) == 20 * 2


def test_family_wise_error_is_calibrated_on_null_data():
    """Over 100 small datasets with no effect, some time point is FWE-significant at 0.05
    in about 5 of them (binomial 99.9 % interval), and uncorrected p at one time point is
    below 0.05 about as often."""
    fwe, single = 0, 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        data = rng.standard_normal((20, 4, 6))
        table = pd.DataFrame({"a": np.tile(["x", "y"], 10)})
        res = rsa.rsa_array(data, table, n_null=99, random_state=seed)
        fwe += bool(res.pvalues_fwe[:, 0].min() < 0.05)
        single += bool(res.pvalues[0, 0] < 0.05)
    assert 0 < fwe <= 13, fwe
    assert 0 < single <= 13, single


def test_the_yardstick_is_fast():
    """120 trials x 32 channels x 40 times, 3 features, 99 nulls: well under a second on
    one core (a loose bound here: the machine is shared)."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((120, 32, 40))
    table = pd.DataFrame({"a": rng.integers(0, 2, 120).astype(bool),
                          "b": rng.choice(["p", "q", "r"], 120), "c": rng.normal(size=120)})
    rsa.rsa_array(data[:20], table[:20], n_null=9)                 # imports, first calls
    t0 = time.perf_counter()
    res = rsa.rsa_array(data, table, n_null=99, random_state=0)
    took = time.perf_counter() - t0
    assert res.pvalues.shape == (40, 3)
    assert took < 5.0, took


# ------------------------------------------------------------------------- groups
def test_groups_confine_the_relabellings_as_mlem_nulls_do():
    rng = np.random.default_rng(0)
    n = 24
    runs = np.repeat([0, 1, 2], 8)
    table = pd.DataFrame({"a": np.tile(["x", "y"], 12)})
    perms, mode, _ = rsa._rsa_nulls(table, runs, 30, rng)
    assert mode == "within"
    assert (runs[perms] == runs[None]).all()
    # the trials of an item move together (each group one feature row)
    items = np.repeat(np.arange(6), 4)
    item_table = pd.DataFrame({"a": np.where(items % 2, "x", "y")})
    perms, mode, _ = rsa._rsa_nulls(item_table, items, 30, rng)
    assert mode == "whole"
    moved = items[perms]                                           # (R, n)
    assert all(len(set(row[items == g])) == 1 for row in moved for g in range(6))
    data = rng.standard_normal((n, 3, 4))
    res = rsa.rsa_array(data, table.assign(run=runs), groups="run", n_null=19,
                        random_state=0)
    assert res.feature_names == ["a"] and res.settings["null_exchange"] == "within"
    assert res.settings["n_groups"] == 3


def test_a_feature_constant_within_every_group_is_not_testable():
    rng = np.random.default_rng(0)
    runs = np.repeat([0, 1, 2, 3], 6)
    table = pd.DataFrame({"a": np.where(runs % 2, "x", "y"), "b": np.tile(["u", "v"], 12)})
    with pytest.warns(UserWarning, match="test of 'a' cannot be run"):
        res = rsa.rsa_array(rng.standard_normal((24, 3, 4)), table, groups=runs,
                            n_null=19, random_state=0)
    assert np.isnan(res.pvalues[:, 0]).all() and np.isfinite(res.pvalues[:, 1]).all()
    assert np.isfinite(res.rho[:, 0]).all()
    assert "a" in res.untestable_tests


# ------------------------------------------------------------------ undefined cases
def test_undefined_correlations_are_nan_with_a_warning():
    data, table = small(4)
    table["one"] = "same"
    with pytest.warns(UserWarning, match="model RDM of 'one' is constant"):
        res = rsa.rsa_array(data, table, n_null=9, random_state=0)
    assert np.isnan(res.rho[:, 2]).all() and np.isnan(res.pvalues[:, 2]).all()
    assert np.isfinite(res.pvalues[:, :2]).all()
    twin = table[["cat"]].assign(copy=table["cat"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = rsa.rsa_array(data, twin, partial=True, n_null=9, random_state=0)
    said = [str(w.message) for w in caught]
    assert any("determine that of 'cat'" in m for m in said)
    assert not any("neural RDM" in m for m in said), said
    assert np.isnan(res.rho).all()
    flat = np.repeat(data[:1], len(data), axis=0)
    with pytest.warns(UserWarning, match="neural RDM of every one"):
        res = rsa.rsa_array(flat, table[["cat"]], scale=False, n_null=9, random_state=0)
    assert np.isnan(res.rho).all() and np.isnan(res.pvalues).all()


# ---------------------------------------------------------- containers, files, plots
def test_results_round_trip_and_plot(tmp_path):
    import matplotlib.pyplot as plt

    data, table = encoded(1, n=40, T=12)
    res = rsa.rsa_array(data, table, sfreq=100.0, n_null=99, partial=True,
                        random_state=0)
    path = res.save(tmp_path / "rsa.npz")
    back = mlem_neuro.read_result(path)
    assert type(back) is RSATimeCourseResult
    np.testing.assert_array_equal(back.rho, res.rho)
    np.testing.assert_array_equal(back.pvalues_fwe, res.pvalues_fwe)
    np.testing.assert_array_equal(back.times, res.times)
    assert back.tests == res.tests and back.settings["method"] == "rsa"
    assert back.settings["partial"] is True
    pd.testing.assert_frame_equal(back.to_data_frame(), res.to_data_frame())
    fig = res.plot(show=False)
    assert "RSA" in fig.axes[0].get_title() and len(fig.axes) == 1
    assert "partial" in fig.axes[0].get_ylabel()
    _, ax = plt.subplots()
    assert res.plot(terms="a", axes=ax, show=False) is ax.figure
    plt.close("all")


# ------------------------------------------------------------------------- Epochs
def test_epochs_with_metadata_match_the_array():
    import mne

    data, table = encoded(2, n=40, C=6, T=16)
    sfreq = 100.0
    info = mne.create_info([f"EEG{k:03d}" for k in range(6)], sfreq, "eeg")
    meta = table.assign(run=np.repeat([0, 1], 20))
    epochs = mne.EpochsArray(data * 1e-6, info, tmin=-0.05, metadata=meta, verbose=False)
    res = rsa.rsa_epochs(epochs, groups="run", tmin=0.0, n_null=99, random_state=0)
    assert res.feature_names == ["a", "b"]
    assert np.isclose(res.times[0], 0.0) and len(res.times) == 11
    arr = rsa.rsa_array(data[:, :, 5:], table, times=res.times, groups=meta["run"],
                        n_null=99, random_state=0)
    np.testing.assert_allclose(res.rho, arr.rho, atol=1e-10)
    np.testing.assert_array_equal(res.pvalues, arr.pvalues)
    one = rsa.rsa_epochs(epochs, features=["a"], n_null=0)
    assert one.feature_names == ["a"] and one.tests is None
    assert epochs.metadata.shape == (40, 3)                    # the caller's epochs kept


# ---------------------------------------------------------------------- searchlight
AFFINE = np.array([[3.0, 0, 0, -12], [0, 3.0, 0, -12], [0, 0, 3.0, -12], [0, 0, 0, 1]])


def images(n=40, shape=(6, 6, 6), centre=(3, 3, 3), amp=1.0, seed=0):
    """Noise; feature "a" adds a pattern inside one sphere of 6 mm; "b" nowhere."""
    rng = np.random.default_rng(seed)
    a = np.tile([0, 1], n // 2)
    b = rng.permutation(np.tile([0, 1], n // 2))
    data = rng.standard_normal(shape + (n,))
    grid = np.indices(shape).reshape(3, -1).T
    inside = (np.linalg.norm((grid - np.asarray(centre)) * 3.0, axis=1) <= 6.0)
    inside = inside.reshape(shape)
    data[inside] += amp * rng.standard_normal(shape)[inside][:, None] * a[None, :]
    table = pd.DataFrame({"a": np.where(a, "on", "off"), "b": np.where(b, "u", "v")})
    mask = nib.Nifti1Image(np.ones(shape, np.int8), AFFINE)
    process = np.zeros(shape, np.int8)
    process[1::2, 1::2, 1::2] = 1                  # 27 centres, including (3, 3, 3)
    return nib.Nifti1Image(data.astype(np.float32), AFFINE), table, mask, \
        nib.Nifti1Image(process, AFFINE)


def test_searchlight_finds_the_encoding_sphere(tmp_path):
    imgs, table, mask, process = images()
    res = rsa.rsa_searchlight(imgs, table, mask, process, radius=6.0, n_null=99,
                              random_state=0)
    assert isinstance(res, RSABrainMapResult) and res.n_models == 27
    centre = int(np.flatnonzero((res.voxel_indices == (3, 3, 3)).all(axis=1))[0])
    assert int(np.argmax(res.rho[:, 0])) == centre
    assert res.significant("a")[centre] and not res.significant("b").any()
    # the sphere's statistic is the Spearman of its voxels' RDM
    from mlem_neuro.adapters.nifti import mask_coords, sphere_membership

    _, seeds = mask_coords(np.ones((6, 6, 6), bool), AFFINE)
    A = sphere_membership(seeds[[_centre_index()]], np.ones((6, 6, 6), bool),
                          AFFINE, 6.0)
    X = imgs.get_fdata().reshape(-1, 40).T[:, A.indices]
    assert np.isclose(res.rho[centre, 0], _spearman(pdist(X), rsa.model_rdm(table["a"])))
    back = mlem_neuro.read_result(res.save(tmp_path / "sl.npz"))
    assert type(back) is RSABrainMapResult
    np.testing.assert_array_equal(back.pvalues_fwe, res.pvalues_fwe)
    assert back.importance_img("a").shape == (6, 6, 6)
    display = res.plot("a", display_mode="z", cut_coords=1)
    display.close()
    with pytest.raises(ValueError, match="no score map"):
        res.plot(None)


def _centre_index():
    """Row of voxel (3, 3, 3) in the C-order list of a full 6 x 6 x 6 mask."""
    return int(np.ravel_multi_index((3, 3, 3), (6, 6, 6)))


# -------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(distance="manhattan"), ValueError, r"distance must be one of \['euclidean', "
                                              r"'correlation', 'cosine'\] for RSA"),
    (dict(distance="crossnobis"), ValueError, r"distance must be one of"),
    (dict(n_null=-1), ValueError, r"n_null must be an int >= 0"),
    (dict(n_null=9.0), TypeError, r"n_null must be an int >= 0"),
    (dict(partial="yes"), TypeError, r"partial must be True or False"),
    (dict(n_jobs=0), ValueError, r"n_jobs must be None"),
    (dict(random_state=-1), ValueError, r"random_state must be None or an int >= 0"),
    (dict(sfreq=-1.0), ValueError, r"sfreq must be a finite number > 0"),
])
def test_bad_options_are_refused_by_the_registry(kwargs, exc, match):
    data, table = small()
    with pytest.raises(exc, match=match):
        rsa.rsa_array(data, table, **kwargs)


def test_bad_inputs():
    data, table = small()
    with pytest.raises(ValueError, match="3-D"):
        rsa.rsa_array(data[:, :, 0], table)
    with pytest.raises(ValueError, match="14 trials"):
        rsa.rsa_array(data, table[:10])
    with pytest.raises(ValueError, match="groups must hold one label per stimulus"):
        rsa.rsa_array(data, table, groups=[0, 1])
    with pytest.raises(TypeError, match="mne.Epochs"):
        rsa.rsa_epochs(data)
    imgs, itable, mask, _ = images(n=8)
    with pytest.raises(ValueError, match="mask_img is required"):
        rsa.rsa_searchlight(imgs, itable, None)
    with pytest.raises(ValueError, match="radius must be a positive number"):
        rsa.rsa_searchlight(imgs, itable, mask, radius=0)
    with pytest.raises(ValueError, match="one row per image"):
        rsa.rsa_searchlight(imgs, itable[:5], mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rsa.rsa_array(data, table, n_null=0)                # no spurious warning
