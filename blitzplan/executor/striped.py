"""A striped multicast run for real: two sources feed one node of two GPUs, which forwards.

The cluster is four hosts of two NVLink-joined GPUs on one leaf, links paced slow enough that
transfers dominate on a CPU. Hosts 0 and 1 each serve the model as a decode instance on their
first GPU (the second serves prefill, so it relays nothing): two sources of one NIC each. Four
new TP1 instances land on hosts 2 and 3 with two live instances, so host 3's node is a live tail:
each source streams a different stripe of every unit into host 2's two NICs, host 2 gathers them
over NVLink and forwards everything to host 3. :func:`run_striped` plans it with
``plan_multicast`` and runs it with :func:`~blitzplan.executor.multicast.run_multicast`: one
process per GPU, gloo on the CPU, every unit checked bit-exact on every new GPU.
"""

from __future__ import annotations

from blitzplan.cluster import ClusterState
from blitzplan.executor.checkpoint import Checkpoint
from blitzplan.executor.multicast import MulticastRun, run_multicast
from blitzplan.models import ModelSpec
from blitzplan.multicast import MulticastPlan, plan_multicast
from blitzplan.topologies import Topology, build_cluster, nvswitch_host
from blitzplan.units import GIB, KIB, MB

__all__ = ["STRIPED_TARGETS", "run_striped", "striped_plan", "striped_topology"]

STRIPED_TARGETS = (("h2/gpu0",), ("h2/gpu1",), ("h3/gpu0",), ("h3/gpu1",))
"""The four new TP1 instances: two per host."""


def striped_topology(*, nic_bytes_per_s: float = 4 * MB) -> Topology:
    """Four hosts of two GPUs; NVLink and PCIe four times as fast as the NICs."""
    host = nvswitch_host(
        "a100",
        gpus=2,
        nic_bytes_per_s=nic_bytes_per_s,
        host_to_gpu_bytes_per_s=4 * nic_bytes_per_s,
        gpu_pcie_bytes_per_s=4 * nic_bytes_per_s,
        nvlink_bytes_per_s=4 * nic_bytes_per_s,
        dram_bytes=16 * GIB,
    )
    return build_cluster(host, hosts=4, name="executor-striped")


def striped_plan(
    spec: ModelSpec, *, nic_bytes_per_s: float = 4 * MB, chunk_bytes: int = 32 * KIB
) -> tuple[ClusterState, MulticastPlan]:
    """The scenario's state and its greedy plan (see the module docstring)."""
    state = ClusterState(striped_topology(nic_bytes_per_s=nic_bytes_per_s), models=[spec])
    for host in ("h0", "h1"):
        state.add_instance(spec, gpus=[f"{host}/gpu0"], role="decode")
        state.add_instance(spec, gpus=[f"{host}/gpu1"], role="prefill")
    plan = plan_multicast(
        state,
        spec,
        targets=[list(t) for t in STRIPED_TARGETS],
        live=2,
        chunk_bytes=chunk_bytes,
    )
    return state, plan


def run_striped(
    checkpoint: Checkpoint,
    *,
    nic_bytes_per_s: float = 4 * MB,
    chunk_bytes: int = 32 * KIB,
    device: str = "cpu",
    timeout_s: float = 30.0,
) -> MulticastRun:
    """Plan the scenario for ``checkpoint``'s model and run it for real."""
    _, plan = striped_plan(
        checkpoint.spec(), nic_bytes_per_s=nic_bytes_per_s, chunk_bytes=chunk_bytes
    )
    return run_multicast(plan, checkpoint, device=device, timeout_s=timeout_s)
