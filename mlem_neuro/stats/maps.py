"""Group level for brain maps: per-subject MLEM maps into nilearn's permutation test."""
from __future__ import annotations

import os

import numpy as np

from ..core.checks import MAP_MEASURES, check
from ..utils import renamed
from ._main_effect import check_main_effect_term

__all__ = ["second_level_maps"]


def _load_results(results, what="results"):
    from ..results import read_result
    from ..results.brainmap import BrainMapResult

    if isinstance(results, (BrainMapResult, str, os.PathLike)):
        raise TypeError(f"{what} must be a list of per-subject BrainMapResult objects (or "
                        "paths of saved results), one per subject.")
    out = []
    for k, r in enumerate(results):
        if isinstance(r, (str, os.PathLike)):
            r = read_result(r)
        if not isinstance(r, BrainMapResult):
            raise TypeError(f"{what}[{k}] is a {type(r).__name__}; second_level_maps takes "
                            "BrainMapResult objects (from mlem_searchlight / mlem_roi).")
        out.append(r)
    if len(out) < 2:
        raise ValueError(f"a one-sample group test needs at least 2 subjects; got {len(out)}.")
    for k, r in enumerate(out[1:], start=1):
        _same_grid(r, out[0], f"{what}[{k}]")
    return out


def _same_grid(r, ref, what, ref_what="results[0]"):
    if r.shape != ref.shape or not np.allclose(r.affine, ref.affine, atol=1e-4):
        raise ValueError(f"{what} maps are on grid {r.shape} with affine "
                         f"{r.affine[:3].round(3).tolist()} but {ref_what} on {ref.shape} "
                         f"with {ref.affine[:3].round(3).tolist()}: group statistics need "
                         "every subject on one (template) grid. Run the searchlight on "
                         "normalised images, or resample the maps "
                         "(nilearn.image.resample_to_img) and test them with nilearn.")


@renamed(n_perm="n_null")
def second_level_maps(results, term, mask_img=None, n_null=10000, two_sided_test=False,
                      n_jobs=None, random_state=None, *, measure="importance",
                      additive=None, n_perm=None, **kwargs):
    """One-sample permutation test of per-subject MLEM maps (nilearn).

    Each subject's ``importance_img(term)`` (or its ``main_effect_img(term)``, its score
    map, or its map of the held-out gain of the metric with interactions over the
    additive one) is fed to
    :func:`nilearn.glm.second_level.non_parametric_inference` with an intercept-only
    design: is the importance (or held-out Spearman, or the gain) above 0 across subjects?

    Parameters
    ----------
    results : list of BrainMapResult | list of path
        One result per subject, all on the same grid (e.g. MNI space).
    term : str | None
        The term to test (``"f"`` or ``"f:g"``); ``None`` tests the held-out score maps;
        ``"interactions"`` with ``additive`` tests whether the features interact: each
        subject's score map minus its additive score map (a term-level interaction's
        importance is no evidence of an interaction: method page).
    mask_img : 3D image | None
        Voxels tested.  Default: the voxels every subject's result covers.
    n_null : int
        Sign-flip permutations (nilearn's ``n_perm``), named as in the single-subject
        tests; ``n_perm`` is its former name here (deprecated; a FutureWarning).
    two_sided_test : bool
        Test both signs (default: importance > 0, one-sided; always one-sided for
        ``"interactions"``: a metric with interactions that predicts worse than the
        additive one is over-fitted, not evidence of anything).
    n_jobs : int | None
        Parallel permutations (``None`` → 1).
    random_state : None | int
        Seeds the permutations.
    measure : {"importance", "main_effect"}
        Test ``term``'s held-out importance (default), or (``"main_effect"``, ``term`` a
        feature) its in-sample main effect, each subject's ``main_effect_img(term)``: the
        partial Spearman correlation of the feature's distance with the neural distance,
        the other features' held fixed, centred on 0 without an effect (voxels where a
        subject's main effect is undefined are left out of the default mask).
    additive : list of BrainMapResult | list of path | None
        With ``term="interactions"`` only: the same subjects in the same order, analysed
        like ``results`` but with ``constraint="diagonal"``, with the same ``cv`` and an int
        ``random_state`` (same folds; a warning says when they differ).
    n_perm : int | None
        Former name of ``n_null`` (deprecated; a FutureWarning; both names: a TypeError).
    **kwargs
        Passed to ``non_parametric_inference`` (``smoothing_fwhm``, ``threshold``,
        ``tfce``...).

    Returns
    -------
    out : Nifti1Image | dict
        What ``non_parametric_inference`` returns: the image of ``-log10`` voxel-level
        FWE-corrected p-values, or, with ``threshold`` / ``tfce``, a dict of images
        (``"t"``, ``"logp_max_t"``, ``"size"``, ``"logp_max_size"``, ...).

    Notes
    -----
    Measured on simulated subjects' searchlights with the defaults (method page, "Group
    level"): groups of 10 with a family-wise significant voxel of an unencoded feature
    in 5 of 100 groups (another feature encoded in one sphere).  With
    ``"interactions"`` ("Interactions across subjects"): a significant voxel in 0 of 100
    groups with additive codes in one sphere and 13 of 200 (0.065) on pure noise, and a
    sub-additive code found within 6 mm in 0.40 and 1.00 of 40 groups at two amplitudes.

    Examples
    --------
    >>> from mlem_neuro.stats import second_level_maps
    >>> res = [mlem_neuro.read_result(f"sub-{s:02d}_mlem.npz")
    ...        for s in range(1, 21)]                                  # doctest: +SKIP
    >>> logp = second_level_maps(res, "category", n_null=5000)       # doctest: +SKIP
    >>> nilearn.plotting.plot_stat_map(logp, threshold=1.3)           # doctest: +SKIP
    """
    import nibabel as nib
    import pandas as pd
    from nilearn.glm.second_level import non_parametric_inference

    check("measure", measure, allowed=MAP_MEASURES)
    subjects = _load_results(results)
    if measure == "main_effect":
        imgs = _main_effect_imgs(subjects, term, additive)
    elif additive is not None or (term == "interactions" and term not in subjects[0].terms):
        imgs = _gain_imgs(subjects, additive, term, two_sided_test)
    elif term is None:
        imgs = [r.score_img for r in subjects]
    else:
        for k, r in enumerate(subjects):
            if term not in r.terms:
                raise ValueError(f"results[{k}] has no term {term!r}; its terms are "
                                 f"{r.terms}.")
        imgs = [r.importance_img(term) for r in subjects]
    if mask_img is None:
        covered = np.ones(subjects[0].shape, dtype=bool)
        for r in subjects:
            covered &= np.asarray(r.mask_img.dataobj).astype(bool)
        for img in imgs:                                # undefined main effects
            covered &= np.isfinite(np.asarray(img.dataobj))
        if not covered.any():
            raise ValueError("the subjects' maps share no voxel; pass mask_img.")
        mask_img = nib.Nifti1Image(covered.astype(np.int8), subjects[0].affine)
    design = pd.DataFrame({"intercept": np.ones(len(imgs))})
    return non_parametric_inference(imgs, design_matrix=design,
                                    second_level_contrast="intercept", mask=mask_img,
                                    n_perm=int(n_null), two_sided_test=two_sided_test,
                                    n_jobs=1 if n_jobs is None else n_jobs,
                                    random_state=random_state, **kwargs)


def _main_effect_imgs(subjects, term, additive):
    """Each subject's main-effect map of feature ``term`` (checked: a feature of every
    subject, main effects computed)."""
    if additive is not None:
        raise ValueError("additive is used with term='interactions' only, not with "
                         "measure='main_effect'.")
    check_main_effect_term(subjects, term, "term='interactions' and additive")
    return [r.main_effect_img(term) for r in subjects]


def _gain_imgs(subjects, additive, term, two_sided_test):
    """Each subject's score map minus its additive score map (checked pair by pair)."""
    from ._additive import NO_ADDITIVE, check_pairs

    if additive is None:
        raise ValueError(NO_ADDITIVE)
    if term != "interactions":
        raise ValueError(f"additive is used with term='interactions' only; got term={term!r}")
    if two_sided_test:
        raise ValueError("the test of interactions is one-sided (the metric with "
                         "interactions predicting better than the additive one): "
                         "two_sided_test must be False.")
    additive = _load_results(additive, "additive")
    check_pairs(subjects, additive, _same_models)
    return [f._paint(f.score - a.score) for f, a in zip(subjects, additive)]


def _same_models(r, ref, what):
    """``r`` and ``ref`` map the same models to the same voxels."""
    _same_grid(r, ref, what, "its pair in results")
    if not (np.array_equal(r.voxel_indices, ref.voxel_indices)
            and np.array_equal(r.voxel_model, ref.voxel_model)):
        raise ValueError(f"{what} covers other voxels or models (spheres, regions) than its "
                         "pair in results: analyse both with the same mask, radius or "
                         "atlas.")
