"""Packaging: PEP 621 metadata, licence, optional extras, lazy imports, the set-up script,
doctest collection and lint."""
import configparser
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = {"numpy", "scipy", "pandas", "scikit-learn", "joblib", "torch", "torchsort", "numba"}
OPTIONAL = {"meeg": {"mne"}, "fmri": {"nilearn", "nibabel"}, "viz": {"matplotlib"},
            "bids": {"mne-bids"}}
HEAVY = sorted(n.replace("-", "_") for n in set().union(*OPTIONAL.values()))  # import names


def _pyproject():
    try:
        import tomllib
    except ModuleNotFoundError:                     # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _names(requirements):
    """Distribution names of requirement strings (extras and versions dropped)."""
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].strip().lower() for r in requirements}


def test_pyproject_has_pep621_metadata():
    project = _pyproject()["project"]
    assert project["name"] == "mlem_neuro"
    assert project["dynamic"] == ["version"]
    assert _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "mlem_neuro._version.__version__"}
    assert project["readme"] == "README.md" and project["requires-python"] == ">=3.10"
    assert project["authors"] == [{"name": "mlem_neuro developers"}]
    assert project["scripts"] == {"mlem-neuro": "mlem_neuro.cli:main"}
    assert any(c.startswith("Programming Language :: Python :: 3") for c in
               project["classifiers"])
    assert _pyproject()["build-system"]["build-backend"] == "setuptools.build_meta"


def test_license_file_matches_declared_license():
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert re.search(r"Copyright \(c\) \d{4}, mlem_neuro developers", text)
    assert [n for n in ("1.", "2.", "3.") if f"\n{n} " in text] == ["1.", "2.", "3."]
    assert "Neither the name of the copyright holder" in text      # the third clause


def test_setup_cfg_no_longer_duplicates_metadata():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert not {"metadata", "options", "options.extras_require",
                "options.entry_points"} & set(cfg.sections())
    assert "pyproject.toml" in (ROOT / "setup.cfg").read_text()


def test_dependencies_core_and_extras():
    project = _pyproject()["project"]
    assert _names(project["dependencies"]) == CORE
    extras = project["optional-dependencies"]
    for extra, names in OPTIONAL.items():
        assert _names(extras[extra]) == names
    assert extras["all"] == ["mlem_neuro[meeg,fmri,viz,bids]"]
    assert "mlem_neuro[all]" in extras["test"] and "mlem_neuro[all]" in extras["doc"]
    assert {"pytest", "dask", "ruff"} <= _names(extras["test"])
    assert {"sphinx", "sphinx-gallery", "numpydoc"} <= _names(extras["doc"])
    torch = [r for r in project["dependencies"] if _names([r]) == {"torch"}]
    assert torch == ["torch>=2.1"]


def test_installed_metadata_matches_the_source():
    import mlem_neuro

    try:
        meta = importlib.metadata.metadata("mlem_neuro")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("mlem_neuro is not installed (make test installs it)")
    assert meta["Version"] == mlem_neuro.__version__
    requires = meta.get_all("Requires-Dist")
    assert _names(r for r in requires if "extra ==" not in r) == CORE, \
        "installed metadata is stale: re-run tools/setup_env.sh (make install)"
    assert set(OPTIONAL) | {"all", "test", "doc"} <= set(meta.get_all("Provides-Extra"))
    scripts = {e.name: e.value for e in importlib.metadata.entry_points(group="console_scripts")
               if e.name == "mlem-neuro"}
    assert scripts == {"mlem-neuro": "mlem_neuro.cli:main"}


PROBE = textwrap.dedent("""
    import importlib.abc, sys, traceback
    HEAVY = {heavy!r}
    first = {{}}

    class Watch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in HEAVY and top not in first:
                frames = [f"{{f.filename}}:{{f.lineno}}" for f in traceback.extract_stack()
                          if "mlem_neuro" in f.filename]
                first[top] = frames[-1] if frames else "outside mlem_neuro"
            return None

    sys.meta_path.insert(0, Watch())
    import mlem_neuro
    from mlem_neuro.simulation import simulate_representations
    X, y, _ = simulate_representations(n_stimuli=30, n_features=3, n_units=8, random_state=0)
    est = mlem_neuro.MLEM(max_steps=20, random_state=0).fit(X, y)
    est.score(X, y)
    est.permutation_importance(X, y, n_permutations=2, random_state=0)
    print("LOADED", sorted(m for m in HEAVY if m in sys.modules), first)
    import nibabel                                     # control: the probe sees an import
    print("CONTROL", "nibabel" in sys.modules and "nibabel" in first)
""")


def test_core_import_and_fit_do_not_import_optional_packages():
    """``import mlem_neuro; MLEM().fit(...)`` loads none of mne, nilearn, nibabel, matplotlib."""
    proc = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = next(line for line in proc.stdout.splitlines() if line.startswith("LOADED"))
    assert loaded.startswith("LOADED [] "), f"imported on the core path (by file:line): {loaded}"
    assert "CONTROL True" in proc.stdout


def test_console_script_runs():
    script = Path(sys.executable).with_name("mlem-neuro")
    if not script.exists():
        pytest.skip("the mlem-neuro script is not installed next to this interpreter")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "demo" in proc.stdout and "searchlight" in proc.stdout


def _build_wheel(tmp_path, env=None):
    """Names in a wheel built from a clean copy of the sources."""
    pytest.importorskip("setuptools", minversion="77")
    pytest.importorskip("wheel")
    src = tmp_path / "src"
    shutil.copytree(ROOT / "mlem_neuro", src / "mlem_neuro",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    for name in ("pyproject.toml", "setup.cfg", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                           "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                          capture_output=True, text=True, timeout=300,
                          env=None if env is None else {**os.environ, **env})
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("mlem_neuro-*.whl")
    return wheel, zipfile.ZipFile(wheel).namelist()


def _compiled(names):
    return [n for n in names if re.search(r"\.(so|pyd|c)$", n)]


@pytest.mark.slow
def test_wheel_builds_without_a_c_compiler(tmp_path):
    """The compiled kernels are numba's (compiled when first used): the wheel is pure
    Python and builds with no working compiler."""
    wheel, names = _build_wheel(tmp_path, env={"CC": "false", "LDSHARED": "false"})
    assert "mlem_neuro/core/training/compiled.py" in names and not _compiled(names)
    assert "mlem_neuro/core/kernels/training.py" in names          # the kernels' package
    assert wheel.name.endswith("-py3-none-any.whl")


@pytest.mark.slow
def test_wheel_builds_with_metadata_and_licence(tmp_path):
    wheel, names = _build_wheel(tmp_path)
    assert "mlem_neuro/core/training/engine.py" in names and "mlem_neuro/cli.py" in names
    assert not [n for n in names if n.startswith(("tests/", "conftest"))]
    assert not _compiled(names)       # pure Python: numba compiles the kernels
    info = next(n.split("/")[0] for n in names if ".dist-info/" in n)
    assert f"{info}/licenses/LICENSE" in names
    meta = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in meta
    assert re.search(r'Requires-Dist: mne>=[\d.]+; extra == "meeg"', meta)
    assert "Requires-Dist: torch>=2.1\n" in meta


def test_setup_script_installs_pinned_torch_first_and_probes_quietly():
    script = (ROOT / "tools" / "setup_env.sh").read_text()
    assert subprocess.run(["bash", "-n", str(ROOT / "tools" / "setup_env.sh")]).returncode == 0
    assert "TORCH_SPEC=${MLEM_TORCH_SPEC:-torch==2.13.0}" in script
    install = script.index('pip install -q -e ".[all,test,doc]" "torch==$TORCH_VERSION"')
    assert script.index('pip install "$TORCH_SPEC"') < install
    assert script.index('pip install -q "numpy') < script.index('pip install "$TORCH_SPEC"')
    # every probe that imports torch before the final summary line hides its stderr
    lines = [ln for ln in script[:install].splitlines() if "import torch" in ln]
    assert lines and all("2>/dev/null" in ln or "2>&1" in ln for ln in lines), lines
    # no other line lets pip resolve a torch on its own
    for ln in script.splitlines():
        if "pip install" in ln and "torch" in ln:
            assert "TORCH_SPEC" in ln or "torch==" in ln or "torchsort" in ln.lower(), ln


def test_pytest_collects_the_package_doctests():
    options = _pyproject()["tool"]["pytest"]["ini_options"]
    assert {"tests", "mlem_neuro"} <= set(options["testpaths"])
    assert "--doctest-modules" in options["addopts"]
    assert set(options["doctest_optionflags"]) == {"NORMALIZE_WHITESPACE", "ELLIPSIS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "mlem_neuro"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    doctests = [ln for ln in proc.stdout.splitlines() if re.match(r"mlem_neuro/\S+\.py::", ln)]
    assert len(doctests) >= 5, proc.stdout[-3000:]


def test_ruff():
    """The whole repository passes ruff with the settings of pyproject.toml."""
    ruff = [sys.executable, "-m", "ruff"]
    if subprocess.run([*ruff, "--version"], capture_output=True).returncode:
        if shutil.which("ruff") is None:
            pytest.skip("ruff is not installed (pip install ruff, or make install)")
        ruff = [shutil.which("ruff")]
    # --no-cache: the checkout may be read-only (a non-root user's run of the suite)
    proc = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", "."],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
