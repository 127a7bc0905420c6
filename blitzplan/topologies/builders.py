"""Builders for cluster graphs: NVSwitch and PCIe hosts on leaf-spine fabrics.

A host is a PCIe tree: GPUs (and the NICs serving them) hang off PCIe switches, the switches off a
root complex (``h0/rc``), and the host DRAM and the SSD off the root complex. An NVSwitch host adds
one NVSwitch joining all its GPUs. Hosts' NICs connect to leaf switches; several leaves connect
through one aggregate spine node whose per-leaf uplink is the leaf's NIC capacity divided by the
oversubscription ratio (ECMP over many spines treated as one fluid link). In a rail-optimised
fabric NIC ``r`` of every host in a group goes to the leaf of rail ``r``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import networkx as nx

from blitzplan._checks import (
    MAX_BYTES,
    MAX_BYTES_PER_S,
    MIN_BYTES_PER_S,
    check_bounded,
    check_count,
    is_number,
)
from blitzplan.errors import InvalidInputError
from blitzplan.hardware import get_gpu
from blitzplan.topologies.graph import Topology
from blitzplan.units import GIB, US

__all__ = [
    "DRAM_LATENCY_S",
    "MAX_GPUS_PER_HOST",
    "MAX_HOSTS",
    "NETWORK_LATENCY_S",
    "NVLINK_LATENCY_S",
    "PCIE_LATENCY_S",
    "SSD_LATENCY_S",
    "HostSpec",
    "build_cluster",
    "nvswitch_host",
    "pcie_host",
]

NVLINK_LATENCY_S = 1 * US
PCIE_LATENCY_S = 1 * US
NETWORK_LATENCY_S = 2 * US
"""One network hop (NIC to leaf, leaf to spine)."""
DRAM_LATENCY_S = 0.1 * US
SSD_LATENCY_S = 20 * US
MAX_GPUS_PER_HOST = 1024
"""The most GPUs one host (one NVSwitch or PCIe domain) may have; rack-scale NVLink domains
have 72."""
MAX_HOSTS = 100_000
"""The most hosts a built cluster may have (the largest today have tens of thousands)."""


@dataclass(frozen=True)
class HostSpec:
    """One server model. Rates are per direction, in bytes per second.

    ``host_to_gpu_bytes_per_s`` is the uplink of each PCIe switch to the root complex, shared by the
    ``gpus_per_pcie_switch`` GPUs (and NICs) behind it; ``gpu_pcie_bytes_per_s`` is each GPU's own
    link to its switch. ``nvlink_bytes_per_s`` is each GPU's NVSwitch bandwidth (0: no NVLink).
    """

    gpu: str
    gpus: int
    gpu_pcie_bytes_per_s: float
    host_to_gpu_bytes_per_s: float
    nic_bytes_per_s: float
    dram_bytes: float
    dram_bytes_per_s: float
    ssd_bytes_per_s: float
    nvlink_bytes_per_s: float = 0.0
    gpus_per_pcie_switch: int = 1
    gpus_per_nic: int = 1

    def __post_init__(self) -> None:
        get_gpu(self.gpu)
        for key in ("gpus", "gpus_per_pcie_switch", "gpus_per_nic"):
            count = check_count(key, getattr(self, key), maximum=MAX_GPUS_PER_HOST)
            object.__setattr__(self, key, count)
        for key in (
            "gpu_pcie_bytes_per_s",
            "host_to_gpu_bytes_per_s",
            "nic_bytes_per_s",
            "dram_bytes_per_s",
            "ssd_bytes_per_s",
        ):
            check_bounded(key, getattr(self, key), MIN_BYTES_PER_S, MAX_BYTES_PER_S, "bytes/s")
        check_bounded("dram_bytes", self.dram_bytes, 1, MAX_BYTES, "bytes")
        if self.nvlink_bytes_per_s != 0:  # 0: no NVLink
            check_bounded(
                "nvlink_bytes_per_s",
                self.nvlink_bytes_per_s,
                MIN_BYTES_PER_S,
                MAX_BYTES_PER_S,
                "bytes/s",
            )
        if self.gpus % self.gpus_per_pcie_switch:
            raise InvalidInputError(
                f"gpus_per_pcie_switch={self.gpus_per_pcie_switch} must divide gpus={self.gpus}"
            )
        small, large = sorted((self.gpus_per_nic, self.gpus_per_pcie_switch))
        if self.gpus % self.gpus_per_nic or large % small:
            raise InvalidInputError(
                f"gpus_per_nic={self.gpus_per_nic} must divide gpus={self.gpus} and divide or be "
                f"a multiple of gpus_per_pcie_switch={self.gpus_per_pcie_switch}"
            )

    @property
    def nics(self) -> int:
        return self.gpus // self.gpus_per_nic


def nvswitch_host(
    gpu: str,
    *,
    gpus: int = 8,
    nic_bytes_per_s: float,
    host_to_gpu_bytes_per_s: float,
    nvlink_bytes_per_s: float | None = None,
    gpu_pcie_bytes_per_s: float | None = None,
    gpus_per_pcie_switch: int = 1,
    gpus_per_nic: int = 1,
    dram_bytes: float = 1024 * GIB,
    dram_bytes_per_s: float = 200e9,
    ssd_bytes_per_s: float = 7e9,
) -> HostSpec:
    """An HGX/DGX-style host: :func:`pcie_host`'s PCIe tree with every GPU also on one NVSwitch
    (NVLink rate from the GPU spec)."""
    spec = get_gpu(gpu)
    nvlink = spec.nvlink_bytes_per_s if nvlink_bytes_per_s is None else nvlink_bytes_per_s
    if not nvlink > 0:
        raise InvalidInputError(
            f"nvlink_bytes_per_s must be > 0 for an NVSwitch host, got {nvlink!r}"
        )
    tree = pcie_host(
        gpu,
        gpus=gpus,
        nic_bytes_per_s=nic_bytes_per_s,
        host_to_gpu_bytes_per_s=host_to_gpu_bytes_per_s,
        gpu_pcie_bytes_per_s=gpu_pcie_bytes_per_s,
        gpus_per_pcie_switch=gpus_per_pcie_switch,
        gpus_per_nic=gpus_per_nic,
        dram_bytes=dram_bytes,
        dram_bytes_per_s=dram_bytes_per_s,
        ssd_bytes_per_s=ssd_bytes_per_s,
    )
    return replace(tree, nvlink_bytes_per_s=nvlink)


def pcie_host(
    gpu: str,
    *,
    gpus: int = 8,
    nic_bytes_per_s: float,
    host_to_gpu_bytes_per_s: float,
    gpu_pcie_bytes_per_s: float | None = None,
    gpus_per_pcie_switch: int = 2,
    gpus_per_nic: int = 1,
    dram_bytes: float = 1024 * GIB,
    dram_bytes_per_s: float = 200e9,
    ssd_bytes_per_s: float = 7e9,
) -> HostSpec:
    """A PCIe host without NVLink: GPUs in groups behind shared PCIe switches."""
    spec = get_gpu(gpu)
    return HostSpec(
        gpu=gpu,
        gpus=gpus,
        gpu_pcie_bytes_per_s=spec.pcie_bytes_per_s
        if gpu_pcie_bytes_per_s is None
        else gpu_pcie_bytes_per_s,
        host_to_gpu_bytes_per_s=host_to_gpu_bytes_per_s,
        nic_bytes_per_s=nic_bytes_per_s,
        dram_bytes=dram_bytes,
        dram_bytes_per_s=dram_bytes_per_s,
        ssd_bytes_per_s=ssd_bytes_per_s,
        gpus_per_pcie_switch=gpus_per_pcie_switch,
        gpus_per_nic=gpus_per_nic,
    )


def _link(graph: nx.DiGraph[str], a: str, b: str, rate: float, latency: float, medium: str) -> None:
    """A full-duplex link: two directed edges of the same capacity."""
    graph.add_edge(a, b, bytes_per_s=rate, latency_s=latency, medium=medium)
    graph.add_edge(b, a, bytes_per_s=rate, latency_s=latency, medium=medium)


def _add_host(graph: nx.DiGraph[str], host: str, spec: HostSpec) -> list[str]:
    """Add one host's nodes and links; return its NICs in order."""
    rc, mem, ssd = f"{host}/rc", f"{host}/mem", f"{host}/ssd"
    graph.add_node(rc, kind="switch", switch="pcie", host=host)
    graph.add_node(mem, kind="host_mem", host=host, dram_bytes=spec.dram_bytes)
    graph.add_node(ssd, kind="ssd", host=host)
    _link(graph, mem, rc, spec.dram_bytes_per_s, DRAM_LATENCY_S, "dram")
    _link(graph, ssd, rc, spec.ssd_bytes_per_s, SSD_LATENCY_S, "ssd")
    nvswitch = f"{host}/nvswitch" if spec.nvlink_bytes_per_s > 0 else None
    if nvswitch:
        graph.add_node(nvswitch, kind="switch", switch="nvswitch", host=host)
    switches = [f"{host}/pcie{k}" for k in range(spec.gpus // spec.gpus_per_pcie_switch)]
    for switch in switches:
        graph.add_node(switch, kind="switch", switch="pcie", host=host)
        _link(graph, switch, rc, spec.host_to_gpu_bytes_per_s, PCIE_LATENCY_S, "pcie")
    nics = [f"{host}/nic{n}" for n in range(spec.nics)]
    for n, nic in enumerate(nics):
        graph.add_node(nic, kind="nic", host=host)
        first_gpu = n * spec.gpus_per_nic
        shared_across_switches = spec.gpus_per_nic > spec.gpus_per_pcie_switch
        parent = rc if shared_across_switches else switches[first_gpu // spec.gpus_per_pcie_switch]
        _link(graph, nic, parent, spec.gpu_pcie_bytes_per_s, PCIE_LATENCY_S, "pcie")
    for j in range(spec.gpus):
        gpu = f"{host}/gpu{j}"
        graph.add_node(
            gpu,
            kind="gpu",
            host=host,
            gpu=spec.gpu,
            index=j,
            nvlink_group=nvswitch,
            nic=nics[j // spec.gpus_per_nic],
        )
        switch = switches[j // spec.gpus_per_pcie_switch]
        _link(graph, gpu, switch, spec.gpu_pcie_bytes_per_s, PCIE_LATENCY_S, "pcie")
        if nvswitch:
            _link(graph, gpu, nvswitch, spec.nvlink_bytes_per_s, NVLINK_LATENCY_S, "nvlink")
    return nics


def build_cluster(
    host: HostSpec,
    *,
    hosts: int,
    hosts_per_leaf: int | None = None,
    oversubscription: float = 1.0,
    rail_optimized: bool = False,
    name: str = "custom",
    description: str = "",
) -> Topology:
    """``hosts`` identical hosts on a leaf-spine fabric (one leaf holds every host by default)."""
    hosts = check_count("hosts", hosts, maximum=MAX_HOSTS)
    per_leaf = hosts if hosts_per_leaf is None else check_count("hosts_per_leaf", hosts_per_leaf)
    if not is_number(oversubscription) or not 1 <= oversubscription < math.inf:
        raise InvalidInputError(f"oversubscription must be >= 1, got {oversubscription!r}")
    graph: nx.DiGraph[str] = nx.DiGraph()
    leaf_load: dict[str, float] = {}
    for h in range(hosts):
        nics = _add_host(graph, f"h{h}", host)
        group = h // per_leaf
        for rail, nic in enumerate(nics):
            leaf = f"leaf{group * len(nics) + rail}" if rail_optimized else f"leaf{group}"
            if leaf not in graph:
                graph.add_node(leaf, kind="switch", switch="leaf")
            _link(graph, nic, leaf, host.nic_bytes_per_s, NETWORK_LATENCY_S, "network")
            leaf_load[leaf] = leaf_load.get(leaf, 0.0) + host.nic_bytes_per_s
    if len(leaf_load) > 1:
        graph.add_node("spine", kind="switch", switch="spine")
        for leaf, load in leaf_load.items():
            _link(graph, leaf, "spine", load / oversubscription, NETWORK_LATENCY_S, "network")
    return Topology(graph, name=name, description=description)
