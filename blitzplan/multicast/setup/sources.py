"""Who may send: the eligible holders of a model and their exits, as source plan nodes
(see :mod:`~blitzplan.multicast.setup.problem` for the rules).
"""

from __future__ import annotations

from collections.abc import Iterable, Set

from blitzplan.cluster import ClusterState, Instance, Role, Source
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.multicast.plan_types import NodeKind, PlanNode, built
from blitzplan.multicast.setup.holdings import reshardable
from blitzplan.topologies import Topology

__all__ = ["blocked_nics", "check_exclude", "eligible_holders", "source_nodes", "wired"]


def check_exclude(state: ClusterState, exclude: Iterable[str]) -> set[str]:
    if isinstance(exclude, str):
        raise InvalidInputError(
            f"exclude must be a collection of names, got the string {exclude!r}"
        )
    items = set(exclude)
    topo, ids = state.topology, {inst.id for inst in state.instances}
    for item in items:
        if item not in ids and item not in topo.graph.nodes and item not in topo.hosts():
            raise InvalidInputError(
                f"exclude names {item!r}, which is neither an instance, a node nor a host"
            )
    return items


def eligible_holders(
    state: ClusterState, model: ModelSpec, tp: int, excluded: set[str], allow_prefill: bool
) -> list[tuple[Instance | None, str | None]]:
    """Eligible holders: ``(instance, None)`` or ``(None, host memory)``. An instance of another
    TP degree holds byte-exact stripes only where the layout says so
    (:func:`~blitzplan.multicast.setup.holdings.reshardable`); elsewhere it is no holder."""
    topo = state.topology
    every = state.sources(model)
    if not every:
        raise InfeasibleError(f"no source holds model {model.identity}")
    usable = [s for s in every if not excluded or not _excluded(topo, s, excluded)]
    if not usable:
        raise InfeasibleError(
            f"no source of model {model.identity} is left: all of "
            f"{[s.instance.id if s.instance else f'host copy on {s.host}' for s in every]} "
            "are excluded"
        )
    exact = [s for s in usable if s.instance is None or reshardable(model, tp, s.instance.tp)]
    if not exact:
        raise InfeasibleError(
            f"model {model.identity} is held only by instances of tp="
            f"{sorted({s.instance.tp for s in usable if s.instance})}, whose rank buffers hold no "
            f"byte-exact stripes of a tp={tp} buffer (the model's layout grid is too coarse: "
            "Layout.exact_for)"
        )
    holders: list[tuple[Instance | None, str | None]] = [
        (s.instance, None)
        for s in exact
        if s.instance is not None and (allow_prefill or s.instance.serving_role is not Role.PREFILL)
    ]
    holders += [(None, s.nodes[0]) for s in exact if s.kind == "host"]
    if not holders:
        raise InfeasibleError(
            f"model {model.identity} is held only by prefill instances, whose egress carries KV "
            "caches; pass allow_prefill_sources=True to use them"
        )
    return holders


def _excluded(topo: Topology, source: Source, excluded: set[str]) -> bool:
    """Whether ``excluded`` names one of the source's nodes, its host (a host copy's, or an
    instance GPU's), or its instance."""
    if source.host and source.host in excluded:
        return True
    if any(n in excluded for n in source.nodes):
        return True
    inst = source.instance
    return inst is not None and (
        inst.id in excluded or any(topo.host_of(g) in excluded for g in source.nodes)
    )


def _kv_leaves_group(state: ClusterState, inst: Instance) -> bool:
    """Whether a prefill instance sends KV caches out of its NVLink group (over its NICs)."""
    group = set(state.topology.nvlink_group_of(inst.gpus[0]))
    return any(
        other.serving_role is Role.DECODE
        and other.identity == inst.identity
        and not set(other.gpus) <= group
        for other in state.instances
    )


def source_nodes(
    state: ClusterState,
    holders: list[tuple[Instance | None, str | None]],
    unavailable: set[str],
    allow_prefill: bool,
    target_groups: set[tuple[str, ...]],
    blocked: Set[str],
    free: Set[str],
) -> tuple[PlanNode, ...]:
    """Holders as nodes. An instance sends through its own GPUs (unless they carry its KV) and a
    share of the spare GPUs of its NVLink group when no new instance lands in that group (those
    spares relay for the new instances instead); ``blocked`` are :func:`blocked_nics`, ``free``
    the state's free GPUs."""
    topo = state.topology
    instances = [inst for inst, _ in holders if inst is not None]
    helpers: dict[str, list[str]] = {inst.id: [] for inst in instances}
    by_group: dict[tuple[str, ...], list[Instance]] = {}
    for inst in instances:
        by_group.setdefault(topo.nvlink_group_of(inst.gpus[0]), []).append(inst)
    for group, members in by_group.items():
        if group in target_groups:
            continue
        spare = [g for g in group if g in free and g not in unavailable]
        for j, gpu in enumerate(spare):
            helpers[members[j % len(members)].id].append(gpu)
    nodes: list[PlanNode] = []
    for inst in instances:
        own: tuple[str, ...] = inst.gpus
        if inst.serving_role is Role.PREFILL and (
            not allow_prefill or _kv_leaves_group(state, inst)
        ):
            own = ()
        exits = tuple(
            g
            for g in own + tuple(h for h in helpers[inst.id] if topo.has_path(inst.gpus[0], h))
            if wired(topo, topo.nic_of(g), blocked)
        )
        nodes.append(
            built(  # PlanNode(...) without its frozen __init__: one per serving instance
                PlanNode,
                id=len(nodes),
                kind=NodeKind.INSTANCE,
                label=f"{inst.id} ({inst.role.value})",
                gpus=inst.gpus,
                memory=None,
                exits=exits,
                relays=(),
                instance_id=inst.id,
                tp=inst.tp,
                present=(),
                ready_s=inst.loading.units_ready_s if inst.loading is not None else (),
            )
        )
    used_nics = {topo.nic_of(g) for node in nodes for g in node.exits}
    for _, memory in holders:
        if memory is None:
            continue
        host = str(topo.graph.nodes[memory]["host"])
        nics = tuple(
            n
            for n in topo.nics_of_host(host)
            if n not in used_nics
            and n not in unavailable
            and wired(topo, n, blocked)
            and topo.has_path(memory, n)
        )
        nodes.append(
            PlanNode(len(nodes), NodeKind.HOST, f"host copy on {host}", memory=memory, exits=nics)
        )
    return tuple(nodes)


def wired(topology: Topology, nic: str, blocked: Set[str]) -> bool:
    """Whether weights may leave by ``nic``: it reaches a leaf and carries no prefill KV."""
    return nic not in blocked and topology.leaf_of_nic(nic) is not None


def blocked_nics(state: ClusterState, allow_prefill: bool) -> set[str]:
    """NICs that carry a prefill instance's KV caches (never weight exits)."""
    topo = state.topology
    return {
        topo.nic_of(g)
        for inst in state.instances
        if inst.serving_role is Role.PREFILL
        and (not allow_prefill or _kv_leaves_group(state, inst))
        for g in inst.gpus
    }
