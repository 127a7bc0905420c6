"""The ready times of a sliced plan from its pattern equal those of the full slicing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blitzplan import InfeasibleError, InvalidInputError
from blitzplan.multicast.exact.phase_slices import slice_phases
from blitzplan.multicast.exact.slice_layout import _atom_cuts, slice_layout
from blitzplan.multicast.exact.slice_timing import sliced_ready
from blitzplan.multicast.planners.greedy import build, context, greedy_choice
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built
from tests.multicast_random import random_plan, tiny_problem
from tests.test_multicast import multicast_case, tiny_cases

SLICINGS = ((1, False), (2, False), (3, False), (7, False), (2, True), (3, True), (7, True))


def _compare(problem: Problem, built: Built) -> tuple[int, int]:
    """Every slicing of ``SLICINGS``: the pattern's ready times are the full plan's (or the
    pattern declines); ``(slicings the pattern timed, slicings tried)``."""
    cuts = _atom_cuts(built.builder.lanes, problem.tp)
    answered = 0
    for phases, staggered in SLICINGS:
        found = sliced_ready(problem, built, phases, slice_layout(built, staggered), cuts)
        try:
            sliced = slice_phases(problem, built, phases, staggered=staggered)
        except InvalidInputError:  # the full slicing's waits form a cycle
            assert found is None
            continue
        if found is not None:
            answered += 1
            full = sliced.ready_at_s
            assert found.ready_at_s.keys() == full.keys()
            for name, at in full.items():
                assert found.ready_at_s[name] == pytest.approx(at, rel=1e-9, abs=1e-12)
            _same_plan(
                slice_phases(problem, built, phases, staggered=staggered, timed=found), sliced
            )
    return answered, len(SLICINGS)


def _same_plan(given: Built, full: Built) -> None:
    """The slicing with its pattern's times put in place is the slicing evaluated lane by
    lane: the same lanes, and the same rates, arrivals, starts, feeders and readiness."""
    assert given.builder.lanes == full.builder.lanes
    assert given.builder.flows == full.builder.flows
    a, b = given.timeline, full.timeline
    assert a.rates == pytest.approx(b.rates, rel=1e-12)
    assert np.allclose(a.lane_arrival_s, b.lane_arrival_s, rtol=1e-12, atol=0.0)
    assert a.lane_start_s is not None and b.lane_start_s is not None
    assert np.allclose(a.lane_start_s, b.lane_start_s, rtol=1e-12, atol=0.0)
    assert a.lane_feeds == b.lane_feeds
    assert len(a.hop_arrival_s) == len(b.hop_arrival_s)
    for mine, theirs in zip(a.hop_arrival_s, b.hop_arrival_s, strict=True):
        assert mine == pytest.approx(theirs, rel=1e-12)
    assert a.layer_ready_s.keys() == b.layer_ready_s.keys()
    for name, times in b.layer_ready_s.items():
        assert a.layer_ready_s[name] == pytest.approx(times, rel=1e-12)
    assert given.ready_at_s == pytest.approx(full.ready_at_s, rel=1e-12)


@pytest.mark.parametrize("index", range(len(tiny_cases())))
def test_pattern_times_random_plans_as_the_full_slicing(index: int) -> None:
    """12 random plans per tiny case (any sender, cut, exit, relay and pace), each cut into
    1-7 slices, plain and staggered: the pattern's ready times are the full plan's, and the
    pattern answers most slicings."""
    state, spec, options = tiny_cases()[index]
    problem = tiny_problem(state, spec, **options)
    rng = random.Random(index)
    answered = tried = 0
    for _ in range(12):
        built = random_plan(problem, rng)
        if built is not None:
            a, t = _compare(problem, built)
            answered, tried = answered + a, tried + t
    assert tried > 0
    assert answered >= 0.5 * tried


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multicast_case(max_targets=4), st.integers(0, 2**32 - 1))
def test_property_pattern_times_greedy_and_random_plans_as_the_full_slicing(
    case, seed: int
) -> None:
    """Random clusters (TP 1-2, background flows, both chunk sizes): the greedy's plan and a
    random plan, sliced, time the same from the pattern as in full."""
    state, spec, options = case
    try:
        problem = tiny_problem(state, spec, **options)
        ctx = context(problem)
        plans = [build(problem, ctx, greedy_choice(problem, ctx, "all_ready"))]
    except InfeasibleError:
        return
    extra = random_plan(problem, random.Random(seed))
    for built in (*plans, *([extra] if extra is not None else [])):
        _compare(problem, built)
