"""The validation page, generated from the ``validation/`` folder.

Every ``validation/*.py`` script (not ``_*.py``) must open with a module docstring: what it
measures, on which design, and how to run it. Its recorded figures live beside it, in
``validation/results/<script>.rst`` (reStructuredText; optional, subsections underlined with
``~``). :func:`render` lists every script, in the order of :data:`ORDER` then by name, as a
section labelled ``validation-<script>`` (underscores as hyphens): the first paragraph of
its docstring, its results, then the whole docstring as the script states it.

Run from ``doc/conf.py`` (the extension's :func:`setup`), it writes
``doc/generated/validation_scripts.txt``, which ``doc/validation.rst`` includes. A script
without a docstring, or a results file without its script, stops the build with a
``ValueError`` that names the file.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "validation"
OUTPUT = ROOT / "doc" / "generated" / "validation_scripts.txt"

#: scripts shown first, in this order (the tests' calibration, then power, then the rest)
ORDER = ("calib_null", "calib_defaults", "power_defaults", "calib_interactions",
         "calib_familywise", "calib_runs", "haxby_shuffle", "calib_group",
         "calib_group_interactions", "calib_crossdist", "design_collinearity", "recovery",
         "numeric_recovery", "why_mlem", "why_mlem_real")


def label(stem):
    """The reference label of a script's section (``:ref:`validation-calib-null```)."""
    return "validation-" + stem.replace("_", "-")


def summary(doc):
    """The docstring's first paragraph, on one line."""
    return " ".join(doc.split("\n\n")[0].split())


def scripts(folder=FOLDER):
    """``[(stem, docstring, results text or None)]`` of every validation script, in page
    order; raises ``ValueError`` for a script without a module docstring or a results file
    without its script."""
    folder = Path(folder)
    found = {}
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(), filename=str(path)))
        if not doc or not doc.strip():
            raise ValueError(f"{path}: a validation script needs a module docstring (what it "
                             "measures, the design, how to run it) for the validation page")
        results = folder / "results" / f"{path.stem}.rst"
        found[path.stem] = (doc.strip(), results.read_text() if results.exists() else None)
    if not found:
        raise ValueError(f"no validation scripts in {folder}")
    for results in sorted((folder / "results").glob("*.rst")):
        if results.stem not in found:
            raise ValueError(f"{results}: results without a script {results.stem}.py in "
                             f"{folder}")
    order = [s for s in ORDER if s in found] + sorted(s for s in found if s not in ORDER)
    return [(s, *found[s]) for s in order]


def render(folder=FOLDER):
    """The reStructuredText of the page's body: an overview table and a section a script."""
    items = scripts(folder)
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 30 70", "",
             "   * - script", "     - what it measures"]
    for stem, doc, _ in items:
        lines += [f"   * - :ref:`{stem}.py <{label(stem)}>`",
                  f"     - {summary(doc)}"]
    lines.append("")
    for stem, doc, results in items:
        title = f"``{stem}.py``"
        lines += [f".. _{label(stem)}:", "", title, "-" * len(title), "",
                  summary(doc), ""]
        if results:
            lines += [results.rstrip(), ""]
        else:
            lines += ["(No figures recorded on this page: the script's docstring says where "
                      "its results are used.)", ""]
        lines += [f"*The script* (``validation/{stem}.py``; its docstring)::", ""]
        lines += [("    " + line).rstrip() for line in doc.splitlines()]
        lines.append("")
    return "\n".join(lines)


def write(folder=FOLDER, output=OUTPUT):
    """Write :func:`render`'s text to ``output`` (only when it changed, so that Sphinx
    does not re-read the page for nothing); returns the path."""
    output = Path(output)
    text = render(folder)
    if not output.exists() or output.read_text() != text:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
    return output


def _generate(app):
    write()


def setup(app):
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    print(write())
