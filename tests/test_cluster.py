"""Cluster state and the parameter pool: instances, sources, O(1) host copies, errors."""

from __future__ import annotations

import pytest

from blitzplan import (
    ClusterState,
    InfeasibleError,
    InvalidInputError,
    QueuedRequest,
    Role,
    load_model,
    load_topology,
)
from blitzplan.topologies import build_cluster, nvswitch_host
from blitzplan.units import GBPS, GIB


@pytest.fixture
def state() -> ClusterState:
    return ClusterState(load_topology("paper-a800-32"), models=["mistral-small-24b", "llama-3-8b"])


def test_one_host_copy_per_model_spread_over_hosts(state: ClusterState) -> None:
    copies = state.pool.host_copies
    assert len(copies) == 2
    assert len({c.host for c in copies}) == 2  # largest first on the emptiest host, then the next
    mistral = state.pool.host_copy(load_model("mistral-small-24b").identity)
    assert mistral is not None and mistral.bytes == 47_144_806_400
    assert state.pool.dram_free_bytes(mistral.host) == 1024 * GIB - mistral.bytes


def test_placing_again_is_idempotent(state: ClusterState) -> None:
    assert state.pool.place([load_model("llama-3-8b")]) == ()
    assert len(state.pool.host_copies) == 2


def test_instances_occupy_gpus(state: ClusterState) -> None:
    inst = state.add_instance(
        "mistral-small-24b", gpus=["h0/gpu0", "h0/gpu1"], role="prefill", queue=[(0.5, 1024)]
    )
    assert inst.id == "i0" and inst.tp == 2 and inst.role is Role.PREFILL
    assert inst.queue == (QueuedRequest(0.5, 1024, "i0/r0"),)
    assert "h0/gpu0" not in state.free_gpus() and len(state.free_gpus()) == 30
    updated = state.update_instance(inst.id, role="decode", kv_bytes_used=4096)
    assert updated.role is Role.DECODE and state.instance(inst.id).kv_bytes_used == 4096
    state.remove_instance(inst.id)
    assert len(state.free_gpus()) == 32


def test_sources_are_instances_then_the_host_copy(state: ClusterState) -> None:
    prefill = state.add_instance("mistral-small-24b", gpus=["h0/gpu0", "h0/gpu1"], role="prefill")
    decode = state.add_instance("mistral-small-24b", gpus=["h1/gpu0", "h1/gpu1"], role="decode")
    state.add_instance("llama-3-8b", gpus=["h2/gpu0"], role="decode")
    sources = state.sources("mistral-small-24b")
    assert [s.kind for s in sources] == ["instance", "instance", "host"]
    assert [s.instance.id for s in sources[:2] if s.instance] == [prefill.id, decode.id]
    assert [s.egress_busy for s in sources] == [True, False, False]
    assert sources[2].nodes == (state.topology.host_mem(sources[2].host or ""),)


def test_other_revision_is_never_a_source(state: ClusterState) -> None:
    state.add_instance(load_model("mistral-small-24b", revision="v2"), gpus=["h0/gpu0", "h0/gpu1"])
    sources = state.sources("mistral-small-24b")
    assert [s.kind for s in sources] == ["host"]
    assert state.sources(load_model("mistral-small-24b", revision="v2"))[0].kind == "instance"


def test_model_without_copy_or_instance_has_no_source(state: ClusterState) -> None:
    assert state.sources("qwen2.5-7b") == []


def test_aggregate_dram_too_small_is_refused_whole() -> None:
    host = nvswitch_host(
        "h100",
        gpus=2,
        nic_bytes_per_s=400 * GBPS,
        host_to_gpu_bytes_per_s=400 * GBPS,
        dram_bytes=100 * GIB,
    )
    topo = build_cluster(host, hosts=2)
    with pytest.raises(InfeasibleError, match=r"aggregate free host DRAM \(200.0 GiB on 2 hosts\)"):
        ClusterState(topo, models=["llama-3-70b", "qwen2.5-72b"])
    state = ClusterState(topo, models=["llama-3-8b"])
    with pytest.raises(InfeasibleError, match="no single host has 131.4 GiB"):
        state.pool.place([load_model("llama-3-70b"), load_model("qwen2.5-7b")])
    assert [c.identity.name for c in state.pool.host_copies] == [
        "llama-3-8b"
    ]  # nothing half-placed


def test_background_flows_are_routed(state: ClusterState) -> None:
    flow = state.add_background_flow("h0/gpu0", "h1/gpu0", name="kv")
    assert flow.edges[0] == ("h0/gpu0", "h0/pcie0")
    assert state.background_flows == (flow,)
    state.clear_background_flows()
    assert state.background_flows == ()


def test_instance_errors_are_named(state: ClusterState) -> None:
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"])
    with pytest.raises(InvalidInputError, match=r"gpus \['h0/gpu0'\] already run an instance"):
        state.add_instance("llama-3-8b", gpus=["h0/gpu0"])
    with pytest.raises(InvalidInputError, match="gpus names 'h9/gpu0', which is not a GPU"):
        state.add_instance("llama-3-8b", gpus=["h9/gpu0"])
    with pytest.raises(InvalidInputError, match="must share a host"):
        state.add_instance("mistral-small-24b", gpus=["h1/gpu0", "h2/gpu0"])
    with pytest.raises(
        InvalidInputError,
        match="llama-3-70b at tp=1 needs 131.4 GiB of weights and 2.5 GiB of KV reserve",
    ):
        state.add_instance("llama-3-70b", gpus=["h1/gpu0"])
    with pytest.raises(
        InvalidInputError,
        match="role must be one of prefill, decode, colocated, idle, loading, got 'router'",
    ):
        state.add_instance("llama-3-8b", gpus=["h1/gpu0"], role="router")
    with pytest.raises(InvalidInputError, match="prompt_tokens must be a positive integer, got 0"):
        state.add_instance("llama-3-8b", gpus=["h1/gpu0"], queue=[(0.0, 0)])
    with pytest.raises(InvalidInputError, match="instance_id 'i7' is unknown"):
        state.instance("i7")
    with pytest.raises(InvalidInputError, match="gpus must be a non-empty list"):
        state.add_instance("llama-3-8b", gpus="h1/gpu0")
    assert len(state.instances) == 1  # no failed call left anything behind


def test_unknown_model_name_in_state_is_named(state: ClusterState) -> None:
    with pytest.raises(InvalidInputError, match="model 'gpt-5' is neither a preset"):
        state.add_instance("gpt-5", gpus=["h1/gpu0"])


def test_loading_instances_hold_gpus_but_are_no_source(state: ClusterState) -> None:
    state.add_instance("llama-3-8b", gpus=["h1/gpu0"], role="loading")
    assert "h1/gpu0" not in state.free_gpus()
    assert [s.kind for s in state.sources("llama-3-8b")] == ["host"]
