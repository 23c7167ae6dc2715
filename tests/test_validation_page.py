"""The validation page is generated from ``validation/``: every script appears on it, and a
script without a docstring stops the build (``doc/sphinxext/validation_page.py``)."""
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "validation_page", ROOT / "doc" / "sphinxext" / "validation_page.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_validation_script_is_on_the_generated_page(tmp_path):
    gen = _generator()
    scripts = sorted(p.stem for p in (ROOT / "validation").glob("*.py")
                     if not p.name.startswith("_"))
    assert len(scripts) >= 15
    out = gen.write(output=tmp_path / "validation_scripts.txt")
    text = out.read_text()
    for stem in scripts:
        label = stem.replace("_", "-")
        assert f".. _validation-{label}:" in text, stem
        assert f"``{stem}.py``" in text and f"validation/{stem}.py" in text, stem
    # each recorded results file is on the page, under its script
    for results in (ROOT / "validation" / "results").glob("*.rst"):
        assert results.stem in scripts, f"{results.name} has no script"
        first = next(line for line in results.read_text().splitlines() if line.strip())
        assert first in text
    # the page includes the generated text, and the index lists it, the user changelog
    # (what's new) and, just after it, the performance history (changelog)
    assert "generated/validation_scripts.txt" in (ROOT / "doc" / "validation.rst").read_text()
    index = (ROOT / "doc" / "index.rst").read_text()
    assert re.search(r"^   validation$", index, re.M)
    assert re.search(r"^   whats_new\n   changelog$", index, re.M)


def test_labels_other_pages_use_are_defined():
    """``:ref:`` targets used on the hand-written pages exist on them or on the generated
    page (the calibration tables moved from the method page to the validation page)."""
    gen = _generator()
    doc = ROOT / "doc"
    text = "".join(p.read_text() for p in doc.glob("*.rst")) + gen.render()
    defined = set(re.findall(r"^\.\. _([\w-]+):", text, re.M))
    used = set()
    for p in list(doc.glob("*.rst")) + list((ROOT / "validation" / "results").glob("*.rst")):
        for target in re.findall(r":ref:`(?:[^`<]*<)?([\w-]+)>?`", p.read_text()):
            used.add(target)
    assert used - {u for u in used if u.startswith("sphx_glr")} <= defined, \
        sorted(used - defined)


def test_a_script_without_a_docstring_fails_loudly(tmp_path):
    gen = _generator()
    folder = tmp_path / "validation"
    folder.mkdir()
    (folder / "calib_ok.py").write_text('"""Calibration of something."""\n')
    (folder / "_helper.py").write_text("x = 1\n")           # helpers are not studies
    assert "calib_ok" in gen.render(folder)
    (folder / "calib_bare.py").write_text("import numpy\n")
    with pytest.raises(ValueError, match="calib_bare.py: a validation script needs a module "
                                         "docstring"):
        gen.render(folder)
    (folder / "calib_bare.py").write_text('""" """\n')
    with pytest.raises(ValueError, match="calib_bare.py"):
        gen.render(folder)


def test_results_without_their_script_fail_loudly(tmp_path):
    gen = _generator()
    folder = tmp_path / "validation"
    (folder / "results").mkdir(parents=True)
    (folder / "calib_ok.py").write_text('"""Calibration of something."""\n')
    (folder / "results" / "calib_gone.rst").write_text("A table.\n")
    with pytest.raises(ValueError, match="calib_gone.rst: results without a script"):
        gen.render(folder)


def _private_imports(path):
    """``module.name`` of every private name ``path`` imports from the package."""
    import ast

    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlem_neuro"):
            if any(part.startswith("_") for part in node.module.split(".")):
                bad.append(node.module)
            bad += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.startswith("mlem_neuro")
                    and any(part.startswith("_") for part in a.name.split("."))]
    return bad


@pytest.mark.parametrize("folder", ["benchmarks", "validation"])
def test_user_scripts_import_no_private_names(folder):
    """What a user runs (``benchmarks/``, ``validation/``) imports only public names; the
    micro-benchmarks on internals live in ``benchmarks/internals/``."""
    found = {p.name: _private_imports(p) for p in sorted((ROOT / folder).glob("*.py"))}
    assert not {k: v for k, v in found.items() if v}
