"""Achieved link rates per medium, and topologies without failed parts."""

from __future__ import annotations

import math

import pytest

from blitzplan import ClusterState, InfeasibleError, InvalidInputError, load_model, load_topology
from blitzplan.multicast import plan_multicast
from blitzplan.topologies.links import LINK_EFFICIENCY, link_efficiency_table
from blitzplan.units import GBPS


def test_each_medium_runs_at_its_measured_fraction_of_line_rate() -> None:
    line = load_topology("paper-a800-32")
    real = line.with_link_efficiency()
    assert real.link_efficiency == LINK_EFFICIENCY
    pairs = [
        ((line.host_mem("h0"), "h0/gpu5"), 128 * GBPS * LINK_EFFICIENCY["pcie"]),
        (("h0/gpu0", "h1/gpu0"), 100 * GBPS * LINK_EFFICIENCY["network"]),
        (("h0/gpu0", "h0/gpu1"), 1600 * GBPS * LINK_EFFICIENCY["nvlink"]),
        ((line.ssd("h0"), line.host_mem("h0")), 10 * GBPS * LINK_EFFICIENCY["ssd"]),
    ]
    for (src, dst), rate in pairs:
        assert real.bottleneck_bytes_per_s(src, dst) == pytest.approx(rate)


def test_line_rate_comes_back_and_tables_do_not_compound() -> None:
    line = load_topology("paper-a100-16")
    twice = line.with_link_efficiency().with_link_efficiency({"pcie": 0.5})
    assert twice.link_efficiency["pcie"] == 0.5
    assert twice.link_efficiency["network"] == LINK_EFFICIENCY["network"]
    back = twice.with_link_efficiency(1.0)
    assert back.capacity == line.capacity
    assert set(back.link_efficiency.values()) == {1.0}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (0.0, r"link_efficiency\['pcie'\] must be in \(0, 1\], got 0.0"),
        (1.5, "must be in"),
        (math.nan, "must be in"),
        ({"infiniband": 0.9}, "unknown media"),
        ({"pcie": True}, "must be a number"),
    ],
)
def test_bad_efficiencies_are_named(value: object, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        link_efficiency_table(value)  # type: ignore[arg-type]


def test_the_planner_sees_achieved_rates() -> None:
    """AllCache's host-to-GPU copy is PCIe-bound: it takes 1 / 0.8 as long at achieved rates."""
    spec = load_model("llama-3-8b")
    times = []
    for topo in (
        load_topology("paper-a100-16"),
        load_topology("paper-a100-16").with_link_efficiency(),
    ):
        state = ClusterState(topo, models=[spec])
        plan = plan_multicast(state, spec, targets=[["h1/gpu0"]], method="allcache")
        times.append(plan.all_ready_s)
    assert times[1] / times[0] == pytest.approx(1 / LINK_EFFICIENCY["pcie"], rel=0.02)


def test_without_a_host_and_a_nic_link() -> None:
    topo = load_topology("paper-a800-32").with_link_efficiency()
    rest = topo.without(nodes=topo.nodes_of_host("h0"))
    assert rest.hosts() == ["h1", "h2", "h3"] and rest.link_efficiency == topo.link_efficiency
    leaf = topo.leaf_of("h1/gpu0")
    assert leaf is not None
    cut = topo.without(links=[("h1/nic0", leaf)])
    assert cut.nic_of("h1/gpu0") != "h1/nic0"  # it sends through a NIC that still has a fabric
    assert "h1/gpu0" in cut.path("h1/gpu0", "h2/gpu0")
    with pytest.raises(InvalidInputError, match="nodes names 'h9'"):
        topo.without(nodes=["h9"])
    with pytest.raises(InvalidInputError, match="links names"):
        topo.without(links=[("h0/gpu0", "h3/gpu7")])
    with pytest.raises(InfeasibleError, match="leave no GPU"):
        topo.without(nodes=[n for h in topo.hosts() for n in topo.nodes_of_host(h)])
    islands = topo.without(nodes=[topo.leaf_of("h1/gpu0")])  # every host loses the fabric
    assert len(islands.gpus()) == len(topo.gpus())  # GPUs stay, unreachable over the network
