"""Cluster state files: the YAML/JSON a serving stack (or the CLI) describes its cluster in.

::

    topology: paper-a800-32            # a catalog name, a topology file, or an inline mapping
    models: [mistral-small-24b]        # one host copy each, placed at start
    instances:
      - {model: mistral-small-24b, gpus: [h0/gpu0, h0/gpu1], role: prefill,
         queue: [[0.0, 2048], [0.1, 512]], kv_bytes_used: 0, id: p0}
      - {model: mistral-small-24b, gpus: [h1/gpu0, h1/gpu1], role: loading, id: n0,
         loading: {role: decode, units_ready_s: [0.0, 0.1, ..., 0.5],    # per unit, from now
                   needs: [p0], edges: [[h0/gpu0, h0/nvswitch]]}}  # what the arrivals need
    background_flows:
      - {src: h0/gpu0, dst: h1/gpu0, gbps: 20}            # routed src -> dst
      - {edges: [[h0/nic0, leaf0], [leaf0, h1/nic0]], bytes_per_s: 2.5e9, name: kv}
      - {edges: [[h0/gpu2, h0/nic0]], bytes_per_s: 1.2e10, until_s: 0.42}   # ends (a plan's step)

A model is a preset name, a path to a config.json, or a mapping with ``config`` (and optional
``name``, ``revision``, ``weights_hash``). Every error names the entry it is about.

:func:`save_state` writes what :func:`~blitzplan.apply_plan` and :func:`~blitzplan.recover`
produce, and :func:`load_state` reads it back equal: the same keys plus ``removed`` (failed
``nodes`` and ``links`` taken out of the topology, as ``Topology.without`` does),
``host_copies`` (each model's host copy where it is, ``{name, revision, content_hash,
hash_kind, host, bytes}``, instead of ``models`` placing them), routed background flows with
their ``edges`` and exact ``bytes_per_s``, queued requests with their ids, and ``counters`` (the
ids the state handed out, so that none is handed out again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from blitzplan._checks import is_number
from blitzplan.cluster import ClusterState, HostCopy, Loading
from blitzplan.errors import BlitzplanError, InvalidInputError
from blitzplan.models import ModelIdentity, ModelSpec, list_models, load_model
from blitzplan.topologies import Flow, Topology, load_topology, topology_from_dict
from blitzplan.units import GBPS

__all__ = ["load_state", "save_state", "state_from_dict", "state_to_dict"]

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
_LOADING_OPTIONAL = {"needs", "edges"}
_FLOW = {"src", "dst", "edges", "gbps", "bytes_per_s", "name", "until_s"}
_COPY = {"name", "revision", "content_hash", "hash_kind", "host", "bytes"}


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
            f"{where} must be a mapping with role and units_ready_s (and optional needs, edges), "
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
    return _wrap(where, lambda: Loading(entry["role"], tuple(times), needs, frozenset(edges)))


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


# --- writing ---------------------------------------------------------------------------------


def save_state(state: ClusterState, path: str | Path, *, topology: object = None) -> None:
    """Write ``state`` as a state file (JSON for a ``.json`` path, else YAML) that
    :func:`load_state` reads back equal. ``topology`` is the file's ``topology`` entry (a
    catalog name, a path or a mapping; default: the topology's catalog name)."""
    data = state_to_dict(state, topology=topology)
    file = Path(path)
    if file.suffix == ".json":
        file.write_text(json.dumps(data, indent=1) + "\n")
    else:
        file.write_text(yaml.safe_dump(data, sort_keys=False))


def state_to_dict(state: ClusterState, *, topology: object = None) -> dict[str, Any]:
    """The contents of a state file for ``state`` (see :func:`save_state`)."""
    entry = topology if topology is not None else _base_name(state.topology)
    base = _topology(entry, "<save>", None)
    data: dict[str, Any] = {"topology": entry}
    removed = _difference(base, state.topology)
    if removed:
        data["removed"] = removed
    data["host_copies"] = [
        {
            "name": c.identity.name,
            "revision": c.identity.revision,
            "content_hash": c.identity.content_hash,
            "hash_kind": c.identity.hash_kind,
            "host": c.host,
            "bytes": c.bytes,
        }
        for c in state.pool.host_copies
    ]
    data["instances"] = [_instance_entry(inst) for inst in state.instances]
    data["background_flows"] = [_flow_entry(state, flow) for flow in state.background_flows]
    data["counters"] = state.counters
    return data


def _base_name(topology: Topology) -> str:
    name = topology.name
    while name.endswith(" (degraded)"):
        name = name.removesuffix(" (degraded)")
    return name


def _graph_parts(topology: Topology) -> tuple[dict[str, Any], dict[tuple[str, str], Any]]:
    nodes = {n: d for n, d in topology.graph.nodes(data=True)}
    return nodes, {(u, v): d for u, v, d in topology.graph.edges(data=True)}


def _difference(base: Topology, now: Topology) -> dict[str, Any]:
    """The nodes and links ``now`` lacks of ``base`` (``base.without`` of them is ``now``);
    InvalidInputError when ``now`` is not ``base`` less some parts."""
    base_nodes, base_links = _graph_parts(base)
    now_nodes, now_links = _graph_parts(now)
    nodes = sorted(set(base_nodes) - set(now_nodes))
    links = sorted(
        {tuple(sorted(e)) for e in set(base_links) - set(now_links) if set(e) <= set(now_nodes)}
    )
    if not nodes and not links and (base_nodes, base_links) == (now_nodes, now_links):
        return {}
    rebuilt = base.without(nodes=nodes, links=links)  # type: ignore[arg-type]
    if _graph_parts(rebuilt) != (now_nodes, now_links):
        raise InvalidInputError(
            f"the state's topology {now.name!r} is not its topology file less failed parts; "
            "pass topology= (the file's topology entry) to save it"
        )
    return {"nodes": nodes, "links": [list(link) for link in links]}


def _model_entry(spec: ModelSpec) -> object:
    if spec.name in list_models() and load_model(spec.name) == spec:
        return spec.name
    entry: dict[str, Any] = {"config": dict(spec.config), "name": spec.name}
    entry["revision"] = spec.revision
    if spec.weights_hash is not None:
        entry["weights_hash"] = spec.weights_hash
    return entry


def _instance_entry(inst: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": inst.id,
        "model": _model_entry(inst.model),
        "gpus": list(inst.gpus),
        "role": inst.role.value,
        "queue": [[q.arrival_s, q.prompt_tokens, q.id] for q in inst.queue],
        "kv_bytes_used": inst.kv_bytes_used,
    }
    if inst.loading is not None:
        entry["loading"] = {
            "role": inst.loading.role.value,
            "units_ready_s": list(inst.loading.units_ready_s),
        }
        if inst.loading.needs is not None:  # absent: unknown, so any failure leaves it stale
            entry["loading"]["needs"] = sorted(inst.loading.needs)
        if inst.loading.edges:
            entry["loading"]["edges"] = [list(e) for e in sorted(inst.loading.edges)]
    return entry


def _flow_entry(state: ClusterState, flow: Flow) -> dict[str, Any]:
    entry: dict[str, Any] = {"edges": [list(e) for e in flow.edges], "name": flow.name}
    if flow.max_bytes_per_s != float("inf"):
        entry["bytes_per_s"] = flow.max_bytes_per_s
    if state.flow_end_s(flow) != float("inf"):
        entry["until_s"] = state.flow_end_s(flow)
    return entry
