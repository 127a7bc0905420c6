"""The cluster state: instances on GPUs, the parameter pool and background flows of one cluster."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import replace
from typing import Any

from blitzplan.cluster.background import BackgroundFlows
from blitzplan.cluster.gpufit import check_tp_fits, memory_misfit
from blitzplan.cluster.hostpool import ParameterPool
from blitzplan.cluster.naming import IdCounters
from blitzplan.cluster.records import (
    Instance,
    Loading,
    QueuedRequest,
    Role,
    Source,
    check_kv,
    check_loading,
    parse_role,
)
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, load_model
from blitzplan.topologies import Flow, Topology

__all__ = ["ClusterState"]


class ClusterState:
    """Instances, free GPUs, the parameter pool and background flows of one cluster.

    >>> from blitzplan import load_topology
    >>> state = ClusterState(load_topology("h200-8"), models=["llama-3-8b"])
    >>> inst = state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")
    >>> [s.kind for s in state.sources("llama-3-8b")]
    ['instance', 'host']
    """

    def __init__(self, topology: Topology, *, models: Iterable[ModelSpec | str] = ()) -> None:
        if not isinstance(topology, Topology):
            raise InvalidInputError(f"topology must be a Topology, got {type(topology).__name__}")
        self.topology = topology
        self.pool = ParameterPool(topology)
        self._instances: dict[str, Instance] = {}
        self._background = BackgroundFlows(topology)
        self._ids = IdCounters()
        self.pool.place(_spec(m) for m in models)

    def copy(self) -> ClusterState:
        """An independent copy: same topology, host copies, instances, background flows and
        counters of the ids handed out."""
        other = ClusterState(self.topology)  # no models: nothing placed, nothing searched
        other.pool._copies = dict(self.pool._copies)
        other._instances = dict(self._instances)
        other._background = self._background.copy()
        other._ids = self._ids.copy()
        return other

    def __repr__(self) -> str:
        roles = Counter(inst.role.value for inst in self._instances.values())
        copies = [f"{c.identity.name}@{c.host}" for c in self.pool.host_copies]
        return (
            f"ClusterState({self.topology.name!r}, instances={len(self._instances)} "
            f"({', '.join(f'{n} {r}' for r, n in sorted(roles.items())) or 'none'}), "
            f"free_gpus={len(self.free_gpus())}, host_copies={copies}, "
            f"background_flows={len(self._background.flows)})"
        )

    def __eq__(self, other: object) -> bool:
        """Equal states: the same topology (name, nodes and links), instances, host copies and
        background flows (in any order) with their ends. The id counters are not compared."""
        if not isinstance(other, ClusterState):
            return NotImplemented
        return (
            _same_topology(self.topology, other.topology)
            and self._instances == other._instances
            and self.pool._copies == other.pool._copies
            and self._background == other._background
        )

    __hash__ = None  # type: ignore[assignment]  # a mutable state is no dict key

    # --- ids ------------------------------------------------------------------------------------

    @property
    def counters(self) -> dict[str, dict[str, int]]:
        """The ids handed out so far, as data (a state file keeps them): ``names``, per made-up
        id prefix (``i``, ``new``) the next number; ``requests``, per instance the next default
        request number. Ids below them are never handed out again."""
        return self._ids.as_data()

    def restore_counters(self, counters: Mapping[str, Mapping[str, int]]) -> None:
        """Raise the counters to at least ``counters`` (what :attr:`counters` gave: restoring
        a saved state); never lowers them."""
        self._ids.restore(counters)

    def fresh_names(self, prefix: str, count: int) -> list[str]:
        """``count`` ids ``<prefix><k>`` never handed out by this state (nothing is claimed: a
        plan names its new instances with them, and they are claimed when added)."""
        return self._ids.fresh(prefix, count, taken=self._instances)

    # --- instances ----------------------------------------------------------------------------

    @property
    def instances(self) -> tuple[Instance, ...]:
        return tuple(self._instances.values())

    def instance(self, instance_id: str) -> Instance:
        if instance_id not in self._instances:
            raise InvalidInputError(
                f"instance_id {instance_id!r} is unknown; known: {', '.join(self._instances)}"
            )
        return self._instances[instance_id]

    def busy_gpus(self) -> set[str]:
        return {gpu for inst in self._instances.values() for gpu in inst.gpus}

    def free_gpus(self) -> list[str]:
        """GPUs no instance occupies, in topology order."""
        busy = self.busy_gpus()
        return [gpu for gpu in self.topology.gpus() if gpu not in busy]

    def free_slots(
        self,
        tp: int,
        *,
        model: ModelSpec | None = None,
        placement: str = "pack",
        prefer_leaves: Set[str | None] = frozenset(),
    ) -> list[tuple[str, ...]]:
        """Every free TP group of ``tp`` GPUs inside one NVLink group, in placement order (and,
        given ``model``, only on GPUs whose memory holds it: :func:`memory_misfit`).

        ``pack``: fullest groups first (more instances share a group), then groups under one of
        ``prefer_leaves``, then topology order. ``spread``: the same groups, one slot per group
        in turn."""
        topo = self.topology
        check_tp_fits(topo, tp)
        busy = frozenset(self.busy_gpus())
        key = (busy, tp, model, placement, frozenset(prefer_leaves))
        memo = topo.memo.setdefault("free_slots", {})
        found = memo.get(key)
        if found is None:  # a pure function of the key on this topology: kept in its memo
            if len(memo) >= _SLOT_MEMOS:
                memo.clear()
            found = memo[key] = tuple(_free_slots(topo, busy, tp, model, placement, prefer_leaves))
        return list(found)

    def add_instance(
        self,
        model: ModelSpec | str,
        *,
        gpus: Sequence[str],
        role: Role | str = Role.PREFILL,
        queue: Iterable[QueuedRequest | tuple[float, int]] = (),
        kv_bytes_used: int = 0,
        instance_id: str | None = None,
        loading: Loading | None = None,
    ) -> Instance:
        """Start an instance of ``model`` on free ``gpus`` (its TP group, all on one host).

        Ids are ``i0, i1, ...`` unless ``instance_id`` names it (it must be new); an id is never
        handed out twice, even after its instance is removed. Queued requests without an id get
        ``<instance>/r<k>``, ``k`` counting on across updates (never reused). ``loading`` goes
        with ``role="loading"``: its future role and per-unit arrival times."""
        spec = _spec(model)
        check_loading(loading, parse_role(role), spec)
        group = self._check_gpus(spec, gpus)
        if instance_id is not None and (
            not isinstance(instance_id, str) or not instance_id or instance_id in self._instances
        ):
            raise InvalidInputError(
                f"instance_id must be a new non-empty name, got {instance_id!r}"
            )
        name = instance_id or self.fresh_names("i", 1)[0]
        kv = check_kv(kv_bytes_used)
        requests = self._ids.queue_of(name, queue)
        self._ids.claim(name)
        instance = Instance(
            id=name,
            model=spec,
            gpus=group,
            role=parse_role(role),
            queue=requests,
            kv_bytes_used=kv,
            loading=loading,
        )
        self._instances[instance.id] = instance
        return instance

    def keep_instances(self, instances: Iterable[Instance]) -> None:
        """Add ``instances``, records of another state of this cluster, as they are (a state
        after failures keeps its survivors: their model, queue and loading record were checked
        when they were added there); each one's GPUs must be free GPUs of this topology and its
        id new here."""
        busy = self.busy_gpus()
        graph, topology = self.topology.graph, self.topology
        for inst in instances:
            if not isinstance(inst, Instance) or inst.id in self._instances:
                raise InvalidInputError(f"instances must be new Instance records, got {inst!r}")
            for gpu in inst.gpus:
                if gpu not in graph or topology.kind(gpu) != "gpu" or gpu in busy:
                    raise InvalidInputError(
                        f"instance {inst.id!r}: gpu {gpu!r} is not a free GPU of the topology"
                    )
            busy.update(inst.gpus)
            self._ids.claim(inst.id)
            self._instances[inst.id] = inst

    def update_instance(
        self,
        instance_id: str,
        *,
        role: Role | str | None = None,
        queue: Iterable[QueuedRequest | tuple[float, int]] | None = None,
        kv_bytes_used: int | None = None,
        loading: Loading | None = None,
    ) -> Instance:
        """Change an instance's role, load or loading record; returns the new record (a role
        other than ``loading`` drops its loading record)."""
        old = self.instance(instance_id)
        new_role = old.role if role is None else parse_role(role)
        check_loading(loading, new_role, old.model)
        new = replace(
            old,
            loading=(loading or old.loading) if new_role is Role.LOADING else None,
            role=new_role,
            queue=old.queue if queue is None else self._ids.queue_of(old.id, queue),
            kv_bytes_used=old.kv_bytes_used if kv_bytes_used is None else check_kv(kv_bytes_used),
        )
        self._instances[instance_id] = new
        return new

    def remove_instance(self, instance_id: str) -> Instance:
        """Release an instance's GPUs; returns the removed record."""
        return self._instances.pop(self.instance(instance_id).id)

    def _check_gpus(self, model: ModelSpec, gpus: Sequence[str]) -> tuple[str, ...]:
        if (
            isinstance(gpus, str)
            or not isinstance(gpus, Sequence)
            or not gpus
            or not all(isinstance(g, str) for g in gpus)
        ):
            raise InvalidInputError(f"gpus must be a non-empty list of GPU names, got {gpus!r}")
        group = tuple(gpus)
        topology = self.topology
        for gpu in group:  # a GPU node of the topology (no set of all GPUs per call)
            if gpu not in topology.graph or topology.kind(gpu) != "gpu":
                raise InvalidInputError(f"gpus names {gpu!r}, which is not a GPU of the topology")
        if len(set(group)) != len(group):
            raise InvalidInputError(f"gpus repeats a GPU: {list(group)!r}")
        busy = self.busy_gpus() & set(group)
        if busy:
            raise InvalidInputError(f"gpus {sorted(busy)!r} already run an instance")
        hosts = {self.topology.host_of(g) for g in group}
        if len(hosts) > 1:
            raise InvalidInputError(
                f"gpus of one instance must share a host, got {sorted(hosts)!r}"
            )
        groups = {self.topology.nvlink_group_of(g) for g in group}
        if len(group) > 1 and len(groups) > 1:
            raise InvalidInputError(
                f"gpus {list(group)!r} are not in one NVLink group ({len(groups)} groups): a TP "
                "instance runs its collectives over NVLink, and the planner places and loads TP "
                "groups inside one; on a host without NVLink use one GPU per instance"
            )
        model.check_tp(len(group))
        for gpu in group:
            misfit = memory_misfit(model, len(group), self.topology.gpu_spec(gpu).memory_bytes)
            if misfit:
                raise InvalidInputError(f"gpu {gpu!r}: {misfit}; use a larger TP group")
        return group

    # --- sources and flows --------------------------------------------------------------------

    def sources(self, model: ModelSpec | str) -> list[Source]:
        """Every place ``model``'s weights can be sent from now: instances (loading ones whose
        arrival times are known included: they hold each unit from its ``units_ready_s``), then
        the host copy.

        Only the exact identity counts: instances of another revision are never sources.
        """
        identity = _spec(model).identity
        found = [
            Source("instance", inst.gpus, identity, instance=inst)
            for inst in self._instances.values()
            if inst.identity == identity
            and (inst.role is not Role.LOADING or inst.loading is not None)
        ]
        copy = self.pool.host_copy(identity)
        if copy is not None:
            found.append(Source("host", (copy.node,), identity, host=copy.host))
        return found

    @property
    def background_flows(self) -> tuple[Flow, ...]:
        """Transfers (KV caches) occupying links while weights move."""
        return self._background.flows

    def add_background_flow(
        self, src: str, dst: str, *, max_bytes_per_s: float = math.inf, name: str = ""
    ) -> Flow:
        """Record a transfer from ``src`` to ``dst`` that keeps running (e.g. KV caches)."""
        return self._background.add(src, dst, max_bytes_per_s=max_bytes_per_s, name=name)

    def add_flow(self, flow: Flow, *, until_s: float = math.inf) -> Flow:
        """Record an already routed background flow; its edges must be in the topology.
        ``until_s``: when it ends, seconds from now (an earlier plan's step), else it keeps
        running (serving traffic)."""
        return self._background.add_routed(flow, until_s=until_s)

    def flow_end_s(self, flow: Flow) -> float:
        """When background ``flow`` ends, seconds from now (inf: it keeps running)."""
        return self._background.end_s(flow)

    def clear_background_flows(self) -> None:
        self._background.clear()


def _same_topology(a: Topology, b: Topology) -> bool:
    """The same name, nodes and links (with their attributes)."""
    if a is b:
        return True

    def nodes(t: Topology) -> dict[str, Any]:
        return {n: d for n, d in t.graph.nodes(data=True)}

    def links(t: Topology) -> dict[tuple[str, str], Any]:
        return {(u, v): d for u, v, d in t.graph.edges(data=True)}

    return a.name == b.name and nodes(a) == nodes(b) and links(a) == links(b)


def _spec(model: ModelSpec | str) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model)


_SLOT_MEMOS = 64
"""Free-slot lists a topology keeps (per busy set, TP degree, model and placement)."""


def _free_slots(
    topo: Topology,
    busy: Set[str],
    tp: int,
    model: ModelSpec | None,
    placement: str,
    prefer_leaves: Set[str | None],
) -> list[tuple[str, ...]]:
    """:meth:`ClusterState.free_slots` of the GPUs not in ``busy``."""
    misfit: dict[float, bool] = {}  # per memory size: whether the model misses it
    groups: dict[tuple[str, ...], list[str]] = {}
    for gpu, memory, group in _gpu_table(topo):
        if gpu in busy:
            continue
        if model is not None:
            if memory not in misfit:
                misfit[memory] = memory_misfit(model, tp, memory) is not None
            if misfit[memory]:
                continue
        groups.setdefault(group, []).append(gpu)
    order = sorted(
        groups.items(),
        key=lambda kv: (
            -(len(kv[1]) // tp),
            topo.leaf_of(kv[0][0]) not in prefer_leaves,
            topo.gpu_position(kv[0][0]),
        ),
    )
    per_group = [
        [tuple(gpus[start : start + tp]) for start in range(0, len(gpus) - tp + 1, tp)]
        for _, gpus in order
    ]
    if placement == "spread":
        depth = max((len(slots) for slots in per_group), default=0)
        return [slots[k] for k in range(depth) for slots in per_group if k < len(slots)]
    return [slot for slots in per_group for slot in slots]


def _gpu_table(topology: Topology) -> list[tuple[str, float, tuple[str, ...]]]:
    """Every GPU of ``topology`` in order with its memory and NVLink group (kept in its memo)."""
    memo = topology.memo.setdefault("gpu_table", {})
    if () not in memo:
        memo[()] = [
            (g, topology.gpu_spec(g).memory_bytes, topology.nvlink_group_of(g))
            for g in topology.gpus()
        ]
    return memo[()]  # type: ignore[no-any-return]
