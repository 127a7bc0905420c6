"""Partial plans: with a host cut off, plan() loads what the reachable free GPUs take and lists
the rest in ``missing`` with the reason, instead of refusing the whole request."""

from __future__ import annotations

import pytest

from blitzplan import ClusterState, InfeasibleError, load_topology
from blitzplan.scale import ScaleRequest, plan, validate_plan

MODEL = "llama-3-8b"


def _uplink_cut(
    host: str, holder: str = "h0/gpu0", topology: str = "paper-a100-16", tp: int = 1
) -> ClusterState:
    """``topology`` with every link between ``host``'s NICs and the leaf failed; one decode
    instance of MODEL on ``holder``'s NVLink group (``tp`` GPUs) and the host copy are the
    holders."""
    topo = load_topology(topology)
    nics = {n for n in topo.graph.nodes if n.startswith(f"{host}/nic")}
    links = [
        (u, v)
        for u, v in topo.graph.edges
        if (u in nics) != (v in nics) and not (u.startswith(host) and v.startswith(host))
    ]
    state = ClusterState(topo.without(links=links), models=[MODEL])
    gpus = list(topo.nvlink_group_of(holder))[:tp]
    state.add_instance(MODEL, gpus=gpus, role="decode")
    return state


def test_a_cut_off_host_gives_a_partial_plan_with_the_reason() -> None:
    """Reproducer: 12 new instances, 15 free GPUs of which 8 sit on h1 (uplink failed)."""
    state = _uplink_cut("h1")
    copy = state.pool.host_copy(state.instances[0].identity)
    assert copy is not None and copy.host == "h0"  # no holder on h1
    made = plan(state, ScaleRequest(MODEL, prefill=12))
    assert len(made.new_instances) == 7
    assert all(g.startswith("h0/") for i in made.new_instances for g in i.gpus)
    assert validate_plan(state, made) == ()
    assert any("host h1" in m and "unreachable" in m for m in made.missing)
    assert any("5 prefill instances are not planned" in m for m in made.missing)
    with pytest.raises(InfeasibleError, match="host h1 are unreachable"):
        plan(state, ScaleRequest(MODEL, prefill=12), strict=True)


def test_a_request_the_reachable_gpus_hold_is_met_in_full() -> None:
    """dgx-h100-64, h0 cut off: 25 new TP2 instances, whose placement would take h0's slots
    (fullest NVLink groups first), are planned in full on the 27 reachable slots; nothing is
    missing and the cut host is in the notes."""
    state = _uplink_cut("h0", holder="h1/gpu0", topology="dgx-h100-64", tp=2)
    state.pool.drop(state.instances[0].identity)  # the host copy sits on h0: no holder there
    request = ScaleRequest(MODEL, prefill=25, tp=2)
    made = plan(state, request)
    assert len(made.new_instances) == 25 and made.missing == ()
    assert not any(g.startswith("h0/") for i in made.new_instances for g in i.gpus)
    assert validate_plan(state, made) == ()
    assert any("4 free tp=2 slots on host h0 are unreachable" in n for n in made.notes)


def test_nothing_reachable_plans_nothing_and_says_why() -> None:
    """Every free GPU cut off: an empty plan naming the hosts, not an exception."""
    state = _uplink_cut("h1")
    for k in range(1, 8):
        state.add_instance(MODEL, gpus=[f"h0/gpu{k}"], role="decode")
    made = plan(state, ScaleRequest(MODEL, prefill=2))
    assert made.new_instances == () and made.multicast is None
    assert any("host h1" in m for m in made.missing)
