"""Brain maps of MLEM results: one model per searchlight sphere or per atlas region."""
from __future__ import annotations

import json
import warnings

import numpy as np

from .._docs import fill_doc
from ._base import BaseResult

#: NIfTI extension code used for the term names of :meth:`BrainMapResult.to_nifti`.
_EXT_CODE = "comment"
_KINDS = ("searchlight", "roi")


@fill_doc
class BrainMapResult(BaseResult):
    """Cross-validated MLEM importance and score maps (searchlight spheres or ROIs).

    Returned by :func:`mlem_neuro.mlem_searchlight` (one model per sphere, its value shown
    at the sphere's centre voxel) and :func:`mlem_neuro.mlem_roi` (one model per region,
    its value painted over every voxel of the region).  Voxels that no model covers are 0
    in the images (nilearn's convention for searchlight maps).

    Parameters
    ----------
    %(fold_importance)s
    %(fold_score)s
    %(fold_weights)s
    %(n_iter)s
    %(terms)s
    %(feature_names)s
    %(settings)s
    affine : ndarray (4, 4)
        Affine of the map grid (the process mask's grid for a searchlight).
    shape : tuple of 3 int
        Shape of the map grid.
    voxel_indices : ndarray of int (V, 3)
        Voxels of the grid that show a model's value (sphere centres, or region voxels).
    voxel_model : ndarray of int (V,) | None
        Which model each of these voxels shows (default: ``arange(V)``, one centre per
        model).
    kind : {"searchlight", "roi"}
        One model per searchlight sphere (its value at the centre voxel) or per atlas
        region (its value over the region's voxels).
    region_labels : list | None
        Atlas label of each model (``kind="roi"``).
    background : ndarray (X, Y, Z) | None
        Image on the map grid that :meth:`plot` shows the maps over by default: the
        analyses store the mean absolute value of the input images (their mean image for
        positive images; the brain's outline for betas) for images in native space, and
        ``None`` for images in a standard space (header sform/qform code Talairach,
        MNI152 or template), where nilearn's MNI template is the background.  The
        result's images (``*_img``, :meth:`to_nifti`) carry the input images' space code
        (``settings["space_code"]``: sform code, else qform code, e.g. 4 for MNI152).
    %(tests)s
    %(pvalues)s
    %(pvalues_fwe)s
    %(main_effect)s
    %(gate_open)s
    %(training)s
    %(compiled)s

    Attributes
    ----------
    importance : ndarray (n_models, n_terms)
        Fold-mean permutation importance (drop of held-out Spearman).
    score : ndarray (n_models,)
        Fold-mean held-out Spearman.
    terms : list of str
        ``"f"`` per feature, ``"f:g"`` per interaction.
    %(pvalues_fwe_tests)s

    Examples
    --------
    >>> res = mlem_neuro.mlem_searchlight(imgs, table, mask_img)   # doctest: +SKIP
    >>> res.importance_img("category")                             # doctest: +SKIP
    >>> res.to_data_frame().query("term == 'category'")            # doctest: +SKIP
    >>> res.save("sub-01_mlem.npz"); mlem_neuro.read_result("sub-01_mlem.npz")  # doctest: +SKIP
    """

    _extra_arrays = ("affine", "shape", "voxel_indices", "voxel_model")

    def __init__(self, fold_importance, fold_score, fold_weights, n_iter, terms,
                 feature_names, settings=None, *, affine, shape, voxel_indices,
                 voxel_model=None, kind="searchlight", region_labels=None, background=None,
                 tests=None, pvalues=None, pvalues_fwe=None, main_effect=None, gate_open=None,
                 training=None, compiled=None):
        super().__init__(fold_importance, fold_score, fold_weights, n_iter, terms,
                         feature_names, settings, tests=tests, pvalues=pvalues,
                         pvalues_fwe=pvalues_fwe, main_effect=main_effect, gate_open=gate_open,
                         training=training, compiled=compiled)
        self.affine = np.asarray(affine, dtype=float)
        self.shape = tuple(int(s) for s in np.asarray(shape).ravel())
        self.voxel_indices = np.asarray(voxel_indices, dtype=np.int64).reshape(-1, 3)
        M = self.fold_score.shape[1]
        if voxel_model is None:
            voxel_model = np.arange(len(self.voxel_indices))
        self.voxel_model = np.asarray(voxel_model, dtype=np.int64).ravel()
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {list(_KINDS)}; got {kind!r}")
        self.kind = kind
        self.region_labels = None if region_labels is None else list(region_labels)
        if self.affine.shape != (4, 4) or len(self.shape) != 3:
            raise ValueError("affine must be 4x4 and shape 3 integers")
        if len(self.voxel_model) != len(self.voxel_indices):
            raise ValueError("voxel_model and voxel_indices must have one entry per voxel")
        if len(self.voxel_model) and (self.voxel_model.min() < 0
                                      or self.voxel_model.max() >= M):
            raise ValueError(f"voxel_model refers to models outside 0..{M - 1}")
        if len(self.voxel_indices) and ((self.voxel_indices < 0).any()
                                        or (self.voxel_indices >= self.shape).any()):
            raise ValueError(f"voxel_indices fall outside the grid of shape {self.shape}")
        if self.region_labels is not None and len(self.region_labels) != M:
            raise ValueError(f"{len(self.region_labels)} region labels for {M} models")
        if background is not None:
            background = np.asarray(background, dtype=np.float32)
            if background.shape != self.shape:
                raise ValueError(f"background has shape {background.shape}; it must be on "
                                 f"the map grid, of shape {self.shape}")
        self.background = background

    def _state(self):
        arrays, meta = super()._state()
        if self.background is not None:
            arrays["background"] = self.background
        return arrays, meta

    @classmethod
    def _from_state(cls, arrays, meta):
        res = super()._from_state(arrays, meta)
        # files written before backgrounds were stored have none
        background = arrays.get("background")
        res.background = None if background is None else np.asarray(background)
        return res

    def _extra_meta(self):
        return dict(kind=self.kind, region_labels=self.region_labels)

    # ---------------------------------------------------------------- geometry
    @property
    def n_models(self):
        """Number of models (spheres or regions)."""
        return self.fold_score.shape[1]

    @property
    def mask_img(self):
        """Binary image of the voxels that show a model's value."""
        data = np.zeros(self.shape, dtype=np.int8)
        data[tuple(self.voxel_indices.T)] = 1
        return self._image(data)

    def model_coords(self):
        """World coordinates of the models: centre voxel, or centroid of the region's voxels.

        Returns
        -------
        xyz : ndarray (n_models, 3)
            Coordinates in mm (the affine's space); NaN for a model that shows on no voxel.
        """
        xyz = self.voxel_indices @ self.affine[:3, :3].T + self.affine[:3, 3]
        counts = np.bincount(self.voxel_model, minlength=self.n_models)
        out = np.zeros((self.n_models, 3))
        np.add.at(out, self.voxel_model, xyz)
        with np.errstate(invalid="ignore", divide="ignore"):
            return out / counts[:, None]

    # ------------------------------------------------------------------ images
    def _paint(self, values):
        """3D (or 4D for 2-D ``values`` (n_models, k)) image, 0 where no model."""
        values = np.asarray(values, dtype=float)
        extra = values.shape[1:]
        data = np.zeros(self.shape + extra)
        data[tuple(self.voxel_indices.T)] = values[self.voxel_model]
        img = self._image(data)
        img.header.set_data_dtype(np.float64)
        return img

    def _image(self, data):
        """A NIfTI image of ``data`` on the map grid, in the input images' world space
        (their sform/qform code, ``settings["space_code"]``, e.g. 4 for MNI152; nibabel's
        default, 2 "aligned", when the images had none)."""
        import nibabel as nib

        img = nib.Nifti1Image(data, self.affine)
        code = int(self.settings.get("space_code") or 0)
        if code:
            img.set_sform(self.affine, code=code)
            img.set_qform(self.affine, code=code)
        return img

    def importance_img(self, term):
        """Fold-mean permutation importance of ``term`` as a 3D image.

        Parameters
        ----------
        term : str
            One of :attr:`terms` (a feature ``"f"`` or an interaction ``"f:g"``).

        Returns
        -------
        img : Nifti1Image
        """
        t = self._one_term(term)
        return self._paint(self.importance[:, t])

    def main_effect_img(self, feature):
        """In-sample main effect of ``feature`` as a 3D image: the partial Spearman
        correlation of its distance with the neural distance, the other features'
        distances held fixed (:attr:`main_effect`; method page, "The feature test").

        Parameters
        ----------
        feature : str
            One of :attr:`feature_names` (main effects are per feature, not per
            interaction term).

        Returns
        -------
        img : Nifti1Image
            NaN where the main effect is undefined (a constant neural RDM, or a feature
            whose distance the others determine).
        """
        if self.main_effect is None:
            raise ValueError("this result has no main_effect (a file saved before results "
                             "kept it, or a result built without it): rerun the analysis "
                             "to map main effects.")
        if feature not in self.feature_names:
            raise ValueError(f"main effects are per feature; {feature!r} is not one of "
                             f"{list(self.feature_names)}.")
        return self._paint(self.main_effect[:, list(self.feature_names).index(feature)])

    def importance_fold_std_img(self, term):
        """Across-fold standard deviation of the importance of ``term`` as a 3D image.

        The spread across folds, not a standard error (see
        :attr:`importance_fold_std`).

        Parameters
        ----------
        term : str
            One of :attr:`terms` (a feature ``"f"`` or an interaction ``"f:g"``).

        Returns
        -------
        img : Nifti1Image
            0 where no model shows (and for single-fold results).
        """
        t = self._one_term(term)
        return self._paint(self.importance_fold_std[:, t])

    def importance_std_img(self, term):
        """Deprecated alias of :meth:`importance_fold_std_img`.

        Parameters
        ----------
        term : str
            One of :attr:`terms`.

        Returns
        -------
        img : Nifti1Image
            The across-fold spread of the importance of ``term``.
        """
        warnings.warn("importance_std_img is deprecated and will be removed: use "
                      "importance_fold_std_img.", FutureWarning, stacklevel=2)
        return self.importance_fold_std_img(term)

    @property
    def background_img(self):
        """The default background of :meth:`plot` (:attr:`background` as an image), or
        ``None`` (nilearn's MNI template)."""
        if self.background is None:
            return None
        return self._image(self.background)

    @property
    def score_img(self):
        """Fold-mean held-out Spearman ρ of every model as a 3D image."""
        return self._paint(self.score)

    def significance_img(self, test, alpha=0.05, corrected=True):
        """Where ``test`` is significant, as a binary 3D image (needs ``n_null > 0``).

        Parameters
        ----------
        test : str
            One of :attr:`tests` (``"score"`` or a feature).
        alpha : float
            Level of the test.
        corrected : bool | "models" | "all"
            ``True`` or ``"models"`` (default): family-wise corrected over the models
            (spheres, regions) of this test (:attr:`pvalues_fwe`); ``"all"``: over the
            models and all the tests (:attr:`pvalues_fwe_tests`); ``False``: uncorrected
            (:attr:`pvalues`).

        Returns
        -------
        img : Nifti1Image
            1 at the voxels of significant models, 0 elsewhere.
        """
        return self._paint(self.significant(test, alpha, corrected).astype(float))

    def _one_term(self, term):
        if not isinstance(term, str):
            raise TypeError(f"term must be a str, one of {self.terms}; got {term!r}")
        return self._term_index(term)[0]

    def to_nifti(self, what="importance"):
        """All terms in one 4D image, one volume per term (in :attr:`terms` order).

        The term names travel with the image: a NIfTI header extension (code
        ``"comment"``) holds ``{"mlem_neuro": {"what": ..., "terms": [...]}}`` as JSON,
        which survives ``to_filename`` / ``nibabel.load``; read it back with
        :func:`nifti_terms`.  The header description says so.

        Parameters
        ----------
        what : {"importance", "importance_fold_std"}
            The fold-mean importance, or its spread across folds (``"importance_std"``
            is a deprecated alias of ``"importance_fold_std"``).

        Returns
        -------
        img : Nifti1Image (X, Y, Z, n_terms)
            One volume per term, 0 where no model shows.
        """
        import nibabel as nib

        if what == "importance":
            values = self.importance
        elif what in ("importance_fold_std", "importance_std"):
            if what == "importance_std":
                warnings.warn("to_nifti('importance_std') is deprecated: use "
                              "'importance_fold_std'.", FutureWarning, stacklevel=2)
                what = "importance_fold_std"
            values = self.importance_fold_std
        else:
            raise ValueError("what must be 'importance' or 'importance_fold_std'; got "
                             f"{what!r}")
        img = self._paint(values)
        payload = json.dumps({"mlem_neuro": {"what": what, "terms": self.terms}})
        img.header.extensions.append(nib.nifti1.Nifti1Extension(_EXT_CODE,
                                                                payload.encode()))
        img.header["descrip"] = f"mlem_neuro {what}: {len(self.terms)} terms (ext)"[:80]
        return img

    # ------------------------------------------------------------------ frames
    def to_data_frame(self):
        """Tidy frame, one row per (model, term).

        Returns
        -------
        df : DataFrame
            Searchlight: columns ``i, j, k`` (centre voxel), ``x, y, z`` (mm), ``term``,
            ``importance``, ``importance_fold_std``, ``score``.  ROI: ``region`` (label),
            ``n_voxels``, ``x, y, z`` (region centroid, mm), then the same value columns.
            With tests (``n_null > 0``) also ``pvalue``, ``pvalue_fwe`` (corrected over
            models) and ``pvalue_fwe_tests`` (over models and tests) of the term's test
            (NaN for a term without one), then ``score_pvalue``, ``score_pvalue_fwe``,
            ``score_pvalue_fwe_tests``, and the same three ``interactions_*`` columns
            when the test of interactions ran; with :attr:`gate_open` (the staged feature
            test), a ``gate_open`` column: whether its gate was open in the row's model.
        """
        xyz = self.model_coords()
        if self.kind == "searchlight":
            ijk = np.zeros((self.n_models, 3), dtype=np.int64)
            ijk[self.voxel_model] = self.voxel_indices
            coords = dict(i=ijk[:, 0], j=ijk[:, 1], k=ijk[:, 2])
        else:
            coords = dict(region=np.asarray(self.region_labels),
                          n_voxels=np.bincount(self.voxel_model, minlength=self.n_models))
        coords.update(x=xyz[:, 0], y=xyz[:, 1], z=xyz[:, 2])
        return self._long_frame(coords)

    # -------------------------------------------------------------------- plot
    def plot(self, term=None, alpha=0.05, corrected=True, **kwargs):
        """Plot the importance map of ``term`` (or the score map) with nilearn.

        With tests (``n_null > 0``), the voxels whose p-value (by default corrected over
        the models of the test) is below ``alpha`` are outlined (black contours).

        Parameters
        ----------
        term : str | None
            A term of :attr:`terms`; ``None`` plots the held-out score map.
        alpha : float
            Level of the tests that are outlined.
        corrected : bool | "models" | "all"
            Which p-values (as in :meth:`significance_img`): ``True`` or ``"models"``
            (default) corrected over the spheres or regions of the plotted test,
            ``"all"`` over them and all the tests, ``False`` uncorrected.
        **kwargs
            Passed to :func:`nilearn.plotting.plot_stat_map` (``bg_img``,
            ``display_mode``, ``threshold``, ``axes``...).  ``bg_img`` defaults to
            :attr:`background_img`: the mean absolute value of the analysed images for
            maps in native space (where the MNI template would not line up with the
            brain), nilearn's MNI template for maps in a standard space.

        Returns
        -------
        display : nilearn display object
        """
        from nilearn.plotting import plot_stat_map

        if self.tests is not None:
            self._corrected_pvalues(corrected)          # a bad value fails before drawing
        if term is None:
            img, title = self.score_img, f"{self.score_kind} Spearman{self._no_cv_note}"
        else:
            img, title = self.importance_img(term), f"importance: {term}"
        kwargs.setdefault("title", title)
        if self.background is not None:
            kwargs.setdefault("bg_img", self.background_img)
        display = plot_stat_map(img, **kwargs)
        test = "score" if term is None else term
        if self.tests is not None and test in self.tests:
            sig = self.significance_img(test, alpha, corrected)
            if np.asarray(sig.dataobj).any():
                display.add_contours(sig, levels=[0.5], colors="k", linewidths=1.0)
        return display


def nifti_terms(img):
    """Term names stored by :meth:`BrainMapResult.to_nifti` in ``img``.

    Parameters
    ----------
    img : str | path-like | Nifti1Image
        The 4D image (or its file) written from :meth:`BrainMapResult.to_nifti`.

    Returns
    -------
    terms : list of str
        One per volume.
    """
    import nibabel as nib

    if not isinstance(img, nib.spatialimages.SpatialImage):
        img = nib.load(img)
    for ext in img.header.extensions:
        try:
            payload = json.loads(ext.get_content())
        except (ValueError, TypeError, UnicodeDecodeError):
            continue
        if isinstance(payload, dict) and "mlem_neuro" in payload:
            return list(payload["mlem_neuro"]["terms"])
    raise ValueError("this image carries no mlem_neuro term names (it was not written by "
                     "BrainMapResult.to_nifti).")
