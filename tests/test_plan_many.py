"""plan_many(): several requests planned in order, earlier plans' flows as background, and the
documented rule that releases idle instances of other models when GPUs run short."""

from __future__ import annotations

import pytest

from blitzplan import ClusterState, InfeasibleError, InvalidInputError, load_topology
from blitzplan.scale import ScaleRequest, plan
from blitzplan.scale.plan_many import plan_many

OPTIONS = {"compare_baselines": False}


def two_models() -> ClusterState:
    state = ClusterState(load_topology("paper-a800-32"), models=["llama-3-8b", "qwen2.5-7b"])
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")
    state.add_instance("qwen2.5-7b", gpus=["h1/gpu0"], role="decode")
    return state


def test_requests_are_planned_in_order_and_share_the_links() -> None:
    state = two_models()
    first, second = ScaleRequest("llama-3-8b", prefill=4), ScaleRequest("qwen2.5-7b", prefill=4)
    many = plan_many(state, [first, second], **OPTIONS)
    assert [p.spec.name for p in many.plans] == ["llama-3-8b", "qwen2.5-7b"]
    gpus = [g for p in many.plans for info in p.new_instances for g in info.gpus]
    assert len(gpus) == len(set(gpus)) == 8  # no GPU given twice
    alone = plan(state, first, **OPTIONS)
    assert many.plans[0].plan_id == alone.plan_id  # the first request plans as if alone
    later = plan(state, second, **OPTIONS)
    assert (
        many.plans[1].milestones.full_capacity_s >= later.milestones.full_capacity_s - 1e-9
    )  # it gets what the first leaves, never more than alone
    assert len(many.state.background_flows) >= len(alone.steps)
    assert state == two_models()  # the caller's state is unchanged
    assert many.released == ()


def test_short_of_gpus_idle_instances_of_other_models_go_newest_first() -> None:
    state = ClusterState(load_topology("h200-8"), models=["llama-3-8b", "qwen2.5-7b"])
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")
    for k in range(1, 7):
        state.add_instance("qwen2.5-7b", gpus=[f"h0/gpu{k}"], role="decode")
    state.add_instance("qwen2.5-7b", gpus=["h0/gpu7"], role="prefill", queue=[(0.0, 512)])
    many = plan_many(state, [ScaleRequest("llama-3-8b", prefill=2)], **OPTIONS)
    assert many.released == ((0, "i6"), (0, "i5"))  # idle, newest first; i7 has a queue
    assert {g for i in many.plans[0].new_instances for g in i.gpus} == {"h0/gpu5", "h0/gpu6"}
    short = plan_many(state, [ScaleRequest("llama-3-8b", prefill=8)], **OPTIONS)
    assert [v for _, v in short.released] == ["i6", "i5", "i4", "i3", "i2", "i1"]
    assert len(short.plans[0].new_instances) == 6  # what fits, as plan() gives it
    with pytest.raises(InfeasibleError, match=r"requests\[1\] \(mistral-small-24b\)"):
        plan_many(
            state,
            [ScaleRequest("llama-3-8b", prefill=1), ScaleRequest("mistral-small-24b", prefill=1)],
            **OPTIONS,
        )  # no copy of it anywhere


def test_bad_requests_are_refused() -> None:
    state = two_models()
    with pytest.raises(InvalidInputError, match="requests must be a list"):
        plan_many(state, ScaleRequest("llama-3-8b", prefill=1))  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"requests\[1\] must be a ScaleRequest"):
        plan_many(state, [ScaleRequest("llama-3-8b", prefill=1), "qwen"])  # type: ignore[list-item]
