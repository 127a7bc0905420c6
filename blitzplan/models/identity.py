"""What makes two copies of a model's weights interchangeable: :class:`ModelIdentity`.

**Weights hash** (``hash_kind == "weights"``), when safetensors files are given (or an index that
lists them): SHA-256 over the sorted SHA-256 digests of the files. A file's digest covers its
header (tensor names, dtypes, shapes, offsets) and every tensor byte, so equal hashes mean
byte-identical checkpoints. File digests rather than per-tensor hashes because the file digest is
what the Hugging Face Hub records for every LFS file: in a local Hub cache it is the name of the
blob a snapshot links to, so a cached snapshot is identified without reading its bytes; any other
file is read once. The same weights resharded into other files hash differently (conservative:
never falsely equal). A cache blob's name is trusted, as the Hub's own tools trust it.

**Config hash** (``hash_kind == "config"``), without weights: SHA-256 of the name, revision,
config.json and every size field. It identifies "this config under this name and revision", not
the bytes: two fine-tunes sharing config, name and revision get the same hash.

Two identities compare equal when their kind and hash agree (a config hash covers the name and
revision; a weights hash deliberately does not, so the same bytes under two names match).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blitzplan.errors import InvalidInputError

if TYPE_CHECKING:
    from blitzplan.models.spec import ModelSpec

__all__ = ["HASH_KINDS", "SAFETENSORS_INDEX", "ModelIdentity", "safetensors_files", "weights_hash"]

HASH_KINDS = ("config", "weights")
SAFETENSORS_INDEX = "model.safetensors.index.json"
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_HEADER_LENGTH_BYTES = 8  # a little-endian u64 before the JSON header
_MAX_HEADER_BYTES = 100_000_000  # the safetensors format's own limit
_WEIGHTS_HASH_SCHEME = "blitzplan-safetensors-files-v1"
_CONFIG_ONLY_FIELDS = ("config", "weights_hash")


@dataclass(frozen=True)
class ModelIdentity:
    """What must match for two copies of weights to be interchangeable (see the module doc)."""

    name: str = field(compare=False)
    revision: str = field(compare=False)
    content_hash: str
    hash_kind: str = "config"

    def __post_init__(self) -> None:
        if self.hash_kind not in HASH_KINDS:
            raise InvalidInputError(
                f"hash_kind must be one of {HASH_KINDS}, got {self.hash_kind!r}"
            )

    def __eq__(self, other: object) -> bool:
        """Equal content hash and kind (name and revision do not count); one object is equal to
        itself at once (the instances of one spec share its identity: planners compare it per
        instance). The hash stays the generated one, of the same two fields."""
        if other is self:
            return True
        if not isinstance(other, ModelIdentity) or other.__class__ is not self.__class__:
            return NotImplemented
        return self.content_hash == other.content_hash and self.hash_kind == other.hash_kind

    def __str__(self) -> str:
        return f"{self.name}@{self.revision}#{self.content_hash[:12]}"


def config_identity(spec: ModelSpec) -> ModelIdentity:
    """The config hash of ``spec``: its name, revision, config.json and every size field."""
    sizes: dict[str, Any] = {
        f.name: getattr(spec, f.name)
        for f in dataclasses.fields(spec)
        if f.name not in _CONFIG_ONLY_FIELDS
    }
    config = _json_numbers(dict(spec.config))
    payload = json.dumps({**sizes, "config": config}, sort_keys=True, default=str)
    return ModelIdentity(spec.name, spec.revision, hashlib.sha256(payload.encode()).hexdigest())


def _json_numbers(value: Any) -> Any:
    """``value`` with integral floats as ints, as JSON has one kind of number (``1.0`` and
    ``1`` are one value: a config read back from a canonical document keeps its hash)."""
    if isinstance(value, dict):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_numbers(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


# --- weights ---------------------------------------------------------------------------------


def _read_index(index: Path) -> tuple[Path, ...]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InvalidInputError(f"safetensors index {str(index)!r} is malformed: {exc}") from exc
    missing = [name for name in names if not (index.parent / name).is_file()]
    if missing:
        raise InvalidInputError(
            f"safetensors index {str(index)!r} lists {len(missing)} file(s) that are not there "
            f"(e.g. {missing[0]!r}); the weights hash needs every file of the checkpoint"
        )
    return tuple(index.parent / name for name in names)


def safetensors_files(path: str | Path) -> tuple[Path, ...]:
    """The safetensors files of a checkpoint: a directory (its index, else every ``*.safetensors``
    in it; possibly none), an index file, or one ``.safetensors`` file."""
    path = Path(path)
    if path.is_dir():
        index = path / SAFETENSORS_INDEX
        return _read_index(index) if index.is_file() else tuple(sorted(path.glob("*.safetensors")))
    if path.is_file() and path.name.endswith(".json"):
        return _read_index(path)
    if path.is_file() and path.suffix == ".safetensors":
        return (path,)
    raise InvalidInputError(
        f"weights {str(path)!r} must be a directory, a {SAFETENSORS_INDEX} or a .safetensors file"
    )


def _check_header(path: Path) -> None:
    """Raise unless ``path`` starts with a safetensors header (a length and a JSON object)."""
    with path.open("rb") as handle:
        raw = handle.read(_HEADER_LENGTH_BYTES)
        length = struct.unpack("<Q", raw)[0] if len(raw) == _HEADER_LENGTH_BYTES else -1
        size = path.stat().st_size
        ok = 0 < length <= min(_MAX_HEADER_BYTES, size - _HEADER_LENGTH_BYTES)
        try:
            ok = ok and isinstance(json.loads(handle.read(length)), dict)
        except (json.JSONDecodeError, UnicodeDecodeError):
            ok = False
    if not ok:
        raise InvalidInputError(f"weights file {str(path)!r} is not a safetensors file")


def file_digest(path: Path) -> str:
    """SHA-256 of a file: the Hub cache blob name it links to, else computed from its bytes."""
    target = path.resolve()
    if path.is_symlink() and target.parent.name == "blobs" and _SHA256_HEX.fullmatch(target.name):
        return target.name
    with target.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def weights_hash(files: Iterable[str | Path]) -> str:
    """The content hash of a checkpoint's safetensors files (see the module docstring)."""
    paths = {Path(f).resolve(strict=False): Path(f) for f in files}
    if not paths:
        raise InvalidInputError("weights must name at least one .safetensors file")
    for path in paths.values():
        if not path.is_file():
            raise InvalidInputError(f"weights file {str(path)!r} does not exist")
        _check_header(path)
    digests = sorted(file_digest(path) for path in paths.values())
    return hashlib.sha256("\n".join([_WEIGHTS_HASH_SCHEME, *digests]).encode()).hexdigest()
