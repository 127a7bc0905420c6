"""The executor's built-in scenarios: ScalePlan documents made with ``blitzplan.plan``.

At line rate (``link_efficiency=1.0``) on hosts of four NVLink-joined GPUs, one NIC per GPU, NICs
slow enough that transfers dominate on a CPU (NVLink and PCIe four times faster). ``small`` and
``large`` scale TP2 prefill instances from TP1 and TP2 sources (forwarding, multi-source stripes,
all-gathers); ``live`` pairs one new prefill instance with a queued one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from blitzplan.errors import InvalidInputError
from blitzplan.executor.smallmodel.llama import small_config
from blitzplan.units import GIB, KIB, MB

if TYPE_CHECKING:
    from blitzplan.cluster import ClusterState
    from blitzplan.compute import ComputeModel
    from blitzplan.models import ModelSpec
    from blitzplan.scale import ScalePlan

_TINY = {"num_layers": 4, "hidden_size": 64, "intermediate_size": 128, "vocab_size": 128}
_SMALL = {"num_layers": 8, "hidden_size": 128, "intermediate_size": 384, "vocab_size": 512}
_QUEUE = tuple((0.0, n) for n in (192, 128, 256, 160, 224, 96, 256, 128, 192, 160, 224, 128))
SCENARIOS: dict[str, dict[str, Any]] = {
    "small": {
        "model": _TINY,
        "hosts": 3,
        "serving": (
            (("h0/gpu0",), "decode"),
            (("h2/gpu3",), "decode"),
            (("h2/gpu1", "h2/gpu2"), "prefill"),
        ),
        "prefill": 3,
    },
    "large": {
        "model": _SMALL,
        "hosts": 5,
        "serving": (
            (("h0/gpu0",), "decode"),
            (("h0/gpu1",), "decode"),
            (("h1/gpu0", "h1/gpu1"), "decode"),
        ),
        "prefill": 6,
        "nic": 4 * MB,
        "chunk_bytes": 64 * KIB,
    },
    "live": {
        "model": _SMALL,
        "hosts": 2,
        "serving": ((("h0/gpu0",), "prefill"), (("h1/gpu0",), "decode")),
        "prefill": 1,
        "tp": 1,
        "nic": 8 * MB,
        "chunk_bytes": 64 * KIB,
        "queue": _QUEUE,
    },
}
"""Per scenario: model sizes (4 heads, 2 KV heads), hosts, serving instances ``(gpus, role)``
(the first with ``queue``), new prefill instances of TP ``tp`` (default 2), NIC rate (default
1 MB/s), chunk size (default 32 KiB)."""


def _scenario(name: str) -> dict[str, Any]:
    if name not in SCENARIOS:
        raise InvalidInputError(f"scenario must be one of {', '.join(SCENARIOS)}, got {name!r}")
    return {"tp": 2, "nic": 1 * MB, "chunk_bytes": 32 * KIB, "queue": (), **SCENARIOS[name]}


def scenario_state(name: str, spec: ModelSpec) -> ClusterState:
    """The scenario's cluster with its serving instances (no host copy of the model)."""
    from blitzplan import ClusterState
    from blitzplan.topologies import build_cluster, nvswitch_host

    chosen = _scenario(name)
    nic = chosen["nic"]
    host = nvswitch_host(
        "a100",
        gpus=4,
        nic_bytes_per_s=nic,
        host_to_gpu_bytes_per_s=4 * nic,
        gpu_pcie_bytes_per_s=4 * nic,
        nvlink_bytes_per_s=4 * nic,
        dram_bytes=16 * GIB,
    )
    state = ClusterState(build_cluster(host, hosts=chosen["hosts"], name=f"executor-{name}"))
    for k, (gpus, role) in enumerate(chosen["serving"]):
        queue = chosen["queue"] if k == 0 else ()
        state.add_instance(spec, gpus=list(gpus), role=role, queue=queue)
    return state


def scenario_plan(
    name: str, *, compute: ComputeModel | None = None, live_method: str = "zigzag"
) -> tuple[ClusterState, ScalePlan]:
    """The scenario's state and its plan (``compute`` defaults to the planner's roofline;
    ``live_method`` is the live pairs' policy)."""
    from blitzplan import ScaleRequest, load_model, plan

    chosen = _scenario(name)
    sizes = small_config(num_attention_heads=4, num_key_value_heads=2, **chosen["model"])
    spec = load_model(sizes)
    state = scenario_state(name, spec)
    request = ScaleRequest(spec, prefill=chosen["prefill"], tp=chosen["tp"])
    options = {"chunk_bytes": chosen["chunk_bytes"], "live_method": live_method}
    return state, plan(state, request, link_efficiency=1.0, compute=compute, **options)


def write_scenario(name: str, path: str | Path, *, checkpoint: str | Path | None = None) -> Path:
    """Write the scenario's ScalePlan document to ``path`` and, with ``checkpoint``, seeded
    weights of its model there unless it has them."""
    from blitzplan.executor.smallmodel.checkpoint import MANIFEST, save_checkpoint
    from blitzplan.scale.export import program_json

    _, made = scenario_plan(name)
    Path(path).write_text(program_json(made))
    if checkpoint is not None and not (Path(checkpoint) / MANIFEST).is_file():
        save_checkpoint(made.spec, checkpoint, seed=0)
    return Path(path)
