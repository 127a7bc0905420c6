"""The ScalePlan as a data plane reads it: the transfer program, its JSON Schema, request ids."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from blitzplan import (
    ClusterState,
    InvalidInputError,
    Loading,
    Role,
    apply_plan,
    load_topology,
    plan_multicast,
)
from blitzplan.cli import main
from blitzplan.scale import ScalePlan, ScaleRequest, plan, recover, replan, validate_plan
from blitzplan.scale.document import json_schema
from blitzplan.scale.transfer_steps import StepKind
from tests.conftest import REPO
from tests.fault_campaign import SCENARIOS, base_plan
from tests.program_check import check_program

MODEL = "mistral-small-24b"


def paper_state() -> ClusterState:
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    state.add_instance(MODEL, gpus=["h0/gpu0", "h0/gpu1"], role="prefill", queue=[(0.0, 2048)] * 8)
    state.add_instance(MODEL, gpus=["h0/gpu2", "h0/gpu3"], role="decode")
    state.add_instance(MODEL, gpus=["h0/gpu4", "h0/gpu5"], role="decode")
    return state


def test_the_program_gives_every_gpu_its_buffer_once() -> None:
    scale = plan(paper_state(), ScaleRequest(MODEL, prefill=2, tp=2))
    assert scale.steps and check_program(scale) == []
    kinds = {step.kind for step in scale.steps}
    assert StepKind.NETWORK in kinds and StepKind.ALLGATHER in kinds
    for step in scale.steps:
        assert (step.nic is not None) == (step.kind is StepKind.NETWORK)
        assert step.start_s <= step.end_s
        assert all(f < len(scale.multicast.lanes) for f in step.feeds)


def test_step_rates_agree_with_their_predicted_times() -> None:
    scale = plan(paper_state(), ScaleRequest(MODEL, prefill=6, tp=2))
    for step in scale.steps:
        assert step.chunk_bytes == scale.options.chunk_bytes
        assert step.rate_bytes_per_s > 0
        sending_s = step.bytes / step.rate_bytes_per_s
        assert sending_s <= step.end_s - step.start_s + 1e-6
        if not step.feeds and not step.after:  # nothing to wait for: it sends at its rate
            assert sending_s == pytest.approx(step.end_s - step.start_s, rel=1e-6)


def test_a_broken_program_is_caught_by_the_certificate() -> None:
    scale = plan(paper_state(), ScaleRequest(MODEL, prefill=2, tp=2))
    dropped = dataclasses.replace(scale, steps=scale.steps[1:])
    assert any("misses bytes" in p for p in check_program(dropped))
    twice = dataclasses.replace(scale, steps=(*scale.steps, scale.steps[0]))
    assert any("has or gets" in p for p in check_program(twice))


def test_host_memory_to_a_gpu_of_its_host_names_no_nic() -> None:
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    scale = plan(state, ScaleRequest(MODEL, prefill=1, tp=2))  # the host copy only
    local = [s for s in scale.steps if s.kind is StepKind.HOST_TO_DEVICE]
    for step in local:
        assert step.nic is None and step.link == "pcie"
    assert check_program(scale) == []


@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.9])
def test_replan_asks_only_for_what_is_missing(fraction: float) -> None:
    state = paper_state()
    scale = plan(state, ScaleRequest(MODEL, prefill=2, tp=2))
    at = fraction * scale.milestones.full_capacity_s
    after = replan(scale, state, at_s=at, failed=["i2"])
    assert check_program(after) == []
    shard = sum(scale.multicast.unit_bytes)
    for info in after.new_instances:
        for gpu in info.gpus:
            sent = sum(
                (r.last_unit - r.first_unit + 1) * r.length
                for s in after.steps
                if s.destination == gpu
                for r in s.ranges
            )
            held = sum(
                round(hi * after.multicast.unit_bytes[u])
                - round(lo * after.multicast.unit_bytes[u])
                for u, intervals in after.held.get(gpu, {}).items()
                for lo, hi in intervals
            )
            assert sent + held == shard
            assert held > 0


def test_request_ids_in_pairs_mutations_and_releases() -> None:
    scale = plan(paper_state(), ScaleRequest(MODEL, prefill=2, decode=1, tp=2))
    pair = scale.live_pairs[0]
    assert [b for batch in pair.batches for b in batch] == [f"i0/r{k}" for k in range(8)]
    down = plan(paper_state(), ScaleRequest(MODEL, prefill=-1, tp=2))
    (release,) = down.releases
    assert release.requests == tuple(f"i0/r{k}" for k in range(8)) and release.at_s > 0


def test_new_names_skip_instance_ids_in_use() -> None:
    state = paper_state()
    state.add_instance(MODEL, gpus=["h0/gpu6", "h0/gpu7"], role="decode", instance_id="new0")
    scale = plan(state, ScaleRequest(MODEL, prefill=1, tp=2))
    assert [i.name for i in scale.new_instances] == ["new1"]


def test_the_shipped_schema_is_the_generated_one(capsys: pytest.CaptureFixture[str]) -> None:
    shipped = (REPO / "blitzplan" / "schemas" / "scaleplan.v3.schema.json").read_text()
    assert shipped == ScalePlan.json_schema()
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == shipped


@pytest.mark.parametrize("which", ["plan", "replan"])
def test_documents_validate_against_the_schema(which: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    sc = next(s for s in SCENARIOS if s.name.startswith("dgx h100 8B"))
    scale = base_plan(sc)
    if which == "replan":
        at = 0.3 * scale.milestones.full_capacity_s
        scale = replan(scale, sc.build(), at_s=at, failed=["h1/gpu3"])
    jsonschema.validate(json.loads(scale.to_json(timing=True)), json_schema(ScalePlan))
    with pytest.raises(jsonschema.ValidationError):
        document = json.loads(scale.to_json())
        document["steps"][0]["kind"] = "teleport"
        jsonschema.validate(document, json_schema(ScalePlan))


# --- applying a plan --------------------------------------------------------------------------


def two_prefill_state() -> ClusterState:
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    for i in range(2):
        queue = [(0.0, 1024 + 256 * k) for k in range(6)]
        state.add_instance(MODEL, gpus=[f"h0/gpu{2 * i}", f"h0/gpu{2 * i + 1}"], queue=queue)
    state.add_instance(MODEL, gpus=["h0/gpu4", "h0/gpu5"], role="decode")
    return state


def test_apply_part_way_and_after() -> None:
    state = two_prefill_state()
    scale = plan(state, ScaleRequest(MODEL, prefill=2, decode=1, tp=2))
    half = scale.milestones.full_capacity_s / 2
    mid = apply_plan(state, scale, at_s=half)
    by_id = {i.id: i for i in mid.instances}
    loading = [i for i in scale.new_instances if not all(t <= half for t in i.layer_ready_s)]
    assert loading and all(by_id[i.name].role is Role.LOADING for i in loading)
    for info in loading:  # each knows its future role and when each unit arrives from now
        record = by_id[info.name].loading
        assert record is not None and record.role.value == info.role
        assert record.units_ready_s == tuple(max(0.0, t - half) for t in info.layer_ready_s)
    assert len(mid.background_flows) == sum(1 for s in scale.steps if s.end_s > half)
    assert [i.id for i in state.instances] == ["i0", "i1", "i2"]  # the input is unchanged
    (mutation,) = scale.mutations
    assert by_id[mutation.instance].role is Role.DECODE and not by_id[mutation.instance].queue
    moved_to = {target for _, target in mutation.moved}
    assert all(by_id[t].queue for t in moved_to if t in by_id)
    end = apply_plan(state, scale, at_s=scale.milestones.queue_drain_s + 1.0)
    after = {i.id: i for i in end.instances}
    for info in scale.new_instances:
        assert after[info.name].role.value == info.role
    assert not end.background_flows
    pair = scale.live_pairs[0]
    assert not after[pair.old].queue  # the pair's schedule finished every batch


def test_a_second_plan_on_an_applied_state_names_new_instances_afresh() -> None:
    """While the first plan loads, its transfers are background flows for the next plan until
    they end (a plan they leave no route waits for them), and its loading decode instance is a
    source from each unit's arrival; once it is done, its instances serve as sources; the names
    stay unique."""
    state = paper_state()
    first = plan(state, ScaleRequest(MODEL, decode=1, tp=2))  # a decode instance: a source
    mid = apply_plan(state, first, at_s=first.milestones.full_capacity_s / 2)
    assert mid.background_flows
    overlapping = plan(mid, ScaleRequest(MODEL, prefill=1, tp=2))
    assert {s.holder for s in overlapping.steps} & {"loading"}
    assert validate_plan(mid, overlapping) == ()
    prefill_first = plan(state, ScaleRequest(MODEL, prefill=1, tp=2))  # a future prefill one
    busy = apply_plan(state, prefill_first, at_s=prefill_first.milestones.full_capacity_s / 2)
    waits = plan(busy, ScaleRequest(MODEL, prefill=1, tp=2))  # no source now: it waits
    ends = max(busy.flow_end_s(f) for f in busy.background_flows)
    assert validate_plan(busy, waits) == () and check_program(waits) == []
    assert all(step.not_before_s >= ends for step in waits.steps)
    assert any("once an earlier plan's steps end" in note for note in waits.notes)
    done = apply_plan(state, first, at_s=first.milestones.full_capacity_s)
    assert not done.background_flows
    second = plan(done, ScaleRequest(MODEL, prefill=1, tp=2))
    names = {i.name for i in first.new_instances}
    assert names.isdisjoint(i.name for i in second.new_instances)
    senders = {n.instance_id for n in second.multicast.nodes if n.instance_id}
    assert senders & names  # the first plan's instance is a source now


def overlapping() -> tuple[ClusterState, ClusterState, ScalePlan]:
    """Two decode instances loading (no mutation) when a burst asks for four prefill ones."""
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    state.add_instance(MODEL, gpus=["h0/gpu0", "h0/gpu1"], role="prefill", queue=[(0.0, 2048)] * 8)
    state.add_instance(MODEL, gpus=["h0/gpu2", "h0/gpu3"], role="decode")
    first = plan(state, ScaleRequest(MODEL, decode=2, tp=2), mutate_decode=False)
    return state, apply_plan(state, first, at_s=0.2), first


def test_an_overlapping_plan_streams_from_instances_still_loading() -> None:
    _, mid, _ = overlapping()
    loading = {i.id: i.loading for i in mid.instances if i.loading is not None}
    assert set(loading) == {"new0", "new1"}
    second = plan(mid, ScaleRequest(MODEL, prefill=4, tp=2))
    assert validate_plan(mid, second) == () and check_program(second) == []
    from_loading = [s for s in second.steps if s.holder == "loading"]
    assert from_loading  # the first plan's busy source NICs leave the loading GPUs' as the way
    owner = {g: i.id for i in mid.instances for g in i.gpus}
    for step in from_loading:
        record = loading[owner[step.source]]
        assert record is not None
        carried = [u for r in step.ranges for u in range(r.first_unit, r.last_unit + 1)]
        assert step.start_s >= min(record.units_ready_s[u] for u in carried) - 1e-9
        assert step.end_s >= max(record.units_ready_s[u] for u in carried)
    # one of them fails: the other gets bytes through its GPUs, so its record is stale too
    after = replan(second, mid, at_s=0.1, failed=["new0"])
    assert validate_plan(recover(second, mid, at_s=0.1, failed=["new0"]).state, after) == ()
    assert not [s for s in after.steps if s.holder == "loading"]
    assert after.notes[0] == (
        "new1, loading under an earlier plan, is no source: its plan needs new0; that plan "
        "needs a replan too"
    )
    # without them the same burst waits for host 0's NICs, which the first plan still uses
    alone = plan_multicast(mid, MODEL, count=4, tp=2, exclude=["new0", "new1"])
    assert second.multicast.objective_s < alone.objective_s


def test_a_loading_record_is_checked_and_moves_on() -> None:
    state, mid, first = overlapping()
    spec = first.spec
    with pytest.raises(InvalidInputError, match="not 'loading'"):
        Loading(Role.LOADING, (0.0,))
    with pytest.raises(InvalidInputError, match="units_ready_s must be"):
        Loading(Role.DECODE, (0.0, math.nan))
    with pytest.raises(InvalidInputError, match="goes with role 'loading'"):
        state.add_instance(
            spec, gpus=["h3/gpu0"], role="decode", loading=Loading(Role.DECODE, (1.0,))
        )
    with pytest.raises(InvalidInputError, match="has 1 times"):
        state.add_instance(
            spec, gpus=["h3/gpu0"], role="loading", loading=Loading(Role.DECODE, (1.0,))
        )
    bare = mid.copy()
    bare.update_instance("new0", role="idle")
    assert bare.instance("new0").loading is None  # a role other than loading drops the record
    # a plan applied on top moves the first plan's loading instances on with the clock
    second = plan(mid, ScaleRequest(MODEL, prefill=1, tp=2))
    later = apply_plan(mid, second, at_s=10.0)
    assert later.instance("new0").role is Role.DECODE and later.instance("new0").loading is None
    soon = apply_plan(mid, second, at_s=0.1)
    before = mid.instance("new0").loading
    after = soon.instance("new0").loading
    assert before is not None and after is not None
    assert after.units_ready_s == tuple(max(0.0, t - 0.1) for t in before.units_ready_s)


def test_apply_refuses_a_plan_of_another_state() -> None:
    state = paper_state()
    scale = plan(state, ScaleRequest(MODEL, prefill=1, tp=2))
    applied = apply_plan(state, scale, at_s=0.0)
    with pytest.raises(InvalidInputError, match="not made on this state"):
        apply_plan(applied, scale, at_s=0.0)
    with pytest.raises(InvalidInputError, match="at_s must be a finite time"):
        apply_plan(state, scale, at_s=-1)


def test_a_relay_stages_several_ranks_apart() -> None:
    """A spare GPU relaying for a TP2 node may receive the same stripe of both ranks: it stages
    them as host memory holds them (rank r at r * B_u), so neither overwrites the other."""
    scenario = SCENARIOS[1]  # paper a800, prefill sources allowed: a GPU of a new node fails
    after = replan(base_plan(scenario), scenario.build(), at_s=0.0, failed=["h1/gpu7"])
    relayed: dict[str, set[int]] = {}
    for step in after.steps:
        if step.instance is None:
            relayed.setdefault(step.destination, set()).add(step.rank)
    assert any(len(ranks) > 1 for ranks in relayed.values())
    assert check_program(after) == []
    from blitzplan.wire.program_rules import memory_devices

    assert set(relayed) <= memory_devices(after.steps)
