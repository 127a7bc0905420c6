"""The cluster simulator: replay a trace on a topology under a system and an autoscaler."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from blitzplan._checks import MAX_SECONDS, is_finite_number
from blitzplan._progress import position_bar
from blitzplan.cluster import ClusterState
from blitzplan.compute import ComputeModel, RooflineComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.live.policies import POLICIES, Policy
from blitzplan.models import ModelSpec, load_model
from blitzplan.sim.autoscaler import Autoscaler, PaperAutoscaler
from blitzplan.sim.engine import Simulator
from blitzplan.sim.faults import check_failures
from blitzplan.sim.report import RequestRecord, SimReport, plot_reports
from blitzplan.sim.systems import SYSTEMS, make_system
from blitzplan.sim.traces import Request, Trace, load_trace, synthetic_trace
from blitzplan.topologies import Topology, load_topology

__all__ = [
    "SYSTEMS",
    "PaperAutoscaler",
    "Request",
    "SimReport",
    "Trace",
    "capacity_rate_per_s",
    "load_trace",
    "plot_reports",
    "simulate",
    "synthetic_trace",
]

_LOG = logging.getLogger(__name__)

TARGET_LOAD = 0.5
"""With ``rate_scale=None`` the trace is rescaled to this fraction of the cluster's capacity
(the paper's setting)."""


def capacity_rate_per_s(
    topology: Topology, model: ModelSpec, trace: Trace, *, tp: int, compute: ComputeModel
) -> float:
    """Requests per second the whole cluster sustains for this trace's mean request: half the
    instances prefilling at a full token budget, half decoding at batch 64, the slower side."""
    slots = len(ClusterState(topology).free_slots(tp))
    layers = model.num_layers
    prompt = max(1.0, trace.mean_prompt_tokens)
    output = max(1.0, trace.mean_output_tokens)
    prefill_tps = 8192 / (layers * compute.prefill_layer_s(8192, requests=8) + compute.head_s(8))
    context = int(prompt + output / 2)
    decode_tps = 64 / (layers * compute.decode_layer_s(64, context) + compute.head_s(64))
    half = max(1, slots // 2)
    return half * min(prefill_tps / prompt, decode_tps / output)


def simulate(
    topology: Topology | str,
    model: ModelSpec | str,
    trace: Trace | str | Path | None = None,
    *,
    system: str = "blitzscale",
    tp: int = 1,
    window_s: tuple[float, float] | None = None,
    rate_scale: float | None = None,
    seed: int = 0,
    failures: Sequence[tuple[float, str]] = (),
    autoscaler: Autoscaler | None = None,
    compute: ComputeModel | None = None,
    live_policy: str | Policy = "zigzag",
    link_efficiency: float | Mapping[str, float] | None = None,
    slo_ttft_s: float | None = None,
    slo_tbt_s: float | None = None,
    drain_limit_s: float = 600.0,
    record: bool = False,
    progress: bool = False,
) -> SimReport:
    """Replay ``trace`` (a Trace, a CSV path, or None for a seeded synthetic burst) on
    ``topology`` with ``system`` (see :data:`SYSTEMS`) and return what it measured.

    ``window_s`` cuts the trace (seconds from its first request); ``rate_scale`` multiplies its
    rate (None: rescale to half the cluster's capacity, the paper's setting). ``failures`` are
    ``(time_s, host)`` host failures, times on the trace's own axis (the axis of ``window_s``,
    before rescaling), inside the replayed span. ``live_policy`` drives live loading instances
    (``zigzag``, ``best_effort``, ``stop_the_world`` or a Policy object; only ``blitzscale``
    has live instances). ``link_efficiency`` sets each link medium's achieved fraction of line
    rate for every system and the planner (None: the measured defaults of
    :data:`~blitzplan.topologies.LINK_EFFICIENCY`; ``1.0``: line rate). SLOs default to 5x the
    unloaded TTFT of a mean prompt and 5x an unloaded decode step. ``record`` keeps a
    per-request event log in the report.
    """
    _check_times(drain_limit_s, slo_ttft_s, slo_tbt_s)
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    topo = topo.with_link_efficiency(link_efficiency)
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    spec.check_tp(tp)
    slots = ClusterState(topo).free_slots(tp)
    if len(slots) < 2:
        raise InvalidInputError(
            f"topology {topo.name!r} has room for {len(slots)} tp={tp} instances of {spec.name}; "
            "the simulation needs at least 2 (one prefill, one decode)"
        )
    runner = make_system(system)  # checks the name before any work
    policy = _policy(live_policy)
    base = _trace(trace, seed)
    start_s = 0.0
    if window_s is not None:
        base, start_s = base.window(*window_s), float(window_s[0])
    cost = compute or RooflineComputeModel(spec, topo.gpu_spec(topo.gpus()[0]), tp=tp)
    scale = _rate_scale(rate_scale, topo, spec, base, tp, cost)
    span_s = base.duration_s
    if scale != 1.0:
        base = base.rescale(scale)
    faults = check_failures(
        failures, hosts=topo.hosts(), start_s=start_s, span_s=span_s, rate_scale=scale
    )
    scaler = (autoscaler or PaperAutoscaler()) if runner.autoscaled else None
    ttft_slo, tbt_slo = _slos(spec, base, cost, slo_ttft_s, slo_tbt_s)
    _LOG.info(
        "simulate %s: %d requests of %s on %s, %s tp=%d, rate x%.3g",
        system,
        len(base),
        base.name,
        topo.name,
        spec.name,
        tp,
        scale,
    )
    started = time.perf_counter()
    sim = Simulator(
        topo,
        spec,
        base,
        tp=tp,
        system=runner,
        autoscaler=scaler,
        compute=cost,
        policy=policy,
        failures=faults,
        drain_limit_s=drain_limit_s,
    )
    if record:
        sim.router.log = []
    label = f"simulate {system} ({len(base)} requests)"
    with position_bar(label, max(1.0, base.duration_s), "sim s", enabled=progress) as advance:
        sim.progress = lambda fraction: advance(fraction * sim.end_s)
        sim.run()
    wall = time.perf_counter() - started
    _LOG.info(
        "simulate %s: %d events in %.2f s (simulated %.1f s)",
        system,
        sim.events_processed,
        wall,
        sim.now_s,
    )
    report = _report(sim, system, topo, spec, base, tp, wall, ttft_slo, tbt_slo, policy)
    return replace(report, rate_scale=scale, trace_start_s=start_s)


def _policy(live_policy: str | Policy) -> Policy:
    if isinstance(live_policy, str):
        if live_policy not in POLICIES:
            raise InvalidInputError(
                f"live_policy must be one of {', '.join(POLICIES)} or a Policy, got {live_policy!r}"
            )
        return POLICIES[live_policy]()
    if not callable(getattr(live_policy, "decide_new", None)):
        raise InvalidInputError(
            f"live_policy must be a policy name or a Policy, got {live_policy!r}"
        )
    return live_policy


def _rate_scale(
    rate_scale: float | None,
    topo: Topology,
    spec: ModelSpec,
    trace: Trace,
    tp: int,
    cost: ComputeModel,
) -> float:
    if len(trace) <= 1:
        return 1.0
    if rate_scale is not None:
        return rate_scale
    capacity = capacity_rate_per_s(topo, spec, trace, tp=tp, compute=cost)
    return TARGET_LOAD * capacity / trace.rate_per_s


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
    system: str,
    topo: Topology,
    spec: ModelSpec,
    trace: Trace,
    tp: int,
    wall: float,
    ttft_slo: float,
    tbt_slo: float,
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
        )
        for r in sim.requests
    )
    faults = sim.faults
    return SimReport(
        system=system,
        topology=topo.name,
        model=spec.name,
        trace=trace.name,
        tp=tp,
        requests=records,
        gpu_timeline=(*sim.instances.gpu_timeline, (sim.now_s, 0)),
        scale_events=tuple(sim.scale_events),
        failures=tuple(faults.failed),
        no_host_copy_s=faults.no_host_copy_s,
        events_processed=sim.events_processed,
        wall_s=wall,
        slo_ttft_s=ttft_slo,
        slo_tbt_s=tbt_slo,
        live_policy=policy.name,
        link_efficiency=topo.link_efficiency,
        loading_gpu_s=sim.instances.loading_gpu_s,
        replans=faults.replans,
        lost_loads=tuple(faults.lost_loads),
        fault_notes=tuple(faults.notes),
        log=tuple(sim.router.log or ()),
    )


def _check_times(drain_limit_s: object, slo_ttft_s: object, slo_tbt_s: object) -> None:
    if not is_finite_number(drain_limit_s) or not 0 <= drain_limit_s <= MAX_SECONDS:
        raise InvalidInputError(
            f"drain_limit_s must be finite and >= 0 (at most {MAX_SECONDS:g}), "
            f"got {drain_limit_s!r}"
        )
    for name, value in (("slo_ttft_s", slo_ttft_s), ("slo_tbt_s", slo_tbt_s)):
        if value is not None and not (is_finite_number(value) and 0 < value <= MAX_SECONDS):
            raise InvalidInputError(
                f"{name} must be finite and > 0 (at most {MAX_SECONDS:g}) or None, got {value!r}"
            )


def _trace(trace: Trace | str | Path | None, seed: int) -> Trace:
    if trace is None:
        return synthetic_trace(seed=seed)
    if isinstance(trace, Trace):
        return trace
    return load_trace(trace)
