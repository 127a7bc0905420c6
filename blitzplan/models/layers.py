"""The tensors of one decoder layer, and their bytes whole or on one tensor-parallel GPU.

A layer is an inventory of :class:`Linear` projections and :class:`Vector` weights (norms, router
biases) named as the Hugging Face checkpoint names them, so quantization rules that name modules
apply to the right ones. Layouts: grouped-query attention (Llama, Mistral, Qwen2/3, Gemma-2,
Phi-3.5-MoE) or multi-head latent attention (DeepSeek-V2/V3); a dense gated MLP, or routed
experts with a router and optional shared experts (Mixtral, Phi-3.5-MoE, Qwen2-MoE, Qwen3-MoE,
DeepSeek). Gemma-2 adds norms before and after the MLP; Phi-3.5-MoE's norms carry biases.

Tensor parallelism follows Megatron and vLLM: "column" linears split their outputs and "row"
linears their inputs over ``parts`` indivisible pieces (heads, or features; KV heads are
replicated when ``tp`` exceeds them); "replicated" linears (MoE routers, MLA's down-projections)
and every vector are whole on each GPU; a column linear's bias splits, a row linear's does not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blitzplan.models.quant import WeightFormat

if TYPE_CHECKING:
    from blitzplan.models.shapes import MlaDims
    from blitzplan.models.spec import ModelSpec

__all__ = [
    "NORM_BIASES",
    "SANDWICH_NORMS",
    "LayerBytes",
    "Linear",
    "Vector",
    "layer_bytes",
    "layer_modules",
    "layer_params",
]

_ATTENTION_FAMILIES = ("q", "k", "v", "o", "kv")
SANDWICH_NORMS = ("gemma2",)
"""Model types with norms before and after the MLP too (four per layer)."""
NORM_BIASES = ("phimoe",)
"""Model types whose norms are LayerNorms with a bias (the final norm too)."""
_EXPERT = "{e}"  # stands for the expert index in a routed expert's module name
_FLOAT32_BYTES = 4


@dataclass(frozen=True)
class Linear:
    """A projection ``in_features -> out_features`` (``copies`` of it for routed experts)."""

    name: str  # inside the layer, e.g. "self_attn.q_proj"; "{e}" marks the expert index
    family: str  # the LayerBytes field its weight counts in
    in_features: int
    out_features: int
    split: str = "replicated"  # "column" | "row" | "replicated"
    parts: int = 1  # indivisible pieces of the split dimension
    copies: int = 1
    bias: bool = False
    quantizable: bool = True  # MoE routers and gates stay in the model dtype

    def names(self) -> list[str]:
        if _EXPERT not in self.name:
            return [self.name]
        return [self.name.replace(_EXPERT, str(e)) for e in range(self.copies)]

    def shard_shape(self, tp: int) -> tuple[int, int]:
        """(in, out) features on one GPU of a ``tp``-way instance."""
        pieces = max(1, self.parts // tp)
        if self.split == "column":
            return self.in_features, self.out_features // self.parts * pieces
        if self.split == "row":
            return self.in_features // self.parts * pieces, self.out_features
        return self.in_features, self.out_features


@dataclass(frozen=True)
class Vector:
    """A one-dimensional weight: a norm, or a router's score bias."""

    name: str
    family: str
    size: int
    element_bytes: int = 0  # 0: the model dtype


@dataclass(frozen=True)
class LayerBytes:
    """Bytes of one decoder layer by tensor family (quantized weights with their scales).

    ``q``/``k``/``v``/``o`` are the attention projections; for multi-head latent attention ``q``
    holds ``q_a_proj`` and ``q_b_proj`` (or ``q_proj``), ``kv`` holds ``kv_a_proj_with_mqa`` and
    ``kv_b_proj``, and ``k`` and ``v`` are 0. ``mlp`` is the dense MLP or all routed experts,
    ``shared_mlp`` the shared experts, ``router`` the router (and Qwen2-MoE's shared-expert gate,
    DeepSeek-V3's score bias), ``norms`` every norm weight.
    """

    q: int
    k: int
    v: int
    o: int
    attention_bias: int
    mlp: int
    router: int
    norms: int
    kv: int = 0
    shared_mlp: int = 0

    @property
    def attention(self) -> int:
        return self.q + self.k + self.v + self.o + self.kv + self.attention_bias

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.shared_mlp + self.router + self.norms


# --- inventories -----------------------------------------------------------------------------


def _gqa(spec: ModelSpec) -> list[Linear | Vector]:
    h, hd, heads, kv = spec.hidden_size, spec.head_dim, spec.num_attention_heads, spec.num_kv_heads
    modules: list[Linear | Vector] = [
        Linear("self_attn.q_proj", "q", h, heads * hd, "column", heads, bias=spec.qkv_bias),
        Linear("self_attn.k_proj", "k", h, kv * hd, "column", kv, bias=spec.qkv_bias),
        Linear("self_attn.v_proj", "v", h, kv * hd, "column", kv, bias=spec.qkv_bias),
        Linear("self_attn.o_proj", "o", heads * hd, h, "row", heads, bias=spec.o_bias),
    ]
    if spec.qk_norm:
        modules += [
            Vector("self_attn.q_norm", "norms", hd),
            Vector("self_attn.k_norm", "norms", hd),
        ]
    return modules


def _mla(spec: ModelSpec, mla: MlaDims) -> list[Linear | Vector]:
    h, heads = spec.hidden_size, spec.num_attention_heads
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank:
        query: list[Linear | Vector] = [
            Linear("self_attn.q_a_proj", "q", h, mla.q_lora_rank),
            Vector("self_attn.q_a_layernorm", "norms", mla.q_lora_rank),
            Linear("self_attn.q_b_proj", "q", mla.q_lora_rank, heads * qk, "column", heads),
        ]
    else:
        query = [Linear("self_attn.q_proj", "q", h, heads * qk, "column", heads)]
    up = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    return [
        *query,
        Linear("self_attn.kv_a_proj_with_mqa", "kv", h, mla.kv_lora_rank + mla.qk_rope_head_dim),
        Vector("self_attn.kv_a_layernorm", "norms", mla.kv_lora_rank),
        Linear("self_attn.kv_b_proj", "kv", mla.kv_lora_rank, up, "column", heads),
        Linear("self_attn.o_proj", "o", heads * mla.v_head_dim, h, "row", heads),
    ]


def _swiglu(
    prefix: str,
    family: str,
    h: int,
    inter: int,
    *,
    copies: int = 1,
    bias: bool = False,
    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
) -> list[Linear]:
    gate, up, down = (f"{prefix}{name}" for name in names)
    return [
        Linear(gate, family, h, inter, "column", inter, copies, bias),
        Linear(up, family, h, inter, "column", inter, copies, bias),
        Linear(down, family, inter, h, "row", inter, copies, bias),
    ]


def _moe(spec: ModelSpec) -> list[Linear | Vector]:
    h, experts, moe = spec.hidden_size, spec.num_experts, spec.moe
    if spec.model_type in ("mixtral", "phimoe"):
        return [
            Linear("block_sparse_moe.gate", "router", h, experts, quantizable=False),
            *_swiglu(
                "block_sparse_moe.experts.{e}.",
                "mlp",
                h,
                spec.intermediate_size,
                copies=experts,
                names=("w1", "w3", "w2"),
            ),
        ]
    modules: list[Linear | Vector] = [
        Linear("mlp.gate", "router", h, experts, quantizable=False),
        *_swiglu("mlp.experts.{e}.", "mlp", h, spec.intermediate_size, copies=experts),
    ]
    if moe.router_bias:
        modules.append(
            Vector("mlp.gate.e_score_correction_bias", "router", experts, _FLOAT32_BYTES)
        )
    if moe.shared_intermediate_size:
        shared = "mlp.shared_expert." if spec.model_type == "qwen2_moe" else "mlp.shared_experts."
        modules += _swiglu(shared, "shared_mlp", h, moe.shared_intermediate_size)
    if moe.shared_expert_gate:
        modules.append(Linear("mlp.shared_expert_gate", "router", h, 1, quantizable=False))
    return modules


def layer_modules(spec: ModelSpec, index: int) -> tuple[Linear | Vector, ...]:
    """Every tensor of decoder layer ``index`` (0-based), as the checkpoint names it."""
    h = spec.hidden_size
    attention = _gqa(spec) if spec.mla is None else _mla(spec, spec.mla)
    if spec.is_moe_layer(index):
        mlp = _moe(spec)
    else:
        inter = spec.moe.dense_intermediate_size or spec.intermediate_size
        mlp = list(_swiglu("mlp.", "mlp", h, inter, bias=spec.mlp_bias))
    names = ["input_layernorm", "post_attention_layernorm"]
    if spec.model_type in SANDWICH_NORMS:
        names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    norms = [Vector(name, "norms", h) for name in names]
    if spec.model_type in NORM_BIASES:
        norms += [Vector(f"{name}.bias", "norms", h) for name in names]
    return (*attention, *mlp, *norms)


# --- bytes and parameters --------------------------------------------------------------------


def formats(spec: ModelSpec, linear: Linear, index: int) -> list[tuple[WeightFormat | None, int]]:
    """(format or None for the model dtype, copies) of a linear in layer ``index``."""
    quant = spec.quantization
    if quant is None or not linear.quantizable:
        return [(None, linear.copies)]
    if quant.uniform:
        return [(quant.groups[0][1], linear.copies)]
    prefix = f"model.layers.{index}."
    found = Counter(quant.format_for(prefix + name, in_layer=name) for name in linear.names())
    return list(found.items())


def _linear_bytes(spec: ModelSpec, linear: Linear, index: int, tp: int) -> tuple[int, int]:
    """(weight bytes, bias bytes) of ``linear`` on one GPU of a ``tp``-way instance."""
    k, n = linear.shard_shape(tp)
    weight = sum(
        copies * (fmt.weight_bytes(k, n) if fmt else spec.dtype_bytes * k * n)
        for fmt, copies in formats(spec, linear, index)
    )
    bias_features = n if linear.split == "column" else linear.out_features
    bias = spec.dtype_bytes * bias_features * linear.copies if linear.bias else 0
    return weight, bias


def layer_bytes(spec: ModelSpec, index: int, *, tp: int = 1) -> LayerBytes:
    """Bytes of decoder layer ``index`` by family, whole (``tp=1``) or on one TP GPU."""
    by_family: Counter[str] = Counter()
    for module in layer_modules(spec, index):
        if isinstance(module, Vector):
            by_family[module.family] += (module.element_bytes or spec.dtype_bytes) * module.size
            continue
        weight, bias = _linear_bytes(spec, module, index, tp)
        by_family[module.family] += weight
        in_attention = module.family in _ATTENTION_FAMILIES
        by_family["attention_bias" if in_attention else module.family] += bias
    return LayerBytes(**{name: by_family[name] for name in LayerBytes.__dataclass_fields__})


def layer_params(spec: ModelSpec, index: int) -> tuple[int, int]:
    """(parameters, parameters one token touches) of decoder layer ``index``."""
    total = active = 0
    for module in layer_modules(spec, index):
        if isinstance(module, Vector):
            total, active = total + module.size, active + module.size
            continue
        one = module.in_features * module.out_features + (module.out_features if module.bias else 0)
        total += one * module.copies
        active += one * (spec.experts_per_token if module.copies > 1 else 1)
    return total, active
