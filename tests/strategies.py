"""Hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from blitzplan.topologies import Topology, build_cluster, nvswitch_host, pcie_host
from blitzplan.units import GBPS, GIB


@st.composite
def random_cluster(draw: st.DrawFn) -> Topology:
    gbps = st.integers(min_value=10, max_value=800).map(lambda g: g * GBPS)
    gpus = draw(st.sampled_from([2, 4, 8]))
    per_switch = draw(st.sampled_from([g for g in (1, 2, 4) if gpus % g == 0]))
    per_nic = draw(
        st.sampled_from([g for g in (1, 2) if per_switch % g == 0 or g % per_switch == 0])
    )
    common = dict(
        gpus=gpus,
        gpus_per_pcie_switch=per_switch,
        gpus_per_nic=per_nic,
        host_to_gpu_bytes_per_s=draw(gbps),
        nic_bytes_per_s=draw(gbps),
        gpu_pcie_bytes_per_s=draw(gbps),
        dram_bytes=512 * GIB,
    )
    if draw(st.booleans()):
        host = nvswitch_host("h100", nvlink_bytes_per_s=draw(gbps), **common)
    else:
        host = pcie_host("a100-pcie", **common)
    hosts = draw(st.integers(min_value=1, max_value=6))
    return build_cluster(
        host,
        hosts=hosts,
        hosts_per_leaf=draw(st.integers(min_value=1, max_value=hosts)),
        oversubscription=draw(st.sampled_from([1.0, 2.0, 3.0])),
        rail_optimized=draw(st.booleans()),
    )
