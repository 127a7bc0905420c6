"""Overlapping plans that know each other: loading records say what they depend on, a replan
never streams from an instance its earlier plan can no longer finish, and an earlier plan's
running steps are background flows only until they end."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from blitzplan import ClusterState, InfeasibleError, InvalidInputError, Loading, Role, load_topology
from blitzplan.multicast import plan_multicast, validate_multicast
from blitzplan.scale import (
    ScalePlan,
    ScaleRequest,
    apply_plan,
    plan,
    recover,
    replan,
    validate_plan,
)
from blitzplan.scale.realize import at_efficiency
from blitzplan.topologies import Flow
from tests.fault_campaign import SCENARIOS
from tests.overlap_campaign import random_overlap, run_overlap
from tests.program_check import check_program

MODEL = "llama-3-8b"


def _chained() -> tuple[ClusterState, ScalePlan, float, ClusterState, ScalePlan]:
    """The issue's reproducer: two decode instances load from the host copy on h0 and, 30% in,
    four prefill instances are asked for (they stream from the loading ones)."""
    st0 = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    assert st0.pool.host_copies[0].node == "h0/mem"
    p1 = plan(st0, ScaleRequest(MODEL, decode=2, tp=1))
    t1 = 0.3 * p1.milestones.full_capacity_s
    st1 = apply_plan(st0, p1, at_s=t1)
    p2 = plan(st1, ScaleRequest(MODEL, prefill=4))
    return st0, p1, t1, st1, p2


def _loading_sources(scale: ScalePlan) -> set[str]:
    return {s.source for s in scale.steps if s.holder == "loading"}


def test_issue_18_a_replan_never_streams_from_instances_that_cannot_finish() -> None:
    st0, p1, t1, st1, p2 = _chained()
    assert _loading_sources(p2) == {"h0/gpu0", "h0/gpu1"}
    at2 = 0.2 * p2.milestones.full_capacity_s
    with pytest.raises(InfeasibleError, match="new0 cannot be finished"):
        replan(p1, st0, at_s=t1 + at2, failed=["h0/mem"])  # the earlier plan: lost
    recovery = recover(p2, st1, at_s=at2, failed=["h0/mem"])
    assert recovery.stale == (
        "new0, loading under an earlier plan, is no source: its plan needs h0/mem; that plan "
        "needs a replan too",
        "new1, loading under an earlier plan, is no source: its plan needs h0/mem, new0; that "
        "plan needs a replan too",
    )
    assert all(i.loading is None for i in recovery.state.instances)
    with pytest.raises(InfeasibleError) as refused:  # nothing else holds the model
        replan(p2, st1, at_s=at2, failed=["h0/mem"])
    message = str(refused.value)
    assert all(f"new{k} cannot be finished" in message for k in range(2, 6))
    assert "new0, loading under an earlier plan, is no source" in message


def test_a_loading_record_says_what_its_arrivals_need() -> None:
    _, p1, _, st1, _ = _chained()
    record = st1.instance("new1").loading
    assert record is not None and record.needs is not None
    assert "h0/mem" in record.needs  # read from the host copy
    routes = {e for s in p1.steps if s.end_s > 0 for e in p1.multicast.flows[s.id].edges}
    assert record.edges and record.edges <= routes
    assert record.advanced(0.01).needs == record.needs  # moving on keeps what it needs
    with pytest.raises(InvalidInputError, match="loading.needs must be"):
        Loading(Role.DECODE, (1.0,), needs="h0/mem")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="loading.edges must be"):
        Loading(Role.DECODE, (1.0,), needs=frozenset(), edges=frozenset({"ab"}))  # type: ignore[arg-type]


def test_a_failure_elsewhere_keeps_the_record_an_unknown_one_does_not() -> None:
    _, _, _, st1, p2 = _chained()
    at2 = 0.2 * p2.milestones.full_capacity_s
    far = "h3/nic7"  # on no route of the first plan
    assert all(
        far not in {u for e in i.loading.edges for u in e}
        for i in st1.instances
        if i.loading is not None
    )
    after = replan(p2, st1, at_s=at2, failed=[far])
    assert recover(p2, st1, at_s=at2, failed=[far]).stale == ()
    assert _loading_sources(after) and not after.notes
    assert validate_plan(recover(p2, st1, at_s=at2, failed=[far]).state, after) == ()
    unknown = st1.copy()  # the same records without what they need (e.g. from a state file)
    for inst in unknown.instances:
        if inst.loading is not None:
            bare = Loading(inst.loading.role, inst.loading.units_ready_s)
            unknown.update_instance(inst.id, loading=bare)
    stale = recover(p2, unknown, at_s=at2, failed=[far]).stale
    assert len(stale) == 2 and all("its plan's routes are unknown" in s for s in stale)
    assert recover(p2, unknown, at_s=at2).stale == ()  # nothing failed: nothing stale


def _earlier_fills_the_routes() -> ClusterState:
    """The host copy on h0 loads six TP2 instances; 11% in, the plan's steps fill every NIC of
    h0 (the loading prefill instances are no sources): the burst asked then used to be refused
    ("background flows fill ... every route")."""
    sc = next(s for s in SCENARIOS if s.name.startswith("dgx host copy only"))
    st0 = sc.build()
    p1 = plan(st0, ScaleRequest("qwen2.5-7b", decode=3, prefill=3, tp=2), refine_budget=None)
    return apply_plan(st0, p1, at_s=0.11252900539650945 * p1.milestones.full_capacity_s)


def test_issue_18_running_steps_are_background_only_until_they_end() -> None:
    st1 = _earlier_fills_the_routes()
    ends = max(st1.flow_end_s(f) for f in st1.background_flows)
    assert ends < 1.0 and math.isfinite(ends)
    p2 = plan(st1, ScaleRequest("qwen2.5-7b", prefill=5, tp=2), refine_budget=None)
    assert validate_plan(st1, p2) == () and check_program(p2) == []
    assert all(step.not_before_s >= ends for step in p2.steps)
    assert p2.notes == (
        f"the new instances start in {ends:.3f} s, once an earlier plan's steps end: until "
        "then they fill every route to one of them",
    )
    free = st1.copy()  # the bound is that of plans on free links that need not wait
    free.clear_background_flows()
    unwaited = plan_multicast(
        at_efficiency(free, p2.options.link_efficiency),
        "qwen2.5-7b",
        targets=[i.gpus for i in p2.multicast.instances],
        names=[i.name for i in p2.multicast.instances],
        tp=2,
        live=list(p2.multicast.live),
    )
    assert p2.multicast.lower_bound_s == pytest.approx(unwaited.lower_bound_s)
    assert p2.multicast.status.value == "feasible"
    # the validator refuses a plan that leaves the running steps out without waiting for them
    mc = p2.multicast
    eager = dataclasses.replace(
        mc, instances=tuple(dataclasses.replace(i, startup_s=0.0) for i in mc.instances)
    )
    problems = validate_multicast(st1, eager)
    assert any("leaves out background flow" in p for p in problems)


def test_applying_a_plan_ends_the_flows_that_ended() -> None:
    st1 = _earlier_fills_the_routes()
    ends = {f: st1.flow_end_s(f) for f in st1.background_flows}
    assert ends and all(0 < t < math.inf for t in ends.values())
    p2 = plan(st1, ScaleRequest("qwen2.5-7b", prefill=1, tp=2))
    half = sorted(ends.values())[len(ends) // 2]
    later = apply_plan(st1, p2, at_s=half)
    for flow in st1.background_flows:
        if ends[flow] > half:
            assert later.flow_end_s(flow) == pytest.approx(ends[flow] - half)
        else:
            assert flow not in later.background_flows
    st1.add_background_flow("h3/gpu0", "h2/gpu0", name="kv")  # serving traffic keeps running
    kv = st1.background_flows[-1]
    assert st1.flow_end_s(kv) == math.inf
    assert kv in apply_plan(st1, p2, at_s=100.0).background_flows
    with pytest.raises(InvalidInputError, match="until_s must be a time > 0"):
        st1.add_flow(Flow(kv.edges, 1e9, "bad"), until_s=0.0)


def test_property_overlapping_replans_hold_the_bar() -> None:
    """Property: random second plans made while the first loads, replanned after none, one or
    two failures, are clear errors or plans the campaign's checkers accept: valid, byte-exact
    within and across the two documents, and streaming from no instance its own plan can no
    longer finish."""
    rng = random.Random(18)
    outcomes = []
    while len(outcomes) < 16:
        case = random_overlap(rng)
        if case is not None:
            outcomes.append(run_overlap(*case))
    assert all(o.kind != "crash" and o.problems == () for o in outcomes), [
        (o.scenario, o.failures, o.problems) for o in outcomes if o.problems
    ]
    assert sum(o.kind == "plan" for o in outcomes) >= 8
