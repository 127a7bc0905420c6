"""Replanning a MultiPlan after failures (blitzplan.scale.multiplan.replan_parts): each part
repaired by the one-request replan in priority order, the parts' flows sharing links in one
program, each part holding only bytes its old part delivered."""

from __future__ import annotations

import pytest

from blitzplan import (
    ClusterState,
    InfeasibleError,
    InvalidInputError,
    MultiPlan,
    ScaleRequest,
    apply_plan,
    plan,
    replan,
)
from blitzplan.models import ModelIdentity
from blitzplan.scale import validate_plan
from blitzplan.scale.byte_checks import validate_replan
from blitzplan.scale.multiplan import replan_parts
from blitzplan.wire.multiprogram import read_multiprogram_json
from tests.program_check import check_program
from tests.test_multiplan import LLAMA, OPTIONS, QWEN, two_models


def _multi() -> tuple[MultiPlan, float]:
    """Two requests of two models on paper-a800-32, and a moment half-way through the first
    part's loads."""
    state = two_models()
    multi = plan(state, [ScaleRequest(LLAMA, prefill=2), ScaleRequest(QWEN, prefill=2)], **OPTIONS)
    first = min(max(info.layer_ready_s) for p in multi.plans for info in p.new_instances)
    return multi, first / 2


def _checked(old: MultiPlan, new: MultiPlan, at_s: float) -> None:
    """Byte checks of every part against its old part, the program rules, the joint reader."""
    assert len(new.plans) == len(old.plans) and new.evictions == ()
    for before, after in zip(old.plans, new.plans, strict=True):
        assert after.spec.identity == before.spec.identity
        assert validate_replan(before, after, at_s) == ()
        assert check_program(after) == []
    read_multiprogram_json(new.program_json())


def test_a_failed_gpu_is_repaired_in_its_part_and_the_other_keeps_its_bytes() -> None:
    state = two_models()
    multi, at = _multi()
    victim = multi.plans[0].new_instances[0]
    new = replan_parts(multi, state, replan, at_s=at, failed=[victim.gpus[0]])
    _checked(multi, new, at)
    first, second = new.plans
    assert [i.name for i in first.new_instances] == [multi.plans[0].new_instances[1].name]
    assert first.missing == (f"{victim.name} lost with its GPUs {list(victim.gpus)}",)
    assert [i.name for i in second.new_instances] == [i.name for i in multi.plans[1].new_instances]
    assert first.held and second.held  # half-way, both parts keep delivered bytes
    assert state == two_models()  # the caller's state is unchanged


def test_the_later_part_shares_links_with_the_earlier_parts_replan() -> None:
    state = two_models()
    multi, at = _multi()
    new = replan_parts(multi, state, replan, at_s=at, failed=[multi.plans[0].new_instances[0].name])
    after_first = apply_plan(state, new.plans[0], at_s=0.0)
    assert validate_plan(after_first, new.plans[1]) == ()  # fair shares beside the first's
    bare = after_first.copy()
    bare.clear_background_flows()
    broken = validate_plan(bare, new.plans[1])
    assert any(f"{new.plans[0].plan_id[:8]} step" in line for line in broken), broken
    apply_plan(state, new, at_s=0.0)  # the whole applies on the cluster now


def test_a_host_failure_loses_one_part_whole_and_keeps_the_other() -> None:
    state = two_models()
    multi, at = _multi()
    host = multi.plans[0].new_instances[0].gpus[0].split("/")[0]
    new = replan_parts(multi, state, replan, at_s=at, failed=[host])
    _checked(multi, new, at)
    assert new.plans[0].new_instances == ()
    assert len(new.plans[0].missing) == len(multi.plans[0].new_instances)
    assert len(new.plans[1].new_instances) == len(multi.plans[1].new_instances)


def test_names_go_to_their_part_and_unknown_ones_are_refused() -> None:
    state = two_models()
    multi, at = _multi()
    dropped, failed = multi.plans[0].new_instances[0].name, multi.plans[1].new_instances[1].name
    new = replan_parts(multi, state, replan, at_s=at, failed=[failed], cancelled=[dropped])
    _checked(multi, new, at)
    assert new.plans[0].missing == (f"{dropped} cancelled",)
    assert len(new.plans[1].missing) == 1 and new.plans[1].missing[0].startswith(failed)
    with pytest.raises(InvalidInputError, match="cancelled names 'nobody'"):
        replan_parts(multi, state, replan, at_s=at, cancelled=["nobody"])
    with pytest.raises(InvalidInputError, match=r"plans\[0\] \(llama-3-8b\): failed names 'x9'"):
        replan_parts(multi, state, replan, at_s=at, failed=["x9"])
    with pytest.raises(InvalidInputError, match="takes a MultiPlan"):
        replan_parts(multi.plans[0], state, replan, at_s=at)  # type: ignore[arg-type]


def test_after_every_load_ended_nothing_is_left_to_plan() -> None:
    state = two_models()
    multi, _ = _multi()
    end = max(max(i.layer_ready_s) for p in multi.plans for i in p.new_instances)
    new = replan_parts(multi, state, replan, at_s=end + 1.0)
    assert [p.new_instances for p in new.plans] == [(), ()]
    assert [p.missing for p in new.plans] == [(), ()]


def test_a_part_the_replan_refuses_is_named_and_nothing_is_returned() -> None:
    """Llama's serving instance and host copy fail: no holder has the units its survivors
    lack, the one-request replan refuses, and the call names the part and returns nothing."""
    state = two_models()
    multi, at = _multi()
    sources = ["h0/gpu0", state.topology.host_mem(state.pool.host_copy(_identity(state)).host)]
    with pytest.raises(InfeasibleError, match=r"plans\[0\] \(llama-3-8b\): new0 cannot be"):
        replan_parts(multi, state, replan, at_s=at, failed=sources)
    qwen_only = replan_parts(multi, state, replan, at_s=at, failed=sources[:1])
    _checked(multi, qwen_only, at)  # the host copy alone still finishes both parts


def _identity(state: ClusterState) -> ModelIdentity:
    return next(i.identity for i in state.instances if i.model.name == LLAMA)
