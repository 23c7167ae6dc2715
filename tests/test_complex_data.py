"""Complex data are refused at every entry, never reduced to their real part."""
import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro import MLEM

MATCH = r"holds complex values .*np\.abs"


@pytest.fixture
def design():
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": rng.integers(0, 2, 12).astype(bool)})
    data = rng.standard_normal((12, 3, 2)) + 1j * rng.standard_normal((12, 3, 2))
    return data, table


def test_arrays_and_the_estimator_refuse_complex_data(design):
    data, table = design
    with pytest.raises(ValueError, match=MATCH):
        mlem_neuro.mlem_array(data, table, cv=2, n_repeats=1)
    with pytest.raises(ValueError, match=MATCH):
        MLEM().fit(data[:, :, 0], table)
    # the magnitude, asked for, is fine
    mlem_neuro.mlem_array(np.abs(data), table, cv=2, n_repeats=1, max_steps=5, verbose="ERROR")


def test_images_and_epochs_refuse_complex_data(design):
    nib = pytest.importorskip("nibabel")
    mne = pytest.importorskip("mne")
    data, table = design
    img = nib.Nifti1Image(np.tile(data[:, 0, 0], (2, 2, 2, 1)).astype(np.complex64),
                          np.eye(4))
    mask = nib.Nifti1Image(np.ones((2, 2, 2), "int8"), np.eye(4))
    with pytest.raises(ValueError, match=MATCH):
        mlem_neuro.mlem_searchlight(img, table, mask, radius=1.0)
    epochs = mne.EpochsArray(data, mne.create_info(3, 100.0, "eeg"), metadata=table,
                             verbose="ERROR")
    with pytest.raises(ValueError, match=MATCH):
        mlem_neuro.mlem_epochs(epochs, features=["a"], cv=2, n_repeats=1)
