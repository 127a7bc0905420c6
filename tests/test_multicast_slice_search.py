"""The slice search's clock: what it predicts before a build, what a build measures, when a
build stops, and the slicings left for lack of time (no timing asserted: only the decisions
the predictions and measurements make)."""

from __future__ import annotations

import time

import pytest

import blitzplan.multicast.exact.slice_layout as slice_layout
import blitzplan.multicast.exact.slice_search as slice_search
from blitzplan.multicast.exact.phase_slices import BuildPace, slice_phases, sliced_until
from blitzplan.multicast.exact.slice_layout import BY_LANE, BY_SENDER
from blitzplan.multicast.exact.slice_search import SliceSearch
from blitzplan.multicast.planners.baselines import BASELINES
from blitzplan.multicast.timeline.assemble import Built, finish
from blitzplan.solvers import SolveStatus
from tests.clocks import StillClock
from tests.test_multicast_phase_slices import chain_case

_FINISH = {
    "method": "exact",
    "objective": "all_ready",
    "status": SolveStatus.FEASIBLE,
    "lower_bound_s": 0.0,
    "started_s": 0.0,
}


def _timed_ring() -> tuple[SliceSearch, Built]:
    """The chain's ring with every slicing timed from its pattern (no clock)."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    search = SliceSearch(problem, "all_ready")
    search.time([ring], None)
    assert search.timed and not search.pending
    return search, ring


def _builds_counted(monkeypatch) -> list[int]:
    """The slice counts of the builds started from now on, in order."""
    started: list[int] = []

    def counted(*args, **kwargs):
        started.append(args[2])
        return sliced_until(*args, **kwargs)

    monkeypatch.setattr(slice_search, "sliced_until", counted)
    return started


def test_a_build_predicted_past_the_deadline_is_not_started(monkeypatch) -> None:
    """Every slicing's build predicted at 1000 s with 10 s left: none is started and the ring
    itself is the answer; predicted at a millionth of its pattern's time, the fastest is
    built."""
    search, ring = _timed_ring()
    started = _builds_counted(monkeypatch)
    search.pace.per_pattern = 1000 / min(search.took.values())
    search.pace.untimed_rate = 1000.0
    assert search.best([ring], time.perf_counter() + 10) is ring
    assert started == []
    search.pace.per_pattern = 1e-6
    best = search.best([ring], time.perf_counter() + 60)
    fastest = min(search.timed)
    assert started[0] == fastest[1]
    assert max(best.ready_at_s.values()) == pytest.approx(fastest[0], rel=1e-9)


def test_a_build_keeps_the_time_of_its_parts_after_the_lanes() -> None:
    """A build whose parts after its lanes (the times put in place, the phases checked, the
    finished plan's tuples made) take a million times its lanes' time stops (None) with 10 s
    left, timed or untimed, and leaves the measured shares as they were; at no cost it is
    built with its finished plan's tuples made, which the plan made from it then holds."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    shape = slice_layout.plan_shape(problem, ring)
    times = slice_layout.pattern_ready(problem, ring, 64, True, shape)
    assert times is not None
    for timed in (times, None):
        slow = BuildPace(1e6, 1e6, measured=True)
        assert sliced_until(problem, ring, 64, True, timed, time.perf_counter() + 10, slow) is None
        assert (slow.timeline, slow.rest) == (1e6, 1e6)
        free = BuildPace(0.0, 0.0, measured=True)
        built = sliced_until(problem, ring, 64, True, timed, time.perf_counter() + 60, free)
        assert built is not None and built.frozen is not None
        assert free.rest > 0.0  # measured
        plan = finish(problem, built, **_FINISH)
        assert plan.lane_arrival_s is built.frozen.lane_arrival_s
        again = finish(
            problem, Built(built.builder, built.timeline, built.ready_at_s, ()), **_FINISH
        )
        assert again.lane_arrival_s == plan.lane_arrival_s and again.hops == plan.hops


def test_a_measured_build_sets_the_estimate_and_never_lowers_it(monkeypatch) -> None:
    """The first build measured replaces the prior ratio (a build slowed by 50 ms: the ratio
    is at least 50 ms over its pattern's time, whatever the prior); a later, faster build
    leaves it as it is."""
    search, _ = _timed_ring()

    def slowed(*args, **kwargs):
        time.sleep(0.05)
        return sliced_until(*args, **kwargs)

    monkeypatch.setattr(slice_search, "sliced_until", slowed)
    search.pace.per_pattern = 1e-6  # a prior far below any real build
    fastest = min(search.timed)
    key = fastest[1:]
    assert search._full(key, None, timed=True) is not None
    assert search.pace.measured_build
    first = search.pace.per_pattern
    assert first >= 0.05 / search.took[key]
    monkeypatch.setattr(slice_search, "sliced_until", sliced_until)
    other = next(t[1:] for t in sorted(search.timed) if t[1:] != key)
    search._full(other, None, timed=True)
    assert search.pace.per_pattern >= first


def test_a_build_stops_once_its_pace_misses_the_deadline() -> None:
    """With its deadline passed, a timed slicing's build stops (None) once an eighth of its
    lanes are made, an untimed one's at once; without one it is the slicing itself."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    shape = slice_layout.plan_shape(problem, ring)
    times = slice_layout.pattern_ready(problem, ring, 64, True, shape)
    assert times is not None
    assert sliced_until(problem, ring, 64, True, times, time.perf_counter() - 1.0) is None
    assert sliced_until(problem, ring, 64, True, None, time.perf_counter() - 1.0) is None
    built = sliced_until(problem, ring, 64, True, times, None)
    assert built is not None
    full = slice_phases(problem, ring, 64, staggered=True)
    assert built.ready_at_s == pytest.approx(full.ready_at_s, rel=1e-9)
    assert built.builder.lanes == full.builder.lanes


def test_slicings_left_for_lack_of_time_wait_and_the_leading_plans_count(monkeypatch) -> None:
    """The ring's slicings, with no time to time them, wait and count in the time the
    search leaves (the ring leads) where they fit by the build deadline; the next call times
    them. A slower plan's waiting slicings do not count while the ring leads (it is sliced at
    all here only with SLICE_WITHIN lifted: it is 2x the ring's sliced time)."""
    monkeypatch.setattr(slice_search, "SLICE_WITHIN", float("inf"))
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    other = BASELINES["serverlessllm"](problem)
    search = SliceSearch(problem, "all_ready")
    search.time([ring], time.perf_counter() - 1.0)
    assert search.pending and not search.timed
    waiting = list(search.pending)
    search.pace.pattern_rate[0] = 1e-3  # as if a pattern had been measured at 1 ms per lane-slice
    assert search.needed_s() == search.reserve_s  # they cannot fit by the deadline given
    search.build_by = time.perf_counter() + 60.0
    assert search.needed_s() > search.reserve_s  # they can
    search.time([], None)
    assert not search.pending
    assert set(waiting) <= {t[1:] for t in search.timed} | set(search.untimed)
    slower = SliceSearch(problem, "all_ready")
    slower.time([ring], None)
    slower.time([other], time.perf_counter() - 1.0)
    assert slower.pending and all(j == 1 for _, _, j in slower.pending)
    assert slower._leader() == 0
    assert slower.needed_s() == slower.reserve_s  # the ring leads: the other's do not count


@pytest.mark.parametrize("within", [1.3, 2.5])
def test_a_plan_far_above_the_fastest_timed_is_not_sliced(monkeypatch, within: float) -> None:
    """With the ring's slicings timed (its fastest 0.0375 s), serverlessllm's plan (0.0755 s,
    2.0x) gets no slicing timed nor waiting under SLICE_WITHIN 1.3; with it at 2.5 it does."""
    monkeypatch.setattr(slice_search, "SLICE_WITHIN", within)
    search, _ = _timed_ring()
    other = BASELINES["serverlessllm"](search.problem)
    assert 1.3 * search.target < search._value(other) < 2.5 * search.target
    search.time([other], time.perf_counter() + 60.0)
    sliced = [key for key in search.pending + search.untimed if key[2] == 1]
    sliced += [t for t in search.timed if t[3] == 1]
    assert len(search.plans) == 2 and bool(sliced) == (within > 2.0)


def test_a_pattern_is_timed_only_when_its_own_build_could_follow() -> None:
    """Patterns predicted at a microsecond per lane-slice with a minute left: with a build
    predicted at a billion times its pattern, none is timed (each waits: it could never be
    built, so timing it would only take the time of the builds that can); at a millionth,
    every one is."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    for per_pattern, timed in ((1e9, False), (1e-6, True)):
        search = SliceSearch(problem, "all_ready")
        search.pace.pattern_rate[0] = 1e-6  # as if measured: every plan's pattern predicted so
        search.pace.per_pattern = per_pattern
        search.time([ring], time.perf_counter() + 60.0)
        assert bool(search.timed) == timed
        assert bool(search.pending) != timed


def test_an_untimed_build_cut_short_keeps_its_pace_for_the_next(monkeypatch) -> None:
    """A slicing the pattern cannot time, built lane by lane: a build that took 5 s (on a
    stand-in clock) and was cut short (None) still sets the pace, so the next one of that size
    is not started with 4 s left; before, only a finished build did, and every later one was
    started at the prior pace and ran to its deadline."""
    search, _ = _timed_ring()
    clock = StillClock()
    monkeypatch.setattr(slice_search, "time", clock)
    started: list[int] = []

    def cut_short(*args, **kwargs):
        started.append(args[2])
        clock.now += 5.0
        return None

    monkeypatch.setattr(slice_search, "sliced_until", cut_short)
    key = (4, False, 0)
    size = search.shapes[0][1] * 4
    assert search._full(key, clock.now + 100.0, timed=False) is None
    assert search.pace.untimed_rate == pytest.approx(5.0 / size)
    assert search._full(key, clock.now + 4.0, timed=False) is None
    assert started == [4]


@pytest.mark.parametrize("preferred", [BY_LANE, BY_SENDER])
def test_the_leading_plans_waiting_slicings_come_in_its_staggering_first(
    monkeypatch, preferred: int
) -> None:
    """The leading plan's slicings left for lack of time are tried again the most slices
    first and, at one count, in the plan's staggering first (case 193: its 64 slices by lane
    depth, 1.0475 of the bound, waited behind its 64 by sender, 2.08x, and the time ran out
    between them); before, the staggering's number decided."""
    search, _ = _timed_ring()
    waiting = [(64, BY_SENDER, 0), (64, BY_LANE, 0), (128, BY_SENDER, 0), (128, BY_LANE, 0)]
    search.pending = list(waiting)
    other = BY_SENDER if preferred == BY_LANE else BY_LANE
    monkeypatch.setattr(search, "_staggering", lambda j: preferred)
    tried: list[list[tuple[int, int, int]]] = []
    monkeypatch.setattr(search, "_patterns", lambda trials, *args: tried.append(list(trials)))
    search.time([], None)
    assert tried[0] == [(128, preferred, 0), (128, other, 0), (64, preferred, 0), (64, other, 0)]


def test_staggered_first_times_a_new_plans_plain_slicings_after_its_staggered_ones(
    monkeypatch,
) -> None:
    """``time(staggered_first=True)`` (the exact method's first call, on the greedy's plan in
    a short window) tries the plan's staggered slicings before its plain ones but the two
    fewest (the first pattern, timed unpredicted: a cheap one, and the second, so the rest are
    predicted from a fixed part and a part per slice); by default the plain ones come first
    (case 193: 4-32 plain took that window, its 64 by lane depth, 1.0475 of the bound against
    1.1005 at 32 plain, then waited; from the fewest alone its 64 was predicted at 1.8 s and
    waited too, timed later at 0.51 s)."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    for first in (True, False):
        search = SliceSearch(problem, "all_ready")
        tried: list[tuple[int, int, int]] = []
        monkeypatch.setattr(
            search, "_patterns", lambda trials, *args, seen=tried: seen.extend(trials)
        )
        search.time([ring], None, staggered_first=first)
        assert tried, "something is tried"
        assert tried[0] == (slice_search.SLICES[0], False, 0)
        plain = [k for k, key in enumerate(tried) if key[1] is False]
        staggered = [k for k, key in enumerate(tried) if key[1]]
        assert len(plain) == len(slice_search.SLICES) and staggered
        assert tried[1] == (slice_search.SLICES[1], False, 0)
        assert (max(staggered) < plain[2]) == first


def test_the_leading_plans_waiting_plain_slicings_come_last_and_keep_no_time() -> None:
    """The leading plan's waiting plain slicings are not tried before the new plans' (only its
    staggered ones are: case 193's 32, 16 and 8 plain, left from the first call, took 0.44 s
    of the second while its 128 and 256 by lane depth did not fit), and the search keeps no
    time for them (:meth:`SliceSearch.needed_s`)."""
    search, _ = _timed_ring()
    search.pending = [(32, False, 0), (64, BY_LANE, 0)]
    tried: list[list[tuple[int, int, int]]] = []
    search._patterns = lambda trials, *args: tried.append(list(trials))  # type: ignore[method-assign]
    search.time([], None)
    assert tried[0] == [(64, BY_LANE, 0)]
    assert tried[-1] == [(32, False, 0)]
    search.pending = [(32, False, 0)]
    search.pace.pattern_rate[0] = 1e-3
    search.build_by = time.perf_counter() + 60.0
    assert search.needed_s() == search.reserve_s


def test_the_slicings_the_pattern_cannot_time_are_built_the_fewest_slices_first(
    monkeypatch,
) -> None:
    """The untimed slicings are built the fewest slices first, whatever order they were found
    in (``staggered_first`` finds a plan's staggered ones before its plain ones: case 10 then
    built 64 staggered slices lane by lane and had no time left for its 32 plain)."""
    search, ring = _timed_ring()
    search.timed = []
    search.untimed = [(64, BY_LANE, 0), (4, False, 0), (32, False, 0), (8, False, 0)]
    built: list[tuple[int, int, int]] = []
    monkeypatch.setattr(search, "_full", lambda key, *args, **kwargs: built.append(key))
    assert search.best([ring], None) is ring
    assert built == [(4, False, 0), (8, False, 0), (32, False, 0), (64, BY_LANE, 0)]


def test_until_a_pattern_is_timed_only_the_fewest_plain_slices_are_tried(monkeypatch) -> None:
    """Case 193 at load 11: the first call had no time for any pattern, and the second began
    with the leading plan's waiting 256 staggered slices, which nothing measured could
    predict (5.4 s past a 0.28 s window). Until a pattern is timed, the others wait: the first
    timed is the fewest plain slices, and the rest are predicted from it."""
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    search = SliceSearch(problem, "all_ready")
    search.time([ring], time.perf_counter() - 1.0)
    assert any(staggered for _, staggered, _ in search.pending) and not search.pace.pattern_rate
    tried: list[tuple[int, int]] = []
    real = slice_search.pattern_ready

    def counted(problem, plan, phases, staggered, shape, check=None):
        tried.append((phases, staggered))
        return real(problem, plan, phases, staggered, shape, check)

    monkeypatch.setattr(slice_search, "pattern_ready", counted)
    search.time([], None)
    assert tried[0] == (slice_search.SLICES[0], False) and len(tried) > 1


def test_a_call_before_the_last_builds_no_untimed_slicing_and_frees_the_reserve(
    monkeypatch,
) -> None:
    """``untimed=False`` (the exact method's build before its search): the fastest timed
    slicing is built, none the pattern could not time, and the time kept for that build is
    freed (:meth:`SliceSearch.needed_s` then keeps none for it); the last call, by default,
    builds the untimed ones too."""
    search, ring = _timed_ring()
    search.untimed = [(4, False, 0)]
    search.reserve_s = 5.0
    built: list[tuple[tuple[int, int, int], bool]] = []
    full = search._full

    def spy(key, deadline, *, timed):
        built.append((key, timed))
        return full(key, deadline, timed=timed)

    monkeypatch.setattr(search, "_full", spy)
    fastest = min(search.timed)
    best = search.best([ring], None, untimed=False)
    assert built == [(fastest[1:], True)]
    assert max(best.ready_at_s.values()) == pytest.approx(fastest[0], rel=1e-9)
    assert search.reserve_s == 0.0
    assert search.needed_s() == 0.0
    built.clear()
    search.best([ring], None)
    assert ((4, False, 0), False) in built


def test_the_leaders_waiting_staggered_slicings_are_timed_alone_when_asked() -> None:
    """``time(..., leader_only=True)``: of the slicings left waiting, only the leading plan's
    staggered ones are timed (the exact method's call before its search, when the leader is
    near the bound); a plain one waits for the next call, which times it."""
    search, _ = _timed_ring()
    staggered = max(key for key in search.took if key[1])
    plain = (slice_search.SLICES[0], False, 0)
    search.pending = [plain, staggered]
    before = len(search.timed)
    search.time([], None, leader_only=True)
    assert [(m, by, j) for _, m, by, j in search.timed[before:]] == [staggered]
    assert search.pending == [plain]
    search.time([], None)
    assert search.pending == []
    assert (plain[0], plain[1], plain[2]) in {(m, by, j) for _, m, by, j in search.timed[before:]}
