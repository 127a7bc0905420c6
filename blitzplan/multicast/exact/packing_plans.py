"""The plans of one shape's trees: the packing's subsets, re-shared by lag and rebalanced.

The column generation of :mod:`~blitzplan.multicast.exact.tree_packing` ends with trees and
their master rates; the master leaves out each hop's chunk, so the plan kept is not always all
of them at those rates. :func:`shape_plans` builds, under the cost model, the packings of the
widest ``k`` trees per rank (:func:`_subsets`), and for the exact method the best of them with
stripes sized to their lags (:func:`~blitzplan.multicast.exact.lag_packing.lag_shared`) and
rebalanced for fewer slow hops (:func:`_balanced`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from blitzplan.multicast.exact.lag_packing import Packed, lag_shared
from blitzplan.multicast.exact.lag_packing import depth as tree_depth
from blitzplan.multicast.exact.lag_packing import value as _value
from blitzplan.multicast.exact.overlay_arcs import Overlay, master, packing_plan
from blitzplan.multicast.exact.steiner import Tree
from blitzplan.multicast.setup.problem import Problem

__all__ = ["BALANCED", "GIVE", "LAGGED", "shape_plans"]


def shape_plans(
    problem: Problem,
    overlay: Overlay,
    trees: list[Tree],
    rates: np.ndarray,
    live: frozenset[int],
    widths: Sequence[int] | None,
    deadline: float | None,
) -> Packed | None:
    """The fastest plan of ``trees`` at their master ``rates``: the packings of the first ``k``
    trees per rank (:func:`_subsets`, ``k`` in ``widths``; None, the exact method: every count,
    ranked by rate and by rate per hop, the best three re-shared by lag and rebalanced, every
    plan with fast forwarding lanes), within ``deadline`` (a :func:`time.perf_counter` value;
    the first and the last count, and the best one re-shared, even when late)."""
    fast = widths is None  # the exact method: forwarding lanes faster where links leave room
    rankings = [_by_rate] if widths is not None else [_by_rate, _by_rate_per_hop]
    tried: list[Packed] = []
    for ranking in rankings:
        tried += _subsets(problem, overlay, trees, rates, live, ranking, (widths, deadline, fast))
    if not tried:
        return None
    tried.sort(key=lambda item: item[0])
    if widths is None:  # the exact method: shorter stripes on the slower trees, then
        best = _distinct(tried[:BALANCED])  # trade a little rate for fewer slow hops
        for k, (_, subset, kept, _) in enumerate(_distinct(tried[:LAGGED])):
            if k and deadline is not None and time.perf_counter() > deadline:
                break  # the best one even when late: three plans
            tried.append(lag_shared(problem, overlay, subset, kept, live, fast))
        for _, subset, _, _ in best:
            for give in GIVE:
                if deadline is not None and time.perf_counter() > deadline:
                    return min(tried, key=lambda item: item[0])
                balanced = _balanced(problem, overlay, subset, live, give, fast)
                if balanced is not None:
                    again = lag_shared(problem, overlay, subset, balanced[2], live, fast)
                    tried += [balanced, again]
    return min(tried, key=lambda item: item[0])


def _distinct(packs: list[Packed]) -> list[Packed]:
    """The first of each set of trees among ``packs`` (the two rankings often keep the same
    trees, whose master rates, re-sharing and rebalancing are then the same)."""
    seen: dict[tuple[tuple[int, tuple[int, ...]], ...], Packed] = {}
    for pack in packs:
        seen.setdefault(tuple((t.rank, t.arcs) for t in pack[1]), pack)
    return list(seen.values())


LAGGED = 3
"""The exact method re-shares the stripes of this many of its best packings."""


BALANCED = 3
"""The exact method rebalances the rates of this many of its best packings."""
GIVE = (0.0, 0.005, 0.02, 0.05)
"""Fractions of the packing's rate the rebalanced packings give up for their slowest tree."""


def _balanced(
    problem: Problem,
    overlay: Overlay,
    trees: list[Tree],
    live: frozenset[int],
    give: float,
    fast: bool = False,
) -> Packed | None:
    """The packing of ``trees`` at ``1 - give`` of its best rate whose slowest tree per hop is
    fastest: a hop of a tree costs its lanes about a chunk at the tree's rate, which the master
    program leaves out (a linear program: maximise ``z`` with ``y_tau >= depth_tau * z``)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_matrix

    solved = master(overlay, trees, problem.tp)
    if solved is None or solved[0] <= 0:
        return None
    target = solved[0] * (1 - give)
    tp, n = problem.tp, len(trees) + 1
    rows, cols, vals = [], [], []
    for t, tree in enumerate(trees):
        rows += [tree.rank, tp + len(overlay.edges) + t, tp + len(overlay.edges) + t]
        cols += [t + 1, t + 1, 0]
        vals += [-1.0, -1.0, float(tree_depth(overlay, tree))]
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
    rates = np.asarray(result.x[1:])
    built = packing_plan(problem, overlay, trees, rates, live, fast=fast)
    return _value(built), trees, rates, built


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
    limits: tuple[Sequence[int] | None, float | None, bool],
) -> list[Packed]:
    """Plans under the cost model of the packings of the first ``k`` trees per rank in
    ``ranking`` (the widest first: fewer, wider stripes lose less to each hop's chunk, which
    the program leaves out), ``k`` in ``widths`` (None: every count) and all of them, with each
    plan's value and trees. After ``deadline``, only the first and the last count are tried;
    ``fast``: forwarding lanes faster where their links leave room."""
    widths, deadline, fast = limits
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
        solved = master(overlay, subset, problem.tp)
        if solved is None:
            continue
        built = packing_plan(problem, overlay, subset, solved[1], live, fast=fast)
        out.append((_value(built), subset, solved[1], built))
    return out
