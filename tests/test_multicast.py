"""Multicast planning: hand-computed fixtures, the validator on every method, properties, errors."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blitzplan import ClusterState, InfeasibleError, InvalidInputError, load_model, load_topology
from blitzplan.models import ModelSpec
from blitzplan.multicast import METHODS, MulticastPlan, plan_multicast, validate_multicast
from blitzplan.solvers import SolveStatus
from blitzplan.topologies import build_cluster, pcie_host
from blitzplan.units import GBPS, MIB
from tests.strategies import random_cluster

SMALL = {
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "vocab_size": 4000,
}
CHUNK = 1 * MIB
RATE = 100 * GBPS
# one network hop between two single-GPU PCIe hosts: gpu-pcie, pcie-nic (1 us each), nic-leaf,
# leaf-nic (2 us each), nic-pcie, pcie-gpu (1 us each)
HOP_LATENCY_S = 8e-6


def uniform_cluster(hosts: int, hosts_per_leaf: int | None = None, oversubscription: float = 1.0):
    host = pcie_host(
        "a100-pcie",
        gpus=1,
        gpus_per_pcie_switch=1,
        gpu_pcie_bytes_per_s=RATE,
        host_to_gpu_bytes_per_s=RATE,
        nic_bytes_per_s=RATE,
    )
    return build_cluster(
        host, hosts=hosts, hosts_per_leaf=hosts_per_leaf, oversubscription=oversubscription
    )


def assert_valid(state: ClusterState, plan: MulticastPlan) -> None:
    assert validate_multicast(state, plan) == ()


def test_three_node_chain_by_hand() -> None:
    """Source h0 -> h1 -> h2 over identical 100 Gbps links: the tail lags by one chunk + latency."""
    spec = load_model(SMALL)
    state = ClusterState(uniform_cluster(3))
    state.add_instance(spec, gpus=["h0/gpu0"], role="decode")
    plan = plan_multicast(state, spec, targets=[["h1/gpu0"], ["h2/gpu0"]], chunk_bytes=CHUNK)
    assert_valid(state, plan)
    assert [(c.source, len(c.nodes)) for c in plan.chains] == [(0, 2)]
    total = spec.total_bytes / RATE
    first_layer = (spec.embedding_bytes + spec.layer_bytes) / RATE
    assert plan.ready_at_s["new0"] == pytest.approx(total, rel=1e-9)
    assert plan.ready_at_s["new1"] == pytest.approx(total + CHUNK / RATE + HOP_LATENCY_S, rel=1e-9)
    assert plan.layer_ready_s["new0"][1] == pytest.approx(first_layer, rel=1e-9)
    assert plan.live == ()
    assert plan.rates == pytest.approx((RATE, RATE))


def test_two_sources_four_targets_on_two_leaves_by_hand() -> None:
    """Each leaf holds one source and two targets: two chains that never cross the spine."""
    spec = load_model(SMALL)
    topo = uniform_cluster(6, hosts_per_leaf=3, oversubscription=4)
    state = ClusterState(topo)
    state.add_instance(spec, gpus=["h0/gpu0"], role="decode")
    state.add_instance(spec, gpus=["h3/gpu0"], role="idle")
    targets = [["h1/gpu0"], ["h4/gpu0"], ["h2/gpu0"], ["h5/gpu0"]]
    expected = spec.total_bytes / RATE + CHUNK / RATE + HOP_LATENCY_S
    for method in ("greedy", "exact"):
        plan = plan_multicast(
            state, spec, targets=targets, chunk_bytes=CHUNK, method=method, live=2
        )
        assert_valid(state, plan)
        assert plan.objective_s == pytest.approx(expected, rel=1e-9)
        assert all("spine" not in {u for e in f.edges for u in e} for f in plan.flows)
        assert len(plan.live) == 2
    assert plan.status is SolveStatus.OPTIMAL


def test_nvlink_group_receives_sharded_and_all_gathers() -> None:
    """Four TP1 instances in one NVSwitch host: each GPU receives a quarter over its NIC."""
    topo = load_topology("dgx-h100-64")
    state = ClusterState(topo, models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")
    plan = plan_multicast(state, "llama-3-8b", targets=[[f"h1/gpu{i}"] for i in range(4)])
    assert_valid(state, plan)
    (hop,) = plan.hops
    assert sorted(lane.fraction for lane in hop.lanes) == [0.25] * 4
    assert len(plan.allgathers) == 1 and len(plan.allgathers[0].lanes) == 4
    nvlink = {e for lane in plan.allgathers[0].lanes for e in plan.flows[lane.flow].edges}
    assert all("nvswitch" in u or "nvswitch" in v for u, v in nvlink)
    # the source stripes over the spare GPUs' NICs of its NVLink group
    assert len({lane.exit for lane in hop.lanes}) == 4


def test_intra_host_chain_rides_nvlink() -> None:
    topo = load_topology("h200-8")
    state = ClusterState(topo, models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")
    plan = plan_multicast(state, "llama-3-8b", count=2)
    assert_valid(state, plan)
    edges = {e for f in plan.flows for e in f.edges}
    assert all("nic" not in u and "nic" not in v for u, v in edges)


def paper_state() -> ClusterState:
    state = ClusterState(load_topology("paper-a800-32"), models=["mistral-small-24b"])
    for i, role in enumerate(["prefill", "prefill", "decode", "decode"]):
        state.add_instance(
            "mistral-small-24b", gpus=[f"h0/gpu{2 * i}", f"h0/gpu{2 * i + 1}"], role=role
        )
    return state


@pytest.mark.parametrize("method", METHODS)
def test_every_method_validates_on_the_paper_scenario(method: str) -> None:
    state = paper_state()
    plan = plan_multicast(
        state, "mistral-small-24b", count=6, tp=2, live=2, method=method, time_limit_s=30
    )
    assert_valid(state, plan)
    assert plan.method == method and len(plan.instances) == 6
    assert plan.lower_bound_s <= plan.objective_s


def test_prefill_sources_are_pruned_unless_allowed() -> None:
    state = paper_state()
    plan = plan_multicast(state, "mistral-small-24b", count=6, tp=2)
    senders = {plan.nodes[h.sender].instance_id for h in plan.hops} - {None}
    assert senders == {"i2", "i3"}
    spread = [[f"h{h}/gpu0", f"h{h}/gpu1"] for h in (1, 2, 3)]
    pruned = plan_multicast(state, "mistral-small-24b", targets=spread, tp=2)
    allowed = plan_multicast(
        state, "mistral-small-24b", targets=spread, tp=2, allow_prefill_sources=True
    )
    assert_valid(state, allowed)
    assert (len(pruned.chains), len(allowed.chains)) == (2, 3)
    assert allowed.objective_s < pruned.objective_s


def test_host_copy_is_the_source_when_no_instance_serves() -> None:
    state = ClusterState(load_topology("paper-a800-32"), models=["llama-3-8b"])
    plan = plan_multicast(state, "llama-3-8b", count=3)
    assert_valid(state, plan)
    assert [plan.nodes[c.source].kind.value for c in plan.chains] == ["host"]


def test_a_failed_source_is_never_used() -> None:
    state = paper_state()
    plan = plan_multicast(state, "mistral-small-24b", count=2, tp=2, exclude=["i2"])
    assert_valid(state, plan)
    assert {plan.nodes[c.source].instance_id for c in plan.chains} == {"i3"}
    fallback = plan_multicast(state, "mistral-small-24b", count=2, tp=2, exclude=["i2", "i3"])
    assert plan_multicast is not None and fallback.nodes[0].kind.value == "host"
    assert_valid(state, fallback)


def test_deterministic() -> None:
    a = plan_multicast(paper_state(), "mistral-small-24b", count=6, tp=2, live=2)
    b = plan_multicast(paper_state(), "mistral-small-24b", count=6, tp=2, live=2)
    assert dataclasses.replace(a, solve_s=0.0) == dataclasses.replace(b, solve_s=0.0)


# --- bad input -------------------------------------------------------------------------------


def test_bad_targets_are_named() -> None:
    state = paper_state()
    with pytest.raises(InvalidInputError, match="targets names 'h0/gpu0', which is not free"):
        plan_multicast(state, "mistral-small-24b", targets=[["h0/gpu0", "h1/gpu0"]], tp=2)
    with pytest.raises(InvalidInputError, match="'h9/gpu0', which is not a GPU"):
        plan_multicast(state, "mistral-small-24b", targets=[["h9/gpu0", "h1/gpu0"]], tp=2)
    with pytest.raises(InvalidInputError, match="exactly one of count and targets"):
        plan_multicast(state, "mistral-small-24b", count=1, targets=[["h1/gpu0"]])


def test_no_source_and_excluded_sources_are_named() -> None:
    state = paper_state()
    with pytest.raises(InfeasibleError, match="no source holds model qwen2.5-7b"):
        plan_multicast(state, "qwen2.5-7b", count=1)
    with pytest.raises(InfeasibleError, match="all of .* are excluded"):
        plan_multicast(state, "mistral-small-24b", count=1, tp=2, exclude=["h0"])


def test_option_errors_are_named() -> None:
    state = paper_state()
    with pytest.raises(InvalidInputError, match="tp=16 is larger than the largest NVLink group"):
        plan_multicast(
            state,
            load_model({**SMALL, "num_attention_heads": 16, "num_key_value_heads": 16}),
            count=1,
            tp=16,
        )
    with pytest.raises(InvalidInputError, match="chunk_bytes must be a positive integer, got 0"):
        plan_multicast(state, "mistral-small-24b", count=1, tp=2, chunk_bytes=0)
    with pytest.raises(InvalidInputError, match=r"live must be an integer in 0..2.*got 3"):
        plan_multicast(state, "mistral-small-24b", count=2, tp=2, live=3)
    with pytest.raises(InvalidInputError, match="method must be one of greedy, exact"):
        plan_multicast(state, "mistral-small-24b", count=1, tp=2, method="magic")
    with pytest.raises(InvalidInputError, match="needs live >= 1"):
        plan_multicast(state, "mistral-small-24b", count=1, tp=2, objective="live_ready")
    with pytest.raises(InvalidInputError, match="exclude names 'i99'"):
        plan_multicast(state, "mistral-small-24b", count=1, tp=2, exclude=["i99"])
    with pytest.raises(InvalidInputError, match="not inside one NVLink group"):
        plan_multicast(state, "mistral-small-24b", targets=[["h1/gpu0", "h2/gpu0"]], tp=2)


def test_validator_catches_broken_plans() -> None:
    state = paper_state()
    plan = plan_multicast(state, "mistral-small-24b", count=2, tp=2)
    late = dataclasses.replace(plan, ready_at_s={k: v + 1 for k, v in plan.ready_at_s.items()})
    assert any("ready_at_s" in p for p in validate_multicast(state, late))
    fast = dataclasses.replace(plan, rates=tuple(2 * r for r in plan.rates))
    assert any("fair share gives" in p for p in validate_multicast(state, fast))
    hop = plan.hops[0]
    half = dataclasses.replace(hop, lanes=hop.lanes[:1])
    assert any(
        "receives" in p
        for p in validate_multicast(state, dataclasses.replace(plan, hops=(half, *plan.hops[1:])))
    )
    bound = dataclasses.replace(plan, lower_bound_s=plan.objective_s * 2)
    assert any("lower bound" in p for p in validate_multicast(state, bound))


# --- properties ------------------------------------------------------------------------------

PROPERTY_MODEL = {**SMALL, "num_hidden_layers": 3}


@st.composite
def multicast_case(draw: st.DrawFn, max_targets: int = 4) -> tuple[ClusterState, ModelSpec, dict]:
    topo = draw(random_cluster())
    spec = load_model(PROPERTY_MODEL)
    state = ClusterState(topo, models=[spec])
    groups: dict[tuple[str, ...], list[str]] = {}
    for gpu in topo.gpus():
        groups.setdefault(topo.nvlink_group_of(gpu), []).append(gpu)
    tp = draw(st.sampled_from([1, 2])) if min(map(len, groups)) >= 2 else 1
    slots = [tuple(g[i : i + tp]) for g in groups.values() for i in range(0, len(g) - tp + 1, tp)]
    sources = draw(st.integers(0, min(3, len(slots) - 1)))
    for slot in draw(st.permutations(slots))[:sources]:
        state.add_instance(
            spec, gpus=list(slot), role=draw(st.sampled_from(["decode", "idle", "prefill"]))
        )
    free_slots = len(slots) - sources
    count = draw(st.integers(1, min(max_targets, free_slots)))
    options = {
        "count": count,
        "tp": tp,
        "live": draw(st.integers(0, count)),
        "allow_prefill_sources": draw(st.booleans()),
        "chunk_bytes": draw(st.sampled_from([256 * 1024, 4 * MIB])),
    }
    return state, spec, options


@given(multicast_case(), st.sampled_from((*METHODS[2:], "greedy")))
def test_property_every_plan_validates(case, method: str) -> None:
    """Property: every method's plan passes the validator and its bound is below it."""
    state, spec, options = case
    plan = plan_multicast(state, spec, method=method, **options)
    assert_valid(state, plan)
    assert plan.lower_bound_s <= plan.objective_s * (1 + 1e-9)


@settings(max_examples=25)
@given(multicast_case(max_targets=4), st.sampled_from(["all_ready", "sum_ready", "live_ready"]))
def test_property_exact_is_no_worse_than_greedy_and_bounded(case, objective: str) -> None:
    """Property: lower bound <= exact <= greedy on every objective, and exact validates."""
    state, spec, options = case
    if objective == "live_ready" and options["live"] == 0:
        options = {**options, "live": 1}
    greedy = plan_multicast(state, spec, objective=objective, **options)
    exact = plan_multicast(state, spec, objective=objective, method="exact", **options)
    assert_valid(state, exact)
    assert exact.status is SolveStatus.OPTIMAL
    assert exact.lower_bound_s <= exact.objective_s * (1 + 1e-9)
    assert exact.objective_s <= greedy.objective_s * (1 + 1e-9)


@settings(max_examples=20)
@given(multicast_case())
def test_property_equal_input_gives_identical_plan(case) -> None:
    """Property: planning the same state twice gives the same plan."""
    state, spec, options = case
    a = plan_multicast(state, spec, **options)
    b = plan_multicast(state, spec, **options)
    assert dataclasses.replace(a, solve_s=0.0) == dataclasses.replace(b, solve_s=0.0)
