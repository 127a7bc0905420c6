"""Random plans anywhere in the striped plan space, for testing the validator and the bound.

``random_plan`` makes every decision at random that a plan may make: which target nodes hold the
live instances, the forwarding order, how each rank's stripe coordinates are cut, which sender,
holder, exit and entry each piece takes (network or inside a host, relays included), the pace of
each lane and gather. Every plan it returns is valid by construction, so the validator must accept
it and no plan may beat the certified lower bound.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from typing import Any

from blitzplan.cluster import ClusterState
from blitzplan.models import ModelSpec
from blitzplan.multicast.allocation.plan_builder import PlanBuilder, lane_route
from blitzplan.multicast.plan_types import MulticastPlan, NodeKind, PlanNode
from blitzplan.multicast.setup.holdings import holder_segments
from blitzplan.multicast.setup.problem import Problem, prepare
from blitzplan.multicast.timeline.assemble import Built, base_builder, finish, run
from blitzplan.solvers import SolveStatus
from blitzplan.units import MIB

_PREPARE_DEFAULTS: dict[str, Any] = {
    "count": None,
    "targets": None,
    "startup_s": 0.0,
    "exclude": (),
    "names": None,
    "delivered": None,
    "placement": "pack",
    "chunk_bytes": 4 * MIB,
    "allow_prefill_sources": False,
}


def tiny_problem(state: ClusterState, spec: ModelSpec, **options: Any) -> Problem:
    """``prepare`` with the tests' defaults (no startup, nothing excluded or delivered, packed,
    4 MiB chunks, no prefill sources); ``options`` (targets or count, tp, live, ...) win."""
    return prepare(state, spec, **(_PREPARE_DEFAULTS | options))


def finished(
    problem: Problem,
    built: Built,
    lower_bound_s: float,
    *,
    objective: str = "all_ready",
    method: str = "greedy",
) -> MulticastPlan:
    """The FEASIBLE plan ``built`` makes, recorded with ``lower_bound_s``, for the validator."""
    return finish(
        problem,
        built,
        method=method,
        objective=objective,
        status=SolveStatus.FEASIBLE,
        lower_bound_s=lower_bound_s,
        started_s=time.perf_counter(),
    )


def _cover(problem: Problem, rng: random.Random, targets: list[int], offset: int) -> set[int]:
    count = {t: sum(1 for i in problem.instances if i.node + offset == t) for t in targets}
    chosen: set[int] = set()
    for t in rng.sample(targets, len(targets)):
        if sum(count[c] for c in chosen) >= problem.live:
            break
        chosen.add(t)
    return chosen


def _usable(problem: Problem, edges: tuple[tuple[str, str], ...]) -> bool:
    return all(problem.residual.get(e, 0.0) > 1e-6 * problem.topology.capacity[e] for e in edges)


def _holders(
    sender: PlanNode, rank: int, lo: float, hi: float, tp: int, landed: dict, rng: random.Random
) -> list[tuple[str, float, float]]:
    """Holders covering ``[lo, hi)`` of ``rank`` at ``sender`` (split where they change)."""
    if sender.memory is not None:
        return [(sender.memory, lo, hi)]
    if sender.kind is NodeKind.INSTANCE:
        out = []
        for a, b, q in holder_segments(sender.tp, rank, tp):
            x, y = max(a, lo), min(b, hi)
            if y - x > 1e-9:
                out.append((sender.gpus[q], x, y))
        return out
    peers = [g for g in sender.gpus if sender.rank_of(g) == rank]
    if sender.present or rng.random() < 0.5:  # a relay lacks the units the node had before
        return [(rng.choice(peers), lo, hi)]  # holds it once its gathers are done
    out = []
    for gpu, a, b in landed[sender.id][rank]:
        x, y = max(a, lo), min(b, hi)
        if y - x > 1e-9:
            out.append((gpu, x, y))
    return out


def _cuts(rng: random.Random) -> list[float]:
    inner = sorted({round(rng.random(), 6) for _ in range(rng.randint(0, 2))} - {0.0, 1.0})
    return [0.0, *inner, 1.0]


def random_plan(problem: Problem, rng: random.Random) -> Built | None:
    """A random valid plan of ``problem``, or None when a random choice found no route."""
    builder = base_builder(problem)
    offset = len(problem.sources)
    targets = [n.id for n in builder.nodes[offset:]]
    live_nodes = _cover(problem, rng, targets, offset)
    order = rng.sample(targets, len(targets))
    senders = list(range(offset))
    landed: dict[int, dict[int, list[tuple[str, float, float]]]] = {}
    window = rng.uniform(0.05, 2.0)
    for j in order:
        node = builder.nodes[j]
        landed[j] = {r: [] for r in range(problem.tp)}
        if problem.node_bytes(node) > 0 and not _fill_node(
            problem, builder, j, senders, live_nodes, landed, rng, window
        ):
            return None
        senders.append(j)
    live = [i.name for t in live_nodes for i in problem.instances if i.node + offset == t]
    return run(problem, builder, live[: problem.live])


def _fill_node(
    problem: Problem,
    builder: PlanBuilder,
    j: int,
    senders: list[int],
    live_nodes: set[int],
    landed: dict,
    rng: random.Random,
    window: float,
) -> bool:
    topo = problem.topology
    node = builder.nodes[j]
    carried = problem.node_bytes(node) / problem.tp
    for rank in range(problem.tp):
        entries = [g for g in node.gpus if node.rank_of(g) == rank] + list(node.relays)
        cuts = _cuts(rng)
        for lo, hi in itertools.pairwise(cuts):
            for _ in range(20):  # retry until a sender with a usable route turns up
                s = rng.choice(senders)
                pieces = _holders(builder.nodes[s], rank, lo, hi, problem.tp, landed, rng)
                lanes = [
                    _pick(problem, builder, s, h, entries, live_nodes, rng) for h, _, _ in pieces
                ]
                if pieces and all(lane is not None for lane in lanes):
                    break
            else:
                return False
            hop = builder.hop(s, j)
            for (holder, a, b), picked in zip(pieces, lanes, strict=True):
                exit_, dst = picked  # type: ignore[misc]
                pace = math.inf if rng.random() < 0.5 else (b - a) * carried / window
                builder.add_lane(hop, holder, exit_, dst, rank, a, b, pace_bytes_per_s=pace)
                landed[j][rank].append((dst, a, b))
    for rank, pieces in landed[j].items():
        for holder, a, b in pieces:
            for gpu in node.gpus:
                if node.rank_of(gpu) == rank and gpu != holder:
                    if not _usable(problem, lane_route(topo, holder, holder, gpu)[1]):
                        return False
                    pace = math.inf if rng.random() < 0.5 else (b - a) * carried / window
                    builder.add_gather(j, holder, gpu, rank, a, b, pace_bytes_per_s=pace)
    return True


def _pick(
    problem: Problem,
    builder: PlanBuilder,
    sender: int,
    holder: str,
    entries: list[str],
    live_nodes: set[int],
    rng: random.Random,
) -> tuple[str, str] | None:
    """A random (exit, entry) with a usable route for ``holder``, or None."""
    topo = problem.topology
    node = builder.nodes[sender]
    for _ in range(10):
        dst = rng.choice(entries)
        local = topo.graph.nodes[holder]["host"] == topo.graph.nodes[dst]["host"]
        if local:
            exit_ = holder
        elif sender in live_nodes or not node.exits:
            continue
        else:
            exit_ = rng.choice(node.exits)
            nic = exit_ if topo.kind(exit_) == "nic" else topo.nic_of(exit_)
            if topo.leaf_of_nic(nic) is None:
                continue
        if _usable(problem, lane_route(topo, holder, exit_, dst)[1]):
            return exit_, dst
    return None
