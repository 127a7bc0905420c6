"""One replay, once :func:`~blitzplan.sim.simulate` checked its arguments: the trace cut and
rescaled, the fleet sized, the engine run, the report assembled."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from blitzplan._collector import collector_relaxed
from blitzplan._progress import position_bar
from blitzplan.cluster import ClusterState
from blitzplan.compute import ComputeModel, RooflineComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.live.policies import Policy
from blitzplan.models import ModelSpec
from blitzplan.sim.autoscaler import Autoscaler, PaperAutoscaler
from blitzplan.sim.capacity import capacity_rate_per_s, replica_rate_per_s
from blitzplan.sim.engine import Simulator
from blitzplan.sim.faults import check_failures
from blitzplan.sim.report import RequestRecord, SimReport
from blitzplan.sim.serving import ServingOptions
from blitzplan.sim.systems import Fleet, make_system
from blitzplan.sim.traces import MAX_TRACE_S, Trace
from blitzplan.topologies import Topology

__all__ = ["TARGET_LOAD", "Replay"]

_LOG = logging.getLogger("blitzplan.sim")  # the simulator's one logger

TARGET_LOAD = 0.5
"""With ``rate_scale=None`` the trace is rescaled to this fraction of the cluster's capacity
(the paper's setting; :func:`~.capacity.capacity_rate_per_s`)."""


@dataclass(frozen=True)
class Replay:
    """The checked setting of one run: cluster, model, system, fleet and colocated options."""

    topology: Topology
    model: ModelSpec
    tp: int
    system: str
    fleet: Fleet | None
    colocated: bool
    options: ServingOptions

    def replay(
        self,
        trace: Trace,
        *,
        window_s: tuple[float, float] | None,
        rate_scale: float | None,
        failures: Sequence[tuple[float, str]],
        autoscaler: Autoscaler | None,
        compute: ComputeModel | None,
        live_policy: Policy,
        slos: tuple[float | None, float | None],
        drain_limit_s: float,
        record: tuple[bool, bool],
        progress: bool,
    ) -> SimReport:
        topo, spec = self.topology, self.model
        gpu = topo.gpu_spec(topo.gpus()[0])
        serving = self.options.resolved(spec, gpu) if self.colocated else None
        slots = len(ClusterState(topo).free_slots(self.tp))
        cost = compute or RooflineComputeModel(spec, gpu, tp=self.tp)
        start_s = 0.0 if window_s is None else float(window_s[0])
        cut = trace if window_s is None else trace.window(*window_s)
        replica = _ReplicaRate(self, cut, cost, serving)
        scale = self._rate_scale(rate_scale, cut, cost, replica)
        base = _rescaled(cut, scale)
        fleet = self._fleet(slots, base, replica)
        runner = make_system(self.system, colocated=self.colocated, fleet=fleet)
        self._check_room(slots, runner.initial_fleet(slots))
        faults = check_failures(
            failures, hosts=topo.hosts(), start_s=start_s, span_s=cut.duration_s, rate_scale=scale
        )
        scaler = (autoscaler or PaperAutoscaler()) if runner.autoscaled else None
        replica_tokens_per_s = None
        if serving is not None and scaler is not None and base.requests:
            replica_tokens_per_s = replica() * base.mean_prompt_tokens
        ttft_slo, tbt_slo = _slos(spec, base, cost, *slos)
        sim = Simulator(
            topo,
            spec,
            base,
            tp=self.tp,
            system=runner,
            autoscaler=scaler,
            compute=cost,
            policy=live_policy,
            serving=serving,
            replica_tokens_per_s=replica_tokens_per_s,
            failures=faults,
            drain_limit_s=drain_limit_s,
        )
        wall = _run(sim, self.system, base, record, progress)
        report = _report(sim, self, base, wall, (ttft_slo, tbt_slo), live_policy)
        return replace(report, rate_scale=scale, trace_start_s=start_s)

    def _rate_scale(
        self, rate_scale: float | None, trace: Trace, cost: ComputeModel, replica: _ReplicaRate
    ) -> float:
        if len(trace) <= 1:
            return 1.0
        if rate_scale is not None:
            return rate_scale
        if replica.serving is not None:
            capacity = len(ClusterState(self.topology).free_slots(self.tp)) * replica()
        else:
            capacity = capacity_rate_per_s(
                self.topology, self.model, trace, tp=self.tp, compute=cost
            )
        return TARGET_LOAD * capacity / trace.rate_per_s

    def _fleet(self, slots: int, trace: Trace, replica: _ReplicaRate) -> Fleet | None:
        """``vllm-avg``: the replicas the trace's mean rate needs; else the caller's."""
        if self.system != "vllm-avg" or replica.serving is None or not trace.requests:
            return self.fleet
        return Fleet(colocated=max(1, min(slots, math.ceil(trace.rate_per_s / replica()))))

    def _check_room(self, slots: int, fleet: Fleet) -> None:
        need = max(fleet.total, 1 if self.colocated else 2)
        if slots < need:
            kind = "one colocated replica" if self.colocated else "one prefill, one decode"
            raise InvalidInputError(
                f"topology {self.topology.name!r} has room for {slots} tp={self.tp} instances "
                f"of {self.model.name}; the simulation needs at least {need} ({kind}"
                f"{'' if need <= 2 else ', the fleet asked'})"
            )


class _ReplicaRate:
    """One replica's measured capacity (:func:`~.capacity.replica_rate_per_s`) for this run,
    measured once, when first asked (a fixed fleet at a given rate never asks)."""

    def __init__(
        self, setting: Replay, trace: Trace, cost: ComputeModel, serving: ServingOptions | None
    ) -> None:
        self.setting, self.trace, self.cost, self.serving = setting, trace, cost, serving
        self._rate: float | None = None

    def __call__(self) -> float:
        if self._rate is None:
            if self.serving is None:
                raise InvalidInputError("a disaggregated run has no colocated replica rate")
            s = self.setting
            self._rate = replica_rate_per_s(
                s.topology, s.model, self.trace, tp=s.tp, compute=self.cost, serving=self.serving
            )
        return self._rate


def _rescaled(trace: Trace, scale: float) -> Trace:
    """``trace`` at ``scale`` times its rate, checked (at most MAX_TRACE_S long, warned when
    empty)."""
    if not trace.requests:
        _LOG.warning("simulate: the replayed trace %s holds no request", trace.name)
    trace = trace.rescale(scale) if scale != 1.0 else trace
    if trace.duration_s > MAX_TRACE_S:
        raise InvalidInputError(
            f"trace {trace.name!r} spans {trace.duration_s:g} s, more than MAX_TRACE_S = "
            f"{MAX_TRACE_S:g} s (a year)"
        )
    return trace


def _run(
    sim: Simulator, system: str, trace: Trace, record: tuple[bool, bool], progress: bool
) -> float:
    """Run ``sim``; the wall seconds it took."""
    if record[0]:
        sim.notes.log = []
    if record[1] and sim.colocated is not None:
        sim.colocated.records = []
    _LOG.info("simulate %s: %d requests of %s", system, len(trace), trace.name)
    started = time.perf_counter()
    label = f"simulate {system} ({len(trace)} requests)"
    bar = position_bar(label, max(1.0, trace.duration_s), "sim s", enabled=progress)
    with bar as advance, collector_relaxed():
        sim.progress = lambda fraction: advance(fraction * sim.end_s)
        sim.run()
    wall = time.perf_counter() - started
    _LOG.info("simulate %s: %d events in %.2f s", system, sim.events_processed, wall)
    return wall


def _slos(
    spec: ModelSpec,
    trace: Trace,
    cost: ComputeModel,
    slo_ttft_s: float | None,
    slo_tbt_s: float | None,
) -> tuple[float, float]:
    mean_prompt = max(1, int(trace.mean_prompt_tokens)) if len(trace) else 1024
    ttft = 5 * (spec.num_layers * cost.prefill_layer_s(mean_prompt) + cost.head_s(1))
    tbt = 5 * (spec.num_layers * cost.decode_layer_s(1, mean_prompt) + cost.head_s(1))
    return (ttft if slo_ttft_s is None else slo_ttft_s, tbt if slo_tbt_s is None else slo_tbt_s)


def _report(
    sim: Simulator,
    setting: Replay,
    trace: Trace,
    wall: float,
    slos: tuple[float, float],
    policy: Policy,
) -> SimReport:
    records = tuple(
        RequestRecord(
            r.arrival_s,
            r.prompt_tokens,
            r.output_tokens,
            r.first_token_s,
            r.finish_s,
            r.restarts,
            r.dropped,
            r.split,
            r.prefilled_on,
            r.preemptions,
        )
        for r in sim.requests
    )
    faults, topo = sim.faults, setting.topology
    iterations = sim.colocated.records if sim.colocated is not None else None
    return SimReport(
        system=setting.system,
        topology=topo.name,
        model=setting.model.name,
        trace=trace.name,
        tp=setting.tp,
        requests=records,
        gpu_timeline=(*sim.instances.gpu_timeline, (sim.now_s, 0)),
        scale_events=tuple(sim.scale_events),
        failures=tuple(faults.failed),
        no_host_copy_s=faults.no_host_copy_s,
        events_processed=sim.events_processed,
        wall_s=wall,
        slo_ttft_s=slos[0],
        slo_tbt_s=slos[1],
        live_policy=policy.name,
        link_efficiency=topo.link_efficiency,
        loading_gpu_s=sim.instances.loading_gpu_s,
        replans=faults.replans,
        lost_loads=tuple(faults.lost_loads),
        fault_notes=tuple(faults.notes),
        log=tuple(sim.notes.log or ()),
        serving="colocated" if setting.colocated else "disaggregated",
        iterations=tuple(iterations or ()),
    )
