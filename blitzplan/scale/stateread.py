"""Reading a cluster state file's contents (see :mod:`blitzplan.scale.statefile` for the format):
every entry checked, and every error naming the entry it is about."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from blitzplan._checks import is_number
from blitzplan.cluster import ClusterState, HostCopy, Loading
from blitzplan.errors import BlitzplanError, InvalidInputError
from blitzplan.models import ModelIdentity, ModelSpec, load_model
from blitzplan.topologies import Flow, Topology, load_topology, topology_from_dict
from blitzplan.units import GBPS

__all__ = ["state_from_dict", "topology_of_entry"]

T = TypeVar("T")

_TOP = {
    "topology",
    "removed",
    "models",
    "host_copies",
    "instances",
    "background_flows",
    "counters",
}
_INSTANCE = {"model", "gpus", "role", "queue", "kv_bytes_used", "id", "loading"}
_LOADING = {"role", "units_ready_s"}
_LOADING_OPTIONAL = {"needs", "edges", "relieves"}
_FLOW = {"src", "dst", "edges", "gbps", "bytes_per_s", "name", "until_s"}
_COPY = {"name", "revision", "content_hash", "hash_kind", "host", "bytes"}


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
    topology = topology_of_entry(data["topology"], source, base)
    if "removed" in data:
        topology = _removed(topology, data["removed"], f"state {source!r} removed")
    models = [
        _model(m, f"state {source!r} models[{i}]", base)
        for i, m in enumerate(_list(data.get("models", []), f"state {source!r} models"))
    ]
    state = ClusterState(topology)
    for i, entry in enumerate(_list(data.get("host_copies", []), f"state {source!r} host_copies")):
        _add_copy(state, _mapping(entry, f"state {source!r} host_copies[{i}]"), i, source)
    _wrap(f"state {source!r} models", lambda: state.pool.place(models))
    if "counters" in data:
        counters = _mapping(data["counters"], f"state {source!r} counters")
        _wrap(f"state {source!r}", lambda: state.restore_counters(counters))
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
    if not isinstance(entry, Mapping) or not _LOADING <= set(entry) <= _LOADING | _LOADING_OPTIONAL:
        raise InvalidInputError(
            f"{where} must be a mapping with role and units_ready_s (and optional needs, edges, "
            "relieves), "
            f"got {entry!r}"
        )
    times = _list(entry["units_ready_s"], f"{where} units_ready_s")
    needs = entry.get("needs")
    if needs is not None:
        needs = frozenset(str(n) for n in _list(needs, f"{where} needs"))
    edges = [
        tuple(_list(e, f"{where} edges")) for e in _list(entry.get("edges", []), f"{where} edges")
    ]
    if not all(len(e) == 2 and all(isinstance(n, str) for n in e) for e in edges):
        raise InvalidInputError(f"{where} edges must be [node, node] pairs, got {edges!r}")
    relieves = entry.get("relieves")
    return _wrap(
        where, lambda: Loading(entry["role"], tuple(times), needs, frozenset(edges), relieves)
    )


def _add_flow(state: ClusterState, entry: Mapping[str, Any], where: str) -> None:
    if "gbps" in entry and "bytes_per_s" in entry:
        raise InvalidInputError(f"{where} gives both gbps and bytes_per_s; give one")
    key = "gbps" if "gbps" in entry else "bytes_per_s"
    rate = entry.get(key)
    if rate is not None and not (is_number(rate) and rate > 0):
        raise InvalidInputError(f"{where} {key} must be a number > 0 (or absent), got {rate!r}")
    cap = float("inf") if rate is None else float(rate) * (GBPS if key == "gbps" else 1.0)
    until = entry.get("until_s", float("inf"))
    if not (is_number(until) and until > 0):
        raise InvalidInputError(f"{where} until_s must be a time > 0 (or absent), got {until!r}")
    if "edges" in entry:
        if "src" in entry or "dst" in entry:
            raise InvalidInputError(f"{where} gives edges and src/dst; give one")
        edges = [
            tuple(_list(e, f"{where} edges[{k}]"))
            for k, e in enumerate(_list(entry["edges"], f"{where} edges"))
        ]
        if not all(len(e) == 2 and all(isinstance(n, str) for n in e) for e in edges):
            raise InvalidInputError(f"{where} edges must be [node, node] pairs, got {edges!r}")
        flow = _wrap(where, lambda: Flow(tuple(edges), cap, str(entry.get("name", ""))))
        _wrap(where, lambda: state.add_flow(flow, until_s=float(until)))
        return
    if "until_s" in entry:
        raise InvalidInputError(f"{where} until_s needs the flow's edges (an earlier plan's step)")
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


def topology_of_entry(value: object, source: str, base: Path | None) -> Topology:
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
        extra = sorted(set(value) - {"config", "name", "revision", "weights_hash"})
        if extra:
            raise InvalidInputError(f"{where} has unknown key(s) {extra}")
        return _wrap(
            where,
            lambda: ModelSpec.from_config(
                value["config"],
                name=value.get("name"),
                revision=str(value.get("revision", "main")),
                weights_hash=value.get("weights_hash"),
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


def _removed(topology: Topology, entry: object, where: str) -> Topology:
    removed = _mapping(entry, where)
    extra = sorted(set(removed) - {"nodes", "links"})
    if extra:
        raise InvalidInputError(f"{where} has unknown key(s) {extra}; allowed: links, nodes")
    nodes = [str(n) for n in _list(removed.get("nodes", []), f"{where} nodes")]
    links = [
        tuple(_list(link, f"{where} links[{k}]"))
        for k, link in enumerate(_list(removed.get("links", []), f"{where} links"))
    ]
    return _wrap(where, lambda: topology.without(nodes=nodes, links=links))


def _add_copy(state: ClusterState, entry: Mapping[str, Any], index: int, source: str) -> None:
    where = f"state {source!r} host_copies[{index}]"
    if set(entry) != _COPY:
        raise InvalidInputError(
            f"{where} needs exactly the keys {sorted(_COPY)}, got {sorted(entry)}"
        )

    def add() -> None:
        identity = ModelIdentity(
            str(entry["name"]),
            str(entry["revision"]),
            str(entry["content_hash"]),
            str(entry["hash_kind"]),
        )
        host = str(entry["host"])
        size = entry["bytes"]
        if not isinstance(size, int) or size <= 0:
            raise InvalidInputError(f"bytes must be a positive integer, got {size!r}")
        state.pool.add(HostCopy(identity, host, state.topology.host_mem(host), size))

    _wrap(where, add)
