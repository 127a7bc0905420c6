"""What a call under ``deadline_s`` returns when its checkpoints stop it (issue 19, anytime):
the best plan found so far, valid and complete in what it plans, the rest in ``missing``.

A stop before a multicast plan is timed keeps the changes that move no weights (in-place
rebalances, releases); a call found too slow once its greedy plan is timed (or at the transfer
program's first step) plans afresh the share the time left affords; a retry is not made when
the recorded plan of none does not fit; the late recut is asked once per stage; and a loop's
checkpoint stops before a step that cannot end in time. Clocks and
checkpoints are injected: nothing here is timed."""

from __future__ import annotations

import time

import pytest

from blitzplan.multicast.planning_rate import RECUTS, DeadlinePassed, TooSlow, record_rate
from blitzplan.scale import ScalePlan, ScaleRequest, plan, validate_plan
from blitzplan.scale import planning as planning_module
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import at_efficiency
from blitzplan.topologies.links import LINK_EFFICIENCY
from tests.clocks import StillClock
from tests.program_check import check_program
from tests.test_plan_deadline import _busy, _fresh_topology


def _stopping_at(monkeypatch: pytest.MonkeyPatch, stage: str) -> None:
    """Every checkpoint of the calls that follow finds the time out at ``stage``."""

    def checkpoint(
        self: Planning, topology: object, recut: bool = True, sizes: object = ()
    ) -> object:
        def check(at: str) -> None:
            if at == stage:
                raise DeadlinePassed(at)

        return check

    monkeypatch.setattr(Planning, "checkpoint", checkpoint)


def _round_trip(state: object, out: ScalePlan) -> None:
    """``out`` is valid: the multicast validator, the independent byte certificate of its
    program and ``from_json``'s program checks pass, the document reads back the same."""
    assert validate_plan(state, out) == ()  # type: ignore[arg-type]
    assert check_program(out) == []
    again = ScalePlan.from_json(out.to_json())
    assert again.plan_id == out.plan_id and again.steps == out.steps


@pytest.mark.parametrize("stage", ["layout", "lanes", "evaluated", "program"])
def test_a_stop_keeps_the_rebalance_in_place_and_lists_the_loads(
    monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """``prefill=-1, decode=3`` on 4 prefill + 4 decode: one prefill instance changes role in
    place (no weights), two more would mutate with a new prefill instance loaded for each.
    Stopped at ``stage``: the rebalance is planned (its queue moved to a serving prefill
    instance), the two mutations and their loads are not (``missing``: +2 decode), no step."""
    state = _busy()
    _stopping_at(monkeypatch, stage)
    out = plan(state, ScaleRequest("llama-3-8b", prefill=-1, decode=3, tp=1), deadline_s=60.0)
    assert out.new_instances == () and out.steps == () and out.multicast is None
    assert len(out.mutations) == 1 and out.mutations[0].replaced_by is None
    assert out.releases == ()
    assert out.missing == ("deadline_s: +2 decode not planned (out of time)",)
    assert any(
        f"ran out while planning ({stage} checkpoint" in n
        and "planned only 1 role changes in place, 0 releases (they move" in n
        for n in out.notes
    )
    moved = {target for _, target in out.mutations[0].moved}
    serving = {i.id for i in state.instances if i.role.value == "prefill"}
    assert moved and moved <= serving - {out.mutations[0].instance}
    _round_trip(state, out)


def test_a_stop_keeps_the_releases_of_a_mixed_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """``prefill=4, decode=-2`` stopped in the greedy: the two decode instances with the least
    KV in use drain and are released (as without a deadline), the four new prefill instances
    are ``missing``; removing more than serve lists that shortfall, not as out of time."""
    state = _busy()
    request = ScaleRequest("llama-3-8b", prefill=4, decode=-2, tp=1)
    free = plan(_busy(), request)
    _stopping_at(monkeypatch, "allocation")
    out = plan(state, request, deadline_s=60.0)
    assert [r.instance for r in out.releases] == [r.instance for r in free.releases]
    assert len(out.releases) == 2 and out.new_instances == ()
    assert out.missing == ("deadline_s: +4 prefill not planned (out of time)",)
    fresh = _busy()  # a cluster with no stop recorded: no backoff
    short = plan(fresh, ScaleRequest("llama-3-8b", prefill=2, decode=-6, tp=1), deadline_s=60.0)
    assert len(short.releases) == 4 and short.missing == (  # 4 decode instances serve
        "asked to remove 6 decode instances, only 4 serve",
        "deadline_s: +2 prefill not planned (out of time)",
    )
    assert any(
        n.endswith("planned only 0 role changes in place, 2 releases (they move no weights)")
        for n in out.notes
    )
    _round_trip(state, out)


@pytest.mark.parametrize("stage", ["allocation", "paces", "evaluated", "program"])
def test_a_call_too_slow_at_a_late_checkpoint_plans_afresh_a_valid_share(
    monkeypatch: pytest.MonkeyPatch, stage: str
) -> None:
    """Found too slow at ``stage`` (injected in the first attempt, half of its 12 instances
    affordable), up to the transfer program's first step: a plan of 6 planned afresh (its
    checkpoints could recut again), its program delivering every byte of each of them (the
    byte certificate), the other 6 in ``missing``."""
    state = _busy()
    attempts: list[bool] = []

    def checkpoint(
        self: Planning, topology: object, recut: bool = True, sizes: object = ()
    ) -> object:
        attempts.append(recut)
        first = len(attempts) == 1

        def check(at: str) -> None:
            if first and at == stage:
                raise TooSlow(at, 0.5)

        return check

    monkeypatch.setattr(Planning, "checkpoint", checkpoint)
    began = time.thread_time()
    out = plan(state, ScaleRequest("llama-3-8b", prefill=12, tp=1), deadline_s=60.0)
    call_s = time.thread_time() - began
    assert attempts == [True, RECUTS > 1] and len(out.new_instances) == 6
    assert "deadline_s: 6 new instances not planned" in out.missing
    assert any(
        f"a plan of 12 new instances ran slower than recorded ({stage}" in n for n in out.notes
    )
    assert {s.instance for s in out.steps} - {None} == {i.name for i in out.new_instances}
    _round_trip(state, out)
    book = at_efficiency(state, dict(LINK_EFFICIENCY)).topology.memo["planning_time"]
    (tried, given_up), (planned, own) = book["records"]  # each attempt records its own time
    assert (tried, planned) == (12, 6) and given_up > 0 and 0 < own <= call_s - given_up


def test_the_late_recut_is_asked_at_a_stage_s_first_checkpoint_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1 s deadline (the stop point 1 s less the cheapest answer, 1 ms): the greedy begins
    at 10 ms; at the program's first step, 0.5 s in, the work (0.49 s for 58 %, a plan of 64)
    ends by 0.86 s: no recut. Later steps of the program, 10 ms apart, are further along than
    58 %: no recut up to 0.98 s, though 58 % would project past the deadline; at 0.99 s a step
    as long as the last would end past the stop point: the call stops there (not a recut).
    Reached first at 0.8 s, the program's first step projects past the stop point: a recut;
    without a recut left the call goes on there (only its clock stops it). Once the program
    is built, the rest but the pairs (12 % of the 0.84 s of work at 0.85 s: 0.95 s) ends by
    the stop point: it goes on; reached first at 0.9 s (1.007 s) it stops."""
    clock = StillClock()
    monkeypatch.setattr(planning_module, "time", clock)
    run = Planning(PlanOptions(deadline_s=1.0), None, clock.now, clock.now)
    check = run.checkpoint(_fresh_topology("h200-8"))
    assert check is not None
    clock.now = 100.01
    check("problem")
    for ms in range(500, 990, 10):
        clock.now = 100.0 + ms / 1e3
        check("program")
    clock.now = 100.0 + 0.99
    with pytest.raises(DeadlinePassed) as stopped:
        check("program")
    assert not isinstance(stopped.value, TooSlow)
    for recut, raised in [(True, TooSlow), (False, DeadlinePassed)]:
        fresh = run.checkpoint(_fresh_topology("h200-8"), recut=recut)
        assert fresh is not None
        clock.now = 100.0 + 0.01
        fresh("problem")
        clock.now = 100.0 + 0.8  # first reached at 0.8 s: 1.36 s of work, past the deadline
        if not recut:
            fresh("program")  # the last attempt does not project
            clock.now = 100.0 + 0.85
            fresh("programmed")
            fresh = run.checkpoint(_fresh_topology("h200-8"), recut=recut)
            assert fresh is not None
            clock.now = 100.0 + 0.01
            fresh("problem")
            clock.now = 100.0 + 0.9
        with pytest.raises(raised) as found:
            fresh("program" if recut else "programmed")
        assert isinstance(found.value, TooSlow) == recut


def test_a_loop_s_checkpoint_stops_before_a_step_that_cannot_end_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 1 s deadline: a loop's checkpoint (``lanes``, per target node) reached at 0.3 s and
    0.6 s passes (the next step, 0.3 s long as the last, ends by 0.9 s); at 0.7 s the next
    (0.1 s) would end at 0.8 s: it passes; another stage between does not count; at 0.95 s,
    0.25 s after its last, the next would end at 1.2 s, past the stop point (0.999 s): the
    loop stops there, though the stop point is not reached."""
    clock = StillClock()
    monkeypatch.setattr(planning_module, "time", clock)
    run = Planning(PlanOptions(deadline_s=1.0), None, clock.now, clock.now)
    check = run.checkpoint(_fresh_topology("h200-8"))
    assert check is not None
    for at in (0.3, 0.6, 0.7):
        clock.now = 100.0 + at
        check("lanes")
    clock.now = 100.0 + 0.75
    check("other")  # another stage's first step: nothing to go by
    clock.now = 100.0 + 0.95  # the lanes' last step took 0.25 s: the next ends at 1.2 s
    with pytest.raises(DeadlinePassed) as stopped:
        check("lanes")
    assert stopped.value.stage == "lanes"


def test_no_retry_when_the_recorded_plan_of_none_does_not_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A line that refuses 1 s retries every BACKOFF-th call (test_plan_deadline_stops); once a
    plan of none is recorded at 2 s of CPU, no retry fits in 1 s: every call answers at once
    (no checkpoint made)."""
    state = _busy()
    derated = at_efficiency(state, dict(LINK_EFFICIENCY)).topology
    record_rate(derated, 10, 100.0)
    record_rate(derated, 0, 2.0)
    made: list[object] = []
    monkeypatch.setattr(Planning, "checkpoint", lambda self, *a, **k: made.append(a))
    request = ScaleRequest("llama-3-8b", prefill=4, tp=1)
    for _ in range(8):
        out = plan(state, request, deadline_s=1.0)
        assert out.missing == ("deadline_s: +4 prefill not planned (too short)",)
    assert made == [] and derated.memo["planning_time"]["none"] == 2.0
