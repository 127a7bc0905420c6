"""The byte allocation of a forwarding order as a linear program over the lanes' real routes.

For a fixed order of target nodes and set of forwarding nodes, every candidate lane is a holder
(a source GPU holding the bytes, host memory, or an instance GPU of an earlier forwarding node;
an earlier node holding live instances only towards GPUs of its own host, never over a NIC),
an exit and an entry GPU of the receiving node, with the edges of the route the topology gives it
plus the NVLink edges of the gathers that copy what lands on the entry to the other instance
GPUs of its rank. Let ``x_p`` be the bytes candidate ``p`` carries and ``T`` the time every lane
streams for::

    minimise T  (then, at that T, the links per byte: direct landings, own NICs)
    subject to  sum_{p into (j, rank r, class c)} x_p = D_jrc        each node needs its bytes once
                sum_p load_p(e) x_p <= capacity_left(e) * T          every edge, background removed
                x_p >= 0

A *class* is an interval of a rank's stripe coordinates held whole by one GPU of every source (TP
re-sharding cuts a rank where source ranks change). Every lane paced at ``x_p / T`` then fits on
every link at once, so the fair shares are the paces and the plan streams in ``T`` plus its
pipeline fill. Solved with HiGHS through :func:`scipy.optimize.linprog`; ``T`` is the least time
of any allocation of this order over these routes (a plan of another order or other routes may
do better; the certified lower bound is what proves optimality).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.multicast.allocation.plan_builder import PlanBuilder, lane_route
from blitzplan.multicast.plan_types import NodeKind, PlanNode
from blitzplan.multicast.refine_budget import RefineBudget
from blitzplan.multicast.setup.holdings import TOLERANCE, holder_segments
from blitzplan.multicast.setup.problem import Problem
from blitzplan.topologies import Edge, Topology

__all__ = ["MAX_CANDIDATES", "LpAllocation", "build_lp_lanes", "lp_allocate"]

MAX_CANDIDATES = 12_000
"""Beyond this many candidate lanes the program is not built (the caller keeps its plan)."""
_GB = 1e9
_FLOOR = 1e-9
_TIE = 1e-9


@dataclass(frozen=True)
class _Candidate:
    node: int
    rank: int
    cls: int
    sender: int
    holder: str
    exit: str
    entry: str
    load: tuple[tuple[Edge, int], ...]


@dataclass(frozen=True)
class LpAllocation:
    """The program's answer: per candidate used, its bytes; and the streaming time ``T``."""

    fluid_s: float
    used: tuple[tuple[_Candidate, float], ...]
    classes: tuple[tuple[int, float, float], ...]


def _classes(problem: Problem) -> tuple[tuple[int, float, float], ...]:
    """``(rank, lo, hi)`` intervals each held whole by one GPU of every source."""
    out = []
    source_tps = {n.tp for n in problem.sources if n.kind is NodeKind.INSTANCE}
    for rank in range(problem.tp):
        cuts = {0.0, 1.0}
        for tp in source_tps:
            for lo, hi, _ in holder_segments(tp, rank, problem.tp):
                cuts |= {lo, hi}
        points = sorted(cuts)
        out += [(rank, a, b) for a, b in itertools.pairwise(points) if b - a > TOLERANCE]
    return tuple(out)


def _holders(sender: PlanNode, rank: int, lo: float, hi: float, tp: int) -> list[str]:
    if sender.memory is not None:
        return [sender.memory]
    if sender.kind is NodeKind.INSTANCE:
        return [
            sender.gpus[q]
            for a, b, q in holder_segments(sender.tp, rank, tp)
            if a <= lo + TOLERANCE and hi <= b + TOLERANCE
        ][:1]
    return [g for g in sender.gpus if sender.rank_of(g) == rank]


def _candidates(
    problem: Problem,
    nodes: Sequence[PlanNode],
    order: Sequence[int],
    forwarding: frozenset[int],
    classes: Sequence[tuple[int, float, float]],
    budget: RefineBudget | None = None,
) -> list[_Candidate] | None:
    topo = problem.topology
    senders = [n.id for n in nodes if n.kind in (NodeKind.INSTANCE, NodeKind.HOST)]
    local_only: set[int] = set()
    out: list[_Candidate] = []
    for j in order:
        if budget is not None and budget.spent():
            return None
        node = nodes[j]
        if problem.node_bytes(node) > 0:
            entries = [*node.gpus, *node.relays]
            for c, (rank, lo, hi) in enumerate(classes):
                peers = [g for g in node.gpus if node.rank_of(g) == rank]
                for e in entries:
                    if node.rank_of(e) not in (None, rank):
                        continue
                    gather = _gather_load(topo, e, peers)
                    for s in senders:
                        for h in _holders(nodes[s], rank, lo, hi, problem.tp):
                            if s in local_only and not _same_host(topo, h, e):
                                continue
                            for x in _exits(problem, nodes[s], h, e):
                                try:
                                    _, edges, _ = lane_route(topo, h, x, e)
                                except (InvalidInputError, InfeasibleError):
                                    continue  # no route after failures
                                load = tuple((edge, 1) for edge in edges) + gather
                                out.append(_Candidate(j, rank, c, s, h, x, e, load))
                    if len(out) > MAX_CANDIDATES:
                        return None
        senders.append(j)
        if j not in forwarding:
            local_only.add(j)  # a live node's NICs carry KV: it feeds only its own host
    return out


def _same_host(topo: Topology, a: str, b: str) -> bool:
    return bool(topo.graph.nodes[a]["host"] == topo.graph.nodes[b]["host"])


def _gather_load(topo: Topology, entry: str, peers: Sequence[str]) -> tuple[tuple[Edge, int], ...]:
    load: dict[Edge, int] = {}
    for g in peers:
        if g != entry and topo.has_path(entry, g):
            for edge in lane_route(topo, entry, entry, g)[1]:
                load[edge] = load.get(edge, 0) + 1
    return tuple(load.items())


def _exits(problem: Problem, sender: PlanNode, holder: str, entry: str) -> list[str]:
    """Exits worth a candidate: the holder itself inside one host; otherwise the sender's exits
    under the entry's leaf (all of them when none is)."""
    topo = problem.topology
    if topo.graph.nodes[holder]["host"] == topo.graph.nodes[entry]["host"]:
        return [holder]
    leaf = topo.leaf_of(entry)
    usable = []
    for e in sender.exits:
        nic = e if topo.kind(e) == "nic" else topo.nic_of(e)
        nic_leaf = topo.leaf_of_nic(nic)
        if nic_leaf is not None and problem.residual.get((nic, nic_leaf), 0.0) > 0:
            usable.append((e, nic_leaf))
    same = [e for e, nic_leaf in usable if nic_leaf == leaf]
    return same or [e for e, _ in usable]


def lp_allocate(
    problem: Problem,
    nodes: Sequence[PlanNode],
    order: Sequence[int],
    forwarding: frozenset[int],
    budget: RefineBudget | None = None,
) -> LpAllocation | None:
    """Solve the program of the module docstring; None when it is too large or infeasible, or
    ``budget`` runs out (HiGHS gets the time left as its limit)."""
    classes = _classes(problem)
    candidates = _candidates(problem, nodes, order, forwarding, classes, budget)
    if not candidates or (budget is not None and budget.spent()):
        return None
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    rows: dict[Edge, int] = {}
    ub_r, ub_c, ub_v = [], [], []
    for k, cand in enumerate(candidates):
        for edge, times in cand.load:
            ub_r.append(rows.setdefault(edge, len(rows)))
            ub_c.append(k)
            ub_v.append(float(times))
    n = len(candidates)
    capacity = np.array([problem.residual[e] / _GB for e in rows])
    ub_r += list(range(len(rows)))
    ub_c += [n] * len(rows)
    ub_v += list(-capacity)
    a_ub = coo_matrix((ub_v, (ub_r, ub_c)), shape=(len(rows), n + 1)).tocsr()
    demand_rows: dict[tuple[int, int], int] = {}
    eq_r, eq_c = [], []
    for k, cand in enumerate(candidates):
        eq_r.append(demand_rows.setdefault((cand.node, cand.cls), len(demand_rows)))
        eq_c.append(k)
    b_eq = np.zeros(len(demand_rows))
    for (j, c), row in demand_rows.items():
        _, lo, hi = classes[c]
        b_eq[row] = (hi - lo) * problem.node_bytes(nodes[j]) / problem.tp / _GB
    a_eq = coo_matrix((np.ones(len(eq_r)), (eq_r, eq_c)), shape=(len(demand_rows), n + 1))
    cost = np.zeros(n + 1)
    cost[n] = 1.0
    solve = functools.partial(
        linprog,
        A_ub=a_ub,
        b_ub=np.zeros(len(rows)),
        A_eq=a_eq.tocsr(),
        b_eq=b_eq,
        method="highs",
    )
    left = None if budget is None else budget.left()
    if left is not None:
        solve = functools.partial(solve, options={"time_limit": left})
    result = solve(cost, bounds=[(0, None)] * (n + 1))
    if budget is not None and budget.spent():
        return None  # HiGHS may have stopped at its limit: no plan from a partial answer
    if result.status != 0 or not math.isfinite(result.fun) or result.fun <= 0:
        return None
    # second pass at that T: fewest links per byte (a direct landing over a relay and a gather,
    # an own NIC over an NVLink relay)
    fluid = float(result.x[n])
    links = np.array([float(len(c.load)) for c in candidates] + [0.0])
    tied = solve(links, bounds=[(0, None)] * n + [(0, fluid * (1 + _TIE))])
    if tied.status == 0:
        result = tied
    used = tuple(
        (cand, float(value) * _GB)
        for cand, value in zip(candidates, result.x[:n], strict=True)
        if value > _FLOOR * max(b_eq.max(), 1.0)
    )
    return LpAllocation(float(result.x[n]), used, classes)


def build_lp_lanes(
    problem: Problem, builder: PlanBuilder, lp: LpAllocation, *, gather_headroom: float
) -> None:
    """Lanes and gathers of an LP allocation: each class of each node is cut into consecutive
    pieces, one per candidate used, grouped by entry so each entry's bytes are contiguous."""
    by_class: dict[tuple[int, int], list[tuple[_Candidate, float]]] = {}
    for cand, size in lp.used:
        by_class.setdefault((cand.node, cand.cls), []).append((cand, size))
    landed: dict[tuple[int, int, str], list[tuple[float, float]]] = {}
    for (j, c), items in sorted(by_class.items()):
        node = builder.nodes[j]
        rank, lo, hi = lp.classes[c]
        slots = [*node.gpus, *node.relays]
        items.sort(key=lambda item: (slots.index(item[0].entry), item[0].sender, item[0].holder))
        total = sum(size for _, size in items)
        at = lo
        for k, (cand, size) in enumerate(items):
            end = hi if k == len(items) - 1 else at + (hi - lo) * size / total
            if end - at <= TOLERANCE:
                continue
            hop = builder.hop(cand.sender, j)
            builder.add_lane(
                hop,
                cand.holder,
                cand.exit,
                cand.entry,
                rank,
                at,
                end,
                pace_bytes_per_s=size / lp.fluid_s,
            )
            landed.setdefault((j, rank, cand.entry), []).append((at, end))
            at = end
    for (j, rank, entry), pieces in landed.items():
        node = builder.nodes[j]
        carried = problem.node_bytes(node) / problem.tp
        for lo, hi in _runs(pieces):
            for gpu in node.gpus:
                if gpu != entry and node.rank_of(gpu) == rank:
                    builder.add_gather(
                        j,
                        entry,
                        gpu,
                        rank,
                        lo,
                        hi,
                        pace_bytes_per_s=gather_headroom * (hi - lo) * carried / lp.fluid_s,
                    )


def _runs(pieces: list[tuple[float, float]]) -> list[tuple[float, float]]:
    runs: list[tuple[float, float]] = []
    for lo, hi in sorted(pieces):
        if runs and abs(runs[-1][1] - lo) <= TOLERANCE:
            runs[-1] = (runs[-1][0], hi)
        else:
            runs.append((lo, hi))
    return runs
