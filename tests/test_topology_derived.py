"""Derived topologies (derated, without failed parts) keep their parent's routes and NICs only
where a fresh build finds the same ones: checked against a fresh build of the same graph."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from blitzplan import load_topology
from blitzplan.topologies import Topology
from blitzplan.topologies.fabric_routes import fabric_path


def _switch(topology: Topology, kind: str) -> str:
    return next(n for n, d in topology.graph.nodes(data=True) if d.get("switch") == kind)


def _failures(topology: Topology) -> list[tuple[list[str], list[tuple[str, str]]]]:
    gpu = topology.gpus()[5]
    nic = topology.nic_of(topology.gpus()[9])
    leaf = topology.leaf_of_nic(nic)
    assert leaf is not None
    out: list[tuple[list[str], list[tuple[str, str]]]] = [
        ([gpu], []),
        ([nic], []),
        ([leaf], []),
        ([_switch(topology, "nvswitch")], []),
        ([], [(nic, leaf)]),
        ([gpu, topology.nic_of(topology.gpus()[-1])], []),
    ]
    spines = [n for n, d in topology.graph.nodes(data=True) if d.get("switch") == "spine"]
    if spines:
        out.append(([spines[0]], []))
    return out


def _ends(topology: Topology) -> list[str]:
    """Every third GPU (both ends of each NIC's rail and NVLink pairs among them) and every
    host memory: the kinds of route a plan asks for."""
    return [*topology.gpus()[::3], *(topology.host_mem(h) for h in topology.hosts())]


def _warm(topology: Topology) -> None:
    """Fill the route caches as a plan does."""
    for src, dst in itertools.permutations(_ends(topology), 2):
        topology.has_path(src, dst)


def _same(derived: Topology) -> None:
    """``derived`` answers every query as a fresh build of its graph does."""
    fresh = Topology(nx.DiGraph(derived.graph), name=derived.name)
    assert list(derived.graph.nodes(data=True)) == list(fresh.graph.nodes(data=True))
    assert list(derived.graph.edges(data=True)) == list(fresh.graph.edges(data=True))
    for node in derived.graph:  # the order a search meets predecessors in
        assert list(derived.graph.pred[node]) == list(fresh.graph.pred[node])
    assert {g: derived.nic_of(g) for g in derived.gpus()} == {
        g: fresh.nic_of(g) for g in fresh.gpus()
    }
    for src, dst in itertools.permutations(_ends(derived), 2):
        found = derived.has_path(src, dst)
        assert found == fresh.has_path(src, dst), (src, dst)
        if found:
            assert derived.path(src, dst) == fresh.path(src, dst), (src, dst)


@pytest.mark.parametrize("name", ["dgx-h100-64", "paper-a800-32"])
def test_a_degraded_topology_routes_as_a_fresh_build(name: str) -> None:
    line = load_topology(name)
    parent = line.with_link_efficiency()
    _warm(parent)
    before = [(n, dict(d)) for n, d in parent.graph.nodes(data=True)]
    kept_any = False
    for nodes, links in _failures(parent):
        derived = parent.without(nodes=nodes, links=links)
        kept_any |= bool(derived._paths)
        _same(derived)
    assert kept_any  # the routes were kept somewhere, so the comparison checked them
    assert [(n, dict(d)) for n, d in parent.graph.nodes(data=True)] == before


def test_derating_a_degraded_topology_derates_its_parent_then_degrades() -> None:
    line = load_topology("dgx-h100-64")
    real = line.with_link_efficiency()
    _warm(real)
    gpu = line.gpus()[3]
    degraded = line.without(nodes=[gpu])
    derated = degraded.with_link_efficiency()
    assert derated.capacity == real.without(nodes=[gpu]).capacity
    assert derated.link_efficiency == real.link_efficiency
    assert gpu not in derated.graph
    _same(derated)
    _same(line.with_link_efficiency())


def _view_path(topology: Topology, a: str, b: str) -> tuple[str, ...] | None:
    """The reference: networkx's search on a filtered view of the fabric and the two ends."""
    view = nx.subgraph_view(
        topology.graph,
        filter_node=lambda n: (
            n in (a, b) or topology.graph.nodes[n].get("switch") in ("leaf", "spine")
        ),
    )
    try:
        return tuple(nx.shortest_path(view, a, b))
    except nx.NetworkXNoPath:
        return None


def _two_spines(name: str) -> Topology:
    """``name`` with a second spine joined to every leaf: routes between leaves tie."""
    graph = nx.DiGraph(load_topology(name).graph)
    graph.add_node("spine2", kind="switch", switch="spine")
    for leaf, spine, data in list(graph.edges(data=True)):
        if spine == "spine":
            graph.add_edge(leaf, "spine2", **data)
            graph.add_edge("spine2", leaf, **graph.edges["spine", leaf])
    return Topology(graph, name=f"{name} with two spines")


@pytest.mark.parametrize("name", ["dgx-h100-64", "rail-leafspine-1024", "two spines"])
def test_fabric_routes_are_the_ones_networkx_finds(name: str) -> None:
    topology = _two_spines("dgx-h100-64") if name == "two spines" else load_topology(name)
    nics = topology.nics()[:: max(1, len(topology.nics()) // 40)]
    leaf = topology.leaf_of_nic(nics[1])
    spines = [n for n, d in topology.graph.nodes(data=True) if d.get("switch") == "spine"]
    assert leaf is not None
    cases = [
        topology,
        topology.without(nodes=[leaf]),
        topology.without(links=[(nics[2], str(topology.leaf_of_nic(nics[2])))]),
    ]
    if spines:
        cases.append(topology.without(nodes=spines[:1]))
    found_none = False
    for case in cases:
        alive = [n for n in nics if n in case.graph]
        for a, b in itertools.permutations(alive, 2):
            route = fabric_path(case, a, b)
            assert route == _view_path(case, a, b), (case.name, a, b)
            found_none |= route is None
    assert found_none  # a cut-off NIC was among the pairs: the no-route answer was checked too
