"""Where the new instances go, who may send, and what each link has left for weights.

Sources (holders): decode and idle instances of the model's identity (prefill ones only with
``allow_prefill_sources``; loading ones with known arrival times by the role they will take,
holding each unit from its arrival), each with the spare GPUs of its NVLink group whose NICs it
may send through, and the cluster's host-DRAM copy, sending through its host's NICs that no
instance source already uses. A prefill instance's GPUs are never exits under the paper's rule
(the default); with ``allow_prefill_sources`` they are exits only when every decode instance of
the model sits in their NVLink group, so the instance's KV caches never leave through its NICs.
Targets: one node per NVLink group holding new instances, with the group's spare GPUs as relays.
Spare GPUs are GPUs no instance occupies, not reserved for a new instance, not excluded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import TypedDict

from blitzplan.cluster import ClusterState, Instance, Role, check_tp_fits, memory_misfit
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.multicast.holdings import reshardable
from blitzplan.multicast.plan_types import NewInstance, NodeKind, PlanNode
from blitzplan.topologies import Edge, Topology, residual_after

__all__ = [
    "PLACEMENTS",
    "PrepareOptions",
    "Problem",
    "place_targets",
    "prepare",
    "residual_capacity",
]

PLACEMENTS = ("pack", "spread")
"""pack: fullest NVLink groups first (keeps groups whole); spread: one instance per group in
turn, so groups keep spare GPUs whose NICs relay stripes."""


@dataclass(frozen=True)
class Problem:
    """Everything a method needs: nodes to load, eligible sources, and link capacity left."""

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
    residual: Mapping[Edge, float]
    live_names: tuple[str, ...] = ()
    """The new instances that must be the live ones (empty: the planner chooses ``live``)."""

    @property
    def topology(self) -> Topology:
        return self.state.topology

    def missing_units(self, node: PlanNode) -> tuple[bool, ...]:
        """Per unit, whether ``node``'s GPUs still need it."""
        return tuple(not node.has(u) for u in range(len(self.unit_bytes)))

    def node_bytes(self, node: PlanNode) -> float:
        """Bytes of distinct shards the node still needs (every rank once)."""
        need = self.missing_units(node)
        return float(self.tp * sum(b for b, m in zip(self.unit_bytes, need, strict=True) if m))


class PrepareOptions(TypedDict):
    """The keyword arguments of :func:`prepare` besides ``placement``."""

    count: int | None
    targets: Sequence[Sequence[str]] | None
    tp: int
    live: int | Sequence[str]
    chunk_bytes: int
    startup_s: float | Mapping[str, float]
    exclude: Iterable[str]
    allow_prefill_sources: bool
    names: Sequence[str] | None
    delivered: Mapping[str, Sequence[bool]] | None
    need_sources: bool


def prepare(
    state: ClusterState,
    model: ModelSpec,
    *,
    count: int | None,
    targets: Sequence[Sequence[str]] | None,
    tp: int,
    live: int | Sequence[str],
    chunk_bytes: int,
    startup_s: float | Mapping[str, float],
    exclude: Iterable[str],
    allow_prefill_sources: bool,
    names: Sequence[str] | None = None,
    delivered: Mapping[str, Sequence[bool]] | None = None,
    placement: str = "pack",
    need_sources: bool = True,
) -> Problem:
    """Validate the request and lay out source and target nodes (no plan yet).

    ``live`` is how many new instances are live (the planner picks them) or their names.
    ``need_sources=False`` (data planes that read copies on every host) plans without holders.
    """
    model.check_tp(tp)
    check_tp_fits(state.topology, tp)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise InvalidInputError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    if placement not in PLACEMENTS:
        raise InvalidInputError(
            f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}"
        )
    excluded = _check_exclude(state, exclude)
    holders = _holders(state, model, tp, excluded, allow_prefill_sources) if need_sources else []
    groups = _target_groups(state, model, tp, count, targets, holders, placement)
    reserved = {gpu for group in groups for gpu in group}
    names = _names(names, len(groups))
    live, live_names = _live(live, names)
    present = _delivered(delivered, names, model.num_units)
    instances, nodes = _target_nodes(
        state,
        groups,
        tp,
        startup_s,
        names,
        present,
        reserved | excluded,
        _blocked_nics(state, allow_prefill_sources),
    )
    target_groups = {state.topology.nvlink_group_of(n.gpus[0]) for n in nodes}
    sources = _source_nodes(
        state, holders, excluded | reserved, allow_prefill_sources, target_groups
    )
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
        residual=residual_capacity(state),
        live_names=live_names,
    )


def _live(live: int | Sequence[str], names: list[str]) -> tuple[int, tuple[str, ...]]:
    if isinstance(live, str) or not isinstance(live, int | Sequence) or isinstance(live, bool):
        raise InvalidInputError(
            f"live must be a count in 0..{len(names)} or a list of new instance names, got {live!r}"
        )
    if isinstance(live, int):
        if not 0 <= live <= len(names):
            raise InvalidInputError(
                f"live must be an integer in 0..{len(names)} (the number of new instances), "
                f"got {live!r}"
            )
        return live, ()
    chosen = tuple(str(n) for n in live)
    unknown = [n for n in chosen if n not in names]
    if unknown or len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"live names {list(live)!r}; new instances: {names}")
    return len(chosen), chosen


def residual_capacity(state: ClusterState) -> dict[Edge, float]:
    """Each edge's capacity minus what the state's background flows use of it.

    Background flows (KV caches) take their max-min fair rates among themselves first: weights
    never slow serving traffic down; they use what is left."""
    return residual_after(state.background_flows, state.topology.capacity)


def _names(names: Sequence[str] | None, count: int) -> list[str]:
    if names is None:
        return [f"new{i}" for i in range(count)]
    if isinstance(names, str):
        raise InvalidInputError(f"names must be a list of instance names, got the string {names!r}")
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
    holders: Sequence[tuple[Instance | None, str | None]],
    placement: str,
) -> list[tuple[str, ...]]:
    if (count is None) == (targets is None):
        raise InvalidInputError("give exactly one of count and targets")
    if targets is not None:
        if isinstance(targets, str):
            raise InvalidInputError(f"targets must be a list of GPU groups, got {targets!r}")
        groups = [tuple(group) for group in targets]
        if not groups:
            raise InvalidInputError("targets must name at least one instance, got []")
        _check_explicit_targets(state, groups, tp)
        for group in groups:
            for gpu in group:
                misfit = memory_misfit(model, tp, state.topology.gpu_spec(gpu).memory_bytes)
                if misfit:
                    raise InfeasibleError(f"targets group {list(group)!r}: {misfit}")
        return groups
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InvalidInputError(f"count must be a positive integer, got {count!r}")
    topo = state.topology
    leaves: set[str | None] = set()
    for inst, memory in holders:
        if inst is not None:
            leaves |= {topo.leaf_of(g) for g in inst.gpus}
        elif memory is not None:
            host = str(topo.graph.nodes[memory]["host"])
            leaves |= {topo.leaf_of(g) for g in topo.gpus_of_host(host)}
    return place_targets(state, tp, count, prefer_leaves=leaves, placement=placement, model=model)


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


def place_targets(
    state: ClusterState,
    tp: int,
    count: int,
    *,
    prefer_leaves: Set[str | None] = frozenset(),
    placement: str = "pack",
    model: ModelSpec | None = None,
) -> list[tuple[str, ...]]:
    """The first ``count`` of :meth:`ClusterState.free_slots`; InfeasibleError when they do not
    fit."""
    slots = state.free_slots(tp, prefer_leaves=prefer_leaves, placement=placement, model=model)
    if len(slots) < count:
        raise InfeasibleError(
            f"count={count} new tp={tp} instances do not fit the free GPUs: room for {len(slots)}"
            + _misfit_note(state, tp, model)
        )
    return slots[:count]


def _misfit_note(state: ClusterState, tp: int, model: ModelSpec | None) -> str:
    """Why free GPUs do not count, when memory is the reason."""
    if model is None:
        return ""
    topo = state.topology
    reasons = {memory_misfit(model, tp, topo.gpu_spec(g).memory_bytes) for g in state.free_gpus()}
    reasons.discard(None)
    return "".join(f"; {reason}" for reason in sorted(r for r in reasons if r))


def _target_nodes(
    state: ClusterState,
    groups: list[tuple[str, ...]],
    tp: int,
    startup_s: float | Mapping[str, float],
    names: list[str],
    present: Mapping[str, tuple[bool, ...]],
    unavailable: set[str],
    blocked_nics: set[str],
) -> tuple[tuple[NewInstance, ...], tuple[PlanNode, ...]]:
    """One target node per NVLink group (and set of units already delivered). A GPU whose NIC
    carries a prefill instance's KV caches receives but never forwards."""
    topology = state.topology
    by_group: dict[tuple[tuple[str, ...], tuple[bool, ...]], list[int]] = {}
    for i, group in enumerate(groups):
        key = (topology.nvlink_group_of(group[0]), present[names[i]])
        by_group.setdefault(key, []).append(i)
    startups = _startups(startup_s, names)
    free = set(state.free_gpus())
    pool = _pcie_relay_pools(topology, by_group, free - unavailable - set(sum(groups, ())))
    relay_taken: set[str] = set()
    nodes: list[PlanNode] = []
    node_of: dict[int, int] = {}
    for (nvlink, mask), members in by_group.items():
        node_id = len(nodes)
        gpus = tuple(gpu for i in members for gpu in groups[i])
        relays = tuple(  # a node holding units from before forwards from its instance GPUs
            g
            for g in pool.get((nvlink, mask), nvlink)
            if g in free
            and g not in unavailable
            and g not in relay_taken
            and all(topology.has_path(g, x) for x in gpus)
        )
        relay_taken |= set(relays)
        nodes.append(
            PlanNode(
                node_id,
                NodeKind.TARGET,
                "+".join(names[i] for i in members),
                gpus=gpus,
                exits=tuple(
                    g for g in gpus + relays if _wired(topology, topology.nic_of(g), blocked_nics)
                ),
                relays=relays,
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


def _pcie_relay_pools(
    topology: Topology,
    by_group: Mapping[tuple[tuple[str, ...], tuple[bool, ...]], list[int]],
    spare: Set[str],
) -> dict[tuple[tuple[str, ...], tuple[bool, ...]], tuple[str, ...]]:
    """Relay candidates of target nodes on hosts without NVLink (one GPU per node): the host's
    spare GPUs without NVLink, dealt round-robin to the host's target nodes (they forward what
    their NICs receive over PCIe). Nodes in an NVLink group are not listed (their group's spares
    relay over NVLink)."""
    by_host: dict[str, list[tuple[tuple[str, ...], tuple[bool, ...]]]] = {}
    for key in by_group:
        nvlink, _ = key
        if len(nvlink) == 1:
            by_host.setdefault(topology.host_of(nvlink[0]), []).append(key)
    pools: dict[tuple[tuple[str, ...], tuple[bool, ...]], tuple[str, ...]] = {}
    for host, keys in by_host.items():
        candidates = [
            g
            for g in topology.gpus_of_host(host)
            if g in spare and len(topology.nvlink_group_of(g)) == 1
        ]
        for k, key in enumerate(keys):
            pools[key] = tuple(candidates[k :: len(keys)])
    return pools


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
    topo, ids = state.topology, {inst.id for inst in state.instances}
    for item in items:
        if item not in ids and item not in topo.graph.nodes and item not in topo.hosts():
            raise InvalidInputError(
                f"exclude names {item!r}, which is neither an instance, a node nor a host"
            )
    return items


def _holders(
    state: ClusterState, model: ModelSpec, tp: int, excluded: set[str], allow_prefill: bool
) -> list[tuple[Instance | None, str | None]]:
    """Eligible holders: ``(instance, None)`` or ``(None, host memory)``. An instance of another
    TP degree holds byte-exact stripes only where the layout says so
    (:func:`~blitzplan.multicast.holdings.reshardable`); elsewhere it is no holder."""
    topo = state.topology
    every = state.sources(model)
    if not every:
        raise InfeasibleError(f"no source holds model {model.identity}")
    usable = []
    for source in every:
        names = set(source.nodes) | ({source.host} if source.host else set())
        if source.instance is not None:
            names |= {source.instance.id} | {topo.host_of(g) for g in source.nodes}
        if not names & excluded:
            usable.append(source)
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


def _kv_leaves_group(state: ClusterState, inst: Instance) -> bool:
    """Whether a prefill instance sends KV caches out of its NVLink group (over its NICs)."""
    group = set(state.topology.nvlink_group_of(inst.gpus[0]))
    return any(
        other.serving_role is Role.DECODE
        and other.identity == inst.identity
        and not set(other.gpus) <= group
        for other in state.instances
    )


def _source_nodes(
    state: ClusterState,
    holders: list[tuple[Instance | None, str | None]],
    unavailable: set[str],
    allow_prefill: bool,
    target_groups: set[tuple[str, ...]],
) -> tuple[PlanNode, ...]:
    """Holders as nodes. An instance sends through its own GPUs (unless they carry its KV) and a
    share of the spare GPUs of its NVLink group when no new instance lands in that group (those
    spares relay for the new instances instead)."""
    topo = state.topology
    free = set(state.free_gpus())
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
    blocked = _blocked_nics(state, allow_prefill)
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
            if _wired(topo, topo.nic_of(g), blocked)
        )
        nodes.append(
            PlanNode(
                len(nodes),
                NodeKind.INSTANCE,
                f"{inst.id} ({inst.role.value})",
                gpus=inst.gpus,
                exits=exits,
                instance_id=inst.id,
                tp=inst.tp,
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
            and _wired(topo, n, blocked)
            and topo.has_path(memory, n)
        )
        nodes.append(
            PlanNode(len(nodes), NodeKind.HOST, f"host copy on {host}", memory=memory, exits=nics)
        )
    return tuple(nodes)


def _wired(topology: Topology, nic: str, blocked: set[str]) -> bool:
    """Whether weights may leave by ``nic``: it reaches a leaf and carries no prefill KV."""
    return nic not in blocked and topology.leaf_of_nic(nic) is not None


def _blocked_nics(state: ClusterState, allow_prefill: bool) -> set[str]:
    """NICs that carry a prefill instance's KV caches (never weight exits)."""
    topo = state.topology
    return {
        topo.nic_of(g)
        for inst in state.instances
        if inst.serving_role is Role.PREFILL
        and (not allow_prefill or _kv_leaves_group(state, inst))
        for g in inst.gpus
    }
