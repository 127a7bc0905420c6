"""Seeded weights saved one safetensors file per unit, with a manifest, and loaded unit by unit.

``manifest.json`` holds the model's identity, config, seed and the SHA-256 of every unit's file;
:func:`load_unit` refuses a file with other bytes (CorruptCheckpointError naming the unit).
"""

from __future__ import annotations

import dataclasses
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
from blitzplan.models.identity import file_digest

MANIFEST = "manifest.json"


class CorruptCheckpointError(InvalidInputError):
    """A unit file is not what its manifest says. ``unit`` (also ``layer``, as in
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
    files: tuple[str, ...]
    digests: tuple[str, ...]

    def spec(self) -> ModelSpec:
        """The ModelSpec the weights were made for."""
        return ModelSpec.from_config(
            self.config, name=self.identity.name, revision=self.identity.revision
        )

    @property
    def num_units(self) -> int:
        return len(self.files)


def save_checkpoint(spec: ModelSpec, directory: str | Path, *, seed: int = 0) -> Checkpoint:
    """Write seeded weights for ``spec`` to ``directory`` (created), one file per unit."""
    seed = check_count("seed", seed, minimum=0, maximum=2**63 - 1)
    dims, root = model_dims(spec), Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    identity = {k: str(v) for k, v in dataclasses.asdict(spec.identity).items()}
    units = []
    for unit in range(dims.spec.num_units):
        weights, name = init_unit(dims, unit, seed=seed), f"unit-{unit:03d}.safetensors"
        save_file(weights, str(root / name), metadata={**identity, "unit": str(unit)})
        units.append({"file": name, "sha256": file_digest(root / name)})
    manifest = {"identity": identity, "config": dict(spec.config), "seed": seed, "units": units}
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return load_checkpoint(root)


def load_checkpoint(directory: str | Path) -> Checkpoint:
    """Read a checkpoint's manifest (no weights are read); checks it is self-consistent."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise InvalidInputError(f"checkpoint {str(directory)!r} has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
        units = manifest["units"]
        checkpoint = Checkpoint(
            directory=Path(directory),
            identity=ModelIdentity(**manifest["identity"]),
            config=dict(manifest["config"]),
            seed=int(manifest["seed"]),
            files=tuple(str(u["file"]) for u in units),
            digests=tuple(str(u["sha256"]) for u in units),
        )
        spec = checkpoint.spec()
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"checkpoint manifest {str(path)!r} is malformed: {exc}") from exc
    if spec.identity != checkpoint.identity or len(units) != spec.num_units:
        raise InvalidInputError(
            f"checkpoint {str(directory)!r} names identity {checkpoint.identity} and "
            f"{len(units)} units, but its config gives {spec.identity} and {spec.num_units}"
        )
    return checkpoint


def check_identity(checkpoint: Checkpoint, identity: ModelIdentity) -> None:
    """Raise InvalidInputError unless the checkpoint holds the model ``identity``, every unit
    intact: a run never starts on weights it cannot send."""
    if checkpoint.identity != identity:
        raise InvalidInputError(
            f"checkpoint {str(checkpoint.directory)!r} holds model {checkpoint.identity}, but the "
            f"plan's model is {identity}; refusing to mix weights of two model versions"
        )
    for unit in range(checkpoint.num_units):
        load_unit(checkpoint, unit)


def load_unit(checkpoint: Checkpoint, unit: int) -> Weights:
    """One unit's tensors (on the CPU), its file checked against the manifest's hash."""
    if not 0 <= unit < checkpoint.num_units:
        raise InvalidInputError(f"unit must be in 0..{checkpoint.num_units - 1}, got {unit!r}")
    path = checkpoint.directory / checkpoint.files[unit]
    if not path.is_file():
        raise CorruptCheckpointError(f"unit {unit} file {str(path)!r} is missing", unit=unit)
    if (digest := file_digest(path)) != checkpoint.digests[unit]:
        raise CorruptCheckpointError(
            f"unit {unit} in {str(path)!r} hashes to {digest[:12]}, the manifest says "
            f"{checkpoint.digests[unit][:12]}",
            unit=unit,
        )
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (OSError, SafetensorError) as exc:
        message = f"unit {unit} file {str(path)!r} does not read as safetensors: {exc}"
        raise CorruptCheckpointError(message, unit=unit) from None


def checkpoint_tensors(checkpoint: Checkpoint, unit: int) -> dict[str, Any]:
    """A unit as full tensors under their Hugging Face names (see :func:`.llama.hf_arrays`)."""
    return hf_arrays(model_dims(checkpoint.spec()), unit, load_unit(checkpoint, unit))
