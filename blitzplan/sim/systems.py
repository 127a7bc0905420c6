"""The systems the simulator compares: each a data plane that turns a scaling decision into a
:class:`ScaleAction` (instances to launch with their unit timelines, instances to drain or to
mutate, weight flows, and the plan to replan from after a failure); the engine applies it.

* ``distserve-full`` / ``distserve-half``: every GPU / half of them, fixed, preloaded
  (disaggregated).
* ``vllm-full`` / ``vllm-avg``: colocated replicas, fixed, preloaded: on every GPU / as many as
  the trace's mean rate needs (the fleet ``simulate`` computes).
* ``fixed``: the fleet the caller gives (prefill, decode and colocated counts), preloaded.
* ``serverlessllm``: autoscaled; a host DRAM cache kept ``ttl_s`` per host after its last
  instance, else SSD -> DRAM -> GPU; new instances serve once fully loaded.
* ``allcache``: autoscaled; host DRAM, always a hit; serves once loaded.
* ``blitzscale-network``: autoscaled; weights from serving GPUs or the one host copy over the
  network, one target at a time; serves once loaded.
* ``blitzscale-multicast``: the same with ``plan()``'s striped multicast (greedy).
* ``blitzscale``: the multicast, plus live new instances that run the paper's protocol (a relay,
  :mod:`.prefill`, under the run's live policy) and, disaggregated, decode scaling by mutation.

The autoscaled systems run disaggregated or colocated (``colocated``): colocated, they add and
remove colocated replicas, and BlitzScale's live replicas pair with the replicas ``plan()``
pairs them with (:mod:`.pairs`). The ablations add one idea at a time (the paper's Figure 20);
``blitzscale`` has them all. The autoscaler decides decode counts, so ``plan()``'s decode
pre-scaling is off here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from blitzplan.cluster import ClusterState
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.multicast import plan_multicast
from blitzplan.scale import PlanOptions, ScalePlan, ScaleRequest, plan
from blitzplan.sim.autoscaler import ScaleDecision
from blitzplan.sim.hostcache import HostCaches
from blitzplan.sim.instances import SimInstance
from blitzplan.topologies import Flow, Topology

__all__ = [
    "COLOCATED_SYSTEMS",
    "SYSTEMS",
    "ClusterView",
    "DataPlane",
    "Fleet",
    "Launch",
    "ScaleAction",
    "System",
    "make_system",
]


@dataclass(frozen=True)
class Fleet:
    """A fixed fleet: how many instances of each role start preloaded."""

    prefill: int = 0
    decode: int = 0
    colocated: int = 0

    @property
    def total(self) -> int:
        return self.prefill + self.decode + self.colocated

    def roles(self) -> list[str]:
        return (
            ["prefill"] * self.prefill + ["decode"] * self.decode + ["colocated"] * self.colocated
        )


@dataclass(frozen=True)
class Launch:
    """A new instance: role, GPUs, when each unit (embedding, layers, head) lands (seconds
    into the run), whether it serves live while loading, its name in the plan and, live and
    colocated, the replica it helps (``pair``)."""

    role: str
    gpus: tuple[str, ...]
    unit_ready_s: tuple[float, ...]
    live: bool = False
    name: str = ""
    pair: str | None = None

    @property
    def ready_s(self) -> float:
        return max(self.unit_ready_s)


@dataclass(frozen=True)
class ScaleAction:
    """What a system decided: the engine drains ``releases``, turns ``mutations`` (prefill
    instance ids) into decode instances, starts ``launches`` and runs ``weight_flows`` until the
    last launch is ready. ``plan`` is kept to replan the load after a failure."""

    launches: tuple[Launch, ...] = ()
    releases: tuple[str, ...] = ()
    mutations: tuple[str, ...] = ()
    weight_flows: tuple[Flow, ...] = ()
    plan: ScalePlan | None = None
    ssd_loads: int = 0
    """Launches that load from SSD (a ServerlessLLM host-cache miss)."""


class ClusterView(Protocol):
    """What a system may read of the running simulation."""

    @property
    def now_s(self) -> float: ...

    @property
    def model(self) -> ModelSpec: ...

    @property
    def tp(self) -> int: ...

    @property
    def topology_now(self) -> Topology: ...

    def snapshot(self, *, exclude: frozenset[str] = ...) -> ClusterState: ...

    def idle_instance(self, role: str, idle_s: float) -> SimInstance | None: ...

    def count(self, role: str) -> int: ...


class System(Protocol):
    """A data plane under the autoscaler; its decisions are values the engine applies."""

    @property
    def name(self) -> str: ...

    @property
    def autoscaled(self) -> bool: ...

    @property
    def holds_host_copy(self) -> bool:
        """Whether it keeps the cluster's one host copy (its loss costs a rebuild)."""
        ...

    def start(self, view: ClusterView) -> ScaleAction: ...

    def scale(self, view: ClusterView, decision: ScaleDecision, idle_s: float) -> ScaleAction: ...

    def host_emptied(self, view: ClusterView, host: str) -> None:
        """The last instance on ``host`` was released."""
        ...


@dataclass
class DataPlane:
    """Every system of :data:`SYSTEMS`: a data plane and the ideas it has on."""

    name: str
    fixed_fraction: float | None = None
    plane: str = "blitzscale"
    live: bool = False
    mutate: bool = False
    ttl_s: float = 60.0
    prefill_share: float = 0.5
    startup_s: float = 0.0
    colocated: bool = False
    fleet: Fleet | None = None
    """The fixed fleet (``fixed``, ``vllm-avg``; None: from ``fixed_fraction``)."""
    caches: HostCaches | None = None
    """In a multi-model run, ServerlessLLM's host caches shared by every model (this system's
    model is ``cache_key`` there); None: one model, whose cache on a host lives ``ttl_s`` after
    its last instance there, without a capacity."""
    cache_key: str = ""
    _cache_until: dict[str, float] = field(default_factory=dict)

    @property
    def autoscaled(self) -> bool:
        return self.fixed_fraction is None and self.fleet is None

    @property
    def holds_host_copy(self) -> bool:
        return self.plane.startswith("blitzscale")

    def start(self, view: ClusterView) -> ScaleAction:
        """The instances at time 0: the fixed fleet, or one of each role it scales."""
        slots = view.snapshot().free_slots(view.tp)
        roles = self.initial_fleet(len(slots)).roles()
        loaded = (view.now_s,) * view.model.num_units
        launches = tuple(
            Launch(role, tuple(gpus), loaded) for role, gpus in zip(roles, slots, strict=False)
        )
        self._touch(view, launches)
        return ScaleAction(launches=launches)

    def initial_fleet(self, slots: int) -> Fleet:
        """What :meth:`start` launches on a cluster with room for ``slots`` instances."""
        if self.fleet is not None:
            return self.fleet
        if self.colocated:
            return Fleet(
                colocated=1 if self.autoscaled else int(slots * (self.fixed_fraction or 1))
            )
        count = 2 if self.autoscaled else max(2, int(slots * (self.fixed_fraction or 1)))
        prefill = max(1, min(count - 1, round(count * self.prefill_share)))
        return Fleet(prefill=prefill, decode=count - prefill)

    def host_emptied(self, view: ClusterView, host: str) -> None:
        """A host's DRAM cache lives ``ttl_s`` after its last instance (ServerlessLLM)."""
        if self.caches is not None:
            self.caches.released(host, self.cache_key, view.now_s)
        self._cache_until[host] = view.now_s + self.ttl_s

    def _touch(self, view: ClusterView, launches: tuple[Launch, ...]) -> None:
        topo = view.topology_now
        for launch in launches:
            host = topo.host_of(launch.gpus[0])
            self._cache_until[host] = math.inf
            if self.caches is not None and self.plane == "serverlessllm":
                self.caches.launch(host, self.cache_key, view.now_s)

    def scale(self, view: ClusterView, decision: ScaleDecision, idle_s: float) -> ScaleAction:
        if not self.autoscaled:
            return ScaleAction()
        releases = []
        deltas = (
            ("prefill", decision.prefill),
            ("decode", decision.decode),
            ("colocated", decision.colocated),
        )
        for role, delta in deltas:
            victim = view.idle_instance(role, idle_s) if delta < 0 else None
            if victim is not None and view.count(role) > 1:
                releases.append(victim.id)
        add_p, add_d = max(decision.prefill, 0), max(decision.decode, 0)
        if self.colocated:
            add_p, add_d = max(decision.colocated, 0), 0
        action = ScaleAction()
        if add_p + add_d:
            blitz = self.plane.startswith("blitzscale")
            action = (self._blitz if blitz else self._local)(view, add_p, add_d)
            self._touch(view, action.launches)
        return replace(action, releases=tuple(releases))

    def _local(self, view: ClusterView, add_p: int, add_d: int) -> ScaleAction:
        """AllCache / ServerlessLLM: host DRAM (a cache hit) or SSD, on the target's host."""
        state = view.snapshot()
        slots = state.free_slots(view.tp)[: add_p + add_d]
        hosts = {tuple(s): view.topology_now.host_of(s[0]) for s in slots}
        hits = [s for s in slots if self.plane == "allcache" or self._cached(view, hosts[tuple(s)])]
        misses = [s for s in slots if s not in hits]
        ready: dict[tuple[str, ...], tuple[float, ...]] = {}
        for group, method in ((hits, "allcache"), (misses, "serverlessllm")):
            if not group:
                continue
            mc = plan_multicast(
                state,
                view.model,
                targets=[list(g) for g in group],
                tp=view.tp,
                method=method,
                startup_s=self.startup_s,
            )
            for planned in mc.instances:
                ready[planned.gpus] = tuple(view.now_s + t for t in mc.layer_ready_s[planned.name])
        roles = ["colocated" if self.colocated else "prefill"] * add_p + ["decode"] * add_d
        launches = tuple(
            Launch(role, tuple(gpus), ready[tuple(gpus)])
            for role, gpus in zip(roles, slots, strict=False)
        )
        return ScaleAction(launches=launches, ssd_loads=len(misses))

    def _cached(self, view: ClusterView, host: str) -> bool:
        if self.caches is not None:
            return self.caches.holds(host, self.cache_key, view.now_s)
        return self._cache_until.get(host, -1.0) >= view.now_s

    def _blitz(self, view: ClusterView, add_p: int, add_d: int) -> ScaleAction:
        """BlitzScale: ``plan()`` (one target at a time for the network-only ablation)."""
        scale = _plan(view, self, add_p, add_d)
        if scale is None or scale.multicast is None:
            return ScaleAction()
        pairs = {pair.new: pair.old for pair in scale.live_pairs}
        launches = tuple(
            Launch(
                info.role,
                info.gpus,
                tuple(view.now_s + t for t in info.layer_ready_s),
                live=self.live and info.live and info.role in ("prefill", "colocated"),
                name=info.name,
                pair=pairs.get(info.name),
            )
            for info in scale.new_instances
        )
        return ScaleAction(
            launches=launches,
            mutations=tuple(m.instance for m in scale.mutations),
            weight_flows=scale.multicast.flows,
            plan=scale,
        )


def _plan(view: ClusterView, system: DataPlane, add_p: int, add_d: int) -> ScalePlan | None:
    """``plan()`` on the run's snapshot; a colocated system asks for ``add_p`` colocated
    replicas (plan() pairs each live one with the most loaded replica)."""
    request = ScaleRequest(view.model, prefill=add_p, decode=add_d, tp=view.tp)
    if system.colocated:
        request = ScaleRequest(view.model, colocated=add_p, tp=view.tp)
    options = PlanOptions(  # no wall-clock budget: a replay gives the same plans on any machine
        method="one_by_one" if system.plane == "blitzscale-network" else "greedy",
        mutate_decode=system.mutate,
        startup_s=system.startup_s,
        refine_budget=None,
    )
    state = view.snapshot()
    # prefill sources only when nothing else holds the weights (colocated replicas send no
    # KV to decode instances: they are sources anyway)
    for prefill_sources in (False, True):
        try:
            return plan(state, request, options=options, allow_prefill_sources=prefill_sources)
        except InfeasibleError:
            continue
    return None


SYSTEMS: dict[str, Callable[[], DataPlane]] = {
    "distserve-full": lambda: DataPlane("distserve-full", fixed_fraction=1.0),
    "distserve-half": lambda: DataPlane("distserve-half", fixed_fraction=0.5),
    "vllm-full": lambda: DataPlane("vllm-full", fixed_fraction=1.0, colocated=True),
    "vllm-avg": lambda: DataPlane("vllm-avg", fixed_fraction=1.0, colocated=True),
    "fixed": lambda: DataPlane("fixed", fixed_fraction=1.0),
    "serverlessllm": lambda: DataPlane("serverlessllm", plane="serverlessllm"),
    "allcache": lambda: DataPlane("allcache", plane="allcache"),
    "blitzscale-network": lambda: DataPlane("blitzscale-network", plane="blitzscale-network"),
    "blitzscale-multicast": lambda: DataPlane("blitzscale-multicast", plane="blitzscale-multicast"),
    "blitzscale": lambda: DataPlane("blitzscale", plane="blitzscale", live=True, mutate=True),
}
"""Every system :func:`~blitzplan.simulate` knows, by name."""

COLOCATED_SYSTEMS = ("vllm-full", "vllm-avg")
"""The systems that are colocated whatever ``serving`` says."""


def make_system(name: str, *, colocated: bool = False, fleet: Fleet | None = None) -> DataPlane:
    """A fresh system by name, colocated or not, with a fixed ``fleet`` when given."""
    if name not in SYSTEMS:
        raise InvalidInputError(f"system must be one of {', '.join(SYSTEMS)}, got {name!r}")
    return replace(SYSTEMS[name](), colocated=colocated, fleet=fleet)
