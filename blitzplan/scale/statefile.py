"""Cluster state files: the YAML/JSON a serving stack (or the CLI) describes its cluster in.

::

    topology: paper-a800-32            # a catalog name, a topology file, or an inline mapping
    models: [mistral-small-24b]        # one host copy each, placed at start
    instances:
      - {model: mistral-small-24b, gpus: [h0/gpu0, h0/gpu1], role: prefill,
         queue: [[0.0, 2048], [0.1, 512]], kv_bytes_used: 0, id: p0}
      - {model: mistral-small-24b, gpus: [h1/gpu0, h1/gpu1], role: loading, id: n0,
         loading: {role: decode, units_ready_s: [0.0, 0.1, ..., 0.5]}}   # per unit, from now
    background_flows:
      - {src: h0/gpu0, dst: h1/gpu0, gbps: 20}

A model is a preset name, a path to a config.json, or a mapping with ``config`` (and optional
``name``, ``revision``). Every error names the entry it is about.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from blitzplan._checks import is_number
from blitzplan.cluster import ClusterState, Loading
from blitzplan.errors import BlitzplanError, InvalidInputError
from blitzplan.models import ModelSpec, load_model
from blitzplan.topologies import Topology, load_topology, topology_from_dict
from blitzplan.units import GBPS

__all__ = ["load_state", "state_from_dict"]

T = TypeVar("T")

_TOP = {"topology", "models", "instances", "background_flows"}
_INSTANCE = {"model", "gpus", "role", "queue", "kv_bytes_used", "id", "loading"}
_LOADING = {"role", "units_ready_s"}
_FLOW = {"src", "dst", "gbps", "name"}


def load_state(path: str | Path) -> ClusterState:
    """A ClusterState from a YAML or JSON state file."""
    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"state file {str(path)!r} does not exist")
    try:
        text = file.read_text()
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"state file {str(path)!r} does not parse: {exc}") from exc
    return state_from_dict(data, source=str(path), base=file.parent)


def state_from_dict(
    data: object, *, source: str = "<dict>", base: Path | None = None
) -> ClusterState:
    """A ClusterState from the parsed contents of a state file."""
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"state {source!r} must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise InvalidInputError(
            f"state {source!r} has unknown key(s) {unknown}; allowed: {sorted(_TOP)}"
        )
    if "topology" not in data:
        raise InvalidInputError(f"state {source!r} needs a 'topology'")
    topology = _topology(data["topology"], source, base)
    models = [
        _model(m, f"state {source!r} models[{i}]", base)
        for i, m in enumerate(_list(data.get("models", []), f"state {source!r} models"))
    ]
    state = _wrap(f"state {source!r} models", lambda: ClusterState(topology, models=models))
    for i, entry in enumerate(_list(data.get("instances", []), f"state {source!r} instances")):
        where = f"state {source!r} instances[{i}]"
        entry = _mapping(entry, where)
        extra = sorted(set(entry) - _INSTANCE)
        if extra:
            raise InvalidInputError(f"{where} has unknown key(s) {extra}")
        for key in ("model", "gpus"):
            if key not in entry:
                raise InvalidInputError(f"{where} needs {key!r}")
        spec = _model(entry["model"], f"{where} model", base)
        _add_instance(state, spec, entry, where)
    for i, entry in enumerate(
        _list(data.get("background_flows", []), f"state {source!r} background_flows")
    ):
        where = f"state {source!r} background_flows[{i}]"
        entry = _mapping(entry, where)
        extra = sorted(set(entry) - _FLOW)
        if extra:
            raise InvalidInputError(f"{where} has unknown key(s) {extra}")
        _add_flow(state, entry, where)
    return state


def _add_instance(
    state: ClusterState, spec: ModelSpec, entry: Mapping[str, Any], where: str
) -> None:
    gpus = entry["gpus"]
    queue = _list(entry.get("queue", []), f"{where} queue")
    loading = _loading(entry.get("loading"), f"{where} loading")
    _wrap(
        where,
        lambda: state.add_instance(
            spec,
            gpus=gpus,
            role=entry.get("role", "prefill"),
            queue=queue,
            kv_bytes_used=entry.get("kv_bytes_used", 0),
            instance_id=entry.get("id"),
            loading=loading,
        ),
    )


def _loading(entry: object, where: str) -> Loading | None:
    if entry is None:
        return None
    if not isinstance(entry, Mapping) or set(entry) != _LOADING:
        raise InvalidInputError(
            f"{where} must be a mapping with role and units_ready_s, got {entry!r}"
        )
    times = _list(entry["units_ready_s"], f"{where} units_ready_s")
    return _wrap(where, lambda: Loading(entry["role"], tuple(times)))


def _add_flow(state: ClusterState, entry: Mapping[str, Any], where: str) -> None:
    rate = entry.get("gbps")
    if rate is not None and not (is_number(rate) and rate > 0):
        raise InvalidInputError(f"{where} gbps must be a number > 0 (or absent), got {rate!r}")
    cap = float("inf") if rate is None else float(rate) * GBPS
    _wrap(
        where,
        lambda: state.add_background_flow(
            str(entry.get("src")),
            str(entry.get("dst")),
            max_bytes_per_s=cap,
            name=str(entry.get("name", "")),
        ),
    )


def _wrap(where: str, action: Callable[[], T]) -> T:
    try:
        return action()
    except BlitzplanError as exc:
        raise type(exc)(f"{where}: {exc}") from exc


def _topology(value: object, source: str, base: Path | None) -> Topology:
    where = f"state {source!r} topology"
    if isinstance(value, Mapping):
        return _wrap(where, lambda: topology_from_dict(value, source=where))
    if not isinstance(value, str):
        raise InvalidInputError(f"{where} must be a name, a path or a mapping, got {value!r}")
    path = Path(value)
    if base is not None and not path.is_absolute() and (base / path).is_file():
        path = base / path
    return _wrap(where, lambda: load_topology(str(path) if path.is_file() else value))


def _model(value: object, where: str, base: Path | None) -> ModelSpec:
    if isinstance(value, Mapping):
        if "config" not in value:
            raise InvalidInputError(f"{where} needs 'config' when given as a mapping")
        return _wrap(
            where,
            lambda: ModelSpec.from_config(
                value["config"], name=value.get("name"), revision=str(value.get("revision", "main"))
            ),
        )
    if isinstance(value, str) and base is not None and (base / value).exists():
        return _wrap(where, lambda: load_model(base / value))
    if not isinstance(value, str):
        raise InvalidInputError(f"{where} must be a preset name, a path or a mapping")
    return _wrap(where, lambda: load_model(value))


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInputError(f"{where} must be a list, got {value!r}")
    return value


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{where} must be a mapping, got {value!r}")
    return value
