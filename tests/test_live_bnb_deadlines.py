"""``bnb``'s time limit: every phase is given at most the time left, none starts past the
deadline, the sequencer and the slot bound stop there even mid-way, the imports a solve
needs are paid before its clock starts, and the collector's full passes skip the objects
that were there before it.

Nothing here times a solve: fake clocks and patched phases that record the time they were
given make every outcome deterministic (speed is measured in ``benchmarks/limits.py``).
"""

from __future__ import annotations

import gc
import importlib
import math
import sys
import time
from types import SimpleNamespace

import pytest

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live import solve
from blitzplan.live.bound import slots as relaxation_slots
from blitzplan.live.exact import nmachine, node_cpsat, priced, root_bounds
from blitzplan.live.exact.common import Start, start_point
from blitzplan.live.exact.nmachine import NOp, sequence
from blitzplan.live.exact.node_cpsat import CP_MODEL
from blitzplan.solvers import backends
from blitzplan.solvers.backends import BACKENDS, OPTIONAL_IMPORT_MIN_S, load_backend
from tests.clocks import StillClock

LOOSE = LiveScalingInstance([0.0, 0.0], [0.0] * 3, 1.0, 1.0, 0.0)
"""Three batches, every layer there: the relaxation's bound is loose."""


def test_the_sequencer_stops_at_the_deadline_while_it_backs_out() -> None:
    """Property: once the clock passes the deadline, the sequencer prunes no further level.
    Here its first prune (batch 0's first layer first leaves layer 2 late) empties a frame, and
    backing out would prune the frame above it; the clock is past the deadline from the first
    prune on, so that second prune must not run."""
    ops = [NOp(3.0, 8.0, 1.0, 0, 1), NOp(4.0, 5.0, 1.0, 0, 2), NOp(3.0, 7.0, 1.0, 1, 1)]
    clock, pruned = StillClock(0.0), []
    original = nmachine._prune

    def prune(frame: object, left: list[NOp]) -> int:
        pruned.append(clock.now)
        clock.now = 2.0  # past the deadline from here on
        return original(frame, left)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nmachine, "time", clock)
        patch.setattr(nmachine, "_prune", prune)
        assert sequence(ops, deadline_s=1.0, max_steps=10**6) == (None, False)
    assert pruned == [0.0]
    assert sequence(ops, deadline_s=math.inf, max_steps=10**6) == ((0, 0, 1), True)


def test_the_slot_bound_takes_no_step_when_its_set_up_took_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The grids take the whole limit: no first prices' trial and no step runs after, and
    the answer is no bound (``-inf``), not a bound from a step taken past the deadline."""
    completion = schedule_live(LOOSE, method="zigzag", bound=False).completion_s
    clock, programs = StillClock(0.0), []
    grids = relaxation_slots.SlotPrices

    def slow_grids(*args: object, **kwargs: object) -> object:
        prices = grids(*args, **kwargs)  # type: ignore[arg-type]
        clock.now += 10.0
        return prices

    def program(*args: object, **kwargs: object) -> object:
        programs.append(clock.now)
        raise AssertionError("a program solved past the deadline")

    monkeypatch.setattr(relaxation_slots, "time", clock)
    monkeypatch.setattr(relaxation_slots, "SlotPrices", slow_grids)
    monkeypatch.setattr(relaxation_slots, "solve_batches", program)
    found = relaxation_slots.slot_bound(
        LOOSE, upper_bound=2.0, time_limit_s=1.0, completion_s=completion
    )
    assert found == (-math.inf, None) and programs == []


def _start(time_limit_s: float) -> Start:
    hint = schedule_live(LOOSE, method="zigzag")
    args = {"objective": "mean_latency", "old_order": "free", "backend": "bnb"}
    return start_point(LOOSE, **args, time_limit_s=time_limit_s, hint=hint, relax=False)


def _record_phases(monkeypatch: pytest.MonkeyPatch, start: Start) -> list[tuple[str, float]]:
    """Replace each phase of :func:`~blitzplan.live.exact.root_bounds.strengthen` by a fake
    that records (its name, the seconds it was given less the seconds then left) and changes
    nothing; the local search is given its deadline, recorded likewise."""
    improve = importlib.import_module("blitzplan.live.improve")  # (the package's is a function)
    given: list[tuple[str, float]] = []

    def polish(*args: object, deadline_s: float, **kwargs: object) -> object:
        given.append(("polish", deadline_s - start.deadline_s))
        return SimpleNamespace(value=math.inf)

    def slot(start_: Start, *, budget_s: float, **kwargs: object) -> list[object]:
        given.append(("slot", budget_s - start_.left_s()))
        return []

    def timed(name: str) -> object:
        def phase(*args: object, time_limit_s: float, **kwargs: object) -> float:
            given.append((name, time_limit_s - start.left_s()))
            return -math.inf

        return phase

    monkeypatch.setattr(improve, "polish", polish)
    monkeypatch.setattr(priced, "priced_search", slot)
    monkeypatch.setattr(root_bounds, "capacity_bound", timed("capacity"))
    monkeypatch.setattr(root_bounds, "lagrangian_bound", timed("lagrange"))
    monkeypatch.setattr(start, "proven", lambda: False)
    return given


def test_each_root_bound_is_given_at_most_the_time_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Property: the local search, the slot and capacity bounds each start with no more than
    the time then left (their shares of it; 8 s, less than the capacity bound's budget without
    a limit; a short call's quick Lagrangian: ``test_live_bnb_short``). Here the capacity
    program's probe is cut short (it takes its whole budget), so the slot bound and the
    capacity program run after it as without it."""
    start = _start(8.0)
    given = _record_phases(monkeypatch, start)
    _probe_takes_its_budget(monkeypatch)
    monkeypatch.setattr(priced, "slot_setup_s", lambda instance: 0.0)
    root_bounds.strengthen(start, -math.inf)
    assert [name for name, _ in given] == ["polish", "capacity", "slot", "capacity"]
    assert all(over_s <= 0.0 for _, over_s in given)


def _probe_takes_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make :mod:`~blitzplan.live.exact.root_bounds`' clock read each capacity program as
    taking its whole budget (the other phases take none of it)."""
    clock = StillClock(0.0)
    capacity = root_bounds.capacity_bound

    def timed(*args: object, time_limit_s: float, **kwargs: object) -> float:
        clock.now += time_limit_s
        return capacity(*args, time_limit_s=time_limit_s, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(root_bounds, "time", clock)
    monkeypatch.setattr(root_bounds, "capacity_bound", timed)


@pytest.mark.parametrize(("share", "polished"), [(0.99, False), (0.9, True)])
def test_a_capacity_probe_that_ended_is_the_root_program(
    monkeypatch: pytest.MonkeyPatch, share: float, polished: bool
) -> None:
    """Under a free order the capacity program first gets its probe's share of the time
    left; ended (not cut short) its value is the program's: it is not run again, the root
    node is not given it (``ended``), the slot bound runs after it, and its priced schedules
    are polished only where the gap the program leaves is
    :data:`~blitzplan.live.exact.root_bounds.SLOT_SKIP_GAP` or more (here 1% and 10%)."""
    start = _start(8.0)
    given = _record_phases(monkeypatch, start)
    recorded = priced.priced_search
    shares: list[object] = []

    def sharing(*args: object, polish_share: float, **kwargs: object) -> object:
        shares.append(polish_share)
        return recorded(*args, polish_share=polish_share, **kwargs)

    monkeypatch.setattr(priced, "priced_search", sharing)
    monkeypatch.setattr(priced, "slot_setup_s", lambda instance: 0.0)
    upper, budgets = start.incumbent.objective, []

    def capacity(*args: object, time_limit_s: float, **kwargs: object) -> float:
        given.append(("capacity", time_limit_s - start.left_s()))
        budgets.append((time_limit_s, start.left_s()))
        return share * upper  # at once: within its budget

    monkeypatch.setattr(root_bounds, "capacity_bound", capacity)
    report = root_bounds.strengthen(start, -math.inf)
    assert [name for name, _ in given] == ["polish", "capacity", "slot"]
    assert report.ended and start.bound == share * upper
    assert len(shares) == 1 and (shares[0] > 0) == polished
    budget, left = budgets[0]
    assert budget == pytest.approx(root_bounds.CAPACITY_PROBE_SHARE * left, rel=1e-3)


def test_a_short_free_call_runs_no_capacity_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 s call keeps the short path (the slot bound on its short grid, then the capacity
    program with most of the time): no probe before the slot bound."""
    start = _start(1.0)
    given = _record_phases(monkeypatch, start)
    monkeypatch.setattr(priced, "slot_setup_s", lambda instance: 0.0)
    root_bounds.strengthen(start, -math.inf)
    assert [name for name, _ in given] == ["polish", "slot", "capacity"]


def test_no_root_bound_starts_past_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    start = _start(1000.0)
    given = _record_phases(monkeypatch, start)
    start.deadline_s = time.perf_counter() - 1.0
    root_bounds.strengthen(start, -math.inf)
    assert given == []


def test_the_slot_bound_is_skipped_when_its_set_up_would_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slot bound cannot stop before its set-up is done: estimated (stretched by the load
    seen) past its share of the time left, it is not started; the capacity bound still is."""
    start = _start(1000.0)
    given = _record_phases(monkeypatch, start)
    monkeypatch.setattr(priced, "slot_setup_s", lambda instance: 0.1)
    monkeypatch.setattr(start, "slowdown", lambda: 1e5)  # 0.1 s of CPU takes 10^4 s of wall
    root_bounds.strengthen(start, -math.inf)
    assert [name for name, _ in given] == ["polish", "capacity"]


def test_the_slowdown_is_wall_time_over_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    start = _start(1000.0)
    start.started_s, start.started_cpu_s = 0.0, 0.0
    monkeypatch.setattr(time, "perf_counter", lambda: 8.0)
    monkeypatch.setattr(time, "thread_time", lambda: 2.0)
    assert start.slowdown() == 4.0
    monkeypatch.setattr(time, "thread_time", lambda: 16.0)
    assert start.slowdown() == 1.0  # never below one


def test_bnb_imports_or_tools_before_its_clock_starts_when_the_limit_pays_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CP-SAT on a node (:mod:`blitzplan.live.exact.node_cpsat`) uses OR-Tools when it is
    installed: loading the backend imports it, unless the limit is too short to pay for it."""
    pytest.importorskip("ortools")
    assert CP_MODEL in BACKENDS["bnb"].optional
    imported: list[str] = []
    monkeypatch.setattr(backends.importlib, "import_module", imported.append)
    load_backend("bnb", time_limit_s=0.5 * OPTIONAL_IMPORT_MIN_S)
    assert imported == []
    for limit_s in (OPTIONAL_IMPORT_MIN_S, None):
        load_backend("bnb", time_limit_s=limit_s)
        assert imported.pop() == CP_MODEL


def test_a_timed_search_never_pays_the_first_import_of_or_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node handed to CP-SAT in a solve with a deadline keeps its bound when OR-Tools was
    not imported before the solve; without a deadline it is imported then."""
    pytest.importorskip("ortools")
    imported: list[str] = []
    monkeypatch.delitem(sys.modules, CP_MODEL, raising=False)
    monkeypatch.setattr(node_cpsat.importlib, "import_module", imported.append)
    timed = _start(1000.0)
    assert node_cpsat._cp_model(timed) is None and imported == []
    timed.deadline_s = math.inf
    node_cpsat._cp_model(timed)
    assert imported == [CP_MODEL]


def test_the_solve_function_is_imported_before_the_time_left_is_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Importing the solver's module (here a fake that takes 4 s of a fake clock) counts
    against the limit: the solver is given what is left after it."""
    clock, limits = StillClock(100.0), []

    def solver(backend: str) -> object:
        clock.now += 4.0

        def solve_(instance: LiveScalingInstance, *, time_limit_s: float, **kwargs: object):
            limits.append(time_limit_s)
            return kwargs["hint"]

        return solve_

    monkeypatch.setattr(solve, "time", clock)
    monkeypatch.setattr(solve, "_solver", solver)
    schedule_live(LOOSE, method="exact", backend="bnb", time_limit_s=10.0)
    assert limits == [pytest.approx(6.0)]


def test_a_solve_runs_with_the_older_objects_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Property: while an exact solve runs, the objects from before it are out of the
    collector's passes; after it, nothing it froze stays frozen."""
    counts, real = [], solve._solver

    def solver(backend: str) -> object:
        inner = real(backend)

        def counted(*args: object, **kwargs: object) -> object:
            counts.append(gc.get_freeze_count())
            return inner(*args, **kwargs)

        return counted

    monkeypatch.setattr(solve, "_solver", solver)
    before = gc.get_freeze_count()
    schedule_live(LOOSE, method="exact", backend="bnb", time_limit_s=30.0)
    assert counts[0] > before and gc.get_freeze_count() == before


def test_the_callers_frozen_objects_stay_frozen() -> None:
    """Objects the caller froze stay frozen through a solve (the count falls only by those
    freed meanwhile: the solve does not unfreeze them)."""
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0
        schedule_live(LOOSE, method="exact", backend="bnb", time_limit_s=30.0)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
