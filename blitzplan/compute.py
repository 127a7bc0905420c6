"""Per-layer compute times: a roofline on a GPU spec, or a measured table with the same interface.

Every planner, the simulator and the executor ask a :class:`ComputeModel` three questions: how
long one decoder layer takes to prefill a batch of tokens, how long one decode step of one layer
takes for a batch at a context length, and how long the lm_head takes for some tokens. Times are
per GPU of a tensor-parallel instance, including its all-reduces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np

from blitzplan._checks import MAX_COUNT, MAX_SECONDS, is_integer, is_number
from blitzplan.errors import InvalidInputError
from blitzplan.hardware import GpuSpec, get_gpu
from blitzplan.models import ModelSpec
from blitzplan.units import US

__all__ = ["ComputeModel", "RooflineComputeModel", "TableComputeModel"]

_ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron tensor parallelism)
_FLOPS_PER_MAC = 2


@runtime_checkable
class ComputeModel(Protocol):
    """What the planners need to know about compute time, per layer and per instance."""

    def prefill_layer_s(self, tokens: int, *, requests: int = 1) -> float:
        """Seconds for one decoder layer to prefill ``tokens`` prompt tokens of ``requests``."""
        ...

    def decode_layer_s(self, batch_size: int, context_len: int) -> float:
        """Seconds for one decoder layer to decode one token for each of ``batch_size``."""
        ...

    def head_s(self, tokens: int) -> float:
        """Seconds for the final norm and lm_head over ``tokens`` tokens."""
        ...


def _check_count(name: str, value: int, *, minimum: int = 1) -> None:
    if not is_integer(value) or value < minimum:
        raise InvalidInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > MAX_COUNT:
        raise InvalidInputError(f"{name} must be at most {MAX_COUNT}, got {value!r}")


@dataclass(frozen=True)
class RooflineComputeModel:
    """max(FLOPs / (peak * mfu), bytes / (HBM * mbu)) per layer, plus all-reduces and overhead.

    ``mfu`` and ``mbu`` are the fractions of peak compute and HBM bandwidth a real kernel reaches;
    ``layer_overhead_s`` covers kernel launches. Calibrate them against a measured table.
    """

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    mfu: float = 0.6
    mbu: float = 0.8
    layer_overhead_s: float = 30 * US
    allreduce_latency_s: float = 10 * US

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu", get_gpu(self.gpu))
        self.model.check_tp(self.tp)
        for key in ("mfu", "mbu"):
            value = getattr(self, key)
            if not is_number(value) or not 0 < value <= 1:
                raise InvalidInputError(f"{key} must be in (0, 1], got {value!r}")
        for key in ("layer_overhead_s", "allreduce_latency_s"):
            value = getattr(self, key)
            if not is_number(value) or not 0 <= value <= MAX_SECONDS:
                raise InvalidInputError(
                    f"{key} must be >= 0 (at most {MAX_SECONDS:g}), got {value!r}"
                )

    @cached_property
    def _shard_bytes(self) -> tuple[int, ...]:
        return self.model.shard(self.tp).unit_bytes

    def _roofline_s(self, flops: float, bytes_moved: float) -> float:
        return max(
            flops / (self.gpu.bf16_flops_per_s * self.mfu),
            bytes_moved / (self.gpu.hbm_bytes_per_s * self.mbu),
        )

    def _allreduce_s(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        link = self.gpu.nvlink_bytes_per_s or self.gpu.pcie_bytes_per_s
        payload = tokens * self.model.activation_bytes_per_token
        ring = 2 * (self.tp - 1) / self.tp * payload / link
        return _ALLREDUCES_PER_LAYER * (ring + self.allreduce_latency_s)

    def _layer_weight_bytes(self, tokens: int) -> float:
        """Weights read once per layer; a small MoE batch touches only the experts it routes to."""
        m = self.model
        layer = self._shard_bytes[1]
        if m.num_experts == 1:
            return float(layer)
        expert = m.layer.mlp / m.num_experts / self.tp
        touched = min(m.num_experts, tokens * m.experts_per_token)
        return layer - expert * (m.num_experts - touched)

    def prefill_layer_s(self, tokens: int, *, requests: int = 1) -> float:
        _check_count("tokens", tokens)
        _check_count("requests", requests)
        m = self.model
        q_dim = m.num_attention_heads * m.head_dim
        # causal attention: QK^T and PV over half of an n x n matrix per request of n tokens
        attention_macs = 2 * q_dim * tokens * (tokens / requests) / 2
        flops = _FLOPS_PER_MAC * (m.active_params_per_layer * tokens + attention_macs) / self.tp
        kv_write = tokens * m.kv_bytes_per_token / m.num_layers / self.tp
        moved = (
            self._layer_weight_bytes(tokens) + 2 * tokens * m.activation_bytes_per_token + kv_write
        )
        return self._roofline_s(flops, moved) + self._allreduce_s(tokens) + self.layer_overhead_s

    def decode_layer_s(self, batch_size: int, context_len: int) -> float:
        _check_count("batch_size", batch_size)
        _check_count("context_len", context_len, minimum=0)
        m = self.model
        q_dim = m.num_attention_heads * m.head_dim
        attention_macs = 2 * q_dim * batch_size * context_len
        flops = _FLOPS_PER_MAC * (m.active_params_per_layer * batch_size + attention_macs) / self.tp
        kv_read = batch_size * context_len * m.kv_bytes_per_token / m.num_layers / self.tp
        moved = self._layer_weight_bytes(batch_size) + kv_read
        return (
            self._roofline_s(flops, moved) + self._allreduce_s(batch_size) + self.layer_overhead_s
        )

    def head_s(self, tokens: int) -> float:
        _check_count("tokens", tokens)
        m = self.model
        head_params = m.vocab_size * m.hidden_size / self.tp
        flops = _FLOPS_PER_MAC * head_params * tokens
        moved = self._shard_bytes[-1] + tokens * m.activation_bytes_per_token
        return self._roofline_s(flops, moved) + self.layer_overhead_s


def _interp(x: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Piecewise-linear through (xs, ys), extended linearly past both ends."""
    if len(xs) == 1:
        return float(ys[0])
    if x < xs[0]:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        return float(ys[0] + slope * (x - xs[0]))
    if x > xs[-1]:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return float(ys[-1] + slope * (x - xs[-1]))
    return float(np.interp(x, xs, ys))


def _array(name: str, values: object) -> np.ndarray:
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name} must hold numbers, got {values!r}") from None


def _axis(name: str, values: Sequence[float]) -> np.ndarray:
    array = _array(name, values)
    if array.ndim != 1 or len(array) == 0:
        raise InvalidInputError(f"{name} must be a non-empty 1-D sequence, got {values!r}")
    if np.any(~np.isfinite(array)) or np.any(array < 0) or np.any(array > MAX_COUNT):
        raise InvalidInputError(f"{name} must hold counts in [0, {MAX_COUNT}], got {values!r}")
    if np.any(np.diff(array) <= 0):
        raise InvalidInputError(f"{name} must be strictly increasing, got {list(values)!r}")
    return array


def _times(name: str, values: object, shape: tuple[int, ...]) -> np.ndarray:
    array = _array(name, values)
    if array.shape != shape:
        raise InvalidInputError(f"{name} must have shape {shape}, got {array.shape}")
    if np.any(~np.isfinite(array)) or np.any(array < 0) or np.any(array > MAX_SECONDS):
        raise InvalidInputError(
            f"{name} must hold finite times >= 0 (at most {MAX_SECONDS:g} s), "
            f"got {array.tolist()!r}"
        )
    return array


class TableComputeModel:
    """A measured compute model: piecewise-linear in tokens, bilinear in (batch, context).

    ``prefill_s[i]`` is the per-layer time at ``prefill_tokens[i]``; ``decode_s[i][j]`` the
    decode step at ``decode_batch_sizes[i]`` and ``decode_context_lens[j]``; ``head_s[i]`` the
    head at ``head_tokens[i]``. Outside the grid the nearest segment is extended linearly.
    Prefill here does not depend on the number of requests (the table measured one mix).
    """

    def __init__(
        self,
        *,
        prefill_tokens: Sequence[float],
        prefill_s: Sequence[float],
        decode_batch_sizes: Sequence[float],
        decode_context_lens: Sequence[float],
        decode_s: Sequence[Sequence[float]],
        head_tokens: Sequence[float],
        head_s: Sequence[float],
    ) -> None:
        self._prefill_x = _axis("prefill_tokens", prefill_tokens)
        self._prefill_y = _times("prefill_s", prefill_s, self._prefill_x.shape)
        self._batch_x = _axis("decode_batch_sizes", decode_batch_sizes)
        self._context_x = _axis("decode_context_lens", decode_context_lens)
        self._decode_y = _times("decode_s", decode_s, (len(self._batch_x), len(self._context_x)))
        self._head_x = _axis("head_tokens", head_tokens)
        self._head_y = _times("head_s", head_s, self._head_x.shape)

    @classmethod
    def tabulate(
        cls,
        model: ComputeModel,
        *,
        prefill_tokens: Sequence[int] = (1, 128, 512, 2048, 8192),
        decode_batch_sizes: Sequence[int] = (1, 8, 32, 128),
        decode_context_lens: Sequence[int] = (0, 512, 2048, 8192),
    ) -> TableComputeModel:
        """Sample another compute model on a grid (for tests, or to freeze a calibrated model)."""
        return cls(
            prefill_tokens=prefill_tokens,
            prefill_s=[model.prefill_layer_s(n) for n in prefill_tokens],
            decode_batch_sizes=decode_batch_sizes,
            decode_context_lens=decode_context_lens,
            decode_s=[
                [model.decode_layer_s(b, c) for c in decode_context_lens]
                for b in decode_batch_sizes
            ],
            head_tokens=prefill_tokens,
            head_s=[model.head_s(n) for n in prefill_tokens],
        )

    def prefill_layer_s(self, tokens: int, *, requests: int = 1) -> float:
        _check_count("tokens", tokens)
        _check_count("requests", requests)
        return max(0.0, _interp(tokens, self._prefill_x, self._prefill_y))

    def decode_layer_s(self, batch_size: int, context_len: int) -> float:
        _check_count("batch_size", batch_size)
        _check_count("context_len", context_len, minimum=0)
        per_batch = np.array([_interp(context_len, self._context_x, row) for row in self._decode_y])
        return max(0.0, _interp(batch_size, self._batch_x, per_batch))

    def head_s(self, tokens: int) -> float:
        _check_count("tokens", tokens)
        return max(0.0, _interp(tokens, self._head_x, self._head_y))
