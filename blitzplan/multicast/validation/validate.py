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

import numpy as np

from blitzplan.cluster import ClusterState, Role
from blitzplan.multicast.plan_types import Lane, MulticastPlan, NodeKind
from blitzplan.multicast.validation.holdings_check import check_holdings
from blitzplan.multicast.validation.lane_table import (
    LaneTable,
    by_value,
    flow_routes,
    lane_table,
    plan_arrivals,
    same_rows,
)
from blitzplan.multicast.validation.route_check import check_phases, check_routes
from blitzplan.multicast.validation.timeline_check import check_timeline
from blitzplan.topologies import Edge, Topology, fair_share_after

__all__ = ["validate_multicast"]

_TOL = 1e-6
_COORD = 1e-9
_LOCAL_METHODS = ("allcache", "serverlessllm")


def validate_multicast(state: ClusterState, plan: MulticastPlan) -> tuple[str, ...]:
    """Every rule ``plan`` breaks, as sentences; empty when it is valid."""
    problems: list[str] = []
    table = lane_table(plan)  # the lanes as columns, read once for the checks of every lane
    problems += _check_instances(plan)
    problems += _check_senders(state, plan)
    problems += _check_bytes(plan, table)
    problems += check_holdings(state, plan, table)
    problems += _check_flows(state, plan, table)
    problems += check_routes(state, plan)
    problems += _check_background(state, plan)
    if not problems:
        problems += _check_rates(state, plan)
    theirs = plan_arrivals(plan) if not problems else None
    if not problems:
        problems += check_timeline(state, plan, table, theirs)
    if not problems:
        ends = theirs.max(1) if theirs is not None and theirs.shape[1] else None
        problems += check_phases(plan, table, ends)
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
    """Every lane sends from a source of the model (or a baseline's copy where the method has
    one), by an exit of its sender, not through a prefill GPU or a NIC that carries KV caches,
    nor over the network from a live instance's node (judged once per sender, holder, exit,
    destination and whether it is a gather lane)."""
    out = []
    rules = _SenderRules(state, plan)
    found: dict[tuple[object, ...], tuple[str, ...]] = {}
    for lane in plan.lanes:
        key = (lane.sender, lane.holder, lane.exit, lane.dst, lane.gather)
        says = found.get(key)
        if says is None:
            says = found[key] = rules.faults(lane)
        if says:
            where = f"lane {lane.flow} ({lane.holder}->{lane.dst})"
            out += [f"{where} {said}" for said in says]
    return out


class _SenderRules:
    """What :func:`_check_senders` reads of the state, once."""

    def __init__(self, state: ClusterState, plan: MulticastPlan) -> None:
        self.state, self.plan, self.topo = state, plan, state.topology
        self.instances = {inst.id: inst for inst in state.instances}
        self.prefill = {
            g for i in state.instances if i.serving_role is Role.PREFILL for g in i.gpus
        }
        self.kv_nics = _kv_nics(state, plan.allow_prefill_sources)
        live_nodes = {i.node for i in plan.instances if i.name in plan.live}
        self.live_gpus = {
            g for n in live_nodes for g in (*plan.nodes[n].gpus, *plan.nodes[n].relays)
        }

    def faults(self, lane: Lane) -> tuple[str, ...]:
        """What ``lane`` breaks, each after its ``where``."""
        plan, state, topo = self.plan, self.state, self.topo
        out = []
        sender = plan.nodes[lane.sender]
        if sender.kind is NodeKind.INSTANCE:
            inst = self.instances.get(sender.instance_id or "")
            loading_unknown = inst is not None and inst.role is Role.LOADING and not inst.loading
            if inst is None or inst.identity != plan.model or loading_unknown:
                out.append(f"sends from {sender.label}, which does not serve {plan.model}")
            elif inst.serving_role is Role.PREFILL and not plan.allow_prefill_sources:
                out.append(f"sends from prefill instance {inst.id}")
        elif sender.kind is NodeKind.HOST:
            copy = state.pool.host_copy(plan.model)
            if copy is None or copy.node != sender.memory:
                out.append(f"sends from {sender.memory}, not the host copy of {plan.model}")
        elif sender.kind in (NodeKind.CACHE, NodeKind.STAGE) and plan.method not in _LOCAL_METHODS:
            out.append(f"reads a baseline's local copy or staging in {plan.method!r}")
        if lane.gather:
            return tuple(out)
        local = topo.graph.nodes[lane.holder]["host"] == topo.graph.nodes[lane.dst]["host"]
        if not local and lane.exit != lane.holder and lane.exit not in sender.exits:
            out.append(f"leaves by {lane.exit}, not an exit of {sender.label}")
        if not plan.allow_prefill_sources and {lane.holder, lane.exit} & self.prefill:
            out.append("sends from a prefill GPU")
        if not local and topo.kind(lane.exit) in ("nic", "gpu"):  # else check_routes says
            nic = lane.exit if topo.kind(lane.exit) == "nic" else topo.nic_of(lane.exit)
            if nic in self.kv_nics:
                out.append(f"leaves by {nic}, which carries a prefill instance's KV")
        if not local and {lane.holder, lane.exit} & self.live_gpus:
            out.append("sends over the network from the node of a live instance")
        return tuple(out)


def _check_bytes(plan: MulticastPlan, table: LaneTable | None = None) -> list[str]:
    """Each instance GPU gets each stripe of its own rank exactly once; nothing lands outside
    (judged per receiving node and GPU for every lane into it at once; the sentences in the
    order of ``plan.lanes``)."""
    table = lane_table(plan) if table is None else table
    said: list[tuple[int, int, str]] = []  # (place in plan.lanes, which rule, sentence)
    lanes, names = table.lanes, table.names
    got: dict[str, list[np.ndarray]] = defaultdict(list)
    with np.errstate(invalid="ignore"):
        stripe = (table.lo >= 0 - _COORD) & (table.lo < table.hi) & (table.hi <= 1 + _COORD)
    for group in same_rows(table.receiver, table.dst):
        receiver = plan.nodes[int(table.receiver[group[0]])]
        dst = names[int(table.dst[group[0]])]
        if receiver.kind is not NodeKind.TARGET:
            continue
        if dst not in receiver.gpus + receiver.relays:
            said += [
                (
                    int(table.at[f]),
                    0,
                    f"lane {lanes[f].flow} lands on {dst}, outside node {receiver.id}",
                )
                for f in group.tolist()
            ]
            continue
        rank = receiver.rank_of(dst)
        if rank is not None:
            wrong = table.rank[group] != rank
            said += [
                (
                    int(table.at[f]),
                    1,
                    f"lane {lanes[f].flow} lands rank {lanes[f].rank} bytes "
                    f"on rank-{rank} GPU {dst}",
                )
                for f in group[wrong].tolist()
            ]
            got[dst].append(group[~wrong])
        said += [
            (
                int(table.at[f]),
                2,
                f"lane {lanes[f].flow} carries the empty or invalid stripe "
                f"{lanes[f].lo}..{lanes[f].hi}",
            )
            for f in group[~stripe[group]].tolist()
        ]
    said.sort(key=lambda x: x[:2])
    out = [sentence for _, _, sentence in said]
    for inst in plan.instances:
        node = plan.nodes[inst.node]
        if node.present and all(node.present):
            continue
        for gpu in inst.gpus:
            mine = np.concatenate([np.zeros(0, np.int64), *got.get(gpu, [])])
            missing, doubled = _gaps(table.lo[mine], table.hi[mine])
            if missing > _TOL:
                out.append(f"{inst.name} GPU {gpu} misses {missing:.6f} of its shard")
            if doubled > _TOL:
                out.append(f"{inst.name} GPU {gpu} receives {doubled:.6f} of its shard twice")
    return out


def _gaps(lo: np.ndarray, hi: np.ndarray) -> tuple[float, float]:
    """How much of ``[0, 1)`` the stripes ``[lo, hi)`` miss and how much they cover twice:
    by ``(lo, hi)``, each stripe against the furthest end before it (0 at first)."""
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    end = np.maximum.accumulate(np.r_[0.0, hi])
    before = end[:-1]
    gap = lo > before
    missing = float(np.sum(np.where(gap, lo - before, 0.0)))
    doubled = float(np.sum(np.where(gap, 0.0, np.maximum(0.0, np.minimum(hi, before) - lo))))
    return missing + max(0.0, 1.0 - float(end[-1])), doubled


def _check_flows(
    state: ClusterState, plan: MulticastPlan, table: LaneTable | None = None
) -> list[str]:
    """Every flow is one lane's: from its holder to its destination, a connected path of the
    topology's edges through its exit (judged once per holder, destination, exit and route)."""
    out = []
    topo = state.topology
    table = lane_table(plan) if table is None else table
    n = len(table.lanes)
    if len(plan.flows) != n or not (table.flow == np.arange(n)).all():
        return ["lanes and flows do not correspond one to one"]
    found: dict[tuple[object, ...], tuple[str, ...]] = {}
    for lane in plan.lanes:
        edges = plan.flows[lane.flow].edges
        key = (lane.holder, lane.dst, lane.exit, id(edges))  # the plan keeps every route alive
        says = found.get(key)
        if says is None:
            says = found[key] = _flow_faults(topo, lane, edges)
        out += [f"flow {lane.flow} {said}" for said in says]
    return out


def _flow_faults(topo: Topology, lane: Lane, edges: tuple[Edge, ...]) -> tuple[str, ...]:
    """What is wrong with ``edges`` as the flow of ``lane`` (:func:`_check_flows`)."""
    out = []
    nodes = [edges[0][0], *(v for _, v in edges)]
    if edges[0][0] != lane.holder or edges[-1][1] != lane.dst:
        out.append(f"runs {edges[0][0]}->{edges[-1][1]}, not {lane.holder}->{lane.dst}")
    if any(a[1] != b[0] for a, b in itertools.pairwise(edges)):
        out.append("is not a connected path")
    if any(not topo.graph.has_edge(*e) for e in edges):
        out.append("uses an edge the topology lacks")
    if lane.exit != lane.holder and lane.exit not in nodes:
        out.append(f"does not pass its exit {lane.exit}")
    return tuple(out)


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
    """Per phase, the plan's rates are the max-min fair share of its flows on what the
    background leaves, each positive and at most its pace, and no edge carries more than its
    capacity. Phases of the same flows (routes and paces, in order) get the same fair share: it
    is computed once per such list (a sliced plan repeats one phase hundreds of times)."""
    out = []
    topo = state.topology
    n = len(plan.flows)
    phase = np.asarray(plan.flow_phase, dtype=np.int64).reshape(n)
    ours = np.asarray(plan.rates, dtype=float).reshape(n)
    caps = np.fromiter((flow.max_bytes_per_s for flow in plan.flows), float, count=n)
    routes, route_of = flow_routes(plan)
    fair = np.zeros(n)
    by_phase = by_value(phase)
    shared: dict[bytes, tuple[float, ...]] = {}
    for ids in by_phase.values():
        key = route_of[ids].tobytes() + caps[ids].tobytes()
        rates = shared.get(key)
        if rates is None:
            flows = [plan.flows[i] for i in ids.tolist()]
            rates = shared[key] = fair_share_after(flows, topo.capacity, plan.background)
        fair[ids] = rates
    with np.errstate(invalid="ignore"):
        differ = np.abs(fair - ours) > _TOL * np.maximum(fair, 1.0)
        empty = ~(ours > 0)
        fast = ours > caps * (1 + _TOL)
    # the load per (phase, edge): the background's fair rates on every phase, then the flows'
    background: dict[Edge, float] = defaultdict(float)
    for flow, rate in zip(plan.background, topo.fair_share(plan.background), strict=True):
        for edge in flow.edges:
            background[edge] += rate
    edges = list(dict.fromkeys([*background, *(edge for route in routes for edge in route)]))
    edge_id = {edge: k for k, edge in enumerate(edges)}
    phases = np.unique(phase)
    row = np.searchsorted(phases, phase) * len(edges)
    at, rate_at = [], []
    for r, ids in by_value(route_of).items():
        for edge in routes[r]:
            at.append(row[ids] + edge_id[edge])
            rate_at.append(ours[ids])
    flat = np.bincount(
        np.concatenate([np.zeros(0, np.int64), *at]),
        np.concatenate([np.zeros(0), *rate_at]),
        minlength=len(phases) * len(edges),
    )
    load = flat.reshape(len(phases), len(edges)) + np.fromiter(
        (background.get(edge, 0.0) for edge in edges), float, count=len(edges)
    )
    capacity = np.fromiter((topo.bytes_per_s(edge) for edge in edges), float, count=len(edges))
    with np.errstate(invalid="ignore"):
        over = load > capacity * (1 + _TOL)
    for p, ids in sorted(by_phase.items()):
        for i in ids[differ[ids] | empty[ids] | fast[ids]].tolist():
            if differ[i]:
                out.append(f"flow {i} has rate {ours[i]:.6g}, fair share gives {fair[i]:.6g}")
            if empty[i]:
                out.append(f"flow {i} gets no capacity (rate {plan.rates[i]!r})")
            if fast[i]:
                out.append(f"flow {i} runs faster than its pace")
        k = int(np.searchsorted(phases, p))
        for e in np.flatnonzero(over[k]).tolist():
            out.append(f"phase {p} puts {load[k, e]:.6g} B/s on {edges[e]}, over its capacity")
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
