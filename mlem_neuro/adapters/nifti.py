"""NIfTI images + masks → stimulus × voxel data and sphere / region memberships.

The searchlight and ROI analyses see the brain through two objects:

* ``X`` ``(n_stimuli, n_voxels)``: the images masked by ``mask_img`` (nilearn's
  :func:`~nilearn.masking.apply_mask`, after the mask is resampled to the images' grid with
  nearest-neighbour interpolation, as :class:`nilearn.decoding.SearchLight` does);
* ``A`` ``(n_models, n_voxels)``: a sparse 0/1 membership matrix, one row per sphere (or
  region) listing the voxels it contains.

:func:`sphere_membership` builds ``A`` with the neighbourhood rule of nilearn's
:func:`~nilearn.maskers.nifti_spheres_masker.apply_mask_and_get_affinity` (scikit-learn's
radius-neighbours graph of the voxels' world coordinates, plus the voxel nearest to each
centre); it gives the same matrix but finds the centres' voxels with array look-ups
instead of ``list.index`` scans, whose cost grows with ``n_spheres × n_voxels`` (40 s for
36,680 spheres at 3 mm, and quadratically more beyond).

:class:`~mlem_neuro.core.rdms.sources.SphereRDMSource` (re-exported here) then serves the
neural RDMs of every sphere at once, as :func:`mlem_neuro.crossval.run_cv` expects of an
*RDM source*.
"""
from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np
import scipy.sparse as sp

# the sphere/region RDM source lives in core/rdms/sources.py; imported back for old imports
from ..core.rdms.sources import BLOCK_BYTES, SphereRDMSource  # noqa: F401
from ..utils import check_real

#: peak bytes per (sphere, voxel) entry while :func:`sphere_membership` builds ``A``
#: (measured with tracemalloc: 36-58 bytes per entry for 27,000 spheres of radius 6-20 mm;
#: the finished CSR matrix holds 12: int32 index + float64 value).
SPHERE_ENTRY_BYTES = 36


def _read_errors():
    from nibabel.filebasedimages import ImageFileError
    from nibabel.spatialimages import HeaderDataError

    # gzip.BadGzipFile is an OSError; a truncated .nii.gz ends in EOFError
    return (ImageFileError, HeaderDataError, OSError, EOFError, zlib.error, ValueError,
            TypeError)


# ---------------------------------------------------------------------------- images
def _unreadable(name, source, err):
    return ValueError(
        f"{name}: cannot read the image {source} ({type(err).__name__}: {err}). The file is "
        "truncated, corrupt or not a NIfTI image: check that it was copied or downloaded "
        "completely (e.g. 'gzip -t' on a .nii.gz) and that it opens with "
        "nibabel.load(path).get_fdata(), or write it again.")


def _read_data(img, name, source):
    """``img`` with its data in memory (no-op for in-memory images).

    nibabel loads lazily, so a truncated or corrupt file only fails when its data are
    read: read them here, once, so that the error names the file and the parameter.
    """
    import nibabel as nib

    if not nib.is_proxy(img.dataobj):
        return img
    try:
        data = np.asanyarray(img.dataobj)
    except _read_errors() as err:
        raise _unreadable(name, source, err) from None
    return img.__class__(data, img.affine, img.header)


def _load(img, name, read=True):
    """Load one Niimg-like object (path or nibabel image) without checking its dimension.

    With ``read=True`` (default) the data are read into memory, so that a truncated or
    corrupt file raises a ValueError naming ``name`` and the file here rather than a
    nibabel/zlib traceback later; ``read=False`` checks the header only (for callers that
    need the shape of images they hand on unread).
    """
    import nibabel as nib
    from nilearn.image import load_img

    if isinstance(img, (str, os.PathLike)):
        source = repr(str(img))
        if not Path(img).exists():
            raise ValueError(f"{name}: no such image file {source}.")
        try:
            img = load_img(img)
        except _read_errors() as err:
            raise _unreadable(name, f"file {source}", err) from None
        return _read_data(img, name, f"file {source}") if read else img
    if isinstance(img, nib.spatialimages.SpatialImage):
        filename = img.get_filename()
        source = f"read from {filename!r}" if filename else "given (no file name)"
        return _read_data(img, name, source) if read else img
    raise TypeError(f"{name} must be a NIfTI file path or a nibabel image; got "
                    f"{type(img).__name__}.")


def _fmt_affine(affine):
    return np.array2string(np.asarray(affine)[:3], precision=3, suppress_small=True,
                           separator=", ").replace("\n", "")


def load_images(imgs, name="imgs"):
    """Check ``imgs`` (a 4D image or a list of 3D images) and return it as a 4D image.

    Every image must share one grid (shape and affine); the error names the first image
    that does not and how to fix it.

    Returns
    -------
    img : Nifti1Image
        4D, one volume per stimulus.
    """
    from nilearn.image import concat_imgs

    if isinstance(imgs, (list, tuple)):
        if len(imgs) == 0:
            raise ValueError(f"{name} is an empty list; pass one 3D image per stimulus.")
        loaded = []
        for k, img in enumerate(imgs):
            img = _squeeze_volume(_load(img, f"{name}[{k}]"))
            check_real(img.get_data_dtype(), f"{name}[{k}]")
            if img.ndim != 3:
                raise ValueError(f"{name}[{k}] has shape {img.shape}; a list of images must "
                                 "hold 3D images (one per stimulus). Pass a 4D image on its "
                                 "own, or split it with nilearn.image.iter_img.")
            loaded.append(img)
        ref = loaded[0]
        for k, img in enumerate(loaded[1:], start=1):
            if img.shape != ref.shape or not np.allclose(img.affine, ref.affine, atol=1e-4):
                raise ValueError(
                    f"{name}[{k}] has shape {img.shape} and affine {_fmt_affine(img.affine)} "
                    f"but {name}[0] has shape {ref.shape} and affine "
                    f"{_fmt_affine(ref.affine)}: all images must share one grid. Resample "
                    f"them first, e.g. nilearn.image.resample_to_img(img, {name}[0]).")
        return concat_imgs(loaded, dtype=np.float64, ensure_ndim=4, auto_resample=False)
    img = _load(imgs, name)
    check_real(img.get_data_dtype(), name)
    if img.ndim == 3:
        raise ValueError(f"{name} is a single 3D image; MLEM needs one image per stimulus "
                         "(a 4D image or a list of 3D images).")
    if img.ndim != 4:
        raise ValueError(f"{name} must be a 4D image or a list of 3D images; got an image of "
                         f"shape {img.shape}.")
    return img


def load_mask(mask_img, ref_img, name="mask_img"):
    """Binary mask on ``ref_img``'s grid (resampled with nearest neighbours if needed).

    Returns
    -------
    mask : ndarray of bool, ``ref_img.shape[:3]``
    """
    from nilearn.image import resample_to_img

    img = _check_3d(mask_img, name)
    if img.shape[:3] != ref_img.shape[:3] or not np.allclose(img.affine, ref_img.affine,
                                                             atol=1e-4):
        img = resample_to_img(img, ref_img.slicer[..., 0] if len(ref_img.shape) == 4
                              else ref_img, interpolation="nearest", force_resample=True,
                              copy_header=True)
    mask, _ = _binary(img, name)
    if not mask.any():
        raise ValueError(f"{name} selects no voxel of the images' grid (after resampling "
                         "it to the images' grid with nearest neighbours): check that the "
                         "mask and the images cover the same part of space.")
    return mask


def _squeeze_volume(img):
    """A 4D image holding a single volume, as that 3D volume (others unchanged)."""
    return img.slicer[..., 0] if img.ndim == 4 and img.shape[3] == 1 else img


def _check_3d(img, name):
    img = _squeeze_volume(_load(img, name))
    if img.ndim != 3:
        raise ValueError(f"{name} must be a 3D image; got an image of shape {img.shape}. "
                         "Pass one volume, e.g. nilearn.image.index_img(img, 0), or combine "
                         "the volumes with nilearn.masking.intersect_masks.")
    return img


def _binary(img, name):
    """nilearn's reading of a mask (two values, 0 = background), with our error names."""
    from nilearn.masking import load_mask_img

    try:
        return load_mask_img(img)
    except ValueError as err:
        if "empty" in str(err):
            raise ValueError(f"{name} is empty (all zeros): it selects no voxel. Pass a "
                             "mask with at least one non-zero voxel, e.g. "
                             "nilearn.masking.compute_brain_mask(imgs).") from None
        raise ValueError(f"{name} is not a valid binary mask: {err} Pass a 0/1 image, e.g. "
                         "nilearn.image.binarize_img(img).") from None


def mask_data(img4d, mask, name="imgs"):
    """``(n_stimuli, n_voxels)`` float64 data of the in-mask voxels (nilearn ``apply_mask``)."""
    import nibabel as nib
    from nilearn.masking import apply_mask

    mask_img = nib.Nifti1Image(mask.astype(np.int8), img4d.affine)
    X = apply_mask(img4d, mask_img, dtype=np.float64, ensure_finite=False)
    bad = ~np.isfinite(X).all(axis=0)
    if bad.any():
        ijk = np.argwhere(mask)[np.flatnonzero(bad)[0]]
        raise ValueError(f"{int(bad.sum())} in-mask voxel(s) hold NaN or infinite values in "
                         f"some of {name} (e.g. voxel {tuple(int(v) for v in ijk)}); remove "
                         "them from mask_img or fill them.")
    return np.ascontiguousarray(X)


def mask_coords(mask, affine):
    """Voxel indices ``(V, 3)`` (C order, as nilearn) and world coordinates ``(V, 3)``."""
    ijk = np.argwhere(mask)
    xyz = ijk @ np.asarray(affine)[:3, :3].T + np.asarray(affine)[:3, 3]
    return ijk, xyz


# ----------------------------------------------------------------------- memberships
def check_radius(radius):
    """``radius`` (millimetres, world coordinates) as a float, refusing non-numbers and
    non-positive or non-finite values (:data:`mlem_neuro.core.checks.CHECKS`)."""
    from ..core.checks import check

    return check("radius", radius)


def _check_sphere_memory(n_spheres, n_voxels, affine, radius):
    """Refuse, before any allocation, a sphere membership larger than the memory budget.

    Each sphere is taken to hold ``min(n_voxels, 4/3 π r³ / voxel volume + 1)`` voxels (an
    upper bound: spheres cut by the mask's edge hold fewer; 1.1-1.3x the true count for
    a cube mask, 6-20 mm); the build peaks at :data:`SPHERE_ENTRY_BYTES` per entry.
    """
    from ..core.memory import check_memory

    voxel_volume = abs(float(np.linalg.det(affine[:3, :3])))
    sphere_volume = 4.0 / 3.0 * np.pi * radius ** 3
    with np.errstate(divide="ignore", over="ignore"):
        per_sphere = min(float(n_voxels), sphere_volume / voxel_volume + 1.0)
    n_entries = n_spheres * per_sphere
    side = round(voxel_volume ** (1 / 3), 3)
    check_memory(
        int(n_entries * SPHERE_ENTRY_BYTES),
        f"the sphere membership for radius={radius:g} mm ({n_spheres:,} spheres x up to "
        f"{per_sphere:,.0f} of the {n_voxels:,} mask voxels each, voxels of ~{side:g} mm)",
        "use a smaller radius (in mm of world coordinates, e.g. radius=6.0) or fewer sphere "
        "centres (process_mask_img)")


def sphere_membership(seeds, mask, affine, radius):
    """Sparse sphere × voxel membership, nilearn's searchlight neighbourhoods.

    Sphere ``s`` holds every in-mask voxel whose centre lies within ``radius`` mm of
    ``seeds[s]`` (scikit-learn's ``radius_neighbors_graph``), plus the in-mask voxel
    nearest to the seed, exactly as
    :func:`nilearn.maskers.nifti_spheres_masker.apply_mask_and_get_affinity` builds them
    for :class:`nilearn.decoding.SearchLight`.

    Parameters
    ----------
    seeds : ndarray (S, 3)
        Sphere centres in world coordinates (mm).
    mask : ndarray of bool (3D)
        In-mask voxels (columns of the result, in ``np.argwhere`` order).
    affine : ndarray (4, 4)
        Affine of ``mask``.
    radius : float
        In mm.

    Returns
    -------
    A : scipy.sparse.csr_matrix (S, V), float64 0/1, sorted indices

    Raises
    ------
    MemoryError
        Before any allocation, when the membership would exceed the memory budget
        (:mod:`mlem_neuro.core.memory`), e.g. for a radius mistyped in micrometres.
    """
    from sklearn.neighbors import NearestNeighbors

    radius = check_radius(radius)
    seeds = np.asarray(seeds, dtype=float).reshape(-1, 3)
    affine = np.asarray(affine, dtype=float)
    _check_sphere_memory(len(seeds), int(np.count_nonzero(mask)), affine, radius)
    ijk, xyz = mask_coords(mask, affine)
    V = len(ijk)
    A = NearestNeighbors(radius=radius).fit(xyz).radius_neighbors_graph(seeds).tocsr()
    S = len(seeds)
    # voxel nearest to each seed (rounded voxel coordinates), if in the mask
    index = np.full(mask.shape, -1, dtype=np.int64)
    index[tuple(ijk.T)] = np.arange(V)
    inv = np.linalg.inv(affine)
    near = np.round(seeds @ inv[:3, :3].T + inv[:3, 3]).astype(np.int64)
    inside = np.all((near >= 0) & (near < np.array(mask.shape)), axis=1)
    col = np.full(S, -1, dtype=np.int64)
    col[inside] = index[tuple(near[inside].T)]
    rows, cols = [np.flatnonzero(col >= 0)], [col[col >= 0]]
    # nilearn also adds the first voxel whose truncated world coordinates equal the
    # seed's truncated world coordinates (a no-op for seeds on in-mask voxel centres)
    first = {}
    for v, key in enumerate(map(tuple, xyz.astype(np.int64).tolist())):
        first.setdefault(key, v)
    trunc = [first.get(key, -1) for key in map(tuple, seeds.astype(np.int64).tolist())]
    trunc = np.asarray(trunc, dtype=np.int64)
    rows.append(np.flatnonzero(trunc >= 0))
    cols.append(trunc[trunc >= 0])
    r, c = np.concatenate(rows), np.concatenate(cols)
    extra = sp.csr_matrix((np.ones(len(r)), (r, c)), shape=(S, V))
    A = (A + extra).tocsr()
    A.data[:] = 1.0
    A.sort_indices()
    return A


def region_membership(labels, mask):
    """Sparse region × voxel membership from a label volume (0 = background).

    Parameters
    ----------
    labels : ndarray (3D)
        Region label of every voxel (same grid as ``mask``).
    mask : ndarray of bool (3D)
        Voxels allowed.

    Returns
    -------
    A : csr_matrix (R, V)
        Columns are the voxels of ``mask & (labels != 0)`` in ``np.argwhere`` order.
    region_labels : ndarray (R,)
        Sorted label values of the regions with at least one voxel.
    voxel_mask : ndarray of bool (3D)
        ``mask & (labels != 0)``.
    """
    voxel_mask = mask & (labels != 0)
    lab = labels[voxel_mask]
    region_labels, code = np.unique(lab, return_inverse=True)
    V = len(lab)
    A = sp.csr_matrix((np.ones(V), (code, np.arange(V))), shape=(len(region_labels), V))
    A.sort_indices()
    return A, region_labels, voxel_mask
