"""ModelSpec: a decoder-only transformer's sizes, per transfer unit, whole or per TP GPU."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from blitzplan._checks import check_count
from blitzplan.errors import InvalidInputError
from blitzplan.models.checks import check_quantization
from blitzplan.models.config import spec_fields
from blitzplan.models.identity import ModelIdentity, config_identity
from blitzplan.models.layers import (
    NORM_BIASES,
    LayerBytes,
    Linear,
    formats,
    layer_bytes,
    layer_modules,
    layer_params,
)
from blitzplan.models.quant import Quantization
from blitzplan.models.shapes import MlaDims, MoeLayout, TensorParallelShard
from blitzplan.models.vision import VisionTower

__all__ = ["ModelSpec"]

_KV_TENSORS = 2  # one K and one V tensor per layer and token
_MTP_NORMS = 3  # enorm, hnorm and shared_head.norm of a DeepSeek-V3 next-token-prediction layer
_MTP_CONCAT = 2  # eh_proj maps [embedding; hidden state] (2 x hidden) to hidden


@dataclass(frozen=True)
class ModelSpec:
    """Architecture sizes of one decoder-only transformer, from its config.json.

    Build with :func:`~blitzplan.models.load_model` or :meth:`from_config`. ``intermediate_size``
    is a dense layer's MLP width, or one routed expert's in a MoE model. ``dtype_bytes`` is the
    width of every unquantized tensor; ``quantization`` says how the quantized linears are stored.
    Layers may differ (DeepSeek's dense first layers, a layer a quantization skips):
    ``unit_bytes()``, ``layers`` and ``shard(tp)`` give every layer, while ``layer``,
    ``layer_bytes``, ``params_per_layer`` and ``active_params_per_layer`` describe the largest one
    (the first of equals), the one a per-layer cost model should assume.
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
    model_type: str = "llama"
    qk_norm: bool = False
    moe: MoeLayout = field(default_factory=MoeLayout)
    mla: MlaDims | None = None
    quantization: Quantization | None = None
    vision: VisionTower | None = None
    mtp_layers: int = 0
    weights_hash: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key in (
            "hidden_size", "intermediate_size", "num_layers", "num_attention_heads", "num_kv_heads",
            "head_dim", "vocab_size", "num_experts", "experts_per_token", "dtype_bytes",
        ):  # fmt: skip
            object.__setattr__(self, key, check_count(key, getattr(self, key)))
        if self.num_attention_heads % self.num_kv_heads:
            raise InvalidInputError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_kv_heads})"
            )
        if self.experts_per_token > self.num_experts:
            raise InvalidInputError(
                f"num_experts_per_tok ({self.experts_per_token}) must be <= the number of routed "
                f"experts ({self.num_experts}; read from num_local_experts, num_experts or "
                "n_routed_experts)"
            )
        if any(not 0 <= i < self.num_layers for i in self.moe.dense_layers):
            raise InvalidInputError(f"moe.dense_layers must lie in 0..{self.num_layers - 1}")

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any],
        *,
        name: str | None = None,
        revision: str = "main",
        dtype_bytes: int | None = None,
        weights_hash: str | None = None,
    ) -> ModelSpec:
        """Build a spec from a Hugging Face config.json dict (see :mod:`.config`)."""
        if not isinstance(config, Mapping):
            raise InvalidInputError(f"config must be a mapping, got {type(config).__name__}")
        fields = spec_fields(config, dtype_bytes=dtype_bytes)
        mla, moe = fields.pop("mla"), fields.pop("moe", None)
        spec = cls(
            name=name or str(config.get("_name_or_path") or fields["model_type"] or "model"),
            revision=revision,
            mla=MlaDims(**mla) if mla else None,
            moe=MoeLayout(**moe) if moe else MoeLayout(),
            weights_hash=weights_hash,
            config=dict(config),
            **fields,
        )
        check_quantization(spec)
        return spec

    # --- layers ------------------------------------------------------------------------------

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) routes to experts."""
        return self.num_experts > 1 and index not in self.moe.dense_layers

    def _layer_key(self, index: int) -> tuple[bool, int]:
        """Layers with equal keys weigh the same (a non-uniform quantization sets each apart)."""
        uniform = self.quantization is None or self.quantization.uniform
        return self.is_moe_layer(index), -1 if uniform else index

    @cached_property
    def _per_tp(self) -> dict[int, tuple[int, ...]]:
        """Memo of per-layer bytes by TP degree (the spec is immutable)."""
        return {}

    @cached_property
    def _shards(self) -> dict[int, TensorParallelShard]:
        """Memo of :meth:`shard` by TP degree."""
        return {}

    def _layer_totals(self, tp: int) -> tuple[int, ...]:
        if tp not in self._per_tp:
            memo: dict[tuple[bool, int], int] = {}
            for index in range(self.num_layers):
                key = self._layer_key(index)
                if key not in memo:
                    memo[key] = layer_bytes(self, index, tp=tp).total
            self._per_tp[tp] = tuple(memo[self._layer_key(i)] for i in range(self.num_layers))
        return self._per_tp[tp]

    @cached_property
    def layers(self) -> tuple[LayerBytes, ...]:
        """Bytes of every decoder layer by tensor family, in order."""
        memo: dict[tuple[bool, int], LayerBytes] = {}
        for index in range(self.num_layers):
            if self._layer_key(index) not in memo:
                memo[self._layer_key(index)] = layer_bytes(self, index)
        return tuple(memo[self._layer_key(i)] for i in range(self.num_layers))

    @cached_property
    def _largest(self) -> int:
        totals = self._layer_totals(1)
        return totals.index(max(totals))

    @property
    def is_uniform(self) -> bool:
        """True when every decoder layer weighs the same."""
        return len(set(self._layer_totals(1))) == 1

    @property
    def layer(self) -> LayerBytes:
        """Bytes of the largest decoder layer by tensor family."""
        return self.layers[self._largest]

    @property
    def layer_bytes(self) -> int:
        """Bytes of the largest decoder layer (every layer's, for a uniform model)."""
        return self.layer.total

    @cached_property
    def _largest_params(self) -> tuple[int, int]:
        return layer_params(self, self._largest)

    @property
    def params_per_layer(self) -> int:
        """Parameters of the largest decoder layer."""
        return self._largest_params[0]

    @property
    def active_params_per_layer(self) -> int:
        """Parameters one token touches in the largest layer (shared plus top-k routed experts)."""
        return self._largest_params[1]

    # --- whole-model sizes -------------------------------------------------------------------

    @property
    def embedding_bytes(self) -> int:
        return self.dtype_bytes * self.vocab_size * self.hidden_size

    @property
    def vision_bytes(self) -> int:
        """Vision tower and projector of a vision-language model (carried in unit 0); else 0."""
        return self.dtype_bytes * self.vision.params if self.vision else 0

    @property
    def lm_head_bias(self) -> bool:
        """Whether the head carries a bias (Phi-3.5-MoE's ``lm_head_bias``)."""
        return not self.tie_word_embeddings and bool(self.config.get("lm_head_bias", False))

    def _lm_head_bytes(self, vocab: int) -> int:
        if self.tie_word_embeddings:
            return 0
        fmt = self.quantization.lm_head_format() if self.quantization else None
        weight = (
            fmt.weight_bytes(self.hidden_size, vocab)
            if fmt
            else self.dtype_bytes * vocab * self.hidden_size
        )
        return weight + (self.dtype_bytes * vocab if self.lm_head_bias else 0)

    @property
    def lm_head_bytes(self) -> int:
        """Bytes of the output projection; 0 when it is tied to the embedding."""
        return self._lm_head_bytes(self.vocab_size)

    @property
    def final_norm_bytes(self) -> int:
        """The final norm's weight (and bias, for LayerNorm models)."""
        return self.dtype_bytes * self._final_norm_params

    @property
    def _final_norm_params(self) -> int:
        return self.hidden_size * (2 if self.model_type in NORM_BIASES else 1)

    @property
    def total_bytes(self) -> int:
        """Bytes a serving instance loads: every unit (next-token-prediction layers excluded)."""
        return sum(self.unit_bytes())

    @property
    def total_params(self) -> int:
        """Parameters of every unit (quantization aside; next-token-prediction layers excluded)."""
        memo: dict[bool, int] = {}
        for index in range(self.num_layers):
            moe = self.is_moe_layer(index)
            if moe not in memo:
                memo[moe] = layer_params(self, index)[0]
        layers = sum(memo[self.is_moe_layer(i)] for i in range(self.num_layers))
        heads = 1 if self.tie_word_embeddings else 2
        vision = self.vision.params if self.vision else 0
        head_bias = self.vocab_size if self.lm_head_bias else 0
        return (
            heads * self.vocab_size * self.hidden_size
            + head_bias
            + self._final_norm_params
            + layers
            + vision
        )

    @property
    def mtp_bytes(self) -> int:
        """Bytes of DeepSeek-V3's next-token-prediction layer(s) in the checkpoint, else 0.

        Each holds its own embedding and output head, three norms, ``eh_proj`` (unquantized, as
        in the released checkpoint) and one decoder layer. Serving without speculative decoding
        does not load them, so they are not a transfer unit and not in ``total_bytes``.
        """
        h = self.hidden_size
        own = 2 * self.embedding_bytes + self.dtype_bytes * (_MTP_NORMS * h + _MTP_CONCAT * h * h)
        return sum(
            own + layer_bytes(self, self.num_layers + j).total for j in range(self.mtp_layers)
        )

    @property
    def checkpoint_bytes(self) -> int:
        """Bytes of every weight the checkpoint stores: ``total_bytes`` plus ``mtp_bytes``."""
        return self.total_bytes + self.mtp_bytes

    @property
    def num_units(self) -> int:
        """Embedding, ``num_layers`` decoder layers, and the head: ``num_layers + 2``."""
        return self.num_layers + 2

    def unit_bytes(self) -> tuple[int, ...]:
        """Bytes per transfer unit: embedding (+ vision), layers 1..L, lm_head + final norm."""
        head = self.lm_head_bytes + self.final_norm_bytes
        return (self.embedding_bytes + self.vision_bytes, *self._layer_totals(1), head)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies across all layers (MLA: the latent and rope key)."""
        return self._kv_bytes_per_token(1)

    def _kv_bytes_per_token(self, tp: int) -> int:
        if self.mla is not None:  # one latent per token, replicated on every TP GPU
            return (
                self.num_layers
                * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim)
                * self.dtype_bytes
            )
        kv_heads = max(1, self.num_kv_heads // tp)
        return _KV_TENSORS * self.num_layers * kv_heads * self.head_dim * self.dtype_bytes

    @property
    def activation_bytes_per_token(self) -> int:
        """Bytes of the hidden state handed from one layer to the next, per token."""
        return self.hidden_size * self.dtype_bytes

    # --- tensor parallelism ------------------------------------------------------------------

    def shard(self, tp: int) -> TensorParallelShard:
        """Bytes per unit on one GPU of a ``tp``-way tensor-parallel instance (Megatron split).

        Heads, MLP and expert widths split (KV heads replicate when ``tp`` exceeds them), MoE
        routers, MLA down-projections, norms and the vision tower are whole on every GPU, the
        embedding and lm_head split by vocabulary (padded up). See :mod:`blitzplan.models.layers`.
        """
        if tp in self._shards:
            return self._shards[tp]
        self.check_tp(tp)
        vocab = math.ceil(self.vocab_size / tp)
        embedding = self.dtype_bytes * vocab * self.hidden_size + self.vision_bytes
        head = self._lm_head_bytes(vocab) + self.final_norm_bytes
        units = (embedding, *self._layer_totals(tp), head)
        shard = TensorParallelShard(tp, units, self._kv_bytes_per_token(tp))
        self._shards[tp] = shard
        return shard

    def check_tp(self, tp: int) -> None:
        """Raise InvalidInputError unless ``tp`` evenly splits heads, MLPs and quantized blocks."""
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
        for key in ("dense_intermediate_size", "shared_intermediate_size"):
            if getattr(self.moe, key) % tp:
                raise InvalidInputError(
                    f"tp={tp} must divide {key} ({getattr(self.moe, key)}) of {self.name}"
                )
        problem = self.quantized_split_problem(tp)
        if problem:
            raise InvalidInputError(f"tp={tp} cannot split {self.name}: {problem}")

    def quantized_split_problem(self, tp: int) -> str | None:
        """Why ``tp`` cuts a quantized linear into pieces its format cannot store, or None."""
        if self.quantization is None:
            return None
        seen: set[tuple[bool, int]] = set()
        for index in range(self.num_layers):
            if self._layer_key(index) in seen:
                continue
            seen.add(self._layer_key(index))
            for module in layer_modules(self, index):
                if isinstance(module, Linear):
                    problem = _split_problem(self, module, index, tp)
                    if problem:
                        return problem
        return None

    # --- identity ----------------------------------------------------------------------------

    @cached_property
    def identity(self) -> ModelIdentity:
        """Name, revision and a content hash: of the weights when they were given, else of the
        config (see :class:`~blitzplan.models.ModelIdentity`)."""
        if self.weights_hash is not None:
            return ModelIdentity(self.name, self.revision, self.weights_hash, "weights")
        return config_identity(self)


def _split_problem(spec: ModelSpec, linear: Linear, index: int, tp: int) -> str | None:
    k, n = linear.shard_shape(tp)
    for fmt, _ in formats(spec, linear, index):
        problem = fmt.shape_problem(k, n, split=linear.split if tp > 1 else "none") if fmt else None
        if problem:
            return f"layer {index} {linear.name}: {problem}"
    return None
