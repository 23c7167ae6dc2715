"""The thread policy: available cores, torch's threads set for the work and restored, and
the runtime that carries them (:class:`mlem_neuro.core.runtime.Runtime`): resolved once
at the entry point, passed down explicitly."""
import os

import numpy as np
import pytest
import torch

import mlem_neuro
from mlem_neuro import MLEM, crossval
from mlem_neuro._threads import (
    ENV_VAR,
    available_cores,
    cgroup_cpu_limit,
    requested_threads,
    torch_threads,
    worker_threads,
)
from mlem_neuro.core import runtime as rt
from mlem_neuro.core.options import MLEMOptions
from mlem_neuro.core.rdms.sources import DenseRDMSource
from mlem_neuro.core.runtime import Runtime
from mlem_neuro.simulation import simulate_representations


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def threads3():
    """torch at 3 threads during the test (a setting the policy never picks here)."""
    old = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(old)


def _cgroup(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize("files, limit", [
    ({"cpu.max": "150000 100000\n"}, 2),                 # v2: ceil(1.5) = 2
    ({"cpu.max": "50000 100000"}, 1),                    # half a core: at least 1
    ({"cpu.max": "400000 100000"}, 4),
    ({"cpu.max": "max 100000"}, None),                   # no quota
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),   # v1
    ({"cpu/cpu.cfs_quota_us": "250000", "cpu/cpu.cfs_period_us": "100000"}, 3),
    ({"cpu,cpuacct/cpu.cfs_quota_us": "100000",
      "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 1),
    ({"cpu.max": "garbage"}, None),
    ({}, None),                                          # no cgroup files at all
])
def test_cgroup_cpu_limit(tmp_path, files, limit):
    assert cgroup_cpu_limit(_cgroup(tmp_path, files)) == limit


def test_available_cores_affinity_and_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5},
                        raising=False)
    monkeypatch.setattr(rt, "CGROUP_ROOT", str(tmp_path / "none"))
    assert available_cores() == 6
    monkeypatch.setattr(rt, "CGROUP_ROOT", _cgroup(tmp_path,
                                                         {"cpu.max": "250000 100000"}))
    assert available_cores() == 3                        # the quota caps the affinity
    monkeypatch.setattr(rt, "CGROUP_ROOT", _cgroup(tmp_path / "big",
                                                         {"cpu.max": "1600000 100000"}))
    assert available_cores() == 6                        # the affinity caps the quota
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)   # not on Linux
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert available_cores() == 5


def test_available_cores_here():
    cores = available_cores()
    assert 1 <= cores <= (os.cpu_count() or cores)


@pytest.mark.parametrize("cores", [1, 2, 3, 8])
@pytest.mark.parametrize("env", [None, "1", "2", "64"])
def test_workers_times_threads_never_exceed_cores(monkeypatch, cores, env):
    monkeypatch.setattr(rt, "available_cores", lambda: cores)
    if env is not None:
        monkeypatch.setenv(ENV_VAR, env)
    wanted = 1 if env is None else int(env)
    for workers in range(1, cores + 1):
        threads = worker_threads(workers)
        assert 1 <= threads <= wanted
        assert workers * threads <= cores
        if env == "64":                     # asked for more: every core is used
            assert threads == cores // workers
    assert worker_threads(cores + 3) == 1   # more workers than cores: one thread each


def test_env_values(monkeypatch):
    assert requested_threads() == 1
    for text, value in [("", 1), (" 3 ", 3), ("off", None), ("OFF", None)]:
        monkeypatch.setenv(ENV_VAR, text)
        assert requested_threads() == value
    monkeypatch.setenv(ENV_VAR, "off")
    assert worker_threads(2) is None


@pytest.mark.parametrize("text", ["0", "-2", "1.5", "two", "auto"])
def test_bad_env_values_are_refused(monkeypatch, text):
    monkeypatch.setenv(ENV_VAR, text)
    with pytest.raises(ValueError, match=f"{ENV_VAR} must be a positive int.*'off'"):
        worker_threads(1)


def test_torch_threads_restores_the_callers_setting(threads3):
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == threads3
    with pytest.raises(RuntimeError, match="boom"):
        with torch_threads(2):
            assert torch.get_num_threads() == 2
            raise RuntimeError("boom")
    assert torch.get_num_threads() == threads3
    with torch_threads(None):                # "off": nothing changes
        assert torch.get_num_threads() == threads3
    assert torch.get_num_threads() == threads3


@pytest.fixture(scope="module")
def data():
    X, y, _ = simulate_representations(30, 3, 10, noise=0.1, random_state=0)
    return X, y


FAST = dict(max_steps=20, patience=5, random_state=0)


def test_analysis_runs_on_policy_threads_and_restores(data, threads3, monkeypatch):
    X, y = data
    seen = []
    fit_chunk = crossval._fit_chunk

    def spy(*args):
        seen.append(torch.get_num_threads())
        return fit_chunk(*args)

    monkeypatch.setattr(crossval, "_fit_chunk", spy)
    res = mlem_neuro.mlem_array(np.stack([X, X], axis=-1), y, cv=3, n_repeats=1, **FAST)
    assert res.importance.shape[0] == 2
    assert seen == [1, 1, 1]                 # one chunk per fold, each on one thread
    assert torch.get_num_threads() == threads3

    monkeypatch.setenv(ENV_VAR, "2")         # asked for more: at most the cores
    seen.clear()
    crossval.run_cv(DenseRDMSource(X[None]), y, MLEMOptions(cv=3, n_repeats=1, **FAST))
    assert seen == [min(2, available_cores())] * 3
    assert torch.get_num_threads() == threads3

    monkeypatch.setenv(ENV_VAR, "off")       # the policy off: the caller's threads
    seen.clear()
    crossval.run_cv(DenseRDMSource(X[None]), y, MLEMOptions(cv=3, n_repeats=1, **FAST))
    assert seen == [threads3] * 3


def test_analysis_restores_threads_on_error(data, threads3, monkeypatch):
    X, y = data

    def fail(*args):
        raise RuntimeError("chunk failed")

    monkeypatch.setattr(crossval, "_fit_chunk", fail)
    with pytest.raises(RuntimeError, match="chunk failed"):
        crossval.run_cv(DenseRDMSource(X[None]), y, MLEMOptions(cv=3, n_repeats=1, **FAST))
    assert torch.get_num_threads() == threads3


def test_worker_threads_for_n_jobs(data, monkeypatch):
    """Each joblib worker gets cores // n_jobs threads (at least one) with its chunk, for
    torch and for the compiled loop, and the main process runs on as many."""
    X, y = data
    calls, main = [], []

    def run_jobs(Parallel, jobs, n_total, n_jobs, desc, **kwargs):
        for function, args, _ in jobs:                   # run_with(runtime, _fit_chunk, ...)
            assert args[-1] is args[0]                   # the chunk is given the runtime
            calls.append((args[0].threads, args[0].compiled_threads))
        main.append(torch.get_num_threads())             # the main process meanwhile
        raise RuntimeError("stop")

    monkeypatch.setattr(crossval, "_run_jobs", run_jobs)
    monkeypatch.setattr(rt, "available_cores", lambda: 4)
    monkeypatch.setenv(ENV_VAR, "8")
    for n_jobs, threads in [(None, 4), (1, 4), (2, 2), (3, 1), (4, 1), (-1, None)]:
        calls.clear()
        with pytest.raises(RuntimeError, match="stop"):
            crossval.run_cv(DenseRDMSource(X[None]), y,
                            MLEMOptions(cv=3, n_repeats=1, n_jobs=n_jobs, **FAST))
        if threads is None:                  # -1: every core joblib counts here
            from joblib import effective_n_jobs
            threads = max(1, 4 // effective_n_jobs(-1))
        assert calls == [(threads, threads)] * 3 and main[-1] == threads


def test_estimator_runs_on_policy_threads_and_restores(data, threads3, monkeypatch):
    X, y = data
    seen = []
    fit_stack = mlem_neuro.estimator.fit_stack

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return fit_stack(*args, **kwargs)

    monkeypatch.setattr(mlem_neuro.estimator, "fit_stack", spy)
    est = MLEM(**FAST).fit(X, y)
    assert seen == [1] and torch.get_num_threads() == threads3
    est.score(X, y)
    est.permutation_importance(X, y, n_permutations=2)
    assert torch.get_num_threads() == threads3
    monkeypatch.setenv(ENV_VAR, "nonsense")
    with pytest.raises(ValueError, match=ENV_VAR):
        est.score(X, y)
    assert torch.get_num_threads() == threads3


@pytest.mark.parametrize("case", ["categorical", "numeric", "term", "mini-batches",
                                  "repeated folds", "tests"])
def test_threading_backend_gives_the_serial_numbers(case):
    """Chunks of a time point each, run in two threads of this process (joblib's
    threading backend, as a dask worker with several threads would): the numbers of the
    serial run, to the last bit.  (The repeated folds of a numeric design, per-pair
    training, differed by 9e-5 while the forms came from a matrix product over the
    chunk.)"""
    import joblib
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 40
    data = rng.standard_normal((n, 6, 8))
    table = pd.DataFrame({"A": np.arange(n) % 2, "B": (np.arange(n) // 2) % 2,
                          "C": rng.uniform(size=n)})
    data[:, :2, 3:6] += table[["A", "C"]].to_numpy()[:, :, None]
    kw = {"categorical": dict(), "numeric": dict(), "term": dict(level="term"),
          "mini-batches": dict(batch_size=200), "repeated folds": dict(cv=2, n_repeats=3),
          "tests": dict(n_null=3)}[case]
    if case == "categorical":
        table = table[["A", "B"]]
    kw = dict(dict(cv=5, n_repeats=1), **kw, random_state=1, max_steps=40, patience=10)
    ref = mlem_neuro.mlem_array(data, table, **kw)
    with joblib.parallel_config(backend="threading"):
        threaded = mlem_neuro.mlem_array(data, table, chunk_size=1, n_jobs=2, **kw)
    np.testing.assert_array_equal(threaded.fold_importance, ref.fold_importance)
    np.testing.assert_array_equal(threaded.fold_score, ref.fold_score)
    if case == "tests":
        np.testing.assert_array_equal(threaded.pvalues_fwe, ref.pvalues_fwe)


def test_the_compiled_loop_takes_the_workers_cores(monkeypatch):
    """The compiled loop's threads: every core a worker may use (cores // workers), capped
    by MLEM_NEURO_NUM_THREADS ("off": one); one outside the package's work
    (``Runtime()``)."""
    monkeypatch.setattr(rt, "available_cores", lambda: 8)
    assert rt.worker_cores(1) == 8 and rt.worker_cores(3) == 2
    assert rt.worker_cores(16) == 1
    assert Runtime.resolve(3).compiled_threads == 2 and Runtime.resolve(3).threads == 1
    monkeypatch.setenv(ENV_VAR, "3")
    assert rt.worker_cores(1) == 3 and rt.worker_cores(4) == 2
    assert Runtime.resolve(1).compiled_threads == 3 and Runtime.resolve(1).threads == 3
    monkeypatch.setenv(ENV_VAR, "off")
    assert rt.worker_cores(1) == 1
    assert Runtime.resolve(1).threads is None and Runtime.resolve(1).compiled_threads == 1
    assert Runtime().compiled_threads == 1 and Runtime().threads == 1


def test_resolve_reads_a_given_environment_not_the_process_one(monkeypatch):
    """``Runtime.resolve(environ=...)`` reads that mapping (the process's environment is
    not consulted), with the variables' documented meanings."""
    import dataclasses

    from mlem_neuro.core.memory import ENV_VAR as MEMORY_VAR

    monkeypatch.setattr(rt, "available_cores", lambda: 8)
    monkeypatch.setenv(ENV_VAR, "nonsense")              # would raise if it were read
    monkeypatch.setenv(MEMORY_VAR, "nonsense")
    r = Runtime.resolve(2, "cpu", environ={ENV_VAR: "3", MEMORY_VAR: "2GiB"})
    assert (r.threads, r.compiled_threads, r.n_workers, r.cores) == (3, 3, 2, 8)
    assert r.memory_bytes == 2 * 2**30 and r.device == "cpu"
    default = Runtime.resolve(1, environ={})
    assert (default.threads, default.compiled_threads) == (1, 8)
    assert default.memory_bytes == Runtime().memory_bytes
    with pytest.raises(ValueError, match=MEMORY_VAR):
        Runtime.resolve(1, environ={MEMORY_VAR: "lots"})
    with pytest.raises(ValueError, match=ENV_VAR):
        Runtime.resolve(1, environ={ENV_VAR: "0"})
    with pytest.raises(dataclasses.FrozenInstanceError):  # resolved once, for good
        r.threads = 1


def test_an_analysis_gives_the_compiled_loop_the_cores(data, monkeypatch):
    """The runtime resolved at the entry point reaches the compiled loop as an argument:
    the loop of every stack is allowed the worker's cores."""
    from mlem_neuro.core.training import compiled

    seen = []
    real = compiled.threads_for
    monkeypatch.setattr(compiled, "threads_for", lambda M, allowed=1: seen.append(
        allowed) or real(M, allowed))
    monkeypatch.setattr(rt, "available_cores", lambda: 2)
    X, y = data
    mlem_neuro.mlem_array(X[:, :, None], y, cv=2, n_repeats=1, max_steps=5, verbose="ERROR")
    assert seen and set(seen) == {2}
    seen.clear()
    MLEM(**FAST).fit(X, y)                               # the estimator: one worker
    assert seen == [2]


def test_the_runtime_is_resolved_once_per_analysis(data, monkeypatch):
    """run_cv reads the environment once, at its start: a variable changed while the
    analysis runs changes nothing in it; every chunk is given that one runtime, and a
    runtime given explicitly is the one that reaches the fits."""
    X, y = data
    resolved, given = [], []
    resolve = Runtime.resolve.__func__

    def counting(cls, *args, **kwargs):
        resolved.append(resolve(cls, *args, **kwargs))
        return resolved[-1]

    fit_chunk = crossval._fit_chunk

    def spy(*args):
        given.append(args[-1])
        monkeypatch.setenv(ENV_VAR, "nonsense")          # mid-run: not read again
        return fit_chunk(*args)

    monkeypatch.setattr(Runtime, "resolve", classmethod(counting))
    monkeypatch.setattr(crossval, "_fit_chunk", spy)
    crossval.run_cv(DenseRDMSource(X[None]), y, MLEMOptions(cv=3, n_repeats=1, **FAST))
    assert len(resolved) == 1 and len(given) == 3
    assert all(r is resolved[0] for r in given)
    monkeypatch.delenv(ENV_VAR)
    mine = Runtime(threads=1, compiled_threads=1)
    given.clear()
    crossval.run_cv(DenseRDMSource(X[None]), y, MLEMOptions(cv=3, n_repeats=1, **FAST),
                    runtime=mine)
    assert len(resolved) == 1 and given == [mine] * 3    # not resolved: given


def test_no_context_variable_carries_the_runtime():
    """The runtime is passed as an argument: no module of the package uses context
    variables (the compiled loop's threads were one)."""
    import pathlib

    root = pathlib.Path(mlem_neuro.__file__).parent
    users = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if "contextvars" in p.read_text() or "ContextVar" in p.read_text()]
    assert users == []


def test_an_analysis_with_tests_resolves_one_runtime(monkeypatch):
    """An analysis with the test of interactions (its fold loop, its main effects, the
    test's fast fits) resolves one runtime, at its start, and the test's fits are given
    that one."""
    import pandas as pd

    from mlem_neuro.core.scoring import fastnull

    resolved, given = [], []
    resolve = Runtime.resolve.__func__

    def counting(cls, *args, **kwargs):
        resolved.append(resolve(cls, *args, **kwargs))
        return resolved[-1]

    scores = fastnull.interaction_scores

    def spy(*args, runtime=None, **kwargs):
        given.append(runtime)
        return scores(*args, runtime=runtime, **kwargs)

    monkeypatch.setattr(Runtime, "resolve", classmethod(counting))
    monkeypatch.setattr(fastnull, "interaction_scores", spy)
    rng = np.random.default_rng(0)
    n = 24
    table = pd.DataFrame({"A": np.arange(n) % 2, "B": (np.arange(n) // 2) % 2})
    data = rng.standard_normal((n, 4, 2))
    res = mlem_neuro.mlem_array(data, table, cv=2, n_repeats=1, n_null=3, max_steps=10,
                                random_state=0, verbose="ERROR")
    assert "interactions" in res.tests
    assert len(resolved) == 1 and given == resolved
