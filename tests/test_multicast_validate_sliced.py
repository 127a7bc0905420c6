"""The certificate checker on plans of many phases: its per-GPU runs of arrived stripes, its
rank-holding limits and its level-by-level recurrence agree with the plain rules they replace
(written here as oracles), and it still refuses a sliced plan broken in a late phase."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from fractions import Fraction

import numpy as np

from blitzplan.multicast import validate_multicast
from blitzplan.multicast.exact.phase_slices import slice_phases
from blitzplan.multicast.plan_types import ALL_RANKS, MulticastPlan, NodeKind
from blitzplan.multicast.planners.baselines import BASELINES
from blitzplan.multicast.validation.holdings_check import (
    _chains,
    _covered,
    _held_by_rank,
    _held_by_ranks,
)
from blitzplan.multicast.validation.lane_table import lane_table
from blitzplan.multicast.validation.lane_waits import lane_waits
from blitzplan.multicast.validation.route_check import check_phases
from blitzplan.multicast.validation.timeline_check import _Arrivals
from tests.multicast_random import tiny_problem
from tests.test_multicast import tiny_cases
from tests.test_multicast_overlay import _plan
from tests.test_multicast_phase_slices import chain_case

_COORD = 1e-9


def _sweep(pieces: list[tuple[float, float]], lo: float, hi: float) -> float:
    """The rule as first written: from ``lo``, over the overlapping stripes in order, each
    starting at most ``_COORD`` past what is covered extends it."""
    covered = lo
    for a, b in sorted(p for p in pieces if p[1] > lo and p[0] < hi):
        if a <= covered + _COORD:
            covered = max(covered, b)
    return covered


def test_runs_of_arrived_stripes_reach_as_far_as_the_sweep() -> None:
    """Property: for seeded random stripe sets on a grid of eighths (ends nudged by 0, half or
    twice ``_COORD``, so runs touch, nearly touch and just miss), whether a lane ``[lo, hi)``
    is covered is the same by the runs and by the sweep over every stripe, for every lane on the
    grid."""
    rng = random.Random(7)
    nudges = (0.0, _COORD / 2, -_COORD / 2, 2 * _COORD, -2 * _COORD)
    grid = [k / 8 for k in range(9)]
    for _ in range(300):
        pieces = []
        for _ in range(rng.randint(0, 6)):
            a, b = sorted(rng.sample(grid, 2))
            pieces.append((max(0.0, a + rng.choice(nudges)), b + rng.choice(nudges)))
        chains = _chains(pieces)
        for lo, hi in itertools.combinations(grid, 2):
            for nudge in nudges:
                start = max(0.0, lo + nudge)
                by_sweep = _sweep(pieces, start, hi) >= hi - _COORD
                by_runs = bool(_covered(chains, np.array([start]))[0] >= hi - _COORD)
                assert by_runs == by_sweep, (pieces, start, hi)


def _held_exactly(q: int, a: int, r: int, b: int, lo: float, hi: float) -> bool:
    start = (Fraction(r) + Fraction(lo)) / b
    end = (Fraction(r) + Fraction(hi)) / b
    return Fraction(q, a) - Fraction(_COORD) <= start and end <= Fraction(q + 1, a) + Fraction(
        _COORD
    )


def test_rank_holdings_agree_with_exact_fractions_at_the_limits() -> None:
    """Property: for every source and target degree up to 8 and every pair of ranks, stripes
    whose ends sit on a limit's nearest float, one float either side of it, or at random give
    the same answer as the exact fractions, one stripe at a time and all at once."""
    rng = random.Random(3)
    for a, b in itertools.product((1, 2, 4, 8), repeat=2):
        for q, r in itertools.product(range(a), range(b)):
            low = float(b * (Fraction(q, a) - Fraction(_COORD)) - r)
            high = float(b * (Fraction(q + 1, a) + Fraction(_COORD)) - r)
            ends = [rng.random() for _ in range(4)]
            for x in (low, high):
                ends += [x, math.nextafter(x, -math.inf), math.nextafter(x, math.inf)]
            ends = [x for x in ends if 0.0 <= x <= 1.0]
            pairs = list(itertools.product(ends, repeat=2))
            for lo, hi in pairs:
                assert _held_by_rank(q, a, r, b, lo, hi) == _held_exactly(q, a, r, b, lo, hi)
            los, his = np.array(pairs, float).reshape(len(pairs), 2).T
            at_once = _held_by_ranks(q, a, r, b, los, his).tolist()
            assert at_once == [_held_exactly(q, a, r, b, lo, hi) for lo, hi in pairs]


def _plain_feeds(plan: MulticastPlan) -> list[list[int]]:
    """Which lanes feed each lane, by the rule as first written (every pair compared): none
    for a source's lane, every lane into the sender for a store-and-forward hop's, else the
    lanes landing on the holder, of its rank or of all ranks, overlapping its stripe."""
    lanes = sorted(plan.lanes, key=lambda x: x.flow)
    hop_of = {lane.flow: h for h, hop in enumerate(plan.hops) for lane in hop.lanes}
    sources = (NodeKind.INSTANCE, NodeKind.HOST, NodeKind.CACHE)
    feeds = []
    for lane in lanes:
        h = hop_of.get(lane.flow)
        if plan.nodes[lane.sender].kind in sources:
            feeds.append([])
        elif h is not None and not plan.hops[h].pipelined:
            feeds.append([x.flow for x in lanes if x.receiver == lane.sender])
        else:
            feeds.append(
                [
                    x.flow
                    for x in lanes
                    if x.flow != lane.flow
                    and (x.receiver, x.dst) == (lane.sender, lane.holder)
                    and (x.rank == lane.rank or ALL_RANKS in (x.rank, lane.rank))
                    and min(x.hi, lane.hi) - max(x.lo, lane.lo) > _COORD
                ]
            )
    return feeds


def _loop_arrivals(state, plan: MulticastPlan) -> dict[int, list[float]]:
    """The recurrence as a plain loop, lane by lane, each once every lane it waits for is
    done (the oracle)."""
    units = len(plan.unit_bytes)
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    lanes = sorted(plan.lanes, key=lambda x: x.flow)
    hop_of = {lane.flow: h for h, hop in enumerate(plan.hops) for lane in hop.lanes}
    startup: dict[int, float] = {}
    for inst in plan.instances:
        startup[inst.node] = max(startup.get(inst.node, 0.0), inst.startup_s)
    feeds = _plain_feeds(plan)
    arrive: dict[int, list[float]] = {}
    first: dict[int, float] = {}
    todo = list(range(len(lanes)))
    while todo:
        waiting = []
        for f in todo:
            h = hop_of.get(f)
            waited = (
                []
                if h is None
                else [x.flow for a in plan.hops[h].after for x in plan.hops[a].lanes]
            )
            if any(x not in arrive for x in (*waited, *feeds[f])):
                waiting.append(f)
                continue
            lane, receiver = lanes[f], plan.nodes[lanes[f].receiver]
            scale = tp if lane.rank == ALL_RANKS else 1
            latency = sum(state.topology.latency_s(e) for e in plan.flows[f].edges)
            rate = plan.rates[f]
            begin = max([startup.get(lane.receiver, 0.0), *(max(arrive[x]) for x in waited)])
            if feeds[f] and h is not None and not plan.hops[h].pipelined:
                done = max(max(arrive[x]) for x in feeds[f])
                avail, begin = [done] * units, max(begin, done)
            elif feeds[f]:
                avail = [max(arrive[x][u] for x in feeds[f]) for u in range(units)]
                begin = max(begin, max(first[x] for x in feeds[f]))
            else:
                avail = [0.0] * units
                begin = max(begin, 0.0)
            t, times, lead = begin, [], None
            for u in range(units):
                size = 0.0 if receiver.has(u) else lane.fraction * scale * plan.unit_bytes[u]
                if size <= 0:
                    times.append(0.0)
                    continue
                chunk = min(plan.chunk_bytes, size) / rate
                t = max(avail[u] + chunk + latency, t + size / rate)
                times.append(t)
                lead = chunk if lead is None else lead
            arrive[f] = times
            first[f] = begin + (lead or 0.0) + latency
        assert len(waiting) < len(todo), "a cycle"
        todo = waiting
    return arrive


def _sliced_chain() -> tuple[object, MulticastPlan]:
    state, problem = chain_case()
    chain = BASELINES["ring"](problem)
    return state, _plan(problem, slice_phases(problem, chain, 64), math.inf)


def _plans() -> list[tuple[object, MulticastPlan]]:
    """A 64-phase chain and the tiny cases' plans of every method (store and forward ones
    included)."""
    plans = [_sliced_chain()]
    for state, spec, options in tiny_cases()[:6]:
        problem = tiny_problem(state, spec, **options)
        for method in ("ring", "binomial", "one_by_one"):
            plans.append((state, _plan(problem, BASELINES[method](problem), math.inf)))
    return plans


def test_the_waits_are_the_plain_rules_and_every_level_follows_its_waits() -> None:
    """The lanes feeding each lane (the columns' search of lanes landing on its holder, or
    every lane into a store-and-forward sender) are those of the rule comparing every pair;
    every lane's level is past those of its feeds and of the lanes of the hops its hop waits
    for; and two hops waiting for each other give no levels."""
    for _, plan in _plans():
        table = lane_table(plan)
        waits = lane_waits(plan, table)
        assert waits is not None
        plain = _plain_feeds(plan)
        hop_of = {lane.flow: h for h, hop in enumerate(plan.hops) for lane in hop.lanes}
        for f in range(len(table.lanes)):
            s = int(table.sender[f])
            ours = (
                waits.into[waits.into_ptr[s] : waits.into_ptr[s + 1]]
                if waits.stored[f]
                else waits.feeds[waits.ptr[f] : waits.ptr[f + 1]]
            )
            assert ours.tolist() == plain[f], (plan.method, f)
            h = hop_of.get(f)
            waited = (
                []
                if h is None
                else [x.flow for a in plan.hops[h].after for x in plan.hops[a].lanes]
            )
            assert all(waits.level[x] < waits.level[f] for x in (*plain[f], *waited))
    _, plan = _sliced_chain()
    hops = list(plan.hops)
    hops[0] = dataclasses.replace(hops[0], after=(*hops[0].after, len(hops) - 1))
    hops[-1] = dataclasses.replace(hops[-1], after=(*hops[-1].after, 0))
    cycle = dataclasses.replace(plan, hops=tuple(hops))
    assert lane_waits(cycle, lane_table(cycle)) is None


def test_level_by_level_arrivals_equal_the_plain_loop() -> None:
    """The closed form, level by level, gives every lane's arrivals of the loop to 1e-12 (far
    inside the checker's 1e-6), on a 64-phase chain and on the tiny cases' plans of every
    method (store and forward ones included)."""
    for state, plan in _plans():
        table = lane_table(plan)
        waits = lane_waits(plan, table)
        assert waits is not None
        ours = _Arrivals(state, plan, table, waits).run()
        loop = _loop_arrivals(state, plan)
        for f in range(len(table.lanes)):
            for x, y in zip(ours[f], loop[f], strict=True):
                assert abs(x - y) <= 1e-12 * max(1.0, abs(y)), (plan.method, f)


def test_a_sliced_plan_broken_in_a_late_phase_is_refused() -> None:
    """On the 64-phase chain (h1 forwards to h2): valid as built; refused when a stripe that
    a lane of the last phase forwards reaches h1 only in half, when a late lane's arrival is off by
    1%, when a lane of the last phase is moved into the first (whose span on its links then
    covers every phase between), and when two
    hops wait for each other."""
    state, plan = _sliced_chain()
    assert validate_multicast(state, plan) == ()
    last = max(plan.flow_phase)
    forwarded = [
        (h, hop)
        for h, hop in enumerate(plan.hops)
        if plan.nodes[hop.sender].kind is NodeKind.TARGET and hop.phase == last
    ]
    assert forwarded
    lane = forwarded[0][1].lanes[0]
    # the lane that brought this stripe to the forwarding GPU now brings only its first half
    k, into = next(
        (k, hop)
        for k, hop in enumerate(plan.hops)
        if hop.receiver == lane.sender
        and any(x.dst == lane.holder and x.lo <= lane.lo < x.hi for x in hop.lanes)
    )
    cut = [
        dataclasses.replace(x, hi=(x.lo + x.hi) / 2)
        if x.dst == lane.holder and x.lo <= lane.lo < x.hi
        else x
        for x in into.lanes
    ]
    hops = list(plan.hops)
    hops[k] = dataclasses.replace(into, lanes=tuple(cut))
    problems = validate_multicast(state, dataclasses.replace(plan, hops=tuple(hops)))
    assert any("never receives" in p for p in problems), problems

    f = lane.flow
    arrivals = list(plan.lane_arrival_s)
    arrivals[f] = tuple(t * 1.01 for t in arrivals[f])
    late = dataclasses.replace(plan, lane_arrival_s=tuple(arrivals))
    assert any("arrivals differ" in p for p in validate_multicast(state, late))

    phases = list(plan.flow_phase)
    phases[f] = 0  # phase 0 on its links now spans every phase between
    shared = dataclasses.replace(plan, flow_phase=tuple(phases))
    assert any("at the same time" in p for p in check_phases(shared))

    hops = list(plan.hops)
    hops[0] = dataclasses.replace(hops[0], after=(*hops[0].after, len(hops) - 1))
    hops[-1] = dataclasses.replace(hops[-1], after=(*hops[-1].after, 0))
    cycle = dataclasses.replace(plan, hops=tuple(hops))
    assert any("cycle" in p for p in validate_multicast(state, cycle))
