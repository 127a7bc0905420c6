"""State that tells the truth: ids and names never reused, value semantics, short reprs, and
inputs the planner cannot plan refused at the door with the argument named."""

from __future__ import annotations

import pytest

from blitzplan import ClusterState, InvalidInputError, load_topology
from blitzplan.cluster import MAX_AHEAD_S, MAX_PROMPT_TOKENS, QueuedRequest
from blitzplan.scale import ScaleRequest, apply_plan, plan, replan
from tests.test_scale import MODEL, paper_state


def _ids(state: ClusterState) -> set[str]:
    return {q.id for inst in state.instances for q in inst.queue}


def test_default_request_ids_never_come_back_after_apply_plan() -> None:
    state = paper_state()
    scale = plan(state, ScaleRequest(MODEL, prefill=2, tp=2))
    ever = _ids(state)
    pair = scale.live_pairs[0]
    done_at = pair.schedule.completion_s[0]
    after = apply_plan(state, scale, at_s=done_at)
    old = after.instance(pair.old)
    assert len(old.queue) < len(state.instance(pair.old).queue)  # finished requests left
    grown = after.update_instance(pair.old, queue=[*old.queue, (0.0, 512), (0.1, 256)])
    new_ids = {q.id for q in grown.queue} - {q.id for q in old.queue}
    assert len(new_ids) == 2 and not new_ids & ever  # no id of a finished request is reused
    again = after.update_instance(pair.old, queue=[(0.0, 128)])
    assert again.queue[0].id not in ever | new_ids


def test_instance_names_are_never_reused_after_a_release() -> None:
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    first = state.add_instance(MODEL, gpus=["h0/gpu0", "h0/gpu1"], role="decode")
    state.remove_instance(first.id)
    second = state.add_instance(MODEL, gpus=["h0/gpu0", "h0/gpu1"], role="decode")
    assert (first.id, second.id) == ("i0", "i1")
    scale = plan(state, ScaleRequest(MODEL, prefill=1, tp=2))
    done = apply_plan(state, scale, at_s=scale.milestones.full_capacity_s)
    name = scale.new_instances[0].name
    done.remove_instance(name)  # released
    again = plan(done, ScaleRequest(MODEL, prefill=1, tp=2))
    assert again.new_instances[0].name != name
    assert done.copy().counters == done.counters
    assert done.counters["names"]["new"] > int(name.removeprefix("new"))


def test_state_equality_is_by_value() -> None:
    a, b = paper_state(), paper_state()
    assert a == b and a == a.copy() and a != "a state"
    b.update_instance("i0", kv_bytes_used=1)
    assert a != b
    other = ClusterState(load_topology("dgx-h100-64"), models=[MODEL])
    assert ClusterState(load_topology("paper-a800-32"), models=[MODEL]) != other
    with pytest.raises(TypeError):
        hash(a)


def test_reprs_are_short_and_summary_says_what_happens() -> None:
    state = paper_state()
    assert repr(state).startswith("ClusterState('paper-a800-32', instances=4 (2 decode")
    scale = plan(state, ScaleRequest(MODEL, prefill=2, decode=1, tp=2))
    assert len(repr(scale)) < 300 and scale.plan_id[:12] in repr(scale)
    text = scale.summary()
    assert "paper-a800-32" in text and f"{len(scale.steps)} steps" in text
    assert "mutations, releases  1, 0" in text


def test_a_tp_group_across_nvlink_groups_is_refused_with_the_argument_named() -> None:
    state = ClusterState(load_topology("paper-a100-16"), models=["llama-3-8b"])
    with pytest.raises(InvalidInputError, match=r"gpus \['h0/gpu0', 'h0/gpu1'\] are not in one"):
        state.add_instance("llama-3-8b", gpus=["h0/gpu0", "h0/gpu1"], role="decode")
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")  # TP1 is fine


@pytest.mark.parametrize(
    ("request_args", "message"),
    [
        ((1e9, 100), "arrival_s must be .* at most 3600 ahead"),
        ((MAX_AHEAD_S + 1, 100), "at most 3600 ahead"),
        ((0.0, 10**9), "prompt_tokens must be at most 10000000"),
    ],
)
def test_far_arrivals_and_huge_prompts_are_refused(request_args: tuple, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        QueuedRequest(*request_args)
    QueuedRequest(MAX_AHEAD_S, MAX_PROMPT_TOKENS)  # the limits themselves are fine


def test_replan_and_apply_refuse_another_clusters_state() -> None:
    scale = plan(paper_state(), ScaleRequest(MODEL, prefill=1, tp=2))
    assert scale.cluster == "paper-a800-32"
    other = ClusterState(load_topology("dgx-h100-64"), models=[MODEL])
    other.add_instance(MODEL, gpus=["h0/gpu2", "h0/gpu3"], role="decode")
    with pytest.raises(InvalidInputError, match="state of cluster .dgx-h100-64., but the plan"):
        replan(scale, other, at_s=0.1, failed=[])
    with pytest.raises(InvalidInputError, match="made on cluster 'paper-a800-32'"):
        apply_plan(other, scale, at_s=0.1)


def _two_hosts(nic1_gbps: float | None) -> dict:
    """Two PCIe hosts under one leaf; host 1's NIC at ``nic1_gbps`` (None: not linked)."""
    nodes: list[dict] = [{"id": "leaf", "kind": "switch", "switch": "leaf"}]
    links: list[dict] = []
    for host, rate in (("h0", 100.0), ("h1", nic1_gbps)):
        nodes += [
            {"id": f"{host}/mem", "kind": "host_mem", "host": host, "dram_gib": 512},
            {"id": f"{host}/pcie0", "kind": "switch", "switch": "pcie", "host": host},
            {"id": f"{host}/nic0", "kind": "nic", "host": host},
            {"id": f"{host}/gpu0", "kind": "gpu", "host": host, "gpu": "h100"},
        ]
        links += [
            {"a": f"{host}/gpu0", "b": f"{host}/pcie0", "gbps": 256, "medium": "pcie"},
            {"a": f"{host}/mem", "b": f"{host}/pcie0", "gbps": 256, "medium": "pcie"},
            {"a": f"{host}/nic0", "b": f"{host}/pcie0", "gbps": 256, "medium": "pcie"},
        ]
        if rate is not None:
            links.append({"a": f"{host}/nic0", "b": "leaf", "gbps": rate})
    return {"name": "two-hosts", "nodes": nodes, "links": links}


def test_a_crawling_link_and_a_host_without_uplink_are_refused_at_load() -> None:
    from blitzplan.topologies import topology_from_dict

    assert len(topology_from_dict(_two_hosts(100.0)).gpus()) == 2
    with pytest.raises(InvalidInputError, match=r"links\[7\] gbps must be at least 0.1 Gbit/s"):
        topology_from_dict(_two_hosts(1e-6))
    with pytest.raises(InvalidInputError, match="host 'h1' has no uplink"):
        topology_from_dict(_two_hosts(None))
