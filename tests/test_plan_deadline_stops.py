"""What a deadline's clock cannot stop is kept out of a call under ``deadline_s`` (issue 19):
the work before the first checkpoint (answered at once when recent calls spent longer there
than the deadline leaves), the relaxation's bound beside a live pair's schedule (up to 0.25 s
per distinct pair), the next pair once the longest one so far no longer fits, and the garbage
collector. No wall-clock is asserted: the records and clocks are set."""

from __future__ import annotations

import gc
import time

import pytest

from blitzplan.multicast.planning_rate import BACKOFF, layout_cost, record_layout, record_rate
from blitzplan.scale import ScaleRequest, plan, validate_plan
from blitzplan.scale.deadline import collect_due, due_generation
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import at_efficiency
from blitzplan.topologies.links import LINK_EFFICIENCY
from tests.test_plan_deadline import _busy, _fresh_topology


def test_layout_cost_is_the_least_recent_record() -> None:
    topology = _fresh_topology("h200-8")
    assert layout_cost(topology) is None
    for seconds in (0.004, 0.002, 0.003, float("nan"), -1.0):
        record_layout(topology, seconds)
    assert layout_cost(topology) == 0.002


def test_a_call_reaching_its_first_checkpoint_records_what_it_spent_before() -> None:
    state = _busy()
    out = plan(state, ScaleRequest("llama-3-8b", prefill=3, tp=1), deadline_s=60.0)
    assert len(out.new_instances) == 3
    derated = at_efficiency(state, dict(LINK_EFFICIENCY)).topology
    layouts = derated.memo["planning_time"]["layout"]
    assert len(layouts) == 1 and layouts[0] > 0


def test_a_deadline_shorter_than_the_work_before_the_first_checkpoint_answers_at_once() -> None:
    """Recent calls spent 10 s of CPU before their first checkpoint: a 1 s deadline gets the
    plan of nothing at once (valid, every change in ``missing``, the note says why), with no
    multicast laid out; a 60 s one plans."""
    state = _busy()
    derated = at_efficiency(state, dict(LINK_EFFICIENCY)).topology
    record_layout(derated, 10.0)
    request = ScaleRequest("llama-3-8b", prefill=4, decode=-1, tp=1)
    out = plan(state, request, deadline_s=1.0)
    assert out.new_instances == () and out.multicast is None and out.steps == ()
    assert out.mutations == () and out.releases == ()
    assert validate_plan(state, out) == ()
    assert out.missing == ("deadline_s: +4 prefill, -1 decode not planned (too short)",)
    assert len(out.notes) == 1
    assert out.notes[0].startswith("deadline_s: 1 s is too short for any plan on this cluster")
    assert "10000.0 ms of CPU time before their first checkpoint" in out.notes[0]
    assert derated.memo["planning_time"]["layout"] == [10.0]  # nothing laid out, nothing added
    assert len(plan(state, request, deadline_s=60.0).new_instances) == 4


def test_live_pairs_under_a_deadline_carry_no_relaxation_bound() -> None:
    """The same live pairs with and without a deadline: the same schedules; without one the
    relaxation's bound is beside each, under one (its time is not on the deadline's clock)
    the bound is only what the policy itself proved."""
    request = ScaleRequest("llama-3-8b", prefill=2, tp=1)
    free = plan(_busy(), request)
    bounded = plan(_busy(), request, deadline_s=60.0)
    assert free.live_pairs and len(bounded.live_pairs) == len(free.live_pairs)
    for a, b in zip(free.live_pairs, bounded.live_pairs, strict=True):
        assert b.schedule.objective == a.schedule.objective
        assert a.schedule.bound is not None
        assert b.schedule.bound is None or b.schedule.bound <= a.schedule.bound


def test_passed_reserves_the_next_step_s_time() -> None:
    """A call begun 0.5 s ago under a 100 s deadline: not passed, but a next step of 200 s
    would pass it; without a deadline nothing passes."""
    began = time.monotonic() - 0.5
    run = Planning(PlanOptions(deadline_s=100.0), None, began, time.thread_time())
    assert not run.passed() and not run.passed(None, 1.0)
    assert run.passed(None, 200.0)
    assert not Planning(PlanOptions(), None, began, time.thread_time()).passed(None, 1e9)


def test_a_call_under_a_deadline_leaves_the_collector_as_it_found_it() -> None:
    request = ScaleRequest("llama-3-8b", prefill=2, tp=1)
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            plan(_busy(), request, deadline_s=60.0)
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_every_backoff_th_call_the_line_refuses_plans_anyway() -> None:
    """A line whose intercept (100 s per plan) refuses a 1 s deadline: BACKOFF - 1 calls get
    the plan of nothing at once, the next one plans under its checkpoints (here nothing fits
    either: its multicast affords none and it records what it cost, which pins the line)."""
    state = _busy()
    derated = at_efficiency(state, dict(LINK_EFFICIENCY)).topology
    record_rate(derated, 10, 100.0)
    request = ScaleRequest("llama-3-8b", prefill=4, tp=1)
    for _ in range(BACKOFF - 1):
        out = plan(state, request, deadline_s=1.0)
        assert out.missing == ("deadline_s: +4 prefill not planned (too short)",)
        assert "none" not in derated.memo["planning_time"]
    tried = plan(state, request, deadline_s=1.0)
    assert tried.new_instances == () and validate_plan(state, tried) == ()
    assert "deadline_s: 0 of 4 new instances planned" in tried.notes
    assert derated.memo["planning_time"]["none"] > 0


def test_the_collection_a_call_makes_due_runs_inside_it_when_the_deadline_affords_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the youngest generation's threshold at 10 allocations every plan makes a
    collection due: under an hour's deadline it runs before plan() returns (the count is back
    under the threshold); without a deadline plan() runs none itself. A due pass whose cost the
    time left does not afford (the call's clock at its deadline) is left for the caller's next
    allocation; with time left it runs, and a run with no deadline runs none."""
    before = gc.get_threshold()
    ran: list[int] = []
    real = gc.collect
    monkeypatch.setattr(
        gc, "collect", lambda generation=2: ran.append(generation) or real(generation)
    )
    request = ScaleRequest("llama-3-8b", prefill=2, tp=1)
    try:
        gc.set_threshold(10, 10, 10)
        out = plan(_busy(), request, deadline_s=3600.0)
        assert len(out.new_instances) == 2 and len(ran) == 1 and gc.get_count()[0] <= 10
        plan(_busy(), request)
        assert len(ran) == 1
        gc.disable()  # no pass of its own while the due one is asked about
        try:
            kept = [{k} for k in range(200)]  # 200 tracked sets (no free list): a pass is due
            assert due_generation() is not None and len(kept) == 200
            run = Planning(PlanOptions(deadline_s=1.0), None, time.monotonic(), time.thread_time())
            monkeypatch.setattr(Planning, "used", lambda self: 1.0)
            collect_due(run)
            assert len(ran) == 1
            collect_due(Planning(PlanOptions(), None, time.monotonic(), time.thread_time()))
            assert len(ran) == 1
            monkeypatch.setattr(Planning, "used", lambda self: 0.0)
            collect_due(run)
            assert len(ran) == 2 and due_generation() is None
        finally:
            gc.enable()
    finally:
        gc.set_threshold(*before)
