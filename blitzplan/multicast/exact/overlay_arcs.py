"""The tree packing's plan space: the overlay's arcs (a holder, instance GPU or relay sending to
an instance GPU or relay, each on one route a lane may take), the master linear program over a
set of trees, and the plan of a packing (every tree's lanes paced at its rate).

A *tree* of rank ``r`` carries one stripe interval of rank ``r`` from holders of the whole rank
(the host copy, a source of the new instances' TP degree) to every rank-``r`` instance GPU, over
overlay arcs, with no remote arc out of a live node. Tree ``tau`` runs every lane at rate
``y_tau``; the master maximises ``lam`` with ``sum_{tau of r} y_tau >= lam`` per rank and the
trees' loads within each edge's residual capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from blitzplan.multicast.bound.overlay_lp import (
    Sender,
    lane_routes,
    overlay_receivers,
    overlay_senders,
)
from blitzplan.multicast.exact.steiner import FULL, Tree
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, base_builder, run

__all__ = ["Overlay", "master", "packing_plan", "tree_spans"]

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


def master(
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


def packing_plan(
    problem: Problem,
    overlay: Overlay,
    trees: list[Tree],
    rates: np.ndarray,
    live: frozenset[int],
    shares: np.ndarray | None = None,
    fast: bool = False,
) -> Built:
    """Lanes of every tree with a positive rate: its interval of the rank (:func:`tree_spans`),
    paced at the tree's rate; with ``fast``, a forwarding lane faster by what its links leave
    (:func:`forward_boosts`)."""
    builder = base_builder(problem)
    offset = len(problem.sources)
    node_of = _node_of(problem, overlay.senders)
    spans = tree_spans(trees, rates, problem.tp, shares)
    boost = forward_boosts(overlay, trees, rates, spans) if fast else {}
    for t, (lo, hi) in spans.items():
        y = float(rates[t])
        r = trees[t].rank
        for a in trees[t].arcs:
            arc = overlay.arcs[a]
            sender = overlay.senders[arc.sender]
            receiver = offset + _target_of(problem, arc.dst)
            source = node_of[sender.name]
            pace = (y + boost.get((t, a), 0.0)) * _SCALE * (1 - 1e-9)
            if source == receiver:
                builder.add_gather(receiver, sender.name, arc.dst, r, lo, hi, pace_bytes_per_s=pace)
            else:
                hop = builder.hop(source, receiver)
                builder.add_lane(
                    hop, sender.name, arc.exit, arc.dst, r, lo, hi, pace_bytes_per_s=pace
                )
    names = [i.name for i in problem.instances if i.node in live]
    chosen = list(problem.live_names) or names[: problem.live]
    return run(problem, builder, chosen)


def forward_boosts(
    overlay: Overlay, trees: list[Tree], rates: np.ndarray, spans: dict[int, tuple[float, float]]
) -> dict[tuple[int, int], float]:
    """Per forwarding arc ``(tree, arc)`` of the trees with a span, the rate its route's links
    leave it above its tree's: each link's slack (its capacity less every spanned tree's load)
    in equal parts among the forwarding arcs crossing it, the least part on the route. A hop
    costs its lane a chunk at its own rate (the cost model's per-hop term), so a faster
    forwarding lane ends nearer its feeder; the paces still fit every link."""
    slack = overlay.capacity.copy()
    crossing = np.zeros(len(slack))
    forwarding = []
    for t in spans:
        for e, count in trees[t].load.items():
            slack[e] -= count * float(rates[t])
        for a in trees[t].arcs:
            if overlay.senders[overlay.arcs[a].sender].node is not None:
                forwarding.append((t, a))
                np.add.at(crossing, overlay.arcs[a].edges, 1.0)
    part = np.maximum(slack, 0.0) / np.maximum(crossing, 1.0)
    return {
        (t, a): float(part[overlay.arcs[a].edges].min()) if len(overlay.arcs[a].edges) else 0.0
        for t, a in forwarding
    }


def tree_spans(
    trees: list[Tree], rates: np.ndarray, tp: int, shares: np.ndarray | None = None
) -> dict[int, tuple[float, float]]:
    """Per tree with a positive rate (none below 1e-6 of its rank's: no sliver stripes) and a
    positive share, its interval ``[lo, hi)`` of its rank: consecutive, in tree order, sized by
    ``shares`` (relative within the rank; None: by rate)."""
    out: dict[int, tuple[float, float]] = {}
    for r in range(tp):
        mine = [(t, float(rates[t])) for t, tree in enumerate(trees) if tree.rank == r]
        whole = sum(y for _, y in mine if y > 0)
        part = {t: y if shares is None else float(shares[t]) for t, y in mine if y > 1e-6 * whole}
        used = [t for t, w in part.items() if w > 0]
        total = sum(part[t] for t in used)
        lo = 0.0
        for k, t in enumerate(used):
            hi = 1.0 if k == len(used) - 1 else lo + part[t] / total
            out[t] = (lo, hi)
            lo = hi
    return out


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
