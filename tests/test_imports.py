"""The package's modules import each other without circles: every ``import`` in every
module (at the top or inside a function) is an arrow, and the arrows form no cycle.

Module-level circles break imports; function-level ones hide a design knot (the fold
loop calling the tests built on it).  This test fails on the first new one."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "mlem_neuro"


def _modules():
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _targets(mods, name, node):
    package = name if mods[name].name == "__init__.py" else name.rsplit(".", 1)[0]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [f"{module}.{a.name}" if f"{module}.{a.name}" in mods else module
            for a in node.names]


def import_graph():
    mods = _modules()
    edges = {m: set() for m in mods}
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(mods, name, node):
                    # a package's __init__ importing its own modules is not an arrow back
                    if (target in mods and target != name
                            and not name.startswith(target + ".")):
                        edges[name].add(target)
    return edges


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_detector_finds_a_planted_cycle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    edges = import_graph()
    assert len(edges) > 40 and edges["mlem_neuro.crossval"]
    found = cycles(edges)
    assert not found, "import circles: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("lower, upper", [
    ("mlem_neuro.core.training.engine", "mlem_neuro.crossval"),
    ("mlem_neuro.core.scoring.fastnull", "mlem_neuro.crossval"),
    ("mlem_neuro.crossval", "mlem_neuro.inference"),
    ("mlem_neuro.core.training.compiled", "mlem_neuro.core.training.engine"),
    ("mlem_neuro.core.training.reference", "mlem_neuro.core.training.engine"),
    ("mlem_neuro.core.training.torch_loop", "mlem_neuro.core.training.engine"),
    ("mlem_neuro.core.training.backends", "mlem_neuro.core.training.engine"),
    ("mlem_neuro.core.kernels.training", "mlem_neuro.core.training.compiled"),
])
def test_lower_layers_do_not_import_upper_ones(lower, upper):
    assert upper not in import_graph()[lower]


def test_the_kernels_are_the_bottom_layer():
    """The compiled kernels (``core/kernels``) import nothing of the package but its
    constants (a leaf of numbers), and the sub-packages that call them (ranks, distances,
    stimuli, scoring) reach them without the training sub-package's compiled loop."""
    edges = import_graph()
    kernels = [m for m in edges if m.startswith("mlem_neuro.core.kernels")]
    assert "mlem_neuro.core.kernels.training" in kernels
    for module in kernels:
        outside = {t for t in edges[module] if not t.startswith("mlem_neuro.core.kernels")}
        assert outside <= {"mlem_neuro.core.constants"}, (module, outside)
    assert not edges["mlem_neuro.core.constants"], edges["mlem_neuro.core.constants"]
    for package in ("ranks", "rdms", "stimuli", "scoring"):
        for module in (m for m in edges if m.startswith(f"mlem_neuro.core.{package}")):
            assert "mlem_neuro.core.training.compiled" not in edges[module], module


#: the layers, lowest first: a module may import its own layer and the ones below
LAYERS = [
    ("mlem_neuro.core",),                                    # the array engine
    ("mlem_neuro.crossval",),                                # the fold loop
    ("mlem_neuro.inference", "mlem_neuro.interaction"),      # tests built on the fold loop
]


def _layer(module):
    for level, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return None


def test_no_upward_arrow_between_the_layers():
    """``core`` imports nothing of the fold loop or the tests above it, and the fold loop
    nothing of the tests (the interaction test lives above ``crossval``, in
    ``mlem_neuro.interaction``)."""
    upward = [(a, b) for a, targets in import_graph().items() for b in targets
              if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)]
    assert not upward, upward


def test_core_is_in_sub_packages_that_say_what_they_hold():
    mods = _modules()
    flat = sorted(m for m in mods if m.startswith("mlem_neuro.core.") and m.count(".") == 2
                  and mods[m].name != "__init__.py")
    assert flat == ["mlem_neuro.core.checks", "mlem_neuro.core.constants",
                    "mlem_neuro.core.jobs", "mlem_neuro.core.memory",
                    "mlem_neuro.core.options", "mlem_neuro.core.runtime",
                    "mlem_neuro.core.utils"]
    packages = {m.split(".")[2] for m in mods if m.count(".") >= 3
                and m.startswith("mlem_neuro.core.")}
    assert packages == {"kernels", "training", "ranks", "scoring", "rdms", "stimuli"}
    for package in packages:
        assert ast.get_docstring(ast.parse((ROOT / "core" / package / "__init__.py")
                                           .read_text())), package
