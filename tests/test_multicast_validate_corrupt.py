"""The certificate checker refuses plans broken one rule at a time: the rules of the lanes' bytes,
holders, senders, flows and rates (each judged for many lanes at once) each still name the lane
or flow that breaks them."""

from __future__ import annotations

import dataclasses

import pytest

from blitzplan.multicast import MulticastPlan, plan_multicast, validate_multicast
from blitzplan.multicast.plan_types import Lane, NodeKind
from blitzplan.topologies import Flow
from tests.test_multicast import paper_state


@pytest.fixture(scope="module")
def paper() -> tuple[object, MulticastPlan]:
    state = paper_state()
    plan = plan_multicast(state, "mistral-small-24b", count=6, tp=2, live=2)
    assert validate_multicast(state, plan) == ()
    return state, plan


def _lane_changed(plan: MulticastPlan, pick, **changes: object) -> tuple[MulticastPlan, Lane]:
    """``plan`` with the first lane of its hops that ``pick`` accepts changed."""
    for h, hop in enumerate(plan.hops):
        for k, lane in enumerate(hop.lanes):
            if pick(plan, lane):
                lanes = list(hop.lanes)
                lanes[k] = dataclasses.replace(lane, **changes)
                hops = list(plan.hops)
                hops[h] = dataclasses.replace(hop, lanes=tuple(lanes))
                return dataclasses.replace(plan, hops=tuple(hops)), lane
    raise AssertionError("no lane to change")


def _from_instance(plan: MulticastPlan, lane: Lane) -> bool:
    return plan.nodes[lane.sender].kind is NodeKind.INSTANCE


def _from_target(plan: MulticastPlan, lane: Lane) -> bool:
    return plan.nodes[lane.sender].kind is NodeKind.TARGET


def _into_target(plan: MulticastPlan, lane: Lane) -> bool:
    return plan.nodes[lane.receiver].kind is NodeKind.TARGET and lane.hi < 1


def _says(state, plan: MulticastPlan, words: str) -> None:
    problems = validate_multicast(state, plan)
    assert any(words in p for p in problems), problems


def test_the_bytes_rules(paper) -> None:
    state, plan = paper
    outside, lane = _lane_changed(plan, _into_target, dst="h0/gpu0")
    _says(state, outside, f"lane {lane.flow} lands on h0/gpu0, outside node")
    node = plan.nodes[lane.receiver]
    rank = node.rank_of(lane.dst)
    assert rank is not None
    wrong, _ = _lane_changed(plan, _into_target, rank=1 - rank)
    _says(state, wrong, f"bytes on rank-{rank} GPU {lane.dst}")
    empty, _ = _lane_changed(plan, _into_target, hi=lane.lo)
    _says(state, empty, "carries the empty or invalid stripe")
    twice, _ = _lane_changed(plan, _into_target, hi=1.0)
    _says(state, twice, "of its shard twice")


def test_the_holders_rules(paper) -> None:
    state, plan = paper
    elsewhere, lane = _lane_changed(plan, _from_instance, holder="h3/gpu0")
    _says(state, elsewhere, f"lane {lane.flow} (h3/gpu0->{lane.dst}): h3/gpu0 is not a GPU of")
    forwarded, lane = _lane_changed(plan, _from_target, holder="h3/gpu0")
    _says(state, forwarded, "h3/gpu0 is not a GPU of node")


def test_the_senders_and_flows_rules(paper) -> None:
    state, plan = paper
    prefill = next(i for i in state.instances if i.serving_role.value == "prefill").gpus[0]
    exit_, lane = _lane_changed(plan, _from_instance, exit=prefill)
    _says(state, exit_, "sends from a prefill GPU")
    _says(state, exit_, f"flow {lane.flow} does not pass its exit {prefill}")
    f = lane.flow
    flows = list(plan.flows)
    flows[f] = Flow(tuple((b, a) for a, b in flows[f].edges), flows[f].max_bytes_per_s)
    reversed_ = dataclasses.replace(plan, flows=tuple(flows))
    _says(state, reversed_, f"not {lane.holder}->{lane.dst}")
    if len(flows[f].edges) > 1:
        _says(state, reversed_, f"flow {f} is not a connected path")
    flows[f] = Flow((("nowhere", "else"),), plan.flows[f].max_bytes_per_s)
    _says(state, dataclasses.replace(plan, flows=tuple(flows)), "an edge the topology lacks")
    _says(state, dataclasses.replace(plan, flows=plan.flows[:-1]), "do not correspond")


def test_the_rates_rules(paper) -> None:
    state, plan = paper
    rates = list(plan.rates)
    rates[0] = 0.0
    _says(state, dataclasses.replace(plan, rates=tuple(rates)), "flow 0 gets no capacity")
    flows = list(plan.flows)
    flows[0] = Flow(flows[0].edges, plan.rates[0] / 2)
    _says(state, dataclasses.replace(plan, flows=tuple(flows)), "flow 0 runs faster than its pace")
    double = dataclasses.replace(plan, rates=tuple(2 * r for r in plan.rates))
    _says(state, double, "over its capacity")


def test_the_layer_ready_times(paper) -> None:
    state, plan = paper
    name = plan.instances[0].name
    ready = dict(plan.layer_ready_s)
    ready[name] = tuple(t * 1.01 for t in ready[name])
    late = dataclasses.replace(plan, layer_ready_s=ready)
    _says(state, late, f"{name} layer ready times differ from the recurrence")
