"""Searchlight and ROI MLEM on NIfTI images: one importance map per feature and interaction.

Images (one per stimulus) are masked with nilearn, sphere (or region) memberships form a
sparse matrix ``A`` (:mod:`mlem_neuro.adapters.nifti`), and
:class:`~mlem_neuro.core.rdms.sources.SphereRDMSource` computes the neural RDMs of all spheres
at once from sparse products.  The shared driver :func:`mlem_neuro.crossval.run_cv` then
trains the spheres as batched stacks in memory-bounded chunks, dispatched through joblib
(so ``joblib.parallel_config(backend="dask")`` spreads them over a ``dask.distributed``
cluster), and the output is wrapped in a :class:`~mlem_neuro.results.BrainMapResult`.
"""
from __future__ import annotations

import numpy as np

from ._docs import fill_doc
from .adapters.nifti import (
    _binary,
    _check_3d,
    check_radius,
    load_images,
    load_mask,
    mask_coords,
    mask_data,
    region_membership,
    sphere_membership,
)
from .core.options import CROSSVALIDATED_DISTANCES, MLEMOptions
from .core.rdms.sources import CondensedRDMSource, SphereRDMSource
from .core.stimuli.features import as_feature_table
from .crossval import result_settings, result_tests
from .fmri import check_standardize, zscore_runs
from .inference import run_analysis
from .items import check_items, check_partitions, trial_partitions
from .results.brainmap import BrainMapResult
from .utils import logger, normalise_magnitude, verbose

__all__ = ["mlem_roi", "mlem_searchlight"]


def _standardize_runs(standardize, features, groups):
    """Run labels for ``standardize="run"`` and where they come from (``None, None``
    without standardisation)."""
    import pandas as pd

    index = getattr(features, "index", None)
    trial_index = isinstance(index, pd.Index) and "run" in index.names
    if trial_index and "trial" in index.names and not index.is_monotonic_increasing:
        # trial_images returns the images and the table in (run, trial) order
        raise ValueError(
            "the features' (run, trial) index is out of order: the table was reordered "
            "(e.g. by sort_values) after trial_images returned it, but its rows are matched "
            "to the images by position (and standardize='run' reads the runs from it). "
            "Pass the table in the images' order (features.sort_index()).")
    if check_standardize(standardize) is None:
        return None, None
    if trial_index:
        return index.get_level_values("run").to_numpy(), "features index"
    if groups is not None:
        return np.asarray(groups), "groups"
    raise ValueError("standardize='run' needs the run of each image: pass the feature "
                     "table returned by mlem_neuro.fmri.trial_images (its (run, trial) "
                     "index names the runs), or groups=<run label of each image>.")


def _standardize(X, runs, runs_from):
    """``X`` (images x voxels) z-scored within run when ``runs`` is given."""
    if runs is None:
        return X
    logger.info("standardize='run': each voxel z-scored across the images of each of %d "
                "runs (runs from the %s)", len(np.unique(runs)), runs_from)
    return zscore_runs(X, runs)


#: NIfTI sform/qform codes of standard spaces (Talairach, MNI152, other template)
_TEMPLATE_CODES = (3, 4, 5)


def space_code(img4d):
    """The NIfTI code of the images' world space (the sform's, else the qform's; ``0``
    when neither is set), which the result's images keep (e.g. 4, MNI152)."""
    return int(img4d.header["sform_code"]) or int(img4d.header["qform_code"])


def mean_background(img4d, shape, affine):
    """Mean absolute value of the images (before any standardisation) on the map grid,
    the default background of native-space maps; ``None`` for images in a standard
    space (their header's sform or qform code says Talairach, MNI152 or template), where
    nilearn's MNI template is the right background.

    For positive images (BOLD volumes) this is their mean image; betas average to about
    0 (exactly 0 once z-scored within run), but their mean absolute value still draws
    the brain they were estimated in.
    """
    import nibabel as nib

    codes = (int(img4d.header["sform_code"]), int(img4d.header["qform_code"]))
    if any(code in _TEMPLATE_CODES for code in codes):
        return None
    from nilearn.image import resample_img

    data = np.asanyarray(img4d.dataobj)
    total = np.zeros(data.shape[:3])
    for k in range(data.shape[3]):            # one volume at a time: no 4D copy
        total += np.abs(np.nan_to_num(data[..., k].astype(np.float64)))
    mean = nib.Nifti1Image(total / data.shape[3], img4d.affine)
    if mean.shape != tuple(shape) or not np.allclose(mean.affine, affine, atol=1e-4):
        mean = resample_img(mean, target_affine=affine, target_shape=tuple(shape),
                            force_resample=True, copy_header=True)
    return np.asarray(mean.dataobj, dtype=np.float32)


def _warn_single_voxels(sizes, radius, affine):
    """Warn when no sphere holds more than its centre voxel (a voxel-wise analysis)."""
    if sizes.max() > 1:
        return
    import warnings

    side = " x ".join(f"{v:.3g}" for v in np.linalg.norm(np.asarray(affine)[:3, :3],
                                                          axis=0))
    warnings.warn(f"every sphere holds a single voxel (radius={radius:g} mm, voxels of "
                  f"{side} mm): the distances are those of one voxel's values, not of "
                  "multivoxel patterns. radius is in mm of world coordinates: increase it "
                  "(e.g. radius=6.0) for a multivoxel searchlight.", UserWarning,
                  stacklevel=4)


def _warn_flat_models(X, A, what, name):
    """Warn about the models (rows of ``A``) whose voxels all hold one value in every
    image (columns of ``X`` constant): every distance 0, score and importance 0 by
    convention, indistinguishable on a map from a measured 0.  ``name(k)`` says which
    model ``k`` is."""
    varying = (np.ptp(X, axis=0) > 0).astype(np.float64)
    flat = np.flatnonzero(A @ varying == 0)
    if not len(flat):
        return
    import warnings

    warnings.warn(f"{len(flat)} of {A.shape[0]} {what} hold only voxels whose value is the "
                  f"same in every image (e.g. {name(flat[0])}): all their distances are 0, "
                  "so their score, importance and p-values are NaN (undefined). "
                  "Restrict mask_img to the voxels that hold data (e.g. the mask the "
                  "betas were estimated in).", UserWarning, stacklevel=4)


def spheres(img4d, mask, process_mask_img, radius, runs, runs_from):
    """The searchlight's spheres and patterns, shared by :func:`mlem_searchlight` and
    :func:`mlem_neuro.rsa.rsa_searchlight`: ``(centres mask, its affine, centre voxels,
    sphere membership A (centres x mask voxels, CSR), X (images x mask voxels,
    standardised per run when asked))``, with an error for a centre without a mask
    voxel in its sphere and warnings for single-voxel spheres and flat models."""
    if process_mask_img is None:
        centres_mask, centres_affine = mask, img4d.affine
    else:
        pimg = _check_3d(process_mask_img, "process_mask_img")
        centres_mask, centres_affine = _binary(pimg, "process_mask_img")
    centre_ijk, seeds = mask_coords(centres_mask, centres_affine)
    A = sphere_membership(seeds, mask, img4d.affine, radius)
    sizes = np.diff(A.indptr)
    if (sizes == 0).any():
        bad = np.flatnonzero(sizes == 0)
        raise ValueError(
            f"{len(bad)} of {len(sizes)} sphere centres of process_mask_img have no voxel "
            f"of mask_img within radius={radius} mm (e.g. centre voxel "
            f"{tuple(int(v) for v in centre_ijk[bad[0]])}); restrict process_mask_img to "
            "the mask (nilearn.masking.intersect_masks) or increase radius.")
    _warn_single_voxels(sizes, radius, img4d.affine)
    X = _standardize(mask_data(img4d, mask), runs, runs_from)
    _warn_flat_models(X, A, "spheres",
                      lambda k: f"centre voxel {tuple(int(v) for v in centre_ijk[k])}")
    return centres_mask, centres_affine, centre_ijk, A, X


def _prepare(imgs, features, mask_img, items, groups, name="mask_img", partitions=None,
             distance="euclidean", runs_from=None):
    img4d = load_images(imgs)
    n = img4d.shape[3]
    table = as_feature_table(features, name="features")
    if len(table) != n:
        raise ValueError(f"features has {len(table)} rows but imgs holds {n} images; the "
                         "table needs one row per image, in the same order.")
    items = check_items(items, n, table)
    partitions, part_col = check_partitions(partitions, distance, items, n, table)
    if part_col is not None:
        table = table.drop(columns=part_col)       # an identifier, not a feature
    if items is not None:          # checked before any image is masked
        table = items.reduce_table(items.drop_from(table))
        try:
            groups = items.reduce_groups(groups)
        except ValueError as err:
            if runs_from != "groups":
                raise
            raise ValueError(
                f"{err} To z-score within run (standardize='run') without grouping the "
                "folds by run, give the runs in the features' index instead of groups: "
                "features.set_index(pd.Index(runs, name='run')).") from None
    mask = load_mask(mask_img, img4d, name) if mask_img is not None else None
    return img4d, table, mask, items, groups, partitions, part_col


def _image_source(X, A, items, partitions, options):
    """The source of the spheres / regions ``A`` over the images ``X`` (rows: trials),
    and the settings it adds: the items' mean images, or their cross-validated
    distances (crossnobis: each sphere / region whitened by its own Ledoit-Wolf noise
    covariance).  Extreme magnitudes are rescaled first, exactly
    (:func:`~mlem_neuro.utils.normalise_magnitude`)."""
    X = normalise_magnitude(X, "images")
    if options.distance in CROSSVALIDATED_DISTANCES:
        from .core.rdms.crossdist import (
            crossnobis_membership,
            crossval_sq_distances_membership,
        )

        partitions = trial_partitions(partitions, items, options.distance,
                                      options.random_state)
        K = int(len(np.unique(partitions)))
        logger.info("%s distances between %d items from %d partitions of their images%s",
                    options.distance, items.n_items, K,
                    " (Ledoit-Wolf noise covariance per sphere / region)"
                    if options.distance == "crossnobis" else "")
        if options.distance == "crossnobis":
            d2 = crossnobis_membership(X, A, items.inverse_, partitions)
        else:
            d2 = crossval_sq_distances_membership(X, A, items.inverse_, partitions)
        return CondensedRDMSource(d2), dict(items.settings(), n_partitions=K)
    X, extra = _average_items(X, items)
    source = SphereRDMSource(X, A, options.distance)
    source.check_patterns()
    return source, extra


def _average_items(X, items):
    """The items' mean images (rows of the masked data) and the items' settings."""
    if items is None:
        return X, {}
    return items.average(X), items.settings()


@verbose
@fill_doc
def mlem_searchlight(imgs, features, mask_img, process_mask_img=None, radius=6.0, *,
                     groups=None, items=None, partitions=None, cv=2, n_repeats="auto",
                     standardize=None,
                     n_permutations=10, n_null=0,
                     null="conditional", feature_test="staged", held_out_pairs="auto",
                     level="feature", constraint="spd",
                     interactions=True,
                     feature_kinds=None, feature_groups=None, missing_distance=0.0,
                     distance="euclidean", max_steps=1000, patience="auto", lr="auto", tol=1e-4,
                     batch_size="auto", numeric_levels="auto", chunk_size=None, n_jobs=None,
                     device="cpu", backend="auto",
                     random_state=None, verbose=None):
    """Searchlight MLEM: importance maps of every feature.

    Around each centre voxel, the images' patterns within a sphere of ``radius`` mm give
    the neural distances between stimuli; one cross-validated MLEM model per sphere learns
    the metric over the feature distances, and the permutation importance of each feature
    (or, with ``level="term"``, of each term) on held-out pairs is mapped at the sphere's
    centre.

    Parameters
    ----------
    %(imgs)s
    %(features_images)s
    %(mask_img)s
    process_mask_img : 3D image | None
        Voxels used as sphere centres (nilearn's ``process_mask_img``; its own grid gives
        the grid of the maps).  Default: every voxel of ``mask_img``.
    %(radius)s
    %(groups_images)s
    %(items)s
    %(partitions)s
    %(cv_images)s
    %(n_repeats)s
    %(standardize_images)s
    %(n_permutations)s
    %(n_null)s
    %(null)s
    %(feature_test)s
    %(held_out_pairs)s
    %(level)s
    %(constraint)s
    %(interactions)s
    %(feature_kinds)s
    %(feature_groups)s
    %(missing_distance)s
    %(distance_images)s
    %(max_steps)s
    %(patience)s
    %(lr)s
    %(tol)s
    %(batch_size)s
    %(numeric_levels)s
    %(chunk_size_spheres)s
    %(n_jobs)s
    %(device)s
    %(backend)s
    %(random_state)s
    %(verbose)s

    Returns
    -------
    result : BrainMapResult
        ``importance_img(term)``, ``score_img``, ``to_nifti()``, ``to_data_frame()``,
        ``plot(term)``, ``save``.

    Notes
    -----
    Every sphere is a model of the batched engine: spheres are trained as stacks in
    chunks (``chunk_size``) dispatched with joblib, and the sphere RDMs come from one
    sparse product per block of pairs (no loop over spheres).  Training pairs are formed
    within the training images of each fold, scores and importances within the held-out
    images.

    Examples
    --------
    >>> import mlem_neuro
    >>> imgs, table = mlem_neuro.fmri.trial_images(runs, events, t_r=2.0,
    ...                                            mask_img=mask)       # doctest: +SKIP
    >>> res = mlem_neuro.mlem_searchlight(imgs, table[["category", "animate"]], mask,
    ...                                   radius=6.0, n_jobs=4,
    ...                                   random_state=0)                # doctest: +SKIP
    >>> res.plot("category")                                            # doctest: +SKIP
    >>> res.to_nifti().to_filename("sub-01_importance.nii.gz")          # doctest: +SKIP
    """
    options = MLEMOptions.from_call(locals())
    radius = check_radius(radius)
    if mask_img is None:
        raise ValueError("mask_img is required: pass a brain mask, e.g. "
                         "nilearn.masking.compute_brain_mask(imgs), so that only brain "
                         "voxels enter the spheres.")
    runs, runs_from = _standardize_runs(standardize, features, groups)
    img4d, table, mask, items, groups, partitions, part_col = _prepare(
        imgs, features, mask_img, items, groups, partitions=partitions,
        distance=options.distance, runs_from=runs_from)
    centres_mask, centres_affine, centre_ijk, A, X = spheres(
        img4d, mask, process_mask_img, radius, runs, runs_from)
    sizes = np.diff(A.indptr)
    logger.info("MLEM searchlight: %d images, %d voxels in mask, %d spheres of %d voxels "
                "(median; %d-%d)", X.shape[0], X.shape[1], len(sizes), int(np.median(sizes)),
                sizes.min(), sizes.max())
    source, item_settings = _image_source(X, A, items, partitions, options)
    out = run_analysis(source, table, options, groups=groups, desc="spheres")
    settings = result_settings(options, out, groups, analysis="searchlight", radius=radius,
                               n_images=img4d.shape[3], n_mask_voxels=X.shape[1],
                               median_sphere_size=float(np.median(sizes)),
                               standardize=runs_from and "run", standardize_runs=runs_from,
                               partitions=part_col, space_code=space_code(img4d),
                               **item_settings)
    return BrainMapResult(out.importance, out.score, out.W, out.n_iter, out.terms,
                          out.feature_names, settings, affine=centres_affine,
                          shape=centres_mask.shape, voxel_indices=centre_ijk,
                          kind="searchlight",
                          background=mean_background(img4d, centres_mask.shape,
                                                     centres_affine),
                          **result_tests(out))


@verbose
@fill_doc
def mlem_roi(imgs, features, labels_img, mask_img=None, *, groups=None, items=None,
             partitions=None, cv=2, n_repeats="auto", standardize=None, n_permutations=10, n_null=0,
             null="conditional", feature_test="staged", held_out_pairs="auto",
             level="feature",
             constraint="spd", interactions=True, feature_kinds=None, feature_groups=None,
             missing_distance=0.0, distance="euclidean", max_steps=1000, patience="auto", lr="auto",
             tol=1e-4, batch_size="auto", numeric_levels="auto", chunk_size=None, n_jobs=None,
             device="cpu", backend="auto",
             random_state=None, verbose=None):
    """ROI MLEM: one cross-validated model per region of an atlas.

    Each non-zero label of ``labels_img`` is a region; the patterns of its voxels give the
    neural distances of one MLEM model.  The result is a :class:`BrainMapResult` with
    ``kind="roi"``: its images paint each region's values over the region's voxels, and
    ``to_data_frame()`` has one row per (region, term) with the region label, its number of
    voxels and its centroid.

    Parameters
    ----------
    %(imgs)s
    %(features_images)s
    labels_img : 3D image
        Integer atlas (0 = background), resampled to the images' grid with nearest
        neighbours when needed (a deterministic atlas, as for
        :class:`nilearn.maskers.NiftiLabelsMasker`).  Regions left without a voxel on
        that grid (outside the images, or smaller than their voxels) are dropped with a
        warning.
    mask_img : 3D image | None
        Restrict the regions to these voxels.  Regions left without voxels are dropped
        with a warning.
    %(groups_images)s
    %(items)s
    %(partitions)s
    %(cv_images)s
    %(n_repeats)s
    %(standardize_images)s
    %(n_permutations)s
    %(n_null)s
    %(null)s
    %(feature_test)s
    %(held_out_pairs)s
    %(level)s
    %(constraint)s
    %(interactions)s
    %(feature_kinds)s
    %(feature_groups)s
    %(missing_distance)s
    %(distance_images)s
    %(max_steps)s
    %(patience)s
    %(lr)s
    %(tol)s
    %(batch_size)s
    %(numeric_levels)s
    %(chunk_size_spheres)s
    %(n_jobs)s
    %(device)s
    %(backend)s
    %(random_state)s
    %(verbose)s

    Returns
    -------
    result : BrainMapResult
        ``kind="roi"``, ``region_labels`` the atlas label of each model.

    Examples
    --------
    >>> from nilearn import datasets                                     # doctest: +SKIP
    >>> atlas = datasets.fetch_atlas_harvard_oxford("cort-maxprob-thr25-2mm")  # doctest: +SKIP
    >>> res = mlem_neuro.mlem_roi(imgs, table, atlas.maps, random_state=0)     # doctest: +SKIP
    >>> res.to_data_frame().pivot(index="region", columns="term",
    ...                           values="importance")                 # doctest: +SKIP
    """
    from nilearn.image import resample_to_img

    options = MLEMOptions.from_call(locals())
    runs, runs_from = _standardize_runs(standardize, features, groups)
    img4d, table, mask, items, groups, partitions, part_col = _prepare(
        imgs, features, mask_img, items, groups, partitions=partitions,
        distance=options.distance, runs_from=runs_from)
    limg = _check_3d(labels_img, "labels_img")
    given = np.unique(np.asarray(limg.dataobj))
    fractional = given[np.isfinite(given) & (given != np.round(given))]
    if len(fractional):
        raise ValueError(
            f"labels_img holds {len(fractional)} non-integer values (e.g. "
            f"{fractional[:3].tolist()}): it looks like a continuous map (a statistic, a "
            "probability), not an atlas of integer labels, and every distinct value would "
            "become a region. Threshold it into labels first (e.g. "
            "nilearn.image.math_img('(img > 0.5) * 1', img=...)).")
    if limg.shape != img4d.shape[:3] or not np.allclose(limg.affine, img4d.affine, atol=1e-4):
        limg = resample_to_img(limg, img4d.slicer[..., 0], interpolation="nearest",
                               force_resample=True, copy_header=True)
    labels = np.asarray(limg.dataobj)
    if not np.isfinite(labels).all():
        raise ValueError("labels_img holds NaN or infinite values; use 0 for background.")
    if mask is None:
        mask = np.ones(labels.shape, dtype=bool)
    all_labels = np.unique(labels[labels != 0])
    if len(all_labels) == 0:
        raise ValueError("labels_img has no region: every voxel is 0 (background) on the "
                         "images' grid.")
    off_grid = np.setdiff1d(given[np.isfinite(given) & (given != 0)], all_labels)
    if len(off_grid):
        import warnings

        warnings.warn(f"{len(off_grid)} region(s) of labels_img have no voxel on the images' "
                      "grid (after nearest-neighbour resampling: outside the images' field "
                      "of view, or smaller than their voxels) and are left out: labels "
                      f"{[v.item() for v in off_grid]}", UserWarning, stacklevel=3)
    A, region_labels, voxel_mask = region_membership(labels, mask)
    lost = np.setdiff1d(all_labels, region_labels)
    if len(region_labels) == 0:
        raise ValueError("no region of labels_img has a voxel inside mask_img.")
    if len(lost):
        import warnings

        warnings.warn(f"{len(lost)} region(s) of labels_img have no voxel inside mask_img and "
                      f"are left out: labels {lost.tolist()}", UserWarning, stacklevel=3)
    X = _standardize(mask_data(img4d, voxel_mask), runs, runs_from)
    _warn_flat_models(X, A, "regions", lambda k: f"label {region_labels[k]:g}")
    logger.info("MLEM ROI: %d images, %d regions, %d voxels", X.shape[0], A.shape[0],
                X.shape[1])
    source, item_settings = _image_source(X, A, items, partitions, options)
    out = run_analysis(source, table, options, groups=groups, desc="regions")
    settings = result_settings(options, out, groups, analysis="roi",
                               n_images=img4d.shape[3], n_mask_voxels=X.shape[1],
                               standardize=runs_from and "run", standardize_runs=runs_from,
                               partitions=part_col, space_code=space_code(img4d),
                               **item_settings)
    ijk = np.argwhere(voxel_mask)
    voxel_model = A.tocsc().indices if A.shape[0] else np.zeros(0, dtype=int)
    labels_out = [int(v) if float(v).is_integer() else float(v) for v in region_labels]
    return BrainMapResult(out.importance, out.score, out.W, out.n_iter, out.terms,
                          out.feature_names, settings, affine=img4d.affine,
                          shape=img4d.shape[:3], voxel_indices=ijk,
                          voxel_model=voxel_model, kind="roi", region_labels=labels_out,
                          background=mean_background(img4d, img4d.shape[:3], img4d.affine),
                          **result_tests(out))

