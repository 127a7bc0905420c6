"""How a colocated replica batches and keeps its KV cache: vLLM's engine arguments, their
defaults and where each default comes from.

==========================  ====================================================================
option                      default (source)
==========================  ====================================================================
``scheduler``               ``"chunked"`` (vLLM V1, where chunked prefill is always on)
``max_num_batched_tokens``  ``chunked``: 8192 on GPUs of at least 70 GiB that are not A100s
                            (H100, H200, A800), else 2048; ``prefill-first``: the larger of
                            ``max_model_len`` and 2048 (vLLM ``EngineArgs.get_batch_defaults``
                            for its OpenAI server; V0 ``SchedulerConfig`` without chunking)
``max_num_seqs``            ``chunked``: 1024 on those GPUs, else 256; ``prefill-first``: 256
                            (the same sources)
``long_prefill_tokens``     0, no per-request cap (V1 ``long_prefill_token_threshold``; chunked
                            only)
``gpu_memory_utilization``  0.9 (vLLM ``CacheConfig``)
``block_size``              16 tokens (vLLM ``CacheConfig`` on CUDA)
``max_model_len``           the model's ``max_position_embeddings`` (vLLM ``ModelConfig``);
                            a request whose prompt and output exceed it is refused (dropped), as
                            vLLM's server refuses it
``router``                  ``"least-outstanding"``: the replica with the fewest requests routed
                            to it and not finished (ties: the oldest replica); ``"round-robin"``
==========================  ====================================================================

``prefill-first`` never splits a prompt: one longer than ``max_num_batched_tokens`` is dropped
(vLLM V0 refuses a budget under ``max_model_len`` instead; here a smaller budget is allowed and
its effect, the longer prompts refused, shows in the report).

A replica's KV cache holds what ``gpu_memory_utilization`` of each GPU's memory leaves after its
weight shard and the peak activations of a full iteration (vLLM measures these in a profiling
run; here the MLP's gate-up output and input for ``max_num_batched_tokens`` tokens, and the
sampler's float32 logits for ``max_num_seqs`` requests), in blocks of ``block_size`` tokens.
CUDA context and graph memory are not subtracted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from blitzplan._checks import check_count, is_finite_number
from blitzplan.errors import InvalidInputError
from blitzplan.hardware import GpuSpec
from blitzplan.models import ModelSpec
from blitzplan.sim.schedulers import SCHEDULERS, ReplicaLimits

__all__ = ["ROUTERS", "ServingOptions"]

ROUTERS = ("least-outstanding", "round-robin")
"""How requests are spread over colocated replicas (see the module docstring)."""

_LARGE_GPU_BYTES = 70 * 2**30
"""vLLM's threshold for its larger batch defaults (``get_batch_defaults``)."""
_WATERMARK = 0.01
"""V0's ``BlockSpaceManager`` keeps this fraction of the blocks free when admitting prompts."""
_LOGIT_BYTES = 4  # the sampler's logits are float32


@dataclass(frozen=True)
class ServingOptions:
    """The keyword options of a colocated fleet (module docstring); None takes the default."""

    scheduler: str = "chunked"
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    long_prefill_tokens: int = 0
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    max_model_len: int | None = None
    router: str = "least-outstanding"

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise InvalidInputError(
                f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.scheduler!r}"
            )
        if self.router not in ROUTERS:
            raise InvalidInputError(
                f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}"
            )
        for name in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(self, name) is not None:
                check_count(name, getattr(self, name))
        check_count("long_prefill_tokens", self.long_prefill_tokens, minimum=0)
        check_count("block_size", self.block_size)
        utilization = self.gpu_memory_utilization
        if not (is_finite_number(utilization) and 0 < utilization <= 1):
            raise InvalidInputError(
                f"gpu_memory_utilization must be in (0, 1], got {utilization!r}"
            )

    def resolved(self, model: ModelSpec, gpu: GpuSpec) -> ServingOptions:
        """Every default filled in for ``model`` on ``gpu``; checked as vLLM checks it."""
        max_len = self.max_model_len or _context(model)
        large = gpu.memory_bytes >= _LARGE_GPU_BYTES and "a100" not in gpu.name
        if self.scheduler == "chunked":
            tokens, seqs = (8192, 1024) if large else (2048, 256)
        else:
            tokens, seqs = max(max_len, 2048), 256
        out = replace(
            self,
            max_model_len=max_len,
            max_num_batched_tokens=self.max_num_batched_tokens or tokens,
            max_num_seqs=self.max_num_seqs or seqs,
        )
        if out.max_num_batched_tokens < out.max_num_seqs:  # type: ignore[operator]
            raise InvalidInputError(
                f"max_num_batched_tokens ({out.max_num_batched_tokens}) must be at least "
                f"max_num_seqs ({out.max_num_seqs}), as vLLM requires"
            )
        return out

    def limits(self, total_blocks: int) -> ReplicaLimits:
        """The scheduler's limits (of resolved options) for a cache of ``total_blocks``."""
        budget, seqs, max_len = self._numbers()
        prefill_first = self.scheduler == "prefill-first"
        return ReplicaLimits(
            max_num_batched_tokens=budget,
            max_num_seqs=seqs,
            long_prefill_tokens=self.long_prefill_tokens,
            block_size=self.block_size,
            watermark_blocks=int(_WATERMARK * total_blocks) if prefill_first else 0,
            prompt_limit=min(max_len, budget) if prefill_first else max_len,
        )

    def kv_blocks(self, model: ModelSpec, gpu: GpuSpec, tp: int) -> int:
        """KV blocks of one replica (resolved options; see the module docstring)."""
        budget, seqs, _ = self._numbers()
        shard = model.shard(tp)
        mlp = 2 * model.intermediate_size // tp + model.hidden_size
        activations = budget * mlp * model.dtype_bytes
        logits = seqs * math.ceil(model.vocab_size / tp) * _LOGIT_BYTES
        free = self.gpu_memory_utilization * gpu.memory_bytes - shard.total_bytes - activations
        blocks = int((free - logits) // (self.block_size * shard.kv_bytes_per_token))
        if blocks < 1:
            raise InvalidInputError(
                f"{model.name} tp={tp} leaves no KV memory on {gpu.name} at "
                f"gpu_memory_utilization={self.gpu_memory_utilization}"
            )
        return blocks

    def _numbers(self) -> tuple[int, int, int]:
        budget, seqs, max_len = self.max_num_batched_tokens, self.max_num_seqs, self.max_model_len
        if budget is None or seqs is None or max_len is None:
            raise InvalidInputError("resolve the serving options first (ServingOptions.resolved)")
        return budget, seqs, max_len


def _context(model: ModelSpec) -> int:
    """vLLM's default ``max_model_len``: the config's ``max_position_embeddings``."""
    found = model.config.get("max_position_embeddings") if model.config else None
    if not isinstance(found, int) or found < 1:
        raise InvalidInputError(
            f"{model.name}'s config has no max_position_embeddings: pass max_model_len"
        )
    return found
