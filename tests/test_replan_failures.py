"""Replans of a busy fleet's plan after each kind of failure (issue 19): every surviving new GPU
ends with every byte exactly once, no byte is claimed that the old steps had not delivered, and
the replan ends no later than the survivors loaded afresh (the fault campaign's independent
``check``: the multicast validator, the program's byte certificate, ``validate_replan`` and the
fresh load). Also: ``recover`` keeps the surviving instances as they were."""

from __future__ import annotations

import functools

import networkx as nx
import pytest

from blitzplan import ClusterState, InvalidInputError, load_topology
from blitzplan.scale import ScalePlan, ScaleRequest, plan, replan
from blitzplan.scale.fresh_load import fresh_bound_s, fresh_end_s, fresh_ingress_s, fresh_inputs
from blitzplan.scale.realize import Targets
from blitzplan.scale.recovery import Failure, recover
from blitzplan.topologies import Topology, links
from tests.fault_campaign import check


@functools.cache
def _busy() -> tuple[ClusterState, ScalePlan]:
    """rail-leafspine-1024 serving llama-3-8b (8 prefill instances with queues on h0, 4 decode
    instances on each of h1 and h2, one GPU each; the benchmark's busy fleet, smaller) and its
    plan of +4 prefill instances."""
    topology = load_topology("rail-leafspine-1024")
    state = ClusterState(topology, models=["llama-3-8b"])
    gpus = topology.gpus()
    for k in [*range(12), *range(16, 20)]:
        role = "prefill" if k < 8 else "decode"
        queue = [(-0.05 * i, 512 + 256 * (i % 5)) for i in range(8)] if role == "prefill" else []
        state.add_instance("llama-3-8b", gpus=[gpus[k]], role=role, queue=queue)
    return state, plan(state, ScaleRequest("llama-3-8b", prefill=4, tp=1))


def _source_gpu(base: ScalePlan) -> str:
    return next(s.source for s in base.steps if s.holder == "instance")


def _failure(kind: str, state: ClusterState, base: ScalePlan) -> Failure:
    """A failure of ``kind`` that hits what the plan sends from or to."""
    topo, source = state.topology, _source_gpu(base)
    if kind == "source instance":
        return next(i.id for i in state.instances if source in i.gpus)
    if kind == "source gpu":
        return source
    if kind == "source nic":
        return topo.nic_of(source)
    if kind == "source host":
        return topo.host_of(source)
    target = base.new_instances[0].gpus[0]
    if kind == "target nic link":
        nic = topo.nic_of(target)
        return (nic, next(n for n in topo.graph.successors(nic) if topo.kind(n) == "switch"))
    return target  # "target gpu"


KINDS = ["source instance", "source gpu", "source nic", "source host", "target nic link",
         "target gpu"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_a_replan_after_each_kind_of_failure_delivers_every_byte(kind: str) -> None:
    state, base = _busy()
    failed = _failure(kind, state, base)
    at = 0.5 * base.milestones.full_capacity_s
    after = replan(base, state, at_s=at, failed=[failed])
    assert check(base, state, [failed], at, after) == []
    assert after.held  # half-way through, the survivors keep bytes already delivered
    survivors = {s.name for s in recover(base, state, at_s=at, failed=[failed]).survivors}
    assert {i.name for i in after.new_instances} == survivors


@pytest.mark.parametrize("fraction", [0.2, 0.8])
def test_a_replan_after_a_source_host_fails_is_checked_at_other_times(fraction: float) -> None:
    state, base = _busy()
    failed = _failure("source host", state, base)
    at = fraction * base.milestones.full_capacity_s
    assert check(base, state, [failed], at, replan(base, state, at_s=at, failed=[failed])) == []


def test_recover_keeps_the_surviving_instances_as_they_were() -> None:
    state, base = _busy()
    failed = _failure("source gpu", state, base)
    current = recover(base, state, at_s=0.01, failed=[failed]).state
    gone = {i.id for i in state.instances if failed in i.gpus}
    assert len(gone) == 1
    assert [i.id for i in current.instances] == [i.id for i in state.instances if i.id not in gone]
    assert all(current.instance(i.id) == i for i in state.instances if i.id not in gone)
    assert current.counters == state.counters  # no id handed out again
    assert failed not in current.topology.gpus()


def test_keep_instances_refuses_what_it_cannot_keep() -> None:
    state, _ = _busy()
    first = state.instances[0]
    other = ClusterState(state.topology)
    other.keep_instances([first])
    assert other.instances == (first,)
    with pytest.raises(InvalidInputError, match="new Instance records"):
        other.keep_instances([first])  # its id is taken
    with pytest.raises(InvalidInputError, match="new Instance records"):
        other.keep_instances(["i0"])  # type: ignore[list-item]
    moved = type(first)(**{**first.__dict__, "id": "copy"})
    with pytest.raises(InvalidInputError, match="not a free GPU"):
        other.keep_instances([moved])  # its GPU is busy
    small = ClusterState(load_topology("h200-8"))
    with pytest.raises(InvalidInputError, match="not a free GPU"):
        small.keep_instances([state.instances[-1]])  # its GPU is not in that topology


# --- the bounds that spare a replan the fresh load -------------------------------------------


@pytest.mark.parametrize("kind", ["source gpu", "source host", "target nic link"])
def test_the_in_link_bound_is_below_the_cut_bound_and_the_fresh_load(kind: str) -> None:
    """The in-link bound a replan tries first is certified: never above the per-instance cut
    bound of the fresh problem, nor above when the fresh load (the same greedy) ends."""
    state, base = _busy()
    failed = _failure(kind, state, base)
    at = 0.5 * base.milestones.full_capacity_s
    recovery = recover(base, state, at_s=at, failed=[failed])
    groups = tuple(s.gpus for s in recovery.survivors)
    names = tuple(s.name for s in recovery.survivors)
    targets = Targets(groups=groups, names=names, startup_s=dict.fromkeys(names, 0.002))
    inputs = fresh_inputs(base, recovery, targets, base.options)
    ingress = fresh_ingress_s(inputs)
    assert 0.002 < ingress <= fresh_bound_s(inputs) * (1 + 1e-12)
    assert ingress <= fresh_end_s(inputs) * (1 + 1e-12)
    # hand-computed: the slowest survivor GPU's rank buffer over the rates of its in-links
    derated = inputs["state"].topology
    shard = sum(base.multicast.unit_bytes)  # type: ignore[union-attr]
    slowest = min(
        sum(d["bytes_per_s"] for _, _, d in derated.graph.in_edges(g, data=True))
        for group in groups
        for g in group
    )
    assert ingress == pytest.approx(0.002 + shard / slowest, rel=1e-12)


# --- the degraded topology: only the hosts a failure touches are rewired ----------------------


def _every_gpu_rewired(topology: Topology, dead: set[str]) -> nx.DiGraph:
    """The degraded graph by the rule applied to every GPU (the oracle of the shortcut)."""
    graph = nx.DiGraph(topology.graph)
    graph.remove_nodes_from(dead)
    for gpu in topology.gpus():
        group = topology.graph.nodes[gpu].get("nvlink_group")
        if gpu in graph and group is not None and group not in graph:
            graph.nodes[gpu]["nvlink_group"] = None
    lost = {g for g in topology.gpus() if g not in dead and not links._rewire(topology, graph, g)}
    graph.remove_nodes_from(lost)
    return graph


@pytest.mark.parametrize(
    ("name", "dead"),
    [
        ("dgx-h100-64", {"h3/nic2"}),
        ("dgx-h100-64", {"h3/nic2", "h5/gpu1", "leaf1"}),
        ("rail-leafspine-1024", {"h8/nic0"}),
        ("paper-a800-32", {"h1/nic0", "h2/gpu3", "leaf0"}),
        ("h200-8", {"h0/gpu2"}),
    ],
)
def test_a_degraded_topology_equals_every_gpu_rewired(name: str, dead: set[str]) -> None:
    """Property: rewiring only the hosts a failure touches (a dead part on the host, or a dead
    node one of its NICs links to, such as a leaf) gives the graph of rewiring every GPU."""
    topology = load_topology(name)
    degraded = topology.without(nodes=dead)
    expected = _every_gpu_rewired(topology, dead)
    assert dict(degraded.graph.nodes(data=True)) == dict(expected.nodes(data=True))
    assert sorted(degraded.graph.edges(data=True)) == sorted(expected.edges(data=True))
