"""Every result says what it was computed with, saves it and reads it back."""
import sys

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro import read_result


@pytest.fixture(scope="module")
def result():
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile([True, False], 10)})
    return mlem_neuro.mlem_array(rng.standard_normal((20, 3, 2)), table, cv=2, n_repeats=1,
                                 max_steps=3, random_state=0, verbose="ERROR")


def test_results_record_versions_platform_and_device(result):
    import numpy
    import torch

    prov = result.provenance
    assert prov["versions"]["numpy"] == numpy.__version__
    assert prov["versions"]["torch"] == torch.__version__
    assert prov["versions"]["mlem_neuro"] == mlem_neuro.__version__
    assert prov["device"] == "cpu" and prov["torch_cuda"] == torch.version.cuda
    assert isinstance(prov["compiled_training"], bool) and prov["python"]
    assert f"mlem_neuro {mlem_neuro.__version__}" in repr(result)


def test_provenance_is_saved_and_read_back_and_old_files_say_unknown(result, tmp_path):
    import json

    fname = result.save(tmp_path / "p_mlem.npz")
    back = read_result(fname)
    assert back.provenance == result.provenance
    # a file written before provenance existed: read back as unknown ({}), not as now
    with np.load(fname) as f:
        entries = {k: f[k] for k in f.files}
    header = json.loads(str(entries.pop("__header__")))
    header.pop("provenance")
    with open(tmp_path / "old_mlem.npz", "wb") as f:
        np.savez(f, __header__=np.array(json.dumps(header)), **entries)
    assert read_result(tmp_path / "old_mlem.npz").provenance == {}
    # a provenance that is no record (a string): refused, naming the field; it was read,
    # and then repr raised AttributeError
    header["provenance"] = "mlem_neuro 0.1"
    with open(tmp_path / "bad_mlem.npz", "wb") as f:
        np.savez(f, __header__=np.array(json.dumps(header)), **entries)
    with pytest.raises(ValueError, match=r"\(bad header\): 'provenance' is a str"):
        read_result(tmp_path / "bad_mlem.npz")
    # one that records more than this version writes is read as it is
    header["provenance"] = dict(result.provenance, gpu_name="H200")
    with open(tmp_path / "new_mlem.npz", "wb") as f:
        np.savez(f, __header__=np.array(json.dumps(header)), **entries)
    back = read_result(tmp_path / "new_mlem.npz")
    assert back.provenance["gpu_name"] == "H200" and "mlem_neuro" in repr(back)


def test_the_command_line_summary_says_what_computed_it(tmp_path, capsys):
    mne = pytest.importorskip("mne")
    from mlem_neuro.cli import main

    rng = np.random.default_rng(0)
    meta = pd.DataFrame({"a": np.tile([True, False], 10)})
    mne.EpochsArray(rng.standard_normal((20, 3, 4)) * 1e-6, mne.create_info(3, 100.0, "eeg"),
                    metadata=meta, verbose="ERROR").save(tmp_path / "x-epo.fif",
                                                         verbose="ERROR")
    assert main(["epochs", str(tmp_path / "x-epo.fif"), "--features", "a", "--cv", "2",
                 "--max-steps", "3", "--n-permutations", "1",
                 "--out", str(tmp_path / "o")]) == 0
    assert f"Computed with mlem_neuro {mlem_neuro.__version__}, torch" in \
        capsys.readouterr().out


def test_versions_are_those_that_run_not_those_installed(monkeypatch):
    """From a source checkout (or beside an older installed copy) the installed
    distributions' metadata disagree with what runs: the imported modules' versions win."""
    import numpy
    import torch

    from mlem_neuro import _provenance

    monkeypatch.setattr(_provenance, "_installed_version", lambda name: "0.0.stale")
    monkeypatch.delitem(sys.modules, "nibabel", raising=False)
    versions = _provenance.collect()["versions"]
    assert versions["mlem_neuro"] == mlem_neuro.__version__
    assert versions["numpy"] == numpy.__version__ and versions["torch"] == torch.__version__
    # a package that is not imported is read from its metadata
    assert versions["nibabel"] == "0.0.stale"


def test_results_record_the_training_paths_that_trained_them(monkeypatch):
    """Which loop trained the models: the compiled loop (categorical designs on the
    CPU), torch when it is switched off; saved in the settings and shown in the summary
    line."""
    from mlem_neuro import _provenance
    from mlem_neuro.core.kernels import _numba
    from mlem_neuro.core.training import compiled

    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile([True, False], 10)})
    kw = dict(cv=2, n_repeats=1, max_steps=3, random_state=0, verbose="ERROR")
    res = mlem_neuro.mlem_array(rng.standard_normal((20, 3, 2)), table, **kw)
    used = res.provenance["training"]
    assert used and used == res.settings["training_used"]
    assert used == ["compiled loop (numba)"]
    assert res.provenance["versions"]["numba"] == compiled.numba.__version__
    assert "trained by" in _provenance.describe(res.provenance)
    monkeypatch.setattr(_numba, "USE_COMPILED", False)
    res = mlem_neuro.mlem_array(rng.standard_normal((20, 3, 2)), table, **kw)
    assert res.provenance["training"] == ["torch (cpu)"]
    # outside an analysis nothing is recorded
    assert _provenance._TRAINING.get() is None
