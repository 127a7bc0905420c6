"""The certificate checker every multicast plan passes, written apart from the planners.

It recomputes, from the plan's own hops and the cluster state: what each new GPU receives, where
it comes from, the fair-share rates, the timeline and the objective, and returns every violated
rule as a sentence (an empty tuple means the plan is valid).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

from blitzplan.cluster import ClusterState, Role
from blitzplan.multicast.types import Hop, Lane, MulticastPlan, NodeKind, PlanNode

__all__ = ["validate_multicast"]

_TOL = 1e-6
_LOCAL_METHODS = ("allcache", "serverlessllm")


def validate_multicast(state: ClusterState, plan: MulticastPlan) -> tuple[str, ...]:
    """Every rule ``plan`` breaks, as sentences; empty when it is valid."""
    problems: list[str] = []
    problems += _check_instances(plan)
    problems += _check_sources(state, plan)
    problems += _check_bytes(plan)
    problems += _check_flows(state, plan)
    if not problems:
        problems += _check_timeline(state, plan)
        problems += _check_objective(plan)
    return tuple(problems)


def _check_instances(plan: MulticastPlan) -> list[str]:
    out = []
    seen: set[str] = set()
    for node in plan.nodes:
        if node.kind is not NodeKind.TARGET:
            continue
        members = [i for i in plan.instances if i.node == node.id]
        expected = tuple(g for i in members for g in i.gpus)
        if expected != node.gpus:
            out.append(f"target node {node.id} holds {node.gpus}, its instances {expected}")
        if node.stripes != len(members) and any(
            lane.fraction < 1 for hop in plan.hops if hop.receiver == node.id for lane in hop.lanes
        ):
            out.append(f"target node {node.id} stripes {node.stripes} ways for {len(members)}")
    for inst in plan.instances:
        if set(inst.gpus) & seen:
            out.append(f"instance {inst.name} shares GPUs with another new instance")
        seen |= set(inst.gpus)
    return out


def _check_sources(state: ClusterState, plan: MulticastPlan) -> list[str]:
    out = []
    instances = {inst.id: inst for inst in state.instances}
    prefill_gpus = {g for i in state.instances if i.role is Role.PREFILL for g in i.gpus}
    received = {hop.receiver: h for h, hop in enumerate(plan.hops)}
    for h, hop in enumerate(plan.hops):
        sender = plan.nodes[hop.sender]
        if sender.kind is NodeKind.INSTANCE:
            inst = instances.get(sender.instance_id or "")
            if inst is None or inst.identity != plan.model:
                out.append(f"hop {h} sends from {sender.label}, which does not hold {plan.model}")
            elif inst.role is Role.PREFILL and not plan.allow_prefill_sources:
                out.append(f"hop {h} sends from prefill instance {inst.id}")
        elif sender.kind is NodeKind.HOST:
            copy = state.pool.host_copy(plan.model)
            if copy is None or copy.node != sender.memory:
                out.append(f"hop {h} sends from {sender.memory}, not the host copy of {plan.model}")
        elif sender.kind is NodeKind.CACHE:
            if plan.method not in _LOCAL_METHODS:
                out.append(f"hop {h} reads an assumed local cache in method {plan.method!r}")
        elif received.get(hop.sender, math.inf) >= h:
            out.append(f"hop {h} forwards from node {hop.sender} before any hop feeds it")
        if not plan.allow_prefill_sources:
            used = {lane.exit for lane in hop.lanes} | {lane.holder for lane in hop.lanes}
            if used & prefill_gpus and sender.kind is not NodeKind.TARGET:
                out.append(f"hop {h} relays over prefill GPUs {sorted(used & prefill_gpus)}")
    return out


def _check_bytes(plan: MulticastPlan) -> list[str]:
    """Each new GPU gets every stripe of its shard exactly once: network plus all-gather."""
    out = []
    got: dict[str, list[float]] = defaultdict(list)
    stripes: dict[str, list[int]] = defaultdict(list)
    hops_into: dict[int, int] = defaultdict(int)
    for hop in plan.hops:
        hops_into[hop.receiver] += 1
        for lane in hop.lanes:
            got[lane.dst].append(lane.fraction)
            stripes[lane.dst].append(lane.stripe)
    for gather in plan.allgathers:
        node = plan.nodes[gather.node]
        for lane in gather.lanes:
            got[lane.dst].append(lane.fraction)
            if lane.dst not in node.gpus or lane.holder not in node.gpus:
                out.append(f"all-gather of node {node.id} leaves the node ({lane.holder})")
    for node in plan.nodes:
        if node.kind in (NodeKind.TARGET, NodeKind.STAGE) and hops_into[node.id] != 1:
            out.append(f"node {node.id} ({node.label}) is fed by {hops_into[node.id]} hops")
    for inst in plan.instances:
        for gpu in inst.gpus:
            total = sum(got[gpu])
            if abs(total - 1.0) > _TOL:
                out.append(f"{inst.name} GPU {gpu} receives {total:.6f} of its shard, not 1")
            if len(set(stripes[gpu])) != len(stripes[gpu]):
                out.append(f"{inst.name} GPU {gpu} receives a stripe twice")
    return out


def _check_flows(state: ClusterState, plan: MulticastPlan) -> list[str]:
    """Flows are paths from holder to receiver; rates are the fair share; no link overfull."""
    out = []
    topo = state.topology
    lanes = [lane for hop in plan.hops for lane in hop.lanes]
    lanes += [lane for gather in plan.allgathers for lane in gather.lanes]
    for lane in lanes:
        edges = plan.flows[lane.flow].edges
        if edges[0][0] != lane.holder or edges[-1][1] != lane.dst:
            out.append(
                f"flow {lane.flow} runs {edges[0][0]}->{edges[-1][1]}, "
                f"not {lane.holder}->{lane.dst}"
            )
        if any(a[1] != b[0] for a, b in itertools.pairwise(edges)):
            out.append(f"flow {lane.flow} is not a connected path")
        if any(not topo.graph.has_edge(*e) for e in edges):
            out.append(f"flow {lane.flow} uses an edge the topology lacks")
    if out:
        return out
    for phase in sorted(set(plan.flow_phase)):
        ids = [i for i, p in enumerate(plan.flow_phase) if p == phase]
        flows = [plan.flows[i] for i in ids] + list(plan.background)
        rates = topo.fair_share(flows)
        for i, rate in zip(ids, rates, strict=False):
            if abs(rate - plan.rates[i]) > _TOL * rate:
                out.append(f"flow {i} has rate {plan.rates[i]:.6g}, fair share gives {rate:.6g}")
        load: dict[tuple[str, str], float] = defaultdict(float)
        for flow, rate in zip(flows, rates, strict=True):
            for edge in flow.edges:
                load[edge] += rate
        for edge, used in load.items():
            if used > topo.bytes_per_s(edge) * (1 + _TOL):
                out.append(f"phase {phase} puts {used:.6g} B/s on {edge}, over its capacity")
    return out


def _check_timeline(state: ClusterState, plan: MulticastPlan) -> list[str]:
    """Recompute the recurrence hop by hop and compare."""
    out = []
    unit = plan.unit_bytes
    units = len(unit)
    done: dict[int, list[float]] = {}
    arrival: dict[int, list[float]] = {}
    first: dict[int, float] = {}
    hop_end: list[float] = []
    startup: dict[int, float] = defaultdict(float)
    for inst in plan.instances:
        startup[inst.node] = max(startup[inst.node], inst.startup_s)
    topo = state.topology
    latency = {
        i: sum(topo.latency_s(edge) for edge in flow.edges) for i, flow in enumerate(plan.flows)
    }
    gathers = {gather.node: gather for gather in plan.allgathers}
    for h, hop in enumerate(plan.hops):
        sender, receiver = plan.nodes[hop.sender], plan.nodes[hop.receiver]
        scale = receiver.tp if receiver.kind is NodeKind.STAGE else 1
        need = [0.0 if receiver.has(u) else float(scale * b) for u, b in enumerate(unit)]
        if hop.sender in done:
            ready = done[hop.sender]
            if not hop.pipelined:
                avail, begin = [ready[-1]] * units, ready[-1]
            elif _same_stripes(sender, receiver):
                avail, begin = arrival[hop.sender], first[hop.sender]
            else:
                avail, begin = ready, first[hop.sender]
        else:
            avail, begin = [0.0] * units, 0.0
        begin = max([begin, startup[hop.receiver], *(hop_end[a] for a in hop.after)])
        times = _recurrence(plan, hop, latency, need, avail, begin, receiver)
        arrival[hop.receiver] = times
        first[hop.receiver] = _first_chunk(plan, hop, latency, need[0], begin)
        hop_end.append(times[-1])
        gather = gathers.get(hop.receiver)
        done[hop.receiver] = (
            _gather(plan, gather.lanes, latency, need, times, receiver) if gather else times
        )
        if not _close(times, plan.arrival_s[h]):
            out.append(f"hop {h} arrivals differ from the recurrence")
    for inst in plan.instances:
        expected = done.get(inst.node)
        if expected is None or not _close(expected, plan.layer_ready_s[inst.name]):
            out.append(f"{inst.name} layer ready times differ from the recurrence")
        elif abs(plan.ready_at_s[inst.name] - expected[-1]) > _TOL * max(1.0, expected[-1]):
            out.append(f"{inst.name} ready_at_s differs from its last unit")
    return out


def _same_stripes(sender: PlanNode, receiver: PlanNode) -> bool:
    return (
        sender.kind is NodeKind.TARGET
        and receiver.kind is NodeKind.TARGET
        and len(sender.gpus) == len(receiver.gpus)
        and sender.stripes == receiver.stripes
        and sender.tp == receiver.tp
    )


def _recurrence(
    plan: MulticastPlan,
    hop: Hop,
    latency: dict[int, float],
    need: list[float],
    avail: list[float],
    begin: float,
    receiver: PlanNode,
) -> list[float]:
    lat = max(latency[lane.flow] for lane in hop.lanes)
    t = begin
    out = []
    for u, b in enumerate(need):
        if receiver.has(u):
            out.append(0.0)  # delivered by an earlier plan: there now, no transfer
            continue
        stream = max(lane.fraction * b / plan.rates[lane.flow] for lane in hop.lanes)
        chunk = max(
            min(plan.chunk_bytes, lane.fraction * b) / plan.rates[lane.flow] for lane in hop.lanes
        )
        t = max(avail[u] + chunk + lat, t + stream)
        out.append(t)
    return out


def _first_chunk(
    plan: MulticastPlan, hop: Hop, latency: dict[int, float], b: float, begin: float
) -> float:
    """When the first chunk of unit 0 reaches the receiver: a forwarding sender passes each
    chunk on as it arrives, so this waits for the hop's start, not for the sender's unit 0."""
    lat = max(latency[lane.flow] for lane in hop.lanes)
    chunk = max(
        min(plan.chunk_bytes, lane.fraction * b) / plan.rates[lane.flow] for lane in hop.lanes
    )
    return begin + chunk + lat


def _gather(
    plan: MulticastPlan,
    lanes: tuple[Lane, ...],
    latency: dict[int, float],
    need: list[float],
    arrival: list[float],
    receiver: PlanNode,
) -> list[float]:
    lat = max(latency[lane.flow] for lane in lanes)
    t = 0.0
    out = []
    for u, b in enumerate(need):
        if receiver.has(u):
            out.append(0.0)
            continue
        t = max(arrival[u], t) + max(lane.fraction * b / plan.rates[lane.flow] for lane in lanes)
        t += lat
        out.append(t)
    return out


def _close(a: list[float] | tuple[float, ...], b: list[float] | tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(
        abs(x - y) <= _TOL * max(1.0, abs(y)) for x, y in zip(a, b, strict=True)
    )


def _check_objective(plan: MulticastPlan) -> list[str]:
    out = []
    ready = plan.ready_at_s
    if plan.objective == "sum_ready":
        value = sum(ready.values())
    elif plan.objective == "live_ready":
        value = max(ready[name] for name in plan.live) if plan.live else math.nan
    else:
        value = max(ready.values())
    if not abs(value - plan.objective_s) <= _TOL * max(1.0, value):
        out.append(f"objective_s {plan.objective_s} but the ready times give {value}")
    if plan.lower_bound_s > plan.objective_s * (1 + _TOL):
        out.append(f"lower bound {plan.lower_bound_s} exceeds the objective {plan.objective_s}")
    return out
