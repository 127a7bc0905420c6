"""Topology builders, queries, routing, the YAML catalog and its errors."""

from __future__ import annotations

import pytest
import yaml

from blitzplan import InvalidInputError, list_topologies, load_topology
from blitzplan.topologies import build_cluster, nvswitch_host, pcie_host, topology_from_dict
from blitzplan.units import GB_PER_S, GBPS, GIB

CATALOG = ["dgx-h100-64", "h200-8", "paper-a100-16", "paper-a800-32", "rail-leafspine-1024"]


def test_catalog_lists_the_issue_entries() -> None:
    assert list_topologies() == CATALOG


@pytest.mark.parametrize("name", CATALOG)
def test_every_catalog_entry_loads_and_validates(name: str) -> None:
    topo = load_topology(name)
    assert topo.name == name
    for gpu in topo.gpus():
        assert topo.host_of(gpu) in topo.hosts()
        assert gpu in topo.nvlink_group_of(gpu)
        assert topo.leaf_of(gpu) is not None
        assert topo.kind(topo.nic_of(gpu)) == "nic"
    for _, _, data in topo.graph.edges(data=True):
        assert data["bytes_per_s"] > 0 and data["latency_s"] >= 0


def test_paper_a800_numbers() -> None:
    topo = load_topology("paper-a800-32")
    assert (len(topo.hosts()), len(topo.gpus())) == (4, 32)
    assert topo.gpu_spec("h0/gpu0").name == "a800-sxm-80g"
    assert len(topo.nvlink_group_of("h0/gpu3")) == 8
    assert topo.bottleneck_bytes_per_s("h0/gpu0", "h0/gpu1") == 1600 * GBPS
    assert topo.bottleneck_bytes_per_s("h0/gpu0", "h1/gpu0") == 100 * GBPS
    assert topo.bottleneck_bytes_per_s(topo.host_mem("h0"), "h0/gpu5") == 128 * GBPS
    assert topo.bottleneck_bytes_per_s(topo.ssd("h0"), topo.host_mem("h0")) == 10 * GBPS


def test_paper_a100_pcie_pairs() -> None:
    topo = load_topology("paper-a100-16")
    assert topo.nvlink_group_of("h0/gpu0") == ("h0/gpu0",)
    mem = topo.host_mem("h1")
    rates = topo.fair_share([topo.flow(mem, "h1/gpu0"), topo.flow(mem, "h1/gpu1")])
    assert rates == pytest.approx((128 * GBPS, 128 * GBPS))  # 256 Gbps uplink shared by 2


def test_rail_leafspine_has_16_leaves_and_2_to_1_spine() -> None:
    topo = load_topology("rail-leafspine-1024")
    assert len(topo.gpus()) == 1024
    assert len({topo.leaf_of(g) for g in topo.gpus()}) == 16
    assert topo.leaf_of("h0/gpu3") == topo.leaf_of("h63/gpu3") != topo.leaf_of("h64/gpu3")
    leaf = topo.leaf_of("h0/gpu0")
    assert topo.bytes_per_s((leaf, "spine")) == 64 * 400 * GBPS / 2
    assert "spine" in topo.path("h0/gpu0", "h64/gpu0")
    assert "spine" not in topo.path("h0/gpu0", "h63/gpu0")


def test_cross_host_traffic_uses_each_gpus_own_nic() -> None:
    topo = load_topology("dgx-h100-64")
    path = topo.path("h0/gpu2", "h5/gpu6")
    assert path[:3] == ("h0/gpu2", "h0/pcie2", "h0/nic2")
    assert path[-3:] == ("h5/nic6", "h5/pcie6", "h5/gpu6")
    assert not any(node.endswith("/rc") for node in path)


def test_intra_host_gpu_traffic_rides_nvlink() -> None:
    topo = load_topology("h200-8")
    assert topo.path("h0/gpu0", "h0/gpu7") == ("h0/gpu0", "h0/nvswitch", "h0/gpu7")
    assert topo.path_latency_s("h0/gpu0", "h0/gpu7") > 0
    assert topo.bottleneck_bytes_per_s("h0/gpu0", "h0/gpu7") == 450 * GB_PER_S


def test_shared_nic_serves_two_gpus() -> None:
    host = pcie_host(
        "a100-pcie",
        gpus=4,
        gpus_per_pcie_switch=2,
        gpus_per_nic=2,
        nic_bytes_per_s=100 * GBPS,
        host_to_gpu_bytes_per_s=200 * GBPS,
    )
    topo = build_cluster(host, hosts=2)
    assert topo.nic_of("h0/gpu0") == topo.nic_of("h0/gpu1") != topo.nic_of("h0/gpu2")
    rates = topo.fair_share([topo.flow("h0/gpu0", "h1/gpu0"), topo.flow("h0/gpu1", "h1/gpu2")])
    assert rates == pytest.approx((50 * GBPS, 50 * GBPS))


def test_leaf_groups_and_oversubscription() -> None:
    host = nvswitch_host(
        "h100", gpus=2, nic_bytes_per_s=400 * GBPS, host_to_gpu_bytes_per_s=400 * GBPS
    )
    topo = build_cluster(host, hosts=4, hosts_per_leaf=2, oversubscription=4)
    assert topo.leaf_of("h0/gpu0") == topo.leaf_of("h1/gpu1") == "leaf0"
    assert topo.leaf_of("h2/gpu0") == "leaf1"
    assert topo.bytes_per_s(("leaf0", "spine")) == 2 * 2 * 400 * GBPS / 4
    # four flows from leaf0 to leaf1 share its 400 Gbps uplink
    flows = [topo.flow(f"h{h}/gpu{g}", f"h{h + 2}/gpu{g}") for h in (0, 1) for g in (0, 1)]
    assert topo.fair_share(flows) == pytest.approx([100 * GBPS] * 4)


def test_queries_name_bad_nodes() -> None:
    topo = load_topology("h200-8")
    with pytest.raises(InvalidInputError, match="node 'h9/gpu0' is not in topology 'h200-8'"):
        topo.host_of("h9/gpu0")
    with pytest.raises(InvalidInputError, match="node 'h0/nic0' is a nic, not a gpu"):
        topo.nvlink_group_of("h0/nic0")
    with pytest.raises(InvalidInputError, match="two different nodes"):
        topo.path("h0/gpu0", "h0/gpu0")
    with pytest.raises(InvalidInputError, match="host 'h3' is not in topology"):
        topo.gpus_of_host("h3")


def test_unknown_topology_lists_catalog() -> None:
    with pytest.raises(InvalidInputError, match="'dgx-a100' is neither a catalog entry.*h200-8"):
        load_topology("dgx-a100")


def builder_yaml(**host_overrides: object) -> dict:
    host = {"type": "nvswitch", "gpu": "h100", "gpus": 2, "nic_gbps": 400, "host_to_gpu_gbps": 400}
    return {"name": "t", "host": {**host, **host_overrides}, "cluster": {"hosts": 2}}


@pytest.mark.parametrize("value", [0, -100])
def test_yaml_with_zero_or_negative_bandwidth(tmp_path, value: int) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(builder_yaml(nic_gbps=value)))
    message = f"host nic_gbps must be at least 0.1 Gbit/s, got {float(value)}"
    with pytest.raises(InvalidInputError, match=message):
        load_topology(path)


def tiny_explicit() -> dict:
    return {
        "name": "tiny",
        "nodes": [
            {"id": "h0/gpu0", "kind": "gpu", "host": "h0", "gpu": "a100"},
            {"id": "h0/sw", "kind": "switch", "switch": "pcie", "host": "h0"},
            {"id": "h0/nic0", "kind": "nic", "host": "h0"},
            {"id": "h0/mem", "kind": "host_mem", "host": "h0", "dram_gib": 256},
        ],
        "links": [
            {"a": "h0/gpu0", "b": "h0/sw", "gbps": 256, "latency_us": 1, "medium": "pcie"},
            {"a": "h0/nic0", "b": "h0/sw", "gbps": 256, "latency_us": 1, "medium": "pcie"},
            {"a": "h0/mem", "b": "h0/sw", "gbps": 1000, "latency_us": 0.1, "medium": "dram"},
        ],
    }


def test_explicit_yaml_loads(tmp_path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_explicit()))
    topo = load_topology(path)
    assert topo.gpus() == ["h0/gpu0"] and topo.nic_of("h0/gpu0") == "h0/nic0"
    assert topo.dram_bytes("h0") == 256 * GIB
    assert topo.leaf_of("h0/gpu0") is None


def test_explicit_zero_bandwidth_link_is_named() -> None:
    data = tiny_explicit()
    data["links"][1]["gbps"] = 0
    with pytest.raises(InvalidInputError, match=r"links\[1\] gbps must be at least 0.1 Gbit/s"):
        topology_from_dict(data)


def test_edge_to_missing_node_is_named() -> None:
    data = tiny_explicit()
    data["edges"] = [{"src": "h0/gpu0", "dst": "h0/gpu9", "gbps": 10}]
    with pytest.raises(InvalidInputError, match=r"edges\[0\] names missing node 'h0/gpu9'"):
        topology_from_dict(data)


def test_gpu_with_no_path_to_any_nic_is_named() -> None:
    data = tiny_explicit()
    data["links"] = [link for link in data["links"] if link["a"] != "h0/gpu0"]
    with pytest.raises(InvalidInputError, match="gpu 'h0/gpu0' has no path to any NIC"):
        topology_from_dict(data)


def test_unknown_keys_and_kinds_are_named() -> None:
    with pytest.raises(InvalidInputError, match="unknown key.*'nic_gpbs'"):
        topology_from_dict(builder_yaml(nic_gpbs=400))
    data = tiny_explicit()
    data["nodes"][0]["kind"] = "tpu"
    with pytest.raises(InvalidInputError, match="node 'h0/gpu0' has kind 'tpu'"):
        topology_from_dict(data)
    with pytest.raises(InvalidInputError, match="host type must be 'nvswitch' or 'pcie'"):
        topology_from_dict(builder_yaml(type="nvlink72"))
    with pytest.raises(InvalidInputError, match="unknown gpu 'b300'"):
        topology_from_dict(builder_yaml(gpu="b300"))


def test_builder_errors_are_named() -> None:
    with pytest.raises(InvalidInputError, match="gpus_per_pcie_switch=3 must divide gpus=8"):
        pcie_host(
            "a100-pcie", gpus_per_pcie_switch=3, nic_bytes_per_s=1.0, host_to_gpu_bytes_per_s=1.0
        )
    host = nvswitch_host("h100", nic_bytes_per_s=1.0, host_to_gpu_bytes_per_s=1.0)
    with pytest.raises(InvalidInputError, match="oversubscription must be >= 1, got 0.5"):
        build_cluster(host, hosts=2, oversubscription=0.5)
    with pytest.raises(InvalidInputError, match="hosts must be a positive integer, got 0"):
        build_cluster(host, hosts=0)
