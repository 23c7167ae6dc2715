"""Docstrings: the shared ``docdict``, ``fill_doc`` and numpydoc checks of the public API.

The public API checked here is everything a user reaches: ``mlem_neuro.__all__``, the
``__all__`` of :mod:`mlem_neuro.stats`, :mod:`mlem_neuro.fmri`, :mod:`mlem_neuro.results`,
the public functions and classes of the modules behind them and of
:mod:`mlem_neuro.simulation`, and every entry of the API reference (``doc/api.rst``, which
adds ``crossval.run_cv`` and ``core.engine.fit_stack``: the rest of :mod:`mlem_neuro.crossval`
and :mod:`mlem_neuro.core` are internal drivers), with the public methods and properties of
each class.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import mlem_neuro
from mlem_neuro import _docs
from mlem_neuro._docs import docdict, fill_doc, fill_docstring, short_doc
from mlem_neuro.utils import verbose

ROOT = Path(__file__).resolve().parents[1]

#: numpydoc checks every public object must pass.
CHECKS = {
    "GL02": "closing quotes on their own line",
    "GL03": "no double blank line",
    "GL06": "only known section names",
    "GL07": "sections in the standard order",
    "GL08": "has a docstring",
    "SS01": "has a one-line summary",
    "PR01": "every parameter documented",
    "PR02": "no documented parameter that does not exist",
    "PR03": "parameters documented in signature order",
    "PR04": "every documented parameter has a type",
    "PR06": "standard type names (bool, str, int)",
    "PR07": "every documented parameter has a description",
    "PR10": "a space before the colon of 'name : type'",
    "RT01": "a Returns section when the function returns a value",
}

#: Known gaps in files owned elsewhere: object -> the codes it still fails.  A fix makes
#: test_known_gaps_are_still_open fail: then delete the entry.
KNOWN_GAPS = {
    "mlem_neuro.FeatureSpace.fit": {"PR01", "RT01"},
    "mlem_neuro.FeatureSpace.transform": {"PR01", "RT01"},
    "mlem_neuro.FeatureSpace.fit_transform": {"PR01", "RT01"},
    "mlem_neuro.set_log_level": {"PR01"},
    "mlem_neuro.adapters.epochs.epochs_data": {"PR01"},
    "mlem_neuro.fmri.trial_images": {"PR03", "PR04"},
    "mlem_neuro.simulation.classical_mds": {"PR01", "RT01"},
    "mlem_neuro.simulation.simulate_epochs": {"PR07"},
}

_PUBLIC_MODULES = ("mlem_neuro.stats", "mlem_neuro.fmri", "mlem_neuro.results")
_DEFINING_MODULES = ("mlem_neuro.stats.timecourse", "mlem_neuro.stats.maps",
                     "mlem_neuro.results.timecourse", "mlem_neuro.results.brainmap",
                     "mlem_neuro.results.spacetime",
                     "mlem_neuro.simulation")


def _api_rst_names():
    text = (ROOT / "doc" / "api.rst").read_text()
    block = text.split(".. autosummary::", 1)[1]
    return re.findall(r"^   ([A-Za-z_][\w.]*)\s*$", block, flags=re.M)


def _resolve(path):
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def _public_objects():
    """``{import path: object}`` of the public functions and classes (first path wins)."""
    paths = [f"mlem_neuro.{n}" for n in mlem_neuro.__all__]
    for mod in _PUBLIC_MODULES:
        paths += [f"{mod}.{n}" for n in importlib.import_module(mod).__all__]
    for mod in _DEFINING_MODULES:
        m = importlib.import_module(mod)
        paths += [f"{mod}.{n}" for n, v in vars(m).items() if not n.startswith("_")
                  and (inspect.isfunction(v) or inspect.isclass(v))
                  and v.__module__ == mod]
    paths += [f"mlem_neuro.{n}" for n in _api_rst_names()]
    out, seen = {}, set()
    for path in paths:
        obj = _resolve(path)
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or id(obj) in seen:
            continue                                # submodules, __version__, repeats
        seen.add(id(obj))
        out[path] = obj
    return out


def _members(objects):
    """Public methods ``{path: function}`` and properties ``{path: property}`` of classes
    (those the class defines itself: inherited ones are checked on their own class)."""
    methods, props = {}, {}
    for path, obj in objects.items():
        if not inspect.isclass(obj):
            continue
        for name, value in vars(obj).items():
            if name.startswith("_"):
                continue
            if isinstance(value, property):
                props[f"{path}.{name}"] = value
            elif inspect.isfunction(value) or isinstance(value, (classmethod, staticmethod)):
                methods[f"{path}.{name}"] = value
    return methods, props


OBJECTS = _public_objects()
METHODS, PROPERTIES = _members(OBJECTS)


def _numpydoc_errors(path):
    from numpydoc.validate import validate

    return [(code, msg) for code, msg in validate(path)["errors"] if code in CHECKS]


# -------------------------------------------------------------------------- docdict
def test_docdict_keys_sorted_in_source():
    keys = list(docdict)
    assert keys == sorted(keys), [a for a, b in zip(keys, sorted(keys)) if a != b]
    # the dict's order is the source order: every assignment is ``docdict["key"] = ...``
    tree = ast.parse(Path(_docs.__file__).read_text())
    assigned = [node.targets[0].slice.value for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Subscript)
                and getattr(node.targets[0].value, "id", None) == "docdict"]
    assert assigned == keys


@pytest.mark.parametrize("key", list(docdict))
def test_docdict_entry_format(key):
    lines = docdict[key].strip("\n").splitlines()
    name, sep, type_ = lines[0].partition(" : ")
    # the key is the parameter name, or the name plus a context suffix (cv_trials)
    assert sep and type_.strip(), f"{key}: first line must be 'name : type'"
    assert key == name or key.startswith(name + "_"), (key, name)
    assert len(lines) >= 2, f"{key} has no description"
    for line in lines[1:]:
        assert line.startswith("    ") and line == line.rstrip(), (key, line)
    assert "%" not in docdict[key]                 # safe for argparse help and for %-filling


def test_every_docdict_entry_is_used():
    sources = "\n".join(p.read_text() for p in (ROOT / "mlem_neuro").rglob("*.py")
                        if p.name != "_docs.py")
    unused = [k for k in docdict
              if f"%({k})s" not in sources and f'short_doc("{k}")' not in sources]
    assert not unused, f"docdict entries used by no docstring: {unused}"


# -------------------------------------------------------------------------- fill_doc
def test_fill_doc_indents_like_the_placeholder():
    def f(lr):
        """Do it.

        Parameters
        ----------
        %(lr)s
        """

    fill_doc(f)
    body = docdict["lr"].strip("\n").splitlines()
    assert f"\n        {body[0]}\n        {body[1]}\n" in f.__doc__
    assert "%(" not in f.__doc__


def test_fill_doc_keeps_other_text_and_percent_signs():
    doc = "Top 5% of pairs.\n\n    Parameters\n    ----------\n    %(tol)s\n    x : int\n"
    out = fill_docstring(doc)
    assert out.startswith("Top 5% of pairs.") and out.endswith("    x : int\n")
    assert "    tol : float\n        Minimum improvement" in out


def test_fill_doc_unknown_key_raises_with_suggestion():
    def g():
        """Bad.

        %(n_permutation)s
        """

    with pytest.raises(ValueError, match=r"n_permutation.*n_permutations.*_docs\.py"):
        fill_doc(g)


def test_fill_doc_refuses_inline_placeholder():
    with pytest.raises(ValueError, match="alone on its line"):
        fill_docstring("Uses %(lr)s inline.")
    with pytest.raises(ValueError, match="no entry 'nope'"):
        fill_docstring("Uses %(nope)s inline.")


def test_fill_doc_under_and_over_verbose():
    def body(lr=0.1, verbose=None):
        """Run.

        Parameters
        ----------
        %(lr)s
        %(verbose)s
        """
        return lr

    inner = verbose(fill_doc(body))             # @verbose above @fill_doc (the package's order)
    assert "%(" not in inner.__doc__ and "lr : float" in inner.__doc__
    assert inner.__wrapped__.__doc__ == inner.__doc__

    def body2(lr=0.1, verbose=None):
        """Run.

        %(lr)s
        """
        return lr

    outer = fill_doc(verbose(body2))            # the other order fills the wrapped one too
    assert "%(" not in outer.__doc__ and outer.__wrapped__.__doc__ == outer.__doc__
    assert outer(lr=0.5) == 0.5


@pytest.mark.parametrize("name", ["mlem_array", "mlem_epochs", "mlem_searchlight",
                                  "mlem_roi"])
def test_analyses_share_the_option_texts(name):
    func = getattr(mlem_neuro, name)
    doc = inspect.getdoc(func)
    for key in ("constraint", "lr", "tol", "batch_size", "missing_distance", "device"):
        assert docdict[key].strip("\n") in doc, (name, key)
    assert "%(" not in func.__wrapped__.__doc__


# ------------------------------------------------------------------------- short_doc
def test_short_doc_first_sentence_plain_text():
    assert short_doc("lr") == "AdamW learning rate (no weight decay)."
    for key in docdict:
        text = short_doc(key)
        assert text.endswith(".") and "\n" not in text, (key, text)
        assert "``" not in text and ":class:" not in text and ":func:" not in text, key
        assert len(text) < len(" ".join(docdict[key].split())), key
    # "e.g." does not end the sentence; roles keep their last name with "~"
    assert "(e.g. the run of each trial)" in short_doc("groups_images")
    assert "then gives GroupKFold folds" in short_doc("groups_images")
    assert short_doc("tol").startswith("Minimum improvement of the training Spearman that "
                                        "resets patience (default 1e-4).")


def test_short_doc_unknown_key():
    with pytest.raises(ValueError, match="no entry 'learning_rate'"):
        short_doc("learning_rate")


# -------------------------------------------------------------------------- numpydoc
def test_public_api_is_collected():
    for path in ("mlem_neuro.MLEM", "mlem_neuro.mlem_array", "mlem_neuro.mlem_roi",
                 "mlem_neuro.stats.permutation_cluster_test", "mlem_neuro.fmri.trial_images",
                 "mlem_neuro.results.BrainMapResult", "mlem_neuro.simulation.simulate_epochs",
                 "mlem_neuro.crossval.run_cv"):
        assert path in OBJECTS
    assert "mlem_neuro.MLEM.permutation_importance" in METHODS
    assert "mlem_neuro.MLEM.get_params" not in METHODS            # scikit-learn's own
    assert "mlem_neuro.results.BaseResult.importance" in PROPERTIES
    assert len(OBJECTS) + len(METHODS) > 40


@pytest.mark.parametrize("path", sorted(OBJECTS) + sorted(METHODS))
def test_numpydoc(path):
    pytest.importorskip("numpydoc")
    errors = [(c, m) for c, m in _numpydoc_errors(path)
              if c not in KNOWN_GAPS.get(path, ())]
    assert not errors, "\n".join(f"{path}: {c} {m}" for c, m in errors)


def test_known_gaps_are_still_open():
    pytest.importorskip("numpydoc")
    fixed = {path: codes - {c for c, _ in _numpydoc_errors(path)}
             for path, codes in KNOWN_GAPS.items()}
    fixed = {p: c for p, c in fixed.items() if c}
    assert not fixed, f"fixed: remove these from KNOWN_GAPS: {fixed}"


@pytest.mark.parametrize("path", sorted(PROPERTIES))
def test_public_properties_have_docstrings(path):
    doc = PROPERTIES[path].__doc__
    assert doc and doc.strip()[0].isupper() and doc.strip().endswith((".", ")")), path


# ---------------------------------------------------------------------- placeholders
def _all_docstrings():
    for info in pkgutil.walk_packages(mlem_neuro.__path__, "mlem_neuro."):
        if info.name in ("mlem_neuro._docs",     # documents the placeholder syntax itself
                         "mlem_neuro.__main__"):  # runs the command line on import
            continue
        module = importlib.import_module(info.name)
        yield info.name, module.__doc__
        for name, obj in vars(module).items():
            if getattr(obj, "__module__", None) != info.name:
                continue
            yield f"{info.name}.{name}", getattr(obj, "__doc__", None)
            if inspect.isclass(obj):
                for attr, value in vars(obj).items():
                    yield f"{info.name}.{name}.{attr}", getattr(value, "__doc__", None)


def test_no_unfilled_placeholder():
    docs = list(_all_docstrings())
    assert len(docs) > 100
    left = [name for name, doc in docs if isinstance(doc, str) and re.search(r"%\(\w+\)s",
                                                                           doc)]
    assert not left, f"unfilled %(...)s placeholders (add @fill_doc): {left}"
