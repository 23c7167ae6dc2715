"""MLEM against scikit-learn's estimator checks (tags API, scikit-learn >= 1.6)."""
import numpy as np
import pandas as pd
import pytest
import sklearn
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from mlem_neuro import MLEM

if tuple(int(v) for v in sklearn.__version__.split(".")[:2]) < (1, 8):
    pytest.skip("the estimator checks need scikit-learn >= 1.8 (tags API, xfail_strict)",
                allow_module_level=True)

from sklearn.utils import get_tags  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

#: Checks MLEM fails by design: its methods compare *pairs* of stimuli.
DESIGN_FAILURES = {
    "check_transformer_data_not_an_array": "transform gives one distance per stimulus pair "
                                           "(n(n-1)/2 values), not a row per sample; no "
                                           "fit_transform",
    "check_transformer_general": "transform gives one distance per stimulus pair, not a row "
                                 "per sample; no fit_transform",
    "check_transformer_preserve_dtypes": "checked through fit_transform, which MLEM lacks "
                                         "(transform's pair distances are float64)",
    "check_transformers_unfitted": "transform only computes neural distances and needs no "
                                   "fit (score and importance do, and raise NotFittedError)",
    "check_methods_sample_order_invariance": "transform returns pair distances, whose "
                                             "number and order are not those of the samples",
    "check_methods_subset_invariance": "a batch of one stimulus has no pair to compare (MLEM "
                                       "needs >= 3 stimuli)",
}
#: Checks of input validation (``MLEM._check_X`` / ``fit``) that still fail.
VALIDATION_FAILURES = {
    "check_n_features_in": "fit does not set n_features_in_ yet",
    "check_n_features_in_after_fitting": "fit does not set n_features_in_ yet",
    "check_dtype_object": "the error for non-numeric X lacks scikit-learn's wording",
    "check_estimators_empty_data_messages": "X with zero units (columns) is accepted",
    "check_estimator_sparse_tag": "the error for sparse X does not say that sparse input is "
                                  "unsupported",
    "check_estimator_sparse_array": "the error for sparse X does not say that sparse input "
                                    "is unsupported",
    "check_estimator_sparse_matrix": "the error for sparse X does not say that sparse input "
                                     "is unsupported",
    "check_fit2d_1sample": "one stimulus is refused ('needs at least 3 stimuli') without "
                           "scikit-learn's 'n_samples=1' wording",
    "check_fit2d_predict1d": "the error for 1-D X lacks 'Reshape your data'",
    "check_requires_y_none": "y=None raises a TypeError about y's type, not a ValueError "
                             "saying y is required",
}
EXPECTED_FAILURES = {**DESIGN_FAILURES, **VALIDATION_FAILURES}


def _expected_failures(estimator):
    return EXPECTED_FAILURES


@parametrize_with_checks([MLEM(max_steps=20, random_state=0)],
                         expected_failed_checks=_expected_failures, xfail_strict=True)
def test_sklearn_estimator_checks(estimator, check):
    """Every check passes, except those listed (strict: a listed check that passes fails)."""
    check(estimator)


def _data(n=12, seed=0):
    rng = np.random.default_rng(seed)
    y = pd.DataFrame({"a": rng.integers(0, 2, n).astype(str), "b": rng.random(n)})
    X = rng.standard_normal((n, 5))
    return X, y


@pytest.mark.parametrize("method", ["score", "permutation_importance", "predict_rdm"])
def test_unfitted_mlem_raises_not_fitted_error(method):
    X, y = _data()
    est = MLEM(max_steps=5)
    args = (y,) if method == "predict_rdm" else (X, y)
    with pytest.raises(NotFittedError, match="not fitted yet; call fit"):
        getattr(est, method)(*args)
    est.fit(X, y)
    getattr(est, method)(*args)                   # and no error once fitted


def test_tags_describe_mlem():
    tags = get_tags(MLEM())
    assert tags.target_tags.required
    assert tags.requires_fit
    assert tags.estimator_type is None            # no predict: not a regressor
    assert not tags.input_tags.pairwise and not tags.input_tags.allow_nan
    assert not tags.input_tags.sparse
    assert tags.transformer_tags.preserves_dtype == ["float64"]
    assert not tags.non_deterministic
    assert get_tags(MLEM(distance="precomputed")).input_tags.pairwise
    assert get_tags(MLEM(device="cuda")).non_deterministic
    # tags follow parameters set after construction (and survive clone)
    est = clone(MLEM()).set_params(distance="precomputed")
    assert get_tags(est).input_tags.pairwise


def test_transform_checks_units_after_fit():
    X, y = _data()
    est = MLEM(max_steps=5).fit(X, y)
    if not hasattr(est, "n_features_in_"):
        pytest.skip("fit does not set n_features_in_")
    with pytest.raises(ValueError, match="X has 2 features, but MLEM is expecting 5"):
        est.score(X[:, :2], y)
    # precomputed dissimilarities change width with the number of stimuli: no check
    D = np.abs(X[:, :1] - X[:, :1].T)
    est = MLEM(max_steps=5, distance="precomputed").fit(D, y)
    assert np.isfinite(est.score(D[:8, :8], y.iloc[:8]))
