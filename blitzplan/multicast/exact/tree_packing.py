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

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from blitzplan.multicast.bound.overlay_lp import (
    Sender,
    lane_routes,
    overlay_receivers,
    overlay_senders,
)
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, base_builder, run, score

__all__ = ["MAX_ROUNDS", "pack_trees"]

MAX_ROUNDS = 400
"""At most this many pricing rounds."""
WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16)
"""Trees per rank the final packings keep (the widest ones), besides all of them."""
_FULL = 1.0 - 1e-9
_SCALE = 1e9


@dataclass(frozen=True)
class _Arc:
    sender: int
    """Index into the senders."""
    dst: str
    exit: str
    edges: np.ndarray
    """Edge indices of its route."""


@dataclass(frozen=True)
class _Tree:
    rank: int
    arcs: tuple[int, ...]
    load: dict[int, float]


class _Overlay:
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
            sends = s.holds[rank] >= _FULL if s.node is None else self._carries(s.name, rank)
            if sends and self.receivers[arc.dst] in (rank, None):
                out.append(a)
        return out

    def _carries(self, gpu: str, rank: int) -> bool:
        return self.receivers[gpu] in (rank, None)


def pack_trees(problem: Problem, live: frozenset[int], *, time_limit_s: float) -> Built | None:
    """The plan of the best tree packing found within ``time_limit_s``, live nodes ``live``;
    None when some instance GPU cannot be reached that way."""
    if problem.delivered or any(t.present for t in problem.targets):
        return None
    if sum(1 for i in problem.instances if i.node in live) < problem.live:
        return None  # the live nodes cannot hold the live instances
    began = time.perf_counter()
    overlay = _Overlay(problem, live)
    per_rank = [overlay.arcs_of_rank(r) for r in range(problem.tp)]
    prices = 1.0 / np.maximum(overlay.capacity, 1e-9)
    trees: list[_Tree] = []
    for r in range(problem.tp):
        tree = _steiner(overlay, r, per_rank[r], prices)
        if tree is None:
            return None
        trees.append(tree)
    solution = None
    for _ in range(MAX_ROUNDS):
        solution = _master(overlay, trees, problem.tp)
        if solution is None:
            return None
        _, _, edge_duals, rank_duals = solution
        added = 0
        for r in range(problem.tp):
            tree = _steiner(overlay, r, per_rank[r], np.maximum(edge_duals, 0.0) + 1e-6 * prices)
            if tree is None:
                continue
            cost = sum(edge_duals[e] * n for e, n in tree.load.items())
            if cost < rank_duals[r] * (1 - 1e-7) and tree not in trees:
                trees.append(tree)
                added += 1
        if not added or time.perf_counter() - began > time_limit_s:
            break
    if solution is None:
        return None
    return _best_subset(problem, overlay, trees, solution[1], live)


def _best_subset(
    problem: Problem,
    overlay: _Overlay,
    trees: list[_Tree],
    rates: np.ndarray,
    live: frozenset[int],
) -> Built | None:
    """The best plan under the cost model among the packings of the ``k`` widest trees per
    rank, ``k`` growing: fewer, wider stripes lose less to each hop's chunk (the program
    leaves that time out)."""
    by_rank: list[list[int]] = [[] for _ in range(problem.tp)]
    for t in sorted(range(len(trees)), key=lambda t: -rates[t]):
        if rates[t] > 1e-9:
            by_rank[trees[t].rank].append(t)
    widest = max(len(ts) for ts in by_rank)
    best: Built | None = None
    for k in sorted({w for w in WIDTHS if w < widest} | {widest}):
        subset = [trees[t] for ts in by_rank for t in ts[:k]]
        solved = _master(overlay, subset, problem.tp)
        if solved is None:
            continue
        built = _plan(problem, overlay, subset, solved[1], live)
        if best is None or _value(built) < _value(best):
            best = built
    return best


def _value(built: Built) -> float:
    return score("all_ready", built.ready_at_s, built.live)


def _steiner(overlay: _Overlay, rank: int, arcs: Sequence[int], price: np.ndarray) -> _Tree | None:
    """The tree of rank ``rank`` of least total price (its arcs' routes' prices), exactly:
    Dreyfus-Wagner over the rank's instance GPUs on the overlay's shortest paths."""
    names = sorted({overlay.senders[overlay.arcs[a].sender].name for a in arcs})
    names += sorted({overlay.arcs[a].dst for a in arcs} - set(names))
    at = {name: k for k, name in enumerate(names)}
    n = len(names)
    cost = np.full((n, n), math.inf)
    pick = np.full((n, n), -1, dtype=int)
    for a in arcs:
        arc = overlay.arcs[a]
        u, v = at[overlay.senders[arc.sender].name], at[arc.dst]
        c = float(price[arc.edges].sum())
        if c < cost[u, v]:
            cost[u, v], pick[u, v] = c, a
    dist, hop = _shortest(cost)
    roots = [
        at[s.name]
        for s in overlay.senders
        if s.node is None and s.holds[rank] >= _FULL and s.name in at
    ]
    terminals = [at[g] for g, r in overlay.receivers.items() if r == rank and g in at]
    if len(terminals) < sum(1 for r in overlay.receivers.values() if r == rank) or not roots:
        return None
    best, split, via = _dreyfus_wagner(dist, terminals)
    full = (1 << len(terminals)) - 1
    root = min(roots, key=lambda v: best[full][v])
    if not math.isfinite(best[full][root]):
        return None
    parent: dict[int, int] = {}
    _unfold(full, root, split, via, (hop, pick), parent, {root})
    chosen = tuple(sorted(parent.values()))
    load: dict[int, float] = {}
    for a in chosen:
        for e in overlay.arcs[a].edges:
            load[int(e)] = load.get(int(e), 0.0) + 1.0
    return _Tree(rank, chosen, load)


def _shortest(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All-pairs shortest paths (Floyd-Warshall) and the first hop of each."""
    n = len(cost)
    dist = cost.copy()
    np.fill_diagonal(dist, 0.0)
    hop = np.tile(np.arange(n), (n, 1))
    for k in range(n):
        through = dist[:, k : k + 1] + dist[k : k + 1, :]
        better = through < dist - 1e-15
        dist = np.where(better, through, dist)
        hop = np.where(better, hop[:, k : k + 1], hop)
    return dist, hop


def _dreyfus_wagner(
    dist: np.ndarray, terminals: list[int]
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """``best[mask][v]``: least price of a tree from ``v`` reaching the terminals in ``mask``;
    ``via[mask][v]`` the node it walks to first and ``split[mask][v]`` the submask it branches
    into there."""
    k, n = len(terminals), len(dist)
    size = 1 << k
    best: list[np.ndarray] = [np.zeros(n)] * size
    split: list[np.ndarray] = [np.zeros(n, dtype=int)] * size
    via: list[np.ndarray] = [np.zeros(n, dtype=int)] * size
    for i, t in enumerate(terminals):
        best[1 << i] = dist[:, t].copy()
        via[1 << i] = np.full(n, t)
    for mask in range(1, size):
        if mask & (mask - 1) == 0:
            continue
        low = mask & -mask
        branched = np.full(n, math.inf)
        part = np.zeros(n, dtype=int)
        sub = (mask - 1) & mask
        while sub:
            if sub & low:
                value = best[sub] + best[mask ^ sub]
                better = value < branched
                branched = np.where(better, value, branched)
                part = np.where(better, sub, part)
            sub = (sub - 1) & mask
        total = dist + branched[None, :]
        go = np.argmin(total, axis=1)
        best[mask] = total[np.arange(n), go]
        via[mask] = go
        split[mask] = part[go]
    return best, split, via


def _unfold(
    mask: int,
    v: int,
    split: list[np.ndarray],
    via: list[np.ndarray],
    paths: tuple[np.ndarray, np.ndarray],
    parent: dict[int, int],
    reached: set[int],
) -> None:
    """The arcs of the tree ``best[mask][v]`` into ``parent`` (one parent per node, each
    added after its parent)."""
    u = int(via[mask][v])
    hop, pick = paths
    step = v
    while step != u:
        nxt = int(hop[step, u])
        if nxt not in reached:
            parent[nxt] = int(pick[step, nxt])
            reached.add(nxt)
        step = nxt
    if mask & (mask - 1) == 0:
        return
    sub = int(split[mask][v])
    _unfold(sub, u, split, via, paths, parent, reached)
    _unfold(mask ^ sub, u, split, via, paths, parent, reached)


def _master(
    overlay: _Overlay, trees: list[_Tree], tp: int
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
    overlay: _Overlay,
    trees: list[_Tree],
    rates: np.ndarray,
    live: frozenset[int],
) -> Built:
    """Lanes of every tree with a positive rate: its share of the rank's interval, paced at the
    tree's rate."""
    builder = base_builder(problem)
    offset = len(problem.sources)
    node_of = _node_of(problem, overlay.senders)
    for r in range(problem.tp):
        used = [(t, rates[t]) for t, tree in enumerate(trees) if tree.rank == r and rates[t] > 1e-9]
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
