"""What every compute model answers, and a layer's kernel times by family."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Protocol, runtime_checkable

from blitzplan._checks import MAX_COUNT, is_integer
from blitzplan.errors import InvalidInputError

__all__ = ["ComputeModel", "KernelTimes", "check_count_arg"]


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


def check_count_arg(name: str, value: int, *, minimum: int = 1) -> None:
    if not is_integer(value) or value < minimum:
        raise InvalidInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value > MAX_COUNT:
        raise InvalidInputError(f"{name} must be at most {MAX_COUNT}, got {value!r}")


@dataclass(frozen=True)
class KernelTimes:
    """Seconds of one decoder layer on one GPU by kernel family, measured or predicted.

    ``gemm_s``: the QKV, O and MLP projections; ``elementwise_s``: RoPE, SiLU-and-mul, both
    RMSNorms and the residual add; ``attention_s``: the attention kernel; ``allreduce_s``: both
    tensor-parallel all-reduces; ``kv_write_s``: writing the new K and V into the cache.
    """

    gemm_s: float = 0.0
    elementwise_s: float = 0.0
    attention_s: float = 0.0
    allreduce_s: float = 0.0
    kv_write_s: float = 0.0

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if not 0 <= value < math.inf:
                raise InvalidInputError(f"{item.name} must be finite and >= 0, got {value!r}")

    @property
    def total_s(self) -> float:
        return (
            self.gemm_s + self.elementwise_s + self.attention_s + self.allreduce_s + self.kv_write_s
        )
