"""The certificate checker every multicast plan passes, written apart from the planners.

It re-derives from the plan's lanes and the cluster state, without the planner's code: that every
new GPU receives every byte of its own rank's shard exactly once (stripe intervals partition
``[0, 1)`` for each unit it needs); that every lane's holder holds what it sends (a source's TP
rank, the model's host copy, or what arrived at the holder earlier in this plan; from an instance
of another TP degree, byte by byte in the model's layout); that no live instance sends over the
network and no prefill GPU sends unless allowed; that every flow is the route of its holder, exit
and destination and phases never share an edge at once (:mod:`.route_check`); that no link
carries more than its capacity beside the background flows (a background flow the plan leaves out
has ended before it starts) and every rate is positive; that lanes wait for nothing in a cycle;
the recurrence of every lane and each instance's readiness (:mod:`.timeline_check`); and the
objective. It returns every violated rule as a sentence (an empty tuple means the plan is valid).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

from blitzplan.cluster import ClusterState, Role
from blitzplan.multicast.plan_types import MulticastPlan, NodeKind
from blitzplan.multicast.validation.holdings_check import check_holdings
from blitzplan.multicast.validation.route_check import check_phases, check_routes
from blitzplan.multicast.validation.timeline_check import check_timeline
from blitzplan.topologies import fair_share_after

__all__ = ["validate_multicast"]

_TOL = 1e-6
_COORD = 1e-9
_LOCAL_METHODS = ("allcache", "serverlessllm")


def validate_multicast(state: ClusterState, plan: MulticastPlan) -> tuple[str, ...]:
    """Every rule ``plan`` breaks, as sentences; empty when it is valid."""
    problems: list[str] = []
    problems += _check_instances(plan)
    problems += _check_senders(state, plan)
    problems += _check_bytes(plan)
    problems += check_holdings(state, plan)
    problems += _check_flows(state, plan)
    problems += check_routes(state, plan)
    problems += _check_background(state, plan)
    if not problems:
        problems += _check_rates(state, plan)
    if not problems:
        problems += check_timeline(state, plan)
    if not problems:
        problems += check_phases(plan)
    if not problems:
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
        if set(node.relays) & set(node.gpus):
            out.append(f"target node {node.id} lists an instance GPU as a relay")
    for inst in plan.instances:
        if set(inst.gpus) & seen:
            out.append(f"instance {inst.name} shares GPUs with another new instance")
        seen |= set(inst.gpus)
    names = [i.name for i in plan.instances]
    if len(set(plan.live)) != len(plan.live) or not set(plan.live) <= set(names):
        out.append(f"live {plan.live} are not distinct new instances")
    return out


def _kv_nics(state: ClusterState, allow_prefill: bool) -> set[str]:
    """NICs that carry a prefill instance's KV caches: every prefill GPU's NIC, or with
    prefill sources allowed those of prefill instances with a decode instance of their model
    outside their NVLink group."""
    topo = state.topology
    out = set()
    for inst in state.instances:
        if inst.serving_role is not Role.PREFILL:
            continue
        group = set(topo.nvlink_group_of(inst.gpus[0]))
        leaves = any(
            o.serving_role is Role.DECODE
            and o.identity == inst.identity
            and not set(o.gpus) <= group
            for o in state.instances
        )
        if not allow_prefill or leaves:
            out |= {topo.nic_of(g) for g in inst.gpus}
    return out


def _check_senders(state: ClusterState, plan: MulticastPlan) -> list[str]:
    out = []
    topo = state.topology
    instances = {inst.id: inst for inst in state.instances}
    prefill = {g for i in state.instances if i.serving_role is Role.PREFILL for g in i.gpus}
    kv_nics = _kv_nics(state, plan.allow_prefill_sources)
    live_nodes = {i.node for i in plan.instances if i.name in plan.live}
    live_gpus = {g for n in live_nodes for g in (*plan.nodes[n].gpus, *plan.nodes[n].relays)}
    for lane in plan.lanes:
        sender = plan.nodes[lane.sender]
        where = f"lane {lane.flow} ({lane.holder}->{lane.dst})"
        if sender.kind is NodeKind.INSTANCE:
            inst = instances.get(sender.instance_id or "")
            loading_unknown = inst is not None and inst.role is Role.LOADING and not inst.loading
            if inst is None or inst.identity != plan.model or loading_unknown:
                out.append(f"{where} sends from {sender.label}, which does not serve {plan.model}")
            elif inst.serving_role is Role.PREFILL and not plan.allow_prefill_sources:
                out.append(f"{where} sends from prefill instance {inst.id}")
        elif sender.kind is NodeKind.HOST:
            copy = state.pool.host_copy(plan.model)
            if copy is None or copy.node != sender.memory:
                out.append(f"{where} sends from {sender.memory}, not the host copy of {plan.model}")
        elif sender.kind in (NodeKind.CACHE, NodeKind.STAGE) and plan.method not in _LOCAL_METHODS:
            out.append(f"{where} reads a baseline's local copy or staging in {plan.method!r}")
        if lane.gather:
            continue
        local = topo.graph.nodes[lane.holder]["host"] == topo.graph.nodes[lane.dst]["host"]
        if not local and lane.exit != lane.holder and lane.exit not in sender.exits:
            out.append(f"{where} leaves by {lane.exit}, not an exit of {sender.label}")
        if not plan.allow_prefill_sources and {lane.holder, lane.exit} & prefill:
            out.append(f"{where} sends from a prefill GPU")
        if not local and topo.kind(lane.exit) in ("nic", "gpu"):  # else check_routes says
            nic = lane.exit if topo.kind(lane.exit) == "nic" else topo.nic_of(lane.exit)
            if nic in kv_nics:
                out.append(f"{where} leaves by {nic}, which carries a prefill instance's KV")
        if not local and {lane.holder, lane.exit} & live_gpus:
            out.append(f"{where} sends over the network from the node of a live instance")
    return out


def _check_bytes(plan: MulticastPlan) -> list[str]:
    """Each instance GPU gets each stripe of its own rank exactly once; nothing lands outside."""
    out = []
    got: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for lane in plan.lanes:
        receiver = plan.nodes[lane.receiver]
        if receiver.kind is not NodeKind.TARGET:
            continue
        if lane.dst not in receiver.gpus + receiver.relays:
            out.append(f"lane {lane.flow} lands on {lane.dst}, outside node {receiver.id}")
            continue
        rank = receiver.rank_of(lane.dst)
        if rank is not None and lane.rank != rank:
            out.append(
                f"lane {lane.flow} lands rank {lane.rank} bytes on rank-{rank} GPU {lane.dst}"
            )
        elif rank is not None:
            got[lane.dst].append((lane.lo, lane.hi))
        if not 0 - _COORD <= lane.lo < lane.hi <= 1 + _COORD:
            out.append(f"lane {lane.flow} carries the empty or invalid stripe {lane.lo}..{lane.hi}")
    for inst in plan.instances:
        node = plan.nodes[inst.node]
        if node.present and all(node.present):
            continue
        for gpu in inst.gpus:
            missing, doubled = _gaps(got[gpu])
            if missing > _TOL:
                out.append(f"{inst.name} GPU {gpu} misses {missing:.6f} of its shard")
            if doubled > _TOL:
                out.append(f"{inst.name} GPU {gpu} receives {doubled:.6f} of its shard twice")
    return out


def _gaps(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    missing = doubled = 0.0
    end = 0.0
    for lo, hi in sorted(intervals):
        if lo > end:
            missing += lo - end
        else:
            doubled += max(0.0, min(hi, end) - lo)
        end = max(end, hi)
    return missing + max(0.0, 1.0 - end), doubled


def _check_flows(state: ClusterState, plan: MulticastPlan) -> list[str]:
    out = []
    topo = state.topology
    if len(plan.flows) != len(plan.lanes) or any(
        lane.flow != i for i, lane in enumerate(sorted(plan.lanes, key=lambda x: x.flow))
    ):
        return ["lanes and flows do not correspond one to one"]
    for lane in plan.lanes:
        edges = plan.flows[lane.flow].edges
        nodes = [edges[0][0], *(v for _, v in edges)]
        if edges[0][0] != lane.holder or edges[-1][1] != lane.dst:
            out.append(
                f"flow {lane.flow} runs {edges[0][0]}->{edges[-1][1]}, "
                f"not {lane.holder}->{lane.dst}"
            )
        if any(a[1] != b[0] for a, b in itertools.pairwise(edges)):
            out.append(f"flow {lane.flow} is not a connected path")
        if any(not topo.graph.has_edge(*e) for e in edges):
            out.append(f"flow {lane.flow} uses an edge the topology lacks")
        if lane.exit != lane.holder and lane.exit not in nodes:
            out.append(f"flow {lane.flow} does not pass its exit {lane.exit}")
    return out


def _check_background(state: ClusterState, plan: MulticastPlan) -> list[str]:
    """The plan shares the links with every background flow of the state, or starts (every new
    instance's startup, which every lane waits for) after that flow has ended."""
    out = []
    ours = set(state.background_flows)
    start = min((i.startup_s for i in plan.instances), default=0.0)
    for flow in plan.background:
        if flow not in ours:
            out.append(f"the plan shares links with {flow.name!r}, no background flow of the state")
    kept = set(plan.background)
    for flow in state.background_flows:
        end = state.flow_end_s(flow)
        if flow not in kept and end > start * (1 + _TOL) + _TOL:
            out.append(
                f"the plan leaves out background flow {flow.name!r}, which runs {end:.6g} s, "
                f"yet starts at {start:.6g} s"
            )
    return out


def _check_rates(state: ClusterState, plan: MulticastPlan) -> list[str]:
    out = []
    topo = state.topology
    by_phase: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(plan.flow_phase):
        by_phase[p].append(i)
    for phase in sorted(by_phase):
        ids = by_phase[phase]
        flows = [plan.flows[i] for i in ids]
        rates = fair_share_after(flows, topo.capacity, plan.background)
        load: dict[tuple[str, str], float] = defaultdict(float)
        for flow, rate in zip(plan.background, topo.fair_share(plan.background), strict=True):
            for edge in flow.edges:
                load[edge] += rate
        for i, rate in zip(ids, rates, strict=True):
            if abs(rate - plan.rates[i]) > _TOL * max(rate, 1.0):
                out.append(f"flow {i} has rate {plan.rates[i]:.6g}, fair share gives {rate:.6g}")
            if not plan.rates[i] > 0:
                out.append(f"flow {i} gets no capacity (rate {plan.rates[i]!r})")
            if plan.rates[i] > plan.flows[i].max_bytes_per_s * (1 + _TOL):
                out.append(f"flow {i} runs faster than its pace")
            for edge in plan.flows[i].edges:
                load[edge] += plan.rates[i]
        for edge, used in load.items():
            if used > topo.bytes_per_s(edge) * (1 + _TOL):
                out.append(f"phase {phase} puts {used:.6g} B/s on {edge}, over its capacity")
    return out


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
    if not math.isfinite(plan.objective_s):
        out.append(f"objective_s {plan.objective_s} is not finite")
    if plan.lower_bound_s > plan.objective_s * (1 + _TOL):
        out.append(f"lower bound {plan.lower_bound_s} exceeds the objective {plan.objective_s}")
    return out
