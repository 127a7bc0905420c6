"""Model specs built from Hugging Face ``config.json`` files: how many bytes each layer weighs.

A model is transferred and executed in *units*: unit 0 is the embedding, units ``1..L`` are the
decoder layers and unit ``L + 1`` is the lm_head together with the final norm. Every planner
speaks in these units, and ``sum(spec.unit_bytes()) == spec.total_bytes`` always holds.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

from blitzplan._checks import check_count, is_integer
from blitzplan.errors import InvalidInputError

__all__ = [
    "DTYPE_BYTES",
    "LayerBytes",
    "ModelIdentity",
    "ModelSpec",
    "TensorParallelShard",
    "list_models",
    "load_model",
]

DTYPE_BYTES: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "int8": 1,
}
"""Bytes per parameter for the ``torch_dtype`` names a config.json may carry."""

_REQUIRED_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)
_NORMS_PER_LAYER = 2  # input_layernorm and post_attention_layernorm, one hidden-size vector each
_KV_TENSORS = 2  # one K and one V tensor per layer and token


@dataclass(frozen=True)
class ModelIdentity:
    """What must match for two copies of weights to be interchangeable."""

    name: str
    revision: str
    content_hash: str

    def __str__(self) -> str:
        return f"{self.name}@{self.revision}#{self.content_hash[:12]}"


@dataclass(frozen=True)
class LayerBytes:
    """Bytes of one decoder layer, by tensor family (whole model, before any TP split)."""

    q: int
    k: int
    v: int
    o: int
    attention_bias: int
    mlp: int
    router: int
    norms: int

    @property
    def attention(self) -> int:
        return self.q + self.k + self.v + self.o + self.attention_bias

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.router + self.norms


@dataclass(frozen=True)
class TensorParallelShard:
    """What one GPU of a ``tp``-way tensor-parallel instance holds, per unit, in bytes."""

    tp: int
    unit_bytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.unit_bytes)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture sizes of one decoder-only transformer, from its config.json.

    Build with :func:`load_model` or :meth:`from_config`; the fields mirror the config's keys.
    """

    name: str
    revision: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    num_experts: int = 1
    experts_per_token: int = 1
    dtype_bytes: int = 2
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key in (
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_attention_heads",
            "num_kv_heads",
            "head_dim",
            "vocab_size",
            "num_experts",
            "experts_per_token",
            "dtype_bytes",
        ):
            object.__setattr__(self, key, check_count(key, getattr(self, key)))
        if self.num_attention_heads % self.num_kv_heads:
            raise InvalidInputError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.experts_per_token > self.num_experts:
            raise InvalidInputError(
                f"num_experts_per_tok must be <= num_local_experts, got "
                f"{self.experts_per_token} > {self.num_experts}"
            )

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        name: str | None = None,
        revision: str = "main",
        dtype_bytes: int | None = None,
    ) -> ModelSpec:
        """Build a spec from a Hugging Face config.json dict."""
        if not isinstance(config, Mapping):
            raise InvalidInputError(f"config must be a mapping, got {type(config).__name__}")
        missing = [key for key in _REQUIRED_FIELDS if key not in config]
        if missing:
            raise InvalidInputError(
                f"config.json is missing required field(s): {', '.join(missing)}"
            )
        if "shared_expert_intermediate_size" in config:
            raise InvalidInputError(
                "config.json field 'shared_expert_intermediate_size' (shared MoE experts) is not "
                "supported; only Mixtral-style routed experts are"
            )
        heads = _int_field(config, "num_attention_heads")
        hidden = _int_field(config, "hidden_size")
        model_type = str(config.get("model_type", ""))
        attention_bias = bool(config.get("attention_bias", False))
        qwen_style = model_type.startswith("qwen2")
        return cls(
            name=name or str(config.get("_name_or_path") or model_type or "model"),
            revision=revision,
            hidden_size=hidden,
            intermediate_size=_int_field(config, "moe_intermediate_size", "intermediate_size"),
            num_layers=_int_field(config, "num_hidden_layers"),
            num_attention_heads=heads,
            num_kv_heads=_int_field(config, "num_key_value_heads", default=heads),
            head_dim=_int_field(config, "head_dim", default=hidden // heads),
            vocab_size=_int_field(config, "vocab_size"),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("qkv_bias", qwen_style or attention_bias)),
            o_bias=attention_bias and not qwen_style,
            mlp_bias=bool(config.get("mlp_bias", False)),
            num_experts=_int_field(config, "num_local_experts", "num_experts", default=1),
            experts_per_token=_int_field(config, "num_experts_per_tok", default=1),
            dtype_bytes=dtype_bytes if dtype_bytes is not None else _dtype_bytes(config),
            config=dict(config),
        )

    # --- sizes -------------------------------------------------------------------------------

    @cached_property
    def layer(self) -> LayerBytes:
        """Bytes of one decoder layer by tensor family."""
        b, h = self.dtype_bytes, self.hidden_size
        q_out = self.num_attention_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        bias = (q_out + 2 * kv_out if self.qkv_bias else 0) + (h if self.o_bias else 0)
        expert = 3 * h * self.intermediate_size + (
            2 * self.intermediate_size + h if self.mlp_bias else 0
        )
        return LayerBytes(
            q=b * h * q_out,
            k=b * h * kv_out,
            v=b * h * kv_out,
            o=b * q_out * h,
            attention_bias=b * bias,
            mlp=b * expert * self.num_experts,
            router=b * h * self.num_experts if self.num_experts > 1 else 0,
            norms=b * _NORMS_PER_LAYER * h,
        )

    @property
    def layer_bytes(self) -> int:
        """Bytes of one decoder layer."""
        return self.layer.total

    @property
    def embedding_bytes(self) -> int:
        return self.dtype_bytes * self.vocab_size * self.hidden_size

    @property
    def lm_head_bytes(self) -> int:
        """Bytes of the output projection; 0 when it is tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.embedding_bytes

    @property
    def final_norm_bytes(self) -> int:
        return self.dtype_bytes * self.hidden_size

    @property
    def total_bytes(self) -> int:
        return (
            self.embedding_bytes
            + self.num_layers * self.layer_bytes
            + self.lm_head_bytes
            + self.final_norm_bytes
        )

    @property
    def num_units(self) -> int:
        """Embedding, ``num_layers`` decoder layers, and the head: ``num_layers + 2``."""
        return self.num_layers + 2

    def unit_bytes(self) -> tuple[int, ...]:
        """Bytes per transfer unit: embedding, layers 1..L, lm_head plus final norm."""
        head = self.lm_head_bytes + self.final_norm_bytes
        return (self.embedding_bytes, *([self.layer_bytes] * self.num_layers), head)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers."""
        return _KV_TENSORS * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def activation_bytes_per_token(self) -> int:
        """Bytes of the hidden state handed from one layer to the next, per token."""
        return self.hidden_size * self.dtype_bytes

    @property
    def params_per_layer(self) -> int:
        return self.layer_bytes // self.dtype_bytes

    @property
    def active_params_per_layer(self) -> int:
        """Parameters one token touches in one layer (top-k experts for MoE)."""
        layer = self.layer
        expert = layer.mlp // self.num_experts
        active = layer.attention + layer.router + layer.norms + expert * self.experts_per_token
        return active // self.dtype_bytes

    # --- tensor parallelism ------------------------------------------------------------------

    def shard(self, tp: int) -> TensorParallelShard:
        """Bytes per unit on one GPU of a ``tp``-way tensor-parallel instance (Megatron split).

        q/o and the MLP split by heads and intermediate size, k/v by KV heads (replicated when
        ``tp`` exceeds them), embedding and lm_head by vocabulary (padded up), norms replicated.
        """
        self.check_tp(tp)
        b, h = self.dtype_bytes, self.hidden_size
        q_out = self.num_attention_heads // tp * self.head_dim
        kv_out = max(1, self.num_kv_heads // tp) * self.head_dim
        bias = (q_out + 2 * kv_out if self.qkv_bias else 0) + (h if self.o_bias else 0)
        inter = self.intermediate_size // tp
        expert = 3 * h * inter + (2 * inter + h if self.mlp_bias else 0)
        layer = (
            b * (2 * h * q_out + 2 * h * kv_out + bias + expert * self.num_experts)
            + self.layer.router
            + self.layer.norms
        )
        embedding = b * math.ceil(self.vocab_size / tp) * h
        head = (0 if self.tie_word_embeddings else embedding) + self.final_norm_bytes
        return TensorParallelShard(tp, (embedding, *([layer] * self.num_layers), head))

    def check_tp(self, tp: int) -> None:
        """Raise InvalidInputError unless ``tp`` evenly splits heads and the MLP."""
        tp = check_count("tp", tp)
        kv = self.num_kv_heads
        if (
            self.num_attention_heads % tp
            or self.intermediate_size % tp
            or (kv % tp if tp <= kv else tp % kv)
        ):
            raise InvalidInputError(
                f"tp={tp} must divide num_attention_heads ({self.num_attention_heads}) and "
                f"intermediate_size ({self.intermediate_size}) of {self.name}, and divide or be "
                f"a multiple of num_key_value_heads ({kv})"
            )

    # --- identity ----------------------------------------------------------------------------

    @cached_property
    def identity(self) -> ModelIdentity:
        """Name, revision and a hash of the name, revision, config and every size field.

        Without the weights at hand the hash stands for them: two specs get the same identity
        only when everything that names or shapes the weights agrees.
        """
        shape = {key: getattr(self, key) for key in _SHAPE_FIELDS}
        payload = {"name": self.name, "revision": self.revision, "config": dict(self.config)}
        digest = hashlib.sha256(
            json.dumps({**payload, **shape}, sort_keys=True, default=str).encode()
        ).hexdigest()
        return ModelIdentity(self.name, self.revision, digest)


_SHAPE_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "vocab_size",
    "tie_word_embeddings",
    "qkv_bias",
    "o_bias",
    "mlp_bias",
    "num_experts",
    "experts_per_token",
    "dtype_bytes",
)


def _int_field(config: Mapping[str, Any], *keys: str, default: int | None = None) -> int:
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if not is_integer(value):
            raise InvalidInputError(f"config.json field {key!r} must be an integer, got {value!r}")
        return int(value)
    if default is None:
        raise InvalidInputError(f"config.json is missing required field {keys[0]!r}")
    return default


def _dtype_bytes(config: Mapping[str, Any]) -> int:
    dtype = str(config.get("torch_dtype", "bfloat16")).removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise InvalidInputError(
            f"config.json field 'torch_dtype' has unknown value {dtype!r}; "
            f"known: {', '.join(sorted(DTYPE_BYTES))}"
        )
    return DTYPE_BYTES[dtype]


# --- presets and loading ---------------------------------------------------------------------


def _preset_dir() -> resources.abc.Traversable:
    return resources.files("blitzplan") / "presets"


def list_models() -> list[str]:
    """Names of the preset models :func:`load_model` accepts."""
    return sorted(
        entry.name.removesuffix(".json")
        for entry in _preset_dir().iterdir()
        if entry.name.endswith(".json")
    )


def load_model(
    model: str | Path | Mapping[str, Any],
    *,
    revision: str = "main",
    dtype_bytes: int | None = None,
) -> ModelSpec:
    """A ModelSpec from a preset name, a path to a config.json, or a config dict.

    >>> load_model("llama-3-8b").total_bytes
    16060522496
    """
    if isinstance(model, Mapping):
        return ModelSpec.from_config(model, revision=revision, dtype_bytes=dtype_bytes)
    if isinstance(model, str) and model in list_models():
        preset = json.loads((_preset_dir() / f"{model}.json").read_text())
        return ModelSpec.from_config(
            preset["config"], name=model, revision=revision, dtype_bytes=dtype_bytes
        )
    if isinstance(model, str | Path):
        path = Path(model)
        if path.is_dir():
            path = path / "config.json"
        if path.is_file():
            return ModelSpec.from_config(
                _read_json(path),
                name=path.parent.name or path.stem,
                revision=revision,
                dtype_bytes=dtype_bytes,
            )
        raise InvalidInputError(
            f"model {str(model)!r} is neither a preset nor a config.json path; "
            f"presets: {', '.join(list_models())}"
        )
    raise InvalidInputError(
        f"model must be a preset name, a path or a config dict, got {type(model).__name__}"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"model config {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInputError(f"model config {str(path)!r} must hold a JSON object")
    return data
