"""Solving the N-capacity relaxation (:mod:`blitzplan.live.bound.relaxation`).

Under ``old_order="free"`` a dynamic program over the sets of batches already on O keeps, per
set, the Pareto front of (O free time, cost) and prunes states that cannot beat the best known
cost (:mod:`blitzplan.live.bound.subsets`); under ``old_order="fifo"`` O's order is fixed
and the program is linear in the batches (each batch goes on O, in release order, or stays on
N). Stopped by the clock, the search still
returns a valid bound: the least any state it left open could reach. Given a
:class:`~blitzplan.live.work_meter.WorkMeter`, the clock is its counted work (the wall clock
only its safety net), so the bound is the same on every run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import numpy as np

from blitzplan.live.bound.fronts import staircase
from blitzplan.live.bound.relaxation import Relaxation, RelaxedPlan, repair
from blitzplan.live.bound.subsets import subset_search
from blitzplan.live.bound.work import work_bound
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import order_value
from blitzplan.live.work_meter import WALL_CLOCK, Clock

__all__ = [
    "GREEDY_MAX_S",
    "SEARCH_SHARE",
    "capacity_bound",
    "relaxation_bound",
    "relaxed_greedy",
    "solve_relaxation",
]

SEARCH_SHARE = 0.8
"""The share of ``relaxation_bound``'s time limit the subset search may use; the rest bounds
the states it left open."""

GREEDY_MAX_S = 0.05
"""The most time the greedy start of ``relaxation_bound`` gets (a quarter of a shorter limit)."""

EVALUATE_S_PER_BATCH = 7e-7
"""An evaluation of the local search's counted seconds per batch of the instance."""

SETUP_S_PER_CELL = 2.5e-6
"""The counted seconds per layer and batch of what ``relaxation_bound`` does before its search
(the options, the first relaxed plan and its repair)."""

_State = tuple[float, float, tuple[int, ...]]
"""(O free time, cost so far, batches on O in order)."""


def relaxed_greedy(
    instance: LiveScalingInstance,
    *,
    objective: str = "mean_latency",
    old_order: str = "free",
    time_limit_s: float = 0.05,
) -> RelaxedPlan:
    """A good relaxed plan: earliest completion first on O, then swaps and moves while they help."""
    relax = Relaxation(instance, objective)
    if old_order == "fifo":
        return relax.plan(_fifo_best(relax)[1])
    return relax.plan(_local_search(relax, time.perf_counter() + time_limit_s))


def _local_search(relax: Relaxation, deadline_s: float, clock: Clock = WALL_CLOCK) -> list[int]:
    """Swaps and moves while they help, until ``deadline_s`` on ``clock`` (every evaluation
    counts :data:`EVALUATE_S_PER_BATCH` a batch)."""
    sequence = _earliest_completion_first(relax)
    best = relax.evaluate(sequence)
    improved, n = True, relax.instance.num_batches
    while improved:
        improved = False
        for candidate in _neighbours(sequence, n):
            if clock.passed(deadline_s):
                return sequence
            clock.spend(EVALUATE_S_PER_BATCH * n)
            value = relax.evaluate(candidate)
            if value < best - 1e-12:
                sequence, best, improved = candidate, value, True
                break
    return sequence


def _earliest_completion_first(relax: Relaxation) -> list[int]:
    free, rest, sequence = relax.instance.old_free_at_s, set(range(relax.instance.num_batches)), []
    while rest:
        placed = {i: relax.options[i].place(free)[0] for i in rest}
        for i in [i for i in rest if relax.on_new[i] <= relax.obj.value(i, placed[i])]:
            rest.discard(i)
        if not rest:
            break
        pick = min(rest, key=lambda i: (placed[i], i))
        sequence.append(pick)
        rest.discard(pick)
        free = placed[pick]
    return sequence


def _neighbours(sequence: list[int], n: int) -> Iterator[list[int]]:
    """Swap two, move one, drop one to N, add one from N at every position (lazily)."""
    for a in range(len(sequence)):
        for b in range(a + 1, len(sequence)):
            swapped = list(sequence)
            swapped[a], swapped[b] = swapped[b], swapped[a]
            yield swapped
        rest = sequence[:a] + sequence[a + 1 :]
        yield rest
        yield from ([*rest[:b], sequence[a], *rest[b:]] for b in range(len(rest) + 1) if b != a)
    for i in sorted(set(range(n)) - set(sequence)):
        yield from ([*sequence[:b], i, *sequence[b:]] for b in range(len(sequence) + 1))


def _fifo_best(relax: Relaxation) -> tuple[float, list[int]]:
    """Exact under a fixed O order: each batch goes on O (in release order) or stays on N.
    Returns (cost, O sequence); an infinite cost when no choice is left to some batch."""
    front: list[_State] = [(relax.instance.old_free_at_s, relax.obj.empty, ())]
    for i in relax.instance.fifo_order:
        grown = []
        for free, cost, seq in front:
            if relax.on_new[i] < math.inf:
                grown.append((free, relax.obj.combine(cost, relax.on_new[i]), seq))
            end = relax.options[i].place(free)[0]
            if end < math.inf:
                grown.append((end, relax.obj.combine(cost, relax.obj.value(i, end)), (*seq, i)))
        front = _pareto(grown)
        if not front:
            return math.inf, []
    cost, _, seq = min((s[1], s[0], s[2]) for s in front)
    return cost, list(seq)


def _pareto(states: list[_State]) -> list[_State]:
    states.sort(key=lambda s: (s[0], s[1]))
    keep = staircase(np.asarray([s[1] for s in states], dtype=float))
    return [state for state, kept in zip(states, keep, strict=True) if kept]


def solve_relaxation(
    relax: Relaxation,
    *,
    old_order: str,
    upper_cost: float = math.inf,
    search_until_s: float = math.inf,
    deadline_s: float = math.inf,
    greedy_s: float = 0.0,
    candidates: tuple[tuple[int, ...], ...] = (),
    clock: Clock = WALL_CLOCK,
) -> tuple[float, tuple[int, ...] | None, bool]:
    """(bound, best O sequence found, finished) of the relaxation, in cost units.

    Under a free order the search starts from the best of the earliest-completion-first
    sequence, the ``candidates`` and (given ``greedy_s`` seconds) a local search from it; states
    that cannot beat that or ``upper_cost`` (the cost of a known schedule) are pruned, so the
    bound is at least ``min(optimum, upper_cost)``. The sequence is None only when no relaxed
    plan exists (a restriction leaves some batch nowhere to go). The subset search stops at
    ``search_until_s`` and bounds its open states until ``deadline_s`` (both instants on
    ``clock``: ``time.perf_counter()`` values, or counted seconds on a meter).
    """
    if old_order == "fifo":
        cost, seq = _fifo_best(relax)
        return cost, tuple(seq) if math.isfinite(cost) else None, True
    seeds = [tuple(_earliest_completion_first(relax)), *candidates]
    if greedy_s > 0:
        until = min(clock.now_s() + greedy_s, search_until_s)
        seeds.append(tuple(_local_search(relax, until, clock)))
    best = min(seeds, key=relax.evaluate)
    seeded = relax.evaluate(best)
    cost, found, complete = subset_search(
        relax, min(seeded, upper_cost), search_until_s, deadline_s, clock=clock
    )
    if found is None and math.isfinite(seeded):
        found = best
    return cost, found, complete


def relaxation_bound(
    instance: LiveScalingInstance,
    *,
    objective: str = "mean_latency",
    old_order: str = "free",
    upper_bound: float = math.inf,
    time_limit_s: float | None = None,
    clock: Clock = WALL_CLOCK,
) -> tuple[float, RelaxedPlan, bool]:
    """(lower bound, best relaxed plan, whether the relaxation was solved to optimality).

    The bound is the larger of the relaxation's and the work relaxation's
    (:mod:`blitzplan.live.bound.work`), which counts N's capacity.

    ``upper_bound`` (the value of any known schedule, in objective units) and the value of the
    first relaxed plan, repaired into a schedule, prune the search; with ``time_limit_s`` the
    search stops early (after ``SEARCH_SHARE`` of it) and the bound is the least over the
    states it had not expanded (still valid, weaker). The call returns within about
    ``time_limit_s``: the clock is read before every group of states. On a meter ``clock``,
    ``time_limit_s`` is counted seconds (:mod:`~blitzplan.live.work_meter`; its wall clock
    only a safety net): the same input gives the same answer on every run.
    """
    started = clock.now_s()
    clock.spend(SETUP_S_PER_CELL * instance.num_layers * instance.num_batches)
    relax = Relaxation(instance, objective)
    search_until, deadline = _search_instants(started, time_limit_s)
    first = _earliest_completion_first(relax)
    upper = min(upper_bound, _repaired_value(instance, relax.plan(first), objective))
    cost, sequence, complete = solve_relaxation(
        relax,
        old_order=old_order,
        upper_cost=relax.obj.scaled(upper),
        search_until_s=search_until,
        deadline_s=deadline,
        greedy_s=GREEDY_MAX_S if time_limit_s is None else min(GREEDY_MAX_S, time_limit_s / 4),
        clock=clock,
    )
    best = tuple(first) if sequence is None else sequence
    bound = max(relax.obj.final(min(cost, relax.evaluate(best))), work_bound(instance, objective))
    return bound, relax.plan(best), complete


CAPACITY_FIRST_STEP = 0.01
"""The capacity bound's first target lies this far (relatively) above the bound it starts from;
every target after it twice as far as the one before."""


def capacity_bound(
    instance: LiveScalingInstance,
    *,
    objective: str = "mean_latency",
    old_order: str = "free",
    lower_bound: float | None = None,
    upper_bound: float = math.inf,
    time_limit_s: float | None = None,
    first_step: float = CAPACITY_FIRST_STEP,
    on_plan: Callable[[RelaxedPlan], None] | None = None,
    open_floors: bool = True,
) -> float:
    """A lower bound on ``objective`` that also counts what the N-capacity relaxation drops:
    the subset program with the capacity conditions of
    :mod:`blitzplan.live.bound.subsets` (O's order kept under ``"fifo"``).

    The program runs against rising targets from ``lower_bound`` (any valid bound; default the
    N-capacity relaxation's): a search that ends without reaching a target proves the target,
    and one that reaches it has found the program's optimum. ``upper_bound`` (a known
    schedule's value) caps the targets: the answer is at most it. With ``time_limit_s``, a
    search cut short still bounds its open states (weaker, valid). ``first_step``: how far
    (relatively) the first target lies above the bound it starts from (inf: at
    ``upper_bound``, one search). ``on_plan``: given the relaxed plan of the O sequence of the
    program's best state, when a search finds one under its target (the repaired plan is
    then a candidate schedule). Without ``open_floors`` the search gets the whole of
    ``time_limit_s`` and, cut short, bounds its open states by their costs alone: their
    floors cost up to 0.23 CPU s more on (32,16) of ``benchmarks/partition.py`` under a free
    order (the grown states in one part), past a limit of 0.15 s, and gave nothing there.
    """
    started = time.perf_counter()
    relax = Relaxation(instance, objective)
    until, deadline = _search_instants(started, time_limit_s)
    if not open_floors and time_limit_s is not None:
        until, deadline = started + time_limit_s, started  # past: the open states' costs
    if lower_bound is None:
        proven, _, _ = solve_relaxation(relax, old_order=old_order)
    else:
        proven = relax.obj.scaled(lower_bound)
    upper, step = relax.obj.scaled(upper_bound), first_step
    while proven < upper:
        target = min(upper, proven + step * max(abs(proven), 1e-12))
        cost, found, complete = subset_search(
            relax,
            target,
            until,
            deadline,
            capacity=True,
            fifo=old_order == "fifo",
            deadlines=True,
        )
        if found is not None and on_plan is not None:
            on_plan(relax.plan(found))
        if not complete or found is not None:
            return relax.obj.final(max(proven, cost))
        proven, step = target, 2 * step
    return relax.obj.final(min(proven, upper))


def _search_instants(started: float, time_limit_s: float | None) -> tuple[float, float]:
    """Until when the subset search searches and until when it bounds the states it left open:
    :data:`SEARCH_SHARE` of ``time_limit_s`` from ``started``, and all of it."""
    if time_limit_s is None:
        return math.inf, math.inf
    return started + SEARCH_SHARE * time_limit_s, started + time_limit_s


def _repaired_value(instance: LiveScalingInstance, plan: RelaxedPlan, objective: str) -> float:
    """The objective of the schedule :func:`~blitzplan.live.bound.relaxation.repair` makes of
    ``plan``."""
    return order_value(instance, *repair(instance, plan), objective)
