"""Built-in scenarios whose ScalePlan documents the executor runs (:mod:`.program`).

Made with the planner (``blitzplan.plan`` at line rate, ``link_efficiency=1.0``, so predicted
rates are the paced ones); run from their JSON alone. Hosts of four NVLink-joined GPUs, one NIC
per GPU, NICs slow enough that transfers dominate on a CPU (NVLink and PCIe four times faster).

* ``small`` (3 hosts, 8 processes): TP1 decode instances on ``h0/gpu0`` and ``h2/gpu3`` serve;
  a TP2 prefill instance on ``h2/gpu1-2`` does not send. Three new TP2 prefill instances: two on
  ``h1``, one on ``h0``. The plan reshards the TP1 sources' buffers (``source_layout``), copies
  over NVLink into ``h0``'s new instance, which forwards a stripe to ``h1``; each of ``h1``'s
  rank buffers is striped over two sources and completed by NVLink all-gathers.
* ``large`` (5 hosts, 16 processes): a TP1 decode instance on ``h0/gpu0`` and ``h0/gpu1`` and a
  TP2 one on ``h1/gpu0-1``; six new TP2 instances on ``h2``-``h4``; ``h2`` forwards to ``h4``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blitzplan.errors import InvalidInputError
from blitzplan.executor.model import small_config
from blitzplan.units import GIB, KIB, MB

if TYPE_CHECKING:
    from blitzplan.cluster import ClusterState
    from blitzplan.models import ModelSpec
    from blitzplan.scale import ScalePlan

__all__ = [
    "PROGRAM_SCENARIOS",
    "ProgramScenario",
    "scenario_plan",
    "scenario_state",
    "write_scenario",
]


@dataclass(frozen=True)
class ProgramScenario:
    """A cluster of ``hosts`` hosts of four GPUs with NICs of ``nic_bytes_per_s``, instances
    ``(gpus, role)`` of the model serving, and ``prefill`` new TP ``tp`` instances to add."""

    config: Mapping[str, Any]
    hosts: int
    serving: tuple[tuple[tuple[str, ...], str], ...]
    prefill: int
    tp: int = 2
    nic_bytes_per_s: float = 1 * MB
    chunk_bytes: int = 32 * KIB


PROGRAM_SCENARIOS: dict[str, ProgramScenario] = {
    "small": ProgramScenario(
        config=small_config(
            num_layers=4,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
        ),
        hosts=3,
        serving=(
            (("h0/gpu0",), "decode"),
            (("h2/gpu3",), "decode"),
            (("h2/gpu1", "h2/gpu2"), "prefill"),
        ),
        prefill=3,
    ),
    "large": ProgramScenario(
        config=small_config(
            num_layers=8,
            hidden_size=128,
            intermediate_size=384,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
        ),
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
}
"""The scenarios by name (see the module docstring)."""


def _scenario(name: str) -> ProgramScenario:
    if name not in PROGRAM_SCENARIOS:
        raise InvalidInputError(
            f"scenario must be one of {', '.join(PROGRAM_SCENARIOS)}, got {name!r}"
        )
    return PROGRAM_SCENARIOS[name]


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
    for gpus, role in chosen.serving:
        state.add_instance(spec, gpus=list(gpus), role=role)
    return state


def scenario_plan(name: str, spec: ModelSpec | None = None) -> tuple[ClusterState, ScalePlan]:
    """The scenario's state and its plan (``spec`` defaults to the scenario's model)."""
    from blitzplan import ScaleRequest, load_model, plan

    chosen = _scenario(name)
    spec = spec or load_model(dict(chosen.config))
    state = scenario_state(name, spec)
    request = ScaleRequest(spec, prefill=chosen.prefill, tp=chosen.tp)
    made = plan(state, request, link_efficiency=1.0, chunk_bytes=chosen.chunk_bytes)
    return state, made


def write_scenario(name: str, path: str | Path, *, checkpoint: str | Path | None = None) -> Path:
    """Write the scenario's ScalePlan document to ``path`` (and, with ``checkpoint``, seeded
    weights of its model to that directory); returns the document's path."""
    from blitzplan import load_model
    from blitzplan.executor.checkpoint import save_checkpoint

    spec = load_model(dict(_scenario(name).config))
    _, made = scenario_plan(name, spec)
    out = Path(path)
    out.write_text(made.to_json())
    if checkpoint is not None:
        save_checkpoint(spec, checkpoint, seed=0)
    return out
