"""Exhaustive search over the striped construction's decisions, with a proof only by the bound.

The construction (:mod:`~blitzplan.multicast.planners.greedy`) is decided by a forwarding order
of the target nodes and the set of nodes holding the live instances. This search enumerates every
minimal live cover and every order of the forwarding nodes (interchangeable nodes once), ranks
them by the fluid time ``T*`` of their allocation, and builds and evaluates under the full cost
model every candidate whose ``T*`` is within :data:`FLUID_WINDOW` of the best, each with the
greedy's allocation and with the linear program of :mod:`~blitzplan.multicast.allocation.lp`
over the lanes' real routes, with the greedy's plan as the incumbent.

The plan space itself is larger (any stripe may take any route), so finishing this search proves
nothing by itself: the answer is OPTIMAL only when its objective meets the certified lower bound
(:mod:`~blitzplan.multicast.bound.lower_bound`), which holds for every plan under the model;
otherwise it is FEASIBLE and the plan reports the gap. Exponential in the number of target
nodes; meant for small cases and for measuring the greedy.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from blitzplan.errors import InfeasibleError
from blitzplan.multicast.allocation.allocate import fluid_time
from blitzplan.multicast.bound.lower_bound import Bound
from blitzplan.multicast.bound.overlay_lp import overlay_bound
from blitzplan.multicast.exact.slice_search import SliceSearch
from blitzplan.multicast.exact.tree_packing import (
    EXACT_SHAPES,
    LAG_SOLVE_SHARE,
    SHAPES_SHARE,
    packings,
    price_trees,
    priced_twin,
)
from blitzplan.multicast.planners.greedy import Choice, Context, build, build_lp, forced_cover
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, score

__all__ = [
    "DEFAULT_LIMIT_S",
    "FLUID_WINDOW",
    "MAX_CHOICES",
    "ExactResult",
    "exact_plan",
    "exact_search",
]

FLUID_WINDOW = 0.02
"""Candidates whose fluid time is within this fraction of the best are evaluated in full."""
MAX_CHOICES = 50_000
"""At most this many (order, cover) pairs are enumerated; beyond it the search stops early."""
MAX_EVALUATIONS = 400
"""At most this many candidates are built and evaluated in full (each with both allocations)."""
_EPS = 1e-9
TIMED_BY = 0.7
"""Under a time limit, the slicings of the packing's and the greedy's plans are timed from
their patterns by this share of it (after the packing, before the search)."""
EARLY_BY = 0.15
"""Under a time limit, the greedy's plan's slicings are timed from their patterns by this share
of it before the overlay program and the packing (the answer where those find nothing better:
case 60's greedy plan, 128 and 256 slices by sender, 1.0177 and 1.0090 of the bound, while its
program and packing took 5.8 s of 10 for a packing 1.20x the bound); those left for lack of time
wait for the later calls, the leading plan's first."""
EARLY_ABOVE = 0.2
"""... when it is within this fraction of the certified bound: slicing takes off a plan's
per-hop lag, not a slow route, so a plan further above rarely gets within 1% sliced (the
greedy's plans at 1.08-1.16 of it sliced to 1.004-1.009 on cases 72, 193, 60; at 1.32-2.03
none under 1.2 on 1, 134, 147, 59, 76, where the window went to slicings never kept)."""
SETTLED_ABOVE = 0.08
"""... and when one of those slicings times within this fraction of the certified bound, the
overlay program and the packing get only :data:`SETTLED_SHARE` of the limit each, the
packing's later shapes only while it is within this of the bound: on cases 60, 72 and 193 the
program (2-3.8 s) never raised the bound and the packing (0.9-2.7 s) was 1.7-2.6x it, while
the greedy's own 256 and 512 slicings, 0.4-1.2% above it, waited for that time (s16-h3)."""
SETTLED_SHARE = 0.1
"""... that share (the program's bound is still taken when it comes in time)."""
BANKED_ABOVE = 0.01
"""When a slicing timed before the search is within this fraction of the certified bound (the
method's target), it is built before the search, which gets the time left: the search's plans
rarely beat it (case 134: 2.4 s of search for a plan 1.18x the packing's twin's 512 slices,
1.0078), and its build after the search did not always fit (case 134 at load 7: the twin's 512
timed after the search, its build refused with 1.32 s left, the answer 1.0130 unsliced)."""
LAG_UNLESS = 0.005
"""The packing's trees are chosen again for their one-phase lags
(:func:`~blitzplan.multicast.exact.lag_packing.lag_repack`, 0.3-0.9 s) only unless a plan or
a slicing timed after the packing (its twin's, the greedy's) is already faster than the
packing's plan by this fraction: that choice only speeds the packing in one phase (case 59:
1.0267 -> 1.0218 of the bound; cases 76 and 147: slower than the packing, 1.347 against
1.101, 1.600 against 1.045), while the twin's slicings were 1.03-1.05 at 64 slices there, the
time then needed for their 256 or more."""
LEADER_ABOVE = 0.03
"""When the fastest slicing timed before the search is within this fraction of the certified
bound (but not within :data:`BANKED_ABOVE`), the leading plan's staggered slicings still
waiting (more slices: its excess over its flow halves per doubling) are timed then, by the
slicings' own deadline, before the search: case 76's packing twin at 256 slices, 1.0119, its
512 (1.0060) refused with 2.8 s left after the search (0.15 s) and the search's plan's own
slicings timed instead (1.0104 at 512), when it would fit before them."""
PRICED_SHARE = 1.0
"""The trees of every shape are priced first, in this share of the shapes' time
(:data:`~blitzplan.multicast.exact.tree_packing.SHAPES_SHARE` of the packing's; each shape's
column generation ends when it adds no tree or at its equal share, as it did before its
plans), and the twin cut from them is timed sliced (and its slicing built when within
:data:`BANKED_ABOVE`) before any packing's plans are made in the time the pricing left: case
76's twin (of the 4-deep trees of all five shapes) waited 2.1 CPU s for the five shapes' plans
(subsets, re-sharing, rebalancing), none of which was its answer, and its 352 slices (1.0087)
were then built at 8.3 of its 10 CPU s; its column generation converged in 0.1-0.5 s a shape.
Half the shapes' time (tried first) cut the column generation short where the share is small
(the greedy's slicing settled: 0.085 s a shape), and the twin of those trees sliced worse
(case 70: 1.0042 against 1.0003, 15: 1.0040 against 1.0002)."""
PACKED_BY = 0.75
"""... and the packings' plans and the choice for lags end by this share of the limit, so the
search still gets its time when the slicings took the packing's."""
SEARCHED_BY = 0.85
"""The search ends by this share of the limit, earlier when building the fastest slicing
timed (and timing the search's own plan's) needs the time."""
SLICED_BY = 0.92
"""The slicings are timed and the fastest built by this share of the limit."""


@dataclass(frozen=True)
class ExactResult:
    """The best plan found, the choice that built it, how many choices were enumerated and
    evaluated, and whether the enumeration finished."""

    best: Built
    choice: Choice
    enumerated: int
    evaluated: int
    finished: bool


def _types(problem: Problem, ctx: Context) -> dict[int, object]:
    """Nodes with equal labels are interchangeable in an order."""
    topo = problem.topology
    offset = len(problem.sources)
    labels: dict[int, object] = {}
    for t in ctx.targets:
        node = ctx.nodes[t]
        members = [i for i in problem.instances if i.node + offset == t]
        labels[t] = (
            tuple(sorted(ctx.port.into.get(t, {}).values())),
            tuple(sorted(ctx.port.out.get(t, {}).values())),
            tuple(sorted(ctx.port.leaves_in(t), key=str)),
            len(node.gpus),
            len(node.relays),
            node.present,
            tuple(i.startup_s for i in members),
            frozenset(ctx.port.hosts[t]) & _holder_hosts(problem, ctx),
            topo.gpu_spec(node.gpus[0]).name,
        )
    return labels


def _holder_hosts(problem: Problem, ctx: Context) -> frozenset[str]:
    return frozenset().union(*(ctx.port.hosts[s.id] for s in problem.sources))


def _covers(problem: Problem, ctx: Context) -> list[tuple[int, ...]]:
    if problem.live == 0:
        return [()]
    if problem.live_names:
        return [forced_cover(problem)]
    offset = len(problem.sources)
    count = {t: sum(1 for i in problem.instances if i.node + offset == t) for t in ctx.targets}
    covers = []
    for size in range(1, len(ctx.targets) + 1):
        for cover in itertools.combinations(ctx.targets, size):
            total = sum(count[t] for t in cover)
            if total >= problem.live and all(total - count[t] < problem.live for t in cover):
                covers.append(cover)
    return covers


def _orders(nodes: list[int], labels: dict[int, object]) -> list[tuple[int, ...]]:
    seen: set[tuple[object, ...]] = set()
    out = []
    for order in itertools.permutations(nodes):
        key = tuple(labels[t] for t in order)
        if key not in seen:
            seen.add(key)
            out.append(order)
    return out


def _builds(problem: Problem, ctx: Context, choice: Choice) -> list[Built]:
    """The choice built with the greedy's allocation and with the linear program's."""
    out = []
    with contextlib.suppress(InfeasibleError):
        out.append(build(problem, ctx, choice))
    refined = build_lp(problem, ctx, choice)
    if refined is not None:
        out.append(refined)
    return out


def exact_search(
    problem: Problem,
    ctx: Context,
    objective: str,
    incumbent: tuple[Choice, Built],
    *,
    time_limit_s: float | None,
    evaluation_s: float = 0.0,
) -> ExactResult:
    """Enumerate choices, evaluate the promising ones, keep the best (module docstring). Under
    a time limit an evaluation starts only when it ends in time at the slowest evaluation
    measured in this run (``evaluation_s``, the incumbent's own build and linear program, before
    the first), so a loaded machine stops the search earlier instead of after its limit."""
    deadline = math.inf if time_limit_s is None else time.perf_counter() + time_limit_s
    labels = _types(problem, ctx)
    ranked: list[tuple[float, Choice]] = []
    finished = True
    for cover in _covers(problem, ctx):
        forwarders = [t for t in ctx.targets if t not in cover]
        forwarding = frozenset(forwarders)
        for order in _orders(forwarders, labels):
            if len(ranked) >= MAX_CHOICES or time.perf_counter() > deadline:
                finished = False
                break
            full = tuple(cover) + order if objective == "live_ready" else order + tuple(cover)
            value = fluid_time(problem, ctx.nodes, ctx.port, full, forwarding)
            ranked.append((value, Choice(full, cover)))
    ranked.sort(key=lambda item: item[0])
    best_choice, best = incumbent
    best_value = score(objective, best.ready_at_s, best.live)
    evaluated = 0
    limit = ranked[0][0] * (1 + FLUID_WINDOW) if ranked else math.inf
    for value, choice in ranked:
        if value > limit or time.perf_counter() + evaluation_s > deadline:
            finished = finished and value > limit
            break
        if choice == best_choice:
            continue
        if evaluated >= MAX_EVALUATIONS:
            finished = False
            break
        evaluated += 1
        began = time.perf_counter()
        for built in _builds(problem, ctx, choice):
            trial = score(objective, built.ready_at_s, built.live)
            if trial < best_value * (1 - _EPS):
                best, best_value, best_choice = built, trial, choice
        evaluation_s = max(evaluation_s, time.perf_counter() - began)
    return ExactResult(best, best_choice, len(ranked), evaluated, finished)


def exact_plan(
    problem: Problem,
    ctx: Context,
    objective: str,
    incumbent: tuple[Choice, Built],
    time_limit_s: float | None,
    *,
    bound: Bound,
    evaluation_s: float,
) -> tuple[Built, Bound]:
    """The exact method: under a limit, the greedy's plan's slicings timed first when it is
    near the bound (:data:`EARLY_BY`, :data:`EARLY_ABOVE`); for ``all_ready``, the overlay
    program's bound and the tree packing on its live choice (the greedy's when the program
    found none in its time) in every shape of :data:`EXACT_SHAPES`
    (:mod:`~blitzplan.multicast.exact.tree_packing`): every shape's trees priced first
    (:data:`PRICED_SHARE`), the twin cut from them and the greedy's plan timed sliced (and the
    fastest built when it is within :data:`BANKED_ABOVE` of the bound), then the packings'
    plans made (:data:`PACKED_BY`); then the search of the greedy's decisions from
    ``incumbent`` (the greedy's plan) with the time left; the fastest of the search's, the
    packing's and the greedy's plans and of their cuts into time slices
    (:mod:`~blitzplan.multicast.exact.slice_search`: the twin's and the greedy's timed before
    the search, which then leaves the time to build the fastest; within the limit);
    the best plan and the better of ``bound`` (the certified bound, the caller's) and the
    program's, which also tells the slicings when 512 slices need no trying
    (:data:`~blitzplan.multicast.exact.slice_fit.FINE_ABOVE`). ``evaluation_s``: the time
    one choice took to build and allocate by linear program in this run (the search's first
    prediction, :func:`exact_search`)."""
    began = time.perf_counter()
    limit = DEFAULT_LIMIT_S if time_limit_s is None else max(time_limit_s, 0.1)
    end = None if time_limit_s is None else began + SLICED_BY * limit
    slicing = SliceSearch(problem, objective, bound_s=bound)
    settled = False  # a slicing of the greedy's plan within SETTLED_ABOVE of the bound
    if end is not None and _near(objective, incumbent[1], bound):  # the greedy's slicings first
        early = began + EARLY_BY * limit
        slicing.time([incumbent[1]], early, end - 0.05 * limit, staggered_first=True)
        sliced = min((v for v, *_ in slicing.timed), default=math.inf)
        settled = sliced <= (1 + SETTLED_ABOVE) * bound
    program_s = (SETTLED_SHARE if settled else 0.4) * limit
    strong = overlay_bound(problem, time_limit_s=program_s) if objective == "all_ready" else None
    if strong is not None and strong.bound_s > bound:
        bound = Bound(strong.bound_s, strong.kind)
        slicing.raise_bound(bound)
    priced, twins = None, list[Built]()  # twins: the packing's to slice (stripes by rate)
    spent = time.perf_counter() - began  # at least a share, unless the program took the rest
    share = min(max(0.05 * limit, 0.6 * limit - spent), SEARCHED_BY * limit - spent)
    beat_s = math.inf
    if settled:
        share, beat_s = min(share, SETTLED_SHARE * limit), (1 + SETTLED_ABOVE) * bound
    pricing_at = _now()
    if objective == "all_ready" and share > 0:  # on the program's live choice, else the greedy's
        live = strong.live_nodes if strong is not None else _live_of(problem, incumbent[0])
        priced = price_trees(
            problem, live, shapes=EXACT_SHAPES, time_limit_s=PRICED_SHARE * SHAPES_SHARE * share
        )
        made = None if priced is None else priced_twin(problem, priced)
        twins += [] if made is None else [made]
    priced_s = _now() - pricing_at
    first = [*twins, incumbent[1]]
    timed_by = None if end is None else began + TIMED_BY * limit
    slicing.time(first, timed_by, None if end is None else end - 0.05 * limit)  # search's least
    near = (1 + BANKED_ABOVE) * bound < slicing.target <= (1 + LEADER_ABOVE) * bound
    if end is not None and near:  # the leader's next counts, now (most slices first)
        slicing.time([], end, end, leader_only=True)
    banked = None  # the fastest slicing timed, built before the search when near the bound
    if end is not None and slicing.target <= (1 + BANKED_ABOVE) * bound:
        banked = slicing.best(first, end, untimed=False)
    packed, packed_by = None, began + PACKED_BY * limit
    deferred: list[Callable[[tuple[float, float] | None], Built | None]] = []
    if priced is not None:  # the packings' plans in the shapes' time the pricing left
        plans_s = _left(SHAPES_SHARE * share - priced_s, packed_by)
        plans_at, kept = _now(), list[Built]()  # kept: the packing's trees as the twin
        packed = packings(
            problem, priced, time_limit_s=plans_s, beat_s=beat_s, deferred=deferred, twins=kept
        )
        priced_s += _now() - plans_at  # the packing's time used
        if kept:  # (a call without plans would time the waiting slicings now)
            slicing.time(kept, timed_by, None if end is None else end - 0.05 * limit)
    if deferred and (packed is None or slicing.target * (1 - LAG_UNLESS) >= _value(packed)):
        clock = None  # the choice for lags, in the time the packing left it
        if end is not None:
            clock = (_now() + _left(share - priced_s, packed_by), LAG_SOLVE_SHARE * share)
        again = deferred[0](clock)
        packed = packed if again is None else again
    left = None
    if end is not None:  # the search ends in time to build the fastest slicing and time its own
        per_plan = slicing.pattern_s / max(1, len(slicing.plans))
        stop = min(SEARCHED_BY * limit, SLICED_BY * limit - slicing.needed_s() - per_plan)
        spent = time.perf_counter() - began
        left = min(max(0.05 * limit, stop - spent), SLICED_BY * limit - spent)
    searched = exact_search(
        problem, ctx, objective, incumbent, time_limit_s=left, evaluation_s=evaluation_s
    ).best
    plans = [p for p in (banked, searched, packed, incumbent[1]) if p is not None]
    slicing.time([searched], end)
    return slicing.best(plans, end), bound


def _near(objective: str, plan: Built, bound: float) -> bool:
    """Whether ``plan`` is within :data:`EARLY_ABOVE` of ``bound``."""
    return score(objective, plan.ready_at_s, plan.live) <= (1 + EARLY_ABOVE) * bound


def _left(seconds: float, by: float) -> float:
    """``seconds`` from now, but to ``by`` at most (0 at least)."""
    return max(0.0, min(seconds, by - _now()))


def _value(plan: Built) -> float:
    return score("all_ready", plan.ready_at_s, plan.live)


def _now() -> float:
    return time.perf_counter()


def _live_of(problem: Problem, choice: Choice) -> frozenset[int]:
    """The target node indices of a choice's live nodes."""
    return frozenset(n - len(problem.sources) for n in choice.live_nodes)


DEFAULT_LIMIT_S = 30.0
"""Without a time limit, the overlay program and the tree packing still stop after a share of
this (the search of the greedy's decisions then runs to its end)."""
