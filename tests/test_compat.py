"""The scikit-learn estimator contract, and MLEM inside nilearn's SearchLight and MNE's
SlidingEstimator (the integrations the MLEM docstring promises)."""
import inspect

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import KFold, cross_val_score
from sklearn.utils.validation import check_is_fitted

from mlem_neuro import MLEM
from mlem_neuro.simulation import simulate_representations

FAST = dict(max_steps=20, batch_size="full")
FITTED = ("W_", "n_iter_", "converged_", "history_", "train_score_", "batch_size_",
          "feature_names_in_", "terms_", "feature_space_")


@pytest.fixture(scope="module")
def sim():
    X, y, _ = simulate_representations(n_stimuli=30, n_features=2, n_units=12, noise=0.2,
                                       random_state=0)
    return X, y


# ------------------------------------------------------------------ params contract
def test_clone_keeps_params():
    est = MLEM(constraint="none", lr=0.05, feature_kinds={"a": "ordinal"},
               feature_groups={"pos": ["x", "y"]}, missing_distance={"a": 1.0})
    cl = clone(est)
    assert cl is not est
    assert type(cl) is MLEM
    assert cl.get_params() == est.get_params()
    assert cl.constraint == "none" and cl.lr == 0.05
    # mutable parameters are copied, not shared
    assert cl.feature_kinds == {"a": "ordinal"} and cl.feature_kinds is not est.feature_kinds


def test_clone_of_fitted_is_unfitted(sim):
    X, y = sim
    est = MLEM(random_state=3, **FAST).fit(X, y)
    cl = clone(est)
    assert cl.get_params() == est.get_params()
    for attr in FITTED:
        assert not hasattr(cl, attr)
    with pytest.raises(NotFittedError, match="not fitted"):
        cl.score(X, y)


def test_get_params_lists_every_init_argument():
    names = [p for p in inspect.signature(MLEM.__init__).parameters if p != "self"]
    params = MLEM().get_params()
    assert sorted(params) == sorted(names)
    defaults = {p.name: p.default for p in inspect.signature(MLEM.__init__).parameters.values()
                if p.name != "self"}
    assert params == defaults


def test_get_set_params_round_trip():
    a = MLEM(constraint="diagonal", interactions=False, n_permutations=7, batch_size=128,
             device="cpu", random_state=5, verbose="info")
    b = MLEM()
    assert b.set_params(**a.get_params()) is b
    assert b.get_params() == a.get_params()
    b.set_params(max_steps=5, lr=0.2)
    assert (b.max_steps, b.lr) == (5, 0.2)
    assert b.get_params()["constraint"] == "diagonal"
    with pytest.raises(ValueError, match="Invalid parameter 'bogus'"):
        b.set_params(bogus=1)


def test_init_does_not_validate_or_alter_params():
    # scikit-learn: __init__ stores parameters untouched; validation happens in fit
    est = MLEM(constraint="foo", batch_size="bar", device="tpu")
    assert est.get_params()["constraint"] == "foo"
    assert est.get_params()["batch_size"] == "bar"


def test_fit_keeps_params_and_sets_trailing_underscore_attributes(sim):
    X, y = sim
    # patience beyond max_steps, so that training cannot stop early (below)
    est = MLEM(random_state=0, patience=50, **FAST)
    before_params = est.get_params()
    before_attrs = set(vars(est))
    for attr in FITTED:
        assert not hasattr(est, attr)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)

    assert est.fit(X, y) is est
    assert est.get_params() == before_params
    new = set(vars(est)) - before_attrs
    assert new, "fit set no attribute"
    assert all(a.endswith("_") and not a.startswith("_") for a in new), sorted(new)
    assert set(FITTED) <= new
    check_is_fitted(est)

    m = 2
    assert est.W_.shape == (m, m)
    np.testing.assert_allclose(est.W_, est.W_.T)
    assert np.linalg.norm(est.W_) == pytest.approx(1.0)
    assert np.linalg.eigvalsh(est.W_).min() > -1e-9            # "spd"
    assert list(est.feature_names_in_) == ["f0", "f1"]
    assert est.terms_ == ["f0", "f1", "f0:f1"]
    # max_steps (20) < patience (50): training cannot stop early
    assert est.n_iter_ == 20 and est.converged_ is False
    assert est.history_.shape == (20,)
    # the kept state improved on the previous best by more than tol: it lies within tol of
    # the best training score seen
    assert np.nanmax(est.history_) - est.tol <= est.train_score_ <= np.nanmax(est.history_)
    assert est.batch_size_ == 30 * 29 // 2


def test_early_stopping_sets_converged(sim):
    X, y = sim
    est = MLEM(max_steps=500, patience=3, batch_size="full", random_state=0).fit(X, y)
    assert est.converged_ is True
    assert est.n_iter_ < 500
    assert len(est.history_) == est.n_iter_


def test_refit_replaces_state(sim):
    X, y = sim
    est = MLEM(random_state=0, **FAST).fit(X, y)
    est.fit(X, y[["f0"]])
    assert est.W_.shape == (1, 1)
    assert list(est.feature_names_in_) == ["f0"]
    assert est.terms_ == ["f0"]


def test_cross_val_score(sim):
    X, y = sim
    scores = cross_val_score(MLEM(max_steps=30, batch_size="full", random_state=0), X, y,
                             cv=3)
    assert scores.shape == (3,)
    assert np.isfinite(scores).all()
    # the simulated geometry generalises to held-out stimuli
    assert scores.min() > 0.5
    # a shuffled feature table does not
    y_null = y.sample(frac=1.0, random_state=0).reset_index(drop=True)
    null = cross_val_score(MLEM(max_steps=30, batch_size="full", random_state=0), X, y_null,
                           cv=3)
    assert np.isfinite(null).all()
    assert null.mean() < scores.mean() - 0.3


# ------------------------------------------------------------------ nilearn SearchLight
def _searchlight_data(n=24, seed=0):
    import nibabel as nib

    rng = np.random.default_rng(seed)
    affine = np.diag([2.0, 2.0, 2.0, 1.0])
    labels = np.tile(["a", "b", "c"], n // 3)
    code = np.tile([0.0, 1.0, 2.0], n // 3)
    data = rng.standard_normal((5, 5, 5, n))
    pattern = rng.standard_normal((5, 5, 5))
    data += 2.0 * pattern[..., None] * code
    imgs = nib.Nifti1Image(data.astype(np.float32), affine)
    mask = np.zeros((5, 5, 5), dtype=np.int8)
    mask[1:4, 1:4, 1:4] = 1
    process = np.zeros((5, 5, 5), dtype=np.int8)
    process[2, 2, 2] = process[1, 2, 2] = process[2, 3, 2] = 1
    return (imgs, nib.Nifti1Image(mask, affine), nib.Nifti1Image(process, affine),
            process.astype(bool), labels, code)


@pytest.mark.filterwarnings("ignore:Use a custom estimator:UserWarning")
@pytest.mark.parametrize("form", ["frame_str", "frame_two_features", "1d_str", "1d_float"])
def test_nilearn_searchlight(form):
    from nilearn.decoding import SearchLight

    imgs, mask_img, process_img, process, labels, code = _searchlight_data()
    rng = np.random.default_rng(1)
    y = {"frame_str": pd.DataFrame({"cond": labels}),
         "frame_two_features": pd.DataFrame({"level": code,
                                             "noise": rng.integers(0, 2, len(code))}),
         "1d_str": labels, "1d_float": code}[form]
    sl = SearchLight(mask_img, process_mask_img=process_img, radius=2.5,
                     estimator=MLEM(random_state=0, **FAST), cv=KFold(3), n_jobs=1)
    sl.fit(imgs, y)
    scores = sl.scores_[process]
    assert scores.shape == (3,)
    assert np.isfinite(sl.scores_).all()
    assert (sl.scores_[~process] == 0).all()
    # every voxel carries the pattern: held-out Spearman well above chance
    assert scores.min() > 0.2


# ------------------------------------------------------------- MNE SlidingEstimator
def test_transform_returns_condensed_neural_rdm():
    from scipy.spatial.distance import pdist

    X = np.random.default_rng(0).standard_normal((9, 4))
    for metric in ("euclidean", "correlation", "cosine"):
        np.testing.assert_allclose(MLEM(distance=metric).transform(X), pdist(X, metric))


ESTIMATORS = [pytest.param(MLEM, id="MLEM")]


def _epochs(n=30, n_channels=8, n_times=14, window=slice(5, 10), amp=5.0, seed=0):
    """Epochs whose channel pattern encodes one feature in time points 5..9 only."""
    rng = np.random.default_rng(seed)
    f = rng.uniform(0, 1, n)
    pattern = rng.standard_normal(n_channels)
    pattern *= np.sqrt(n_channels) / np.linalg.norm(pattern)   # fixed signal strength
    X = rng.standard_normal((n, n_channels, n_times))
    X[:, :, window] += amp * f[:, None, None] * pattern[None, :, None]
    return X, f


@pytest.mark.parametrize("est_cls", ESTIMATORS)
@pytest.mark.parametrize("label", ["numeric", "string"])
def test_mne_sliding_estimator(est_cls, label):
    from mne.decoding import SlidingEstimator

    X, f = _epochs(n=24, n_times=6)
    y = f if label == "numeric" else np.where(f > 0.5, "high", "low")
    sl = SlidingEstimator(est_cls(random_state=0, **FAST), scoring=None, n_jobs=1,
                          verbose=False)
    sl.fit(X, y)
    assert len(sl.estimators_) == 6
    assert all(isinstance(e, MLEM) and e.W_.shape == (1, 1) for e in sl.estimators_)
    scores = sl.score(X, y)
    assert scores.shape == (6,)
    assert np.isfinite(scores).all()
    # the per-time-point score is the estimator's own score on that slice
    assert scores[3] == pytest.approx(sl.estimators_[3].score(X[..., 3], y))


@pytest.mark.parametrize("est_cls", ESTIMATORS)
def test_mne_sliding_estimator_time_course(est_cls):
    from mne.decoding import SlidingEstimator

    X, f = _epochs()
    sl = SlidingEstimator(est_cls(random_state=0, **FAST), scoring=None, n_jobs=1,
                          verbose=False)
    sl.fit(X, f)
    scores = sl.score(X, f)
    inside = scores[5:10]
    outside = np.delete(scores, np.arange(5, 10))
    # measured: inside >= 0.83 (>= 0.72 over seeds 0-5), outside |.| <= 0.14
    assert inside.min() > 0.5
    assert np.abs(outside).max() < 0.3
    assert inside.mean() - outside.mean() > 0.5
