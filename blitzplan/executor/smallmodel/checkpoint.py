"""Seeded weights saved one safetensors file per unit, with a manifest, and loaded unit by unit.

``manifest.json`` holds the model's identity, config and seed; each unit's file names the model
and the unit in its metadata, and :func:`load_unit` refuses one that names another (or is missing,
or does not read: CorruptCheckpointError naming the unit).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from blitzplan._checks import check_count
from blitzplan.errors import InvalidInputError
from blitzplan.executor.smallmodel.llama import Weights, hf_arrays, init_unit, model_dims
from blitzplan.models import ModelIdentity, ModelSpec

MANIFEST = "manifest.json"


class CorruptCheckpointError(InvalidInputError):
    """A unit file is not what the checkpoint says. ``unit`` (also ``layer``, as in
    RankFailedError): 0 the embedding, ``1..L`` the decoder layers, ``L + 1`` the head."""

    def __init__(self, message: str, *, unit: int) -> None:
        super().__init__(message)
        self.unit = self.layer = unit


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint directory as its manifest describes it."""

    directory: Path
    identity: ModelIdentity
    config: dict[str, object]
    seed: int

    @functools.cached_property
    def spec(self) -> ModelSpec:
        """The ModelSpec the weights were made for."""
        return ModelSpec.from_config(
            self.config, name=self.identity.name, revision=self.identity.revision
        )

    def metadata(self, unit: int) -> dict[str, str]:
        """What unit ``unit``'s file says it is."""
        return {**_named(self.identity), "unit": str(unit)}

    def path(self, unit: int) -> Path:
        return self.directory / f"unit-{unit:03d}.safetensors"


def _named(identity: ModelIdentity) -> dict[str, str]:
    return {k: str(v) for k, v in dataclasses.asdict(identity).items()}


def save_checkpoint(spec: ModelSpec, directory: str | Path, *, seed: int = 0) -> Checkpoint:
    """Write seeded weights for ``spec`` to ``directory`` (created), one file per unit."""
    seed = check_count("seed", seed, minimum=0, maximum=2**63 - 1)
    made = Checkpoint(Path(directory), spec.identity, dict(spec.config), seed)
    made.directory.mkdir(parents=True, exist_ok=True)
    for unit in range(spec.num_units):
        weights = init_unit(model_dims(spec), unit, seed=seed)
        save_file(weights, str(made.path(unit)), metadata=made.metadata(unit))
    manifest = {"identity": _named(spec.identity), "config": made.config, "seed": seed}
    (made.directory / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return load_checkpoint(directory)


def load_checkpoint(directory: str | Path) -> Checkpoint:
    """Read a checkpoint's manifest (no weights are read); checks it is self-consistent."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise InvalidInputError(f"checkpoint {str(directory)!r} has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
        identity = ModelIdentity(**manifest["identity"])
        checkpoint = Checkpoint(
            Path(directory), identity, dict(manifest["config"]), manifest["seed"]
        )
        spec = checkpoint.spec
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"checkpoint manifest {str(path)!r} is malformed: {exc}") from exc
    if spec.identity != identity:
        raise InvalidInputError(
            f"checkpoint {str(directory)!r} names identity {identity}, but its config gives "
            f"{spec.identity}"
        )
    return checkpoint


def check_identity(checkpoint: Checkpoint, identity: ModelIdentity) -> None:
    """Raise InvalidInputError unless the checkpoint holds the model ``identity``, every unit's
    file there and of it: a run never starts on weights it cannot send."""
    if checkpoint.identity != identity:
        raise InvalidInputError(
            f"checkpoint {str(checkpoint.directory)!r} holds model {checkpoint.identity}, but the "
            f"plan's model is {identity}; refusing to mix weights of two model versions"
        )
    for unit in range(checkpoint.spec.num_units):
        load_unit(checkpoint, unit, tensors=False)


def load_unit(checkpoint: Checkpoint, unit: int, *, tensors: bool = True) -> Weights:
    """One unit's tensors (on the CPU; none unless ``tensors``), its file's metadata checked."""
    if not 0 <= unit < checkpoint.spec.num_units:
        raise InvalidInputError(f"unit must be in 0..{checkpoint.spec.num_units - 1}, got {unit!r}")
    path = checkpoint.path(unit)
    if not path.is_file():
        raise CorruptCheckpointError(f"unit {unit} file {str(path)!r} is missing", unit=unit)
    try:
        with safe_open(str(path), framework="pt") as handle:
            if (said := handle.metadata()) != checkpoint.metadata(unit):
                raise CorruptCheckpointError(
                    f"unit {unit} in {str(path)!r} says it is {said}, not unit {unit} of "
                    f"{checkpoint.identity}",
                    unit=unit,
                )
            names = list(handle.keys()) if tensors else []
            return {name: handle.get_tensor(name) for name in names}
    except (OSError, SafetensorError) as exc:
        message = f"unit {unit} file {str(path)!r} does not read as safetensors: {exc}"
        raise CorruptCheckpointError(message, unit=unit) from None


def checkpoint_tensors(checkpoint: Checkpoint, unit: int) -> dict[str, Any]:
    """A unit as full tensors under their Hugging Face names (see :func:`.llama.hf_arrays`)."""
    return hf_arrays(model_dims(checkpoint.spec), unit, load_unit(checkpoint, unit))
