"""The discrete-event engine: one queue of typed events, the parts that handle them, the clock.

The serving tiers are parts behind one small interface (:class:`~.tiers.Tier`): the prefill relay
(:mod:`.prefill`) and decode instances (:mod:`.decode`) of a disaggregated fleet, joined by the
request path (:mod:`.router`) and KV transfers (:mod:`.flows`); or the colocated replicas
(:mod:`.colocated`) and their live pairs (:mod:`.pairs`). The other parts see narrow typed views
of the run, never the engine: systems a :class:`~.systems.ClusterView`, host failures a
:class:`~.faults.FaultView`, the autoscaler's signals a :class:`~.metrics.LoadView`. Systems
return :class:`~.systems.ScaleAction` values that :meth:`Simulator.apply` carries out. The queue
owns its tie-breaking counter and refuses an event booked in the past, so two runs of the same
input are identical and the clock never goes back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blitzplan.compute import ComputeModel
from blitzplan.live.policies import Policy
from blitzplan.models import ModelSpec
from blitzplan.sim.autoscaler import Autoscaler, ScaleDecision
from blitzplan.sim.events import (
    Arrival,
    CopyRestored,
    DecodeStep,
    Event,
    EventQueue,
    FlowDone,
    HostFailure,
    Iteration,
    LoadDone,
    RelayStep,
    Tick,
)
from blitzplan.sim.faults import FaultHandler
from blitzplan.sim.instances import NO_WORKER, SimInstance, SimRequest
from blitzplan.sim.loads import WeightLoad, load_hosts
from blitzplan.sim.metrics import autoscaler_load, watch_prefill_bound
from blitzplan.sim.parts import RunParts
from blitzplan.sim.serving import ServingOptions
from blitzplan.sim.systems import Launch, ScaleAction, System
from blitzplan.sim.ticks import TickSkip
from blitzplan.sim.traces import Trace
from blitzplan.topologies import Topology

__all__ = ["ScaleEvent", "Simulator"]


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
    colocated: int = 0


class Simulator(RunParts):
    """A stateful run over one trace; :meth:`run` drives the event loop to the end.

    ``serving`` (resolved :class:`~.serving.ServingOptions`) makes the fleet colocated, each
    replica sustaining ``replica_tokens_per_s`` prompt tokens a second (the autoscaler's
    capacity); None keeps it disaggregated.
    """

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
        serving: ServingOptions | None = None,
        replica_tokens_per_s: float | None = None,
        failures: Sequence[tuple[float, float, str]] = (),
        token_budget: int = 8192,
        max_decode_batch: int = 256,
        drain_limit_s: float = 600.0,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        self.requests = [
            SimRequest(i, r.arrival_s, max(1, r.prompt_tokens), max(1, r.output_tokens))
            for i, r in enumerate(trace.requests)
        ]
        self.queue = EventQueue(
            [r.arrival_s for r in self.requests], lambda i: Arrival(self.requests[i])
        )
        super().__init__(topology, model, tp=tp, compute=compute, token_budget=token_budget)
        self.system, self.autoscaler = system, autoscaler
        self.build(policy, serving, max_decode_batch, replica_tokens_per_s)
        self.faults = FaultHandler(self, topology, model, holds_host_copy=system.holds_host_copy)
        self.loads: list[WeightLoad] = []
        self.scale_events: list[ScaleEvent] = []
        self.pending = len(self.requests)
        self.arrived = 0
        self.end_s = (trace.duration_s if trace.requests else 0.0) + drain_limit_s
        self.events_processed = 0
        self.progress = progress
        self._draining: list[SimInstance] = []
        for sim_s, trace_s, host in failures:
            self.queue.push(sim_s, HostFailure(host, trace_s))
        self.ticks = TickSkip(
            self.requests,
            float(model.kv_bytes_per_token),
            [sim_s for sim_s, _, _ in failures],
            bounded=serving is None,
        )

    # --- the loop -----------------------------------------------------------------------------

    def run(self) -> None:
        self.begin()
        if self.next_s() is not None:
            self.steps(math.inf)
        self._close()

    def begin(self) -> None:
        """The fleet at time 0 and the first decision (a multi-model run calls it, then
        :meth:`steps` while :meth:`next_s` says an event is due, then :meth:`finish`)."""
        self.apply(self.system.start(self))
        if self.autoscaler is not None and self.requests:
            self.queue.push(self.autoscaler.interval_s, Tick())
        self._handlers: dict[type, Callable[[Event], None]] = {
            Arrival: self._arrival,  # type: ignore[dict-item]
            RelayStep: self._relay_step,  # type: ignore[dict-item]
            FlowDone: self._flow_done,  # type: ignore[dict-item]
            DecodeStep: self._decode_step,  # type: ignore[dict-item]
            Iteration: self._iteration,  # type: ignore[dict-item]
            LoadDone: self._load_done,  # type: ignore[dict-item]
            Tick: self._tick,  # type: ignore[dict-item]
            HostFailure: self.faults.host_failure,  # type: ignore[dict-item]
            CopyRestored: self.faults.copy_restored,  # type: ignore[dict-item]
        }
        self._next_report = 0.0

    def next_s(self) -> float | None:
        """When the next event is due, or None once the run is over (no request pending, no
        event left, or the next one past the drain limit)."""
        time_s = self.queue.next_s() if self.pending else None
        return None if time_s is None or time_s > self.end_s else time_s

    def steps(
        self,
        limit_s: float,
        *,
        at_limit: bool = True,
        before: Callable[[float], None] | None = None,
        after: Callable[[float], None] | None = None,
    ) -> float | None:
        """Handle the next event, and the ones after it while they are due before ``limit_s``
        (or at it, with ``at_limit``); when the next one is due (None: the run is over, as
        :meth:`next_s`). ``before(time_s)`` and ``after(time_s)`` are called before and after
        each event (a multi-model run's shared state and checks)."""
        queue, handlers = self.queue, self._handlers
        upcoming = self.next_s()
        while upcoming is not None:
            if before is not None:
                before(upcoming)
            time_s, event = queue.pop()
            handlers[type(event)](event)
            self.events_processed += 1
            if self.progress is not None and time_s >= self._next_report:
                self.progress(time_s / max(self.end_s, 1e-9))
                self._next_report = time_s + max(1.0, self.end_s / 50)
            if after is not None:
                after(time_s)
            upcoming = self.next_s()
            if upcoming is not None and (
                upcoming > limit_s or (upcoming == limit_s and not at_limit)
            ):
                break
        return upcoming

    def finish(self) -> None:
        """Close the run: unfinished requests are dropped, instances released."""
        self._close()

    def _close(self) -> None:
        for request in self.requests:
            if request.stage != "done" and not request.dropped:
                request.dropped = "unfinished when the run ended"
        for inst in self.instances.alive():
            self.instances.release(inst, self.now_s)
        self.faults.close(self.now_s)

    # --- handlers -----------------------------------------------------------------------------

    def _arrival(self, event: Arrival) -> None:
        request = event.request
        self.arrived += 1
        self.meter.prompt(self.now_s, request.prompt_tokens)
        self.path.arrive(request, self.now_s)
        watch_prefill_bound(self, getattr(self.autoscaler, "high", None))

    def _relay_step(self, event: RelayStep) -> None:
        self._wakes.discard((event.owner, self.now_s))
        if event.owner is not None:
            if self.pairs is not None:
                self.pairs.step(event.owner, self.now_s)
        elif self.router is not None:
            for done in self.prefill.step(self.now_s):
                self.router.prefilled(done, self.now_s)
        self._release_drained()

    def _flow_done(self, event: FlowDone) -> None:
        tag = self.flows.done(self.now_s, event.flow, event.version)
        if isinstance(tag, SimRequest):
            self.path.kv_landed(tag, self.now_s)

    def _decode_step(self, event: DecodeStep) -> None:
        if event.instance.alive and self.router is not None:
            self.router.decoded(event.instance, event.size, self.now_s)
            self._release_drained()

    def _iteration(self, event: Iteration) -> None:
        if self.colocated is not None:
            self.colocated.iteration_done(event.instance, event.number, self.now_s)
            self._release_drained()

    def _load_done(self, event: LoadDone) -> None:
        inst = event.instance
        if inst.state != "loading" or inst.ready_s != event.ready_s:
            return  # released, or its load was replanned since
        self.instances.loaded(inst, self.now_s)
        inst.idle_since_s = self.now_s
        self.notes.instance(self.now_s, inst, "loaded")
        if inst.new_worker == NO_WORKER:  # a live instance joins once it holds nothing
            self.tiers[inst.role].join(inst, self.now_s)

    def _tick(self, _: Tick) -> None:
        if self.autoscaler is None:
            return
        load = autoscaler_load(self)
        decision = self.autoscaler.decide(load)
        if decision.up:
            self.meter.hot(self.now_s)
        else:
            self.meter.cool(self.now_s)
        if decision.any:
            idle_s = float(getattr(self.autoscaler, "idle_timeout_s", 0.5))
            self.apply(self.system.scale(self, decision, idle_s), decision)
        interval = self.autoscaler.interval_s
        gap = 0.0 if decision.any else self.ticks.until(self, self.autoscaler, load) - self.now_s
        self.queue.push(self.now_s + interval * max(1, math.floor(gap / interval)), Tick())

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
                load_hosts(self.topology_now, action.plan),
            )
            self.loads.append(load)
            end = max(launch.ready_s for launch in action.launches)
            self.flows.set_weights(load.id, self.now_s, end, action.weight_flows)
        if decision is not None and action.launches:
            self._record(decision, action)

    def _launch(self, launch: Launch) -> SimInstance:
        """A new instance, loading until its last unit lands (live ones join a relay now)."""
        host = self.topology_now.host_of(launch.gpus[0])
        inst = self.instances.add(
            launch.role, launch.gpus, host, now_s=self.now_s, ready_s=launch.ready_s
        )
        self.queue.push(launch.ready_s, LoadDone(inst, launch.ready_s))
        inst.live = launch.live and self._join_live(inst, launch)
        if inst.live:
            first = max(launch.unit_ready_s[:2])
            self.notes.instance(self.now_s, inst, "launch-live", f"layer 1 at {first!r}")
        else:
            self.notes.instance(self.now_s, inst, "launch")
        return inst

    def _join_live(self, inst: SimInstance, launch: Launch) -> bool:
        if inst.role == "colocated":
            pairs = self.pairs
            return pairs is not None and pairs.start(
                inst, launch.unit_ready_s, launch.pair, self.now_s
            )
        self.prefill.join_new(inst, launch.unit_ready_s)
        return True

    def _record(self, decision: ScaleDecision, action: ScaleAction) -> None:
        serving = [la for la in action.launches if la.role != "decode"] or list(action.launches)
        first = min(max(la.unit_ready_s[:2]) if la.live else la.ready_s for la in serving)
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
                decision.colocated,
            )
        )

    def _drain(self, inst: SimInstance) -> None:
        """Stop giving ``inst`` work; it is released once its work is done."""
        inst.draining = True
        self.instances.changed()
        self._draining.append(inst)
        self.tiers[inst.role].leave(inst)
        self._release_drained()

    def _release_drained(self) -> None:
        for inst in list(self._draining):
            if inst.alive and self.tiers[inst.role].busy(inst):
                continue
            self._draining.remove(inst)
            if inst.alive:
                self.release(inst)

    def _mutate(self, inst: SimInstance) -> None:
        """A prefill instance becomes a decode instance in place (no transfer)."""
        self.prefill.leave(inst)
        inst.role, inst.kv_used = "decode", 0.0
        self.instances.changed()
        self.notes.instance(self.now_s, inst, "mutated")
        if inst.state == "serving":
            self.decode.join(inst, self.now_s)
