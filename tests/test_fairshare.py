"""Max-min fair sharing: hand-computed cases and properties over random topologies."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blitzplan import InvalidInputError
from blitzplan.topologies import (
    Flow,
    Topology,
    build_cluster,
    max_min_fair_share,
    pcie_host,
)
from blitzplan.topologies.fairshare import quick_flow
from blitzplan.units import GBPS
from tests.strategies import random_cluster

TOL = 1e-6


def test_two_flows_on_one_100gbps_link_get_50_each() -> None:
    link = ("a", "b")
    rates = max_min_fair_share([Flow((link,)), Flow((link,))], {link: 100 * GBPS})
    assert rates == pytest.approx((50 * GBPS, 50 * GBPS))


def test_classic_three_flow_example() -> None:
    # A crosses e1 and e2, B only e1 (10), C only e2 (20): A = B = 5 on e1, C takes 15 on e2
    e1, e2 = ("x", "y"), ("y", "z")
    flows = [Flow((e1, e2), name="A"), Flow((e1,), name="B"), Flow((e2,), name="C")]
    assert max_min_fair_share(flows, {e1: 10.0, e2: 20.0}) == pytest.approx((5.0, 5.0, 15.0))


def test_flow_cap_frees_capacity_for_others() -> None:
    link = ("a", "b")
    flows = [Flow((link,), max_bytes_per_s=10.0), Flow((link,)), Flow((link,))]
    assert max_min_fair_share(flows, {link: 100.0}) == pytest.approx((10.0, 45.0, 45.0))


def test_opposite_directions_do_not_compete() -> None:
    capacity = {("a", "b"): 100.0, ("b", "a"): 100.0}
    flows = [Flow((("a", "b"),)), Flow((("b", "a"),))]
    assert max_min_fair_share(flows, capacity) == pytest.approx((100.0, 100.0))


def shared_pcie_topology() -> Topology:
    host = pcie_host(
        "a100-pcie",
        gpus=4,
        gpus_per_pcie_switch=2,
        gpu_pcie_bytes_per_s=128 * GBPS,
        host_to_gpu_bytes_per_s=100 * GBPS,
        nic_bytes_per_s=100 * GBPS,
    )
    return build_cluster(host, hosts=1)


def test_gpus_behind_one_pcie_switch_share_its_uplink() -> None:
    topo = shared_pcie_topology()
    mem = topo.host_mem("h0")
    # gpu0 and gpu1 share pcie0's 100 Gbps uplink; gpu2 is alone behind pcie1
    flows = [topo.flow(mem, "h0/gpu0"), topo.flow(mem, "h0/gpu1"), topo.flow(mem, "h0/gpu2")]
    assert topo.fair_share(flows) == pytest.approx((50 * GBPS, 50 * GBPS, 100 * GBPS))


def test_peer_traffic_under_one_switch_skips_the_uplink() -> None:
    topo = shared_pcie_topology()
    assert topo.path("h0/gpu0", "h0/gpu1") == ("h0/gpu0", "h0/pcie0", "h0/gpu1")
    rates = topo.fair_share(
        [topo.flow("h0/gpu0", "h0/gpu1"), topo.flow(topo.host_mem("h0"), "h0/gpu1")]
    )
    # both enter gpu1 over its 128 Gbps link; the host flow is also under the 100 Gbps uplink
    assert rates == pytest.approx((64 * GBPS, 64 * GBPS))


def test_unknown_edge_and_bad_flows_are_named() -> None:
    with pytest.raises(InvalidInputError, match=r"crosses unknown edge \('a', 'q'\)"):
        max_min_fair_share([Flow((("a", "q"),), name="f")], {("a", "b"): 1.0})
    with pytest.raises(InvalidInputError, match="must cross at least one edge"):
        Flow(())
    with pytest.raises(InvalidInputError, match="max_bytes_per_s must be > 0, got 0"):
        Flow((("a", "b"),), max_bytes_per_s=0)
    with pytest.raises(InvalidInputError, match=r"capacity must be finite and > 0, got inf"):
        max_min_fair_share([Flow((("a", "b"),))], {("a", "b"): math.inf})


def check_max_min_fair(flows: list[Flow], capacity: dict, rates: tuple[float, ...]) -> None:
    """The certificate: feasible, and every flow is capped or has a bottleneck edge."""
    load: dict = {}
    for flow, rate in zip(flows, rates, strict=True):
        assert rate > 0
        for edge in flow.edges:
            load[edge] = load.get(edge, 0.0) + rate
    for edge, used in load.items():
        assert used <= capacity[edge] * (1 + TOL)
    for i, flow in enumerate(flows):
        if rates[i] >= flow.max_bytes_per_s * (1 - TOL):
            continue
        bottlenecks = [
            edge
            for edge in flow.edges
            if load[edge] >= capacity[edge] * (1 - TOL)
            and all(
                rates[i] >= rates[j] * (1 - TOL)
                for j, other in enumerate(flows)
                if edge in other.edges
            )
        ]
        assert bottlenecks, f"flow {i} at {rates[i]} has no bottleneck edge"


@st.composite
def cluster_and_flows(draw: st.DrawFn) -> tuple[Topology, list[Flow]]:
    topo = draw(random_cluster())
    endpoints = topo.gpus() + [topo.host_mem(h) for h in topo.hosts()]
    count = draw(st.integers(min_value=1, max_value=12))
    flows = []
    for k in range(count):
        src, dst = draw(st.lists(st.sampled_from(endpoints), min_size=2, max_size=2, unique=True))
        cap = draw(st.one_of(st.just(math.inf), st.integers(1, 100).map(lambda g: g * GBPS)))
        flows.append(topo.flow(src, dst, max_bytes_per_s=cap, name=f"f{k}"))
    return topo, flows


@given(cluster_and_flows())
def test_property_fair_share_is_feasible_and_max_min_fair(case) -> None:
    """Property: fair-share rates never exceed an edge's capacity and are max-min fair."""
    topo, flows = case
    rates = topo.fair_share(flows)
    check_max_min_fair(flows, topo.capacity, rates)


@given(cluster_and_flows())
def test_property_fair_share_ignores_flow_order(case) -> None:
    """Property: the rate of a flow does not depend on where it stands in the list."""
    topo, flows = case
    rates = topo.fair_share(flows)
    reversed_rates = topo.fair_share(flows[::-1])[::-1]
    assert reversed_rates == pytest.approx(rates, rel=1e-6)


def test_certificate_rejects_unfair_and_infeasible_rates() -> None:
    link = ("a", "b")
    flows = [Flow((link,)), Flow((link,))]
    with pytest.raises(AssertionError, match="no bottleneck"):
        check_max_min_fair(flows, {link: 100.0}, (30.0, 70.0))
    with pytest.raises(AssertionError):
        check_max_min_fair(flows, {link: 100.0}, (60.0, 60.0))


def test_quick_flow_is_the_flow_and_keeps_its_checks() -> None:
    edges = (("a", "b"), ("b", "c"))
    for cap in (math.inf, 1e9, 1.0):
        made = quick_flow(edges, cap, "x")
        assert made == Flow(edges, cap, "x")
        assert hash(made) == hash(Flow(edges, cap, "x"))
        assert (made.edges, made.max_bytes_per_s, made.name) == (edges, cap, "x")
    with pytest.raises(InvalidInputError, match="crosses an edge twice"):
        quick_flow((("a", "b"), ("a", "b")), 1e9, "x")
    with pytest.raises(InvalidInputError, match="max_bytes_per_s"):
        quick_flow(edges, 0.5, "x")
    with pytest.raises(InvalidInputError, match="at least one edge"):
        quick_flow((), math.inf, "x")
