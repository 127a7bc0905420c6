"""Reading a Hugging Face ``config.json`` into :class:`~blitzplan.models.ModelSpec` fields.

Model types sized (``model_type``): ``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma2``
(dense; Gemma-2 with four norms per layer and tied embeddings by default); ``mixtral``,
``phimoe`` (Phi-3.5-MoE: LayerNorms with biases, attention and head biases), ``qwen2_moe``,
``qwen3_moe`` (routed experts, Qwen2-MoE with a gated shared expert);
``deepseek_v2``, ``deepseek_v3`` (multi-head latent attention, shared experts, dense first
layers); and the ``mistral3`` vision-language wrapper (language model in ``text_config``, Pixtral
vision tower in ``vision_config``). A config without ``model_type`` is read as Llama. Any other
type is refused: its layers may hold tensors these layouts lack, and a silent guess would be wrong.

The dtype comes from ``dtype`` (written by transformers >= 4.56) or ``torch_dtype`` (older). When
both are present and differ, ``dtype`` wins, as in transformers >= 4.56, where ``torch_dtype`` is a
deprecated alias read only when ``dtype`` is absent. A wrapper's top-level dtype (the checkpoint
as saved) wins over its ``text_config``'s. A config with neither is refused unless the caller
says ``dtype_bytes``: guessing bfloat16 would size a float32 checkpoint at half its bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blitzplan._checks import is_integer
from blitzplan.errors import InvalidInputError
from blitzplan.models.quant_parse import parse_quantization
from blitzplan.models.vision import mistral3_vision

__all__ = ["DTYPE_BYTES", "KNOWN_MODEL_TYPES", "config_dtype", "spec_fields"]

DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "int8": 1,
}
"""Bytes per parameter for the ``dtype`` / ``torch_dtype`` names a config.json may carry."""

_DENSE, _MOE, _MLA = "dense", "moe", "mla"
KNOWN_MODEL_TYPES: dict[str, str] = {
    "llama": _DENSE,
    "mistral": _DENSE,
    "qwen2": _DENSE,
    "qwen3": _DENSE,
    "gemma2": _DENSE,
    "mixtral": _MOE,
    "phimoe": _MOE,
    "qwen2_moe": _MOE,
    "qwen3_moe": _MOE,
    "deepseek_v2": _MLA,
    "deepseek_v3": _MLA,
}
"""The decoder layouts blitzplan sizes, by ``model_type``."""

_TIED_BY_DEFAULT = ("gemma2",)
"""Model types whose transformers config ties the head to the embedding unless it says not."""

_REQUIRED_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)
_WRAPPER = "mistral3"


def int_field(
    config: Mapping[str, Any], *keys: str, default: int | None = None, where: str = ""
) -> int:
    """The first of ``keys`` present (not null) in ``config`` as an int, else ``default``."""
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if not is_integer(value):
            raise InvalidInputError(
                f"config.json field {where + key!r} must be an integer, got {value!r}"
            )
        return int(value)
    if default is None:
        raise InvalidInputError(f"config.json is missing required field {where + keys[0]!r}")
    return default


def config_dtype(config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(key, dtype name) of a config's dtype, ``dtype`` before ``torch_dtype``; None if neither."""
    for key in ("dtype", "torch_dtype"):
        if config.get(key) is not None:
            return key, str(config[key]).removeprefix("torch.")
    return None


def _dtype_bytes(config: Mapping[str, Any], text: Mapping[str, Any]) -> int:
    found = config_dtype(config) or config_dtype(text)
    if found is None:
        raise InvalidInputError(
            "config.json names no dtype (neither 'dtype' nor 'torch_dtype'): the bytes per "
            "parameter are unknown; add the key, or pass dtype_bytes (2 for bfloat16 or "
            "float16) to ModelSpec.from_config / load_model"
        )
    key, name = found
    if name not in DTYPE_BYTES:
        raise InvalidInputError(
            f"config.json field {key!r} has unknown value {name!r}; "
            f"known: {', '.join(sorted(DTYPE_BYTES))}"
        )
    return DTYPE_BYTES[name]


def _unwrap(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """The language model's config and the prefix its fields are named with in messages."""
    if "text_config" not in config and "vision_config" not in config:
        return config, ""
    model_type = config.get("model_type")
    text = config.get("text_config")
    if model_type != _WRAPPER or not isinstance(text, Mapping):
        raise InvalidInputError(
            f"config.json of model_type {model_type!r} is a vision-language wrapper: its language "
            "model is in 'text_config' and its vision tower in 'vision_config'. blitzplan sizes "
            f"the vision tower only for model_type {_WRAPPER!r} (Pixtral); to plan the language "
            "model alone pass config['text_config'] (its bytes then leave out the vision tower "
            "and projector; give dtype_bytes when the dtype is only at the top level)"
        )
    if config.get("quantization_config") is not None:
        raise InvalidInputError(
            "config.json of a quantized vision-language model is not sized: which vision-tower "
            "and projector modules stay unquantized is not in its config; pass "
            "config['text_config'] with the quantization_config to size the language model alone"
        )
    return text, "text_config."


def _model_type(text: Mapping[str, Any], where: str) -> str:
    model_type = str(text.get("model_type") or "llama")
    if model_type not in KNOWN_MODEL_TYPES:
        raise InvalidInputError(
            f"config.json field {where + 'model_type'!r} is {model_type!r}, which blitzplan does "
            f"not size; known: {', '.join(sorted(KNOWN_MODEL_TYPES))}"
        )
    return model_type


def _mla_fields(text: Mapping[str, Any], where: str) -> dict[str, int]:
    if text.get("attention_bias"):
        raise InvalidInputError(
            f"config.json field {where + 'attention_bias'!r}: biased MLA is not sized"
        )
    keys = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    fields = {key: int_field(text, key, where=where) for key in keys}
    return {"q_lora_rank": int_field(text, "q_lora_rank", default=0, where=where), **fields}


def _dense_layers(text: Mapping[str, Any], model_type: str, layers: int) -> tuple[int, ...]:
    """0-based indices of the layers of a MoE model that have a dense MLP."""
    if model_type.startswith("deepseek"):
        first_moe = int_field(text, "first_k_dense_replace", default=0)
        every = int_field(text, "moe_layer_freq", default=1)
        return tuple(i for i in range(layers) if i < first_moe or i % every)
    if model_type.startswith("qwen"):
        step = int_field(text, "decoder_sparse_step", default=1)
        only = text.get("mlp_only_layers") or []
        return tuple(i for i in range(layers) if i in only or (i + 1) % step)
    return ()


def _moe_fields(text: Mapping[str, Any], model_type: str, where: str) -> dict[str, Any]:
    experts = int_field(
        text, "num_local_experts", "num_experts", "n_routed_experts", default=1, where=where
    )
    if "shared_expert_intermediate_size" in text and model_type != "qwen2_moe":
        raise InvalidInputError(
            f"config.json field {where + 'shared_expert_intermediate_size'!r} (a gated shared "
            f"expert) is sized for model_type 'qwen2_moe' only, not {model_type!r}"
        )
    if experts == 1:
        return {
            "num_experts": 1,
            "experts_per_token": int_field(text, "num_experts_per_tok", default=1),
        }
    layers = int_field(text, "num_hidden_layers", where=where)
    dense = _dense_layers(text, model_type, layers)
    moe_inter = int_field(text, "moe_intermediate_size", "intermediate_size", where=where)
    shared = int_field(text, "shared_expert_intermediate_size", default=0, where=where)
    if model_type.startswith("deepseek"):
        shared = int_field(text, "n_shared_experts", default=0, where=where) * moe_inter
    return {
        "num_experts": experts,
        "experts_per_token": int_field(text, "num_experts_per_tok", default=1, where=where),
        "intermediate_size": moe_inter,
        "moe": {
            "dense_layers": dense,
            "dense_intermediate_size": int_field(text, "intermediate_size", where=where)
            if dense
            else 0,
            "shared_intermediate_size": shared,
            "shared_expert_gate": model_type == "qwen2_moe" and shared > 0,
            "router_bias": model_type == "deepseek_v3" and text.get("topk_method") == "noaux_tc",
        },
    }


def spec_fields(config: Mapping[str, Any], *, dtype_bytes: int | None = None) -> dict[str, Any]:
    """Keyword arguments for ModelSpec (all but name, revision, config and weights_hash).

    ``"moe"`` and ``"mla"`` come as plain dicts (or None) for the caller to wrap.
    """
    text, where = _unwrap(config)
    missing = [key for key in _REQUIRED_FIELDS if key not in text]
    if missing:
        place = "field 'text_config' is" if where else "is"
        raise InvalidInputError(
            f"config.json {place} missing required field(s): {', '.join(missing)}"
        )
    model_type = _model_type(text, where)
    heads = int_field(text, "num_attention_heads", where=where)
    hidden = int_field(text, "hidden_size", where=where)
    width = dtype_bytes if dtype_bytes is not None else _dtype_bytes(config, text)
    qwen2 = model_type.startswith("qwen2")
    attention_bias = bool(text.get("attention_bias", False))
    mla = _mla_fields(text, where) if KNOWN_MODEL_TYPES[model_type] == _MLA else None
    fields: dict[str, Any] = {
        "hidden_size": hidden,
        "intermediate_size": int_field(text, "intermediate_size", where=where),
        "num_layers": int_field(text, "num_hidden_layers", where=where),
        "num_attention_heads": heads,
        "num_kv_heads": heads
        if mla
        else int_field(text, "num_key_value_heads", default=heads, where=where),
        "head_dim": (
            mla["qk_nope_head_dim"] + mla["qk_rope_head_dim"]
            if mla
            else int_field(text, "head_dim", default=hidden // heads, where=where)
        ),
        "vocab_size": int_field(text, "vocab_size", where=where),
        "tie_word_embeddings": bool(
            text.get("tie_word_embeddings", model_type in _TIED_BY_DEFAULT)
        ),
        "qkv_bias": bool(text.get("qkv_bias", qwen2 or attention_bias)),
        "o_bias": attention_bias and not qwen2,
        "mlp_bias": bool(text.get("mlp_bias", False)),
        "dtype_bytes": width,
        "model_type": model_type,
        "qk_norm": model_type.startswith("qwen3"),
        "mla": mla,
        "mtp_layers": int_field(text, "num_nextn_predict_layers", default=0)
        if model_type == "deepseek_v3"
        else 0,
        "quantization": parse_quantization(config, dtype_bytes=width),
        "vision": mistral3_vision(config, text_hidden_size=hidden) if where else None,
    }
    return {**fields, **_moe_fields(text, model_type, where)}
