"""plan(deadline_s=) is anytime (issue 19): the new instances the time left affords, at the
planning time recorded on the cluster, are planned; the rest are in ``missing``."""

from __future__ import annotations

import copy

from blitzplan import ClusterState, load_topology
from blitzplan.multicast.planning_rate import (
    DEADLINE_SHARE,
    affordable,
    planning_line,
    record_rate,
)
from blitzplan.scale import ScaleRequest, plan, validate_plan
from blitzplan.scale.realize import at_efficiency
from blitzplan.topologies.links import LINK_EFFICIENCY


def _fresh_topology(name: str):
    """A private copy of a catalog topology (its memo, where plans record their time, too)."""
    topology = copy.copy(load_topology(name))
    topology.memo = {}
    return topology


def test_affordable_follows_the_line_through_the_records() -> None:
    topology = _fresh_topology("h200-8")
    assert affordable(topology, 50, 1e-9) == 50  # nothing recorded: everything
    record_rate(topology, 10, 1.0)
    assert affordable(topology, 50, 1.0) == int(DEADLINE_SHARE / 0.1)
    record_rate(topology, 30, 2.0)  # the line: 0.5 s + 0.05 s per instance
    assert affordable(topology, 50, 1.0) == int((DEADLINE_SHARE - 0.5) / 0.05)
    record_rate(topology, 20, 1.5)
    record_rate(topology, 2, 40.0)  # one slow plan (a cold cache) moves the line little
    fixed, per = planning_line(topology.memo["planning_time"]["records"])
    assert 0.5 <= fixed <= 1.5 and 0.0 < per <= 0.05
    assert affordable(topology, 50, 0.1) == 0
    assert affordable(topology, 5, 100.0) == 5


def test_a_plan_of_no_instance_pins_the_intercept_so_an_estimate_does_not_stay_at_zero() -> None:
    """Three plans of 64 in 85 ms and one of 29 in 60 ms (a slow one) put the line's intercept
    near 40 ms: a 50 ms deadline affords at most one instance; the plan of none that follows
    records its 1 ms, and the line through it affords more again."""
    topology = _fresh_topology("h200-8")
    for n, seconds in [(64, 0.085), (64, 0.085), (64, 0.085), (29, 0.06)]:
        record_rate(topology, n, seconds)
    assert affordable(topology, 64, 0.05) <= 1
    record_rate(topology, 0, 0.001)
    assert affordable(topology, 64, 0.05) >= 10
    for _ in range(20):  # plans of none never push out the records of instances planned
        record_rate(topology, 0, 0.001)
    assert len(topology.memo["planning_time"]["records"]) == 4


def _busy() -> ClusterState:
    state = ClusterState(_fresh_topology("dgx-h100-64"), models=["llama-3-8b"])
    gpus = state.topology.gpus()
    for k in range(8):
        role = "prefill" if k < 4 else "decode"
        queue = [(-0.01 * i, 1024) for i in range(4)] if role == "prefill" else []
        state.add_instance("llama-3-8b", gpus=[gpus[k]], role=role, queue=queue)
    return state


def test_a_deadline_the_recorded_time_cannot_meet_plans_fewer_and_says_so() -> None:
    """Property: with a record of 0.05 s per instance, a 0.5 s deadline affords at most 8 of 20
    new instances; the plan is valid, live instances stay within those planned, and ``missing``
    and ``notes`` say how many were left out. Without a deadline all 20 are planned."""
    state = _busy()
    request = ScaleRequest("llama-3-8b", prefill=20, tp=1)
    derated = at_efficiency(state, dict(LINK_EFFICIENCY)).topology
    record_rate(derated, 10, 0.5)
    cut = plan(state, request, deadline_s=0.5)
    planned = len(cut.new_instances)
    assert planned <= int(0.5 * DEADLINE_SHARE / 0.05)
    assert any(m == f"deadline_s: {20 - planned} new instances not planned" for m in cut.missing)
    assert f"deadline_s: {planned} of 20 new instances planned" in cut.notes
    assert len(cut.multicast.live if cut.multicast else ()) <= planned
    assert validate_plan(state, cut) == ()
    assert len(plan(state, request).new_instances) == 20


def test_a_deadline_already_spent_plans_nothing_but_answers() -> None:
    state = _busy()
    request = ScaleRequest("llama-3-8b", prefill=6, tp=1)
    plan(state, request)  # records how long six took
    nothing = plan(state, request, deadline_s=1e-6)
    assert nothing.new_instances == () and nothing.steps == ()
    assert "deadline_s: +6 prefill not planned (too short)" in nothing.missing


def _recorded_line(state: ClusterState, per_instance_s: float, none_s: float) -> None:
    """Records on ``state``'s cluster: plans of 10 and 20 new instances at ``per_instance_s``
    each on top of ``none_s``, and a plan of none in ``none_s``."""
    derated = at_efficiency(state, dict(LINK_EFFICIENCY)).topology
    for n in (10, 20, 10, 20):
        record_rate(derated, n, none_s + per_instance_s * n)
    record_rate(derated, 0, none_s)


def test_a_deadline_shorter_than_the_cheapest_plan_plans_nothing_and_says_so() -> None:
    """The line says a plan of none takes 0.5 s here: a 0.1 s deadline gets a plan of nothing,
    not a pretended one: no new instance, step, role change or release; every requested change
    in ``missing``; a note that the deadline was too short; the old instances' own drain as
    the milestones."""
    from blitzplan.scale.milestones import solo_drain_s

    state = _busy()
    _recorded_line(state, 0.1, 0.5)
    request = ScaleRequest("llama-3-8b", prefill=6, decode=-1, tp=1)
    nothing = plan(state, request, deadline_s=0.1)
    assert (nothing.new_instances, nothing.steps, nothing.mutations, nothing.releases) == (
        (),
        (),
        (),
        (),
    )
    assert nothing.multicast is None and nothing.live_pairs == ()
    assert nothing.missing == ("deadline_s: +6 prefill, -1 decode not planned (too short)",)
    assert any(
        "0.1 s is too short for any plan" in n and "500.0 ms + 100.00 ms per new instance" in n
        for n in nothing.notes
    )
    queued = [i for i in state.instances if i.queue]
    drains = [solo_drain_s(state, nothing.spec, i, list(i.queue), None) for i in queued]
    assert nothing.milestones.queue_drain_s == max(drains) > 0
    assert nothing.milestones.full_capacity_s == 0.0
    assert nothing.request == {"prefill": 6, "decode": -1, "tp": 1}


def test_a_deadline_that_affords_one_instance_plans() -> None:
    """The same line with a deadline that affords a few instances plans some (not the
    too-short plan); a cluster with no record plans everything under a deadline its clock
    allows."""
    state = _busy()
    _recorded_line(state, 0.1, 0.5)
    request = ScaleRequest("llama-3-8b", prefill=6, tp=1)
    some = plan(state, request, deadline_s=1.0)
    assert 1 <= len(some.new_instances) <= 3
    assert not any("too short" in n for n in some.notes)
    fresh = _busy()
    assert len(plan(fresh, request, deadline_s=60.0).new_instances) == 6
