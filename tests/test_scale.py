"""plan(): live pairs, mutations, releases, milestones, JSON, version safety, and replan()."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blitzplan import (
    ClusterState,
    InfeasibleError,
    InvalidInputError,
    apply_plan,
    load_model,
    load_topology,
)
from blitzplan.compute import RooflineComputeModel
from blitzplan.live.schedule_checks import validate_schedule
from blitzplan.scale import PlanOptions, ScalePlan, ScaleRequest, plan, replan, validate_plan
from blitzplan.scale.pairing import live_instance
from blitzplan.scale.recovery import recover

MODEL = "mistral-small-24b"


def paper_state(queue_tokens: tuple[int, int] = (24_000, 12_000)) -> ClusterState:
    """Host 0 serves MODEL as two prefill (with queues) and two decode TP2 instances."""
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    for i, tokens in enumerate(queue_tokens):
        queue = [(-0.5 + 0.1 * k, tokens // 8) for k in range(8)]
        state.add_instance(
            MODEL,
            gpus=[f"h0/gpu{2 * i}", f"h0/gpu{2 * i + 1}"],
            role="prefill",
            queue=queue,
            kv_bytes_used=(i + 1) * 10**9,
        )
    for i in (2, 3):
        state.add_instance(
            MODEL,
            gpus=[f"h0/gpu{2 * i}", f"h0/gpu{2 * i + 1}"],
            role="decode",
            kv_bytes_used=5 * 10**9,
        )
    return state


def check_plan(state: ClusterState, scale: ScalePlan) -> None:
    if scale.multicast is not None:
        assert validate_plan(state, scale) == ()
    for pair in scale.live_pairs:
        assert pair.schedule.has_ops


def test_six_prefill_instances_with_live_pairs() -> None:
    state = paper_state()
    scale = plan(state, ScaleRequest(MODEL, prefill=6, tp=2), compare_baselines=True)
    check_plan(state, scale)
    assert [i.role for i in scale.new_instances] == ["prefill"] * 6
    assert not plan(state, ScaleRequest(MODEL, prefill=6, tp=2)).milestones.baselines  # opt-in
    assert len(scale.live_pairs) == 2
    # the earliest live tail pairs with the most loaded old instance (i0: 24k queued tokens)
    first = min(scale.live_pairs, key=lambda p: scale.multicast.layer_ready_s[p.new][1])
    assert first.old == "i0"
    m = scale.milestones
    live_first_layer = min(max(scale.multicast.layer_ready_s[p.new][:2]) for p in scale.live_pairs)
    assert m.first_capacity_s == pytest.approx(live_first_layer)
    assert m.full_capacity_s == pytest.approx(max(i.ready_at_s for i in scale.new_instances))
    assert m.queue_drain_s == pytest.approx(
        max(max(p.schedule.completion_s) for p in scale.live_pairs)
    )
    assert set(m.baselines) == {"allcache", "serverlessllm"}
    assert m.baselines["serverlessllm"].full_capacity_s > m.baselines["allcache"].full_capacity_s
    # live help drains the queues sooner than waiting for a whole model from the SSD
    assert m.queue_drain_s < m.baselines["serverlessllm"].queue_drain_s


def test_live_schedules_are_valid_for_their_pairs() -> None:
    state = paper_state()
    scale = plan(state, ScaleRequest(MODEL, prefill=2, tp=2))
    spec = load_model(MODEL)
    assert len(scale.live_pairs) == 2
    for pair in scale.live_pairs:
        old = state.instance(pair.old)
        problem = live_instance(
            state,
            spec,
            scale.multicast.instance(pair.new).gpus,
            scale.multicast.layer_ready_s[pair.new],
            old,
            old.queue,
            PlanOptions(),
            2,
        )
        report = validate_schedule(problem, pair.schedule)
        assert report.ok, report.violations
        assert report.objective == pytest.approx(pair.schedule.objective)


def test_decode_growth_mutates_the_emptiest_prefill() -> None:
    state = paper_state()
    scale = plan(state, ScaleRequest(MODEL, decode=1, tp=2))
    check_plan(state, scale)
    (mutation,) = scale.mutations
    assert (mutation.instance, mutation.from_role, mutation.to_role) == ("i0", "prefill", "decode")
    assert [i.role for i in scale.new_instances] == ["prefill"]
    assert mutation.replaced_by == scale.new_instances[0].name
    # i0's queue moved to i1, which the replacement now helps live
    assert [p.old for p in scale.live_pairs] == ["i1"]
    assert scale.live_pairs[0].queued_requests == 16


def test_large_prefill_scale_up_prescales_decode() -> None:
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    state.add_instance(MODEL, gpus=["h0/gpu0", "h0/gpu1"], role="prefill", queue=[(0.0, 4096)])
    state.add_instance(MODEL, gpus=["h0/gpu2", "h0/gpu3"], role="decode")
    scale = plan(state, ScaleRequest(MODEL, prefill=4, tp=2), prescale_decode=True)
    check_plan(state, scale)
    assert sorted(i.role for i in scale.new_instances) == ["decode"] * 4 + ["prefill"] * 4
    small = plan(state, ScaleRequest(MODEL, prefill=3, tp=2), prescale_decode=True)
    assert not small.missing and all(i.role == "prefill" for i in small.new_instances)
    default = plan(state, ScaleRequest(MODEL, prefill=4, tp=2))  # opt-in: what was asked
    assert [i.role for i in default.new_instances] == ["prefill"] * 4


def test_scale_down_drains_the_least_loaded() -> None:
    state = paper_state()
    scale = plan(state, ScaleRequest(MODEL, prefill=-1, decode=-1, tp=2))
    assert [(r.instance, r.role) for r in scale.releases] == [("i1", "prefill"), ("i2", "decode")]
    assert scale.new_instances == () and scale.multicast is None
    too_many = plan(state, ScaleRequest(MODEL, prefill=-3, tp=2))
    assert "only 2 serve" in too_many.missing[0]


def test_a_released_instance_drains_its_own_queue_first() -> None:
    """Removing the only prefill instance with 100 queued requests: the drain milestone is when
    it has served them (not 0), one prompt after another."""
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    state.add_instance(
        MODEL, gpus=["h0/gpu0", "h0/gpu1"], role="prefill", queue=[(0.0, 1024)] * 100
    )
    state.add_instance(MODEL, gpus=["h0/gpu2", "h0/gpu3"], role="decode")
    scale = plan(state, ScaleRequest(MODEL, prefill=-1, tp=2))
    assert [r.instance for r in scale.releases] == ["i0"]
    spec = load_model(MODEL)
    compute = RooflineComputeModel(spec, state.topology.gpu_spec("h0/gpu0"), tp=2)
    prompt_s = spec.num_layers * compute.prefill_layer_s(1024) + compute.head_s(1)
    assert scale.milestones.queue_drain_s == pytest.approx(100 * prompt_s)


def test_a_released_source_is_free_only_after_its_last_send() -> None:
    """Removing an idle decode instance the plan streams from: its GPUs are not free at 0 (a
    later plan could be placed there mid-stream) but when its last step ends."""
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    state.add_instance(MODEL, gpus=["h0/gpu0", "h0/gpu1"], role="prefill", queue=[(0.0, 2048)] * 4)
    state.add_instance(MODEL, gpus=["h1/gpu0", "h1/gpu1"], role="decode")
    state.add_instance(MODEL, gpus=["h2/gpu0", "h2/gpu1"], role="decode")
    scale = plan(state, ScaleRequest(MODEL, prefill=3, decode=-1, tp=2))
    (release,) = scale.releases
    sends = [s.end_s for s in scale.steps if s.source in release.gpus]
    assert sends, "the case needs a plan that streams from the released instance"
    assert release.at_s == pytest.approx(max(sends)) and release.at_s > 0
    midway = apply_plan(state, scale, at_s=release.at_s / 2)
    assert release.instance in {i.id for i in midway.instances}


def test_numpy_counts_are_counts() -> None:
    request = ScaleRequest(MODEL, prefill=np.int64(2), decode=np.int32(0), tp=np.int64(2))
    assert (request.prefill, request.decode, request.tp) == (2, 0, 2)
    assert type(request.prefill) is int
    assert (
        plan(paper_state(), request).request
        == plan(paper_state(), ScaleRequest(MODEL, 2, tp=2)).request
    )


def test_partial_plan_says_what_is_missing_unless_strict() -> None:
    state = paper_state()
    scale = plan(state, ScaleRequest(MODEL, prefill=14, tp=2), prescale_decode=False)
    assert len(scale.new_instances) == 12
    assert "free GPUs hold 12 new tp=2 instances, 14 wanted" in scale.missing[0]
    with pytest.raises(InfeasibleError, match="14 wanted"):
        plan(state, ScaleRequest(MODEL, prefill=14, tp=2), strict=True, prescale_decode=False)
    # a large scale-up pre-scales decode first and drops it first when GPUs run out
    both = plan(state, ScaleRequest(MODEL, prefill=14, tp=2), prescale_decode=True)
    assert "28 wanted: 14 pre-scaled decode" in both.missing[0]


def test_version_safety() -> None:
    state = ClusterState(load_topology("paper-a800-32"))
    v2 = load_model(MODEL, revision="v2")
    state.add_instance(v2, gpus=["h0/gpu0", "h0/gpu1"], role="decode")
    with pytest.raises(InfeasibleError, match="no source holds model mistral-small-24b@main"):
        plan(state, ScaleRequest(MODEL, prefill=1, tp=2))
    scale = plan(state, ScaleRequest(v2, prefill=1, tp=2))
    assert scale.model == v2.identity and scale.multicast.model == v2.identity


def test_json_round_trip_is_lossless_and_deterministic() -> None:
    a = plan(paper_state(), ScaleRequest(MODEL, prefill=6, decode=1, tp=2))
    text = a.to_json()
    b = ScalePlan.from_json(text)
    assert b == a and b.to_json() == text
    document = json.loads(text)
    assert document["schema_version"] == 3 and document["plan_id"] == a.plan_id
    for key in ("new_instances", "steps", "live_pairs", "mutations", "releases", "milestones"):
        assert key in document
    assert "solve_s" not in document["multicast"] and "timing" not in document
    again = plan(paper_state(), ScaleRequest(MODEL, prefill=6, decode=1, tp=2))
    assert again.to_json() == text and again.plan_id == a.plan_id  # byte-identical
    timed = a.to_json(timing=True)
    assert json.loads(timed)["timing"]["multicast_solve_s"] == a.multicast.solve_s
    assert ScalePlan.from_json(timed).multicast.solve_s == a.multicast.solve_s


def test_a_document_that_adds_fields_reads_and_a_changed_one_does_not() -> None:
    from blitzplan.scale.document import document_digest

    a = plan(paper_state(), ScaleRequest(MODEL, prefill=2, tp=2))
    document = json.loads(a.to_json())
    document["added_by_a_newer_writer"] = {"x": 1}
    document["plan_id"] = document_digest(document)
    newer = ScalePlan.from_json(json.dumps(document))
    assert newer == a and newer.plan_id != a.plan_id  # the added field is signed too
    document["added_by_a_newer_writer"] = {"x": 2}  # changed after signing
    with pytest.raises(InvalidInputError, match="plan_id .* does not match"):
        ScalePlan.from_json(json.dumps(document))


def test_json_writes_infinity_as_null_and_reads_it_back() -> None:
    ring = plan(paper_state(), ScaleRequest(MODEL, prefill=2, tp=2), method="ring")
    assert any(f.max_bytes_per_s == math.inf for f in ring.multicast.flows)  # unpaced
    text = ring.to_json()
    assert "inf" not in text.lower().replace("info", "")
    assert any(f["max_bytes_per_s"] is None for f in json.loads(text)["multicast"]["flows"])
    assert ScalePlan.from_json(text) == ring
    assert all(step.pace_bytes_per_s is None for step in ring.steps)


def test_json_errors_are_named() -> None:
    with pytest.raises(InvalidInputError, match="does not parse"):
        ScalePlan.from_json("{")
    with pytest.raises(InvalidInputError, match="not a blitzplan.scaleplan document"):
        ScalePlan.from_json("{}")
    text = plan(paper_state(), ScaleRequest(MODEL, prefill=1, tp=2)).to_json()
    with pytest.raises(InvalidInputError, match="schema_version 99 is not supported"):
        ScalePlan.from_json(text.replace('"schema_version":3', '"schema_version":99'))
    from blitzplan.scale.document import document_digest

    document = json.loads(text)
    del document["new_instances"]
    document["plan_id"] = document_digest(document)
    with pytest.raises(InvalidInputError, match="missing required field `new_instances`"):
        ScalePlan.from_json(json.dumps(document))
    document = json.loads(text)
    document["steps"][0]["bytes"] = 1
    with pytest.raises(InvalidInputError, match="does not match the document: it was changed"):
        ScalePlan.from_json(json.dumps(document))
    document = json.loads(text)
    document["steps"][0]["kind"] = "teleport"
    document["plan_id"] = document_digest(document)
    with pytest.raises(InvalidInputError, match=r"does not fit the schema: .*steps\[0\]\.kind"):
        ScalePlan.from_json(json.dumps(document))


def test_request_errors_are_named() -> None:
    with pytest.raises(InvalidInputError, match="prefill must be an integer, got 1.5"):
        ScaleRequest(MODEL, prefill=1.5)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="live_method must be one of"):
        plan(paper_state(), ScaleRequest(MODEL, prefill=1, tp=2), live_method="psychic")


# --- replan ----------------------------------------------------------------------------------

BASE = plan(paper_state(), ScaleRequest(MODEL, prefill=6, tp=2))
FAILURES = [
    "i2",
    "i3",
    "new0",
    "new4",
    "h0/gpu5",
    "h1/gpu2",
    "h2",
    "h1/nic0",
    "h0/nic6",
    ("h2/nic1", "leaf0"),
    ("h1/pcie0", "h1/gpu0"),
]


def test_replan_after_a_source_fails_reuses_delivered_layers() -> None:
    state = paper_state()
    at = BASE.milestones.full_capacity_s / 2
    after = replan(BASE, state, at_s=at, failed=["i2"])
    current = recover(BASE, state, at_s=at, failed=["i2"]).state
    assert "i2" not in {i.id for i in current.instances}
    assert validate_plan(current, after) == ()
    for info in after.new_instances:
        old = BASE.multicast.layer_ready_s[info.name]
        for unit, t in enumerate(info.layer_ready_s):
            if old[unit] <= at:
                assert t == 0.0  # already there: not sent again
            else:
                assert t > 0.0
    assert all(
        plan_source.instance_id != "i2"
        for plan_source in after.multicast.nodes
        if plan_source.kind.value == "instance"
    )


def test_replan_cancel_and_errors() -> None:
    state = paper_state()
    after = replan(BASE, state, at_s=0.1, cancelled=["new5"])
    assert "new5" not in {i.name for i in after.new_instances}
    with pytest.raises(InvalidInputError, match="cancelled names 'new9'"):
        replan(BASE, state, at_s=0.1, cancelled=["new9"])
    with pytest.raises(InvalidInputError, match="failed names 'gpu77'"):
        replan(BASE, state, at_s=0.1, failed=["gpu77"])
    with pytest.raises(InvalidInputError, match="at_s must be a finite time >= 0, got -1"):
        replan(BASE, state, at_s=-1)
    with pytest.raises(InfeasibleError, match="no source"):
        replan(BASE, state, at_s=0.1, failed=["i2", "i3", "h0"])


@settings(max_examples=30)
@given(st.sampled_from(FAILURES), st.floats(0.0, 1.0))
def test_property_single_failure_replan_completes_every_survivor(failure, fraction) -> None:
    """Property: after any single failure at any time, every surviving new instance ends with
    every unit exactly once, from one identity, and the new multicast plan validates."""
    state = paper_state()
    at = fraction * BASE.milestones.full_capacity_s
    after = replan(BASE, state, at_s=at, failed=[failure])
    recovery = recover(BASE, state, at_s=at, failed=[failure])
    current, survivors, missing = recovery.state, recovery.survivors, after.missing
    done_before = {i.name for i in BASE.new_instances if all(t <= at for t in i.layer_ready_s)}
    lost = {i.name for i in BASE.new_instances} - {i.name for i in survivors} - done_before
    assert {i.name for i in after.new_instances} == {i.name for i in survivors}
    assert all(any(name in m for m in missing) for name in lost)
    if after.multicast is None:
        return
    assert validate_plan(current, after) == ()
    assert after.multicast.model == BASE.model
    for info in after.new_instances:
        before = BASE.multicast.layer_ready_s[info.name]
        for unit, t in enumerate(info.layer_ready_s):
            delivered_before = before[unit] <= at
            assert delivered_before == (t == 0.0)
            assert math.isfinite(t)
