"""BrainMapResult: images, 4D export with term names, tidy frames, plots, save/read round
trip; and the group-level helper on top of nilearn's permutation test."""
import matplotlib
import nibabel as nib
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.results import BrainMapResult, read_result
from mlem_neuro.results.brainmap import nifti_terms

matplotlib.use("Agg")
AFFINE = np.array([[2.0, 0, 0, -6], [0, 2.0, 0, -8], [0, 0, 2.0, -4], [0, 0, 0, 1]])
TERMS = ["a", "b", "a:b"]



def make_result(F=3, seed=0, kind="searchlight", importance=None, score=None,
                main_effect=None):
    rng = np.random.default_rng(seed)
    shape = (6, 7, 5)
    if kind == "searchlight":
        ijk = np.argwhere(rng.random(shape) < 0.4)
        M, extra = len(ijk), {}
    else:
        labels = rng.integers(0, 4, shape)
        ijk = np.argwhere(labels > 0)
        M = 3
        extra = dict(voxel_model=labels[labels > 0] - 1, region_labels=[10, 20, 30])
    imp = rng.normal(0, 0.1, (F, M, 3)) if importance is None else importance
    score = rng.uniform(-0.2, 0.8, (F, M)) if score is None else score
    return BrainMapResult(imp, score, rng.normal(size=(F, M, 2, 2)),
                          rng.integers(1, 100, (F, M)), TERMS, ["a", "b"],
                          dict(cv=F, radius=6.0, note="x"), affine=AFFINE, shape=shape,
                          voxel_indices=ijk, kind=kind, main_effect=main_effect, **extra)


def test_images_put_model_values_at_their_voxels():
    res = make_result()
    ijk = tuple(res.voxel_indices.T)
    img = res.importance_img("a:b")
    assert img.shape == (6, 7, 5) and np.allclose(img.affine, AFFINE)
    vol = img.get_fdata()
    np.testing.assert_array_equal(vol[ijk], res.importance[:, 2])
    outside = np.ones(vol.shape, bool)
    outside[ijk] = False
    assert (vol[outside] == 0).all()
    np.testing.assert_array_equal(res.score_img.get_fdata()[ijk], res.score)
    np.testing.assert_array_equal(res.importance_fold_std_img("b").get_fdata()[ijk],
                                  res.fold_importance[:, :, 1].std(axis=0, ddof=1))
    np.testing.assert_array_equal(res.mask_img.get_fdata()[ijk], 1)
    assert res.mask_img.get_fdata().sum() == res.n_models
    with pytest.raises(ValueError, match=r"unknown term\(s\) \['c'\]"):
        res.importance_img("c")
    with pytest.raises(TypeError, match="term must be a str"):
        res.importance_img(0)


def test_to_nifti_keeps_term_names(tmp_path):
    res = make_result()
    img = res.to_nifti()
    assert img.shape == (6, 7, 5, 3)
    for t, term in enumerate(TERMS):
        np.testing.assert_array_equal(img.get_fdata()[..., t],
                                      res.importance_img(term).get_fdata())
    assert nifti_terms(img) == TERMS
    path = tmp_path / "imp.nii.gz"
    img.to_filename(path)
    back = nib.load(path)
    assert nifti_terms(back) == TERMS and nifti_terms(str(path)) == TERMS
    assert "3 terms" in back.header["descrip"].item().decode()
    std = res.to_nifti("importance_fold_std")
    np.testing.assert_array_equal(std.get_fdata()[..., 0],
                                  res.importance_fold_std_img("a").get_fdata())
    # the old names still work, with a FutureWarning
    with pytest.warns(FutureWarning, match="importance_fold_std"):
        old = res.to_nifti("importance_std")
    np.testing.assert_array_equal(old.get_fdata(), std.get_fdata())
    with pytest.warns(FutureWarning, match="importance_fold_std_img"):
        old = res.importance_std_img("a")
    np.testing.assert_array_equal(old.get_fdata(), res.importance_fold_std_img("a").get_fdata())
    with pytest.raises(ValueError, match="no mlem_neuro term names"):
        nifti_terms(nib.Nifti1Image(np.zeros((2, 2, 2)), np.eye(4)))
    with pytest.raises(ValueError, match="what must be"):
        res.to_nifti("score")


def test_data_frames():
    res = make_result()
    df = res.to_data_frame()
    M = res.n_models
    assert list(df.columns) == ["i", "j", "k", "x", "y", "z", "term", "importance",
                                "importance_fold_std", "score"]
    assert len(df) == 3 * M
    row = df.iloc[3 * 4 + 2]                                     # model 4, term "a:b"
    assert row.term == "a:b" and row.importance == res.importance[4, 2]
    i, j, k = res.voxel_indices[4]
    assert (row.i, row.j, row.k) == (i, j, k)
    assert (row.x, row.y, row.z) == (2 * i - 6, 2 * j - 8, 2 * k - 4)

    roi = make_result(kind="roi")
    df = roi.to_data_frame()
    assert list(df.columns[:5]) == ["region", "n_voxels", "x", "y", "z"]
    first = df[df.term == "a"].set_index("region")
    counts = np.bincount(roi.voxel_model)
    assert first.n_voxels.to_dict() == {10: counts[0], 20: counts[1], 30: counts[2]}
    xyz = roi.voxel_indices[roi.voxel_model == 1] * 2.0 + [-6, -8, -4]
    np.testing.assert_allclose(first.loc[20, ["x", "y", "z"]].to_numpy(float), xyz.mean(0))
    # each region's voxels all show its value
    vol = roi.importance_img("b").get_fdata()
    for r in range(3):
        sel = tuple(roi.voxel_indices[roi.voxel_model == r].T)
        assert np.all(vol[sel] == roi.importance[r, 1])


@pytest.mark.parametrize("kind", ["searchlight", "roi"])
def test_save_read_round_trip(tmp_path, kind):
    res = make_result(kind=kind)
    path = res.save(tmp_path / "sub-01_mlem.npz")
    back = read_result(path)
    assert type(back) is BrainMapResult and back.kind == kind
    for name in ("fold_importance", "fold_score", "fold_weights", "n_iter", "affine",
                 "voxel_indices", "voxel_model"):
        np.testing.assert_array_equal(getattr(back, name), getattr(res, name))
    assert back.shape == res.shape and isinstance(back.shape[0], int)
    assert back.terms == res.terms and back.feature_names == res.feature_names
    assert back.settings == res.settings and back.region_labels == res.region_labels
    pd.testing.assert_frame_equal(back.to_data_frame(), res.to_data_frame())
    np.testing.assert_array_equal(back.to_nifti().get_fdata(), res.to_nifti().get_fdata())
    assert repr(back) == repr(res)


def test_searchlight_result_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    imgs = nib.Nifti1Image(rng.standard_normal((3, 3, 3, 12)), AFFINE)
    mask = nib.Nifti1Image(np.ones((3, 3, 3), np.int8), AFFINE)
    table = pd.DataFrame({"f": ["x", "y", "z"] * 4})
    res = mlem_neuro.mlem_searchlight(imgs, table, mask, radius=2.5, cv=2, n_repeats=1, max_steps=5,
                                      n_permutations=2, random_state=0)
    back = mlem_neuro.read_result(res.save(tmp_path / "r.npz"))
    pd.testing.assert_frame_equal(back.to_data_frame(), res.to_data_frame())
    assert back.settings == res.settings and back.settings["radius"] == 2.5


def test_plot_uses_nilearn():
    import matplotlib.pyplot as plt
    from nilearn.plotting.displays import OrthoSlicer

    res = make_result()
    display = res.plot("a", display_mode="ortho", bg_img=None, threshold=0.01)
    assert isinstance(display, OrthoSlicer)
    display = res.plot()                                         # score map
    assert isinstance(display, OrthoSlicer)
    plt.close("all")


def test_constructor_checks():
    res = make_result()
    kw = dict(affine=AFFINE, shape=(6, 7, 5), voxel_indices=res.voxel_indices)
    args = (res.fold_importance, res.fold_score, res.fold_weights, res.n_iter, TERMS,
            ["a", "b"])
    with pytest.raises(ValueError, match="voxel_model refers to models outside"):
        BrainMapResult(*args, **kw, voxel_model=np.full(len(res.voxel_indices), 10**6))
    with pytest.raises(ValueError, match="voxel_indices fall outside"):
        BrainMapResult(*args, affine=AFFINE, shape=(2, 2, 2),
                       voxel_indices=res.voxel_indices)
    with pytest.raises(ValueError, match="kind must be one of"):
        BrainMapResult(*args, **kw, kind="surface")


# ------------------------------------------------------------------- group level
# nilearn's own cluster-size map is int64 (its warning, not ours)
@pytest.mark.filterwarnings("ignore:Data array used to create a new image contains 64-bit")
def test_second_level_maps_finds_the_group_effect(tmp_path):
    from mlem_neuro.stats import second_level_maps

    n_sub, F = 8, 2
    subjects = []
    for s in range(n_sub):
        base = make_result(F=F, seed=0)          # same centres for every subject
        rng = np.random.default_rng(100 + s)
        imp = rng.normal(0, 0.05, base.fold_importance.shape)
        blob = base.voxel_indices[:, 0] <= 1     # "a" matters in x-slices 0-1 for everyone
        imp[:, blob, 0] += 0.3
        score = rng.normal(0.1, 0.05, base.fold_score.shape)
        subjects.append(make_result(F=F, seed=0, importance=imp, score=score))
    logp = second_level_maps(subjects, "a", n_null=500, random_state=0)
    vol = logp.get_fdata()
    ijk = tuple(subjects[0].voxel_indices.T)
    blob = subjects[0].voxel_indices[:, 0] <= 1
    # 8 subjects, all positive in the blob (measured FWE-corrected -log10 p = 2.0 in every
    # blob voxel; at most 0.51 elsewhere; at most 0.46 for the noise term "b")
    assert (vol[ijk][blob] > 1.3).all()
    assert (vol[ijk][~blob] < 1.3).all()
    # "b" is noise everywhere; the score maps and paths of saved results work too
    paths = [r.save(tmp_path / f"sub-{k}.npz") for k, r in enumerate(subjects)]
    assert (second_level_maps(paths, "b", n_null=200, random_state=0).get_fdata() < 1.3).all()
    out = second_level_maps(subjects, None, n_null=100, random_state=0, threshold=0.001)
    assert isinstance(out, dict) and "t" in out

    with pytest.raises(ValueError, match="has no term 'c'"):
        second_level_maps(subjects, "c")
    with pytest.raises(ValueError, match="at least 2 subjects"):
        second_level_maps(subjects[:1], "a")
    with pytest.raises(TypeError, match="list of per-subject"):
        second_level_maps(subjects[0], "a")
    moved = make_result(F=F, seed=0)
    moved.affine = moved.affine.copy()
    moved.affine[0, 3] += 10
    with pytest.raises(ValueError, match="one \\(template\\) grid"):
        second_level_maps(subjects[:3] + [moved], "a")


@pytest.mark.filterwarnings("ignore:Data array used to create a new image contains 64-bit")
def test_second_level_maps_tests_main_effects():
    from mlem_neuro.stats import second_level_maps

    base = make_result(F=2, seed=0)
    M = base.n_models
    blob = base.voxel_indices[:, 0] <= 1          # "a"'s main effect in x-slices 0-1
    subjects = []
    for s in range(8):
        me = np.random.default_rng(200 + s).normal(0, 0.05, (M, 2))
        me[blob, 0] += 0.2
        if s == 3:
            me[0, 1] = np.nan                     # undefined in one subject's sphere
        subjects.append(make_result(F=2, seed=0, main_effect=me))
    ijk = tuple(base.voxel_indices.T)
    np.testing.assert_array_equal(subjects[0].main_effect_img("a").get_fdata()[ijk],
                                  subjects[0].main_effect[:, 0])
    vol = second_level_maps(subjects, "a", measure="main_effect", n_null=500,
                            random_state=0).get_fdata()[ijk]
    assert (vol[blob] > 1.3).all() and (vol[~blob] < 1.3).all()
    vol_b = second_level_maps(subjects, "b", measure="main_effect", n_null=200,
                              random_state=0).get_fdata()
    assert np.isfinite(vol_b).all() and (vol_b < 1.3).all()
    assert vol_b[tuple(base.voxel_indices[0])] == 0        # left out of the mask

    with pytest.raises(ValueError, match="must be one of the features"):
        second_level_maps(subjects, "a:b", measure="main_effect")
    with pytest.raises(ValueError, match="measure must be one of"):
        second_level_maps(subjects, "a", measure="score")
    with pytest.raises(ValueError, match="additive is used with term='interactions' only"):
        second_level_maps(subjects, "a", measure="main_effect", additive=subjects)
    with pytest.raises(ValueError, match="have no main_effect"):
        second_level_maps(subjects[:3] + [make_result(F=2, seed=0)], "a",
                          measure="main_effect")
    with pytest.raises(ValueError, match="main effects are per feature"):
        subjects[0].main_effect_img("a:b")


@pytest.mark.filterwarnings("ignore:Data array used to create a new image contains 64-bit")
def test_second_level_maps_tests_interactions_on_the_gain_over_additive_maps(tmp_path):
    from mlem_neuro.stats import second_level_maps

    def pair(s, gain):
        rng = np.random.default_rng(200 + s)
        base = make_result(F=2, seed=0)
        score = rng.uniform(0.0, 0.5, base.fold_score.shape)
        extra = np.zeros_like(score)
        extra[:, base.voxel_indices[:, 0] <= 1] = gain   # x-slices 0-1 for everyone
        out = []
        for constraint, sc in (("spd", score + extra + rng.normal(0, 0.01, score.shape)),
                               ("diagonal", score)):
            r = make_result(F=2, seed=0, score=sc)
            r.settings.update(constraint=constraint, interactions=True,
                              fold_test_indices=[[0, 1], [2, 3]], n_trials=4)
            out.append(r)
        return out

    pairs = [pair(s, 0.05) for s in range(8)]
    full, additive = [p[0] for p in pairs], [p[1] for p in pairs]
    vol = second_level_maps(full, "interactions", additive=additive, n_null=500,
                            random_state=0).get_fdata()
    ijk = tuple(full[0].voxel_indices.T)
    blob = full[0].voxel_indices[:, 0] <= 1
    # every subject gains 0.05 in the blob (noise 0.01): FWE p = 1/256 there
    assert (vol[ijk][blob] > 1.3).all() and (vol[ijk][~blob] < 1.3).all()
    # the scores alone are far above 0 everywhere: without a gain, nothing
    flat = [pair(s, 0.0) for s in range(8)]
    assert (second_level_maps([p[0] for p in flat], "interactions",
                              additive=[p[1] for p in flat], n_perm=200,
                              random_state=0).get_fdata() < 1.3).all()
    paths = [r.save(tmp_path / f"add-{k}.npz") for k, r in enumerate(additive)]
    np.testing.assert_allclose(second_level_maps(full, "interactions", additive=paths,
                                                 n_perm=100, random_state=0).get_fdata(),
                               second_level_maps(full, "interactions", additive=additive,
                                                 n_perm=100, random_state=0).get_fdata())
    with pytest.raises(ValueError, match="pass additive="):
        second_level_maps(full, "interactions")
    with pytest.raises(ValueError, match="term='interactions' only"):
        second_level_maps(full, "a", additive=additive)
    with pytest.raises(ValueError, match="one-sided"):
        second_level_maps(full, "interactions", additive=additive, two_sided_test=True)
    with pytest.raises(ValueError, match="models interactions"):
        second_level_maps(full, "interactions", additive=full)
    with pytest.raises(ValueError, match="other voxels or models"):
        other = make_result(F=2, seed=1)
        other.settings.update(constraint="diagonal")
        second_level_maps(full, "interactions", additive=additive[:7] + [other])
