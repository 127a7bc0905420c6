"""A small Llama-style decoder in plain torch, as functions over dicts of weights, prefill only.

RMSNorm, rotary position embeddings, grouped-query attention and a SwiGLU MLP, shaped by a
:class:`~blitzplan.models.ModelSpec` and cut into the planner's units (0 the embedding, ``1..L``
the layers, ``L + 1`` the final norm and the lm_head), each keyed by :func:`short_name`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, config_dtype
from blitzplan.models.layout import layout

Weights = dict[str, torch.Tensor]
"""One unit's tensors by short name."""
Rope = tuple[torch.Tensor, torch.Tensor]
"""Cosine and sine tables of the rotary embedding, one row per position."""
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The ``torch_dtype`` values the executor runs (float32 for bit-exact comparisons)."""
INIT_STD = 0.02
"""Standard deviation of the seeded projection and embedding weights (as Llama's init)."""
SEED = 0
"""The seed of the weights the executor moves and computes with: every process makes the units
it needs alike, from the document's model (no weights file is read)."""
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Dims:
    """The sizes the forward pass needs, read once from a ModelSpec by :func:`model_dims`."""

    spec: ModelSpec
    hidden: int
    layers: int
    rms_norm_eps: float
    rope_theta: float
    dtype: torch.dtype


def model_dims(spec: ModelSpec) -> Dims:
    """The executor's view of ``spec``; raises InvalidInputError for what it does not run."""
    flags = ("qkv_bias", "o_bias", "mlp_bias", "qk_norm", "tie_word_embeddings")
    parts = {
        "num_experts > 1": spec.num_experts > 1,
        "multi-head latent attention": spec.mla is not None,
        "quantization": spec.quantization is not None,
        "a vision tower": spec.vision is not None,
    }
    unsupported = [name for name in flags if getattr(spec, name)]
    unsupported += [name for name, used in parts.items() if used]
    if unsupported:
        raise InvalidInputError(
            f"model {spec.name!r} uses {', '.join(unsupported)}; the executor runs dense Llama "
            "layers without biases and with an untied lm_head"
        )
    found = config_dtype(spec.config)
    name = found[1] if found else "float32"
    if name not in DTYPES or DTYPES[name].itemsize != spec.dtype_bytes:
        raise InvalidInputError(
            f"torch_dtype must be one of {', '.join(DTYPES)} for the executor (of "
            f"dtype_bytes={spec.dtype_bytes}), got {name!r}"
        )
    return Dims(
        spec=spec,
        hidden=spec.hidden_size,
        layers=spec.num_layers,
        rms_norm_eps=float(spec.config.get("rms_norm_eps", 1e-5)),
        rope_theta=float(spec.config.get("rope_theta", 10_000.0)),
        dtype=DTYPES[name],
    )


def short_name(name: str) -> str:
    """``model.layers.3.mlp.up_proj.weight`` -> ``mlp.up_proj.weight``."""
    return re.sub(r"^model\.(layers\.\d+\.)?", "", name)


def init_unit(
    dims: Dims, unit: int, *, seed: int = SEED, device: torch.device | str = "cpu"
) -> Weights:
    """Seeded weights of one unit (on ``device``): normal(0, INIT_STD) matrices, norms near 1.
    The generator is seeded from ``(seed, unit)``, so any unit can be made alone, in any order."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + unit)
    weights: Weights = {}
    for tensor in layout(dims.spec, 1).units[unit].tensors:
        noise = torch.randn(tensor.shape, generator=generator)
        values = 1.0 + 0.1 * noise if len(tensor.shape) == 1 else INIT_STD * noise
        weights[short_name(tensor.name)] = values.to(dims.dtype).to(device)
    return weights


def hf_arrays(dims: Dims, unit: int, weights: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """A unit's tensors under their Hugging Face names as numpy integers of the element width
    (what :meth:`~blitzplan.models.layout.Layout.rank_buffer` packs: it moves bytes)."""
    out = {}
    for tensor in layout(dims.spec, 1).units[unit].tensors:
        value = weights[short_name(tensor.name)].detach().cpu().contiguous()
        out[tensor.name] = value.view(_INT_OF_WIDTH[value.element_size()]).numpy()
    return out


def unit_from_buffer(dims: Dims, unit: int, buffer: torch.Tensor, device: torch.device) -> Weights:
    """Fresh tensors (on ``device``) of ``unit`` from its TP1 rank buffer. Copies, not views:
    every process computes on freshly allocated memory, which keeps results bit-identical."""
    shards = layout(dims.spec, 1).unpack(unit, 0, buffer.cpu().numpy())
    return {
        short_name(t.name): torch.from_numpy(np.ascontiguousarray(shards[t.name]))
        .view(dims.dtype)
        .reshape(t.shape)
        .to(device=device, copy=True)
        for t in layout(dims.spec, 1).units[unit].tensors
    }


def rope_tables(dims: Dims, *, max_positions: int, device: torch.device | None = None) -> Rope:
    """Rotary tables for positions ``0..max_positions - 1`` (float32, as Llama computes them)."""
    head_dim = dims.spec.head_dim
    half = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    inverse = 1.0 / (dims.rope_theta**half)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inverse)
    both = torch.cat([angles, angles], dim=-1)
    return both.cos().to(device), both.sin().to(device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply the rotary embedding to ``x`` of shape (heads, tokens, head_dim)."""
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def embed(weights: Mapping[str, torch.Tensor], token_ids: torch.Tensor) -> torch.Tensor:
    """Hidden states (tokens, hidden) of a request's token ids."""
    return F.embedding(token_ids, weights["embed_tokens.weight"])


def _attention(dims: Dims, w: Mapping[str, torch.Tensor], x: torch.Tensor, rope: Rope) -> Any:
    spec, tokens = dims.spec, x.shape[0]
    q, k, v = (
        F.linear(x, w[f"self_attn.{p}_proj.weight"]).view(tokens, -1, spec.head_dim).transpose(0, 1)
        for p in "qkv"
    )
    cos, sin = rope[0][:tokens], rope[1][:tokens]
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.linear(out.transpose(0, 1).reshape(tokens, -1), w["self_attn.o_proj.weight"])


def decoder_layer(
    dims: Dims, w: Mapping[str, torch.Tensor], hidden: torch.Tensor, rope: Rope
) -> torch.Tensor:
    """One pre-norm decoder layer over a request's hidden states (tokens, hidden)."""
    shape, eps = (dims.hidden,), dims.rms_norm_eps
    x = F.rms_norm(hidden, shape, w["input_layernorm.weight"], eps)
    hidden = hidden + _attention(dims, w, x, rope)
    x = F.rms_norm(hidden, shape, w["post_attention_layernorm.weight"], eps)
    gate = F.silu(F.linear(x, w["mlp.gate_proj.weight"])) * F.linear(x, w["mlp.up_proj.weight"])
    return hidden + F.linear(gate, w["mlp.down_proj.weight"])


def final_logits(dims: Dims, w: Mapping[str, torch.Tensor], hidden: torch.Tensor) -> torch.Tensor:
    """Logits (vocab,) of the request's last position: final norm, then the lm_head."""
    last = F.rms_norm(hidden[-1:], (dims.hidden,), w["norm.weight"], dims.rms_norm_eps)
    return F.linear(last, w["lm_head.weight"])[0]


def forward(
    dims: Dims,
    units: Sequence[Mapping[str, torch.Tensor]],
    token_ids: torch.Tensor,
    rope: Rope,
    *,
    first: int = 1,
    hidden: torch.Tensor | None = None,
) -> torch.Tensor:
    """The monolithic model: embedding, every layer, the head; logits of the last position.
    With ``hidden`` (the activation before layer ``first``), the layers from ``first`` on."""
    if hidden is None:
        hidden = embed(units[0], token_ids)
    for layer in range(first, dims.layers + 1):
        hidden = decoder_layer(dims, units[layer], hidden, rope)
    return final_logits(dims, units[-1], hidden)
