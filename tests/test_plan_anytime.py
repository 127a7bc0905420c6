"""plan(deadline_s=) stops where the time left no longer affords every new instance (issue 19):
the multicast's checkpoint plans fewer, the plan is valid and ``missing`` lists the rest; the
planning line is fitted on CPU time and the load measured beside it; past the point where only
the cheapest answer still fits, the checkpoints in the greedy and the program stop the call and
it answers with the plan of nothing; without a deadline nothing of this touches the plan."""

from __future__ import annotations

import pytest

from blitzplan.multicast import plan_multicast, validate_multicast
from blitzplan.multicast.planning_rate import (
    ANSWER_S,
    DEADLINE_SHARE,
    RECUTS,
    DeadlinePassed,
    TooSlow,
    afford_now,
    affordable,
    answer_cost,
    planning_costs,
    recent_load,
    record_answer,
    record_rate,
    recut_share,
    stop_at,
)
from blitzplan.scale import ScaleRequest, plan, validate_plan
from blitzplan.scale import planning as planning_module
from blitzplan.scale import realize as realize_module
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import at_efficiency
from blitzplan.topologies.links import LINK_EFFICIENCY
from tests.test_plan_deadline import _busy, _fresh_topology


def test_afford_now_keeps_what_fits_and_else_plans_afresh_what_the_load_allows() -> None:
    """Hand-computed: a line of 10 ms + 1 ms per instance of CPU time, a 1 s deadline (0.8 s
    of it to fill)."""
    topology = _fresh_topology("h200-8")
    assert afford_now(topology, 500, 1.0, 0.5, 0.5) == 500  # nothing recorded: everything
    for n in (100, 200):
        record_rate(topology, n, 0.010 + 0.001 * n, 0.010 + 0.001 * n)
    assert planning_costs(topology) == pytest.approx((0.010, 0.001))
    # 0.1 s spent at load 1: the rest of 500 (0.41 s) fits in 0.7 s
    assert afford_now(topology, 500, 1.0, 0.1, 0.1) == 500
    # the same CPU time took 0.3 s (load 3): the rest, 1.23 s, does not; afresh, 0.5 s at load
    # 3 is 0.1667 s of CPU: (0.1667 - 0.010) / 0.001 = 156 instances
    assert afford_now(topology, 500, 1.0, 0.3, 0.1) == 156
    # below MEASURED_CPU_S of CPU time the recorded load (1) stands
    assert afford_now(topology, 500, 1.0, 0.79, 0.001) == 0
    assert afford_now(topology, 20, 0.05, 0.0, 0.0) == 20


def test_the_load_is_wall_clock_per_cpu_second_and_slows_the_estimate() -> None:
    topology = _fresh_topology("h200-8")
    record_rate(topology, 10, 0.1, 0.3)
    record_rate(topology, 30, 0.2, 0.6)
    assert recent_load(topology) == pytest.approx(3.0)
    fixed, per = planning_costs(topology) or (0.0, 0.0)
    assert affordable(topology, 100, 1.0, 0.0, recent_load(topology)) == int(
        (DEADLINE_SHARE - 3 * fixed) / (3 * per)
    )
    record_rate(topology, 10, 0.4, 0.4)  # a slower record of a size recorded: the fastest counts
    assert planning_costs(topology) == pytest.approx((fixed, per))


def test_plan_multicast_plans_the_first_instances_the_checkpoint_affords() -> None:
    state = _busy()
    asked: list[int] = []

    def afford(n: int) -> int:
        asked.append(n)
        return 5

    names = [f"n{k}" for k in range(20)]
    cut = plan_multicast(state, "llama-3-8b", count=20, live=4, names=names, afford=afford)
    alone = plan_multicast(state, "llama-3-8b", count=5, live=4, names=names[:5])
    assert asked == [20]
    assert [i.name for i in cut.instances] == names[:5] and len(cut.live) == 4
    assert validate_multicast(state, cut) == ()
    assert cut.instances == alone.instances and cut.ready_at_s == alone.ready_at_s
    one = plan_multicast(state, "llama-3-8b", count=20, afford=lambda n: 0)
    assert len(one.instances) == 1  # the problem is laid out: at least one instance


def test_a_deadline_checkpoint_that_affords_few_gives_a_valid_plan_listing_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A mid-size request (+40 on 64 GPUs, 4 of them live) whose checkpoint finds the time left
    affords 6: six new instances, every live tail among them paired, a plan the validator
    passes, and ``missing`` and ``notes`` name the 34 left out."""
    state = _busy()
    request = ScaleRequest("llama-3-8b", prefill=40, tp=1)
    seen: list[int] = []

    def afford(topology: object, count: int, *clocks: float) -> int:
        seen.append(count)
        return 6

    monkeypatch.setattr(realize_module, "afford_now", afford)
    cut = plan(state, request, deadline_s=60.0)  # nothing recorded: the start affords all 40
    assert seen == [40]
    assert len(cut.new_instances) == 6 and cut.multicast is not None
    assert validate_plan(state, cut) == ()
    assert "deadline_s: 34 new instances not planned" in cut.missing
    assert "deadline_s: 6 of 40 new instances planned" in cut.notes
    assert len(cut.live_pairs) == len(cut.multicast.live) == 4
    names = {i.name for i in cut.new_instances}
    assert {s.instance for s in cut.steps} - {None} == names


def test_without_a_deadline_the_records_never_touch_the_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same request on a cluster with no planning record and on one whose records say a
    plan takes an hour gives the same plan (the same plan_id); no checkpoint is asked."""
    request = ScaleRequest("llama-3-8b", prefill=12, decode=2, tp=1)
    fresh = plan(_busy(), request, refine_budget=None)
    slow = _busy()
    derated = at_efficiency(slow, dict(LINK_EFFICIENCY)).topology
    for n in (1, 5, 30):
        record_rate(derated, n, 3600.0 * n, 7200.0 * n)

    def never(*args: object) -> int:
        raise AssertionError("a checkpoint was asked without a deadline")

    monkeypatch.setattr(realize_module, "afford_now", never)
    monkeypatch.setattr(realize_module, "affordable", never)
    monkeypatch.setattr(planning_module, "stop_at", never)
    again = plan(slow, request, refine_budget=None)
    assert again.plan_id == fresh.plan_id and len(again.new_instances) == 14
    assert again.missing == ()


def test_stop_at_keeps_the_cheapest_answer_s_time_at_the_recent_load() -> None:
    """Hand-computed: before any answer is measured it costs ANSWER_S; then the median of the
    recent ones, times the recent load."""
    topology = _fresh_topology("h200-8")
    assert answer_cost(topology) == ANSWER_S
    assert stop_at(topology, 0.05) == pytest.approx(0.05 - ANSWER_S)
    for seconds in (0.002, 0.004, 0.003):
        record_answer(topology, seconds)
    record_rate(topology, 10, 0.1, 0.2)  # load 2
    assert answer_cost(topology) == pytest.approx(0.003)
    assert stop_at(topology, 0.05) == pytest.approx(0.05 - 2 * 0.003)


STAGES = (
    "layout",
    "problem",
    "ports",
    "context",
    "fluid",
    "allocating",
    "allocation",
    "lanes",
    "paces",
    "pacing",
    "evaluation",
    "sharing",
    "rates",
    "timing",
    "timeline",
    "evaluated",
    "programming",
    "program",
    "programmed",
)


@pytest.mark.parametrize("stage", STAGES)
def test_a_checkpoint_that_finds_the_time_out_answers_with_the_plan_of_nothing(
    monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """A checkpoint whose clock says the time is out at ``stage`` (injected: every stage is
    reached in this order, the earlier ones pass): the call returns the plan of nothing, valid,
    every requested change in ``missing``, a note naming the checkpoint; the attempt (12 new
    instances) is recorded on the cluster, and so is the answer's own time."""
    state = _busy()
    reached: list[str] = []

    def checkpoint(
        self: Planning, topology: object, recut: bool = True, sizes: object = ()
    ) -> object:
        def check(at: str) -> None:
            if not reached or reached[-1] != at:
                reached.append(at)
            if at == stage:
                raise DeadlinePassed(at)

        return check

    monkeypatch.setattr(Planning, "checkpoint", checkpoint)
    request = ScaleRequest("llama-3-8b", prefill=12, tp=1)
    out = plan(state, request, deadline_s=60.0)
    assert reached == list(STAGES[: reached.index(stage) + 1])
    assert reached[-1] == stage
    assert out.new_instances == () and out.steps == () and out.multicast is None
    assert validate_plan(state, out) == ()
    assert out.missing == ("deadline_s: +12 prefill not planned (out of time)",)
    assert any(
        f"ran out while planning ({stage} checkpoint" in n and n.endswith("nothing was planned")
        for n in out.notes
    )
    book = at_efficiency(state, dict(LINK_EFFICIENCY)).topology.memo["planning_time"]
    assert [n for n, _ in book["records"]] == [12] and len(book["answer"]) == 1


def test_a_deadline_no_longer_than_the_cheapest_answer_is_answered_before_any_work() -> None:
    """A cluster with no record plans under any deadline its clock can bound, but 1 ns is less
    than the cheapest answer takes (ANSWER_S before one is measured): the plan of nothing at
    once, before any role change or layout (nothing recorded), the note says why."""
    state = _busy()
    out = plan(state, ScaleRequest("llama-3-8b", prefill=6, decode=-1, tp=1), deadline_s=1e-9)
    assert out.new_instances == () and out.mutations == () and out.releases == ()
    assert out.missing == ("deadline_s: +6 prefill, -1 decode not planned (too short)",)
    assert "(the cheapest answer takes 1.0 ms of CPU time" in out.notes[0]
    book = at_efficiency(state, dict(LINK_EFFICIENCY)).topology.memo.get("planning_time", {})
    assert "layout" not in book and "records" not in book


def test_checkpoints_that_never_fire_leave_the_plan_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same request under an hour's deadline, its checkpoints live (and called: counted),
    then switched off: the same plan (the same plan_id)."""
    request = ScaleRequest("llama-3-8b", prefill=10, tp=1)
    calls: list[str] = []
    live_checkpoint = Planning.checkpoint

    def counted(self: Planning, topology: object, recut: bool = True, sizes: object = ()) -> object:
        check = live_checkpoint(self, topology, recut=recut)
        assert check is not None

        def counting(stage: str) -> None:
            calls.append(stage)
            check(stage)

        return counting

    monkeypatch.setattr(Planning, "checkpoint", counted)
    timed = plan(_busy(), request, deadline_s=3600.0)
    monkeypatch.setattr(Planning, "checkpoint", lambda self, topology, recut=True, sizes=(): None)
    free = plan(_busy(), request, deadline_s=3600.0)
    assert len(calls) > len(STAGES) and set(calls) == set(STAGES)
    assert timed.plan_id == free.plan_id and len(timed.new_instances) == 10
    assert validate_plan(_busy(), timed) == ()


def test_recut_share_is_the_time_left_over_the_projected_work() -> None:
    """Hand-computed: work begun at 10 ms, a quarter done at 30 ms, so 80 ms in all: it ends
    at 90 ms, within a 100 ms limit (None); with a 50 ms limit, 0.8 of the 20 ms left less a
    10 ms layout is 6 ms of the 80: 7.5 % of the instances."""
    assert recut_share(0.010, 0.030, 0.25, 0.100, 0.010) is None
    assert recut_share(0.010, 0.030, 0.25, 0.050, 0.010) == pytest.approx(0.075)
    assert recut_share(0.010, 0.030, 0.25, 0.035, 0.010) == 0.0


@pytest.mark.parametrize(("share", "planned"), [(0.5, 12 // 2**RECUTS), (0.05, 0)])
def test_a_call_too_slow_at_an_early_checkpoint_plans_afresh_the_share_it_affords(
    monkeypatch: pytest.MonkeyPatch, share: float, planned: int
) -> None:
    """Every attempt's checkpoint that may recut finds the call too slow at ``paces``
    (injected) with ``share`` of its instances affordable: half of 12, then half of that, each
    recut noted, until the last attempt (RECUTS recuts in, its checkpoints stop rather than
    recut) gives a valid plan, the rest in ``missing``; 5 % (none) gives the plan of nothing at
    once."""
    state = _busy()
    attempts: list[bool] = []

    def checkpoint(
        self: Planning, topology: object, recut: bool = True, sizes: object = ()
    ) -> object:
        attempts.append(recut)

        def check(at: str) -> None:
            if recut and at == "paces":
                raise TooSlow(at, share)

        return check

    monkeypatch.setattr(Planning, "checkpoint", checkpoint)
    out = plan(state, ScaleRequest("llama-3-8b", prefill=12, tp=1), deadline_s=60.0)
    assert len(out.new_instances) == planned
    assert validate_plan(state, out) == ()
    if planned:
        assert attempts == [True] * RECUTS + [False]
        assert f"deadline_s: {12 - planned} new instances not planned" in out.missing
        recuts = [n for n in out.notes if "new instances ran slower than recorded" in n]
        assert [n.split(" new instances")[0] for n in recuts] == [
            f"deadline_s: a plan of {12 // 2**k}" for k in range(RECUTS)
        ]
        assert len(out.steps) > 0 and out.multicast is not None
    else:
        assert attempts == [True]
        assert out.missing == ("deadline_s: +12 prefill not planned (out of time)",)


def test_pairing_stops_at_the_checkpoints_point_and_keeps_the_plan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pairing asks whether the call has reached the checkpoints' stop point on the cluster
    (injected: it has): the live tails load without a pair, the plan stays valid and says so."""
    state = _busy()
    asked: list[object] = []

    def passed(self: Planning, topology: object = None, ahead_s: float = 0.0) -> bool:
        asked.append(topology)
        return topology is not None

    monkeypatch.setattr(Planning, "passed", passed)
    out = plan(state, ScaleRequest("llama-3-8b", prefill=12, tp=1), deadline_s=60.0)
    assert asked and all(t is not None for t in asked)
    assert out.live_pairs == () and len(out.new_instances) == 12
    live = len(out.multicast.live) if out.multicast else 0
    assert live > 0
    assert (
        f"deadline_s: {live} live instances left without a pair (they load, but help no queue)"
        in out.notes
    )
    assert validate_plan(state, out) == ()
