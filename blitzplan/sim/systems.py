"""The systems the simulator compares, each a data plane under the same autoscaler.

* ``distserve-full`` / ``distserve-half``: every GPU / half of them, fixed, preloaded.
* ``serverlessllm``: autoscaled; a host DRAM cache kept ``ttl_s`` per host after its last
  instance, else SSD -> DRAM -> GPU; new instances serve once fully loaded.
* ``allcache``: autoscaled; host DRAM, always a hit; serves once loaded.
* ``blitzscale-network``: autoscaled; weights from serving GPUs or the one host copy over the
  network, one target at a time; serves once loaded.
* ``blitzscale-multicast``: the same in multicast chains (``plan()``, greedy).
* ``blitzscale``: chains, plus live ZigZag pairs and decode scaling by mutation.

The ablations add one idea at a time (the paper's Figure 20); ``blitzscale`` has them all. The
autoscaler decides decode counts, so ``plan()``'s decode pre-scaling is off here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from blitzplan.cluster import ClusterState, QueuedRequest
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.live.schedule import Schedule
from blitzplan.live.solve import schedule_live
from blitzplan.multicast import plan_multicast
from blitzplan.multicast.setup import available_slots
from blitzplan.scale import ScalePlan, ScaleRequest, plan
from blitzplan.scale.plan import Options, live_instance
from blitzplan.scale.replan import _degrade
from blitzplan.sim.autoscaler import ScaleDecision
from blitzplan.sim.engine import SimInstance, SimRequest, Simulator
from blitzplan.topologies import Topology

__all__ = ["SYSTEMS", "make_system"]


@dataclass
class System:
    """Shared behaviour: starting instances, releases, the topology after failures."""

    name: str
    fixed_fraction: float | None = None
    plane: str = "blitzscale"
    live: bool = False
    mutate: bool = False
    ttl_s: float = 60.0
    prefill_share: float = 0.5
    startup_s: float = 0.0
    _degraded: dict[frozenset[str], Topology] = field(default_factory=dict)
    _cache_until: dict[str, float] = field(default_factory=dict)

    @property
    def autoscaled(self) -> bool:
        return self.fixed_fraction is None

    def start(self, sim: Simulator) -> None:
        """The instances at time 0: all of them for fixed systems, one of each otherwise."""
        state = sim.snapshot()
        slots = available_slots(state, sim.tp)
        if len(slots) < 2:
            raise InvalidInputError(
                f"topology {sim.topology.name!r} has room for {len(slots)} tp={sim.tp} "
                f"instances of {sim.model.name}; a disaggregated cluster needs at least 2"
            )
        count = 2 if self.autoscaled else max(2, int(len(slots) * (self.fixed_fraction or 1)))
        prefill = max(1, min(count - 1, round(count * self.prefill_share)))
        for k, gpus in enumerate(slots[:count]):
            inst = sim.add_instance("prefill" if k < prefill else "decode", gpus, ready_s=0.0)
            self._touch_cache(sim, inst)

    def topology_now(self, sim: Simulator) -> Topology:
        if not sim.failed_gpus:
            return sim.topology
        key = frozenset(sim.failed_gpus)
        if key not in self._degraded:
            dead = {n for _, host in sim.failed_hosts for n in sim.topology.nodes_of_host(host)}
            self._degraded[key] = _degrade(sim.topology, dead, set())[0]
        return self._degraded[key]

    def released(self, sim: Simulator, inst: SimInstance) -> None:
        host = sim.topology.host_of(inst.gpus[0])
        alive = [
            i
            for i in sim.instances.values()
            if i.state != "released" and sim.topology.host_of(i.gpus[0]) == host
        ]
        if not alive:
            self._cache_until[host] = sim.now + self.ttl_s

    def _touch_cache(self, sim: Simulator, inst: SimInstance) -> None:
        self._cache_until[sim.topology.host_of(inst.gpus[0])] = math.inf

    def host_copy_lost(self, sim: Simulator, host: str) -> float | None:
        """Seconds to rebuild the one host copy if ``host`` held it (BlitzScale planes only)."""
        if not self.plane.startswith("blitzscale"):
            return None
        state = ClusterState(sim.topology, models=[sim.model])
        if state.pool.host_copies[0].host != host:
            return None
        size = float(sim.model.total_bytes)
        donors = [i for i in sim.instances.values() if i.state == "serving"]
        if donors:  # copy the weights back from a serving GPU into its host's DRAM
            gpu = donors[0].gpus[0]
            memory = sim.topology.host_mem(sim.topology.host_of(gpu))
            return size / sim.topology.bottleneck_bytes_per_s(gpu, memory)
        alive = [h for h in sim.topology.hosts() if h != host]
        if not alive:
            return None
        return size / sim.topology.bottleneck_bytes_per_s(
            sim.topology.ssd(alive[0]), sim.topology.host_mem(alive[0])
        )

    def host_copy_restored(self, sim: Simulator, host: str) -> None:
        del sim, host

    # --- scaling ----------------------------------------------------------------------------

    def scale(self, sim: Simulator, decision: ScaleDecision) -> None:
        if not self.autoscaled:
            return
        idle = sim.autoscaler.idle_timeout_s if sim.autoscaler else 0.5  # type: ignore[attr-defined]
        for role, delta in (("prefill", decision.prefill), ("decode", decision.decode)):
            if delta < 0:
                victim = sim.idle_instance(role, idle)
                if victim is not None and len(sim.active(role)) > 1:
                    sim.release(victim)
        add_p, add_d = max(decision.prefill, 0), max(decision.decode, 0)
        if add_p + add_d == 0:
            return
        if self.plane.startswith("blitzscale"):
            self._scale_blitz(sim, decision, add_p, add_d)
        else:
            self._scale_local(sim, decision, add_p, add_d)

    def _scale_local(self, sim: Simulator, decision: ScaleDecision, add_p: int, add_d: int) -> None:
        state = sim.snapshot()
        slots = available_slots(state, sim.tp)[: add_p + add_d]
        if not slots:
            return
        roles = ["prefill"] * add_p + ["decode"] * add_d
        hits = [
            s
            for s in slots
            if self.plane == "allcache"
            or self._cache_until.get(sim.topology.host_of(s[0]), -1.0) >= sim.now
        ]
        misses = [s for s in slots if s not in hits]
        ready: dict[tuple[str, ...], float] = {}
        for group, method in ((hits, "allcache"), (misses, "serverlessllm")):
            if group:
                mc = plan_multicast(
                    state,
                    sim.model,
                    targets=[list(g) for g in group],
                    tp=sim.tp,
                    method=method,
                    startup_s=self.startup_s,
                )
                for planned in mc.instances:
                    ready[planned.gpus] = mc.ready_at_s[planned.name]
        first = math.inf
        for role, gpus in zip(roles, slots, strict=False):
            inst = sim.add_instance(role, gpus, ready_s=sim.now + ready[gpus])
            self._touch_cache(sim, inst)
            if role == "prefill":
                first = min(first, inst.ready_s)
        full = max(sim.now + t for t in ready.values())
        sim.record_scale(decision, first if math.isfinite(first) else full, full)

    def _scale_blitz(self, sim: Simulator, decision: ScaleDecision, add_p: int, add_d: int) -> None:
        state = sim.snapshot()
        method = "one_by_one" if self.plane == "blitzscale-network" else "greedy"
        request = ScaleRequest(sim.model, prefill=add_p, decode=add_d, tp=sim.tp)
        options = {
            "method": method,
            "compare_baselines": False,
            "prescale_decode": False,
            "mutate_decode": self.mutate,
            "startup_s": self.startup_s,
        }
        try:
            scale = plan(state, request, **options)  # type: ignore[arg-type]
        except InfeasibleError:
            # only prefill instances hold the weights (the host copy is being rebuilt)
            try:
                scale = plan(state, request, allow_prefill_sources=True, **options)  # type: ignore[arg-type]
            except InfeasibleError:
                return
        if scale.multicast is None:
            return
        names = {}
        for info in scale.new_instances:
            inst = sim.add_instance(info.role, info.gpus, ready_s=sim.now + info.ready_at_s)
            names[info.name] = inst
        sim.add_weight_flows(scale.multicast.flows, sim.now + scale.milestones.full_capacity_s)
        for mutation in scale.mutations:
            target = sim.instances.get(mutation.instance)
            if target is not None and target.state != "released":
                sim.mutate(target)
        first = sim.now + min(info.ready_at_s for info in scale.new_instances)
        if self.live:
            for pair in scale.live_pairs:
                started = self._run_pair(sim, state, scale, pair.new, names[pair.new], pair.old)
                first = min(first, started)
        sim.record_scale(decision, first, sim.now + scale.milestones.full_capacity_s)

    def _run_pair(
        self,
        sim: Simulator,
        state: ClusterState,
        scale: ScalePlan,
        name: str,
        new: SimInstance,
        old_id: str,
    ) -> float:
        """Relay the head of the old instance's queue through the ZigZag policy: the requests
        the pair finishes before the scale event's full capacity (the rest stay queued and
        spread over the new instances when they are ready). Returns when the new instance
        first ran a layer."""
        old = sim.instances.get(old_id)
        mc = scale.multicast
        if old is None or old.state != "serving" or not old.queue or mc is None:
            return math.inf
        queue = sorted(old.queue, key=lambda r: (r.arrival_s, r.id))
        offset = sim.now + max(0.0, old.busy_until_s - sim.now)
        horizon = sim.now + scale.milestones.full_capacity_s
        schedule = self._zigzag(sim, state, mc.layer_ready_s[name], new, old, queue)
        kept = sum(1 for done in schedule.completion_s if offset + done <= horizon)
        if kept == 0:
            return math.inf
        if kept < len(queue):
            queue = queue[:kept]
            schedule = self._zigzag(sim, state, mc.layer_ready_s[name], new, old, queue)
        for request in queue:
            old.queue.remove(request)
            old.queued_tokens -= request.prompt_tokens
        for request, done in zip(queue, schedule.completion_s, strict=True):
            sim.relay(request, old, offset + done)
        if schedule.old_ops:
            sim.hold(old, offset + max(op.end_s for op in schedule.old_ops))
        if schedule.new_ops:
            new.ready_s = max(new.ready_s, offset + max(op.end_s for op in schedule.new_ops))
            return offset + min(op.start_s for op in schedule.new_ops)
        return math.inf

    @staticmethod
    def _zigzag(
        sim: Simulator,
        state: ClusterState,
        unit_ready_s: tuple[float, ...],
        new: SimInstance,
        old: SimInstance,
        queue: list[SimRequest],
    ) -> Schedule:
        problem = live_instance(
            state,
            sim.model,
            new.gpus,
            unit_ready_s,
            state.instance(old.id),
            [QueuedRequest(r.arrival_s - sim.now, r.prompt_tokens) for r in queue],
            Options(),
            sim.tp,
        )
        return schedule_live(problem, method="zigzag")


SYSTEMS: dict[str, Callable[[], System]] = {
    "distserve-full": lambda: System("distserve-full", fixed_fraction=1.0),
    "distserve-half": lambda: System("distserve-half", fixed_fraction=0.5),
    "serverlessllm": lambda: System("serverlessllm", plane="serverlessllm"),
    "allcache": lambda: System("allcache", plane="allcache"),
    "blitzscale-network": lambda: System("blitzscale-network", plane="blitzscale-network"),
    "blitzscale-multicast": lambda: System("blitzscale-multicast", plane="blitzscale-multicast"),
    "blitzscale": lambda: System("blitzscale", plane="blitzscale", live=True, mutate=True),
}
"""Every system :func:`~blitzplan.simulate` knows, by name."""


def make_system(name: str) -> System:
    if name not in SYSTEMS:
        raise InvalidInputError(f"system must be one of {', '.join(SYSTEMS)}, got {name!r}")
    return SYSTEMS[name]()
