"""Whether a model fits a GPU: the share of memory its weights may take, and the KV reserve
beside them."""

from __future__ import annotations

from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.topologies import Topology
from blitzplan.units import GIB

__all__ = ["MAX_WEIGHT_FRACTION", "MIN_KV_TOKENS", "check_tp_fits", "memory_misfit"]

MAX_WEIGHT_FRACTION = 0.9
"""Weights and the KV reserve may fill at most this share of a GPU's memory (the rest is
activations and the runtime, as vLLM's default ``gpu_memory_utilization``)."""

MIN_KV_TOKENS = 8192
"""KV cache every GPU must keep room for beside its weights: one 8k-token request. An instance
whose weights leave less is refused, by ``add_instance`` and by ``plan()`` alike."""


def check_tp_fits(topology: Topology, tp: int) -> None:
    """InvalidInputError unless some NVLink group of ``topology`` has ``tp`` GPUs."""
    memo = topology.memo.setdefault("largest_nvlink_group", {})
    if () not in memo:
        memo[()] = max(len(topology.nvlink_group_of(g)) for g in topology.gpus())
    largest = memo[()]
    if tp > largest:
        raise InvalidInputError(f"tp={tp} is larger than the largest NVLink group ({largest} GPUs)")


def memory_misfit(model: ModelSpec, tp: int, memory_bytes: float) -> str | None:
    """Why ``model`` at ``tp`` does not fit a GPU of ``memory_bytes``, or None when it does:
    weights per GPU plus the KV of :data:`MIN_KV_TOKENS` tokens must stay within
    :data:`MAX_WEIGHT_FRACTION` of the memory."""
    shard = model.shard(tp)
    reserve = MIN_KV_TOKENS * shard.kv_bytes_per_token
    if shard.total_bytes + reserve <= MAX_WEIGHT_FRACTION * memory_bytes:
        return None
    return (
        f"{model.name} at tp={tp} needs {shard.total_bytes / GIB:.1f} GiB of weights and "
        f"{reserve / GIB:.1f} GiB of KV reserve ({MIN_KV_TOKENS} tokens) per GPU, more than "
        f"{MAX_WEIGHT_FRACTION:.0%} of {memory_bytes / GIB:.1f} GiB"
    )
