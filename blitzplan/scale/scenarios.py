"""The executor's built-in scenarios (``blitzplan validate --program``): ScalePlan documents of a
small Llama-style model (:func:`small_config`) made with ``blitzplan.plan``.

At line rate (``link_efficiency=1.0``) on hosts of four NVLink-joined GPUs, one NIC per GPU, NICs
slow enough that transfers dominate on a CPU (NVLink and PCIe four times faster). ``small`` and
``large`` scale TP2 prefill instances from TP1 and TP2 sources (forwarding, multi-source stripes,
all-gathers); ``live`` pairs one new prefill instance with a queued one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.models import load_model
from blitzplan.scale.plan import plan
from blitzplan.scale.types import ScalePlan, ScaleRequest
from blitzplan.topologies import build_cluster, nvswitch_host
from blitzplan.units import GIB, KIB, MB

if TYPE_CHECKING:
    from blitzplan.compute import ComputeModel
    from blitzplan.models import ModelSpec


def small_config(
    *,
    num_layers: int = 8,
    hidden_size: int = 256,
    intermediate_size: int = 768,
    num_attention_heads: int = 8,
    num_key_value_heads: int = 2,
    vocab_size: int = 1024,
    torch_dtype: str = "float32",
) -> dict[str, object]:
    """A Hugging Face style config.json dict of a small Llama (no weights are downloaded)."""
    return {
        "model_type": "llama",
        "_name_or_path": "blitzplan-executor-llama",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "vocab_size": vocab_size,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10_000.0,
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
    }


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
    chosen = _scenario(name)
    sizes = small_config(num_attention_heads=4, num_key_value_heads=2, **chosen["model"])
    spec = load_model(sizes)
    state = scenario_state(name, spec)
    request = ScaleRequest(spec, prefill=chosen["prefill"], tp=chosen["tp"])
    options = {"chunk_bytes": chosen["chunk_bytes"], "live_method": live_method}
    return state, plan(state, request, link_efficiency=1.0, compute=compute, **options)
