"""The executor's one table of built-in scenarios: ScalePlan documents made with the planner.

Made with ``blitzplan.plan`` at line rate (``link_efficiency=1.0``, so predicted rates are the
paced ones) and run from their JSON alone. Hosts of four NVLink-joined GPUs, one NIC per GPU,
NICs slow enough that transfers dominate on a CPU (NVLink and PCIe four times faster).

* ``small`` (3 hosts, 8 processes): TP1 decode instances on ``h0/gpu0`` and ``h2/gpu3`` serve;
  a TP2 prefill instance on ``h2/gpu1-2`` does not send. Three new TP2 prefill instances: two on
  ``h1``, one on ``h0``. The plan reshards the TP1 sources' buffers (``source_layout``), copies
  over NVLink into ``h0``'s new instance, which forwards a stripe to ``h1``; each of ``h1``'s
  rank buffers is striped over two sources and completed by NVLink all-gathers.
* ``large`` (5 hosts, 16 processes): TP1 decode instances on ``h0/gpu0`` and ``h0/gpu1`` and a
  TP2 one on ``h1/gpu0-1``; six new TP2 instances on ``h2``-``h4``; ``h2`` forwards to ``h4``.
* ``live`` (2 hosts, TP1): a prefill instance on ``h0/gpu0`` with a queue, a decode instance on
  ``h1/gpu0`` as the source; one new live prefill instance pairs with the queued one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Scenario:
    """A cluster of ``hosts`` hosts of four GPUs with NICs of ``nic_bytes_per_s``, instances
    ``(gpus, role)`` of the model serving (the first with ``queue``, ``(arrival_s,
    prompt_tokens)`` requests), and ``prefill`` new TP ``tp`` instances to add."""

    config: Mapping[str, Any]
    hosts: int
    serving: tuple[tuple[tuple[str, ...], str], ...]
    prefill: int
    tp: int = 2
    nic_bytes_per_s: float = 1 * MB
    chunk_bytes: int = 32 * KIB
    queue: tuple[tuple[float, int], ...] = ()


_TINY = small_config(
    num_layers=4,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
)
_SMALL = small_config(
    num_layers=8,
    hidden_size=128,
    intermediate_size=384,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
)
SCENARIOS: dict[str, Scenario] = {
    "small": Scenario(
        config=_TINY,
        hosts=3,
        serving=(
            (("h0/gpu0",), "decode"),
            (("h2/gpu3",), "decode"),
            (("h2/gpu1", "h2/gpu2"), "prefill"),
        ),
        prefill=3,
    ),
    "large": Scenario(
        config=_SMALL,
        hosts=5,
        serving=(
            (("h0/gpu0",), "decode"),
            (("h0/gpu1",), "decode"),
            (("h1/gpu0", "h1/gpu1"), "decode"),
        ),
        prefill=6,
        nic_bytes_per_s=4 * MB,
        chunk_bytes=64 * KIB,
    ),
    "live": Scenario(
        config=_SMALL,
        hosts=2,
        serving=((("h0/gpu0",), "prefill"), (("h1/gpu0",), "decode")),
        prefill=1,
        tp=1,
        nic_bytes_per_s=8 * MB,
        chunk_bytes=64 * KIB,
        queue=tuple((0.0, n) for n in (192, 128, 256, 160, 224, 96, 256, 128, 192, 160, 224, 128)),
    ),
}
"""The scenarios by name (see the module docstring)."""


def _scenario(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise InvalidInputError(f"scenario must be one of {', '.join(SCENARIOS)}, got {name!r}")
    return SCENARIOS[name]


def scenario_state(name: str, spec: ModelSpec | None = None) -> ClusterState:
    """The scenario's cluster with its serving instances (no host copy of the model)."""
    from blitzplan import ClusterState, load_model
    from blitzplan.topologies import build_cluster, nvswitch_host

    chosen = _scenario(name)
    spec = spec or load_model(dict(chosen.config))
    nic = chosen.nic_bytes_per_s
    host = nvswitch_host(
        "a100",
        gpus=4,
        nic_bytes_per_s=nic,
        host_to_gpu_bytes_per_s=4 * nic,
        gpu_pcie_bytes_per_s=4 * nic,
        nvlink_bytes_per_s=4 * nic,
        dram_bytes=16 * GIB,
    )
    state = ClusterState(build_cluster(host, hosts=chosen.hosts, name=f"executor-{name}"))
    for k, (gpus, role) in enumerate(chosen.serving):
        state.add_instance(spec, gpus=list(gpus), role=role, queue=chosen.queue if k == 0 else ())
    return state


def scenario_plan(
    name: str,
    spec: ModelSpec | None = None,
    *,
    compute: ComputeModel | None = None,
    live_method: str = "zigzag",
) -> tuple[ClusterState, ScalePlan]:
    """The scenario's state and its plan (``spec`` defaults to the scenario's model; ``compute``,
    e.g. layer times measured on this machine, to the planner's roofline; ``live_method`` is the
    live pairs' policy)."""
    from blitzplan import ScaleRequest, load_model, plan

    chosen = _scenario(name)
    spec = spec or load_model(dict(chosen.config))
    state = scenario_state(name, spec)
    request = ScaleRequest(spec, prefill=chosen.prefill, tp=chosen.tp)
    made = plan(
        state,
        request,
        link_efficiency=1.0,
        chunk_bytes=chosen.chunk_bytes,
        compute=compute,
        live_method=live_method,
    )
    return state, made


def write_scenario(name: str, path: str | Path, *, checkpoint: str | Path | None = None) -> Path:
    """Write the scenario's ScalePlan document to ``path`` (and, with ``checkpoint``, seeded
    weights of its model to that directory unless it has them); returns the document's path."""
    from blitzplan import load_model
    from blitzplan.executor.smallmodel.checkpoint import MANIFEST, save_checkpoint
    from blitzplan.scale.export import program_json

    spec = load_model(dict(_scenario(name).config))
    _, made = scenario_plan(name, spec)
    out = Path(path)
    out.write_text(program_json(made))
    if checkpoint is not None and not (Path(checkpoint) / MANIFEST).is_file():
        save_checkpoint(spec, checkpoint, seed=0)
    return out
