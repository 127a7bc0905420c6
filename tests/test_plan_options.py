"""PlanOptions: the one options object of plan(), replan() and the simulator."""

from __future__ import annotations

import dataclasses
import json

import pytest

from blitzplan import InvalidInputError
from blitzplan.scale import PlanOptions, ScalePlan, ScaleRequest, plan, replan
from blitzplan.topologies.links import LINK_EFFICIENCY
from tests.test_scale import MODEL, paper_state


def test_keywords_and_the_options_object_make_the_same_plan() -> None:
    state = paper_state()
    request = ScaleRequest(MODEL, prefill=2, tp=2)
    options = PlanOptions(live_method="best_effort", startup_s=0.1, link_efficiency=1.0)
    by_object = plan(state, request, options=options)
    by_keywords = plan(
        state, request, live_method="best_effort", startup_s=0.1, link_efficiency=1.0
    )
    assert by_object.options == options == by_keywords.options
    assert by_object.to_json() == by_keywords.to_json()
    # keywords change the object's fields and nothing else
    mixed = plan(state, request, options=options, startup_s=0.0)
    assert mixed.options == dataclasses.replace(options, startup_s=0.0)


def test_every_option_is_recorded_and_read_back() -> None:
    state = paper_state()
    options = PlanOptions(prescale_decode=True, mutate_decode=False, max_batch_tokens=4096)
    made = plan(state, ScaleRequest(MODEL, prefill=1, tp=2), options=options)
    assert ScalePlan.from_json(made.to_json()).options == options
    names = {f.name for f in dataclasses.fields(PlanOptions)}
    assert set(json.loads(made.to_json())["options"]) == names


def test_bad_options_are_named() -> None:
    state = paper_state()
    request = ScaleRequest(MODEL, prefill=1, tp=2)
    with pytest.raises(InvalidInputError, match=r"unknown planning option\(s\) \['dedline_s'\]"):
        plan(state, request, dedline_s=1.0)
    with pytest.raises(InvalidInputError, match="deadline_s must be a number of seconds > 0"):
        plan(state, request, deadline_s=0)
    with pytest.raises(InvalidInputError, match="live_method must be one of"):
        PlanOptions(live_method="fastest")
    with pytest.raises(InvalidInputError, match="options must be a PlanOptions"):
        plan(state, request, options={"method": "greedy"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"link_efficiency\['network'\] must be in"):
        PlanOptions(link_efficiency={"network": 2.0})


def test_link_efficiency_is_one_table_whatever_the_form() -> None:
    assert PlanOptions().link_efficiency == LINK_EFFICIENCY
    assert set(PlanOptions(link_efficiency=1.0).link_efficiency.values()) == {1.0}
    partial = PlanOptions(link_efficiency={"network": 0.5}).link_efficiency
    assert partial == {**LINK_EFFICIENCY, "network": 0.5}


def test_replan_carries_the_plans_options_or_takes_new_ones() -> None:
    state = paper_state()
    options = PlanOptions(live_method="best_effort", link_efficiency=0.9)
    made = plan(state, ScaleRequest(MODEL, prefill=2, tp=2), options=options)
    assert replan(made, state, at_s=0.1, failed=["i2"]).options == options
    strict = dataclasses.replace(made.options, strict=True)
    assert replan(made, state, at_s=0.1, failed=["i2"], options=strict).options == strict
