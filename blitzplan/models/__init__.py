"""Model specs built from Hugging Face ``config.json`` files: how many bytes each layer weighs.

A model is transferred and executed in *units*: unit 0 is the embedding (with a vision-language
model's vision tower and projector), units ``1..L`` are the decoder layers and unit ``L + 1`` is
the lm_head together with the final norm. Every planner speaks in these units, and
``sum(spec.unit_bytes()) == spec.total_bytes`` always holds. Layers need not weigh the same
(DeepSeek's dense first layers): every per-layer figure comes from ``unit_bytes()``,
``spec.layers`` or ``spec.shard(tp)``.

Modules: :mod:`~.config` reads a config.json (which model types are sized, the dtype keys),
:mod:`~.layers` lists a layer's tensors and sizes them whole or per tensor-parallel GPU,
:mod:`~.quant` and :mod:`~.quant_parse` size GPTQ, AWQ and FP8 checkpoints, :mod:`~.vision` the
Mistral-3 vision tower, :mod:`~.identity` hashes the weights (or the config), :mod:`~.loading`
finds a config from a preset, a path or a Hugging Face repo id.
"""

from blitzplan.models.config import DTYPE_BYTES, KNOWN_MODEL_TYPES, config_dtype
from blitzplan.models.identity import ModelIdentity, safetensors_files, weights_hash
from blitzplan.models.layers import LayerBytes
from blitzplan.models.layout import Layout, layout
from blitzplan.models.loading import hub_cache_dir, list_models, load_model
from blitzplan.models.quant import Quantization, WeightFormat
from blitzplan.models.shapes import MlaDims, MoeLayout, TensorParallelShard
from blitzplan.models.spec import ModelSpec
from blitzplan.models.vision import VisionTower

__all__ = [
    "DTYPE_BYTES",
    "KNOWN_MODEL_TYPES",
    "LayerBytes",
    "Layout",
    "MlaDims",
    "ModelIdentity",
    "ModelSpec",
    "MoeLayout",
    "Quantization",
    "TensorParallelShard",
    "VisionTower",
    "WeightFormat",
    "config_dtype",
    "hub_cache_dir",
    "layout",
    "list_models",
    "load_model",
    "safetensors_files",
    "weights_hash",
]
