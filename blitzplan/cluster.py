"""Cluster state: instances on GPUs, the parameter pool, and background flows on links.

The parameter pool records where every model's weights are: the GPUs of instances serving it and
the one host-DRAM copy the cluster keeps of each model ("O(1) host caching": one copy per model in
the whole cluster, not one per host). It answers which sources can send a model now.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from blitzplan._checks import MAX_BYTES, MAX_SECONDS, check_count, is_finite_number
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelIdentity, ModelSpec, load_model
from blitzplan.topologies import Flow, Topology
from blitzplan.units import GIB

__all__ = [
    "MAX_AHEAD_S",
    "MAX_PROMPT_TOKENS",
    "MAX_WEIGHT_FRACTION",
    "MIN_KV_TOKENS",
    "ClusterState",
    "HostCopy",
    "Instance",
    "Loading",
    "ParameterPool",
    "QueuedRequest",
    "Role",
    "Source",
    "check_tp_fits",
    "memory_misfit",
]

MAX_WEIGHT_FRACTION = 0.9
"""Weights and the KV reserve may fill at most this share of a GPU's memory (the rest is
activations and the runtime, as vLLM's default ``gpu_memory_utilization``)."""

MIN_KV_TOKENS = 8192
"""KV cache every GPU must keep room for beside its weights: one 8k-token request. An instance
whose weights leave less is refused, by ``add_instance`` and by ``plan()`` alike."""


MAX_AHEAD_S = 3600.0
"""A queued request arrives at most this many seconds from now (a request further ahead is not
queued yet; a time that far out is a unit mistake)."""

MAX_PROMPT_TOKENS = 10_000_000
"""The longest prompt a queued request may carry (ten million tokens, beyond every released
model's context window)."""

_NUMBERED = re.compile(r"(i|new)(\d+)")
"""Instance ids the state and the planner make up: ``i<k>`` (add_instance) and ``new<k>``
(plan()); the state counts both so that neither is used twice."""


def check_tp_fits(topology: Topology, tp: int) -> None:
    """InvalidInputError unless some NVLink group of ``topology`` has ``tp`` GPUs."""
    largest = max(len(topology.nvlink_group_of(g)) for g in topology.gpus())
    if tp > largest:
        raise InvalidInputError(f"tp={tp} is larger than the largest NVLink group ({largest} GPUs)")


def memory_misfit(model: ModelSpec, tp: int, memory_bytes: float) -> str | None:
    """Why ``model`` at ``tp`` does not fit a GPU of ``memory_bytes``, or None when it does:
    weights per GPU plus the KV of :data:`MIN_KV_TOKENS` tokens must stay within
    :data:`MAX_WEIGHT_FRACTION` of the memory."""
    shard = model.shard(tp)
    reserve = MIN_KV_TOKENS * shard.kv_bytes_per_token
    if shard.total_bytes + reserve <= MAX_WEIGHT_FRACTION * memory_bytes:
        return None
    return (
        f"{model.name} at tp={tp} needs {shard.total_bytes / GIB:.1f} GiB of weights and "
        f"{reserve / GIB:.1f} GiB of KV reserve ({MIN_KV_TOKENS} tokens) per GPU, more than "
        f"{MAX_WEIGHT_FRACTION:.0%} of {memory_bytes / GIB:.1f} GiB"
    )


class Role(StrEnum):
    """What an instance does. Prefill instances send KV caches out, so their egress is busy."""

    PREFILL = "prefill"
    DECODE = "decode"
    COLOCATED = "colocated"
    """Prefills and decodes in one engine (vLLM, SGLang): no KV cache leaves it for a decode
    instance, so its NICs are free to send weights."""
    IDLE = "idle"
    LOADING = "loading"
    """Still receiving its weights. It occupies its GPUs; it is a source for a later plan only
    when its ``loading`` record says when each unit arrives (:func:`blitzplan.apply_plan` keeps
    one), and then only as its future role allows (a future prefill instance is no source under
    the paper's rule)."""


@dataclass(frozen=True)
class Loading:
    """An instance still receiving its weights under an earlier plan: the role it takes once
    loaded and, per unit (embedding, layers 1..L, head), the predicted seconds from now until
    the unit is complete on every one of its GPUs (0 for units it has).

    ``needs`` and ``edges`` say what the arrivals still ahead depend on: the instances whose
    processes send or forward them and the host memories they are read from (by name), and the
    directed links they cross. A failure of any of them leaves the record *stale*
    (:func:`~blitzplan.recover` says so and no later plan streams from the instance). ``needs``
    None: unknown, so any failure leaves it stale."""

    role: Role
    units_ready_s: tuple[float, ...]
    needs: frozenset[str] | None = None
    edges: frozenset[tuple[str, str]] = frozenset()

    def __post_init__(self) -> None:
        role = _role(self.role)
        if role is Role.LOADING:
            raise InvalidInputError("loading.role is the role taken once loaded, not 'loading'")
        times = tuple(self.units_ready_s) if isinstance(self.units_ready_s, Sequence) else None
        if not times or not all(is_finite_number(t) and 0 <= t <= MAX_SECONDS for t in times):
            raise InvalidInputError(
                "loading.units_ready_s must be a non-empty list of finite seconds >= 0, got "
                f"{self.units_ready_s!r}"
            )
        object.__setattr__(self, "role", role)
        object.__setattr__(self, "units_ready_s", tuple(float(t) for t in times))
        _check_needs(self.needs, self.edges)
        if self.needs is not None:
            object.__setattr__(self, "needs", frozenset(self.needs))
        object.__setattr__(self, "edges", frozenset(tuple(e) for e in self.edges))

    def advanced(self, seconds: float) -> Loading | None:
        """The record ``seconds`` later (every arrival that much nearer), None once every unit
        is there."""
        left = tuple(max(0.0, t - seconds) for t in self.units_ready_s)
        return replace(self, units_ready_s=left) if any(left) else None

    def stale_after(
        self, failed: Set[str], topology: Topology, *, anything_failed: bool
    ) -> str | None:
        """Why the arrivals still ahead can no longer come, or None: a name it needs is in
        ``failed``, a link it crosses is not in ``topology`` (what survives), or, for a record
        whose needs are unknown, ``anything_failed``."""
        if not any(self.units_ready_s):
            return None
        if self.needs is None:
            return "its plan's routes are unknown" if anything_failed else None
        hit = sorted(self.needs & failed)
        if hit:
            return f"its plan needs {', '.join(hit)}"
        cut = sorted(e for e in self.edges if not topology.graph.has_edge(*e))
        return f"its plan crosses the failed link {cut[0]}" if cut else None


@dataclass(frozen=True)
class QueuedRequest:
    """A request waiting at an instance: when it arrived, how long its prompt is, and its id
    (``"<instance>/r<k>"`` by default: ClusterState names the k-th request of an instance's queue
    when it comes without one)."""

    arrival_s: float
    prompt_tokens: int
    id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise InvalidInputError(f"request id must be a string, got {self.id!r}")
        if not is_finite_number(self.arrival_s) or not (
            -MAX_SECONDS <= self.arrival_s <= MAX_AHEAD_S
        ):
            raise InvalidInputError(
                f"arrival_s must be a finite number of seconds, at most {MAX_AHEAD_S:g} ahead of "
                f"now and {MAX_SECONDS:g} behind, got {self.arrival_s!r}"
            )
        tokens = check_count("prompt_tokens", self.prompt_tokens, maximum=MAX_PROMPT_TOKENS)
        object.__setattr__(self, "arrival_s", float(self.arrival_s))
        object.__setattr__(self, "prompt_tokens", tokens)


@dataclass(frozen=True)
class Instance:
    """One serving instance: a model on a tensor-parallel group of GPUs."""

    id: str
    model: ModelSpec
    gpus: tuple[str, ...]
    role: Role
    queue: tuple[QueuedRequest, ...] = ()
    kv_bytes_used: int = 0
    loading: Loading | None = None
    """For a ``loading`` instance: its future role and when each unit arrives (None: unknown)."""

    @property
    def tp(self) -> int:
        return len(self.gpus)

    @property
    def serving_role(self) -> Role:
        """The role it serves in: its own, or for a loading instance the one it takes."""
        return self.loading.role if self.loading is not None else self.role

    @property
    def identity(self) -> ModelIdentity:
        return self.model.identity


@dataclass(frozen=True)
class HostCopy:
    """The cluster's one host-DRAM copy of a model."""

    identity: ModelIdentity
    host: str
    node: str
    bytes: int


@dataclass(frozen=True)
class Source:
    """Somewhere a model's weights can be sent from right now.

    ``nodes`` are the GPUs of a serving instance or the host-memory node of the host copy.
    ``egress_busy`` is true for prefill instances, whose egress carries KV caches.
    """

    kind: str
    nodes: tuple[str, ...]
    identity: ModelIdentity
    instance: Instance | None = None
    host: str | None = None

    @property
    def egress_busy(self) -> bool:
        return self.instance is not None and self.instance.serving_role is Role.PREFILL


class ParameterPool:
    """Where each model's weights are: one host copy per model, plus serving instances."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology
        self._copies: dict[ModelIdentity, HostCopy] = {}

    @property
    def host_copies(self) -> tuple[HostCopy, ...]:
        return tuple(self._copies.values())

    def host_copy(self, identity: ModelIdentity) -> HostCopy | None:
        return self._copies.get(identity)

    def dram_free_bytes(self, host: str) -> float:
        used = sum(c.bytes for c in self._copies.values() if c.host == host)
        return self._topology.dram_bytes(host) - used

    def place(self, models: Iterable[ModelSpec]) -> tuple[HostCopy, ...]:
        """Place one host copy of each new model, largest first on the host with most free DRAM.

        All or nothing: raises InfeasibleError, placing none, when the copies do not fit.
        """
        new = {m.identity: m for m in models if m.identity not in self._copies}
        hosts = self._topology.hosts()
        free = {host: self.dram_free_bytes(host) for host in hosts}
        need = sum(m.total_bytes for m in new.values())
        if need > sum(free.values()):
            raise InfeasibleError(
                f"aggregate free host DRAM ({sum(free.values()) / GIB:.1f} GiB on {len(hosts)} "
                f"hosts) cannot hold one copy of each model ({need / GIB:.1f} GiB for "
                f"{', '.join(str(i) for i in new)})"
            )
        placed: list[HostCopy] = []
        for identity, model in sorted(new.items(), key=lambda kv: (-kv[1].total_bytes, str(kv[0]))):
            host = max(hosts, key=lambda h: free[h])
            if free[host] < model.total_bytes:
                raise InfeasibleError(
                    f"no single host has {model.total_bytes / GIB:.1f} GiB of free DRAM left for "
                    f"model {identity} (largest free: {free[host] / GIB:.1f} GiB on {host})"
                )
            free[host] -= model.total_bytes
            node = self._topology.host_mem(host)
            placed.append(HostCopy(identity, host, node, model.total_bytes))
        self._copies.update((copy.identity, copy) for copy in placed)
        return tuple(placed)

    def add(self, copy: HostCopy) -> None:
        """Record an existing host copy (restoring a pool); it must fit its host's free DRAM."""
        if copy.identity in self._copies:
            raise InvalidInputError(f"model {copy.identity} already has a host copy")
        if copy.node != self._topology.host_mem(copy.host):
            raise InvalidInputError(f"host copy node {copy.node!r} is not the DRAM of {copy.host}")
        if copy.bytes > self.dram_free_bytes(copy.host):
            raise InfeasibleError(f"host {copy.host} has no room for the copy of {copy.identity}")
        self._copies[copy.identity] = copy

    def drop(self, identity: ModelIdentity) -> None:
        """Forget the host copy of a model (it is evicted)."""
        if identity not in self._copies:
            raise InvalidInputError(f"model {identity} has no host copy to drop")
        del self._copies[identity]


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
        self._background: list[Flow] = []
        self._ends: dict[Flow, float] = {}
        """When each background flow that ends does (seconds from now); the others keep running."""
        self._names: dict[str, int] = {"i": 0, "new": 0}
        """Per made-up id prefix, the next number never handed out (ids are never reused)."""
        self._requests: dict[str, int] = {}
        """Per instance id, the next default request number ``<instance>/r<k>``."""
        self.pool.place(_spec(m) for m in models)

    def copy(self) -> ClusterState:
        """An independent copy: same topology, host copies, instances, background flows and
        counters of the ids handed out."""
        other = ClusterState(self.topology)  # no models: nothing placed, nothing searched
        other.pool._copies = dict(self.pool._copies)
        other._instances = dict(self._instances)
        other._background = list(self._background)
        other._ends = dict(self._ends)
        other._names = dict(self._names)
        other._requests = dict(self._requests)
        return other

    def __repr__(self) -> str:
        roles = Counter(inst.role.value for inst in self._instances.values())
        copies = [f"{c.identity.name}@{c.host}" for c in self.pool.host_copies]
        return (
            f"ClusterState({self.topology.name!r}, instances={len(self._instances)} "
            f"({', '.join(f'{n} {r}' for r, n in sorted(roles.items())) or 'none'}), "
            f"free_gpus={len(self.free_gpus())}, host_copies={copies}, "
            f"background_flows={len(self._background)})"
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
            and Counter(self._background) == Counter(other._background)
            and self._ends == other._ends
        )

    __hash__ = None  # type: ignore[assignment]  # a mutable state is no dict key

    # --- ids ------------------------------------------------------------------------------------

    @property
    def counters(self) -> dict[str, dict[str, int]]:
        """The ids handed out so far, as data (a state file keeps them): ``names``, per made-up
        id prefix (``i``, ``new``) the next number; ``requests``, per instance the next default
        request number. Ids below them are never handed out again."""
        return {"names": dict(self._names), "requests": dict(self._requests)}

    def restore_counters(self, counters: Mapping[str, Mapping[str, int]]) -> None:
        """Raise the counters to at least ``counters`` (what :attr:`counters` gave: restoring
        a saved state); never lowers them."""
        tables = {"names": self._names, "requests": self._requests}
        for what, given in counters.items():
            if what not in tables or not isinstance(given, Mapping):
                raise InvalidInputError(
                    f"counters.{what} is not a mapping of names or requests, got {given!r}"
                )
            for key, value in given.items():
                if not isinstance(key, str) or not key:
                    raise InvalidInputError(f"counters.{what} has the key {key!r}, not a name")
                count = check_count(f"counters.{what}.{key}", value, minimum=0)
                tables[what][key] = max(tables[what].get(key, 0), count)

    def fresh_names(self, prefix: str, count: int) -> list[str]:
        """``count`` ids ``<prefix><k>`` never handed out by this state (nothing is claimed: a
        plan names its new instances with them, and they are claimed when added)."""
        names: list[str] = []
        k = self._names.get(prefix, 0)
        while len(names) < count:
            if f"{prefix}{k}" not in self._instances:
                names.append(f"{prefix}{k}")
            k += 1
        return names

    def _claim(self, name: str) -> None:
        found = _NUMBERED.fullmatch(name)
        if found:
            prefix, number = found.group(1), int(found.group(2))
            self._names[prefix] = max(self._names.get(prefix, 0), number + 1)

    def _queue_of(
        self, instance: str, queue: Iterable[QueuedRequest | tuple[float, int]]
    ) -> tuple[QueuedRequest, ...]:
        requests, after = _queue(queue, instance, self._requests.get(instance, 0))
        self._requests[instance] = after
        return requests

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
        free = set(self.free_gpus())
        groups: dict[tuple[str, ...], list[str]] = {}
        for gpu in topo.gpus():
            if gpu in free and not (
                model is not None and memory_misfit(model, tp, topo.gpu_spec(gpu).memory_bytes)
            ):
                groups.setdefault(topo.nvlink_group_of(gpu), []).append(gpu)
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
        _check_loading(loading, _role(role), spec)
        group = self._check_gpus(spec, gpus)
        if instance_id is not None and (
            not isinstance(instance_id, str) or not instance_id or instance_id in self._instances
        ):
            raise InvalidInputError(
                f"instance_id must be a new non-empty name, got {instance_id!r}"
            )
        name = instance_id or self.fresh_names("i", 1)[0]
        kv = _kv(kv_bytes_used)
        requests = self._queue_of(name, queue)
        self._claim(name)
        instance = Instance(
            id=name,
            model=spec,
            gpus=group,
            role=_role(role),
            queue=requests,
            kv_bytes_used=kv,
            loading=loading,
        )
        self._instances[instance.id] = instance
        return instance

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
        new_role = old.role if role is None else _role(role)
        _check_loading(loading, new_role, old.model)
        new = replace(
            old,
            loading=(loading or old.loading) if new_role is Role.LOADING else None,
            role=new_role,
            queue=old.queue if queue is None else self._queue_of(old.id, queue),
            kv_bytes_used=old.kv_bytes_used if kv_bytes_used is None else _kv(kv_bytes_used),
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
        known = set(self.topology.gpus())
        for gpu in group:
            if gpu not in known:
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
        return tuple(self._background)

    def add_background_flow(
        self, src: str, dst: str, *, max_bytes_per_s: float = math.inf, name: str = ""
    ) -> Flow:
        """Record a transfer from ``src`` to ``dst`` that keeps running (e.g. KV caches)."""
        flow = self.topology.flow(src, dst, max_bytes_per_s=max_bytes_per_s, name=name)
        self._background.append(flow)
        return flow

    def add_flow(self, flow: Flow, *, until_s: float = math.inf) -> Flow:
        """Record an already routed background flow; its edges must be in the topology.
        ``until_s``: when it ends, seconds from now (an earlier plan's step), else it keeps
        running (serving traffic)."""
        for edge in flow.edges:
            self.topology.bytes_per_s(edge)
        if isinstance(until_s, bool) or not isinstance(until_s, int | float) or not until_s > 0:
            raise InvalidInputError(f"until_s must be a time > 0 or inf, got {until_s!r}")
        self._background.append(flow)
        if until_s < math.inf:
            self._ends[flow] = float(until_s)
        return flow

    def flow_end_s(self, flow: Flow) -> float:
        """When background ``flow`` ends, seconds from now (inf: it keeps running)."""
        return self._ends.get(flow, math.inf)

    def clear_background_flows(self) -> None:
        self._background.clear()
        self._ends.clear()


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


def _role(role: Role | str) -> Role:
    try:
        return Role(role)
    except ValueError:
        raise InvalidInputError(
            f"role must be one of {', '.join(r.value for r in Role)}, got {role!r}"
        ) from None


def _queue(
    queue: Iterable[QueuedRequest | tuple[float, int] | tuple[float, int, str]],
    instance: str,
    start: int,
) -> tuple[tuple[QueuedRequest, ...], int]:
    """The queue as QueuedRequests, each with an id unique in it (``<instance>/r<k>`` for the
    entries that come without one, ``k`` from ``start`` on, past every such id already there),
    and the next ``k``."""
    if isinstance(queue, str | bytes | Mapping) or not isinstance(queue, Iterable):
        raise InvalidInputError(
            f"queue must be a list of (arrival_s, prompt_tokens) pairs, got {queue!r}"
        )
    given = [_queued(index, entry) for index, entry in enumerate(queue)]
    pattern = re.compile(re.escape(instance) + r"/r(\d+)")
    numbered = [pattern.fullmatch(r.id) for r in given]
    k = max([start, *(int(m.group(1)) + 1 for m in numbered if m)])
    out = []
    seen: set[str] = set()
    for index, request in enumerate(given):
        if not request.id:
            request = replace(request, id=f"{instance}/r{k}")
            k += 1
        if request.id in seen:
            raise InvalidInputError(f"queue[{index}] repeats request id {request.id!r}")
        seen.add(request.id)
        out.append(request)
    return tuple(out), k


def _queued(index: int, entry: object) -> QueuedRequest:
    if isinstance(entry, QueuedRequest):
        return entry
    if (
        isinstance(entry, str | bytes)
        or not isinstance(entry, Sequence)
        or len(entry) not in (2, 3)
    ):
        raise InvalidInputError(
            f"queue[{index}] must be a QueuedRequest or an (arrival_s, prompt_tokens[, id]) "
            f"tuple, got {entry!r}"
        )
    try:
        return QueuedRequest(*entry)
    except InvalidInputError as exc:
        raise InvalidInputError(f"queue[{index}] {entry!r}: {exc}") from None


def _check_needs(needs: object, edges: object) -> None:
    if needs is not None and (
        isinstance(needs, str)
        or not isinstance(needs, Set)
        or not all(isinstance(n, str) for n in needs)
    ):
        raise InvalidInputError(f"loading.needs must be a set of names or None, got {needs!r}")
    if (
        isinstance(edges, str)
        or not isinstance(edges, Set)
        or not all(
            isinstance(e, tuple) and len(e) == 2 and all(isinstance(x, str) for x in e)
            for e in edges
        )
    ):
        raise InvalidInputError(f"loading.edges must be a set of (node, node) links, got {edges!r}")


def _check_loading(loading: Loading | None, role: Role, spec: ModelSpec) -> None:
    if loading is None:
        return
    if not isinstance(loading, Loading):
        raise InvalidInputError(f"loading must be a Loading record, got {loading!r}")
    if role is not Role.LOADING:
        raise InvalidInputError(f"loading goes with role 'loading', got role {role.value!r}")
    units = len(spec.unit_bytes())
    if len(loading.units_ready_s) != units:
        raise InvalidInputError(
            f"loading.units_ready_s has {len(loading.units_ready_s)} times; {spec.name} has "
            f"{units} units (embedding, {units - 2} layers, head)"
        )


def _kv(kv_bytes_used: int) -> int:
    return check_count("kv_bytes_used", kv_bytes_used, minimum=0, maximum=MAX_BYTES)
