"""The exact search stops promptly once its clock passes the deadline: read on a clock that
moves on at every read (:class:`~tests.clocks.TickingClock`), a call returns within a few reads
past its limit with a schedule the checker passes and an honest status; the long numpy steps
read the clock between parts (the busy bound's merges, the capacity program's refined terms)
and give the same values in parts as whole.

Nothing here times anything: the clocks are fakes, so a loaded machine cannot change an outcome.
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from blitzplan import schedule_live, validate_schedule
from blitzplan.live.bound import busy as relaxation_busy
from blitzplan.live.bound import subset_table
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.subsets import subset_search
from blitzplan.live.exact import bnb  # noqa: F401  (imported before a clock is patched)
from blitzplan.solvers import SolveStatus
from tests.clocks import StillClock, TickingClock
from tests.test_live_counted_bound import _paper_pair

READS_PAST = 50
"""The most reads of the clock a call may make once it reads past its deadline (measured: at
most 14 on (32,16) pairs of 10-16 batches with ticks of 0.2-1 ms)."""


def _ticking(monkeypatch: pytest.MonkeyPatch, tick_s: float, limit_s: float) -> TickingClock:
    clock = TickingClock(tick_s=tick_s)
    clock.deadline_s = clock.now + limit_s
    monkeypatch.setattr(time, "perf_counter", clock.perf_counter)
    monkeypatch.setattr(time, "thread_time", clock.thread_time)
    return clock


@pytest.mark.parametrize(("seed", "old_order"), [(0, "free"), (2, "fifo"), (3, "fifo")])
def test_a_search_stops_within_a_few_reads_past_its_limit(
    monkeypatch: pytest.MonkeyPatch, seed: int, old_order: str
) -> None:
    """Property: however long the search would go on, after the clock first reads past the
    limit the call returns within :data:`READS_PAST` reads, with a valid schedule, FEASIBLE
    or OPTIMAL, its bound at most its value."""
    inst = _paper_pair(seed, 10)
    clock = _ticking(monkeypatch, 1e-3, 1.0)
    found = schedule_live(inst, method="exact", old_order=old_order, time_limit_s=1.0)
    monkeypatch.undo()
    assert clock.reads_past <= READS_PAST
    assert validate_schedule(inst, found).ok
    assert found.status in (SolveStatus.FEASIBLE, SolveStatus.OPTIMAL)
    assert found.bound is not None and found.bound <= found.objective
    if found.status is SolveStatus.FEASIBLE:
        assert found.gap is not None and found.gap > 0


def test_a_limit_spent_at_the_first_read_returns_the_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each read takes the whole limit: the call starts no phase and returns ZigZag's
    schedule (valid, not proven unless its bound proves it) within :data:`READS_PAST`."""
    inst = _paper_pair(1, 10)
    clock = _ticking(monkeypatch, 1.0, 1.0)
    found = schedule_live(inst, method="exact", old_order="fifo", time_limit_s=1.0)
    monkeypatch.undo()
    assert clock.reads_past <= READS_PAST
    assert validate_schedule(inst, found).ok
    assert found.bound is not None and found.bound <= found.objective
    zigzag = schedule_live(inst, method="zigzag", old_order="fifo", bound=False)
    assert found.objective <= zigzag.objective


def _states(rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    """Random busy-bound states, many per set, with ties on free time and cost."""
    return {
        "mask": rng.integers(1, 64, size).astype(np.int64),
        "free": rng.integers(0, 20, size) / 4.0,
        "cost": rng.integers(0, 40, size) / 4.0,
        "work": rng.integers(0, 30, size) / 1000.0,
        "held": rng.random(size),
    }


@pytest.mark.parametrize("size", [1, 999, 5_000])
def test_a_merge_in_parts_is_the_whole_merge(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """The busy bound's merge by key ranges keeps the same states in the same order."""
    states = _states(np.random.default_rng(size), size)
    whole = relaxation_busy._front(states, 0.004)
    monkeypatch.setattr(relaxation_busy, "BUSY_FRONT_STATES", 300)
    parts = relaxation_busy._front_by_parts(states, 0.004, math.inf)
    assert parts is not None and whole.keys() == parts.keys()
    for name in whole:
        assert np.array_equal(whole[name], parts[name]), name


def test_a_merge_in_parts_stops_between_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock passes ``until`` while the first part merges: no other part is merged, and
    the merge gives nothing (the busy bound then claims nothing)."""
    clock, merged = StillClock(0.0), []
    front = relaxation_busy._front

    def slow_front(states: dict[str, np.ndarray], grid: float) -> dict[str, np.ndarray]:
        merged.append(states["cost"].size)
        clock.now = 2.0
        return front(states, grid)

    monkeypatch.setattr(relaxation_busy, "time", clock)
    monkeypatch.setattr(relaxation_busy, "_front", slow_front)
    monkeypatch.setattr(relaxation_busy, "BUSY_FRONT_STATES", 300)
    states = _states(np.random.default_rng(0), 5_000)
    assert relaxation_busy._front_by_parts(states, 0.004, 1.0) is None
    assert len(merged) == 1


def _capacity_node(seed: int) -> tuple[Relaxation, float]:
    """The root of a (32,12) FIFO pair and a loose target (ZigZag's cost)."""
    inst = _paper_pair(seed, 12)
    relax = Relaxation(inst, "mean_latency")
    upper = schedule_live(inst, method="zigzag", old_order="fifo", bound=False).objective
    return relax, relax.obj.scaled(upper)


def test_the_refined_terms_in_parts_give_the_whole_program(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Taken :data:`REFINED_ROWS` states at a time (here 7), the capacity program under FIFO
    ends at the same value and sequence as in one piece."""
    relax, upper = _capacity_node(4)
    whole = subset_search(relax, upper, math.inf, math.inf, capacity=True, fifo=True)
    monkeypatch.setattr(subset_table, "REFINED_ROWS", 7)
    parts = subset_search(relax, upper, math.inf, math.inf, capacity=True, fifo=True)
    assert whole[2] and parts == whole


def _refined_calls(
    monkeypatch: pytest.MonkeyPatch, cut_at: tuple[int, int] | None
) -> tuple[list[int], tuple[float, object, bool]]:
    """The capacity program of :func:`_capacity_node` with the refined terms taken one state
    at a time: the calls per chunk (a chunk's parts share one ``crowd``), and the answer; with
    ``cut_at`` = (chunk, call), the clock passes ``search_until`` at that call."""
    relax, upper = _capacity_node(4)
    clock, calls, last = StillClock(0.0), [], [None]
    original = subset_table.Capacity.refined

    def counted(self: object, crowd: object, rows: np.ndarray, **kwargs: bool) -> np.ndarray:
        if crowd is not last[0]:
            last[0] = crowd
            calls.append(0)
        calls[-1] += 1
        if cut_at == (len(calls) - 1, calls[-1]):
            clock.now = 2.0
        return original(self, crowd, rows, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(time, "perf_counter", clock.perf_counter)  # the wall clock's reads too
        patch.setattr(subset_table.Capacity, "refined", counted)
        patch.setattr(subset_table, "REFINED_ROWS", 1)
        found = subset_search(relax, upper, 1.0, 1.0, capacity=True, fifo=True)
    return calls, found


def test_a_chunk_cut_while_refined_stays_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock passes ``search_until`` at the second part of a chunk of at least three:
    nothing more is refined, and the answer is unfinished, a bound no higher than the whole
    program's."""
    calls, whole = _refined_calls(monkeypatch, None)
    chunk = next(k for k, count in enumerate(calls) if count >= 3)
    cut, (bound, _, finished) = _refined_calls(monkeypatch, (chunk, 2))
    assert whole[2] and cut == [*calls[:chunk], 2]
    assert not finished and bound <= whole[0]


def test_the_busy_bound_in_parts_is_the_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """With its children's floors and its merges taken a few states at a time, the busy bound
    of a (32,12) FIFO pair is the same number."""
    inst = _paper_pair(4, 12)
    relax = Relaxation(inst, "mean_latency")
    best = schedule_live(inst, method="zigzag", old_order="fifo", bound=False)
    at = relaxation_busy.busy_point(relax, best.split)
    upper = relax.obj.scaled(best.objective)
    whole = relaxation_busy.busy_bound(relax, upper, at, math.inf)
    monkeypatch.setattr(relaxation_busy, "BUSY_FLOOR_STATES", 7)
    monkeypatch.setattr(relaxation_busy, "BUSY_FRONT_STATES", 50)
    assert math.isfinite(whole)
    assert relaxation_busy.busy_bound(relax, upper, at, math.inf) == whole
