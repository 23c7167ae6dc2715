"""The package imports and runs for a user who can write neither the install nor the home
folder (a shared install on a cluster, a container run as another user).

numba caches the compiled kernels on disk; with no writable place its ``cache=True``
raised at import.  Here a copy of the package is made read-only, ``HOME`` is a read-only
folder, and Python runs in a child process as an unprivileged user: uid 65534 (nobody)
when the suite runs as root, else the user running it.  The child imports the package,
fits a model with the compiled kernels and runs a small analysis with tests.
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import mlem_neuro

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="POSIX permissions")

NOBODY = 65534
_PACKAGE = Path(mlem_neuro.__file__).parent
#: this process's import path (the environment's site-packages), for the child
_PATHS = [p for p in sys.path if p and os.path.isdir(p)]

_CHILD = textwrap.dedent("""
    import json, os, site, sys, warnings
    for path in json.loads(sys.argv[1]):
        site.addsitedir(path)
    sys.path.insert(0, sys.argv[2])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import numpy as np
        import pandas as pd
        import mlem_neuro
        from mlem_neuro import MLEM
        from mlem_neuro.core.kernels import _numba
        rng = np.random.default_rng(0)
        y = pd.DataFrame({"a": rng.choice(["x", "y"], 24), "b": rng.choice(["u", "v"], 24)})
        X = rng.normal(size=(24, 4)) + 2.0 * (y["a"] == "x").to_numpy()[:, None]
        est = MLEM(backend="compiled", random_state=0).fit(X, y)
        if sys.argv[3] == "analysis":
            res = mlem_neuro.mlem_array(np.repeat(X[:, :, None], 2, axis=2), y, cv=2,
                                        n_repeats=2, n_null=3, random_state=0)
        try:
            import mne
        except ImportError:
            mne_numba = None
        else:                           # MNE's own cached kernels (numba switches them on)
            from mne._numba import bincount
            mne_numba = float(bincount(np.array([0, 1, 1]), np.ones(3), 2)[1])
    import numba
    print(json.dumps({
        "numba_cache_dir": numba.config.CACHE_DIR,
        "mne_numba": mne_numba,
        "file": mlem_neuro.__file__,
        "plan": _numba._CACHE_PLAN,
        "compiled": est.provenance_["compiled_training"],
        "score": float(est.score(X, y)),
        "pvalues": (int(np.isfinite(res.pvalues).sum()) if sys.argv[3] == "analysis"
                    else None),
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught
                     if "numba" in str(w.message) or "cache" in str(w.message)],
    }))
""")


def _users():
    """How to run the child: ``(uid, command prefix, subprocess keywords)``.  As root:
    uid 65534 first; then, where that user cannot reach the interpreter or the
    environment (a checkout under a private folder), root without the capabilities that
    let it write read-only files (``setpriv``), which still sees a read-only install and
    home.  As another user: that user."""
    if os.geteuid() != 0:
        return [(os.geteuid(), [], {})]
    users = [(NOBODY, [], dict(user=NOBODY, group=NOBODY, extra_groups=[]))]
    setpriv = shutil.which("setpriv")
    if setpriv:
        caps = "-dac_override,-dac_read_search,-fowner"
        users.append((0, [setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}"], {}))
    return users


def _interpreters():
    """This interpreter, then the system's of the same version (an unprivileged user
    may not reach an interpreter installed under root's home)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    seen = []
    for exe in (sys.executable, os.path.realpath(sys.executable),
                f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if exe not in seen and os.path.exists(exe):
            seen.append(exe)
    return seen


@pytest.fixture(scope="module")
def readonly_install():
    """A read-only copy of the package and a read-only home, reachable by any user
    (under the system's temporary directory)."""
    root = Path(tempfile.mkdtemp(prefix="mlem_neuro_ro_"))
    try:
        os.chmod(root, 0o755)
        install = root / "install"
        shutil.copytree(_PACKAGE, install / "mlem_neuro",
                        ignore=shutil.ignore_patterns("__pycache__"))
        home = root / "home"
        home.mkdir()
        for path in [install, *install.rglob("*"), home]:
            os.chmod(path, 0o555 if path.is_dir() else 0o444)
        yield dict(root=root, install=install, home=home)
    finally:
        for path in [root, *root.rglob("*")]:
            if path.is_dir() and not path.is_symlink():
                os.chmod(path, 0o755)
        shutil.rmtree(root, ignore_errors=True)


def _run(ctx, name, analysis=True, prepare=None, timeout=600):
    """Run the child as the first user of :func:`_users` that can start Python, with
    ``TMPDIR`` a private folder of that user's (new: ``prepare(tmpdir, uid)`` first).
    Returns ``(uid, tmpdir, the child's report)``."""
    errors = []
    for k, (uid, prefix, keywords) in enumerate(_users()):
        tmpdir = ctx["root"] / f"{name}_{k}"
        if not tmpdir.exists():             # a later run under the same name reuses it
            tmpdir.mkdir()
            if os.geteuid() == 0:
                os.chown(tmpdir, uid, uid)
            os.chmod(tmpdir, 0o700)
            if prepare is not None:
                prepare(tmpdir, uid)
        env = {"HOME": str(ctx["home"]), "TMPDIR": str(tmpdir), "PATH": "/usr/bin:/bin",
               "MLEM_NEURO_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}
        args = [_CHILD, json.dumps(_PATHS), str(ctx["install"]),
                "analysis" if analysis else "fit"]
        for exe in _interpreters():
            try:
                proc = subprocess.run([*prefix, exe, "-c", *args], env=env,
                                      capture_output=True, text=True, timeout=timeout,
                                      cwd=str(ctx["root"]), **keywords)
            except PermissionError as err:      # this user cannot reach this interpreter
                errors.append(f"uid {uid}, {exe}: {err}")
                continue
            if proc.returncode == 0:
                return uid, tmpdir, json.loads(proc.stdout.strip().splitlines()[-1])
            errors.append(f"uid {uid}, {exe}: {proc.stderr.strip()[-2000:]}")
            if "mlem_neuro" in proc.stderr:     # the package failed, not the start
                pytest.fail("the package failed for an unprivileged user:\n"
                            + "\n".join(errors))
    pytest.fail("no user could run the child:\n" + "\n".join(errors))


def test_readonly_install_and_home_cache_in_tmp(readonly_install):
    """No writable place of numba's: the kernels are cached in the user's private folder
    in the temporary directory, quietly (no warning), for every numba kernel of the
    process (MNE's too), and a second process loads them."""
    ctx = readonly_install
    uid, tmpdir, first = _run(ctx, "cache")
    assert Path(first["file"]).parent == ctx["install"] / "mlem_neuro"
    cache = tmpdir / f"mlem_neuro-numba-{uid}"
    assert first["plan"] == [str(cache)]
    assert first["compiled"] is True
    assert first["score"] > 0.2                      # the encoded feature is found
    assert first["pvalues"] > 0                      # the tests ran
    assert first["warnings"] == []
    assert first["numba_cache_dir"] == str(cache)
    assert first["mne_numba"] in (None, 2.0)         # MNE's cached kernel ran
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    files = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    assert any(p.suffix == ".nbi" for p in files), "numba wrote no cache index"
    _, _, second = _run(ctx, "cache", analysis=False)    # the same user and TMPDIR
    assert second["plan"] == first["plan"] and second["warnings"] == []
    assert second["score"] == pytest.approx(first["score"], abs=1e-12)
    # the fit's kernels were loaded from the cache, not compiled and written again
    assert {p: files.get(p) for p in files} == {
        p: p.stat().st_mtime_ns for p in files}


def test_unsafe_private_folder_caches_for_the_process_only(readonly_install):
    """The user's private folder is not safe (others may write it): a new folder of the
    process's (0700) caches the kernels, MNE's included, and one warning says they
    compile in every process."""
    ctx = readonly_install

    def foreign_folder(tmpdir, uid):
        folder = tmpdir / f"mlem_neuro-numba-{uid}"
        folder.mkdir()
        os.chmod(folder, 0o777)         # writable by others: numba's cache runs as code

    uid, tmpdir, out = _run(ctx, "foreign", analysis=False, prepare=foreign_folder)
    foreign = tmpdir / f"mlem_neuro-numba-{uid}"
    (plan,) = out["plan"]
    assert plan is not None and Path(plan).parent == tmpdir and Path(plan) != foreign
    assert out["numba_cache_dir"] == plan and out["mne_numba"] in (None, 2.0)
    assert out["compiled"] is True and out["score"] > 0.2
    assert len(out["warnings"]) == 1 and "for this process only" in out["warnings"][0]
    assert not list(foreign.iterdir())
    assert not Path(plan).exists()                   # removed when the process ended
