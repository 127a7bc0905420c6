"""The tree packing's per-hop lag: stripes sized to it, and packings chosen for it.

The cost model charges a forwarding lane ``min(chunk, stripe of a unit) / its rate`` per hop
(:mod:`~blitzplan.multicast.timeline.lane_times`), which the master program leaves out: a tree of
rate ``y`` whose stripe of ``s`` of the shard (``S`` bytes) ends ``d`` after ``s * S / y``. Its
*lag bytes* ``L = d * y`` are about a chunk per forwarding hop on its deepest path (the first
hop, from a holder, costs none), whatever its rate.

- :func:`lag_shared` sizes each tree's stripe to its lag, so every tree of a rank ends at once.
- :func:`lag_repack` chooses the trees and their rates for it: every tree of a rank then ends at
  ``T`` with ``T * sum y = S + sum L`` over the trees used, so the finish time charges each tree
  used its lag bytes once, a fixed charge. For a ``T`` it is a mixed-integer program (maximise
  ``lam`` with ``sum_r (y - z * L / T) >= lam`` per rank, ``y <= z * cap``, ``z`` binary, the
  master's edge capacities), solved again at the ``T`` its plan reaches (Dinkelbach's step for
  the ratio), the lag bytes measured on each plan. Fewer and shallower trees at nearly the rate.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from blitzplan.multicast.bound.cuts import missing_bytes
from blitzplan.multicast.exact.overlay_arcs import Overlay, packing_plan, tree_spans
from blitzplan.multicast.exact.steiner import Tree
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, score
from blitzplan.solvers.backends import quiet_stdout

__all__ = ["LAG_ROUNDS", "LAG_SOLVES", "Packed", "depth", "lag_repack", "lag_shared", "tree_lags"]

Packed = tuple[float, list[Tree], np.ndarray, Built]
"""A packing's plan: its value, trees, their rates, and the plan."""
LAG_ROUNDS = 3
""":func:`lag_shared` builds this many plans: by rate, then twice by the lags measured on the
plan before."""
LAG_SOLVES = 3
""":func:`lag_repack` solves its program at most this many times."""
NODES = 200
"""Without a clock, a solve of :func:`lag_repack` explores at most this many nodes."""
_SCALE = 1e9
"""The master program's rates are in GB/s."""


def value(built: Built) -> float:
    return score("all_ready", built.ready_at_s, built.live)


def depth(overlay: Overlay, tree: Tree) -> int:
    """The most lanes a byte of the tree crosses from its holder to an instance GPU."""
    parent = {overlay.arcs[a].dst: overlay.senders[overlay.arcs[a].sender].name for a in tree.arcs}
    deepest = 0
    for node in parent:
        hops, at = 0, node
        while at in parent and hops <= len(parent):
            at, hops = parent[at], hops + 1
        deepest = max(deepest, hops)
    return deepest


def tree_lags(
    problem: Problem, trees: list[Tree], rates: np.ndarray, shares: np.ndarray | None, built: Built
) -> dict[int, float]:
    """Per tree with a span in ``built`` (the packing's plan, stripes by ``shares``, None: by
    rate), its lag: its last lane's end less the start and its stripe's bytes at its rate."""
    shard = missing_bytes(problem, problem.instances[0].name)
    start = min(i.startup_s for i in problem.instances)
    spans = tree_spans(trees, rates, problem.tp, shares)
    of_span = {(trees[t].rank, lo): t for t, (lo, _) in spans.items()}
    ends = np.zeros(len(trees))
    arrival = built.timeline.lane_arrival_s
    for lane in built.builder.lanes:
        t = of_span[(lane.rank, lane.lo)]
        ends[t] = max(ends[t], float(arrival[lane.flow].max(initial=0.0)))
    return {
        t: max(0.0, ends[t] - start - (hi - lo) * shard / (float(rates[t]) * _SCALE))
        for t, (lo, hi) in spans.items()
    }


def lag_shared(
    problem: Problem,
    overlay: Overlay,
    trees: list[Tree],
    rates: np.ndarray,
    live: frozenset[int],
    fast: bool = False,
) -> Packed:
    """The packing at the same rates with each tree's stripe sized to its lag: the best plan of
    :data:`LAG_ROUNDS` rounds. A tree of rate ``y`` and lag ``d`` (:func:`tree_lags`) gets the
    share ``y * (T - d)`` with ``T`` such that the shares of a rank sum to its shard: every tree
    of it then ends at about ``T``, where shares by rate end the plan at the largest lag. Each
    round measures the lags on the previous round's plan. ``fast``: forwarding lanes faster by
    what their links leave (:func:`~blitzplan.multicast.exact.overlay_arcs.packing_plan`)."""
    return _shared(problem, overlay, trees, rates, live, fast)[0]


def _shared(
    problem: Problem,
    overlay: Overlay,
    trees: list[Tree],
    rates: np.ndarray,
    live: frozenset[int],
    fast: bool,
) -> tuple[Packed, dict[int, float]]:
    """:func:`lag_shared` and the lags of its plan's trees."""
    shard = missing_bytes(problem, problem.instances[0].name)
    shares = None
    built = packing_plan(problem, overlay, trees, rates, live, fast=fast)
    best: Packed = (value(built), trees, rates, built)
    best_shares = shares
    for _ in range(LAG_ROUNDS - 1):
        lag = tree_lags(problem, trees, rates, shares, built)
        shares = np.zeros(len(trees))
        for r in range(problem.tp):
            mine = [t for t in lag if trees[t].rank == r]
            if not mine:
                continue  # no tree of this rank has a rate: its lanes are none either way
            speed = {t: float(rates[t]) * _SCALE for t in mine}
            end = (shard + sum(speed[t] * lag[t] for t in mine)) / sum(speed.values())
            for t in mine:
                shares[t] = max(0.0, speed[t] * (end - lag[t]))
        built = packing_plan(problem, overlay, trees, rates, live, shares, fast=fast)
        if value(built) < best[0]:
            best, best_shares = (value(built), trees, rates, built), shares
    return best, tree_lags(problem, trees, rates, best_shares, best[3])


def lag_repack(
    problem: Problem,
    overlay: Overlay,
    pool: list[Tree],
    live: frozenset[int],
    incumbent: float,
    clock: tuple[float, float] | None,
    more: Callable[[np.ndarray], list[Tree]] | None = None,
) -> Packed | None:
    """The best plan of :func:`lag_shared` (fast forwarding lanes) on the packings of the trees
    ``pool`` that end first counting each tree's lag bytes once (module docstring), the program
    solved first at ``incumbent`` (the best plan's value) with every tree's lag bytes a chunk
    per forwarding hop, then at each plan's value with the lag bytes measured on it (until the
    trees repeat); at most :data:`LAG_SOLVES` solves, each within ``clock``'s seconds per solve
    and its deadline (None: no clock but :data:`NODES` branch-and-bound nodes a solve, so equal
    input gives an identical plan); None when none found a packing. ``more``: trees of least
    total price per rank (the pricing) for each solve's slack: priced at one over what each
    link leaves, they fit where the chosen packing has room and join the pool."""
    start = min(i.startup_s for i in problem.instances)
    pool = list(pool)
    known = {(t.rank, t.arcs) for t in pool}
    lags = np.array([max(depth(overlay, t) - 1, 0) * problem.chunk_bytes for t in pool]) / _SCALE
    best: Packed | None = None
    span = incumbent - start
    chosen: list[frozenset[int]] = []
    for solve in range(LAG_SOLVES):
        left = None if clock is None else min(clock[1], clock[0] - time.perf_counter())
        if span <= 0 or (left is not None and left <= 0):
            break
        used = _fixed_charge(overlay, pool, problem.tp, lags / span, left)
        if used is None or frozenset(used) in chosen:
            break
        chosen.append(frozenset(used))
        trees, rates = [pool[t] for t in used], np.array(list(used.values()))
        packed, measured = _shared(problem, overlay, trees, rates, live, True)
        if best is None or packed[0] < best[0]:
            best = packed
        for k, t in enumerate(used):
            if k in measured:
                lags[t] = measured[k] * float(rates[k])
        span = packed[0] - start
        late = clock is not None and time.perf_counter() > clock[0]
        if more is not None and solve < LAG_SOLVES - 1 and not late:
            slack = overlay.capacity.copy()
            for t, y in used.items():
                for e, count in pool[t].load.items():
                    slack[e] -= count * y
            fresh = [
                t
                for t in more(1.0 / np.maximum(slack, 1e-3 * overlay.capacity + 1e-9))
                if (t.rank, t.arcs) not in known
            ]
            known.update((t.rank, t.arcs) for t in fresh)
            pool += fresh
            extra = [max(depth(overlay, t) - 1, 0) * problem.chunk_bytes / _SCALE for t in fresh]
            lags = np.concatenate([lags, extra])
    return best


def _fixed_charge(
    overlay: Overlay, pool: list[Tree], tp: int, charge: np.ndarray, time_limit_s: float | None
) -> dict[int, float] | None:
    """``{tree: rate}`` of the trees used by the best solution of: maximise ``lam`` with
    ``sum_{tau of r} (y_tau - charge_tau * z_tau) >= lam`` per rank, the trees' loads within
    each edge's capacity, ``y_tau <= z_tau * cap_tau`` (its least capacity per load), ``z``
    binary; None when none was found in ``time_limit_s`` (None: in :data:`NODES` nodes)."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_matrix

    n, edges = len(pool), len(overlay.edges)
    rows, cols, vals = [], [], []
    cap = np.zeros(n)
    for t, tree in enumerate(pool):
        cap[t] = min((overlay.capacity[e] / c for e, c in tree.load.items()), default=0.0)
        rows += [tree.rank, tree.rank, tp + edges + t, tp + edges + t]
        cols += [1 + t, 1 + n + t, 1 + t, 1 + n + t]
        vals += [-1.0, float(charge[t]), 1.0, -cap[t]]
        for e, c in tree.load.items():
            rows.append(tp + e)
            cols.append(1 + t)
            vals.append(c)
    rows += list(range(tp))
    cols += [0] * tp
    vals += [1.0] * tp
    matrix = csr_matrix((vals, (rows, cols)), shape=(tp + edges + n, 1 + 2 * n))
    upper = np.concatenate([np.zeros(tp), overlay.capacity, np.zeros(n)])
    cost = np.zeros(1 + 2 * n)
    cost[0] = -1.0
    options: dict[str, float] = {"mip_rel_gap": 1e-4}
    if time_limit_s is None:
        options["node_limit"] = NODES
    else:
        options["time_limit"] = time_limit_s
    with quiet_stdout():  # HiGHS 1.12 (SciPy 1.17) prints a debug line on some programs
        result = milp(
            cost,
            constraints=LinearConstraint(matrix, -np.inf, upper),
            integrality=np.concatenate([np.zeros(1 + n), np.ones(n)]),
            bounds=Bounds(np.zeros(1 + 2 * n), np.concatenate([[np.inf], cap, np.ones(n)])),
            options=options,
        )
    if result.x is None or result.x[0] <= 0:
        return None
    rates, used = result.x[1 : 1 + n], result.x[1 + n :] > 0.5
    return {t: float(rates[t]) for t in range(n) if used[t] and rates[t] > 1e-9}
