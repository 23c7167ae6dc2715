"""NIfTI inputs that cannot be read (truncated, corrupt, not NIfTI) and sphere memberships
too large for memory are refused with one clear error naming the parameter."""

import nibabel as nib
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro.adapters.nifti import (
    check_radius,
    load_images,
    load_mask,
    mask_coords,
    sphere_membership,
)

AFFINE = np.diag([3.0, 3.0, 3.0, 1.0])
SHAPE = (6, 6, 6)
N = 12


@pytest.fixture
def files(tmp_path):
    """A good 4D image and mask on disk, a truncated copy of each, a text file."""
    rng = np.random.default_rng(0)
    imgs = nib.Nifti1Image(rng.standard_normal(SHAPE + (N,)).astype(np.float32), AFFINE)
    mask = nib.Nifti1Image(np.ones(SHAPE, np.int8), AFFINE)
    out = {"imgs": tmp_path / "imgs.nii.gz", "mask": tmp_path / "mask.nii.gz"}
    imgs.to_filename(out["imgs"])
    mask.to_filename(out["mask"])
    for key in ("imgs", "mask"):
        data = out[key].read_bytes()
        out[f"cut_{key}"] = tmp_path / f"cut_{key}.nii.gz"
        out[f"cut_{key}"].write_bytes(data[: len(data) * 2 // 3])
    out["text"] = tmp_path / "notes.txt"
    out["text"].write_text("subject 1, run 2: fine\n")
    out["text_nii"] = tmp_path / "fake.nii"
    out["text_nii"].write_text("not an image\n" * 50)
    return out


def test_truncated_file_is_lazy_for_nibabel(files):
    """The set-up reproduces the problem: nibabel opens the cut file, fails on reading."""
    img = nib.load(files["cut_imgs"])
    assert img.shape == SHAPE + (N,)
    with pytest.raises(EOFError):
        img.get_fdata()


def test_truncated_images_named(files):
    with pytest.raises(ValueError, match=r"imgs: cannot read the image file "
                       r"'.*cut_imgs.nii.gz' \(EOFError: .*\)\. The file is truncated, "
                       r"corrupt or not a NIfTI image"):
        load_images(files["cut_imgs"])
    with pytest.raises(ValueError, match=r"imgs\[1\]: cannot read the image file "
                       r"'.*cut_mask.nii.gz'"):
        load_images([files["mask"], files["cut_mask"]])          # a list of 3D images
    # a lazily loaded nibabel image of the cut file: named by its file
    with pytest.raises(ValueError, match=r"imgs: cannot read the image read from "
                       r"'.*cut_imgs.nii.gz'"):
        load_images(nib.load(files["cut_imgs"]))
    ref = load_images(files["imgs"])
    with pytest.raises(ValueError, match=r"mask_img: cannot read the image file "
                       r"'.*cut_mask.nii.gz'"):
        load_mask(files["cut_mask"], ref)


def test_corrupt_gzip_named(files, tmp_path):
    """Bytes flipped inside the compressed stream (zlib / CRC errors)."""
    data = bytearray(files["imgs"].read_bytes())
    for k in range(len(data) // 2, len(data) // 2 + 64):
        data[k] ^= 0xFF
    bad = tmp_path / "flipped.nii.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"imgs: cannot read the image file "
                       r"'.*flipped.nii.gz'"):
        load_images(bad)


def test_text_file_as_image_named(files):
    ref = load_images(files["imgs"])
    with pytest.raises(ValueError, match=r"mask_img: cannot read the image file "
                       r"'.*notes.txt' \(ImageFileError"):
        load_mask(files["text"], ref)
    with pytest.raises(ValueError, match=r"imgs: cannot read the image file '.*fake.nii'"):
        load_images(files["text_nii"])


def test_good_files_still_load(files):
    img = load_images(files["imgs"])
    expected = nib.load(files["imgs"]).get_fdata()
    np.testing.assert_array_equal(img.get_fdata(), expected)
    assert load_mask(files["mask"], img).sum() == np.prod(SHAPE)


def test_analyses_name_the_unreadable_parameter(files):
    table = pd.DataFrame({"a": np.tile(["x", "y"], N // 2)})
    with pytest.raises(ValueError, match=r"^imgs: cannot read the image file '.*cut_imgs"):
        mlem_neuro.mlem_searchlight(files["cut_imgs"], table, files["mask"], cv=2, n_repeats=1)
    with pytest.raises(ValueError, match=r"^mask_img: cannot read .*cut_mask"):
        mlem_neuro.mlem_searchlight(files["imgs"], table, files["cut_mask"], cv=2, n_repeats=1)
    with pytest.raises(ValueError, match=r"^process_mask_img: cannot read .*notes.txt"):
        mlem_neuro.mlem_searchlight(files["imgs"], table, files["mask"],
                                    process_mask_img=files["text"], cv=2, n_repeats=1)
    with pytest.raises(ValueError, match=r"^labels_img: cannot read .*cut_mask"):
        mlem_neuro.mlem_roi(files["imgs"], table, files["cut_mask"], cv=2, n_repeats=1)


# ------------------------------------------------------------------- sphere memory
def test_check_radius_refuses_bad_values():
    for bad in (0, -3.0, np.nan, np.inf):
        with pytest.raises(ValueError, match="radius must be a positive number of "
                           "millimetres"):
            check_radius(bad)
    for bad in ("6", None, True):
        with pytest.raises(TypeError, match="radius must be a number of millimetres"):
            check_radius(bad)
    assert check_radius(6) == 6.0
    mask = np.ones((3, 3, 3), bool)
    with pytest.raises(ValueError, match="radius must be a positive"):
        sphere_membership(mask_coords(mask, AFFINE)[1], mask, AFFINE, -1.0)


def test_huge_radius_refused_before_allocation():
    """radius=1e6 mm on a 3 mm whole-brain grid: every sphere holds every voxel, 153,594
    x 153,594 entries (~790 GiB): refused at once, naming the radius."""
    mask = np.ones((53, 63, 46), bool)
    seeds = mask_coords(mask, AFFINE)[1]
    with pytest.raises(MemoryError, match=r"sphere membership for radius=1e\+06 mm "
                       r"\(153,594 spheres x up to 153,594 of the 153,594 mask voxels.*"
                       r"GiB, more than the memory budget.*use a smaller radius"):
        sphere_membership(seeds, mask, AFFINE, 1e6)


def test_sphere_memory_budget(monkeypatch):
    """The estimate follows the radius: 1,000 spheres of 1 mm voxels x ~114 voxels (3 mm)
    fit 10 MB; at 16 mm every sphere holds the whole 10 mm cube (1 M entries) and does
    not, until the budget is raised."""
    aff = np.eye(4)
    mask = np.ones((10, 10, 10), bool)
    seeds = mask_coords(mask, aff)[1]
    monkeypatch.setenv("MLEM_NEURO_MEMORY", "10MB")
    A = sphere_membership(seeds, mask, aff, 3.0)
    assert A.shape == (1000, 1000)
    assert 0 < A.nnz <= 1000 * (4 / 3 * np.pi * 27 + 1)        # the estimate is a bound
    with pytest.raises(MemoryError, match=r"radius=16 mm \(1,000 spheres x up to 1,000 of "
                       r"the 1,000 mask voxels.*MLEM_NEURO_MEMORY"):
        sphere_membership(seeds, mask, aff, 16.0)
    monkeypatch.setenv("MLEM_NEURO_MEMORY", "1GB")
    assert sphere_membership(seeds, mask, aff, 16.0).nnz == 1000 * 1000


def test_searchlight_huge_radius_refused(files, monkeypatch):
    """Through the analysis: radius=1e6 mm (216 spheres x 216 voxels x 36 bytes = 1.7 MB)
    is refused under a 1 MB budget, before any model is fitted."""
    monkeypatch.setenv("MLEM_NEURO_MEMORY", "1MB")
    table = pd.DataFrame({"a": np.tile(["x", "y"], N // 2)})
    with pytest.raises(MemoryError, match=r"sphere membership for radius=1e\+06 mm \(216 "
                       r"spheres.*use a smaller radius"):
        mlem_neuro.mlem_searchlight(files["imgs"], table, files["mask"], radius=1e6, cv=2,
                                    n_repeats=1)
