"""fMRI inputs that used to pass silently: a TR that disagrees with the header, events
whose regressors are identical, a continuous map given as an atlas."""
import warnings

import numpy as np
import pandas as pd
import pytest

nib = pytest.importorskip("nibabel")
pytest.importorskip("nilearn")

from test_fmri import T_R, _no_fit, simulate_runs  # noqa: E402

import mlem_neuro  # noqa: E402
from mlem_neuro.fmri import trial_images  # noqa: E402


@pytest.fixture(scope="module")
def sim():
    return simulate_runs()


def test_a_t_r_other_than_the_headers_warns(sim, monkeypatch):
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)
    tagged = []
    for img in runs:
        img = nib.Nifti1Image(np.asarray(img.dataobj), img.affine)
        img.header.set_xyzt_units("mm", "sec")
        img.header.set_zooms((*img.header.get_zooms()[:3], 3.0))
        tagged.append(img)
    with pytest.warns(UserWarning, match=r"t_r=2 s, but the header of bold_imgs\[0\] gives "
                      r"a repetition time of 3 s"), pytest.raises(AssertionError):
        trial_images(tagged, events, T_R, mask_img=mask)
    with warnings.catch_warnings():                    # the header's own TR: no warning
        warnings.simplefilter("error", UserWarning)
        with pytest.raises(AssertionError, match="fitted before"):
            trial_images(tagged, events, 3.0, mask_img=mask)


def test_a_header_tr_without_time_units_is_read_as_seconds(sim, monkeypatch):
    """xyzt units unset (common): pixdim[4] = 3.0 is still a TR in seconds, so t_r=2.0
    warns, naming both values and the one used; nibabel's placeholder 1.0 does not."""
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)

    def with_tr(tr):
        out = []
        for img in runs:
            img = nib.Nifti1Image(np.asarray(img.dataobj), img.affine)
            img.header.set_zooms((*img.header.get_zooms()[:3], tr))
            assert img.header.get_xyzt_units() == ("unknown", "unknown")
            out.append(img)
        return out

    with pytest.warns(UserWarning, match=r"t_r=2 s, but the header of bold_imgs\[0\] gives "
                      r"a repetition time of 3 s \(its time unit is unset: read as "
                      r"seconds\); t_r=2 s is used"), pytest.raises(AssertionError):
        trial_images(with_tr(3.0), events, T_R, mask_img=mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        for tr, t_r in ((1.0, T_R), (3.0, 3.0)):       # placeholder, or the header's TR
            with pytest.raises(AssertionError, match="fitted before"):
                trial_images(with_tr(tr), events, t_r, mask_img=mask)


def test_events_with_identical_regressors_are_refused(sim, monkeypatch):
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)
    twin = [ev.copy() for ev in events]
    twin[1].loc[3, ["onset", "duration"]] = twin[1].loc[2, ["onset", "duration"]].to_numpy()
    with pytest.raises(ValueError, match=r"events\[1\]: the regressors of the trial in row "
                       r"2 .* and the trial in row 3 .* are the same"):
        trial_images(runs, twin, T_R, mask_img=mask)


def test_a_continuous_map_is_not_an_atlas(sim):
    rng = np.random.default_rng(0)
    imgs = nib.Nifti1Image(rng.standard_normal((3, 3, 2, 12)).astype("float32"),
                           sim[0][0].affine)
    table = pd.DataFrame({"c": np.tile(list("xyz"), 4)})
    labels = nib.Nifti1Image(rng.uniform(0, 1, (3, 3, 2)), sim[0][0].affine)
    with pytest.raises(ValueError, match="non-integer values .* continuous map"):
        mlem_neuro.mlem_roi(imgs, table, labels, cv=2, n_repeats=1)


def test_runs_on_other_grids_and_confounds_of_another_length_are_refused(sim, monkeypatch):
    runs, events, _, _, mask = sim
    _no_fit(monkeypatch)
    affine = runs[1].affine.copy()
    affine[0, 3] += 5.0                                    # shifted by 5 mm
    shifted = nib.Nifti1Image(np.asarray(runs[1].dataobj), affine)
    with pytest.raises(ValueError, match=r"bold_imgs\[1\] is on another grid"):
        trial_images([runs[0], shifted], events, T_R, mask_img=mask)
    n = runs[0].shape[3]
    confounds = [pd.DataFrame({"motion": np.zeros(n)}),
                 pd.DataFrame({"motion": np.zeros(n - 3)})]
    with pytest.raises(ValueError, match=rf"confounds\[1\] has {n - 3} rows but bold_imgs\[1\] "
                       rf"has {n} scans"):
        trial_images(runs, events, T_R, mask_img=mask, confounds=confounds)
    volumes = [nib.Nifti1Image(np.asarray(runs[0].dataobj)[..., k], runs[0].affine)
               for k in range(n)]
    volumes[5] = nib.Nifti1Image(np.zeros((2, 2, 2), "float32"), runs[0].affine)
    with pytest.raises(ValueError, match=r"bold_imgs\[0\]\[5\] .* is on another grid"):
        trial_images([volumes, runs[1]], events, T_R, mask_img=mask)
