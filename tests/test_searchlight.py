"""Searchlight and ROI MLEM on NIfTI images: neighbourhoods, sphere RDMs, ground truth in
space, chunk/backend invariance (dask), and clear errors on bad input."""
import warnings

import nibabel as nib
import numpy as np
import pandas as pd
import pytest
import torch

import mlem_neuro
from mlem_neuro.adapters.nifti import sphere_membership
from mlem_neuro.core.rdms.neural import rdm_from_rows
from mlem_neuro.core.rdms.sources import SphereRDMSource
from mlem_neuro.core.stimuli.pairs import pair_indices
from mlem_neuro.results import BrainMapResult

AFFINE = np.array([[3.0, 0, 0, -12], [0, 3.0, 0, -12], [0, 0, 3.0, -12], [0, 0, 0, 1]])
FAST = dict(cv=3, n_repeats=1, max_steps=200, n_permutations=5)



def simulate(n=48, shape=(8, 8, 8), centre=(4, 4, 4), radius=6.0, amp=1.0, seed=0):
    """Noise everywhere; feature "a" adds a fixed random pattern only inside one sphere;
    feature "b" is encoded nowhere."""
    rng = np.random.default_rng(seed)
    a = np.tile([0, 1], n // 2)
    b = rng.permutation(np.tile([0, 1], n // 2))
    data = rng.standard_normal(shape + (n,))
    grid = np.indices(shape).reshape(3, -1).T
    inside = (np.linalg.norm((grid - np.asarray(centre)) * 3.0, axis=1) <= radius)
    inside = inside.reshape(shape)
    pattern = rng.standard_normal(shape)
    data[inside] += amp * pattern[inside][:, None] * a[None, :]
    imgs = nib.Nifti1Image(data.astype(np.float32), AFFINE)
    table = pd.DataFrame({"a": np.where(a, "on", "off"), "b": np.where(b, "u", "v")})
    mask = nib.Nifti1Image(np.ones(shape, np.int8), AFFINE)
    process = np.zeros(shape, np.int8)
    process[::2, ::2, ::2] = 1                     # 64 centres, including the encoding one
    return imgs, table, mask, nib.Nifti1Image(process, AFFINE)


# ---------------------------------------------------------------- neighbourhoods
@pytest.mark.parametrize("radius, offset", [(6.0, 0.0), (4.0, 0.0), (1.0, 1.4), (7.5, 1.2)])
def test_sphere_membership_is_nilearns(radius, offset):
    """Same matrix as nilearn's apply_mask_and_get_affinity (the SearchLight path), also
    for centres off the voxel grid where nilearn adds the nearest in-mask voxel."""
    from nilearn.maskers.nifti_spheres_masker import apply_mask_and_get_affinity

    rng = np.random.default_rng(0)
    shape = (7, 6, 8)
    mask = rng.random(shape) < 0.6
    imgs = nib.Nifti1Image(rng.standard_normal(shape + (2,)), AFFINE)
    mask_img = nib.Nifti1Image(mask.astype(np.int8), AFFINE)
    centres = np.argwhere(mask & (rng.random(shape) < 0.5))   # nearest voxel in mask
    seeds = centres @ AFFINE[:3, :3].T + AFFINE[:3, 3] + offset
    _, A_nl = apply_mask_and_get_affinity(seeds, imgs, radius, True, mask_img=mask_img)
    A = sphere_membership(seeds, mask, AFFINE, radius)
    assert A.shape == A_nl.shape
    assert (A != A_nl.tocsr().astype(float)).nnz == 0
    assert set(np.unique(A.data)) == {1.0}


# ----------------------------------------------------------------- sphere RDMs
@pytest.mark.parametrize("metric", ["euclidean", "correlation", "cosine"])
def test_sphere_rdm_matches_dense_per_sphere(metric):
    rng = np.random.default_rng(1)
    shape = (5, 5, 5)
    mask = np.ones(shape, bool)
    seeds = np.argwhere(mask) @ AFFINE[:3, :3].T + AFFINE[:3, 3]
    A = sphere_membership(seeds, mask, AFFINE, 4.0)        # 7 voxels (fewer at edges)
    X = rng.standard_normal((12, A.shape[1])) + 3.0
    src = SphereRDMSource(X, A, metric)
    stim = np.array([0, 2, 3, 5, 7, 8, 11])
    got = src.rdm(stim, "cpu")
    assert got.dtype == torch.float64 and got.shape == (A.shape[0], 21)
    i, j = pair_indices(len(stim))
    for s in range(A.shape[0]):
        Y = torch.as_tensor(X[stim][:, A[s].indices][None])
        want = rdm_from_rows(Y, i, j, metric)[0]
        # measured max |diff| 2.2e-15 (euclidean), 4.4e-16 (correlation)
        np.testing.assert_allclose(got[s].numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
    # a subset keeps only its voxels and gives bit-identical rows
    sub = src.subset(slice(30, 45))
    assert sub.X.shape[1] == len(np.unique(A[30:45].indices)) < X.shape[1]
    assert torch.equal(sub.rdm(stim, "cpu"), got[30:45])
    pick = src.subset(np.array([3, 90, 7]))
    assert torch.equal(pick.rdm(stim, "cpu"), got[[3, 90, 7]])


def test_sphere_rdm_pair_blocks(monkeypatch):
    """Chunking the pairs (memory bound) does not change the distances."""
    from mlem_neuro.core.rdms import sources

    rng = np.random.default_rng(2)
    mask = np.ones((4, 4, 4), bool)
    seeds = np.argwhere(mask) * 3.0 - 12
    src = SphereRDMSource(rng.standard_normal((20, 64)),
                          sphere_membership(seeds, mask, AFFINE, 4.0))
    full = src.rdm(np.arange(20))
    monkeypatch.setattr(sources, "BLOCK_BYTES", 8 * 64 * 7)  # 7 pairs per block
    assert torch.equal(src.rdm(np.arange(20)), full)


# -------------------------------------------------------------- ground truth
@pytest.fixture(scope="module")
def ground_truth():
    imgs, table, mask, process = simulate()
    # term level: the interaction "a:b" has its own map (measured below)
    res = mlem_neuro.mlem_searchlight(imgs, table, mask, process, radius=6.0,
                                      level="term", random_state=0, **FAST)
    return res


def test_importance_peaks_at_the_encoding_sphere(ground_truth):
    res = ground_truth
    assert isinstance(res, BrainMapResult)
    assert res.terms == ["a", "b", "a:b"]
    assert res.importance.shape == (64, 3)
    dist = np.linalg.norm((res.voxel_indices - [4, 4, 4]) * 3.0, axis=1)
    far = dist > 12.0                                         # > 2 radii: no encoding voxel
    imp_a, imp_b, imp_ab = res.importance.T
    # Measured over simulation seeds 0-4 (n=48, cv=3, 5 permutations): the peak of "a" is
    # at the centre (0 mm) every time, peak 0.68-0.94; far from it mean |.| <= 0.018 and
    # max |.| <= 0.17 = 0.18 x peak (held-out noise: 120 pairs per fold); "b" and "a:b":
    # mean |.| <= 0.010, max |.| <= 0.15 = 0.20 x peak.
    assert dist[np.argmax(imp_a)] <= 6.0
    peak = imp_a.max()
    assert peak > 0.4
    assert abs(imp_a[far].mean()) < 0.05
    assert np.abs(imp_a[far]).max() < 0.35 * peak
    # a feature (and interaction) encoded nowhere stays ~0 everywhere
    for imp in (imp_b, imp_ab):
        assert abs(imp.mean()) < 0.05
        assert np.abs(imp).max() < 0.35 * peak
    # held-out score: high at the centre, chance far away (measured 0.56-0.68; far mean
    # |.| <= 0.02)
    assert res.score[dist == 0][0] > 0.3
    assert abs(res.score[far].mean()) < 0.05
    # the maps put those values at the centres, 0 elsewhere
    vol = res.importance_img("a").get_fdata()
    assert vol[4, 4, 4] == pytest.approx(imp_a[dist == 0][0])
    assert vol[1, 1, 1] == 0.0
    assert res.score_img.shape == (8, 8, 8)


def test_feature_level_default_peaks_at_the_encoding_sphere():
    """The default (feature level) maps one importance per feature.

    Measured over simulation seeds 0-4: the peak of "a" is at the centre every time (0.54-
    0.69); far from it mean |.| <= 0.02 and max |.| <= 0.30 x peak; "b": mean |.| <= 0.016,
    max |.| <= 0.33 x peak.
    """
    imgs, table, mask, process = simulate(seed=1)
    res = mlem_neuro.mlem_searchlight(imgs, table, mask, process, radius=6.0,
                                      random_state=0, **FAST)
    assert res.terms == ["a", "b"] and res.settings["level"] == "feature"
    dist = np.linalg.norm((res.voxel_indices - [4, 4, 4]) * 3.0, axis=1)
    far = dist > 12.0
    imp_a, imp_b = res.importance.T
    assert dist[np.argmax(imp_a)] <= 6.0 and imp_a.max() > 0.4
    assert abs(imp_a[far].mean()) < 0.05 and np.abs(imp_a[far]).max() < 0.45 * imp_a.max()
    assert abs(imp_b.mean()) < 0.05 and np.abs(imp_b).max() < 0.45 * imp_a.max()


def test_default_process_mask_is_the_mask():
    imgs, table, mask, _ = simulate(n=24, shape=(4, 4, 3))
    res = mlem_neuro.mlem_searchlight(imgs, table, mask, radius=3.0, cv=2, n_repeats=1, max_steps=5,
                                      n_permutations=1, random_state=0)
    assert res.n_models == 48
    assert np.isfinite(res.importance).all() and np.isfinite(res.score).all()
    assert res.settings["median_sphere_size"] <= 7
    frame = res.to_data_frame()
    assert len(frame) == 48 * 2                 # feature level (default): a, b
    assert list(frame.columns) == ["i", "j", "k", "x", "y", "z", "term", "importance",
                                   "importance_fold_std", "score"]


def test_list_of_3d_image_paths(tmp_path):
    imgs, table, mask, process = simulate(n=12, shape=(4, 4, 4))
    paths = []
    for k in range(12):
        p = tmp_path / f"beta_{k:02d}.nii.gz"
        nib.Nifti1Image(imgs.get_fdata()[..., k], AFFINE).to_filename(p)
        paths.append(str(p))
    kw = dict(radius=4.0, cv=None, max_steps=5, n_permutations=1, random_state=0)
    a = mlem_neuro.mlem_searchlight(paths, table, mask, process, **kw)
    b = mlem_neuro.mlem_searchlight(imgs, table, mask, process, **kw)
    np.testing.assert_allclose(a.importance, b.importance)


# ------------------------------------------------------------ chunks and dask
def test_results_do_not_depend_on_chunks_or_dask():
    """Chunks run through joblib; with joblib's dask backend on a local distributed cluster
    (2 worker processes) the maps equal the default backend's, whatever the chunking."""
    import joblib
    from distributed import Client, LocalCluster

    imgs, table, mask, process = simulate(n=24, shape=(6, 6, 6))
    kw = dict(radius=6.0, cv=3, n_repeats=1, max_steps=60, n_permutations=3, random_state=3)
    ref = mlem_neuro.mlem_searchlight(imgs, table, mask, process, **kw)
    chunked = mlem_neuro.mlem_searchlight(imgs, table, mask, process, chunk_size=5,
                                          n_jobs=1, **kw)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        with joblib.parallel_config(backend="dask"):
            dist = mlem_neuro.mlem_searchlight(imgs, table, mask, process, chunk_size=7,
                                               n_jobs=2, **kw)
        # the chunks were unpickled (hence run) in both worker processes
        ran = client.run(lambda: __import__("sys").modules.get("mlem_neuro.crossval")
                         is not None)
    assert len(ran) == 2 and all(ran.values())
    for other in (chunked, dist):
        # measured: identical to the last bit (max |diff| 0.0)
        np.testing.assert_allclose(other.fold_importance, ref.fold_importance, atol=1e-12)
        np.testing.assert_allclose(other.fold_score, ref.fold_score, atol=1e-12)
        np.testing.assert_allclose(other.fold_weights, ref.fold_weights, atol=1e-9)
        np.testing.assert_array_equal(other.n_iter, ref.n_iter)


# ------------------------------------------------------------------------ ROI
def test_roi_one_model_per_region():
    imgs, table, _, _ = simulate(n=36, shape=(8, 8, 8), amp=1.0, seed=1)
    labels = np.zeros((8, 8, 8), np.int16)
    labels[2:7, 2:7, 2:7] = 5                 # contains the encoding sphere
    labels[:2, :2, :] = 2                     # far from it
    labels[6:, :2, :2] = 9                    # outside the mask below: dropped
    labels_img = nib.Nifti1Image(labels, AFFINE)
    m = np.ones((8, 8, 8), np.int8)
    m[6:, :2, :2] = 0
    with pytest.warns(UserWarning, match=r"labels \[9\]"):
        res = mlem_neuro.mlem_roi(imgs, table, labels_img, nib.Nifti1Image(m, AFFINE),
                                  random_state=0, **FAST)
    assert res.kind == "roi" and res.region_labels == [2, 5]
    imp = dict(zip(res.region_labels, res.importance[:, 0]))
    # measured over seeds 0-4: region 5 importance of "a" 0.29-0.56, region 2 |.| <= 0.07
    assert imp[5] > 0.15 and abs(imp[2]) < 0.15
    vol = res.importance_img("a").get_fdata()
    assert np.all(vol[labels == 5] == imp[5]) and np.all(vol[labels == 0] == 0)
    frame = res.to_data_frame()
    assert list(frame.columns[:5]) == ["region", "n_voxels", "x", "y", "z"]
    assert frame.query("term == 'a'").set_index("region")["n_voxels"].to_dict() == {
        2: int((labels == 2).sum()), 5: 125}


# ------------------------------------------------------------------ bad input
@pytest.fixture(scope="module")
def small():
    return simulate(n=12, shape=(4, 4, 4))


def test_bad_images(small):
    imgs, table, mask, _ = small
    vols = [nib.Nifti1Image(imgs.get_fdata()[..., k], AFFINE) for k in range(12)]
    shifted = AFFINE.copy()
    shifted[0, 3] += 1.5
    odd_shape = vols[:5] + [nib.Nifti1Image(np.zeros((4, 4, 5)), AFFINE)] + vols[6:]
    with pytest.raises(ValueError, match=r"imgs\[5\] has shape \(4, 4, 5\).*one grid"):
        mlem_neuro.mlem_searchlight(odd_shape, table, mask)
    odd_affine = vols[:3] + [nib.Nifti1Image(vols[3].get_fdata(), shifted)] + vols[4:]
    with pytest.raises(ValueError, match=r"imgs\[3\].*affine.*resample_to_img"):
        mlem_neuro.mlem_searchlight(odd_affine, table, mask)
    with pytest.raises(ValueError, match="single 3D image"):
        mlem_neuro.mlem_searchlight(vols[0], table, mask)
    with pytest.raises(TypeError, match="NIfTI file path or a nibabel image"):
        mlem_neuro.mlem_searchlight(np.zeros((4, 4, 4, 12)), table, mask)
    with pytest.raises(ValueError, match="no such image file"):
        mlem_neuro.mlem_searchlight(["missing.nii.gz"] * 12, table, mask)


def test_table_rows_must_match_images(small):
    imgs, table, mask, _ = small
    with pytest.raises(ValueError, match="features has 11 rows but imgs holds 12 images"):
        mlem_neuro.mlem_searchlight(imgs, table.iloc[:11], mask)


def test_bad_masks(small):
    imgs, table, mask, _ = small
    empty = nib.Nifti1Image(np.zeros((4, 4, 4), np.int8), AFFINE)
    with pytest.raises(ValueError, match="mask_img is empty"):
        mlem_neuro.mlem_searchlight(imgs, table, empty)
    with pytest.raises(ValueError, match="process_mask_img is empty"):
        mlem_neuro.mlem_searchlight(imgs, table, mask, empty)
    four_d = nib.Nifti1Image(np.ones((4, 4, 4, 3), np.int8), AFFINE)
    with pytest.raises(ValueError, match=r"mask_img must be a 3D image.*\(4, 4, 4, 3\)"):
        mlem_neuro.mlem_searchlight(imgs, table, four_d)
    with pytest.raises(ValueError, match="process_mask_img must be a 3D image"):
        mlem_neuro.mlem_searchlight(imgs, table, mask, four_d)
    with pytest.raises(ValueError, match="not a valid binary mask"):
        mlem_neuro.mlem_searchlight(
            imgs, table, nib.Nifti1Image(np.arange(64, dtype=np.int16).reshape(4, 4, 4), AFFINE))
    with pytest.raises(ValueError, match="mask_img is required"):
        mlem_neuro.mlem_searchlight(imgs, table, None)
    # a mask elsewhere in space selects nothing of the images' grid
    far = AFFINE.copy()
    far[:3, 3] += 500
    with pytest.raises(ValueError, match="selects no voxel"):
        mlem_neuro.mlem_searchlight(imgs, table, nib.Nifti1Image(np.ones((4, 4, 4),
                                                                         np.int8), far))
    # centres with no mask voxel within the radius
    half = np.zeros((4, 4, 4), np.int8)
    half[:2] = 1
    with pytest.raises(ValueError, match=r"sphere centres of process_mask_img have no voxel"):
        mlem_neuro.mlem_searchlight(imgs, table, nib.Nifti1Image(half, AFFINE), mask,
                                    radius=2.0)


@pytest.mark.parametrize("radius, err", [(0, ValueError), (-3.0, ValueError),
                                         (float("nan"), ValueError), ("6", TypeError)])
def test_bad_radius(small, radius, err):
    imgs, table, mask, _ = small
    with pytest.raises(err, match="radius"):
        mlem_neuro.mlem_searchlight(imgs, table, mask, radius=radius)


def test_bad_distance_and_constant_patterns(small):
    imgs, table, mask, _ = small
    with pytest.raises(ValueError, match="distance must be one of"):
        mlem_neuro.mlem_searchlight(imgs, table, mask, distance="manhattan")
    # one-voxel spheres: the correlation across a sphere's voxels is undefined
    with pytest.raises(ValueError, match="distance='correlation' is undefined"), \
            pytest.warns(UserWarning, match="single voxel"):
        mlem_neuro.mlem_searchlight(imgs, table, mask, radius=1.0, distance="correlation")


def test_radius_below_the_voxel_size_warns(small):
    """A radius smaller than the voxels (e.g. given in cm) leaves every sphere with its
    centre voxel alone: a voxel-wise analysis, not a multivoxel one.  Warned, not refused
    (nilearn's neighbourhoods allow it); one more voxel in some sphere is silent."""
    imgs, table, mask, _ = small
    kw = dict(cv=2, n_repeats=1, max_steps=5, n_permutations=1, random_state=0)
    with pytest.warns(UserWarning, match=r"every sphere holds a single voxel.*"
                      r"radius=0\.6 mm.*voxels of 3 x 3 x 3 mm"):
        res = mlem_neuro.mlem_searchlight(imgs, table, mask, radius=0.6, **kw)
    assert res.settings["median_sphere_size"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = mlem_neuro.mlem_searchlight(imgs, table, mask, radius=3.0, **kw)
    assert res.settings["median_sphere_size"] > 1


def test_non_finite_voxels(small):
    imgs, table, mask, _ = small
    data = imgs.get_fdata().copy()                 # not the shared fixture's cache
    data[1, 2, 3, 4] = np.nan
    with pytest.raises(ValueError, match=r"NaN or infinite.*\(1, 2, 3\)"):
        mlem_neuro.mlem_searchlight(nib.Nifti1Image(data, AFFINE), table, mask)


def test_models_without_signal_warn(small):
    """Spheres / regions whose voxels hold the same value in every image (e.g. 0 outside
    the mask the betas were estimated in) have every distance 0: their Spearman
    correlation is undefined, so score and importance are NaN (never a measured 0, which a
    map could not tell from "no effect"); warned."""
    imgs, table, mask, _ = small
    kw = dict(cv=2, n_repeats=1, max_steps=5, n_permutations=1, random_state=0)
    data = imgs.get_fdata().copy()                 # not the shared fixture's cache
    data[3] = 0.0                    # the last x slab: no data, but every 3 mm sphere
    with warnings.catch_warnings():  # centred there also holds a voxel of x = 2
        warnings.simplefilter("error")
        mlem_neuro.mlem_searchlight(nib.Nifti1Image(data, AFFINE), table, mask,
                                    radius=3.0, **kw)
    data[2] = 0.0                    # now the 16 centres of x = 3 see no data
    flat = nib.Nifti1Image(data, AFFINE)
    with pytest.warns(UserWarning, match=r"16 of 64 spheres hold only voxels whose "
                      r"value is the same in every image.*e\.g\. centre voxel \(3, 0, 0\)"):
        res = mlem_neuro.mlem_searchlight(flat, table, mask, radius=3.0, **kw)
    assert np.isnan(res.score[res.voxel_indices[:, 0] == 3]).all()
    assert np.isfinite(res.score[res.voxel_indices[:, 0] < 3]).all()
    labels = nib.Nifti1Image((np.indices((4, 4, 4))[0] + 1).astype(np.int16), AFFINE)
    with pytest.warns(UserWarning, match=r"2 of 4 regions hold only voxels .*"
                      r"e\.g\. label 3"):
        mlem_neuro.mlem_roi(flat, table, labels, **kw)


def test_roi_regions_lost_on_the_images_grid_warn(small):
    """An atlas on a finer grid, or covering more space than the images, can lose regions
    when resampled to the images' grid (nearest neighbours): they are left out with a
    warning that names them, as regions outside mask_img are."""
    imgs, table, _, _ = small
    fine = AFFINE.copy()                               # 1 mm voxels, same corner
    fine[:3, :3] /= 3.0
    fine[:3, 3] -= 1.0
    labels = np.zeros((18, 12, 12), np.int16)          # x beyond the 4 x 3 mm images
    labels[:6] = 1
    labels[6:12] = 2
    labels[13:, 0, 0] = 7                              # only beyond the images' voxels
    labels[5, 5, 5] = 8                                # one 1 mm voxel between centres
    kw = dict(cv=2, n_repeats=1, max_steps=5, n_permutations=1, random_state=0)
    with pytest.warns(UserWarning, match=r"2 region\(s\) of labels_img have no voxel on "
                      r"the images' grid.*labels \[7, 8\]"):
        res = mlem_neuro.mlem_roi(imgs, table, nib.Nifti1Image(labels, fine), **kw)
    assert res.region_labels == [1, 2]


def test_roi_bad_labels(small):
    imgs, table, _, _ = small
    with pytest.raises(ValueError, match="labels_img has no region"):
        mlem_neuro.mlem_roi(imgs, table, nib.Nifti1Image(np.zeros((4, 4, 4), np.int8),
                                                         AFFINE))
    labels = np.zeros((4, 4, 4), np.int8)
    labels[0, 0, 0] = 1
    m = np.ones((4, 4, 4), np.int8)
    m[0, 0, 0] = 0
    with pytest.raises(ValueError, match="no region of labels_img has a voxel inside"):
        mlem_neuro.mlem_roi(imgs, table, nib.Nifti1Image(labels, AFFINE),
                            nib.Nifti1Image(m, AFFINE))


# ------------------------------------------------------------- standardize="run"
def _runs_table():
    imgs, table, mask, _ = simulate(n=12, shape=(4, 4, 4))   # not the shared fixture
    index = pd.MultiIndex.from_product([range(3), range(4)], names=["run", "trial"])
    return imgs, table.set_index(index), mask, index.get_level_values("run").to_numpy()


def _by_hand(imgs, runs):
    """Each voxel z-scored (ddof=1) over the images of each run, with numpy."""
    data = imgs.get_fdata()
    out = np.empty_like(data)
    for r in np.unique(runs):
        sel = runs == r
        block = data[..., sel]
        out[..., sel] = ((block - block.mean(-1, keepdims=True))
                         / block.std(-1, ddof=1, keepdims=True))
    return nib.Nifti1Image(out, imgs.affine)


@pytest.mark.parametrize("analysis", ["searchlight", "roi"])
def test_standardize_run_is_z_scoring_by_hand(analysis):
    """standardize="run" gives the same result as images z-scored within run by hand,
    with the runs from the (run, trial) index or from groups; settings record it."""
    imgs, table, mask, runs = _runs_table()
    # a run effect far larger than the images' spread: z-scoring within run removes it
    shifted = nib.Nifti1Image(imgs.get_fdata() + 50.0 * runs, imgs.affine)
    kw = dict(cv=[(np.arange(4, 12), np.arange(4)), (np.arange(8), np.arange(8, 12))],
              max_steps=20, n_permutations=2, random_state=0)
    if analysis == "searchlight":
        def fit(images, features, **extra):
            return mlem_neuro.mlem_searchlight(images, features, mask, radius=3.0,
                                               **kw, **extra)
    else:
        labels = nib.Nifti1Image((np.indices((4, 4, 4))[0] // 2 + 1).astype(np.int16),
                                 AFFINE)

        def fit(images, features, **extra):
            return mlem_neuro.mlem_roi(images, features, labels, **kw, **extra)
    expected = fit(_by_hand(shifted, runs), table.reset_index(drop=True))
    from_index = fit(shifted, table, standardize="run")
    from_groups = fit(shifted, table.reset_index(drop=True), groups=runs,
                      standardize="run")
    for res in (from_index, from_groups):
        np.testing.assert_allclose(res.fold_score, expected.fold_score, atol=1e-6)
        np.testing.assert_allclose(res.fold_importance, expected.fold_importance,
                                   atol=1e-6)
        assert res.settings["standardize"] == "run"
    assert from_index.settings["standardize_runs"] == "features index"
    assert from_groups.settings["standardize_runs"] == "groups"
    assert expected.settings["standardize"] is None
    # without it the run effect is the distance: a different fit
    raw = fit(shifted, table)
    assert not np.allclose(raw.fold_score, expected.fold_score, atol=1e-3)


def test_standardize_run_refusals():
    imgs, table, mask, runs = _runs_table()
    plain = table.reset_index(drop=True)
    with pytest.raises(ValueError, match="needs the run of each image.*groups="):
        mlem_neuro.mlem_searchlight(imgs, plain, mask, standardize="run")
    with pytest.raises(ValueError, match=r"run\(s\) \[7\] hold a single image"):
        mlem_neuro.mlem_searchlight(imgs, plain, mask, standardize="run",
                                    groups=np.r_[runs[:-1], 7])
    with pytest.raises(ValueError, match="one run label per image"):
        mlem_neuro.mlem_roi(imgs, plain, mask, standardize="run", groups=runs[:-1])
    with pytest.raises(ValueError, match="standardize must be one of 'run'"):
        mlem_neuro.mlem_roi(imgs, table, mask, standardize="auto")
    with pytest.raises(ValueError, match="True is ambiguous"):
        mlem_neuro.mlem_searchlight(imgs, table, mask, standardize=True)
    # items presented in every run: runs given as groups would also group the folds,
    # which items across runs forbid; the error points to the features' index
    item = np.tile(np.arange(4), 3)
    by_item = pd.DataFrame({"item": item, "a": item % 2, "b": item // 2})
    for analysis in (mlem_neuro.mlem_searchlight, mlem_neuro.mlem_roi):
        with pytest.raises(ValueError, match=r"disagree on groups.*standardize='run'.*"
                           r"features\.set_index\(pd\.Index\(runs, name='run'\)\)"):
            analysis(imgs, by_item, mask, items="item", groups=runs, standardize="run")


# -------------------------------------------------------------------- backgrounds
def test_native_space_maps_plot_on_the_mean_image(monkeypatch, tmp_path):
    """Images in scanner space: the result keeps their mean absolute value (before
    z-scoring, which leaves a mean of 0) and plots over it; images whose header says
    MNI152 keep nilearn's template."""
    import matplotlib.pyplot as plt
    import nilearn.plotting

    imgs, table, mask, runs = _runs_table()
    seen = []
    real = nilearn.plotting.plot_stat_map

    def spy(img, **kwargs):
        seen.append(kwargs.get("bg_img", "nilearn default"))
        return real(img, **kwargs)

    monkeypatch.setattr(nilearn.plotting, "plot_stat_map", spy)
    kw = dict(radius=3.0, cv=2, n_repeats=1, max_steps=5, n_permutations=1, random_state=0)
    native = nib.Nifti1Image(imgs.get_fdata(), AFFINE)
    native.header.set_sform(AFFINE, code="scanner")
    res = mlem_neuro.mlem_searchlight(native, table, mask, standardize="run", **kw)
    np.testing.assert_allclose(res.background, np.abs(imgs.get_fdata()).mean(-1),
                               rtol=1e-5)
    res.plot("a")
    np.testing.assert_array_equal(seen[-1].get_fdata(), res.background)
    np.testing.assert_array_equal(seen[-1].affine, AFFINE)
    back = mlem_neuro.read_result(res.save(tmp_path / "r.npz"))
    np.testing.assert_array_equal(back.background, res.background)
    back.plot(None, bg_img=None)                 # an explicit bg_img wins
    assert seen[-1] is None

    mni = nib.Nifti1Image(imgs.get_fdata(), AFFINE)
    mni.header.set_sform(AFFINE, code="mni")
    res = mlem_neuro.mlem_searchlight(mni, table, mask, **kw)
    assert res.background is None
    res.plot("a")
    assert seen[-1] == "nilearn default"
    plt.close("all")


@pytest.mark.parametrize("code", [4, 1])
def test_maps_keep_the_images_world_space(small, tmp_path, code):
    """Images in MNI152 (code 4) or scanner space (1) give maps in that space (nibabel
    writes code 2, "aligned", by default); the code survives save / read."""
    imgs, table, mask, _ = small
    src = nib.Nifti1Image(imgs.get_fdata().astype(np.float32), AFFINE)
    src.set_sform(AFFINE, code=code)
    src.set_qform(AFFINE, code=code)
    kw = dict(cv=3, n_repeats=1, max_steps=5, random_state=0)
    res = mlem_neuro.mlem_searchlight(src, table, mask, radius=3.0, **kw)
    assert res.settings["space_code"] == code
    path = tmp_path / "res.npz"
    res.save(path)
    for r in (res, mlem_neuro.read_result(path)):
        for img in (r.score_img, r.importance_img("a"), r.to_nifti(), r.mask_img):
            assert int(img.header["sform_code"]) == code
            assert int(img.header["qform_code"]) == code
            np.testing.assert_allclose(img.affine, AFFINE)
    labels = nib.Nifti1Image(np.repeat([1, 2], 32).reshape(4, 4, 4).astype(np.int16), AFFINE)
    roi = mlem_neuro.mlem_roi(src, table, labels, **kw)
    assert int(roi.score_img.header["sform_code"]) == code
