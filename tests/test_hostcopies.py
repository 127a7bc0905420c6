"""O(1) host copies under per-host DRAM: placed under capacity, rebuilt elsewhere by recover()
when their host or memory fails, and a model left with no copy and no instance is named."""

from __future__ import annotations

import pytest
import yaml

from blitzplan import ClusterState, InfeasibleError
from blitzplan.cluster import HostCopy
from blitzplan.hostcopies import rebuild_host_copies
from blitzplan.models import load_model
from blitzplan.scale import ScaleRequest, plan
from blitzplan.scale.recovery import Recovery, recover
from blitzplan.topologies import Topology
from blitzplan.topologies.catalog import _catalog_dir, topology_from_dict
from blitzplan.units import GIB

MODELS = ("llama-3-8b", "qwen2.5-7b", "mistral-small-24b")


def cluster(dram_gib: float, hosts: int = 3) -> Topology:
    """paper-a800-32's hosts with ``dram_gib`` of DRAM each."""
    data = yaml.safe_load(_catalog_dir().joinpath("paper-a800-32.yaml").read_text())
    data["host"]["dram_gib"] = dram_gib
    data["cluster"] = {"hosts": hosts, "hosts_per_leaf": hosts}
    return topology_from_dict(data)


def used(state: ClusterState, host: str) -> float:
    return state.topology.dram_bytes(host) - state.pool.dram_free_bytes(host)


def test_copies_are_placed_under_each_hosts_dram_or_refused() -> None:
    state = ClusterState(cluster(60), models=MODELS)
    for host in state.topology.hosts():
        assert used(state, host) <= state.topology.dram_bytes(host)
    assert len({c.host for c in state.pool.host_copies}) == 3  # 24B + 8B + 7B > 60 GiB
    with pytest.raises(InfeasibleError, match="cannot hold one copy"):
        ClusterState(cluster(20), models=MODELS)


def test_recover_rebuilds_a_lost_copy_on_another_host_under_capacity() -> None:
    state = ClusterState(cluster(60), models=MODELS)
    state.add_instance("llama-3-8b", gpus=["h2/gpu0"], role="decode")
    scale = plan(state, ScaleRequest("llama-3-8b", prefill=1), compare_baselines=False)
    lost = state.pool.host_copy(load_model("llama-3-8b").identity)
    assert lost is not None
    recovery = recover(scale, state, at_s=0.0, failed=[lost.host])
    (rebuilt,) = [c for c in recovery.rebuilds if c.identity == lost.identity]
    assert rebuilt.host != lost.host and rebuilt.host in recovery.state.topology.hosts()
    assert recovery.state.pool.host_copy(lost.identity) is None  # not there before its bytes
    assert any(f"rebuilt on {rebuilt.host} from h2/gpu0" in s for s in recovery.host_copies)
    after = recovery.state.copy()
    for copy in recovery.rebuilds:
        after.pool.add(copy)  # every rebuild fits the DRAM it was placed under
    for host in after.topology.hosts():
        assert used(after, host) <= after.topology.dram_bytes(host)


def _llama_copy_lost(dram_gib: float) -> tuple[HostCopy, Recovery]:
    """Two hosts of ``dram_gib`` holding the host copies of llama-3-8b and qwen2.5-7b, qwen
    decoding on h0: llama's copy, and the recovery of a qwen plan when its memory fails."""
    state = ClusterState(cluster(dram_gib, hosts=2), models=["llama-3-8b", "qwen2.5-7b"])
    state.add_instance("qwen2.5-7b", gpus=["h0/gpu0"], role="decode")
    copy = state.pool.host_copy(load_model("llama-3-8b").identity)
    assert copy is not None
    scale = plan(state, ScaleRequest("qwen2.5-7b", prefill=1), compare_baselines=False)
    return copy, recover(scale, state, at_s=0.0, failed=[copy.node])


def test_a_failed_memory_is_not_chosen_again_and_no_room_is_reported() -> None:
    # 20 GiB hosts hold one ~15 GiB copy each: a lost copy has nowhere to go
    copy, recovery = _llama_copy_lost(20)
    assert recovery.rebuilds == ()  # not on the failed memory, and the other host is full
    assert any("cannot be rebuilt" in s for s in recovery.host_copies)
    assert any(
        "llama-3-8b" in s and "no instance holding its weights" in s for s in recovery.host_copies
    )
    copy, recovery = _llama_copy_lost(40)
    assert [c.host for c in recovery.rebuilds] == ["h1" if copy.host == "h0" else "h0"]
    assert not any("no instance holding" in s for s in recovery.host_copies)


def test_nothing_lost_nothing_rebuilt_and_the_state_is_untouched() -> None:
    state = ClusterState(cluster(200), models=MODELS)
    copies, said = rebuild_host_copies(state, state)
    assert copies == () and said == ()
    dropped = state.copy()
    model = load_model("qwen2.5-7b")
    dropped.pool.drop(model.identity)
    copies, said = rebuild_host_copies(state, dropped, avoid={"h0", "h1"})
    assert [c.host for c in copies] == ["h2"] and dropped.pool.host_copy(model.identity) is None
    assert copies[0].bytes == model.total_bytes and "from the checkpoint on storage" in said[0]
    assert copies[0].bytes <= 200 * GIB
