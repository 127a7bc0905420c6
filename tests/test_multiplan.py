"""plan(state, [request, ...]): several requests in priority order as one MultiPlan, the earlier
plans' flows as background of the later ones, the release rule when GPUs run short, all or
nothing, its documents and the executor's reader of the combined program."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

import blitzplan
from blitzplan import (
    ClusterState,
    InfeasibleError,
    InvalidInputError,
    MultiPlan,
    ScalePlan,
    ScaleRequest,
    apply_plan,
    load_topology,
    plan,
    replan,
)
from blitzplan.scale import validate_plan
from blitzplan.scale.export import program_json
from blitzplan.scale.multiplan import replan_parts
from blitzplan.scale.statefile import save_state
from blitzplan.wire.multiprogram import check_joint, read_multiprogram_json
from blitzplan.wire.scaleprogram import read_program_json

OPTIONS = {"compare_baselines": False, "refine_budget": None}  # equal input, identical plans
LLAMA, QWEN = "llama-3-8b", "qwen2.5-7b"


def two_models(topology: str = "paper-a800-32") -> ClusterState:
    state = ClusterState(load_topology(topology), models=[LLAMA, QWEN])
    state.add_instance(LLAMA, gpus=["h0/gpu0"], role="decode")
    state.add_instance(QWEN, gpus=["h0/gpu1"], role="decode")
    return state


def test_later_requests_share_the_links_the_earlier_ones_leave() -> None:
    state = two_models()
    first, second = ScaleRequest(LLAMA, prefill=1), ScaleRequest(QWEN, prefill=1)
    many = plan(state, [first, second], **OPTIONS)
    assert isinstance(many, MultiPlan) and [p.spec.name for p in many.plans] == [LLAMA, QWEN]
    assert many.plans[0].plan_id == plan(state, first, **OPTIONS).plan_id  # first: as if alone
    made_on = apply_plan(state, many.plans[0], at_s=0.0)
    later = many.plans[1]
    assert validate_plan(made_on, later) == ()  # its rates are fair shares beside the first's
    bare = made_on.copy()
    bare.clear_background_flows()  # the same cluster without the first request's flows
    broken = validate_plan(bare, later)
    assert any(f"{many.plans[0].plan_id[:8]} step" in line for line in broken), broken
    alone = plan(bare, second, **OPTIONS)
    assert [i.gpus for i in alone.new_instances] == [i.gpus for i in later.new_instances]
    assert later.milestones.full_capacity_s > alone.milestones.full_capacity_s * 1.05
    assert state == two_models()  # the caller's state is unchanged
    assert many.evictions == ()


def test_one_request_in_a_list_is_that_request_and_one_alone_is_a_scaleplan() -> None:
    state = two_models()
    request = ScaleRequest(LLAMA, prefill=2)
    single = plan(state, request, **OPTIONS)
    assert isinstance(single, ScalePlan)
    assert plan(state, [request], **OPTIONS).plans[0].plan_id == single.plan_id
    assert apply_plan(state, MultiPlan((single,)), at_s=0.01) == apply_plan(
        state, single, at_s=0.01
    )


def test_no_later_request_places_an_instance_on_an_earlier_ones_relay() -> None:
    state = two_models("paper-a100-16")  # no NVLink: spare GPUs relay over PCIe
    first, second = ScaleRequest(LLAMA, prefill=2), ScaleRequest(QWEN, prefill=2)
    many = plan(state, [first, second], **OPTIONS)
    relays = {s.destination for s in many.plans[0].steps if s.instance is None}
    assert relays and relays.isdisjoint(g for i in many.plans[1].new_instances for g in i.gpus)
    check_joint(many.plans, many.evictions)
    # planned one after the other without holding the relays, the second lands on one: refused
    naive = plan(apply_plan(state, many.plans[0], at_s=0.0), second, **OPTIONS)
    assert relays & {g for i in naive.new_instances for g in i.gpus}
    with pytest.raises(InvalidInputError, match="writes into"):
        check_joint((many.plans[0], naive))
    with pytest.raises(InvalidInputError, match=r"parts\[0\] step \d+: it writes into"):
        read_multiprogram_json(MultiPlan((many.plans[0], naive)).program_json())


def test_short_of_gpus_idle_instances_of_other_models_go_newest_first() -> None:
    state = ClusterState(load_topology("h200-8"), models=[LLAMA, QWEN])
    state.add_instance(LLAMA, gpus=["h0/gpu0"], role="decode")
    for k in range(1, 7):
        state.add_instance(QWEN, gpus=[f"h0/gpu{k}"], role="decode")
    state.add_instance(QWEN, gpus=["h0/gpu7"], role="prefill", queue=[(0.0, 512)])
    many = plan(state, [ScaleRequest(LLAMA, prefill=2)], **OPTIONS)
    assert [(e.request, e.instance) for e in many.evictions] == [(0, "i6"), (0, "i5")]
    assert {g for i in many.plans[0].new_instances for g in i.gpus} == {"h0/gpu5", "h0/gpu6"}
    short = plan(state, [ScaleRequest(LLAMA, prefill=8)], **OPTIONS)
    assert [e.instance for e in short.evictions] == ["i6", "i5", "i4", "i3", "i2", "i1"]
    assert len(short.plans[0].new_instances) == 6  # what fits, as plan() gives it
    assert short.plans[0].missing  # and says what it could not get
    assert MultiPlan.from_json(many.to_json()) == many
    assert read_multiprogram_json(many.program_json()).evictions == many.evictions
    after = apply_plan(state, many, at_s=0.0)  # the evicted go, the new take their GPUs
    assert {"i5", "i6"}.isdisjoint(i.id for i in after.instances)
    assert {i.id for i in after.instances if set(i.gpus) & {"h0/gpu5", "h0/gpu6"}} == {
        "new0",
        "new1",
    }


def test_never_released_what_an_earlier_plan_relies_on() -> None:
    state = ClusterState(load_topology("h200-8"), models=[LLAMA, QWEN])
    state.add_instance(LLAMA, gpus=["h0/gpu0"], role="decode")
    for k in range(1, 6):
        state.add_instance(QWEN, gpus=[f"h0/gpu{k}"], role="decode")
    requests = [ScaleRequest(QWEN, prefill=1), ScaleRequest(LLAMA, prefill=5)]
    many = plan(state, requests, **OPTIONS)
    senders = {s.source for s in many.plans[0].steps}
    relied = {i.id for i in state.instances if senders & set(i.gpus)}
    assert relied & {"i2", "i3", "i4", "i5"}  # the rule has something to skip
    expected = [i for i in ("i5", "i4", "i3", "i2", "i1") if i not in relied][:4]
    assert [(e.request, e.instance, e.model) for e in many.evictions] == [
        (1, i, QWEN) for i in expected
    ]
    assert all(e.model != LLAMA for e in many.evictions)  # never the requesting model's
    assert len(many.plans[1].new_instances) == 5


def test_a_refused_request_refuses_the_whole_call_and_changes_nothing() -> None:
    state = two_models()
    before = state.copy()
    requests = [ScaleRequest(LLAMA, prefill=1), ScaleRequest("mistral-small-24b", prefill=1)]
    with pytest.raises(InfeasibleError, match=r"requests\[1\] \(mistral-small-24b\)"):
        plan(state, requests, **OPTIONS)  # no copy of it anywhere
    too_many = [ScaleRequest(LLAMA, prefill=1), ScaleRequest(QWEN, prefill=40)]
    with pytest.raises(InfeasibleError, match=r"requests\[1\] \(qwen2.5-7b\)"):
        plan(state, too_many, strict=True, **OPTIONS)
    assert state == before


def test_apply_is_all_or_nothing_and_moves_every_part_on() -> None:
    state = two_models()
    state.add_instance(LLAMA, gpus=["h0/gpu2"], role="prefill", queue=[(0.0, 2048)] * 12)
    many = plan(state, [ScaleRequest(LLAMA, prefill=2), ScaleRequest(QWEN, prefill=2)], **OPTIONS)
    first = many.plans[0]
    assert first.live_pairs  # it pairs live with i2: its done batches leave i2
    for at in (
        first.milestones.full_capacity_s / 2,
        max(first.live_pairs[0].schedule.completion_s),
    ):
        both, alone = apply_plan(state, many, at_s=at), apply_plan(state, first, at_s=at)
        for info in first.new_instances:  # the first part is as far as it is alone
            assert both.instance(info.name).loading == alone.instance(info.name).loading
        assert both.instance("i2").queue == alone.instance("i2").queue
        assert len(both.background_flows) >= len(alone.background_flows)
    assert len(both.instance("i2").queue) < 12  # the live batches done by then are gone
    half = apply_plan(state, many, at_s=first.milestones.full_capacity_s / 2)
    running = {f.name.split()[0] for f in half.background_flows}
    assert running == {first.plan_id[:8], many.plans[1].plan_id[:8]}  # both parts still send
    done = apply_plan(state, many, at_s=many.full_capacity_s + 1.0)
    assert not done.background_flows
    assert [str(i.role) for i in done.instances[3:]] == ["prefill"] * 4
    taken = state.copy()
    taken.add_instance(LLAMA, gpus=[many.plans[1].new_instances[0].gpus[0]], role="decode")
    before = taken.copy()
    with pytest.raises(InvalidInputError, match=r"plans\[1\] \(qwen2.5-7b\): .*not free"):
        apply_plan(taken, many, at_s=0.0)
    assert taken == before


def test_documents_round_trip_and_the_executor_reader_takes_the_program() -> None:
    state = two_models()
    many = plan(state, [ScaleRequest(LLAMA, prefill=2), ScaleRequest(QWEN, prefill=2)], **OPTIONS)
    text = many.to_json()
    back = MultiPlan.from_json(text)
    assert back == many and back.plan_id == many.plan_id and back.to_json() == text
    assert json.loads(text)["schema"] == "blitzplan.multiplan"
    tampered = text.replace('"prefill":2', '"prefill":3', 1)
    with pytest.raises(InvalidInputError, match="plan_id"):
        MultiPlan.from_json(tampered)
    program = read_multiprogram_json(many.program_json())
    assert program.plan_id == many.plan_id
    ids = [s.id for part in program.parts for s in part.steps]
    assert len(ids) == len(set(ids)) == sum(len(p.steps) for p in many.plans)
    for part, made, offset in zip(program.parts, many.plans, program.step_offsets, strict=True):
        alone = read_program_json(program_json(made))
        assert part.plan_id == made.plan_id
        assert [s.id - offset for s in part.steps] == [s.id for s in alone.steps]
        assert part.new_instances == alone.new_instances
    gpus = [g for part in program.parts for i in part.new_instances for g in i.gpus]
    assert len(gpus) == len(set(gpus))
    bad = json.loads(many.program_json())
    bad["step_offsets"] = [0, 0]
    from blitzplan.wire.canonical import signed_json

    bad.pop("program_id")
    with pytest.raises(InvalidInputError, match="unique across the program"):
        read_multiprogram_json(signed_json(bad, "program_id")[0])


def test_replan_of_a_multiplan_is_its_parts_repaired_in_order() -> None:
    state = two_models()
    many = plan(state, [ScaleRequest(LLAMA, prefill=2), ScaleRequest(QWEN, prefill=1)], **OPTIONS)
    cancelled = [many.plans[0].new_instances[0].name]
    whole = replan(many, state, at_s=0.01, cancelled=cancelled)
    assert isinstance(whole, MultiPlan)
    assert [len(p.new_instances) for p in whole.plans] == [1, 1]
    parts = replan_parts(many, state, replan, at_s=0.01, cancelled=cancelled)
    assert whole.to_json() == parts.to_json()
    recovery = blitzplan.recover(many, state, at_s=0.01, cancelled=cancelled)
    assert recovery.lost == (f"{cancelled[0]} cancelled",)
    assert [i.name for i in recovery.survivors] == [
        i.name for p in whole.plans for i in p.new_instances
    ]
    with pytest.raises(InvalidInputError, match="plan must be a ScalePlan or a MultiPlan"):
        blitzplan.recover([many], state, at_s=0.01)  # type: ignore[arg-type]


def test_bad_requests_are_refused() -> None:
    state = two_models()
    with pytest.raises(InvalidInputError, match="requests is empty"):
        plan(state, [])
    with pytest.raises(InvalidInputError, match=r"requests\[1\] must be a ScaleRequest"):
        plan(state, [ScaleRequest(LLAMA, prefill=1), "qwen"])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="request must be a ScaleRequest"):
        plan(state, 3)  # type: ignore[call-overload]


def test_deadline_bounds_the_whole_call() -> None:
    state = two_models()
    requests = [ScaleRequest(LLAMA, prefill=1), ScaleRequest(QWEN, prefill=1)]
    many = plan(state, requests, deadline_s=10.0, **OPTIONS)
    shares = [p.options.deadline_s for p in many.plans]
    assert shares[0] is not None and 0 < shares[0] <= 5.0  # an equal share of what is left
    assert shares[1] is not None and 0 < shares[1] < 10.0  # the last: all that is left


def test_the_command_line_plans_several_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from blitzplan.cli import main
    from blitzplan.scale.statefile import save_state

    path, out, program = tmp_path / "cluster.yaml", tmp_path / "multi.json", tmp_path / "prog.json"
    save_state(two_models(), path)
    args = ["plan", "--state", str(path), "--request", f"{LLAMA}:prefill=2"]
    args += ["--request", f"{QWEN}:prefill=1,decode=1", "--out", str(out)]
    assert main([*args, "--program-out", str(program)]) == 0
    assert "requests[1] qwen2.5-7b:prefill=1,decode=1" in capsys.readouterr().out
    multi = MultiPlan.from_json(out.read_text())
    assert [p.request["prefill"] for p in multi.plans] == [2, 1]
    assert read_multiprogram_json(program.read_text()).plan_id == multi.plan_id
    assert main([*args[:5], "--prefill", "1"]) == 2
    assert "--prefill belong to one request" in capsys.readouterr().err
    assert main(["plan", "--state", str(path), "--request", f"{LLAMA}:prefil=2"]) == 2
    assert "'prefil=2' is not prefill=N" in capsys.readouterr().err


def test_a_later_scale_down_never_frees_a_gpu_an_earlier_part_still_sends_from() -> None:
    state = ClusterState(load_topology("h200-8"), models=[LLAMA, QWEN])
    for gpu in ("h0/gpu6", "h0/gpu2", "h0/gpu4"):
        state.add_instance(LLAMA, gpus=[gpu], role="decode")
    requests = [
        ScaleRequest(LLAMA, prefill=2),  # streams from the decode instances
        ScaleRequest(QWEN, decode=1),
        ScaleRequest(LLAMA, decode=-1),  # drains one of them (idle: at once)
        ScaleRequest(LLAMA, prefill=3, decode=-1),
    ]
    many = plan(state, requests, **OPTIONS)
    senders = {s.source for s in many.plans[0].steps} & set(state.topology.gpus())
    released = {g for p in many.plans[2:] for r in p.releases for g in r.gpus}
    assert senders & released  # the case: a later part releases a GPU the first sends from
    later = {g for p in many.plans[1:] for i in p.new_instances for g in i.gpus}
    assert senders.isdisjoint(later)  # ... and no later part places an instance there
    read_multiprogram_json(many.program_json())


@pytest.mark.parametrize("seed", range(8))
def test_random_calls_give_programs_the_reader_accepts(seed: int) -> None:
    """Property: several random requests (adds and removals, two models, small clusters) give a
    MultiPlan whose combined program the executor's reader accepts, whose document reads back
    equal, and that apply_plan applies at any moment."""
    rng = random.Random(seed)
    topology = load_topology(rng.choice(["h200-8", "paper-a100-16", "paper-a800-32"]))
    state = ClusterState(topology, models=[LLAMA, QWEN])
    gpus = rng.sample(topology.gpus(), rng.randint(2, 6))
    for gpu in gpus:
        role = rng.choice(["prefill", "decode", "decode"])
        queue = [(0.0, 1024)] * rng.randint(0, 3) if role == "prefill" else []
        state.add_instance(rng.choice([LLAMA, QWEN]), gpus=[gpu], role=role, queue=queue)
    requests = [
        ScaleRequest(
            rng.choice([LLAMA, QWEN]), prefill=rng.randint(0, 3), decode=rng.randint(-1, 2)
        )
        for _ in range(rng.randint(2, 4))
    ]
    many = plan(state, requests, **OPTIONS)
    read_multiprogram_json(many.program_json())
    assert MultiPlan.from_json(many.to_json()) == many
    for at in (0.0, many.full_capacity_s / 2, many.full_capacity_s + 1.0):
        after = apply_plan(state, many, at_s=at)
        names = {i.name for p in many.plans for i in p.new_instances}
        assert names <= {i.id for i in after.instances}


def queued_pair_state(queues: tuple[int, ...]) -> ClusterState:
    """llama-3-8b on paper-a800-32: a prefill instance per queue length (2,048-token prompts)
    and one decode instance."""
    state = ClusterState(load_topology("paper-a800-32"), models=[LLAMA])
    for k, length in enumerate(queues):
        state.add_instance(LLAMA, gpus=[f"h0/gpu{k}"], role="prefill", queue=[(0.0, 2048)] * length)
    state.add_instance(LLAMA, gpus=["h0/gpu7"], role="decode")
    return state


def test_an_old_instance_pairs_live_with_one_part_only() -> None:
    # the reproducer: both parts paired i0 over the same requests (served twice)
    state = queued_pair_state((8,))
    many = plan(state, [ScaleRequest(LLAMA, prefill=2)] * 2, **OPTIONS)
    assert [(p.new, p.old) for part in many.plans for p in part.live_pairs] == [("new0", "i0")]
    # with a second queued instance, the later part pairs with that one
    state = queued_pair_state((8, 4))
    many = plan(state, [ScaleRequest(LLAMA, prefill=1)] * 2, **OPTIONS)
    olds = [p.old for part in many.plans for p in part.live_pairs]
    assert olds == ["i0", "i1"]
    ids = [r for part in many.plans for p in part.live_pairs for b in p.batches for r in b]
    assert len(ids) == len(set(ids)) == 12


def test_a_plan_made_while_a_live_instance_loads_pairs_its_old_instance_with_no_other(
    tmp_path: Path,
) -> None:
    state = queued_pair_state((8,))
    first = plan(state, ScaleRequest(LLAMA, prefill=1), **OPTIONS)
    assert [(p.new, p.old) for p in first.live_pairs] == [("new0", "i0")]
    midway = apply_plan(state, first, at_s=first.milestones.full_capacity_s / 4)
    loading = midway.instance("new0").loading
    assert loading is not None and loading.relieves == "i0"
    save_state(midway, tmp_path / "s.json")  # the record survives a state file
    assert blitzplan.load_state(tmp_path / "s.json") == midway
    assert plan(midway, ScaleRequest(LLAMA, prefill=1), **OPTIONS).live_pairs == ()


def test_the_joint_rules_refuse_an_old_instance_paired_in_two_parts() -> None:
    state = queued_pair_state((8,))
    first = plan(state, ScaleRequest(LLAMA, prefill=1), **OPTIONS)
    after = apply_plan(state, first, at_s=0.0)
    record = after.instance("new0").loading
    assert record is not None
    after.update_instance("new0", loading=dataclasses.replace(record, relieves=None))
    second = plan(after, ScaleRequest(LLAMA, prefill=1), **OPTIONS)  # as the old planner did
    assert [p.old for p in second.live_pairs] == ["i0"]
    with pytest.raises(InvalidInputError, match=r"parts\[1\] pairs new1 with 'i0'.*served twice"):
        check_joint([first, second])
