"""The overlay bound: a mixed-integer program over every plan's stripes, routes and live choice
whose value is a lower bound on ``all_ready`` for every plan the cost model allows.

**Why it holds.** Under the cost model (:mod:`~blitzplan.multicast.timeline.lane_times`) every
lane ``f`` runs at one rate ``r_f`` for the whole plan, and the lanes of a phase share every link
at once: on each edge their rates sum to at most what the background flows leave. Lane ``f``
carries ``|X_f| * S`` bytes (``X_f`` its stripe interval, ``S`` the per-GPU shard) and starts no
earlier than its receiver's startup ``>= s0`` (the least startup), so a plan ready by ``T``
whose lane ``f`` is needed (its bytes reach an instance GPU) has ``r_f >= |X_f| * lam`` with
``lam = S / (T - s0)``: lane ``f`` feeds its stripe unit by unit into lanes that end by ``T``.
Plans of several phases whose phases never overlap on an edge (the validator's rule) satisfy
the same inequality averaged over time. So ``lam`` is at most the largest ``lam`` of this
program, and ``T >= s0 + S / lam*``:

* **routing**: per sender ``a`` (a holder: the host copy's memory, a source GPU; or a target
  GPU or relay, which may forward what it received) a flow on the topology edges a plan may use
  (those of :class:`~blitzplan.multicast.bound.max_flow.FlowGraph`): a *local* one that never
  takes a NIC into the fabric (a lane between GPUs of one host crosses none) and a *remote* one
  that reaches the fabric only by a NIC of ``a``'s exits (or ``a``'s own NIC) and ends on
  another host. All flows together fit in each edge's residual capacity.
* **overlay**: ``x[r][a, b]``, the rate of rank-``r`` bytes that ``a`` sends to ``b`` (lanes are
  unicast: a byte sent to two GPUs crosses the network twice); the routing flow of ``a`` delivers
  ``sum_r x[r][a, b]`` to each receiver ``b``. Only rank-``r`` instance GPUs and relays receive
  rank-``r`` bytes.
* **every target**: each rank-``r`` instance GPU ``t`` gets a flow of value ``lam`` from the
  holders over the overlay arcs within ``x[r]`` (every point of the stripe reaches ``t`` along a
  chain of lanes from a holder that holds it; a holder of a fraction ``q`` of rank ``r`` starts at
  most ``q * lam`` of it).
* **live**: a binary per target node says it holds live instances (together at least ``live``
  of them, or exactly the named ones); such a node's remote flows are zero (live instances send
  nothing over the network; they may still feed GPUs of their own host).

Only duplication at GPUs and memory, never inside a switch, is what makes this bound tighter than
the max-flow into one instance (where two GPUs behind one PCIe uplink share a single crossing of
it). The additive pipeline terms (chunk and latency per hop) are left out, so the bound stays a
bound. HiGHS solves it (:mod:`~blitzplan.multicast.bound.overlay_solve`: one linear program
per minimal live choice when there are few, else the mixed-integer program), first with the
flows of a few instances only (fewer rows: a larger ``lam``, still a bound), then more;
``lam`` is taken from its proven bound with a relative margin, so rounding cannot overstate
it. Not used when
earlier plans delivered units.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from blitzplan.errors import InfeasibleError
from blitzplan.multicast.allocation.plan_builder import lane_route
from blitzplan.multicast.bound.cuts import cut_bounds, missing_bytes
from blitzplan.multicast.bound.overlay_solve import (
    Need,
    Program,
    Solved,
    live_covers,
    solve,
)
from blitzplan.multicast.plan_types import NewInstance
from blitzplan.multicast.setup.holdings import holder_segments
from blitzplan.multicast.setup.problem import Problem
from blitzplan.topologies import Edge, Topology

__all__ = [
    "OVERLAY_MAX_COLUMNS",
    "OverlayBound",
    "Sender",
    "lane_routes",
    "live_nodes",
    "overlay_bound",
    "overlay_receivers",
    "overlay_senders",
]

OVERLAY_MAX_COLUMNS = 120_000
"""Beyond this many variables the program is not built (the other bounds stand)."""
_SCALE = 1e9
"""Rates in GB/s inside the program."""
_GROWTH = 1.5
"""A set's solve is predicted at the last set's time times its size in columns to this power
(measured 1.2-1.8 on the random cases' programs)."""
_FIT = 0.8
"""... and started when that is at most this share of the time left."""


@dataclass(frozen=True)
class Sender:
    name: str
    host: str
    node: int | None
    """Target node index (None for a source holder)."""
    exits: tuple[str, ...]
    """What its lanes may leave by (its node's exits: GPUs, host NICs)."""
    holds: tuple[float, ...]
    """Per rank, the fraction it holds from the start (0 for target GPUs and relays)."""


@dataclass(frozen=True)
class OverlayBound:
    """The program's bound on ``all_ready`` and the target nodes its best solution makes live
    (a live choice worth building a plan on)."""

    bound_s: float
    kind: str
    live_nodes: frozenset[int]


def overlay_bound(problem: Problem, *, time_limit_s: float = 5.0) -> OverlayBound | None:
    """The bound on ``all_ready`` for every plan of ``problem``, or None when the program does
    not apply (units delivered before), is too large, or no bound is found in time.

    The program is solved for a growing set of instances (by their cut bounds, largest first:
    the likeliest bottleneck first), and every set's answer is a bound: leaving an instance's
    flows out only drops rows. After the first instance, the next set is the largest whose
    solve is predicted to fit (:data:`_GROWTH`, :data:`_FIT`); it stops when the whole program
    is solved or none fits (the solver also stops at the deadline; the sets solved stand). The
    first set's answer orders the live choices of the next and often already reaches the
    whole program's value (every later set then stops at its first live choice)."""
    if problem.delivered or any(t.present for t in problem.targets) or not problem.instances:
        return None
    shard = missing_bytes(problem, problem.instances[0].name)
    if shard <= 0:
        return None
    deadline = time.perf_counter() + time_limit_s  # the program's making counts too
    routed = _routing(problem)
    if routed is None:
        return None
    program, lam, binaries, flows = routed
    need = _need(problem, binaries)
    ranked = _ranked(problem)
    per_rank: Counter[int | None] = Counter(r for r, _, _ in flows[2])  # a column per arc
    sizes = [sum(per_rank[flows[1][g]] for g in i.gpus) for i in ranked]  # of a GPU's rank
    columns = list(itertools.accumulate(sizes, initial=len(program.upper)))
    best: Solved | None = None
    done, size = 0, 1
    while True:
        began = time.perf_counter()
        wanted = frozenset(g for i in ranked[done:size] for g in i.gpus)
        _target_flows(program, *flows, lam, wanted)  # the rows so far stay
        best = solve(program, lam, binaries, need, deadline, best)
        took = time.perf_counter() - began
        left = deadline - time.perf_counter()
        done, size = size, 0
        for more in range(done + 1, len(ranked) + 1):  # the most that fits in the time left
            if took * (columns[more] / columns[done]) ** _GROWTH <= _FIT * left:
                size = more
        if best is None or size == 0:
            break
    if best is None or best.upper <= 0:
        return None
    start = min(i.startup_s for i in problem.instances)
    fixed, _ = live_nodes(problem)
    return OverlayBound(
        start + shard / (best.upper * _SCALE),
        "overlay program over stripes, routes and live choices",
        frozenset(fixed | best.chosen),
    )


def _ranked(problem: Problem) -> list[NewInstance]:
    """Instances by their cut bound, largest first: the likeliest bottleneck."""
    bounds = cut_bounds(problem)
    return sorted(problem.instances, key=lambda i: (-bounds[i.name][0], i.name))


def _need(problem: Problem, binaries: dict[int, int]) -> Need:
    count = dict.fromkeys(binaries, 0)
    for inst in problem.instances:
        if inst.node in count:
            count[inst.node] += 1
    return Need(count, problem.live, live_covers(problem, binaries))


def overlay_senders(problem: Problem) -> list[Sender]:
    """Every holder that may send: the host copy's memory, source GPUs (with the fraction of
    each rank they hold), and the target nodes' GPUs and relays (they forward)."""
    topo = problem.topology
    out = []
    for node in problem.sources:
        if node.memory is not None:
            host = _host(topo, node.memory)
            out.append(Sender(node.memory, host, None, node.exits, (1.0,) * problem.tp))
            continue
        for q, gpu in enumerate(node.gpus):
            holds = tuple(
                sum(b - a for a, b, s in holder_segments(node.tp, r, problem.tp) if s == q)
                for r in range(problem.tp)
            )
            out.append(Sender(gpu, topo.host_of(gpu), None, node.exits, holds))
    for j, node in enumerate(problem.targets):
        for gpu in (*node.gpus, *node.relays):
            out.append(Sender(gpu, topo.host_of(gpu), j, node.exits, (0.0,) * problem.tp))
    return out


def overlay_receivers(problem: Problem) -> dict[str, int | None]:
    """Receivers: instance GPUs with their rank, relays with None (any rank)."""
    out: dict[str, int | None] = {}
    for node in problem.targets:
        for gpu in node.gpus:
            out[gpu] = node.rank_of(gpu)
        for gpu in node.relays:
            out[gpu] = None
    return out


def _build(problem: Problem) -> tuple[Program, int, dict[int, int]] | None:
    """The whole program: ``lam`` and the binaries' columns with it."""
    routed = _routing(problem)
    if routed is None:
        return None
    p, lam, binaries, flows = routed
    _target_flows(p, *flows, lam, None)
    return p, lam, binaries


_Flows = tuple[list[Sender], dict[str, int | None], dict[tuple[int, str, str], int]]


def _routing(problem: Problem) -> tuple[Program, int, dict[int, int], _Flows] | None:
    """The program without the flows into the instance GPUs, and what they are made from."""
    senders = overlay_senders(problem)
    receivers = overlay_receivers(problem)
    fixed, choose = live_nodes(problem)
    p = Program()
    lam = p.column()
    arcs = _arcs(problem, senders, receivers, p)
    if _too_big(problem, senders, receivers, arcs):
        return None
    binaries = {j: p.column(1.0, True) for j in choose}
    load: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    remote: dict[int, dict[int, float]] = defaultdict(dict)
    by_pair: dict[tuple[str, str], list[int]] = defaultdict(list)
    for (_, a, b), c in arcs.items():
        by_pair[(a, b)].append(c)
    for s in senders:
        for b in receivers:
            cols = by_pair.get((s.name, b))
            if not cols:
                continue
            routes = lane_routes(problem, s, b)
            far = _host(problem.topology, b) != s.host
            if not routes or (far and s.node in fixed):
                for c in cols:
                    p.upper[c] = 0.0
                continue
            link = {c: -1.0 for c in cols}
            for _, edges in routes:
                z = p.column()
                link[z] = 1.0
                for e in edges:
                    load[e][z] = load[e].get(z, 0.0) + 1.0
                if far and s.node in binaries:
                    remote[s.node][z] = 1.0
            p.row(link, 0.0, 0.0)
    for edge, terms in load.items():
        p.row(terms, -math.inf, problem.residual[edge] / _SCALE)
    big = sum(problem.residual[e] for e in load) / _SCALE + 1.0
    _live_rows(p, problem, binaries, remote, big)
    return p, lam, binaries, (senders, receivers, arcs)


def _arcs(
    problem: Problem, senders: list[Sender], receivers: dict[str, int | None], p: Program
) -> dict[tuple[int, str, str], int]:
    """``x[r][a, b]`` columns: rank-``r`` bytes from a sender that may hold them to a GPU that
    may receive them (its rank-``r`` instance GPU or a relay)."""
    arcs: dict[tuple[int, str, str], int] = {}
    for r in range(problem.tp):
        for s in senders:
            if s.node is None and s.holds[r] <= 0:
                continue
            if s.node is not None and receivers[s.name] not in (r, None):
                continue
            for b, rank in receivers.items():
                if b != s.name and rank in (r, None):
                    arcs[(r, s.name, b)] = p.column()
    return arcs


def lane_routes(problem: Problem, s: Sender, dst: str) -> list[tuple[str, tuple[Edge, ...]]]:
    """``(exit, edges)`` of each distinct route a lane from ``s`` to ``dst`` may take (one per
    exit; inside a host the host's route), none crossing an edge the background flows fill."""
    topo = problem.topology
    found: dict[tuple[Edge, ...], str] = {}
    for exit_ in (*s.exits, s.name):  # a named exit first: memory names its NIC
        try:
            taken, edges, _ = lane_route(topo, s.name, exit_, dst)
        except InfeasibleError:
            continue
        if all(problem.residual.get(e, 0.0) > 0 for e in edges):
            found.setdefault(edges, taken)
    return [(taken, edges) for edges, taken in sorted(found.items())]


def _host(topo: Topology, name: str) -> str:
    return str(topo.graph.nodes[name]["host"])


def _too_big(
    problem: Problem,
    senders: list[Sender],
    receivers: dict[str, int | None],
    arcs: dict[tuple[int, str, str], int],
) -> bool:
    exits = max((len(s.exits) + 1 for s in senders), default=1)
    targets = sum(1 for r in receivers.values() if r is not None)
    size = len(senders) * len(receivers) * exits + len(arcs) * (1 + targets // problem.tp)
    return size > OVERLAY_MAX_COLUMNS


def live_nodes(problem: Problem) -> tuple[set[int], list[int]]:
    """Target nodes fixed live (named live instances), and those the program chooses."""
    if problem.live_names:
        return {i.node for i in problem.instances if i.name in problem.live_names}, []
    if problem.live <= 0:
        return set(), []
    return set(), list(range(len(problem.targets)))


def _live_rows(
    p: Program,
    problem: Problem,
    binaries: dict[int, int],
    remote: dict[int, dict[int, float]],
    big: float,
) -> None:
    """At least ``live`` instances on live nodes; a live node's remote lanes carry nothing."""
    if not binaries:
        return
    count = [0] * len(problem.targets)
    for inst in problem.instances:
        count[inst.node] += 1
    p.row({binaries[j]: float(count[j]) for j in binaries}, float(problem.live), math.inf)
    for j, cols in remote.items():
        if cols:
            p.row({**cols, binaries[j]: big}, -math.inf, big)


def _target_flows(
    p: Program,
    senders: list[Sender],
    receivers: dict[str, int | None],
    arcs: dict[tuple[int, str, str], int],
    lam: int,
    wanted: frozenset[str] | None,
) -> None:
    """Per instance GPU of rank ``r`` in ``wanted``: a flow of value ``lam`` over the overlay
    within ``x[r]``."""
    holders = [s for s in senders if s.node is None]
    for t, rank in receivers.items():
        if rank is None or (wanted is not None and t not in wanted):
            continue
        balance: dict[str, dict[int, float]] = defaultdict(dict)
        for h in holders:
            if h.holds[rank] > 0:
                c = p.column()
                p.row({c: 1.0, lam: -h.holds[rank]}, -math.inf, 0.0)
                balance[h.name][c] = 1.0
        for (r, a, b), x in arcs.items():
            if r != rank or a == t:
                continue
            c = p.column()
            p.row({c: 1.0, x: -1.0}, -math.inf, 0.0)
            balance[b][c] = balance[b].get(c, 0.0) + 1.0
            balance[a][c] = balance[a].get(c, 0.0) - 1.0
        for v, terms in balance.items():
            if v == t:
                p.row({**terms, lam: -1.0}, 0.0, 0.0)
            else:
                p.row(terms, 0.0, 0.0)
