"""The tree packing's shallow trees: the pricing with a depth limit is exact within its limit,
and the packings of every shape are valid plans the bounds hold against."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from blitzplan.multicast import validate_multicast
from blitzplan.multicast.bound.overlay_lp import overlay_bound
from blitzplan.multicast.exact.lag_packing import depth as _depth
from blitzplan.multicast.exact.lag_packing import lag_shared as _lag_shared
from blitzplan.multicast.exact.overlay_arcs import Overlay, master, packing_plan, tree_spans
from blitzplan.multicast.exact.steiner import RankGraph, Tree, cheapest_tree
from blitzplan.multicast.exact.tree_packing import EXACT_SHAPES, pack_trees
from tests.multicast_random import tiny_problem
from tests.test_multicast import tiny_cases
from tests.test_multicast_overlay import _plan


def _price(tree: Tree, price: np.ndarray) -> float:
    return sum(price[e] * n for e, n in tree.load.items())


def _reaches_all(overlay: Overlay, graph: RankGraph, tree: Tree) -> bool:
    """Every instance GPU of the rank is an arc's end, and every arc starts at a holder of the
    whole rank or at an arc's end (a tree from the holders)."""
    ends = {overlay.arcs[a].dst for a in tree.arcs}
    wanted = {g for g, r in overlay.receivers.items() if r == graph.rank}
    starts = {overlay.senders[overlay.arcs[a].sender] for a in tree.arcs}
    rooted = all(s.node is None or s.name in ends for s in starts)
    return wanted <= ends and rooted


@pytest.mark.parametrize("index", range(len(tiny_cases())))
def test_shallow_pricing_is_exact_within_its_depth(index: int) -> None:
    """On random prices, the cheapest tree of at most ``d`` arcs per byte reaches every
    instance GPU of its rank, is no deeper than ``d``, costs no less than the cheapest tree
    of any depth (Dreyfus-Wagner on shortest paths, exact) and no more as ``d`` grows, and
    costs the same once ``d`` allows every node in a chain."""
    state, spec, options = tiny_cases()[index]
    problem = tiny_problem(state, spec, **options)
    overlay = Overlay(problem, frozenset())
    rng = np.random.default_rng(index)
    for rank in range(problem.tp):
        graph = RankGraph(overlay, rank)
        if not graph.complete:
            continue
        for _ in range(3):
            price = rng.uniform(0.1, 1.0, len(overlay.edges))
            free = cheapest_tree(overlay, graph, price)
            assert free is not None
            costs = []
            for depth in range(1, 5):
                tree = cheapest_tree(overlay, graph, price, depth)
                if tree is None:
                    costs.append(np.inf)
                    continue
                assert _reaches_all(overlay, graph, tree)
                assert _depth(overlay, tree) <= depth
                costs.append(_price(tree, price))
                assert costs[-1] >= _price(free, price) * (1 - 1e-9)
            assert all(b <= a * (1 + 1e-9) for a, b in itertools.pairwise(costs))
            deep = cheapest_tree(overlay, graph, price, graph.n)
            assert deep is not None
            assert _price(deep, price) == pytest.approx(_price(free, price), rel=1e-9)


@pytest.mark.parametrize("index", range(0, len(tiny_cases()), 3))
def test_every_shape_packs_a_valid_plan_the_bound_holds_against(index: int) -> None:
    """Each shape's packing alone validates and does not beat the overlay bound; with
    several shapes the packing is the fastest of them (no clock: the same trees)."""
    state, spec, options = tiny_cases()[index]
    problem = tiny_problem(state, spec, **options)
    strong = overlay_bound(problem)
    assert strong is not None
    values = []
    for shape in EXACT_SHAPES:
        packed = pack_trees(problem, strong.live_nodes, max_rounds=40, shapes=(shape,))
        if packed is None:
            continue
        plan = _plan(problem, packed, strong.bound_s)
        assert validate_multicast(state, plan) == ()
        assert plan.objective_s >= strong.bound_s * (1 - 1e-9)
        values.append(plan.objective_s)
    assert values
    every = pack_trees(problem, strong.live_nodes, max_rounds=40, shapes=EXACT_SHAPES)
    assert every is not None
    assert max(every.ready_at_s.values()) == pytest.approx(min(values), rel=1e-12)


def test_depth_one_trees_send_straight_from_the_holders() -> None:
    """A tree of one arc per byte feeds every instance GPU from a holder: no lane of its plan
    forwards (each lane's holder is a source's GPU or memory)."""
    packed_any = 0
    for state, spec, options in tiny_cases()[::2]:
        problem = tiny_problem(state, spec, **options)
        strong = overlay_bound(problem)
        assert strong is not None
        packed = pack_trees(problem, strong.live_nodes, max_rounds=20, shapes=((1, 2),))
        if packed is None:  # some GPU reachable only through a relay
            continue
        packed_any += 1
        held = {g for s in problem.sources for g in (*s.gpus, s.memory) if g}
        assert all(lane.holder in held for lane in packed.builder.lanes)
    assert packed_any


def _some_trees(problem, overlay: Overlay, count: int, seed: int) -> list[Tree]:
    """Up to ``count`` distinct cheapest trees per rank under random prices (deep and shallow)."""
    rng = np.random.default_rng(seed)
    trees: list[Tree] = []
    for rank in range(problem.tp):
        graph = RankGraph(overlay, rank)
        for k in range(count):
            price = rng.uniform(0.1, 1.0, len(overlay.edges))
            tree = cheapest_tree(overlay, graph, price, None if k % 2 else 2)
            if tree is not None and tree not in trees:
                trees.append(tree)
    return trees


def test_tree_spans_cut_each_rank_by_rate_or_by_share() -> None:
    """Each rank's trees cover ``[0, 1)`` with consecutive intervals in tree order, sized by
    rate without shares and by share with them; a tree of no rate or no share gets none."""
    tp = 2
    trees = [Tree(r, (), {}) for r in range(tp) for _ in range(3)]
    rates = np.array([3.0, 1.0, 0.0] * tp)
    cases = (
        (None, [0.75, 0.25, None]),
        (np.array([1.0, 3.0, 5.0] * tp), [0.25, 0.75, None]),
        (np.array([1.0, 0.0, 5.0] * tp), [1.0, None, None]),
    )
    for shares, sizes in cases:
        spans = tree_spans(trees, rates, tp, shares)
        for r in range(tp):
            mine = [spans.get(3 * r + k) for k in range(3)]
            got = [None if s is None else s[1] - s[0] for s in mine]
            assert got == [None if x is None else pytest.approx(x) for x in sizes]
            kept = [s for s in mine if s is not None]
            assert kept[0][0] == 0.0 and kept[-1][1] == 1.0
            assert all(a[1] == b[0] for a, b in itertools.pairwise(kept))


def packed_tiny(index: int):
    """Tiny case ``index`` with its overlay bound, overlay, up to four trees per rank and their
    master program's rates: (state, problem, bound, overlay, trees, solved); ``solved`` None
    when those trees pack nothing."""
    state, spec, options = tiny_cases()[index]
    problem = tiny_problem(state, spec, **options)
    strong = overlay_bound(problem)
    assert strong is not None
    overlay = Overlay(problem, strong.live_nodes)
    trees = _some_trees(problem, overlay, 4, index)
    return state, problem, strong, overlay, trees, master(overlay, trees, problem.tp)


@pytest.mark.parametrize("index", range(0, len(tiny_cases()), 2))
def test_lag_shares_never_lose_and_stay_valid(index: int) -> None:
    """Re-sharing a packing's stripes by lag keeps its rates: the plan validates, is never
    slower than the packing shared by rate (its first round) and never beats the overlay
    bound."""
    state, problem, strong, overlay, trees, solved = packed_tiny(index)
    if solved is None:
        pytest.skip("no packing of these trees")
    plain = packing_plan(problem, overlay, trees, solved[1], strong.live_nodes)
    value, kept, rates, shared = _lag_shared(problem, overlay, trees, solved[1], strong.live_nodes)
    assert kept is trees and rates is solved[1]
    assert value == max(shared.ready_at_s.values())
    assert value <= max(plain.ready_at_s.values()) * (1 + 1e-12)
    plan = _plan(problem, shared, strong.bound_s)
    assert validate_multicast(state, plan) == ()
    assert plan.objective_s >= strong.bound_s * (1 - 1e-9)


def test_lag_shares_shorten_a_slow_trees_stripe() -> None:
    """On tiny cases whose trees differ in depth, sharing by lag ends the plan earlier than
    sharing by rate (the slower trees' stripes shrink) on at least one."""
    gained = 0
    for index in (15, 16, 17):
        _, problem, strong, overlay, trees, solved = packed_tiny(index)
        assert solved is not None
        plain = packing_plan(problem, overlay, trees, solved[1], strong.live_nodes)
        value = _lag_shared(problem, overlay, trees, solved[1], strong.live_nodes)[0]
        gained += value < max(plain.ready_at_s.values()) * (1 - 1e-6)
    assert gained
