"""The package's rooms and their layers: every top-level module and sub-package is a room
(core's sub-packages one level deeper: ``core.training``, ``core.ranks``, ...), an
import between two modules is an arrow between their rooms, and the arrows form no
circle (the last ones were untied in issue 40).  ``tests/test_imports.py`` checks the
same for single modules.

Layers, bottom up: the leaves (``core.constants``, ``core.checks``), the compiled kernels
(``core.kernels``), the rest of ``core`` (options, stimuli, ranks, rdms, training,
scoring), the driver (``crossval``, ``inference``, ``interaction``), the result
containers and group statistics, then the entry points (time-resolved, searchlight,
adapters, command line).  ``core`` does not yet stand on its own: it still reaches the
package's logging and device helpers (``utils``) and its job runner (``_jobs``); those
arrows are listed below, so a new one fails here (the provenance record left in issue 40:
what trained the models comes back in what the fits return; the thread policy left with
the runtime, :mod:`mlem_neuro.core.runtime`, resolved at the entry point and passed down).
"""
from test_imports import cycles, import_graph


def room(module):
    parts = module.split(".")
    if parts[1:2] == ["core"] and len(parts) > 2:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def room_graph():
    edges = {}
    for module, targets in import_graph().items():
        a = room(module)
        edges.setdefault(a, set())
        for target in targets:
            b = room(target)
            edges.setdefault(b, set())
            if a != b:
                edges[a].add(b)
    return edges


#: the circles between rooms that remain (none since the grid of numeric distances moved
#: into training and the options stopped building a FeatureSpace)
KNOWN_CIRCLES = []

#: core's arrows to the package's top level that remain: none (issue 40; the thread
#: policy moved into ``core.runtime``, the logging and random-state helpers into
#: ``core.utils``, the job runner into ``core.jobs``)
CORE_REACHES_UP = set()


def test_the_rooms_form_no_new_circle():
    edges = room_graph()
    assert len(edges) > 25
    found = sorted(cycles(edges))
    assert found == sorted(KNOWN_CIRCLES), (
        "circles between rooms changed: " + "; ".join(" <-> ".join(c) for c in found)
        + " (a new one is a design knot to untie; a known one gone: remove it from "
          "KNOWN_CIRCLES)")


def test_the_detector_finds_a_planted_room_circle():
    edges = {"mlem_neuro.results": {"mlem_neuro.stats"},
             "mlem_neuro.stats": {"mlem_neuro.results"}, "mlem_neuro.cli": set()}
    assert cycles(edges) == [["mlem_neuro.results", "mlem_neuro.stats"]]


def test_the_lower_rooms_do_not_reach_up():
    edges = room_graph()
    # the results containers and the group statistics: the statistics read results,
    # never the other way (family-wise error over tests lives in core.scoring)
    assert "mlem_neuro.stats" not in edges["mlem_neuro.results"]
    # stimulus codes are read by the null designs, not the reverse
    assert "mlem_neuro.core.scoring" not in edges["mlem_neuro.core.stimuli"]
    # core reaches the top level only through the known arrows
    up = {b for a, targets in edges.items() if a.startswith("mlem_neuro.core")
          for b in targets if not b.startswith("mlem_neuro.core")}
    assert up <= CORE_REACHES_UP, sorted(up - CORE_REACHES_UP)
    assert up == CORE_REACHES_UP, ("an arrow is gone: remove it from CORE_REACHES_UP",
                                   sorted(CORE_REACHES_UP - up))
    # the driver and the entry points are never imported by core, results or stats
    for lower in [r for r in edges if r.startswith("mlem_neuro.core")] + [
            "mlem_neuro.results", "mlem_neuro.stats"]:
        assert not edges[lower] & {"mlem_neuro.crossval", "mlem_neuro.inference",
                                   "mlem_neuro.time_resolved", "mlem_neuro.searchlight",
                                   "mlem_neuro.cli", "mlem_neuro.bids"}, lower
