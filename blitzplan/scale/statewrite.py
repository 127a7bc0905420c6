"""Writing a cluster state file's contents (see :mod:`blitzplan.scale.statefile` for the format)
that :func:`~blitzplan.scale.stateread.state_from_dict` reads back equal."""

from __future__ import annotations

from typing import Any

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, list_models, load_model
from blitzplan.scale.stateread import topology_of_entry
from blitzplan.topologies import Flow, Topology

__all__ = ["state_to_dict"]


def state_to_dict(state: ClusterState, *, topology: object = None) -> dict[str, Any]:
    """The contents of a state file for ``state`` (see
    :func:`~blitzplan.scale.statefile.save_state`)."""
    entry = topology if topology is not None else _base_name(state.topology)
    base = topology_of_entry(entry, "<save>", None)
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
        if inst.loading.relieves is not None:
            entry["loading"]["relieves"] = inst.loading.relieves
    return entry


def _flow_entry(state: ClusterState, flow: Flow) -> dict[str, Any]:
    entry: dict[str, Any] = {"edges": [list(e) for e in flow.edges], "name": flow.name}
    if flow.max_bytes_per_s != float("inf"):
        entry["bytes_per_s"] = flow.max_bytes_per_s
    if state.flow_end_s(flow) != float("inf"):
        entry["until_s"] = state.flow_end_s(flow)
    return entry
