"""Weights as a Hugging Face model directory: ``config.json`` and one ``model.safetensors`` with
every tensor under its Hugging Face name, read unit by unit (0 the embedding, ``1..L`` the
decoder layers, ``L + 1`` the head). :func:`save_checkpoint` writes seeded weights so.

:func:`open_checkpoint` refuses, before any process starts, a directory whose config.json is not
the plan's model's (InvalidInputError), and a weights file that does not read, lacks a unit's
tensor or holds one in another shape or dtype (CorruptCheckpointError naming the unit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from blitzplan._checks import check_count
from blitzplan.errors import InvalidInputError
from blitzplan.executor.smallmodel.llama import Weights, init_unit, model_dims, short_name
from blitzplan.models import ModelSpec
from blitzplan.models.identity import weights_hash
from blitzplan.models.layout import layout

CONFIG, WEIGHTS = "config.json", "model.safetensors"
_STORED = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
"""How safetensors names the dtypes the executor runs."""


class CorruptCheckpointError(InvalidInputError):
    """The weights file is not what the model needs. ``unit`` (also ``layer``, as in
    RankFailedError): 0 the embedding, ``1..L`` the decoder layers, ``L + 1`` the head."""

    def __init__(self, message: str, *, unit: int) -> None:
        super().__init__(message)
        self.unit = self.layer = unit


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory (module docstring) holding the weights of ``spec``."""

    directory: Path
    spec: ModelSpec


def save_checkpoint(spec: ModelSpec, directory: str | Path, *, seed: int = 0) -> Checkpoint:
    """Write seeded weights of ``spec`` (:func:`.llama.init_unit`) to ``directory`` (created)."""
    seed = check_count("seed", seed, minimum=0, maximum=2**63 - 1)
    dims, path = model_dims(spec), Path(directory)
    tensors: Weights = {}
    for unit, record in enumerate(layout(spec, 1).units):
        weights = init_unit(dims, unit, seed=seed)
        tensors |= {t.name: weights[short_name(t.name)] for t in record.tensors}
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / WEIGHTS), metadata={"format": "pt"})
    (path / CONFIG).write_text(json.dumps(dict(spec.config), indent=1, sort_keys=True))
    return open_checkpoint(path, spec)


def open_checkpoint(directory: str | Path, spec: ModelSpec) -> Checkpoint:
    """The checkpoint in ``directory`` if it holds the weights of ``spec`` (module docstring):
    its config.json (and, where ``spec`` names its weights by their hash, its weights file)
    gives ``spec``'s identity under ``spec``'s name and revision, and its file has every tensor
    of every unit. No weights are read but to hash them."""
    path = Path(directory)
    try:
        config = json.loads((path / CONFIG).read_text())
        hashed = weights_hash([path / WEIGHTS]) if spec.weights_hash else None
        found = ModelSpec.from_config(
            config, name=spec.name, revision=spec.revision, weights_hash=hashed
        ).identity
    except (OSError, ValueError, TypeError) as exc:
        raise InvalidInputError(f"checkpoint {str(path)!r} does not read: {exc}") from None
    if found != spec.identity:
        raise InvalidInputError(
            f"checkpoint {str(directory)!r} holds model {found}, but the plan's model is "
            f"{spec.identity}; refusing to mix weights of two models"
        )
    checkpoint = Checkpoint(path, spec)
    for unit in range(spec.num_units):
        load_unit(checkpoint, unit, tensors=False)
    return checkpoint


def load_unit(checkpoint: Checkpoint, unit: int, *, tensors: bool = True) -> Weights:
    """Unit ``unit``'s tensors under their Hugging Face names, on the CPU (none unless
    ``tensors``), each checked to be in the file in its shape and dtype."""
    path, dtype = checkpoint.directory / WEIGHTS, _STORED[model_dims(checkpoint.spec).dtype]
    found: Weights = {}
    try:
        with safe_open(str(path), framework="pt") as handle:
            for tensor in layout(checkpoint.spec, 1).units[unit].tensors:
                part = handle.get_slice(tensor.name)
                stored = (part.get_dtype(), part.get_shape())
                if stored != (dtype, list(tensor.shape)):
                    raise CorruptCheckpointError(
                        f"unit {unit}: tensor {tensor.name!r} of {str(path)!r} is {stored[0]} of "
                        f"shape {stored[1]}, not {dtype} of shape {list(tensor.shape)}",
                        unit=unit,
                    )
                if tensors:
                    found[tensor.name] = handle.get_tensor(tensor.name)
    except (OSError, SafetensorError) as exc:  # no file, not safetensors, a tensor missing
        message = f"unit {unit}: {str(path)!r} does not hold its tensors: {exc}"
        raise CorruptCheckpointError(message, unit=unit) from None
    return found
