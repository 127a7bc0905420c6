"""The parts of one run, and the narrow views that the other parts read.

:class:`RunParts` builds the serving tiers of the fleet (disaggregated: the prefill relay, the
decode instances and the router between them; colocated: the replicas and their live pairs),
the transfers, the load meter and the event log, and answers the three views: a system's
:class:`~.systems.ClusterView`, the fault handler's :class:`~.faults.FaultView` and the
autoscaler's :class:`~.metrics.LoadView`. The engine (:class:`~.engine.Simulator`) adds the
clock, the handlers and the scale actions.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from blitzplan.cluster import ClusterState, HostCopy, QueuedRequest, Role
from blitzplan.compute import ComputeModel
from blitzplan.live.policies import Policy
from blitzplan.models import ModelSpec
from blitzplan.sim.colocated import ColocatedTier
from blitzplan.sim.decode import DecodeTier
from blitzplan.sim.events import (
    CopyRestored,
    DecodeStep,
    EventQueue,
    FlowDone,
    Iteration,
    LoadDone,
    RelayStep,
)
from blitzplan.sim.faults import FaultHandler
from blitzplan.sim.flows import Flows
from blitzplan.sim.instances import NO_WORKER, Instances, SimInstance, SimRequest
from blitzplan.sim.loads import WeightLoad
from blitzplan.sim.metrics import LoadMeter, nic_ingress_bytes_per_s
from blitzplan.sim.notes import Notes
from blitzplan.sim.pairs import LivePairs
from blitzplan.sim.prefill import PrefillTier
from blitzplan.sim.router import Router
from blitzplan.sim.serving import ServingOptions
from blitzplan.sim.snapshot import cluster_state, dealt_queues
from blitzplan.sim.systems import System
from blitzplan.sim.ticks import TickSkip
from blitzplan.sim.tiers import RequestPath, Tier
from blitzplan.topologies import Topology

__all__ = ["RunParts"]

KV_FRACTION_DISAGGREGATED = 0.9
"""A disaggregated instance's KV cache: this fraction of its GPUs' memory less its weights."""


class RunParts:
    """The parts of a run and the views it answers (see the module docstring)."""

    queue: EventQueue
    loads: list[WeightLoad]
    requests: list[SimRequest]
    pending: int
    arrived: int
    system: System
    faults: FaultHandler
    ticks: TickSkip

    def __init__(
        self,
        topology: Topology,
        model: ModelSpec,
        *,
        tp: int,
        compute: ComputeModel,
        token_budget: int,
    ) -> None:
        self.base_topology = self._topology_now = topology
        self.model, self.tp, self.compute, self.token_budget = model, tp, compute, token_budget
        self.gpu = topology.gpu_spec(topology.gpus()[0])
        self.meter, self.notes = LoadMeter(), Notes()
        self.flows = Flows(
            topology,
            lambda t, f, v: self.queue.push(t, FlowDone(f, v)),
            lambda number: self.queue.cancel(number),
        )
        self._wakes: set[tuple[str | None, float]] = set()
        self._ingress: tuple[Topology, float] | None = None
        self._capacity: float | None = None
        self.neighbours: Callable[[], list[tuple[ModelSpec, tuple[str, ...]]]] = list
        """In a multi-model run, the model and GPUs of every other model's instance alive now
        (they occupy GPUs plans must not take); one model: none."""
        self.copy_host: str | None = None
        """In a multi-model run, the host the shared parameter pool placed this model's one
        host copy on; None: where a pool of this model alone places it."""

    def build(
        self,
        policy: Policy,
        serving: ServingOptions | None,
        max_decode_batch: int,
        replica_tokens_per_s: float | None = None,
    ) -> None:
        """The tiers of a disaggregated fleet, and with ``serving`` those of a colocated one
        (whose replicas each sustain ``replica_tokens_per_s`` prompt tokens a second, decoding
        included: the autoscaler's prefill capacity; None: a budget-sized prefill's)."""
        self.serving, self.replica_tokens_per_s = serving, replica_tokens_per_s
        shard = self.model.shard(self.tp)
        kv = self.tp * (KV_FRACTION_DISAGGREGATED * self.gpu.memory_bytes - shard.total_bytes)
        blocks = serving.kv_blocks(self.model, self.gpu, self.tp) if serving else 0
        if serving is not None:
            kv = blocks * serving.block_size * float(self.model.kv_bytes_per_token)
        self.instances = Instances(max(0.0, kv))
        self.prefill = self._relay(policy, None, self.token_budget)
        self.decode = DecodeTier(
            self.model,
            self.compute,
            max_batch=max_decode_batch,
            step=lambda t, inst, n: self.queue.push(t, DecodeStep(inst, n)),
            cancel=self.queue.cancel,
        )
        self.router = Router(
            self.instances,
            self.prefill,
            self.decode,
            self.flows,
            tp=self.tp,
            meter=self.meter,
            notes=self.notes,
            settled=self.settled,
        )
        self.decode.admit = self.router.admit_backlog
        self.colocated: ColocatedTier | None = None
        self.pairs: LivePairs | None = None
        self.tiers: dict[str, Tier] = {"prefill": self.prefill, "decode": self.decode}
        self.path: RequestPath = self.router
        if serving is not None:
            self._build_colocated(policy, serving, blocks)

    def _build_colocated(self, policy: Policy, serving: ServingOptions, blocks: int) -> None:
        tier = ColocatedTier(
            self.model,
            self.compute,
            serving,
            blocks,
            notes=self.notes,
            schedule=lambda t, inst, n: self.queue.push(t, Iteration(inst, n)),
            settled=self.settled,
        )
        budget = serving.max_num_batched_tokens or self.token_budget
        self.pairs = LivePairs(
            tier,
            self.flows,
            self.model,
            tp=self.tp,
            relay=lambda owner: self._relay(policy, owner, budget),
            clock=lambda: self.now_s,
        )
        self.colocated, self.tiers, self.path = tier, {"colocated": tier}, tier

    def _relay(self, policy: Policy, owner: str | None, budget: int) -> PrefillTier:
        """A relay (the prefill tier's, or a colocated pair's) on this model and topology."""
        topo, model, compute = self.base_topology, self.model, self.compute
        gpu = topo.gpus()[0]
        nic, leaf = topo.nic_of(gpu), topo.leaf_of(gpu)
        edge = (nic, leaf) if leaf else (gpu, nic)

        def prefill_s(tokens: int, requests: int) -> float:
            layers = model.num_layers * compute.prefill_layer_s(tokens, requests=requests)
            return layers + compute.head_s(requests)

        relay = PrefillTier(
            model.num_layers,
            prefill_s,
            policy=policy,
            token_budget=budget,
            handoff_bytes_per_s=topo.bytes_per_s(edge),
            handoff_latency_s=topo.latency_s(edge),
            activation_bytes_per_token=float(model.activation_bytes_per_token),
            kv_bytes_per_token=float(model.kv_bytes_per_token),
            wake=lambda at_s: self.wake_relay(at_s, owner),
            clock=lambda: self.now_s,
        )
        relay.notes = self.notes
        return relay

    # --- time and topology --------------------------------------------------------------------

    @property
    def now_s(self) -> float:
        return self.queue.now_s

    def settled(self, request: SimRequest) -> None:
        """``request`` finished or was dropped."""
        self.pending -= 1
        self.ticks.settled(request)

    @property
    def topology_now(self) -> Topology:
        """The topology without the parts that failed so far."""
        return self._topology_now

    def degrade(self, topology: Topology) -> None:
        """What failed is gone: plans and new transfers use ``topology`` from now on."""
        self._topology_now = self.flows.topology = topology

    def wake_relay(self, at_s: float, owner: str | None = None) -> None:
        """A relay steps at ``at_s`` (once per instant, after everything else there)."""
        if (owner, at_s) not in self._wakes:
            self._wakes.add((owner, at_s))
            self.queue.push(at_s, RelayStep(owner), late=True)

    # --- what systems read (ClusterView) ------------------------------------------------------

    def count(self, role: str) -> int:
        return len(self.instances.active(role))

    def idle_instance(self, role: str, idle_s: float) -> SimInstance | None:
        """A serving instance of ``role`` idle for at least ``idle_s``, if any."""
        tier = self.tiers.get(role)
        for inst in sorted(self.instances.serving(role), key=lambda i: i.id, reverse=True):
            idle = tier is not None and not tier.busy(inst)
            if idle and self.now_s - inst.idle_since_s >= idle_s:
                return inst
        return None

    def snapshot(self, *, exclude: frozenset[str] = frozenset()) -> ClusterState:
        """The cluster as ``plan()`` sees it (:mod:`.snapshot`)."""
        if self.colocated is not None:
            queues = self._replica_queues()
        else:
            queues = dealt_queues(self.prefill, self.instances.serving("prefill"), self.now_s)
        state = cluster_state(
            self.topology_now,
            self.model,
            [i for i in self.instances.alive() if i.id not in exclude],
            queues,
            host_copy=not self.faults.copy_missing,
        )
        self._share(state)
        return state

    def _share(self, state: ClusterState) -> None:
        """A multi-model run's snapshot: this model's host copy where the shared pool put it,
        other models' instances on their GPUs (idle, no sources of this model)."""
        copy = state.pool.host_copy(self.model.identity)
        if self.copy_host is not None and copy is not None and copy.host != self.copy_host:
            state.pool.drop(copy.identity)
            node = state.topology.host_mem(self.copy_host)
            state.pool.add(HostCopy(copy.identity, self.copy_host, node, copy.bytes))
        for k, (model, gpus) in enumerate(self.neighbours()):
            state.add_instance(model, gpus=list(gpus), role=Role.IDLE, instance_id=f"x{k}")

    def _replica_queues(self) -> dict[str, list[QueuedRequest]]:
        tier, out = self.colocated, {}
        if tier is None:
            return {}
        for name, replica in tier.replicas.items():
            waiting = [r for r in replica.queues.waiting if r.tokens_done == 0]
            if self.pairs is not None:
                waiting += self.pairs.queue_of(replica)
            out[name] = [QueuedRequest(r.arrival_s - self.now_s, r.prompt_tokens) for r in waiting]
        return out

    # --- what the autoscaler reads (LoadView) -------------------------------------------------

    @property
    def serves_colocated(self) -> bool:
        return self.colocated is not None

    def queued_tokens(self) -> int:
        if self.colocated is not None:
            return self.colocated.queued_tokens()
        return self.prefill.queued_tokens

    def prefill_capacity_tokens_per_s(self) -> float:
        if self.colocated is not None and self.replica_tokens_per_s:
            return self.replica_tokens_per_s
        if self._capacity is None:  # asked at every tick and arrival: the same each time
            budget = self.token_budget
            self._capacity = budget / self.prefill.batch_s(budget, max(1, budget // 1024))
        return self._capacity

    def kv_bytes(self) -> tuple[float, float]:
        capacity = self.instances.kv_capacity_bytes
        if self.colocated is not None:
            serving = len(self.instances.serving("colocated"))
            return self.colocated.kv_used_fraction() * serving * capacity, capacity
        backlog = sum(self.decode.need_bytes(r) for r in self.decode.backlog)
        return sum(i.kv_used for i in self.instances.active("decode")) + backlog, capacity

    def kv_ingress_bytes_per_s(self) -> float:
        if self.colocated is not None:
            return math.inf
        topology = self.topology_now  # the same until a failure degrades it: asked every tick
        if self._ingress is None or self._ingress[0] is not topology:
            self._ingress = (topology, nic_ingress_bytes_per_s(topology, self.tp))
        return self._ingress[1]

    def quiet(self) -> bool:
        """Nothing loads or drains and the load window is empty."""
        now = self.now_s
        if self.meter.prompt_tokens(now) or self.meter.kv_bytes(now):
            return False
        return all(i.state == "serving" and not i.draining for i in self.instances.alive())

    # --- what the fault handler asks (FaultView) ----------------------------------------------

    def lose_host(self, host: str, nodes: set[str]) -> None:
        now = self.now_s
        for tag in self.flows.cancel(now, self.flows.crossing(nodes)):
            self.path.restart(tag, now, f"KV transfer lost with {host}")  # type: ignore[arg-type]
        for inst in self.instances.on_host(host):
            self.lose(inst, f"{inst.id} lost with {host}")
        for request in [
            r for r in self.decode.backlog if any(src.host == host for src, _ in r.kv_sources)
        ]:
            self.router.restart(request, now, f"KV cache lost with {host}")
        self.wake_relay(now)

    def lose(self, inst: SimInstance, reason: str) -> None:
        now = self.now_s
        self.notes.instance(now, inst, "lost")
        for request in self.tiers[inst.role].fail(inst, now):
            self.path.restart(request, now, reason)
        self.release(inst)

    def release(self, inst: SimInstance) -> None:
        """``inst``'s GPUs are free (a system learns when its host holds nothing more)."""
        self.instances.release(inst, self.now_s)
        self.notes.instance(self.now_s, inst, "released")
        if not self.instances.on_host(inst.host):
            self.system.host_emptied(self, inst.host)

    def retime(self, inst: SimInstance, units: tuple[float, ...]) -> None:
        inst.ready_s = max(self.now_s, *units)
        self.queue.push(inst.ready_s, LoadDone(inst, inst.ready_s))
        if inst.new_worker == NO_WORKER:
            return
        if self.pairs is not None and inst.role == "colocated":
            self.pairs.retime(inst, units)
        else:
            self.prefill.retime(inst, units)

    def serving_gpu(self) -> str | None:
        donors = [i for i in self.instances.alive() if i.state == "serving"]
        return donors[0].gpus[0] if donors else None

    def book(self, time_s: float, event: CopyRestored) -> None:
        self.queue.push(time_s, event)

    def end_run(self, reason: str) -> None:
        for inst in self.instances.alive():
            self.release(inst)
        for request in self.requests:
            if request.stage != "done" and not request.dropped:
                request.dropped = reason
        self.pending = 0
