"""Where the new instances go, which sources may send, and how a hop's lanes are laid out."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from blitzplan.cluster import ClusterState, Role, Source
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.multicast.types import NewInstance, NodeKind, PlanNode
from blitzplan.topologies import Topology

__all__ = [
    "Problem",
    "available_slots",
    "hop_lanes",
    "place_targets",
    "prepare",
]


@dataclass(frozen=True)
class Problem:
    """Everything a method needs: the nodes and instances to load and the eligible sources."""

    state: ClusterState
    model: ModelSpec
    tp: int
    unit_bytes: tuple[int, ...]
    chunk_bytes: int
    sources: tuple[PlanNode, ...]
    targets: tuple[PlanNode, ...]
    instances: tuple[NewInstance, ...]
    live: int
    allow_prefill_sources: bool
    delivered: Mapping[str, tuple[bool, ...]]

    @property
    def topology(self) -> Topology:
        return self.state.topology


def prepare(
    state: ClusterState,
    model: ModelSpec,
    *,
    count: int | None,
    targets: Sequence[Sequence[str]] | None,
    tp: int,
    live: int,
    chunk_bytes: int,
    startup_s: float | Mapping[str, float],
    exclude: Iterable[str],
    allow_prefill_sources: bool,
    names: Sequence[str] | None = None,
    delivered: Mapping[str, Sequence[bool]] | None = None,
) -> Problem:
    """Validate the request and lay out target and source nodes (no plan yet).

    ``names`` name the new instances (default ``new0, new1, ...``); ``delivered`` marks, per
    name, the units an earlier plan already delivered to it.
    """
    model.check_tp(tp)
    _check_tp_fits(state.topology, tp)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise InvalidInputError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    excluded = _check_exclude(state, exclude)
    candidates = _source_nodes(state, model, excluded, allow_prefill_sources, reserved=set())
    groups = _target_groups(state, model, tp, count, targets, candidates)
    reserved = {gpu for group in groups for gpu in group}
    sources = _source_nodes(state, model, excluded, allow_prefill_sources, reserved=reserved)
    if isinstance(live, bool) or not isinstance(live, int) or not 0 <= live <= len(groups):
        raise InvalidInputError(
            f"live must be an integer in 0..{len(groups)} (the number of new instances), "
            f"got {live!r}"
        )
    names = _names(names, len(groups))
    present = _delivered(delivered, names, model.num_units)
    instances, nodes = _target_nodes(state.topology, groups, tp, startup_s, names, present)
    return Problem(
        state=state,
        model=model,
        tp=tp,
        unit_bytes=model.shard(tp).unit_bytes,
        chunk_bytes=chunk_bytes,
        sources=sources,
        targets=nodes,
        instances=instances,
        live=live,
        allow_prefill_sources=allow_prefill_sources,
        delivered={n: p for n, p in present.items() if any(p)},
    )


def _names(names: Sequence[str] | None, count: int) -> list[str]:
    if names is None:
        return [f"new{i}" for i in range(count)]
    result = [str(n) for n in names]
    if len(result) != count or len(set(result)) != count:
        raise InvalidInputError(
            f"names must give {count} distinct instance names, got {list(names)!r}"
        )
    return result


def _delivered(
    delivered: Mapping[str, Sequence[bool]] | None, names: list[str], units: int
) -> dict[str, tuple[bool, ...]]:
    given = dict(delivered or {})
    unknown = set(given) - set(names)
    if unknown:
        raise InvalidInputError(f"delivered names unknown instance(s) {sorted(unknown)!r}")
    result = {}
    for name in names:
        mask = tuple(bool(x) for x in given.get(name, (False,) * units))
        if len(mask) != units:
            raise InvalidInputError(f"delivered[{name!r}] must mark {units} units, got {len(mask)}")
        result[name] = mask
    return result


# --- targets ---------------------------------------------------------------------------------


def _target_groups(
    state: ClusterState,
    model: ModelSpec,
    tp: int,
    count: int | None,
    targets: Sequence[Sequence[str]] | None,
    sources: Sequence[PlanNode],
) -> list[tuple[str, ...]]:
    if (count is None) == (targets is None):
        raise InvalidInputError("give exactly one of count and targets")
    if targets is not None:
        groups = [tuple(group) for group in targets]
        if not groups:
            raise InvalidInputError("targets must name at least one instance, got []")
        _check_explicit_targets(state, groups, tp)
        return groups
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidInputError(f"count must be a positive integer, got {count!r}")
    source_leaves = {state.topology.leaf_of(gpu) for node in sources for gpu in node.gpus} | {
        state.topology.leaf_of(g)
        for node in sources
        if node.memory
        for g in state.topology.gpus_of_host(_host_of_memory(state.topology, node.memory))
    }
    return place_targets(state, tp, count, prefer_leaves=source_leaves)


def _check_tp_fits(topology: Topology, tp: int) -> None:
    largest = max(len(topology.nvlink_group_of(g)) for g in topology.gpus())
    if tp > largest:
        raise InvalidInputError(f"tp={tp} is larger than the largest NVLink group ({largest} GPUs)")


def _check_explicit_targets(state: ClusterState, groups: list[tuple[str, ...]], tp: int) -> None:
    topo = state.topology
    free = set(state.free_gpus())
    known = set(topo.gpus())
    seen: set[str] = set()
    for group in groups:
        if len(group) != tp:
            raise InvalidInputError(f"targets group {list(group)!r} must have tp={tp} GPUs")
        for gpu in group:
            if gpu not in known:
                raise InvalidInputError(
                    f"targets names {gpu!r}, which is not a GPU of the topology"
                )
            if gpu not in free:
                raise InvalidInputError(f"targets names {gpu!r}, which is not free")
            if gpu in seen:
                raise InvalidInputError(f"targets names {gpu!r} twice")
            seen.add(gpu)
        if tp > 1 and not set(group) <= set(topo.nvlink_group_of(group[0])):
            raise InvalidInputError(
                f"targets group {list(group)!r} is not inside one NVLink group; a TP group must be"
            )


def available_slots(
    state: ClusterState, tp: int, *, prefer_leaves: Set[str | None] = frozenset()
) -> list[tuple[str, ...]]:
    """Every free TP group in placement order: each inside one NVLink group, fullest groups
    first (so more instances share a group and receive sharded), then groups under a source's
    leaf, then topology order."""
    topo = state.topology
    _check_tp_fits(topo, tp)
    free = set(state.free_gpus())
    groups: dict[tuple[str, ...], list[str]] = {}
    for gpu in topo.gpus():
        if gpu in free:
            groups.setdefault(topo.nvlink_group_of(gpu), []).append(gpu)
    order = sorted(
        groups.items(),
        key=lambda kv: (
            -(len(kv[1]) // tp),
            topo.leaf_of(kv[0][0]) not in prefer_leaves,
            topo.gpu_position(kv[0][0]),
        ),
    )
    return [
        tuple(gpus[start : start + tp])
        for _, gpus in order
        for start in range(0, len(gpus) - tp + 1, tp)
    ]


def place_targets(
    state: ClusterState,
    tp: int,
    count: int,
    *,
    prefer_leaves: Set[str | None] = frozenset(),
) -> list[tuple[str, ...]]:
    """The first ``count`` of :func:`available_slots`; InfeasibleError when they do not fit."""
    slots = available_slots(state, tp, prefer_leaves=prefer_leaves)
    if len(slots) < count:
        raise InfeasibleError(
            f"count={count} new tp={tp} instances do not fit the free GPUs: room for {len(slots)}"
        )
    return slots[:count]


def _target_nodes(
    topology: Topology,
    groups: list[tuple[str, ...]],
    tp: int,
    startup_s: float | Mapping[str, float],
    names: list[str],
    present: Mapping[str, tuple[bool, ...]],
) -> tuple[tuple[NewInstance, ...], tuple[PlanNode, ...]]:
    """One target node per NVLink group (and set of units already delivered)."""
    by_group: dict[tuple[tuple[str, ...], tuple[bool, ...]], list[int]] = {}
    for i, group in enumerate(groups):
        key = (topology.nvlink_group_of(group[0]), present[names[i]])
        by_group.setdefault(key, []).append(i)
    startups = _startups(startup_s, names)
    nodes: list[PlanNode] = []
    node_of: dict[int, int] = {}
    for (_, mask), members in by_group.items():
        node_id = len(nodes)
        gpus = tuple(gpu for i in members for gpu in groups[i])
        label = "+".join(names[i] for i in members)
        nodes.append(
            PlanNode(
                node_id,
                NodeKind.TARGET,
                label,
                gpus=gpus,
                egress=tuple((g, g) for g in gpus),
                stripes=len(members),
                tp=tp,
                present=mask if any(mask) else (),
            )
        )
        for i in members:
            node_of[i] = node_id
    instances = tuple(
        NewInstance(names[i], groups[i], node_of[i], startups[names[i]]) for i in range(len(groups))
    )
    return instances, tuple(nodes)


def _startups(startup_s: float | Mapping[str, float], names: list[str]) -> dict[str, float]:
    if isinstance(startup_s, Mapping):
        unknown = set(startup_s) - set(names)
        if unknown:
            raise InvalidInputError(
                f"startup_s names unknown instance(s) {sorted(unknown)!r}; new instances: {names}"
            )
        values = {name: float(startup_s.get(name, 0.0)) for name in names}
    else:
        values = {name: float(startup_s) for name in names}
    for name, value in values.items():
        if not 0 <= value < math.inf:
            raise InvalidInputError(f"startup_s of {name} must be finite and >= 0, got {value!r}")
    return values


# --- sources ---------------------------------------------------------------------------------


def _check_exclude(state: ClusterState, exclude: Iterable[str]) -> set[str]:
    if isinstance(exclude, str):
        raise InvalidInputError(
            f"exclude must be a collection of names, got the string {exclude!r}"
        )
    items = set(exclude)
    topo = state.topology
    known = {inst.id for inst in state.instances} | set(topo.graph.nodes) | set(topo.hosts())
    for item in items:
        if item not in known:
            raise InvalidInputError(
                f"exclude names {item!r}, which is neither an instance, a node nor a host"
            )
    return items


def _is_excluded(source: Source, topology: Topology, excluded: set[str]) -> bool:
    names = set(source.nodes)
    if source.instance is not None:
        names.add(source.instance.id)
        names |= {topology.host_of(g) for g in source.nodes}
    if source.host is not None:
        names.add(source.host)
    return bool(names & excluded)


def _source_nodes(
    state: ClusterState,
    model: ModelSpec,
    excluded: set[str],
    allow_prefill: bool,
    *,
    reserved: set[str],
) -> tuple[PlanNode, ...]:
    """Eligible sources as nodes: instances (decode/idle, prefill only when allowed), else the
    host copy. Each instance stripes over its own GPUs' NICs and a share of the spare GPUs of its
    NVLink group (GPUs not serving prefill, not ``reserved`` for new instances, not excluded)."""
    topo = state.topology
    every = state.sources(model)
    if not every:
        raise InfeasibleError(f"no source holds model {model.identity}")
    usable = [s for s in every if not _is_excluded(s, topo, excluded)]
    if not usable:
        raise InfeasibleError(
            f"no source of model {model.identity} is left: all of "
            f"{[_source_label(s) for s in every]} are excluded"
        )
    instances = [
        s
        for s in usable
        if s.instance is not None and (allow_prefill or s.instance.role is not Role.PREFILL)
    ]
    if instances:
        return _instance_nodes(state, instances, excluded | reserved, allow_prefill)
    hosts = [s for s in usable if s.kind == "host"]
    if not hosts:
        raise InfeasibleError(
            f"model {model.identity} is held only by prefill instances, whose egress carries KV "
            "caches; pass allow_prefill_sources=True to use them"
        )
    memory = hosts[0].nodes[0]
    host = _host_of_memory(topo, memory)
    egress = tuple((memory, nic) for nic in topo.nics_of_host(host))
    return (PlanNode(0, NodeKind.HOST, f"host copy on {host}", memory=memory, egress=egress),)


def _source_label(source: Source) -> str:
    return source.instance.id if source.instance else f"host copy on {source.host}"


def _instance_nodes(
    state: ClusterState, sources: list[Source], excluded: set[str], allow_prefill: bool
) -> tuple[PlanNode, ...]:
    topo = state.topology
    source_gpus = {g for s in sources for g in s.nodes}
    prefill_gpus = {
        g
        for inst in state.instances
        if inst.role is Role.PREFILL and not allow_prefill
        for g in inst.gpus
    }
    helpers_of: dict[int, list[str]] = {i: [] for i in range(len(sources))}
    by_group: dict[tuple[str, ...], list[int]] = {}
    for i, s in enumerate(sources):
        by_group.setdefault(topo.nvlink_group_of(s.nodes[0]), []).append(i)
    for group, members in by_group.items():
        spare = [
            g
            for g in group
            if g not in source_gpus
            and g not in prefill_gpus
            and g not in excluded
            and g in topo.gpus()
        ]
        for j, gpu in enumerate(spare):
            helpers_of[members[j % len(members)]].append(gpu)
    nodes = []
    for i, s in enumerate(sources):
        own = s.nodes
        egress = tuple((g, g) for g in own) + tuple(
            (own[j % len(own)], h) for j, h in enumerate(helpers_of[i])
        )
        inst = s.instance
        label = f"{inst.id} ({inst.role.value})" if inst else "source"
        nodes.append(
            PlanNode(
                i,
                NodeKind.INSTANCE,
                label,
                gpus=own,
                egress=egress,
                instance_id=inst.id if inst else None,
                tp=len(own),
            )
        )
    return tuple(sorted(nodes, key=lambda n: (-len(n.egress), n.id)))


def _host_of_memory(topology: Topology, memory: str) -> str:
    return str(topology.graph.nodes[memory]["host"])


# --- lanes -----------------------------------------------------------------------------------


def hop_lanes(
    sender: PlanNode, receiver: PlanNode, *, full_shard: bool = False
) -> list[tuple[str, str, str, float, int]]:
    """Lanes ``(holder, exit, dst, fraction, stripe)`` from ``sender`` to ``receiver``.

    Receiving GPU ``a * tp + r`` (instance ``a``, rank ``r``) gets stripe ``a`` of rank ``r``:
    ``1/stripes`` of its shard (``full_shard``: all of it, as stripe 0). It comes from a sender
    egress whose holder has the same rank (any egress when the sender is memory or its TP
    differs), taking those egresses in turn so the lanes spread over all of them.
    """
    m = 1 if full_shard else receiver.stripes
    groups: dict[int, list[tuple[str, str]]] = {}
    for holder, exit_ in sender.egress:
        rank = sender.gpus.index(holder) % sender.tp if holder in sender.gpus else 0
        groups.setdefault(rank, []).append((holder, exit_))
    rank_aware = sender.tp == receiver.tp and len(groups) == receiver.tp
    used: dict[int, int] = {}
    lanes = []
    for i, dst in enumerate(receiver.gpus):
        a, r = divmod(i, receiver.tp)
        key = r if rank_aware else min(groups)
        options = groups[key] if rank_aware else list(sender.egress)
        k = used.get(key, 0)
        used[key] = k + 1
        holder, exit_ = options[k % len(options)]
        lanes.append((holder, exit_, dst, 1.0 / m, 0 if full_shard else a))
    return lanes
