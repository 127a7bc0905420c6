"""A small Llama-style decoder in plain torch, as functions over dicts of weights.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, shaped by a
:class:`~blitzplan.models.ModelSpec`. The model is cut into the units every planner speaks of:
unit 0 the embedding, units ``1..L`` the decoder layers, unit ``L + 1`` the final norm and the
lm_head. A unit's weights are a ``dict`` from name to tensor; :func:`unit_layout` fixes their
names (as in Hugging Face Llama checkpoints), shapes and order, so a unit flattens to exactly
``spec.unit_bytes()[unit]`` bytes (:func:`flatten_unit`); :func:`unit_from_buffer` reads a
unit back from its TP1 rank buffer of :func:`blitzplan.layout`.
Prefill only: a request's tokens run through every layer and the head returns the logits of its
last position (the next-token distribution).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, config_dtype
from blitzplan.models.layout import layout

Weights = dict[str, torch.Tensor]
"""One unit's tensors by name."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""The ``torch_dtype`` values the executor runs (float32 for bit-exact comparisons)."""

DEFAULT_ROPE_THETA = 10_000.0
DEFAULT_RMS_NORM_EPS = 1e-5
INIT_STD = 0.02
"""Standard deviation of the seeded projection and embedding weights (as Llama's init)."""


@dataclass(frozen=True)
class Dims:
    """The sizes the forward pass needs, read once from a ModelSpec."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layers: int
    rms_norm_eps: float
    rope_theta: float
    dtype: torch.dtype

    @property
    def num_units(self) -> int:
        return self.layers + 2


def model_dims(spec: ModelSpec) -> Dims:
    """The executor's view of ``spec``; raises InvalidInputError for what it does not run."""
    unsupported = [
        name
        for name, flag in (
            ("qkv_bias", spec.qkv_bias),
            ("o_bias", spec.o_bias),
            ("mlp_bias", spec.mlp_bias),
            ("tie_word_embeddings", spec.tie_word_embeddings),
            ("num_experts > 1", spec.num_experts > 1),
            ("multi-head latent attention", spec.mla is not None),
            ("qk norms", spec.qk_norm),
            ("quantization", spec.quantization is not None),
            ("a vision tower", spec.vision is not None),
        )
        if flag
    ]
    if unsupported:
        raise InvalidInputError(
            f"model {spec.name!r} uses {', '.join(unsupported)}; the executor runs dense Llama "
            "layers without biases and with an untied lm_head"
        )
    found = config_dtype(spec.config)
    dtype_name = found[1] if found else "float32"
    if dtype_name not in DTYPES:
        raise InvalidInputError(
            f"torch_dtype must be one of {', '.join(DTYPES)} for the executor, got {dtype_name!r}"
        )
    dtype = DTYPES[dtype_name]
    if dtype.itemsize != spec.dtype_bytes:
        raise InvalidInputError(
            f"dtype_bytes={spec.dtype_bytes} does not match torch_dtype {dtype_name!r}"
        )
    return Dims(
        hidden=spec.hidden_size,
        intermediate=spec.intermediate_size,
        heads=spec.num_attention_heads,
        kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        vocab=spec.vocab_size,
        layers=spec.num_layers,
        rms_norm_eps=float(spec.config.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS)),
        rope_theta=float(spec.config.get("rope_theta", DEFAULT_ROPE_THETA)),
        dtype=dtype,
    )


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
        "rms_norm_eps": DEFAULT_RMS_NORM_EPS,
        "rope_theta": DEFAULT_ROPE_THETA,
        "tie_word_embeddings": False,
        "torch_dtype": torch_dtype,
    }


def unit_layout(dims: Dims, unit: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Names and shapes of one unit's tensors, in their flattened order."""
    h, q_out, kv_out = dims.hidden, dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    if unit == 0:
        return (("embed_tokens.weight", (dims.vocab, h)),)
    if unit == dims.layers + 1:
        return (("norm.weight", (h,)), ("lm_head.weight", (dims.vocab, h)))
    if not 0 < unit <= dims.layers:
        raise InvalidInputError(f"unit must be in 0..{dims.layers + 1}, got {unit!r}")
    inter = dims.intermediate
    return (
        ("input_layernorm.weight", (h,)),
        ("self_attn.q_proj.weight", (q_out, h)),
        ("self_attn.k_proj.weight", (kv_out, h)),
        ("self_attn.v_proj.weight", (kv_out, h)),
        ("self_attn.o_proj.weight", (h, q_out)),
        ("post_attention_layernorm.weight", (h,)),
        ("mlp.gate_proj.weight", (inter, h)),
        ("mlp.up_proj.weight", (inter, h)),
        ("mlp.down_proj.weight", (h, inter)),
    )


def init_unit(dims: Dims, unit: int, *, seed: int) -> Weights:
    """Seeded weights of one unit: normal(0, INIT_STD) projections, norms near 1.

    The generator is seeded from ``(seed, unit)``, so any unit can be made alone, in any order.
    """
    generator = torch.Generator().manual_seed(seed * 1_000_003 + unit)
    weights: Weights = {}
    for name, shape in unit_layout(dims, unit):
        if len(shape) == 1:
            values = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        else:
            values = INIT_STD * torch.randn(shape, generator=generator)
        weights[name] = values.to(dims.dtype)
    return weights


def flatten_unit(dims: Dims, unit: int, weights: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The unit's tensors as one contiguous uint8 tensor, in :func:`unit_layout` order."""
    parts = []
    for name, shape in unit_layout(dims, unit):
        tensor = weights[name]
        if tuple(tensor.shape) != shape or tensor.dtype != dims.dtype:
            raise InvalidInputError(
                f"unit {unit} tensor {name!r} has shape {tuple(tensor.shape)} and dtype "
                f"{tensor.dtype}, expected {shape} and {dims.dtype}"
            )
        parts.append(tensor.detach().contiguous().reshape(-1).view(torch.uint8))
    return torch.cat(parts)


def unit_from_buffer(
    spec: ModelSpec, unit: int, buffer: torch.Tensor, *, device: torch.device
) -> Weights:
    """Fresh tensors (on ``device``) of ``unit`` from its TP1 rank buffer
    (:meth:`blitzplan.models.layout.Layout.unpack`), named as :func:`unit_layout` names them.

    Copies, not views: every process computes on freshly allocated memory, which keeps results
    bit-identical across processes."""
    dims = model_dims(spec)
    shards = layout(spec, 1).unpack(unit, 0, buffer.cpu().numpy())
    prefix = f"model.layers.{unit - 1}." if 0 < unit <= dims.layers else "model."
    weights: Weights = {}
    for name, shape in unit_layout(dims, unit):
        full = name if name.startswith("lm_head") else prefix + name
        raw = torch.from_numpy(np.ascontiguousarray(shards[full]))
        weights[name] = raw.view(dims.dtype).reshape(shape).to(device=device, copy=True)
    return weights


@dataclass(frozen=True)
class Rope:
    """Cosine and sine tables of the rotary embedding, one row per position."""

    cos: torch.Tensor
    sin: torch.Tensor


def rope_tables(dims: Dims, *, max_positions: int, device: torch.device | None = None) -> Rope:
    """Rotary tables for positions ``0..max_positions - 1`` (float32, as Llama computes them)."""
    half = torch.arange(0, dims.head_dim, 2, dtype=torch.float32) / dims.head_dim
    inverse = 1.0 / (dims.rope_theta**half)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inverse)
    both = torch.cat([angles, angles], dim=-1)
    return Rope(both.cos().to(device), both.sin().to(device))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply the rotary embedding to ``x`` of shape (heads, tokens, head_dim)."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def embed(weights: Mapping[str, torch.Tensor], token_ids: torch.Tensor) -> torch.Tensor:
    """Hidden states (tokens, hidden) of a request's token ids."""
    return F.embedding(token_ids, weights["embed_tokens.weight"])


def _attention(
    dims: Dims, weights: Mapping[str, torch.Tensor], x: torch.Tensor, rope: Rope
) -> torch.Tensor:
    tokens = x.shape[0]
    q = F.linear(x, weights["self_attn.q_proj.weight"]).view(tokens, dims.heads, dims.head_dim)
    k = F.linear(x, weights["self_attn.k_proj.weight"]).view(tokens, dims.kv_heads, dims.head_dim)
    v = F.linear(x, weights["self_attn.v_proj.weight"]).view(tokens, dims.kv_heads, dims.head_dim)
    cos, sin = rope.cos[:tokens], rope.sin[:tokens]
    q = _rotate(q.transpose(0, 1), cos, sin)
    k = _rotate(k.transpose(0, 1), cos, sin)
    group = dims.heads // dims.kv_heads
    k = k.repeat_interleave(group, dim=0)
    v = v.transpose(0, 1).repeat_interleave(group, dim=0)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.linear(out.transpose(0, 1).reshape(tokens, -1), weights["self_attn.o_proj.weight"])


def _mlp(weights: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    gate = F.silu(F.linear(x, weights["mlp.gate_proj.weight"]))
    up = F.linear(x, weights["mlp.up_proj.weight"])
    return F.linear(gate * up, weights["mlp.down_proj.weight"])


def decoder_layer(
    dims: Dims, weights: Mapping[str, torch.Tensor], hidden: torch.Tensor, rope: Rope
) -> torch.Tensor:
    """One pre-norm decoder layer over a request's hidden states (tokens, hidden)."""
    eps = dims.rms_norm_eps
    hidden = hidden + _attention(
        dims, weights, _rms_norm(hidden, weights["input_layernorm.weight"], eps), rope
    )
    return hidden + _mlp(
        weights, _rms_norm(hidden, weights["post_attention_layernorm.weight"], eps)
    )


def final_logits(
    dims: Dims, weights: Mapping[str, torch.Tensor], hidden: torch.Tensor
) -> torch.Tensor:
    """Logits (vocab,) of the request's last position: final norm, then the lm_head."""
    last = _rms_norm(hidden[-1:], weights["norm.weight"], dims.rms_norm_eps)
    return F.linear(last, weights["lm_head.weight"])[0]


def forward(
    dims: Dims, units: Sequence[Mapping[str, torch.Tensor]], token_ids: torch.Tensor, rope: Rope
) -> torch.Tensor:
    """The monolithic model: embedding, every layer, the head; logits of the last position."""
    if len(units) != dims.num_units:
        raise InvalidInputError(f"forward needs {dims.num_units} units, got {len(units)}")
    hidden = embed(units[0], token_ids)
    for layer in range(1, dims.layers + 1):
        hidden = decoder_layer(dims, units[layer], hidden, rope)
    return final_logits(dims, units[-1], hidden)
