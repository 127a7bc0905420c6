"""The discrete-event engine: one queue of typed events, the parts that handle them, the clock.

The parts a reader can find: requests and the instance lifecycle (:mod:`.instances`), the request
path (:mod:`.router`), the prefill relay (:mod:`.prefill`), decode (:mod:`.decode`), transfers
(:mod:`.flows`), the autoscaler's signals (:mod:`.metrics`), the systems and their scale actions
(:mod:`.systems`), loads in flight (:mod:`.loads`) and host failures (:mod:`.faults`). Every
handler changes state through those parts; systems return :class:`~.systems.ScaleAction` values
that :meth:`Simulator.apply` carries out. The queue owns its tie-breaking counter, so two runs of
the same input are identical.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blitzplan.cluster import ClusterState, QueuedRequest, Role
from blitzplan.compute import ComputeModel
from blitzplan.live.policies import Policy
from blitzplan.models import ModelSpec
from blitzplan.sim.autoscaler import Autoscaler, ScaleDecision
from blitzplan.sim.decode import DecodeTier
from blitzplan.sim.events import (
    Arrival,
    CopyRestored,
    DecodeStep,
    Event,
    EventQueue,
    FlowDone,
    HostFailure,
    LoadDone,
    RelayStep,
    Tick,
)
from blitzplan.sim.faults import FaultHandler
from blitzplan.sim.flows import Flows
from blitzplan.sim.instances import NO_WORKER, Instances, SimInstance, SimRequest
from blitzplan.sim.loads import WeightLoad, load_hosts
from blitzplan.sim.metrics import LoadMeter, autoscaler_load, watch_prefill_bound
from blitzplan.sim.prefill import PrefillTier
from blitzplan.sim.router import Router
from blitzplan.sim.systems import Launch, ScaleAction, System
from blitzplan.sim.traces import Trace
from blitzplan.topologies import Topology

__all__ = ["ScaleEvent", "Simulator"]

SNAPSHOT_QUEUE = 32
"""A snapshot deals the relay's queued requests round-robin to the serving prefill instances,
at most this many each (plan() reads them to pair live instances; the relay ignores its pairs)."""


@dataclass(frozen=True)
class ScaleEvent:
    """One scaling decision and what it bought (seconds into the run)."""

    decided_s: float
    detected_s: float
    reason: str
    prefill: int
    decode: int
    first_capacity_s: float
    full_capacity_s: float
    ssd_loads: int = 0
    launched: int = 0


class Simulator:
    """A stateful run over one trace; :meth:`run` drives the event loop to the end."""

    def __init__(
        self,
        topology: Topology,
        model: ModelSpec,
        trace: Trace,
        *,
        tp: int,
        system: System,
        autoscaler: Autoscaler | None,
        compute: ComputeModel,
        policy: Policy,
        failures: Sequence[tuple[float, float, str]] = (),
        token_budget: int = 8192,
        max_decode_batch: int = 256,
        drain_limit_s: float = 600.0,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.base_topology = self._topology_now = topology
        self.model, self.tp, self.system, self.autoscaler = model, tp, system, autoscaler
        self.compute, self.token_budget = compute, token_budget
        self.now_s = 0.0
        self.queue = EventQueue()
        gpu = topology.gpu_spec(topology.gpus()[0])
        kv_capacity = max(0.0, tp * (0.9 * gpu.memory_bytes - model.shard(tp).total_bytes))
        self.instances = Instances(kv_capacity)
        self.flows = Flows(topology, lambda t, f, v: self.queue.push(t, FlowDone(f, v)))
        self.prefill = self._prefill_tier(policy)
        self.decode = DecodeTier(
            model,
            compute,
            max_batch=max_decode_batch,
            step=lambda t, inst, n: self.queue.push(t, DecodeStep(inst, n)),
        )
        self.meter = LoadMeter()
        self.router = Router(
            self.instances,
            self.prefill,
            self.decode,
            self.flows,
            tp=tp,
            meter=self.meter,
            finished=self._finished,
        )
        self.prefill.note = self.router.note
        self.prefill.note_instance = self.router.note_instance
        self.faults = FaultHandler(self)
        self.loads: list[WeightLoad] = []
        self.scale_events: list[ScaleEvent] = []
        self.requests = [
            SimRequest(i, r.arrival_s, max(1, r.prompt_tokens), max(1, r.output_tokens))
            for i, r in enumerate(trace.requests)
        ]
        self.pending = len(self.requests)
        self.end_s = (trace.duration_s if trace.requests else 0.0) + drain_limit_s
        self.events_processed = 0
        self.progress = progress
        self._wakes: set[float] = set()
        self._draining: list[SimInstance] = []
        for request in self.requests:
            self.queue.push(request.arrival_s, Arrival(request))
        for sim_s, trace_s, host in failures:
            self.queue.push(sim_s, HostFailure(host, trace_s))

    def _prefill_tier(self, policy: Policy) -> PrefillTier:
        topo = self.base_topology
        gpu = topo.gpus()[0]
        nic, leaf = topo.nic_of(gpu), topo.leaf_of(gpu)
        edge = (nic, leaf) if leaf else (gpu, nic)
        model, compute = self.model, self.compute

        def prefill_s(tokens: int, requests: int) -> float:
            layers = model.num_layers * compute.prefill_layer_s(tokens, requests=requests)
            return layers + compute.head_s(requests)

        return PrefillTier(
            model.num_layers,
            prefill_s,
            policy=policy,
            token_budget=self.token_budget,
            handoff_bytes_per_s=topo.bytes_per_s(edge),
            handoff_latency_s=topo.latency_s(edge),
            activation_bytes_per_token=float(model.activation_bytes_per_token),
            kv_bytes_per_token=float(self.model.kv_bytes_per_token),
            wake=self.wake_relay,
        )

    # --- the loop -----------------------------------------------------------------------------

    @property
    def topology_now(self) -> Topology:
        """The topology without the parts that failed so far."""
        return self._topology_now

    def degrade(self, topology: Topology) -> None:
        """What failed is gone: plans and new transfers use ``topology`` from now on."""
        self._topology_now = self.flows.topology = topology

    def run(self) -> None:
        self.apply(self.system.start(self))
        if self.autoscaler is not None and self.requests:
            self.queue.push(self.autoscaler.interval_s, Tick())
        handlers: dict[type, Callable[[Event], None]] = {
            Arrival: self._arrival,  # type: ignore[dict-item]
            RelayStep: self._relay_step,  # type: ignore[dict-item]
            FlowDone: self._flow_done,  # type: ignore[dict-item]
            DecodeStep: self._decode_step,  # type: ignore[dict-item]
            LoadDone: self._load_done,  # type: ignore[dict-item]
            Tick: self._tick,  # type: ignore[dict-item]
            HostFailure: self.faults.host_failure,  # type: ignore[dict-item]
            CopyRestored: self.faults.copy_restored,  # type: ignore[dict-item]
        }
        next_report = 0.0
        while self.queue and self.pending:
            time_s, event = self.queue.pop()
            if time_s > self.end_s:
                break
            self.now_s = time_s
            handlers[type(event)](event)
            self.events_processed += 1
            if self.progress is not None and time_s >= next_report:
                self.progress(time_s / max(self.end_s, 1e-9))
                next_report = time_s + max(1.0, self.end_s / 50)
        self._close()

    def _close(self) -> None:
        for request in self.requests:
            if request.stage != "done" and not request.dropped:
                request.dropped = "unfinished when the run ended"
        for inst in self.instances.alive():
            self.instances.release(inst, self.now_s)
        self.faults.close(self.now_s)

    def _finished(self, request: SimRequest) -> None:
        self.pending -= 1

    def wake_relay(self, at_s: float) -> None:
        """The relay steps at ``at_s`` (once per instant, after everything else there)."""
        if at_s not in self._wakes:
            self._wakes.add(at_s)
            self.queue.push(at_s, RelayStep(), late=True)

    # --- handlers -----------------------------------------------------------------------------

    def _arrival(self, event: Arrival) -> None:
        request = event.request
        self.meter.prompt(self.now_s, request.prompt_tokens)
        self.router.arrive(request, self.now_s)
        watch_prefill_bound(self)

    def _relay_step(self, _: RelayStep) -> None:
        self._wakes.discard(self.now_s)
        for done in self.prefill.step(self.now_s):
            self.router.prefilled(done, self.now_s)
        self._release_drained()

    def _flow_done(self, event: FlowDone) -> None:
        tag = self.flows.done(self.now_s, event.flow, event.version)
        if isinstance(tag, SimRequest):
            self.router.kv_landed(tag, self.now_s)

    def _decode_step(self, event: DecodeStep) -> None:
        if event.instance.alive:
            self.router.decoded(event.instance, event.size, self.now_s)
            self._release_drained()

    def _load_done(self, event: LoadDone) -> None:
        inst = event.instance
        if inst.state != "loading" or inst.ready_s != event.ready_s:
            return  # released, or its load was replanned since
        self.instances.loaded(inst, self.now_s)
        inst.idle_since_s = self.now_s
        self.router.note_instance(self.now_s, inst, "loaded")
        if inst.role == "decode":
            self.router.admit_backlog(self.now_s)
        elif inst.new_worker == NO_WORKER:
            self.prefill.join_old(inst)  # a live instance joins once it holds nothing

    def _tick(self, _: Tick) -> None:
        if self.autoscaler is None:
            return
        decision = self.autoscaler.decide(autoscaler_load(self))
        if decision.prefill > 0 or decision.decode > 0:
            self.meter.hot(self.now_s)
        else:
            self.meter.cool(self.now_s)
        if decision.prefill or decision.decode:
            idle_s = float(getattr(self.autoscaler, "idle_timeout_s", 0.5))
            self.apply(self.system.scale(self, decision, idle_s), decision)
        self.queue.push(self.now_s + self.autoscaler.interval_s, Tick())

    # --- applying decisions -------------------------------------------------------------------

    def apply(self, action: ScaleAction, decision: ScaleDecision | None = None) -> None:
        """Carry out a system's scale action."""
        for inst_id in action.releases:
            self._drain(self.instances.by_id[inst_id])
        for inst_id in action.mutations:
            inst = self.instances.by_id.get(inst_id)
            if inst is not None and inst.alive and inst.role == "prefill":
                self._mutate(inst)
        named = {launch.name: self._launch(launch) for launch in action.launches}
        if action.plan is not None and action.launches:
            load = WeightLoad(
                len(self.loads),
                self.now_s,
                action.plan,
                named,
                {launch.name: launch.unit_ready_s for launch in action.launches},
                load_hosts(self._topology_now, action.plan),
            )
            self.loads.append(load)
            end = max(launch.ready_s for launch in action.launches)
            self.flows.set_weights(load.id, self.now_s, end, action.weight_flows)
        if decision is not None and action.launches:
            self._record(decision, action)

    def _launch(self, launch: Launch) -> SimInstance:
        """A new instance, loading until its last unit lands (live ones join the relay now)."""
        host = self._topology_now.host_of(launch.gpus[0])
        inst = self.instances.add(
            launch.role, launch.gpus, host, now_s=self.now_s, ready_s=launch.ready_s
        )
        inst.live = launch.live
        self.queue.push(launch.ready_s, LoadDone(inst, launch.ready_s))
        if launch.live:
            first = max(launch.unit_ready_s[:2])
            self.router.note_instance(self.now_s, inst, "launch-live", f"layer 1 at {first!r}")
            self.prefill.join_new(inst, launch.unit_ready_s)
        else:
            self.router.note_instance(self.now_s, inst, "launch")
        return inst

    def _record(self, decision: ScaleDecision, action: ScaleAction) -> None:
        prefill = [la for la in action.launches if la.role == "prefill"] or list(action.launches)
        first = min(max(la.unit_ready_s[:2]) if la.live else la.ready_s for la in prefill)
        full = max(la.ready_s for la in action.launches)
        detected = self.meter.detected_s(self.now_s)
        self.scale_events.append(
            ScaleEvent(
                self.now_s,
                detected,
                decision.reason,
                decision.prefill,
                decision.decode,
                first,
                full,
                action.ssd_loads,
                len(action.launches),
            )
        )

    def _drain(self, inst: SimInstance) -> None:
        """Stop giving ``inst`` work; it is released once its work is done."""
        inst.draining = True
        self._draining.append(inst)
        if inst.role == "prefill":
            self.prefill.leave(inst)
        self._release_drained()

    def _release_drained(self) -> None:
        for inst in list(self._draining):
            if inst.alive and self._busy(inst):
                continue
            self._draining.remove(inst)
            if inst.alive:
                self.release(inst)

    def _busy(self, inst: SimInstance) -> bool:
        if inst.role == "prefill":
            return self.prefill.busy(inst)
        return bool(inst.running) or inst.kv_used > 0

    def release(self, inst: SimInstance) -> None:
        self.instances.release(inst, self.now_s)
        self.router.note_instance(self.now_s, inst, "released")
        if not self.instances.on_host(inst.host):
            self.system.host_emptied(self, inst.host)

    def _mutate(self, inst: SimInstance) -> None:
        """A prefill instance becomes a decode instance in place (no transfer)."""
        self.prefill.leave(inst)
        inst.role, inst.kv_used = "decode", 0.0
        self.router.note_instance(self.now_s, inst, "mutated")
        if inst.state == "serving":
            self.router.admit_backlog(self.now_s)

    # --- what systems and the autoscaler read -------------------------------------------------

    def count(self, role: str) -> int:
        return len(self.instances.active(role))

    def idle_instance(self, role: str, idle_s: float) -> SimInstance | None:
        """A serving instance of ``role`` idle for at least ``idle_s``, if any."""
        for inst in sorted(self.instances.serving(role), key=lambda i: i.id, reverse=True):
            if not self._busy(inst) and self.now_s - inst.idle_since_s >= idle_s:
                return inst
        return None

    def snapshot(
        self, *, topology: Topology | None = None, exclude: frozenset[str] = frozenset()
    ) -> ClusterState:
        """The cluster as plan() sees it: instances with queues (the relay's, dealt out) and KV
        use; loading instances hold their GPUs but are no sources."""
        state = ClusterState(topology or self._topology_now, models=[self.model])
        if self.faults.copy_missing:
            state.pool.drop(self.model.identity)
        queues = self._dealt_queues()
        for inst in self.instances.alive():
            if inst.id in exclude:
                continue
            state.add_instance(
                self.model,
                gpus=list(inst.gpus),
                role=Role.LOADING if inst.state == "loading" else Role(inst.role),
                queue=queues.get(inst.id, []),
                kv_bytes_used=int(inst.kv_used),
                instance_id=inst.id,
            )
        return state

    def _dealt_queues(self) -> dict[str, list[QueuedRequest]]:
        serving = [i for i in self.instances.serving("prefill") if i.new_worker == NO_WORKER]
        queues: dict[str, list[QueuedRequest]] = {i.id: [] for i in serving}
        relay, cap = self.prefill.relay, SNAPSHOT_QUEUE * len(serving)
        waiting = [r for b in list(relay.waiting)[:cap] for r in self.prefill.batches[b]]
        for k, request in enumerate(waiting[:cap]):
            queues[serving[k % len(serving)].id].append(
                QueuedRequest(request.arrival_s - self.now_s, request.prompt_tokens)
            )
        return queues
