"""Pricing for the tree packing: the tree of one rank with the least total price, exactly.

A tree carries a stripe of one rank from holders of the whole rank to every instance GPU of that
rank over overlay arcs (each on one lane route); its price is the sum of its routes' edge prices.
Dreyfus-Wagner over the rank's instance GPUs (at most eight per rank in practice: ``3^k`` steps)
on all-pairs shortest paths of the overlay finds the cheapest; relays and other instance GPUs of
the rank are the Steiner nodes. A virtual root with a free arc to every holder of the whole rank
lets the tree be a forest (parts fed by different holders).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from blitzplan.multicast.exact.overlay_arcs import Overlay

__all__ = ["FULL", "RankGraph", "Tree", "cheapest_tree"]

FULL = 1.0 - 1e-9
"""A holder of at least this fraction of a rank holds all of it."""


@dataclass(frozen=True)
class Tree:
    rank: int
    arcs: tuple[int, ...]
    load: dict[int, float]


class RankGraph:
    """The overlay of one rank as index arrays: its nodes, arcs (with their routes' edges as a
    sparse incidence matrix), holders and instance GPUs."""

    def __init__(self, overlay: Overlay, rank: int) -> None:
        from scipy.sparse import csr_matrix

        self.rank = rank
        arcs = overlay.arcs_of_rank(rank)
        senders = [overlay.senders[overlay.arcs[a].sender].name for a in arcs]
        dsts = [overlay.arcs[a].dst for a in arcs]
        names = sorted(set(senders)) + sorted(set(dsts) - set(senders))
        at = {name: k for k, name in enumerate(names)}
        self.n = len(names)
        self.arcs = np.array(arcs, dtype=int)
        self.u = np.array([at[x] for x in senders], dtype=int)
        self.v = np.array([at[x] for x in dsts], dtype=int)
        lengths = [len(overlay.arcs[a].edges) for a in arcs]
        cols = np.concatenate([overlay.arcs[a].edges for a in arcs]) if arcs else np.zeros(0)
        rows = np.repeat(np.arange(len(arcs)), lengths)
        self.incidence = csr_matrix(
            (np.ones(len(cols)), (rows, cols.astype(int))), shape=(len(arcs), len(overlay.edges))
        )
        self.roots = [
            at[s.name]
            for s in overlay.senders
            if s.node is None and s.holds[rank] >= FULL and s.name in at
        ]
        wanted = [g for g, r in overlay.receivers.items() if r == rank]
        self.terminals = [at[g] for g in wanted if g in at]
        self.complete = len(self.terminals) == len(wanted) and bool(self.roots)


def cheapest_tree(
    overlay: Overlay, graph: RankGraph, price: np.ndarray, depth: int | None = None
) -> Tree | None:
    """The tree of the graph's rank of least total price (its arcs' routes' prices), exactly:
    Dreyfus-Wagner over the rank's instance GPUs on the overlay's shortest paths, from a
    virtual root with a free arc to every holder of the whole rank, so a "tree" may be a forest
    whose parts start at different holders (a stripe fed to one host by its own source and to
    another host by another). ``depth``: the cheapest tree in which no byte crosses more than
    that many arcs from its holder (:func:`_shallow`; None: any depth)."""
    if not graph.complete:
        return None
    n = graph.n
    costs = graph.incidence @ price
    order = np.lexsort((costs, graph.u * n + graph.v))
    pair = (graph.u * n + graph.v)[order]
    first = order[np.r_[True, pair[1:] != pair[:-1]]]
    cost = np.full((n + 1, n + 1), math.inf)  # node n: a virtual root over every holder
    pick = np.full((n + 1, n + 1), -1, dtype=int)
    cost[graph.u[first], graph.v[first]] = costs[first]
    pick[graph.u[first], graph.v[first]] = graph.arcs[first]
    cost[n, graph.roots] = 0.0
    if depth is not None:
        return _shallow(overlay, graph, cost, pick, depth)
    dist, hop = _shortest(cost)
    best, via = _dreyfus_wagner(dist, graph.terminals)
    full = (1 << len(graph.terminals)) - 1
    if not math.isfinite(best[full][n]):
        return None
    parent: dict[int, int] = {}
    _unfold(full, n, best, via, (hop, pick), parent, {n})
    return _tree(overlay, graph.rank, parent.values())


def _tree(overlay: Overlay, rank: int, arcs: Iterable[int]) -> Tree:
    chosen = tuple(sorted(a for a in arcs if a >= 0))
    load: dict[int, float] = {}
    for a in chosen:
        for e in overlay.arcs[a].edges:
            load[int(e)] = load.get(int(e), 0.0) + 1.0
    return Tree(rank, chosen, load)


def _shallow(
    overlay: Overlay, graph: RankGraph, cost: np.ndarray, pick: np.ndarray, depth: int
) -> Tree | None:
    """The cheapest tree of at most ``depth`` arcs from a holder to any node: Dreyfus-Wagner
    on the arcs themselves (no shortest paths, each step one arc deeper), layer by layer:
    ``best[h][mask, v]`` is the least price of a tree from ``v`` over at most ``h`` arcs
    reaching the terminals in ``mask``, either one arc ``v -> u`` and a tree of ``h - 1`` from
    ``u``, or two such trees from ``v`` split between submasks. The virtual root's free arcs
    to the holders are one layer more."""
    terminals = graph.terminals
    k, n = len(terminals), len(cost)
    size = 1 << k
    base = np.full((size, n), math.inf)
    base[0] = 0.0
    for i, t in enumerate(terminals):
        base[1 << i, t] = 0.0
    layers: list[tuple[np.ndarray, np.ndarray]] = []
    below = base
    for _ in range(depth + 1):
        through = cost[None, :, :] + below[:, None, :]  # [mask, v, u]: the arc v -> u first
        go = np.argmin(through, axis=2)
        extend = np.take_along_axis(through, go[:, :, None], axis=2)[:, :, 0]
        better = extend < base
        best = np.where(better, extend, base)
        child = np.where(better, go, -1)  # the arc's end, or -1: a split (or a leaf)
        for masks, subs, starts in _splits(k):  # by bit count: each split's parts are done
            merged = np.minimum.reduceat(best[subs] + best[masks ^ subs], starts, axis=0)
            whole = masks[starts]
            better = merged < best[whole]
            best[whole] = np.where(better, merged, best[whole])
            child[whole] = np.where(better, -1, child[whole])
        layers.append((best, child))
        below = best
    full = size - 1
    if not math.isfinite(layers[-1][0][full, n - 1]):
        return None
    parent: dict[int, int] = {}
    reached = {n - 1}
    stack = [(depth, full, n - 1)]
    while stack:
        h, mask, v = stack.pop()
        if mask == 0 or h < 0:
            continue  # nothing to reach, or a leaf (the base layer)
        best, child = layers[h]
        u = int(child[mask, v])
        if u >= 0:
            if u not in reached:
                parent[u] = int(pick[v, u])
                reached.add(u)
            stack.append((h - 1, mask, u))
        elif mask & (mask - 1):
            sub = _split(best, mask, v)
            stack += [(h, sub, v), (h, mask ^ sub, v)]
    return _tree(overlay, graph.rank, parent.values())


@functools.cache
def _splits(k: int) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...]:
    """Per bit count from 2 to ``k``: every mask of that count once per split (the mask,
    repeated), the split's part holding the mask's lowest bit, and where each mask's splits
    start."""
    out = []
    for count in range(2, k + 1):
        masks: list[int] = []
        subs: list[int] = []
        for mask in range(1, 1 << k):
            if mask.bit_count() == count:
                halves = _halves(mask)
                masks += [mask] * len(halves)
                subs += halves
        starts = np.flatnonzero(np.r_[True, np.diff(masks) != 0])
        out.append((np.array(masks), np.array(subs), starts))
    return tuple(out)


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


def _dreyfus_wagner(dist: np.ndarray, terminals: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """``best[mask, v]``: least price of a tree from ``v`` reaching the terminals in ``mask``;
    ``via[mask, v]`` the node it walks to first (where it branches into the split
    :func:`_split` names). Masks of one bit count at once: their splits' parts are done."""
    k, n = len(terminals), len(dist)
    size = 1 << k
    best = np.zeros((size, n))
    via = np.zeros((size, n), dtype=int)
    for i, t in enumerate(terminals):
        best[1 << i] = dist[:, t]
        via[1 << i] = t
    for masks, subs, starts in _splits(k):
        branched = np.minimum.reduceat(best[subs] + best[masks ^ subs], starts, axis=0)
        total = dist[None, :, :] + branched[:, None, :]  # [mask, v, u]: walk to u, branch there
        go = np.argmin(total, axis=2)
        whole = masks[starts]
        best[whole] = np.take_along_axis(total, go[:, :, None], axis=2)[:, :, 0]
        via[whole] = go
    return best, via


def _split(best: np.ndarray, mask: int, v: int) -> int:
    """The part holding ``mask``'s lowest bit of the cheapest split of ``mask`` at ``v``."""
    halves = np.array(_halves(mask))
    return int(halves[np.argmin(best[halves, v] + best[mask ^ halves, v])])


@functools.cache
def _halves(mask: int) -> tuple[int, ...]:
    """The proper submasks of ``mask`` holding its lowest bit (each split once)."""
    low = mask & -mask
    out = []
    sub = (mask - 1) & mask
    while sub:
        if sub & low:
            out.append(sub)
        sub = (sub - 1) & mask
    return tuple(out)


def _unfold(
    mask: int,
    v: int,
    best: np.ndarray,
    via: np.ndarray,
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
    sub = _split(best, mask, u)
    _unfold(sub, u, best, via, paths, parent, reached)
    _unfold(mask ^ sub, u, best, via, paths, parent, reached)
