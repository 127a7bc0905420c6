"""A plan from the overlay program's structure: every rank's stripes as a packing of trees.

The trees, their routes and the master linear program are those of
:mod:`~blitzplan.multicast.exact.overlay_arcs`. Columns come from pricing: with the edge duals
as arc costs, :func:`~blitzplan.multicast.exact.steiner.cheapest_tree` proposes a tree of least
dual cost; it joins while that cost is below the rank's dual. A *shape* sets how: the most arcs
a byte may cross from its holder (None: any), and how many trees each rank prices per round
(after each, its links cost more, so the next takes others: many equal relays then join in few
rounds). Each hop a thin stripe forwards costs it about a chunk at its rate, which the master
leaves out, so shallow trees may time faster even at a lower rate; the plans of several shapes
are timed and the fastest kept. The pricing is heuristic for the time-limited use, so the
plan is checked against the certified bounds like any other.

The plan gives tree ``tau`` of rank ``r`` the interval share ``y_tau / sum_r y`` and paces every
lane at ``y_tau``, so the max-min fair rates are exactly the packing's rates; the cost model then
times it (chunks, latency, startup). The exact method also paces forwarding lanes faster where
their links leave room (a hop costs a chunk at the lane's own rate), re-shares its best packings
by lag and chooses the trees of every shape again for their lags
(:mod:`~blitzplan.multicast.exact.lag_packing`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from blitzplan.multicast.exact.lag_packing import Packed, lag_repack
from blitzplan.multicast.exact.lag_packing import value as _value
from blitzplan.multicast.exact.overlay_arcs import Overlay, master
from blitzplan.multicast.exact.packing_plans import shape_plans
from blitzplan.multicast.exact.slice_twin import by_rate, twin, twin_trees
from blitzplan.multicast.exact.steiner import RankGraph, Tree, cheapest_tree
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built

__all__ = [
    "EXACT_SHAPES",
    "GREEDY_SHAPES",
    "MAX_ROUNDS",
    "PACK_GAP",
    "PACK_ROUNDS",
    "Priced",
    "Shape",
    "pack_trees",
    "packings",
    "price_trees",
    "priced_twin",
    "repack",
]

Shape = tuple[int | None, int]
"""``(depth, per_round)``: the most arcs from a holder (None: any) and trees priced per rank
and round."""
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
GREEDY_SHAPES: tuple[Shape, ...] = ((3, 4), (4, 4), (None, 4))
"""The greedy's packings: trees of at most three arcs, four, then of any depth, four a round
(the later ones only while the packings beat the greedy's plan and are still :data:`PACK_GAP`
above its bound)."""
EXACT_SHAPES: tuple[Shape, ...] = ((None, 1), (None, 4), (3, 4), (4, 4), (2, 4))
"""The exact method's packings, each with an equal share of the time left."""
SHAPES_SHARE = 0.85
"""The exact method's shapes take this share of its time limit, the choice for lags the rest
(and what the shapes leave), at most :data:`LAG_SOLVE_SHARE` of it a solve."""
MORE_DEPTHS = (2, 3, None)
"""The depths of the trees priced by slack between the lag choice's solves."""
LAG_SOLVE_SHARE = 0.075
"""The most of the exact method's time limit one solve of the choice for lags may take."""


def repack(
    problem: Problem,
    lives: Sequence[frozenset[int]],
    built: Built,
    bound: float,
    time_left_s: float | None,
) -> Built:
    """``built`` (the greedy's plan), or the fastest tree packing on one of the live choices
    ``lives`` (target node indices) when ``built`` is more than :data:`PACK_GAP` above
    ``bound`` (until one is within it): its stripes may take any tree of routes, where the
    greedy forwards whole nodes in one order. The shapes :data:`GREEDY_SHAPES`, at most
    :data:`PACK_ROUNDS` / TP rounds each (10 at least), all within ``time_left_s`` (None: no
    clock, so equal input gives an identical plan)."""
    began = time.perf_counter()
    best = built
    for live in dict.fromkeys(lives):  # distinct, in order
        left = None if time_left_s is None else time_left_s - (time.perf_counter() - began)
        if _value(best) <= bound * (1 + PACK_GAP) or (left is not None and left <= 0):
            break
        rounds = max(10, PACK_ROUNDS // problem.tp)
        packed = pack_trees(
            problem,
            live,
            time_limit_s=left,
            max_rounds=rounds,
            shapes=GREEDY_SHAPES,
            enough_s=bound * (1 + PACK_GAP),
            beat_s=_value(built),
        )
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
    shapes: Sequence[Shape] = ((None, 1),),
    enough_s: float = 0.0,
    beat_s: float = math.inf,
    twins: list[Built] | None = None,
    deferred: list[Callable[[tuple[float, float] | None], Built | None]] | None = None,
) -> Built | None:
    """The plan of the best tree packing found in ``max_rounds`` pricing rounds per shape (and
    within ``time_limit_s``, each shape an equal share of the time left; None: no clock, so
    equal input gives an identical plan), the target nodes ``live`` holding the live
    instances; None when some instance GPU cannot be reached that way or those nodes cannot
    hold ``live`` instances. ``widths``: the tree counts per rank the final plans keep
    (:func:`_subsets`; None, the exact method: every count, ranked two ways, the best three
    re-shared by lag (:func:`~blitzplan.multicast.exact.lag_packing.lag_shared`), then
    rebalanced by :func:`_balanced` and re-shared, every plan with fast forwarding lanes; then
    the trees of every shape chosen again for their lags by
    :func:`~blitzplan.multicast.exact.lag_packing.lag_repack`, the shapes taking
    :data:`SHAPES_SHARE` of the time limit and it at most the rest). With a time limit, counts
    past it are skipped (the first and the last still tried), and shapes after the first once
    it is spent (the best packing is still re-shared); and once a plan is ready by
    ``enough_s``, or none so far beats ``beat_s``, the shapes after it. The exact method makes
    the same in two steps, every shape's trees priced before any plan is made
    (:func:`price_trees`, :func:`packings`). ``twins``: the plan to cut into time slices
    joins it (:func:`~blitzplan.multicast.exact.slice_twin.twin`). ``deferred``: the choice
    for lags is not run but handed back, to run when the caller wants it (its clock: the end
    and the most one solve may take; its plan, None when it does not beat the packing), so
    the caller can first time the twin's slicings, which usually leave the packing in one
    phase behind (the exact method's
    :data:`~blitzplan.multicast.exact.exact_search.LAG_UNLESS`)."""
    if not _packable(problem, live):
        return None
    began = time.perf_counter()
    overlay = Overlay(problem, live)
    graphs = [RankGraph(overlay, r) for r in range(problem.tp)]
    best: Packed | None = None
    pool: dict[tuple[int, tuple[int, ...]], Tree] = {}
    limit = time_limit_s
    if limit is not None and widths is None:
        limit *= SHAPES_SHARE
    for k, shape in enumerate(shapes):
        share = None
        if limit is not None:
            share = (began + limit - time.perf_counter()) / (len(shapes) - k)
            if k and share <= 0:
                break
        packed = _pack(problem, overlay, graphs, live, shape, (share, max_rounds, widths), pool)
        if packed is not None and (best is None or packed[0] < best[0]):
            best = packed
        if best is None or not enough_s < best[0] < beat_s:
            break
    made = None if best is None else twin(problem, overlay, list(pool.values()), best, live)
    if twins is not None and made is not None:
        twins.append(made)
    if widths is None and best is not None:  # the exact method: the trees chosen for their lags
        lagged = _lag_choice(problem, overlay, graphs, list(pool.values()), live, best)
        if deferred is not None:
            deferred.append(lagged)
        else:
            clock = None
            if time_limit_s is not None:
                clock = (began + time_limit_s, LAG_SOLVE_SHARE * time_limit_s)
            best_plan = lagged(clock)
            if best_plan is not None:
                return best_plan
    return None if best is None else best[3]


def _packable(problem: Problem, live: frozenset[int]) -> bool:
    """Whether a packing can serve ``problem`` with the live instances on the target nodes
    ``live`` (nothing delivered or present yet, and enough instances there)."""
    if problem.delivered or any(t.present for t in problem.targets):
        return False
    return sum(1 for i in problem.instances if i.node in live) >= problem.live


def _lag_choice(
    problem: Problem,
    overlay: Overlay,
    graphs: list[RankGraph],
    trees: list[Tree],
    live: frozenset[int],
    found: Packed,
) -> Callable[[tuple[float, float] | None], Built | None]:
    """The choice of ``trees`` (and more priced by slack) for their lags
    (:func:`~blitzplan.multicast.exact.lag_packing.lag_repack`), to run with a clock (its end
    and the most one solve may take; None: none); its plan, None unless it beats ``found``."""

    def lagged(clock: tuple[float, float] | None) -> Built | None:
        def more(price: np.ndarray) -> list[Tree]:
            found = (cheapest_tree(overlay, g, price, d) for g in graphs for d in MORE_DEPTHS)
            return [t for t in found if t is not None]

        again = lag_repack(problem, overlay, trees, live, found[0], clock, more)
        return None if again is None or again[0] >= found[0] else again[3]

    return lagged


def _pack(
    problem: Problem,
    overlay: Overlay,
    graphs: list[RankGraph],
    live: frozenset[int],
    shape: Shape,
    limits: tuple[float | None, int, Sequence[int] | None],
    pool: dict[tuple[int, tuple[int, ...]], Tree],
) -> Packed | None:
    """The best packing of one shape's column generation (:func:`pack_trees`); its trees join
    ``pool`` (by rank and arcs)."""
    time_limit_s, max_rounds, widths = limits
    began = time.perf_counter()
    priced = _columns(problem, overlay, graphs, shape, time_limit_s, max_rounds)
    if priced is None:
        return None
    trees, rates = priced
    pool.update(((t.rank, t.arcs), t) for t in trees)
    deadline = None if time_limit_s is None else began + time_limit_s
    return shape_plans(problem, overlay, trees, rates, live, widths, deadline)


def _columns(
    problem: Problem,
    overlay: Overlay,
    graphs: list[RankGraph],
    shape: Shape,
    time_limit_s: float | None,
    max_rounds: int,
) -> tuple[list[Tree], np.ndarray] | None:
    """One shape's column generation: its trees and their master rates, after ``max_rounds``
    pricing rounds, none adding a tree, or ``time_limit_s`` (None: no clock); None when a
    rank has no tree of the shape or the master has no solution."""
    depth, per_round = shape
    began = time.perf_counter()
    prices = 1.0 / np.maximum(overlay.capacity, 1e-9)
    trees: list[Tree] = []
    for r in range(problem.tp):
        tree = cheapest_tree(overlay, graphs[r], prices, depth)
        if tree is None:
            return None
        trees.append(tree)
    solution = None
    for _ in range(max_rounds):
        solution = master(overlay, trees, problem.tp)
        if solution is None:
            return None
        _, _, edge_duals, rank_duals = solution
        added = 0
        for r in range(problem.tp):
            price = np.maximum(edge_duals, 0.0) + 1e-6 * prices
            for _ in range(per_round):
                tree = cheapest_tree(overlay, graphs[r], price, depth)
                if tree is None:
                    break
                cost = sum(edge_duals[e] * n for e, n in tree.load.items())
                if cost >= rank_duals[r] * (1 - 1e-7) or tree in trees:
                    break
                trees.append(tree)
                added += 1
                bump = rank_duals[r] / max(1, len(tree.load))
                for e in tree.load:  # the next tree of this round avoids this one's links
                    price[e] += bump
        if not added or (time_limit_s is not None and time.perf_counter() - began > time_limit_s):
            break
    if solution is None or len(solution[1]) < len(trees):  # columns added since: solve again
        solution = master(overlay, trees, problem.tp)
    return None if solution is None else (trees, solution[1])


@dataclass(frozen=True)
class Priced:
    """Every shape's trees on one live choice, priced before any plan is made of them
    (:func:`price_trees`): the twin is cut from them at once (:func:`priced_twin`), the
    packings' plans later (:func:`packings`)."""

    overlay: Overlay
    graphs: list[RankGraph]
    live: frozenset[int]
    columns: list[tuple[list[Tree], np.ndarray]]
    """Per shape priced, in order: its trees and their master rates."""
    pool: list[Tree]
    """Every shape's trees, once each (by rank and arcs)."""


def price_trees(
    problem: Problem, live: frozenset[int], *, shapes: Sequence[Shape], time_limit_s: float | None
) -> Priced | None:
    """The column generation of every shape of ``shapes`` on the live choice ``live`` (each an
    equal share of the time left of ``time_limit_s``; None: no clock), no plan made yet; None
    when :func:`pack_trees` would have none (its first shape has no tree, or the live nodes
    cannot hold the live instances)."""
    if not _packable(problem, live):
        return None
    began = time.perf_counter()
    overlay = Overlay(problem, live)
    graphs = [RankGraph(overlay, r) for r in range(problem.tp)]
    columns: list[tuple[list[Tree], np.ndarray]] = []
    pool: dict[tuple[int, tuple[int, ...]], Tree] = {}
    for k, shape in enumerate(shapes):
        share = None
        if time_limit_s is not None:
            share = (began + time_limit_s - time.perf_counter()) / (len(shapes) - k)
            if k and share <= 0:
                break
        found = _columns(problem, overlay, graphs, shape, share, MAX_ROUNDS)
        if found is None and not k:
            return None
        if found is not None:
            columns.append(found)
            pool.update(((t.rank, t.arcs), t) for t in found[0])
    return Priced(overlay, graphs, live, columns, list(pool.values()))


def priced_twin(problem: Problem, priced: Priced) -> Built | None:
    """The plan to cut into time slices from every shape's trees
    (:func:`~blitzplan.multicast.exact.slice_twin.twin`, before any packing is made)."""
    return twin(problem, priced.overlay, priced.pool, None, priced.live)


def packings(
    problem: Problem,
    priced: Priced,
    *,
    time_limit_s: float | None,
    beat_s: float = math.inf,
    deferred: list[Callable[[tuple[float, float] | None], Built | None]],
    twins: list[Built] | None = None,
) -> Built | None:
    """The plan of the best packing of the shapes priced (:func:`price_trees`), each shape's
    plans (:func:`~blitzplan.multicast.exact.packing_plans.shape_plans`, every count) an equal
    share of the time left of ``time_limit_s`` (None: no clock), the shapes after one only
    while the best so far beats ``beat_s``; the choice for lags handed back in ``deferred``
    unrun (as :func:`pack_trees` does). ``twins``: the best packing's own trees and rates
    join it when :func:`~blitzplan.multicast.exact.slice_twin.twin_trees` keeps them (a tie
    with the pool's: :func:`priced_twin` had no packing to keep; cases 15 and 70 of the
    benchmark, 1.0002 and 1.0003 of the bound at 256 slices, the pool's 1.0040 and 1.0041)."""
    began = time.perf_counter()
    best: Packed | None = None
    for k, (trees, rates) in enumerate(priced.columns):
        deadline = None
        if time_limit_s is not None:
            now = time.perf_counter()
            deadline = now + (began + time_limit_s - now) / (len(priced.columns) - k)
            if k and deadline <= now:
                break
        packed = shape_plans(problem, priced.overlay, trees, rates, priced.live, None, deadline)
        if packed is not None and (best is None or packed[0] < best[0]):
            best = packed
        if best is None or best[0] >= beat_s:
            break
    if best is None:
        return None
    chosen = twin_trees(priced.overlay, priced.pool, best, problem.tp)
    if twins is not None and chosen is not None and chosen[0] is best[1]:
        twins.append(by_rate(problem, priced.overlay, *chosen, priced.live))
    graphs, pool = priced.graphs, priced.pool
    deferred.append(_lag_choice(problem, priced.overlay, graphs, pool, priced.live, best))
    return best[3]
