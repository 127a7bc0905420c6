"""``bnb``'s short calls: the root bounds in the order a call of a second wants (the Lagrangian
bound's first steps, then the capacity program with most of the time, the busy bound only near
the incumbent), the search after them without the nodes' capacity programs, and a root whose
capacity program ended not given it again.

Phases are patched to record the time they were given (nothing here times a solve); the
short path is checked against the exhaustive oracle on the crowded tiny instances of
``test_live_bnb_nodes``.
"""

from __future__ import annotations

import importlib
import math
from types import SimpleNamespace
from unittest import mock

import pytest

from blitzplan import schedule_live, validate_schedule
from blitzplan.live.bound.relaxation import Restriction
from blitzplan.live.exact import bnb, priced, root_bounds
from blitzplan.live.exact.common import Start, start_point
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.exact.offers import Offers
from blitzplan.solvers import SolveStatus
from tests import test_live_bnb_nodes as nodes
from tests.test_live_bnb_nodes import REL, SEEDS, _crowded, _watched


def _start(time_limit_s: float | None, seed: int = 3) -> Start:
    inst = _crowded(seed)
    hint = schedule_live(inst, method="zigzag", old_order="fifo")
    args = {"objective": "mean_latency", "old_order": "fifo", "backend": "bnb"}
    return start_point(inst, **args, time_limit_s=time_limit_s, hint=hint, relax=False)


def _record_phases(
    monkeypatch: pytest.MonkeyPatch, start: Start, capacity_share: float
) -> list[tuple[str, float, float]]:
    """Replace each phase of :func:`~blitzplan.live.exact.root_bounds.strengthen` by a fake
    that records (its name, the seconds it was given, the seconds then left); the capacity
    program's fake returns ``capacity_share`` of the incumbent, the others nothing."""
    improve = importlib.import_module("blitzplan.live.improve")  # (the package's is a function)
    given: list[tuple[str, float, float]] = []

    def polish(*args: object, deadline_s: float, **kwargs: object) -> object:
        given.append(("polish", deadline_s - start.deadline_s + start.left_s(), start.left_s()))
        return SimpleNamespace(value=math.inf)

    def lagrange(*args: object, time_limit_s: float, **kwargs: object) -> float:
        given.append(("lagrange", time_limit_s, start.left_s()))
        return -math.inf

    def capacity(*args: object, time_limit_s: float, **kwargs: object) -> float:
        given.append(("capacity", time_limit_s, start.left_s()))
        return capacity_share * start.incumbent.objective

    def busy(relax: object, upper: float, at: float, until: float) -> float:
        given.append(("busy", until - bnb.time.perf_counter(), start.left_s()))
        return -math.inf

    def preempted(offers: Offers, until_s: float, descend: bool = False) -> None:
        left = start.left_s()
        given.append(("preempted", until_s - start.deadline_s + left, left))

    monkeypatch.setattr(improve, "polish", polish)
    monkeypatch.setattr(root_bounds, "lagrangian_bound", lagrange)
    monkeypatch.setattr(root_bounds, "capacity_bound", capacity)
    monkeypatch.setattr(root_bounds, "busy_bound", busy)
    monkeypatch.setattr(Offers, "preempted", preempted)
    monkeypatch.setattr(start, "proven", lambda: False)
    return given


def test_a_short_call_lifts_first_and_gives_the_capacity_program_most_of_the_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1 s call, the relaxation far from the incumbent, the gap wide after the capacity
    program: the Lagrangian bound's quick share, then the capacity program with
    :data:`~blitzplan.live.exact.root_bounds.CAPACITY_SHORT_SHARE` of the time left (more than
    its share in a long call), no busy bound; each given at most the time then left."""
    start = _start(1.0)
    given = _record_phases(monkeypatch, start, capacity_share=0.9)
    report = root_bounds.strengthen(start, 0.5 * start.incumbent.objective)
    assert report.short
    assert [name for name, _, _ in given][:3] == ["polish", "lagrange", "capacity"]
    assert "busy" not in [name for name, _, _ in given]
    assert all(seconds <= left for _, seconds, left in given)
    _, quick, left = given[1]
    assert quick == pytest.approx(root_bounds.QUICK_LAGRANGE_SHARE * left, rel=1e-3)
    _, capacity, left = given[2]
    assert capacity > root_bounds.CAPACITY_SHARE_OF_LIMIT * left
    wanted = min(root_bounds.CAPACITY_SHORT_SHARE * left, root_bounds.CAPACITY_FLOOR_S)
    assert capacity == pytest.approx(wanted, rel=1e-3)


def test_a_short_call_runs_the_busy_bound_near_the_incumbent_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Near the incumbent (the relaxation and the capacity bound within 1%) there is no
    quick Lagrangian and the busy bound gets its short share of the time left."""
    start = _start(1.0)
    given = _record_phases(monkeypatch, start, capacity_share=0.995)
    report = root_bounds.strengthen(start, 0.99 * start.incumbent.objective)
    assert report.short
    assert [name for name, _, _ in given] == ["polish", "capacity", "busy", "preempted"]
    _, busy, left = given[2]
    assert busy == pytest.approx(root_bounds.BUSY_SHORT_SHARE * left, rel=1e-2)


def test_a_long_call_keeps_the_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 1,000 s the order and shares are the long call's: no quick Lagrangian, the capacity
    program in its share (at most its cap), and after it neither the busy bound nor the
    Lagrangian bound (the search gets the time left)."""
    start = _start(1000.0)
    given = _record_phases(monkeypatch, start, capacity_share=0.9)
    report = root_bounds.strengthen(start, 0.5 * start.incumbent.objective)
    assert not report.short
    assert [name for name, _, _ in given] == ["polish", "capacity", "preempted"]
    _, capacity, left = given[1]
    wanted = min(root_bounds.CAPACITY_SHARE_OF_LIMIT * left, root_bounds.CAPACITY_MAX_S)
    assert capacity == pytest.approx(wanted, rel=1e-3)


@pytest.mark.parametrize("ended", [False, True])
def test_the_root_is_given_its_capacity_program_again_only_when_it_was_cut(ended: bool) -> None:
    start = _start(None)
    search = bnb._Search(start)
    search.restart(ended)
    assert search.open, "the root was settled: the check is vacuous"
    assert all(node.strong == ended for node in search.open)
    assert search.open[0].restriction == Restriction.none(start.instance)


@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_the_short_path_never_passes_the_optimum(old_order: str) -> None:
    """On the crowded tiny instances with every call taken as short (a 1,000 s limit, no early
    share, the busy bound at any gap): the quick Lagrangian, the capacity program's larger
    share, the busy bound, under a free order the slot bound on its short grid with the
    latency floor (:data:`~blitzplan.live.exact.priced.SHORT_SLOTS`), the search
    without the nodes' programs. At every node taken the search's bound is at most the
    oracle's optimum and the answer is OPTIMAL at the optimum; the short path was taken (the
    check is not vacuous)."""
    reports: list[root_bounds.Strengthened] = []
    real = root_bounds.strengthen

    def strengthen(start: Start, root_bound: float, offers: Offers) -> root_bounds.Strengthened:
        report = real(start, root_bound, offers)
        reports.append(report)
        return report

    real_live = schedule_live

    def limited(*args: object, **kwargs: object) -> object:
        return real_live(*args, **kwargs, time_limit_s=1000.0)  # type: ignore[arg-type]

    for seed in SEEDS:
        inst = _crowded(seed)
        if count_schedules(inst, old_order=old_order) > 20_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=old_order)
        with (
            mock.patch.object(bnb, "EARLY_SEARCH_MAX_S", 0.0),
            mock.patch.object(root_bounds, "CAPACITY_SHORT_S", math.inf),
            mock.patch.object(root_bounds, "BUSY_SHORT_GAP", math.inf),  # whatever the gap
            mock.patch.object(bnb, "strengthen", strengthen),
            mock.patch.object(nodes, "schedule_live", limited),
        ):
            found, seen, _ = _watched(inst, old_order, "default")
        best = oracle.objective
        assert validate_schedule(inst, found).ok
        assert all(low <= best * (1 + REL) + 1e-9 for low in seen), (seed, best, max(seen))
        assert found.status is SolveStatus.OPTIMAL, (seed, found.message)
        assert found.objective == pytest.approx(best, rel=REL, abs=1e-9), seed
    assert len(reports) >= 10 and all(report.short for report in reports), len(reports)


def _record_free_phases(
    monkeypatch: pytest.MonkeyPatch, start: Start
) -> list[tuple[str, float, float, dict[str, object]]]:
    """Like :func:`_record_phases` under a free order: the slot bound's fake
    (``priced_search``) records the grid it was given."""
    given: list[tuple[str, float, float, dict[str, object]]] = []

    def polish(*args: object, **kwargs: object) -> None:
        given.append(("polish", 0.0, start.left_s(), {}))

    def capacity(*args: object, time_limit_s: float, **kwargs: object) -> float:
        given.append(("capacity", time_limit_s, start.left_s(), {}))
        return 0.9 * start.incumbent.objective

    def slot(start_: Start, *, budget_s: float, **kwargs: object) -> list[object]:
        given.append(("slot", budget_s, start.left_s(), kwargs))
        return []

    monkeypatch.setattr(start, "polish", polish)
    monkeypatch.setattr(root_bounds, "capacity_bound", capacity)
    monkeypatch.setattr(priced, "priced_search", slot)
    monkeypatch.setattr(start, "proven", lambda: False)
    return given


@pytest.mark.parametrize(("time_limit_s", "short"), [(1.0, True), (1000.0, False)])
def test_the_slot_bound_of_a_short_free_call_runs_on_the_short_grid(
    monkeypatch: pytest.MonkeyPatch, time_limit_s: float, short: bool
) -> None:
    """Under a free order the slot bound gets its share of the time left; in a short call
    first (then the capacity program), in
    :data:`~blitzplan.live.exact.root_bounds.SHORT_SLOT_SHARE`, on
    :data:`~blitzplan.live.exact.priced.SHORT_SLOTS` slots with the latency floor, in a
    long one after the capacity program's probe (which ended here 10% under the incumbent) on
    the default grid without it."""
    inst = _crowded(3)
    hint = schedule_live(inst, method="zigzag", old_order="free")
    args = {"objective": "mean_latency", "old_order": "free", "backend": "bnb"}
    start = start_point(inst, **args, time_limit_s=time_limit_s, hint=hint, relax=False)
    given = _record_free_phases(monkeypatch, start)
    report = root_bounds.strengthen(start, 0.5 * start.incumbent.objective)
    assert report.short == short
    phases = ["polish", "slot", "capacity"] if short else ["polish", "capacity", "slot"]
    assert [name for name, *_ in given][:3] == phases
    _, slot, left, grid = given[phases.index("slot")]
    share = root_bounds.SHORT_SLOT_SHARE if short else root_bounds.SLOT_SHARE_OF_LIMIT
    assert slot == pytest.approx(min(share * left, root_bounds.CAPACITY_MAX_S), rel=1e-2)
    assert grid == {
        "polish_share": 0.0 if short else priced.PRICED_POLISH_SHARE,
        "moves": priced.POLISH_MOVES,
        "slots": priced.SHORT_SLOTS if short else None,
        "latency_floor": short,
        "starts": root_bounds.SHORT_PRICED_STARTS if short else priced.PRICED_STARTS,
    }


@pytest.mark.parametrize("ended", [True, False])
def test_a_short_free_call_probes_the_capacity_program_then_polishes_the_priced_schedules(
    monkeypatch: pytest.MonkeyPatch, ended: bool
) -> None:
    """In a short call under a free order the capacity program gets
    :data:`~blitzplan.live.exact.root_bounds.SHORT_PROBE_SHARE` of the time left after the
    slot bound (at least :data:`~blitzplan.live.exact.root_bounds.SHORT_PROBE_MIN_S`),
    and the slot bound's priced schedules are polished after it: where it ended, the best
    alone in the short call's polish share (the search gets the rest); where it was cut
    short, every one kept in :data:`~blitzplan.live.exact.root_bounds.SHORT_PRICED_SHARE`."""
    inst = _crowded(3)
    hint = schedule_live(inst, method="zigzag", old_order="free")
    args = {"objective": "mean_latency", "old_order": "free", "backend": "bnb"}
    start = start_point(inst, **args, time_limit_s=1.0, hint=hint, relax=False)
    given = _record_free_phases(monkeypatch, start)
    kept = [start.incumbent, start.incumbent]
    monkeypatch.setattr(priced, "priced_search", lambda *a, **k: kept)
    now = [0.0]  # root_bounds' clock, which times the capacity program
    monkeypatch.setattr(root_bounds, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    real_capacity = root_bounds.capacity_bound

    def capacity(*args: object, time_limit_s: float, **kwargs: object) -> float:
        now[0] += 0.1 * time_limit_s if ended else time_limit_s
        return real_capacity(*args, time_limit_s=time_limit_s, **kwargs)  # type: ignore[no-any-return]

    polished: list[tuple[int, float]] = []

    def polish_priced(start_: Start, schedules: list[object], **kwargs: float) -> None:
        polished.append((len(schedules), kwargs["polish_share"]))

    monkeypatch.setattr(root_bounds, "capacity_bound", capacity)
    monkeypatch.setattr(root_bounds, "polish_priced", polish_priced)
    report = root_bounds.strengthen(start, 0.5 * start.incumbent.objective)
    assert report.short and report.ended == ended
    assert [name for name, *_ in given] == ["polish", "capacity"]
    _, budget, left, _ = given[1]
    probe = max(root_bounds.SHORT_PROBE_SHARE * left, root_bounds.SHORT_PROBE_MIN_S)
    wanted = min(probe, root_bounds.FREE_CAPACITY_SHARE * left)
    assert budget == pytest.approx(wanted, rel=1e-2)
    if ended:
        assert polished == [(1, priced.POLISH_SHARE_OF_LIMIT)]
    else:
        assert polished == [(len(kept), root_bounds.SHORT_PRICED_SHARE)]


@pytest.mark.parametrize("time_left", [False, True])
def test_the_search_restarts_from_the_root_only_with_the_time_to_bound_it(
    monkeypatch: pytest.MonkeyPatch, time_left: bool
) -> None:
    """After the root bounds the search starts again from the root only when more time is
    left than bounding the root took; else it returns with the root bounds (a call of a
    second under a free order had spent its time there and ran 0.03-0.05 s past it)."""
    start = _start(None)
    restarts: list[bool] = []

    def strengthen(start_: Start, root_bound: float, offers: Offers) -> root_bounds.Strengthened:
        start_.raise_bound(root_bound + 1e-3 * abs(start_.incumbent.objective))
        if not time_left:
            start_.deadline_s = bnb.time.perf_counter()  # the root bounds took the time
        return root_bounds.Strengthened(ended=False, short=True)

    monkeypatch.setattr(bnb, "EARLY_SEARCH_MAX_S", 0.0)
    monkeypatch.setattr(bnb, "strengthen", strengthen)
    monkeypatch.setattr(bnb._Search, "restart", lambda self, ended=False: restarts.append(ended))
    search = bnb._Search(start)
    search.run()
    assert restarts == ([False] if time_left else [])
