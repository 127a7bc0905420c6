"""Seeded weights saved one safetensors file per unit, with a manifest, and loaded unit by unit.

A checkpoint directory holds ``unit-000.safetensors`` .. ``unit-{L+1}.safetensors`` and
``manifest.json``: the model's identity (name, revision, content hash), its config, the seed, and
the SHA-256 of every unit's flattened bytes
(:func:`~blitzplan.executor.smallmodel.llama.flatten_unit`).
Every unit file also carries the identity in its metadata, so layers of two versions are never
mixed. :func:`check_identity` refuses, before anything runs, weights whose identity differs from
a plan's model or any unit whose file is of another model or whose bytes do not hash to the
manifest's (:class:`CorruptCheckpointError`, naming the unit); :func:`load_unit` checks the same
for the one unit it loads.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from blitzplan._checks import check_count
from blitzplan.errors import InvalidInputError
from blitzplan.executor.smallmodel.llama import Dims, Weights, flatten_unit, init_unit, model_dims
from blitzplan.models import ModelIdentity, ModelSpec

MANIFEST = "manifest.json"
_FORMAT = "blitzplan-executor-checkpoint/1"


class CorruptCheckpointError(InvalidInputError):
    """A unit file of a checkpoint is not what its manifest says: another model's, or its bytes
    hash to another digest. ``unit`` (also ``layer``, as in
    :class:`~blitzplan.executor.runtime.failures.RankFailedError`) is the unit: 0 the
    embedding, ``1..L`` the decoder layers, ``L + 1`` the head."""

    def __init__(self, message: str, *, unit: int) -> None:
        super().__init__(message)
        self.unit = self.layer = unit


def unit_digest(flat: torch.Tensor) -> str:
    """SHA-256 of a flattened unit's bytes (the checksum every target compares)."""
    return hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest()


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
        """The ModelSpec the weights were made for (its identity is checked on load)."""
        return ModelSpec.from_config(
            self.config, name=self.identity.name, revision=self.identity.revision
        )

    @property
    def num_units(self) -> int:
        return len(self.files)


def _identity_metadata(identity: ModelIdentity) -> dict[str, str]:
    return {
        "name": identity.name,
        "revision": identity.revision,
        "content_hash": identity.content_hash,
        "hash_kind": identity.hash_kind,
    }


def save_checkpoint(spec: ModelSpec, directory: str | Path, *, seed: int = 0) -> Checkpoint:
    """Write seeded weights for ``spec`` to ``directory`` (created), one file per unit."""
    seed = check_count("seed", seed, minimum=0, maximum=2**63 - 1)
    dims = model_dims(spec)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    metadata = _identity_metadata(spec.identity)
    files, digests = [], []
    for unit in range(dims.num_units):
        weights = init_unit(dims, unit, seed=seed)
        name = f"unit-{unit:03d}.safetensors"
        save_file(weights, str(root / name), metadata={**metadata, "unit": str(unit)})
        files.append(name)
        digests.append(unit_digest(flatten_unit(dims, unit, weights)))
    manifest = {
        "format": _FORMAT,
        "identity": metadata,
        "config": dict(spec.config),
        "seed": seed,
        "units": [{"file": f, "sha256": d} for f, d in zip(files, digests, strict=True)],
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return load_checkpoint(root)


def load_checkpoint(directory: str | Path) -> Checkpoint:
    """Read a checkpoint's manifest (no weights are read); checks it is self-consistent."""
    root = Path(directory)
    path = root / MANIFEST
    if not path.is_file():
        raise InvalidInputError(f"checkpoint {str(root)!r} has no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
        identity = ModelIdentity(**manifest["identity"])
        units = manifest["units"]
        checkpoint = Checkpoint(
            directory=root,
            identity=identity,
            config=dict(manifest["config"]),
            seed=int(manifest["seed"]),
            files=tuple(str(u["file"]) for u in units),
            digests=tuple(str(u["sha256"]) for u in units),
        )
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InvalidInputError(f"checkpoint manifest {str(path)!r} is malformed: {exc}") from exc
    spec = checkpoint.spec()
    if spec.identity != identity:
        raise InvalidInputError(
            f"checkpoint {str(root)!r} names identity {identity}, but its config gives "
            f"{spec.identity}"
        )
    if len(units) != spec.num_units:
        raise InvalidInputError(
            f"checkpoint {str(root)!r} lists {len(units)} units, its model has {spec.num_units}"
        )
    return checkpoint


def check_identity(checkpoint: Checkpoint, identity: ModelIdentity) -> None:
    """Raise InvalidInputError unless the checkpoint holds exactly the model ``identity``, whole
    and intact: every unit is read and checked against the manifest (CorruptCheckpointError
    naming the first unit that is not), so that a run never starts on weights it cannot send."""
    if checkpoint.identity != identity:
        raise InvalidInputError(
            f"checkpoint {str(checkpoint.directory)!r} holds model {checkpoint.identity}, but the "
            f"plan's model is {identity}; refusing to mix weights of two model versions"
        )
    dims = model_dims(checkpoint.spec())
    for unit in range(checkpoint.num_units):
        load_unit(checkpoint, unit, dims=dims)


def load_unit(checkpoint: Checkpoint, unit: int, *, dims: Dims | None = None) -> Weights:
    """One unit's tensors (on the CPU), checked against the identity and the manifest's hash."""
    dims = dims or model_dims(checkpoint.spec())
    if not 0 <= unit < checkpoint.num_units:
        raise InvalidInputError(f"unit must be in 0..{checkpoint.num_units - 1}, got {unit!r}")
    path = checkpoint.directory / checkpoint.files[unit]
    if not path.is_file():
        raise CorruptCheckpointError(f"unit {unit} file {str(path)!r} is missing", unit=unit)
    try:
        weights, found = _read_unit(path)
    except (OSError, SafetensorError) as exc:
        raise CorruptCheckpointError(
            f"unit {unit} file {str(path)!r} does not read as safetensors: {exc}", unit=unit
        ) from None
    if found != checkpoint.identity:
        raise CorruptCheckpointError(
            f"unit {unit} file {str(path)!r} belongs to model {found}, the checkpoint is "
            f"{checkpoint.identity}",
            unit=unit,
        )
    try:
        digest = unit_digest(flatten_unit(dims, unit, weights))
    except (KeyError, RuntimeError, ValueError) as exc:  # missing or misshapen tensors
        raise CorruptCheckpointError(
            f"unit {unit} in {str(path)!r} does not hold the unit's tensors: {exc}", unit=unit
        ) from None
    if digest != checkpoint.digests[unit]:
        raise CorruptCheckpointError(
            f"unit {unit} in {str(path)!r} hashes to {digest[:12]}, the manifest says "
            f"{checkpoint.digests[unit][:12]}",
            unit=unit,
        )
    return weights


def _read_unit(path: Path) -> tuple[Weights, ModelIdentity]:
    """A unit file's tensors and the identity in its metadata."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata() or {}
        found = ModelIdentity(
            metadata.get("name", ""),
            metadata.get("revision", ""),
            metadata.get("content_hash", ""),
            metadata.get("hash_kind", "config"),
        )
        weights: Weights = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    return weights, found


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checkpoint_tensors(checkpoint: Checkpoint, unit: int) -> dict[str, Any]:
    """A unit as full tensors under their Hugging Face names, numpy integers of the element
    width (what :meth:`blitzplan.models.layout.Layout.rank_buffer` packs: it moves bytes)."""
    dims = model_dims(checkpoint.spec())
    prefix = f"model.layers.{unit - 1}." if 0 < unit <= dims.layers else "model."
    out = {}
    for name, tensor in load_unit(checkpoint, unit, dims=dims).items():
        full = name if name.startswith("lm_head") else prefix + name
        out[full] = tensor.view(_INT_OF_WIDTH[tensor.element_size()]).numpy()
    return out
