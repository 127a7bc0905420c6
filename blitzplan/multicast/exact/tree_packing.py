"""A plan from the overlay program's structure: every rank's stripes as a packing of trees.

A *tree* of rank ``r`` carries one stripe interval of rank ``r`` from holders of the whole rank
(the host copy, a source of the new instances' TP degree) to every rank-``r`` instance GPU, over
overlay arcs ``a -> b`` (a holder, instance GPU or relay sending to an instance GPU or relay),
each on one route a lane may take (:func:`~blitzplan.multicast.bound.overlay_lp.lane_routes`),
with no remote arc out of a live node. Tree ``tau`` runs every lane at rate ``y_tau``; the master
linear program maximises ``lam`` with ``sum_{tau of r} y_tau >= lam`` per rank and the trees'
loads within each edge's residual capacity. Columns come from pricing: with the edge duals as
arc costs, a shortest-path Steiner heuristic (grow the tree from the holders towards the nearest
missing instance GPU) proposes a tree of least dual cost; it joins while that cost is below the
rank's dual. The heuristic pricing makes this a primal method only: its plan is checked against
the certified bounds like any other.

The plan gives tree ``tau`` of rank ``r`` the interval share ``y_tau / sum_r y`` and paces every
lane at ``y_tau``, so the max-min fair rates are exactly the packing's rates; the cost model then
times it (chunks, latency, startup).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from blitzplan.multicast.bound.overlay_lp import (
    Sender,
    lane_routes,
    overlay_receivers,
    overlay_senders,
)
from blitzplan.multicast.exact.steiner import FULL, RankGraph, Tree, cheapest_tree
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, base_builder, run, score

__all__ = ["MAX_ROUNDS", "PACK_GAP", "PACK_ROUNDS", "pack_trees", "repack"]

MAX_ROUNDS = 400
"""At most this many pricing rounds."""
PACK_GAP = 0.1
"""A greedy plan this far above its bound (relative) also tries the tree packing."""
PACK_ROUNDS = 40
"""Pricing rounds of the greedy's tree packing, divided by the TP degree (each round prices
every rank; a count, so equal input gives an identical plan)."""
WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)
"""Trees per rank the greedy's final packings keep (the widest ones), besides all of them; the
exact method tries every count (``widths=None``)."""
_SCALE = 1e9


@dataclass(frozen=True)
class _Arc:
    sender: int
    """Index into the senders."""
    dst: str
    exit: str
    edges: np.ndarray
    """Edge indices of its route."""


class Overlay:
    """Senders, receivers, arcs with their routes, and the edges they cross."""

    def __init__(self, problem: Problem, live: frozenset[int]) -> None:
        topo = problem.topology
        self.problem = problem
        self.senders = overlay_senders(problem)
        self.receivers = overlay_receivers(problem)
        self.index = {s.name: k for k, s in enumerate(self.senders)}
        edge_id: dict[tuple[str, str], int] = {}
        self.arcs: list[_Arc] = []
        for k, s in enumerate(self.senders):
            for dst in self.receivers:
                if dst == s.name:
                    continue
                far = topo.host_of(dst) != s.host
                if far and s.node in live:
                    continue
                for exit_, edges in lane_routes(problem, s, dst):
                    if far and exit_ not in s.exits:
                        continue  # leave only by exits the setup cleared (no KV NICs)
                    ids = np.array([edge_id.setdefault(e, len(edge_id)) for e in edges])
                    self.arcs.append(_Arc(k, dst, exit_, ids))
        self.edges = list(edge_id)
        self.capacity = np.array([problem.residual[e] / _SCALE for e in self.edges])

    def arcs_of_rank(self, rank: int) -> list[int]:
        out = []
        for a, arc in enumerate(self.arcs):
            s = self.senders[arc.sender]
            sends = s.holds[rank] >= FULL if s.node is None else self._carries(s.name, rank)
            if sends and self.receivers[arc.dst] in (rank, None):
                out.append(a)
        return out

    def _carries(self, gpu: str, rank: int) -> bool:
        return self.receivers[gpu] in (rank, None)


def repack(
    problem: Problem,
    lives: Sequence[frozenset[int]],
    built: Built,
    bound: float,
    time_left_s: float | None,
) -> Built:
    """``built`` (the greedy's plan), or the fastest tree packing on one of the live choices
    ``lives`` (target node indices) when ``built`` is more than :data:`PACK_GAP` above
    ``bound``: its stripes may take any tree of routes, where the greedy forwards whole nodes
    in one order. At most :data:`PACK_ROUNDS` / TP rounds each (10 at least), all within
    ``time_left_s`` (None: no clock, so equal input gives an identical plan)."""
    began = time.perf_counter()
    best = built
    for live in dict.fromkeys(lives):  # distinct, in order
        left = None if time_left_s is None else time_left_s - (time.perf_counter() - began)
        if _value(built) <= bound * (1 + PACK_GAP) or (left is not None and left <= 0):
            break
        rounds = max(10, PACK_ROUNDS // problem.tp)
        packed = pack_trees(problem, live, time_limit_s=left, max_rounds=rounds)
        if packed is not None and _value(packed) < _value(best):
            best = packed
    return best


def pack_trees(
    problem: Problem,
    live: frozenset[int],
    *,
    time_limit_s: float | None = None,
    max_rounds: int = MAX_ROUNDS,
    widths: Sequence[int] | None = WIDTHS,
) -> Built | None:
    """The plan of the best tree packing found in ``max_rounds`` pricing rounds (and within
    ``time_limit_s``; None: no clock, so equal input gives an identical plan), the target
    nodes ``live`` holding the live instances; None when some instance GPU cannot be reached
    that way or those nodes cannot hold ``live`` instances. ``widths``: the tree counts per
    rank the final plans keep (:func:`_subsets`; None, the exact method: every count, ranked
    two ways, and the best three rebalanced by :func:`_balanced`). With a time limit, counts
    past it are skipped (the first and the last still tried)."""
    if problem.delivered or any(t.present for t in problem.targets):
        return None
    if sum(1 for i in problem.instances if i.node in live) < problem.live:
        return None  # the live nodes cannot hold the live instances
    began = time.perf_counter()
    overlay = Overlay(problem, live)
    graphs = [RankGraph(overlay, r) for r in range(problem.tp)]
    prices = 1.0 / np.maximum(overlay.capacity, 1e-9)
    trees: list[Tree] = []
    for r in range(problem.tp):
        tree = cheapest_tree(overlay, graphs[r], prices)
        if tree is None:
            return None
        trees.append(tree)
    solution = None
    for _ in range(max_rounds):
        solution = _master(overlay, trees, problem.tp)
        if solution is None:
            return None
        _, _, edge_duals, rank_duals = solution
        added = 0
        for r in range(problem.tp):
            tree = cheapest_tree(overlay, graphs[r], np.maximum(edge_duals, 0.0) + 1e-6 * prices)
            if tree is None:
                continue
            cost = sum(edge_duals[e] * n for e, n in tree.load.items())
            if cost < rank_duals[r] * (1 - 1e-7) and tree not in trees:
                trees.append(tree)
                added += 1
        if not added or (time_limit_s is not None and time.perf_counter() - began > time_limit_s):
            break
    if solution is None or len(solution[1]) < len(trees):  # columns added since: solve again
        solution = _master(overlay, trees, problem.tp)
    if solution is None:
        return None
    deadline = None if time_limit_s is None else began + time_limit_s
    rankings = [_by_rate] if widths is not None else [_by_rate, _by_rate_per_hop]
    tried: list[tuple[float, list[Tree], Built]] = []
    for ranking in rankings:
        tried += _subsets(problem, overlay, trees, solution[1], live, ranking, widths, deadline)
    if not tried:
        return None
    tried.sort(key=lambda item: item[0])
    best = tried[0][2]
    if widths is None:  # the exact method: trade a little rate for fewer slow hops
        for _, subset, _ in tried[:BALANCED]:
            for give in GIVE:
                if deadline is not None and time.perf_counter() > deadline:
                    return best
                built = _balanced(problem, overlay, subset, live, give)
                if built is not None and _value(built) < _value(best):
                    best = built
    return best


BALANCED = 3
"""The exact method rebalances the rates of this many of its best packings."""
GIVE = (0.0, 0.005, 0.02, 0.05)
"""Fractions of the packing's rate the rebalanced packings give up for their slowest tree."""


def _depth(overlay: Overlay, tree: Tree) -> int:
    """The most lanes a byte of the tree crosses from its holder to an instance GPU."""
    parent = {overlay.arcs[a].dst: overlay.senders[overlay.arcs[a].sender].name for a in tree.arcs}
    deepest = 0
    for node in parent:
        hops, at = 0, node
        while at in parent and hops <= len(parent):
            at, hops = parent[at], hops + 1
        deepest = max(deepest, hops)
    return deepest


def _balanced(
    problem: Problem, overlay: Overlay, trees: list[Tree], live: frozenset[int], give: float
) -> Built | None:
    """The packing of ``trees`` at ``1 - give`` of its best rate whose slowest tree per hop is
    fastest: a hop of a tree costs its lanes about a chunk at the tree's rate, which the master
    program leaves out (a linear program: maximise ``z`` with ``y_tau >= depth_tau * z``)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    solved = _master(overlay, trees, problem.tp)
    if solved is None or solved[0] <= 0:
        return None
    target = solved[0] * (1 - give)
    tp, n = problem.tp, len(trees) + 1
    rows, cols, vals = [], [], []
    for t, tree in enumerate(trees):
        rows += [tree.rank, tp + len(overlay.edges) + t, tp + len(overlay.edges) + t]
        cols += [t + 1, t + 1, 0]
        vals += [-1.0, -1.0, float(_depth(overlay, tree))]
        for e, count in tree.load.items():
            rows.append(tp + e)
            cols.append(t + 1)
            vals.append(count)
    shape = (tp + len(overlay.edges) + len(trees), n)
    matrix = csr_matrix((vals, (rows, cols)), shape=shape)
    bounds = np.concatenate([np.full(tp, -target), overlay.capacity, np.zeros(len(trees))])
    cost = np.zeros(n)
    cost[0] = -1.0
    result = linprog(cost, A_ub=matrix, b_ub=bounds, bounds=(0, None), method="highs")
    if result.status != 0:
        return None
    return _plan(problem, overlay, trees, np.asarray(result.x[1:]), live)


def _by_rate(tree: Tree, rate: float) -> float:
    return -rate


def _by_rate_per_hop(tree: Tree, rate: float) -> float:
    """Wide and shallow first: each hop of a tree costs its lanes a chunk at the tree's rate."""
    return -rate / len(tree.arcs)


def _subsets(
    problem: Problem,
    overlay: Overlay,
    trees: list[Tree],
    rates: np.ndarray,
    live: frozenset[int],
    ranking: Callable[[Tree, float], float],
    widths: Sequence[int] | None,
    deadline: float | None,
) -> list[tuple[float, list[Tree], Built]]:
    """Plans under the cost model of the packings of the first ``k`` trees per rank in
    ``ranking`` (the widest first: fewer, wider stripes lose less to each hop's chunk, which
    the program leaves out), ``k`` in ``widths`` (None: every count) and all of them, with each
    plan's value and trees. After ``deadline``, only the first and the last count are tried."""
    by_rank: list[list[int]] = [[] for _ in range(problem.tp)]
    for t in sorted(range(len(trees)), key=lambda t: ranking(trees[t], float(rates[t]))):
        if rates[t] > 1e-9:
            by_rank[trees[t].rank].append(t)
    widest = max(len(ts) for ts in by_rank)
    counts = range(1, widest + 1) if widths is None else [w for w in widths if w < widest]
    ordered = sorted({*counts, widest})
    out = []
    for k in ordered:
        late = deadline is not None and time.perf_counter() > deadline
        if late and k not in (ordered[0], widest):
            continue
        subset = [trees[t] for ts in by_rank for t in ts[:k]]
        solved = _master(overlay, subset, problem.tp)
        if solved is None:
            continue
        built = _plan(problem, overlay, subset, solved[1], live)
        out.append((_value(built), subset, built))
    return out


def _value(built: Built) -> float:
    return score("all_ready", built.ready_at_s, built.live)


def _master(
    overlay: Overlay, trees: list[Tree], tp: int
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray] | None:
    """``(lam, y, edge duals, rank duals)`` of the restricted master program."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    n = len(trees) + 1
    rows, cols, vals = [], [], []
    for t, tree in enumerate(trees):
        rows.append(tree.rank)
        cols.append(t + 1)
        vals.append(-1.0)
        for e, count in tree.load.items():
            rows.append(tp + e)
            cols.append(t + 1)
            vals.append(count)
    rows += list(range(tp))
    cols += [0] * tp
    vals += [1.0] * tp
    matrix = csr_matrix((vals, (rows, cols)), shape=(tp + len(overlay.edges), n))
    bounds = np.concatenate([np.zeros(tp), overlay.capacity])
    cost = np.zeros(n)
    cost[0] = -1.0
    result = linprog(cost, A_ub=matrix, b_ub=bounds, bounds=(0, None), method="highs")
    if result.status != 0:
        return None
    duals = -np.asarray(result.ineqlin.marginals)
    return -float(result.fun), np.asarray(result.x[1:]), duals[tp:], duals[:tp]


def _plan(
    problem: Problem,
    overlay: Overlay,
    trees: list[Tree],
    rates: np.ndarray,
    live: frozenset[int],
) -> Built:
    """Lanes of every tree with a positive rate: its share of the rank's interval, paced at the
    tree's rate."""
    builder = base_builder(problem)
    offset = len(problem.sources)
    node_of = _node_of(problem, overlay.senders)
    for r in range(problem.tp):
        mine = [(t, float(rates[t])) for t, tree in enumerate(trees) if tree.rank == r]
        whole = sum(y for _, y in mine if y > 0)
        used = [(t, y) for t, y in mine if y > 1e-6 * whole]  # no sliver stripes
        total = sum(y for _, y in used)
        lo = 0.0
        for k, (t, y) in enumerate(used):
            hi = 1.0 if k == len(used) - 1 else lo + y / total
            for a in trees[t].arcs:
                arc = overlay.arcs[a]
                sender = overlay.senders[arc.sender]
                receiver = offset + _target_of(problem, arc.dst)
                source = node_of[sender.name]
                pace = y * _SCALE * (1 - 1e-9)
                if source == receiver:
                    builder.add_gather(
                        receiver, sender.name, arc.dst, r, lo, hi, pace_bytes_per_s=pace
                    )
                else:
                    hop = builder.hop(source, receiver)
                    builder.add_lane(
                        hop, sender.name, arc.exit, arc.dst, r, lo, hi, pace_bytes_per_s=pace
                    )
            lo = hi
    names = [i.name for i in problem.instances if i.node in live]
    chosen = list(problem.live_names) or names[: problem.live]
    return run(problem, builder, chosen)


def _node_of(problem: Problem, senders: Sequence[Sender]) -> dict[str, int]:
    """Each sender's plan node id (sources first, then target nodes)."""
    out: dict[str, int] = {}
    for k, node in enumerate(problem.sources):
        for name in (*node.gpus, *((node.memory,) if node.memory else ())):
            out[name] = k
    for j, node in enumerate(problem.targets):
        for gpu in (*node.gpus, *node.relays):
            out[gpu] = len(problem.sources) + j
    return out


def _target_of(problem: Problem, gpu: str) -> int:
    for j, node in enumerate(problem.targets):
        if gpu in node.gpus or gpu in node.relays:
            return j
    raise KeyError(gpu)
