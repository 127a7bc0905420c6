"""The catalog commands: ``topologies`` (the cluster catalog) and ``models`` (the model presets,
their sizes and host load times)."""

from __future__ import annotations

import argparse

from blitzplan._table import format_table
from blitzplan.cluster import memory_misfit
from blitzplan.errors import BlitzplanError
from blitzplan.models import list_models, load_model
from blitzplan.plan_cli import DEMO_TOPOLOGY
from blitzplan.topologies import list_topologies, load_topology
from blitzplan.units import GB_PER_S, GBPS, GIB, MIB

__all__ = ["cmd_models", "cmd_topologies", "host_load_table", "models_table", "topologies_table"]


def topologies_table() -> str:
    """One row per catalog topology."""
    rows = []
    for name in list_topologies():
        topo = load_topology(name)
        gpu = topo.gpus()[0]
        group = topo.nvlink_group_of(gpu)
        leaf = topo.leaf_of(gpu)
        nvlink = topo.bytes_per_s(topo.path_edges(gpu, group[1])[0]) if len(group) > 1 else 0.0
        host_to_gpu = topo.bottleneck_bytes_per_s(topo.host_mem(topo.host_of(gpu)), gpu)
        rows.append(
            [
                name,
                len(topo.hosts()),
                len(topo.gpus()),
                topo.gpu_spec(gpu).name,
                len(group),
                f"{nvlink / GB_PER_S:.0f}" if nvlink else "-",
                f"{topo.bytes_per_s((topo.nic_of(gpu), leaf)) / GBPS:.0f}" if leaf else "-",
                f"{host_to_gpu / GBPS:.0f}",
                len({topo.leaf_of(g) for g in topo.gpus()}),
            ]
        )
    return format_table(
        [
            "topology",
            "hosts",
            "gpus",
            "gpu",
            "nvlink group",
            "nvlink GB/s",
            "nic Gbps",
            "host->gpu Gbps",
            "leaves",
        ],
        rows,
    )


def models_table() -> str:
    """One row per preset model."""
    rows = []
    for name in list_models():
        m = load_model(name)
        rows.append(
            [
                name,
                m.num_layers,
                f"{m.layer_bytes / MIB:,.1f}",
                f"{m.embedding_bytes / MIB:,.1f}",
                f"{m.lm_head_bytes / MIB:,.1f}",
                f"{m.total_bytes:,}",
                f"{m.total_bytes / GIB:.2f}",
                f"{m.kv_bytes_per_token:,}",
            ]
        )
    return format_table(
        [
            "model",
            "layers",
            "layer MiB",
            "embed MiB",
            "lm_head MiB",
            "total bytes",
            "GiB",
            "KV B/token",
        ],
        rows,
    )


def host_load_table(topology_name: str = DEMO_TOPOLOGY) -> str:
    """Seconds for a TP group on one host to load each preset from that host's DRAM at once.

    All GPUs of the group pull their shards concurrently; their rates come from max-min fair
    sharing of the host's DRAM and PCIe links. "-" marks a TP degree that does not split the model
    or whose shard does not fit the GPU.
    """
    topo = load_topology(topology_name)
    host = topo.hosts()[0]
    gpus = topo.gpus_of_host(host)
    memory = topo.gpu_spec(gpus[0]).memory_bytes
    degrees = [tp for tp in (1, 2, 4, 8) if tp <= len(gpus)]
    rows = []
    for name in list_models():
        m = load_model(name)
        row: list[object] = [name]
        for tp in degrees:
            try:
                m.check_tp(tp)
            except BlitzplanError:
                row.append("-")
                continue
            shard = m.shard(tp).total_bytes
            if memory_misfit(m, tp, memory):
                row.append("-")
                continue
            flows = [topo.flow(topo.host_mem(host), gpu) for gpu in gpus[:tp]]
            row.append(f"{max(shard / rate for rate in topo.fair_share(flows)):.2f}")
        rows.append(row)
    title = f"Load from host DRAM on {topology_name} (one host, TP group pulls at once), seconds"
    return title + "\n" + format_table(["model", *(f"tp{tp}" for tp in degrees)], rows)


# --- scenarios for plan and compare ----------------------------------------------------------


def cmd_topologies(_: argparse.Namespace) -> int:
    print(topologies_table())
    return 0


def cmd_models(_: argparse.Namespace) -> int:
    print(models_table())
    print()
    print(host_load_table())
    return 0
