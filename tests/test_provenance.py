"""Every result says what it was computed with, saves it and reads it back."""
import sys

import numpy as np
import pandas as pd
import pytest

import mlem_neuro
from mlem_neuro import read_result
from mlem_neuro.core.constants import GROUPED_STEP_RULE, PER_PAIR_STEP_RULE


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
    CPU), torch when it is switched off; recorded once (in the provenance, not in the
    settings any more) and shown in the summary line."""
    from mlem_neuro import _provenance
    from mlem_neuro.core.kernels import _numba
    from mlem_neuro.core.training import compiled

    rng = np.random.default_rng(0)
    table = pd.DataFrame({"a": np.tile([True, False], 10)})
    kw = dict(cv=2, n_repeats=1, max_steps=3, random_state=0, verbose="ERROR")
    res = mlem_neuro.mlem_array(rng.standard_normal((20, 3, 2)), table, **kw)
    used = res.provenance["training"]
    assert used == ["compiled loop (numba)"] and "training_used" not in res.settings
    assert res.provenance["versions"]["numba"] == compiled.numba.__version__
    lr, patience = GROUPED_STEP_RULE
    assert f"trained by compiled loop (numba) (lr {lr:g}, patience {patience})" in \
        _provenance.describe(res.provenance)
    monkeypatch.setenv(_numba.NO_COMPILED_VAR, "1")   # set before the analysis, no re-import
    res = mlem_neuro.mlem_array(rng.standard_normal((20, 3, 2)), table, **kw)
    assert res.provenance["training"] == ["torch (cpu)"]
    assert res.provenance["compiled_training"] is False


def test_the_record_comes_from_return_values_not_a_context_variable():
    """No side channel: the provenance module holds no context variable (a fit in a
    worker process, where one is lost, is recorded like any other) and records only what
    it is given."""
    import contextvars

    from mlem_neuro import _provenance

    assert not hasattr(_provenance, "recording")
    assert not hasattr(_provenance, "note_training")
    assert not any(isinstance(v, contextvars.ContextVar) for v in vars(_provenance).values())
    assert _provenance.collect()["training"] is None
    prov = _provenance.collect("cpu", [("torch (cpu)", 0.03, 50), ("torch (cpu)", 0.03, 50),
                                       ("compiled loop (numba)", 0.1, 20)])
    assert prov["training"] == ["compiled loop (numba)", "torch (cpu)"]
    assert prov["step_rules"] == [{"lr": 0.03, "patience": 50}, {"lr": 0.1, "patience": 20}]


def _two_features(n=24, seed=0):
    rng = np.random.default_rng(seed)
    table = pd.DataFrame({"a": np.tile(["x", "y"], n // 2), "b": np.repeat(["u", "v"], n // 2)})
    X = rng.standard_normal((n, 5, 2)) + (table["a"] == "x").to_numpy(float)[:, None, None]
    return X, table


@pytest.mark.parametrize("backend, name", [("auto", "compiled loop (numba)"),
                                           ("torch", "torch (cpu)")])
def test_the_test_of_interactions_records_its_backend(backend, name, monkeypatch):
    """The test of interactions' fits (the shared-rank path, fastnull's blocks, which
    may run in worker processes) come back with the backend that trained them, and the
    analysis records them with its own fits."""
    from mlem_neuro import inference, interaction
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.rdms.sources import DenseRDMSource

    X, table = _two_features()
    opts = MLEMOptions(cv=2, n_repeats=1, max_steps=5, random_state=0, backend=backend)
    source = DenseRDMSource(X.transpose(2, 0, 1))
    *_, trained = interaction.interaction_test(source, table, opts, n_null=3,
                                               random_state=1, return_training=True)
    assert trained == {(name, *GROUPED_STEP_RULE)}        # both fits, categorical rule
    # the analysis records what the test returns: a marker through the test
    seen = []
    real = inference._interaction_test

    def marked(*args, **kw):
        obs, null, trained = real(*args, **kw)
        seen.append(trained)
        return obs, null, trained | {("marker", 0.5, 7)}

    monkeypatch.setattr(inference, "_interaction_test", marked)
    res = mlem_neuro.mlem_array(X, table, cv=2, n_repeats=1, max_steps=5, n_null=9,
                                random_state=0, backend=backend, verbose="ERROR")
    assert "interactions" in res.tests and seen == [{(name, *GROUPED_STEP_RULE)}]
    assert res.provenance["training"] == sorted([name, "marker"])
    assert res.provenance["step_rules"] == [dict(zip(("lr", "patience"), GROUPED_STEP_RULE)),
                                            {"lr": 0.5, "patience": 7}]


def test_the_interaction_tests_workers_return_their_backend():
    """With n_jobs=2 the test's blocks of models train in worker processes (where a
    context variable set here would be lost): their backend comes back all the same."""
    from mlem_neuro.core.options import MLEMOptions
    from mlem_neuro.core.rdms.sources import DenseRDMSource
    from mlem_neuro.interaction import interaction_test

    X, table = _two_features()
    opts = MLEMOptions(cv=2, n_repeats=1, max_steps=5, random_state=0, n_jobs=2)
    *_, trained = interaction_test(DenseRDMSource(X.transpose(2, 0, 1)), table, opts,
                                   n_null=3, random_state=1, return_training=True)
    assert trained == {("compiled loop (numba)", *GROUPED_STEP_RULE)}


@pytest.mark.parametrize("numeric, rule", [
    (False, dict(zip(("lr", "patience"), GROUPED_STEP_RULE))),
    (True, dict(zip(("lr", "patience"), PER_PAIR_STEP_RULE)))])
def test_results_record_the_step_rule_used(numeric, rule):
    """``lr="auto"`` and ``patience="auto"`` resolved: 0.1 / 10 for a categorical design
    (grouped full batches; its null models and test of interactions too), 0.03 / 50 for
    a numeric one trained pair by pair; the settings keep what was asked."""
    X, table = _two_features()
    kw = {}
    if numeric:
        table = table.assign(b=np.random.default_rng(1).uniform(size=len(table)))
        kw = dict(numeric_levels=None)
    res = mlem_neuro.mlem_array(X, table, cv=2, n_repeats=1, max_steps=5, n_null=3,
                                random_state=0, verbose="ERROR", **kw)
    assert res.provenance["step_rules"] == [rule]
    assert res.settings["lr"] == "auto" and res.settings["patience"] == "auto"


def test_files_of_older_versions_with_training_used_read_back(result, tmp_path):
    """Results written before issue 40 kept the training paths twice (the settings'
    ``training_used`` and the provenance): they read back as written."""
    import json

    from mlem_neuro import _provenance

    fname = result.save(tmp_path / "p_mlem.npz")
    with np.load(fname) as f:
        entries = {k: f[k] for k in f.files}
    header = json.loads(str(entries.pop("__header__")))
    header["settings"]["training_used"] = ["compiled loop (numba)"]
    header["provenance"].pop("step_rules")
    with open(tmp_path / "old_mlem.npz", "wb") as f:
        np.savez(f, __header__=np.array(json.dumps(header)), **entries)
    back = read_result(tmp_path / "old_mlem.npz")
    assert back.settings["training_used"] == ["compiled loop (numba)"]
    assert back.provenance["training"] == result.provenance["training"]
    assert "step_rules" not in back.provenance
    assert "trained by compiled loop (numba)" in _provenance.describe(back.provenance)


def test_the_estimator_records_its_provenance():
    from mlem_neuro import MLEM

    X, table = _two_features()
    est = MLEM(max_steps=5, random_state=0).fit(X[:, :, 0], table)
    assert est.provenance_["training"] == ["compiled loop (numba)"]
    assert est.provenance_["step_rules"] == [dict(zip(("lr", "patience"), GROUPED_STEP_RULE))]
    assert est.provenance_["device"] == "cpu"
    est = MLEM(max_steps=5, random_state=0, backend="torch").fit(X[:, :, 0], table)
    assert est.provenance_["training"] == ["torch (cpu)"]
