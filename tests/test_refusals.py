"""Refusals that were wrong: planned over routes that exist, survivor by survivor, or refused
with an error that names the stranded instances and the real reason."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from blitzplan import ClusterState, InfeasibleError, load_topology
from blitzplan.scale import (
    Options,
    ScaleRequest,
    plan,
    recover,
    replan,
    validate_plan,
    validate_replan,
)
from tests.fault_campaign import check
from tests.program_check import check_program

replan_module = importlib.import_module("blitzplan.scale.replan")


def _judged(base, state, failed, at):  # type: ignore[no-untyped-def]
    """Replan and check with the campaign's independent checker and both byte certificates."""
    after = replan(base, state, at_s=at, failed=failed)
    assert check(base, state, failed, at, after) == []
    assert validate_plan(recover(base, state, at_s=at, failed=failed).state, after) == ()
    assert check_program(after) == [] and validate_replan(base, after, at) == ()
    return after


def test_issue_18_pcie_hosts_after_a_root_complex_failure_route_over_what_exists() -> None:
    """paper-a100-16: the greedy used to chain h0/gpu2 to h0/gpu0, behind another PCIe switch
    with the root complex gone ("no route from h0/gpu0 to h0/gpu2"); every survivor plans."""
    state = ClusterState(load_topology("paper-a100-16"), models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h1/gpu7"], role="decode")
    base = plan(state, ScaleRequest("llama-3-8b", prefill=8))
    assert {g for i in base.new_instances for g in i.gpus} == {f"h0/gpu{k}" for k in range(8)}
    for fraction in (0.0, 0.3):
        at = fraction * base.milestones.full_capacity_s
        after = _judged(base, state, ["h0/rc"], at)
        assert len(after.new_instances) == 8 and not after.missing
        left = recover(base, state, at_s=at, failed=["h0/rc"]).state.topology
        inside = [s for s in after.steps if s.source.startswith("h0/gpu")]
        inside = [s for s in inside if s.destination.startswith("h0/")]
        assert all(left.has_path(s.source, s.destination) for s in inside)


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.3, 0.6])
def test_issue_18_a_pcie_link_failure_under_a_tp4_load_from_host_memory(fraction: float) -> None:
    """dgx-h100-64, llama-3-70b TP4 from the host copy on h0, its root complex cut from
    h0/pcie0: h0/gpu0 then gets its rank's bytes through spare GPUs and NVLink. It used to be
    refused from 0.1 s on (a node holding units from before took no relays)."""
    state = ClusterState(load_topology("dgx-h100-64"), models=["llama-3-70b"])
    base = plan(state, ScaleRequest("llama-3-70b", prefill=1, tp=4))
    after = _judged(
        base, state, [("h0/rc", "h0/pcie0")], fraction * base.milestones.full_capacity_s
    )
    assert [i.name for i in after.new_instances] == ["new0"] and not after.missing
    gpu0 = [s for s in after.steps if s.destination == "h0/gpu0"]
    assert gpu0 and all(s.kind.value == "allgather" for s in gpu0)


def test_a_replan_bound_holds_when_bytes_may_leave_and_come_back() -> None:
    """Four TP4 instances from h0's host copy, one lost with h0/gpu0: the instance left on h0
    may get bytes forwarded back from h1 over h0's own NICs, so the max-flow bound into it
    counts them (it used to exceed the plan's objective)."""
    state = ClusterState(load_topology("dgx-h100-64"), models=["llama-3-70b"])
    base = plan(state, ScaleRequest("llama-3-70b", prefill=4, tp=4))
    after = _judged(base, state, [("h0/pcie0", "h0/gpu0")], 0.0)
    mc = after.multicast
    assert mc.lower_bound_s <= mc.objective_s


def test_issue_18_a_host_copy_without_egress_is_refused_for_what_it_is() -> None:
    """Every GPU of the host copy's host runs a prefill instance: nothing failed, so the error
    says the host copy has no NIC to send by (not a failed link) and how to allow it."""
    for topology in ("dgx-h100-64", "paper-a100-16"):
        state = ClusterState(load_topology(topology), models=["llama-3-8b"])
        host = state.pool.host_copies[0].host
        for gpu in state.topology.gpus_of_host(host):
            state.add_instance("llama-3-8b", gpus=[gpu], role="prefill", queue=[(0.0, 512)])
        with pytest.raises(InfeasibleError) as refused:
            plan(state, ScaleRequest("llama-3-8b", prefill=2))
        message = str(refused.value)
        assert "new0" in message and "new1" in message and "failed" not in message
        assert f"every NIC of {host} carries a prefill instance's KV caches" in message
        assert "allow_prefill_sources=True" in message
        allowed = plan(state, ScaleRequest("llama-3-8b", prefill=2), allow_prefill_sources=True)
        assert validate_plan(state, allowed) == () and check_program(allowed) == []


def test_survivors_that_do_not_plan_together_are_taken_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When every survivor plans alone but not all together, the replan keeps them survivor by
    survivor and names the ones left out (here a planner that takes at most two at once)."""
    state = ClusterState(load_topology("paper-a100-16"), models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h1/gpu7"], role="decode")
    base = plan(state, ScaleRequest("llama-3-8b", prefill=4))
    real_reach = replan_module._reach

    def at_most_two(plan_, recovery, survivors, options):  # type: ignore[no-untyped-def]
        if len(survivors) > 2:
            raise InfeasibleError("too many at once")
        return real_reach(plan_, recovery, survivors, options)

    real_realize = replan_module.realize

    def realize_two(*args, **kwargs):  # type: ignore[no-untyped-def]
        if len(args[3].groups) > 2:
            raise InfeasibleError("too many at once")
        return real_realize(*args, **kwargs)

    monkeypatch.setattr(replan_module, "_reach", at_most_two)
    monkeypatch.setattr(replan_module, "realize", realize_two)
    after = replan(base, state, at_s=0.0, failed=["h1/nic0"])
    assert [i.name for i in after.new_instances] == ["new0", "new1"]
    assert [m.split(" cannot")[0] for m in after.missing] == ["new2", "new3"]
    assert "cannot be finished together with new0, new1: too many at once" in after.missing[0]
    strict = dataclasses.replace(Options.of(base.options), strict=True)
    with pytest.raises(InfeasibleError, match="new2 cannot be finished together with"):
        replan(base, state, at_s=0.0, failed=["h1/nic0"], options=strict)
