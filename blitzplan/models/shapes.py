"""The small records a ModelSpec is built from: MLA sizes, MoE layout, and a TP shard."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MlaDims", "MoeLayout", "TensorParallelShard"]


@dataclass(frozen=True)
class MlaDims:
    """Multi-head latent attention (DeepSeek-V2/V3) sizes; ``q_lora_rank`` 0: no query LoRA."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoeLayout:
    """What a MoE model adds beyond routed experts (all zero/empty for Mixtral).

    ``dense_layers``: 0-based indices of layers with a dense MLP of ``dense_intermediate_size``
    (DeepSeek's first ``first_k_dense_replace`` layers, Qwen's ``mlp_only_layers``);
    ``shared_intermediate_size``: the always-active shared expert(s), summed;
    ``shared_expert_gate``: Qwen2-MoE's one-output gate on it; ``router_bias``: DeepSeek-V3's
    float32 score correction.
    """

    dense_layers: tuple[int, ...] = ()
    dense_intermediate_size: int = 0
    shared_intermediate_size: int = 0
    shared_expert_gate: bool = False
    router_bias: bool = False


@dataclass(frozen=True)
class TensorParallelShard:
    """What one GPU of a ``tp``-way tensor-parallel instance holds, per unit, in bytes."""

    tp: int
    unit_bytes: tuple[int, ...]
    kv_bytes_per_token: int = 0  # KV cache one token occupies on this GPU, all layers

    @property
    def total_bytes(self) -> int:
        return sum(self.unit_bytes)
