"""A slicing's build and pattern under a stand-in clock that jumps past the deadline mid-step
(the load rising after the step was predicted to fit): the step stops at its next checkpoint,
the unfinished build is dropped and the best plan already built is the answer (no wall time
asserted: only which steps ran after the jump)."""

from __future__ import annotations

import types

import pytest

import blitzplan.multicast.exact.phase_slices as phase_slices
import blitzplan.multicast.exact.slice_search as slice_search
import blitzplan.multicast.exact.slice_timing as slice_timing
import blitzplan.multicast.timeline.lane_times as lane_times
from blitzplan.multicast.exact.phase_slices import BuildPace, sliced_until
from blitzplan.multicast.exact.slice_layout import BY_LANE, pattern_ready, plan_shape
from blitzplan.multicast.exact.slice_search import SliceSearch
from blitzplan.multicast.planners.baselines import BASELINES
from tests.clocks import StillClock
from tests.test_multicast_phase_slices import chain_case

SLICES = 512
"""The chain's ring in this many slices: 1,024 lanes, four times the checkpoints' grain."""


def _clocked(monkeypatch) -> StillClock:
    clock = StillClock()
    stand_in = types.SimpleNamespace(perf_counter=clock.perf_counter)
    monkeypatch.setattr(phase_slices, "time", stand_in)
    monkeypatch.setattr(slice_search, "time", stand_in)
    return clock


def _jumping(monkeypatch, module, name: str, clock: StillClock, ran: list[str]) -> None:
    """``module.name`` moves the clock 100 s on (past any deadline here) as it starts."""
    real = getattr(module, name)

    def jumped(*args, **kwargs):
        clock.now += 100.0
        ran.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, jumped)


def _recorded(monkeypatch, module, name: str, ran: list[str]) -> None:
    real = getattr(module, name)

    def recorded(*args, **kwargs):
        ran.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recorded)


@pytest.mark.parametrize(
    ("module", "jumps_in", "not_after"),
    [
        (slice_timing, "hop_arrival", ("instance_ready", "phases_apart", "freeze")),
        (phase_slices, "phases_apart", ("freeze",)),
        (phase_slices, "freeze", ()),
    ],
)
def test_a_timed_build_the_deadline_passes_mid_step_is_dropped_at_its_next_checkpoint(
    monkeypatch, module, jumps_in: str, not_after: tuple[str, ...]
) -> None:
    """The ring's 512 staggered slices, timed from their pattern, built with 10 s left on the
    stand-in clock (its lanes take no time, so every prediction fits); the clock jumps 100 s
    as the times are put in place (the hops' arrivals), as the phases are checked, or as the
    plan's tuples are made: the build stops inside that step (None) and none of the steps
    after it runs. Before, those three ran to their end whatever the clock said (the phases'
    check and the tuples: 0.4-1.1 s of 193's 128 slices unloaded)."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    times = pattern_ready(problem, ring, SLICES, BY_LANE, plan_shape(problem, ring))
    assert times is not None
    clock = _clocked(monkeypatch)
    ran: list[str] = []
    _jumping(monkeypatch, module, jumps_in, clock, ran)
    for name in ("instance_ready", "phases_apart", "freeze"):
        if name != jumps_in:
            owner = slice_timing if name == "instance_ready" else phase_slices
            _recorded(monkeypatch, owner, name, ran)
    deadline = clock.now + 10.0
    assert sliced_until(problem, ring, SLICES, BY_LANE, times, deadline, BuildPace()) is None
    assert ran[ran.index(jumps_in) + 1 :] == []
    assert not set(not_after) & set(ran)


def test_the_same_build_on_time_is_built() -> None:
    """Property: the checkpoints stop nothing on time: the same build without a jump is built,
    its tuples made (the check of the test above is not a build that never finishes)."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    times = pattern_ready(problem, ring, SLICES, BY_LANE, plan_shape(problem, ring))
    built = sliced_until(problem, ring, SLICES, BY_LANE, times, None, BuildPace())
    assert built is not None and built.frozen is not None
    assert len(built.builder.lanes) == 2 * SLICES


def test_an_untimed_evaluation_stops_within_a_grain_of_lanes_once_late(monkeypatch) -> None:
    """The ring's 512 slices built lane by lane (untimed): the clock jumps 100 s as the tenth
    lane's feeders are searched (the step that took 0.7 s of 115's 128 slices before its
    first checkpoint): at most :data:`~blitzplan.multicast.timeline.lane_times.CHECK_EVERY`
    more lanes are searched before the build stops (None). Before, all 1,024 were."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    clock = _clocked(monkeypatch)
    searched: list[float] = []
    real = lane_times._feeding

    def feeding(arrived, lane):
        searched.append(clock.now)
        if len(searched) == 10:
            clock.now += 100.0
        return real(arrived, lane)

    monkeypatch.setattr(lane_times, "_feeding", feeding)
    deadline = clock.now + 10.0
    assert sliced_until(problem, ring, SLICES, BY_LANE, None, deadline, BuildPace()) is None
    late = sum(at > deadline for at in searched)
    assert 0 < late <= lane_times.CHECK_EVERY
    assert len(searched) < 2 * SLICES - 1


def test_a_pattern_the_deadline_passes_is_left_and_the_best_built_is_the_answer(
    monkeypatch,
) -> None:
    """The slice search on the ring with 10 s on the stand-in clock: the first pattern timed
    (the fewest plain slices) starts in time and the clock jumps 100 s in its first round of
    slices; the pattern stops at the next round (at most the rounds' levels run after the
    jump), waits as not timed, no other pattern or build starts, and the ring itself is the
    answer. Before, every round of the pattern ran past the deadline."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    clock = _clocked(monkeypatch)
    steps: list[float] = []
    real = slice_timing._Pattern._step

    def step(self, idx, k):
        steps.append(clock.now)
        if len(steps) == 1:
            clock.now += 100.0
        return real(self, idx, k)

    monkeypatch.setattr(slice_timing._Pattern, "_step", step)
    search = SliceSearch(problem, "all_ready")
    deadline = clock.now + 10.0
    search.time([ring], deadline)
    assert len(steps) <= 2  # the first round's levels: the ring's two lanes, one each
    assert not search.timed and (slice_search.SLICES[0], False, 0) in search.pending
    assert search.best([ring], deadline) is ring
