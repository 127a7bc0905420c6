"""Loading a ModelSpec from a preset, a config.json, a local checkpoint or a Hugging Face repo id.

Nothing is ever downloaded. A repo id is sized from a config supplied for it (``config=``), from
the preset that carries that id (``"meta-llama/Meta-Llama-3-8B"`` is the ``llama-3-8b`` preset),
or from a snapshot already in the local Hugging Face cache; otherwise the error says how to
supply one. A directory (a checkpoint, or a cache snapshot) brings its safetensors files, and the
spec's identity is then a hash of those weights (see :mod:`blitzplan.models.identity`).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.models.identity import safetensors_files, weights_hash
from blitzplan.models.spec import ModelSpec

__all__ = ["hub_cache_dir", "list_models", "load_model"]

_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_CONFIG = "config.json"

WeightsArg = str | Path | Sequence[str | Path] | None


def _preset_dir() -> resources.abc.Traversable:
    return resources.files("blitzplan") / "presets"


@functools.cache
def _preset_texts() -> dict[str, str]:
    """Each preset's JSON text by name, read once (they ship with the package)."""
    return {
        entry.name.removesuffix(".json"): entry.read_text()
        for entry in _preset_dir().iterdir()
        if entry.name.endswith(".json")
    }


@functools.lru_cache(maxsize=64)
def _preset_spec(name: str, revision: str, dtype_bytes: int | None) -> ModelSpec:
    config = json.loads(_preset_texts()[name])["config"]
    return _Request(revision, dtype_bytes, None).build(config, name=name)


def _presets() -> dict[str, dict[str, Any]]:
    return {name: json.loads(text) for name, text in _preset_texts().items()}


def list_models() -> list[str]:
    """Names of the preset models :func:`load_model` accepts."""
    return sorted(_preset_texts())


def hub_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face Hub cache: ``cache_dir``, else ``$HF_HUB_CACHE``, ``$HF_HOME/hub``,
    ``$XDG_CACHE_HOME/huggingface/hub`` or ``~/.cache/huggingface/hub``, as the Hub's tools."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "huggingface" / "hub"


def _cached_snapshot(repo_id: str, revision: str, root: Path) -> Path | None:
    repo = root / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit
    return snapshot if (snapshot / _CONFIG).is_file() else None


def _snapshot_name(directory: Path) -> tuple[str, str] | None:
    """(repo id, commit) when ``directory`` is a Hub cache snapshot, else None."""
    repo = directory.parent.parent.name
    if directory.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    return repo.removeprefix("models--").replace("--", "/", 1), directory.name


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"model config {str(path)!r} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidInputError(f"model config {str(path)!r} must hold a JSON object")
    return data


def _hash(weights: WeightsArg) -> str | None:
    if weights is None:
        return None
    if isinstance(weights, str | Path):
        files = safetensors_files(weights)
        if not files:
            raise InvalidInputError(
                f"weights directory {str(weights)!r} holds no .safetensors file"
            )
        return weights_hash(files)
    return weights_hash(weights)


def _config_at(path: Path) -> tuple[dict[str, Any], Path | None]:
    """The config.json at ``path`` (a file or a directory holding one), and the directory when
    it also holds safetensors files."""
    directory = path if path.is_dir() else None
    config_path = path / _CONFIG if directory else path
    if not config_path.is_file():
        raise InvalidInputError(f"model directory {str(path)!r} has no {_CONFIG}")
    with_weights = directory if directory is not None and safetensors_files(directory) else None
    return _read_json(config_path), with_weights


@dataclass(frozen=True)
class _Request:
    """What load_model was asked besides the model: options every path applies alike."""

    revision: str
    dtype_bytes: int | None
    weights: WeightsArg

    def build(
        self,
        config: Mapping[str, Any],
        *,
        name: str | None,
        own_weights: WeightsArg = None,
        revision: str | None = None,
    ) -> ModelSpec:
        weights = self.weights if self.weights is not None else own_weights
        return ModelSpec.from_config(
            config,
            name=name,
            revision=revision or self.revision,
            dtype_bytes=self.dtype_bytes,
            weights_hash=_hash(weights),
        )


def _from_path(path: Path, request: _Request) -> ModelSpec:
    """A config.json, or a directory holding one (and perhaps its safetensors files)."""
    config, own_weights = _config_at(path)
    folder = path if path.is_dir() else path.parent
    name, revision = _snapshot_name(folder) or (folder.name or path.stem, request.revision)
    return request.build(config, name=name, own_weights=own_weights, revision=revision)


def load_model(
    model: str | Path | Mapping[str, Any],
    *,
    revision: str = "main",
    dtype_bytes: int | None = None,
    config: str | Path | Mapping[str, Any] | None = None,
    weights: WeightsArg = None,
    cache_dir: str | Path | None = None,
) -> ModelSpec:
    """A ModelSpec from a preset name, a config.json path or directory, a config dict, or a
    Hugging Face repo id with a local config.

    ``config`` sizes a named model (often a repo id) from a config.json path, directory or dict.
    ``weights`` (a directory, a ``model.safetensors.index.json``, a ``.safetensors`` file or a
    list of them) makes the identity a hash of those weights; a directory ``model`` or a cache
    snapshot uses its own safetensors files (pass its config.json path to skip hashing them).
    ``cache_dir`` is the Hub cache repo ids are looked up in (see :func:`hub_cache_dir`).

    >>> load_model("llama-3-8b").total_bytes
    16060522496
    """
    request = _Request(revision, dtype_bytes, weights)
    if config is not None:
        if not isinstance(model, str):
            raise InvalidInputError(f"config= names the model by a string, got model={model!r}")
        if isinstance(config, Mapping):
            return request.build(config, name=model)
        supplied, own_weights = _config_at(Path(config))
        return request.build(supplied, name=model, own_weights=own_weights)
    if isinstance(model, Mapping):
        return request.build(model, name=None)
    if not isinstance(model, str | Path):
        raise InvalidInputError(
            "model must be a preset name, a path, a repo id or a config dict, "
            f"got {type(model).__name__}"
        )
    if isinstance(model, str) and model in _preset_texts():
        cacheable = type(revision) is str and (dtype_bytes is None or type(dtype_bytes) is int)
        if weights is None and cacheable:  # a preset's spec is immutable: built once each
            return _preset_spec(model, revision, dtype_bytes)
        return request.build(json.loads(_preset_texts()[model])["config"], name=model)
    presets = _presets()
    if Path(model).exists():
        return _from_path(Path(model), request)
    return _from_repo_id(str(model), presets, request, hub_cache_dir(cache_dir))


def _from_repo_id(
    model: str, presets: dict[str, dict[str, Any]], request: _Request, root: Path
) -> ModelSpec:
    if not _REPO_ID.fullmatch(model):
        raise InvalidInputError(
            f"model {model!r} is neither a preset, an existing path nor a Hugging Face repo id; "
            f"presets: {', '.join(sorted(presets))}"
        )
    for name, preset in presets.items():
        if str(preset.get("hf_id", "")).casefold() == model.casefold():
            return request.build(preset["config"], name=name)
    repo_dir = root / ("models--" + model.replace("/", "--"))
    snapshot = _cached_snapshot(model, request.revision, root)
    if snapshot is not None:
        return _from_path(snapshot, request)
    raise InvalidInputError(
        f"model {model!r} is not a preset or an existing path; as a Hugging Face repo id it has "
        "no local config, and blitzplan never downloads: pass config= (a config.json path, its "
        f"directory or a dict), e.g. load_model({model!r}, config='path/to/config.json'), or a "
        "local snapshot directory, or fetch it into the Hub cache first (revision "
        f"{request.revision!r} not found under {str(repo_dir)!r}); "
        f"presets: {', '.join(sorted(presets))}"
    )
