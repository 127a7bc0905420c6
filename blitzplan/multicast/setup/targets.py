"""Where the new instances go: NVLink groups for them (given or placed on free slots), and one
target node per group with the group's spare GPUs as relays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set

from blitzplan.cluster import ClusterState, Instance, memory_misfit
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.multicast.plan_types import NewInstance, NodeKind, PlanNode
from blitzplan.multicast.setup.sources import wired
from blitzplan.topologies import Topology

__all__ = ["place_targets", "target_gpu_groups", "target_nodes"]


def target_gpu_groups(
    state: ClusterState,
    model: ModelSpec,
    tp: int,
    count: int | None,
    targets: Sequence[Sequence[str]] | None,
    holders: Sequence[tuple[Instance | None, str | None]],
    placement: str,
    free: Set[str],
) -> list[tuple[str, ...]]:
    """The GPU groups of the new instances: ``targets`` checked (on the state's ``free`` GPUs),
    or ``count`` placed."""
    if (count is None) == (targets is None):
        raise InvalidInputError("give exactly one of count and targets")
    if targets is not None:
        if isinstance(targets, str):
            raise InvalidInputError(f"targets must be a list of GPU groups, got {targets!r}")
        groups = [tuple(group) for group in targets]
        if not groups:
            raise InvalidInputError("targets must name at least one instance, got []")
        _check_explicit_targets(state, groups, tp, free)
        misfits: dict[float, str | None] = {}  # per GPU memory size (a fleet has one or two)
        for group in groups:
            for gpu in group:
                size = state.topology.gpu_spec(gpu).memory_bytes
                if size not in misfits:
                    misfits[size] = memory_misfit(model, tp, size)
                if misfits[size]:
                    raise InfeasibleError(f"targets group {list(group)!r}: {misfits[size]}")
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


def _check_explicit_targets(
    state: ClusterState, groups: list[tuple[str, ...]], tp: int, free: Set[str]
) -> None:
    topo = state.topology
    known = topo.graph.nodes
    seen: set[str] = set()
    for group in groups:
        if len(group) != tp:
            raise InvalidInputError(f"targets group {list(group)!r} must have tp={tp} GPUs")
        for gpu in group:
            if gpu not in known or topo.kind(gpu) != "gpu":
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


def target_nodes(
    state: ClusterState,
    groups: list[tuple[str, ...]],
    tp: int,
    startup_s: float | Mapping[str, float],
    names: list[str],
    present: Mapping[str, tuple[bool, ...]],
    unavailable: set[str],
    blocked_nics: Set[str],
    free: Set[str],
) -> tuple[tuple[NewInstance, ...], tuple[PlanNode, ...]]:
    """One target node per NVLink group (and set of units already delivered), with relays from
    the state's ``free`` GPUs. A GPU whose NIC carries a prefill instance's KV caches receives
    but never forwards."""
    topology = state.topology
    by_group: dict[tuple[tuple[str, ...], tuple[bool, ...]], list[int]] = {}
    for i, group in enumerate(groups):
        key = (topology.nvlink_group_of(group[0]), present[names[i]])
        by_group.setdefault(key, []).append(i)
    startups = _startups(startup_s, names)
    pool = _pcie_relay_pools(
        topology, by_group, free - unavailable - {g for gr in groups for g in gr}
    )
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
                    g for g in gpus + relays if wired(topology, topology.nic_of(g), blocked_nics)
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
