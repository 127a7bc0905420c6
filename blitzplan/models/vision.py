"""The vision tower and projector of a vision-language wrapper config (Mistral-3 with Pixtral).

``Mistral3ForConditionalGeneration`` (Mistral-Small-3.1/3.2) puts its language model in
``text_config`` and a Pixtral vision encoder in ``vision_config``. The encoder: a patch convolution
(no bias), ``ln_pre``, and per layer an attention norm, bias-free q/k/v/o, an FFN norm and a SwiGLU
MLP. The projector: an RMSNorm, a patch merger (``spatial_merge_size**2`` patches to one, no bias)
and two linears into the text model's width (bias per ``multimodal_projector_bias``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blitzplan._checks import check_count
from blitzplan.errors import InvalidInputError

__all__ = ["VisionTower", "mistral3_vision"]

_SWIGLU_MATRICES = 3  # gate, up, down
_ATTENTION_MATRICES = 4  # q, k, v, o
_NORMS_PER_LAYER = 2


@dataclass(frozen=True)
class VisionTower:
    """Parameters of a vision encoder and of the projector into the language model."""

    tower_params: int
    projector_params: int

    @property
    def params(self) -> int:
        return self.tower_params + self.projector_params


def _int(where: str, config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    return check_count(f"config.json field '{where}.{key}'", value)


def mistral3_vision(config: Mapping[str, Any], *, text_hidden_size: int) -> VisionTower:
    """Pixtral encoder and Mistral-3 projector parameters from a ``mistral3`` wrapper config."""
    vision = config.get("vision_config")
    if not isinstance(vision, Mapping):
        raise InvalidInputError("config.json field 'vision_config' must be an object")
    if vision.get("model_type", "pixtral") != "pixtral":
        raise InvalidInputError(
            f"config.json field 'vision_config.model_type' is {vision['model_type']!r}; blitzplan "
            "sizes the mistral3 vision tower only as Pixtral"
        )
    hidden = _int("vision_config", vision, "hidden_size")
    heads = _int("vision_config", vision, "num_attention_heads")
    head_dim = _int("vision_config", vision, "head_dim", hidden // heads)
    inter = _int("vision_config", vision, "intermediate_size")
    patch = _int("vision_config", vision, "patch_size")
    channels = _int("vision_config", vision, "num_channels", 3)
    layer = (
        _ATTENTION_MATRICES * hidden * heads * head_dim
        + _SWIGLU_MATRICES * hidden * inter
        + _NORMS_PER_LAYER * hidden
    )
    tower = (
        channels * patch * patch * hidden
        + hidden
        + _int("vision_config", vision, "num_hidden_layers") * layer
    )
    merge = _int("config", config, "spatial_merge_size", 2)
    feature_layer = config.get("vision_feature_layer", -1)
    feature_layers = len(feature_layer) if isinstance(feature_layer, list) else 1
    bias = text_hidden_size if config.get("multimodal_projector_bias", False) else 0
    projector = (
        hidden  # norm
        + hidden * merge * merge * hidden  # patch_merger.merging_layer
        + hidden * feature_layers * text_hidden_size
        + bias  # linear_1
        + text_hidden_size * text_hidden_size
        + bias  # linear_2
    )
    return VisionTower(tower, projector)
