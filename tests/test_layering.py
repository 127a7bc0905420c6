"""The package's import graph has no circle: subpackages import one way, modules too.

Every ``import`` of a blitzplan module counts, at module level or inside a function (a circle
held together by function-level imports is still a circle); imports for type checking only do
not (they never run)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

from tests.conftest import REPO


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    typing_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("blitzplan"):
            found |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("blitzplan")}
    return found


def _graph(level: int | None) -> nx.DiGraph:
    modules = {}
    for path in (REPO / "blitzplan").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def group(name: str) -> str:
        return name if level is None else ".".join(name.split(".")[:level])

    graph = nx.DiGraph()
    for name, path in modules.items():
        for target in _imports(path):
            found = owner(target)
            if found is None or found == name or name.startswith(found + "."):
                continue  # itself, or a package importing its own parts
            a, b = group(name), group(found)
            if a != b and "blitzplan" not in (a, b):
                graph.add_edge(a, b)
    return graph


def test_subpackages_import_one_way() -> None:
    assert list(nx.simple_cycles(_graph(2))) == []


def test_modules_import_one_way() -> None:
    assert list(nx.simple_cycles(_graph(None))) == []


def test_the_checker_sees_a_circle(tmp_path: Path) -> None:
    graph = nx.DiGraph([("blitzplan.a", "blitzplan.b"), ("blitzplan.b", "blitzplan.a")])
    assert list(nx.simple_cycles(graph))
    assert "blitzplan.scale.plan" in _graph(None)  # the scan finds the modules


MULTICAST_STAGES = ("setup", "allocation", "timeline", "planners", "bound", "exact", "validation")
"""multicast/'s sub-packages in pipeline order: each imports only the ones before it (and the
package's shared top-level modules: plan_types, refine_budget, planning_rate); the top-level
``methods`` drives them all, and none imports it."""


def _multicast_stage(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "multicast" else None


def test_multicast_stages_import_in_pipeline_order() -> None:
    graph = _graph(None)
    staged = [n for n in graph.nodes if _multicast_stage(n) is not None]
    assert {_multicast_stage(n) for n in staged} == set(MULTICAST_STAGES)
    assert ("blitzplan.multicast.allocation.stripes", "blitzplan.multicast.setup.problem") in (
        graph.edges
    )  # the scan sees imports between stages
    backward = [
        (a, b)
        for a, b in graph.edges
        if a in staged
        and b in staged
        and MULTICAST_STAGES.index(str(_multicast_stage(b)))
        > MULTICAST_STAGES.index(str(_multicast_stage(a)))
    ]
    assert backward == []
    top = {p.stem for p in (REPO / "blitzplan" / "multicast").glob("*.py") if p.stem != "__init__"}
    assert top == {"plan_types", "planning_rate", "refine_budget", "methods"}  # the rest: a stage
    driver = "blitzplan.multicast.methods"  # drives the stages: after all of them
    assert [a for a, b in graph.edges if b == driver and a in staged] == []
    assert ("blitzplan.multicast.methods", "blitzplan.multicast.exact.exact_search") in graph.edges
