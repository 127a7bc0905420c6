"""The cluster simulator: replay a trace on a topology under a system and an autoscaler."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from blitzplan._checks import MAX_SECONDS, is_finite_number
from blitzplan.cluster import ClusterState
from blitzplan.compute import ComputeModel, RooflineComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, load_model
from blitzplan.multicast.setup import available_slots
from blitzplan.sim.autoscaler import Autoscaler, PaperAutoscaler
from blitzplan.sim.engine import Simulator
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

TARGET_LOAD = 0.5
"""With ``rate_scale=None`` the trace is rescaled to this fraction of the cluster's capacity
(the paper's setting)."""


def capacity_rate_per_s(
    topology: Topology, model: ModelSpec, trace: Trace, *, tp: int, compute: ComputeModel
) -> float:
    """Requests per second the whole cluster sustains for this trace's mean request: half the
    instances prefilling at a full token budget, half decoding at batch 64, the slower side."""
    slots = len(available_slots(ClusterState(topology), tp))
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
    slo_ttft_s: float | None = None,
    slo_tbt_s: float | None = None,
    drain_limit_s: float = 600.0,
    progress: bool = False,
) -> SimReport:
    """Replay ``trace`` (a Trace, a CSV path, or None for a seeded synthetic burst) on
    ``topology`` with ``system`` (see :data:`SYSTEMS`) and return what it measured.

    ``window_s`` cuts the trace (seconds from its first request); ``rate_scale`` multiplies its
    rate (None: rescale to half the cluster's capacity, the paper's setting). ``failures`` are
    ``(time_s, host)`` host failures. SLOs default to 5x the unloaded TTFT of a mean prompt and
    5x an unloaded decode step.
    """
    _check_times(drain_limit_s, slo_ttft_s, slo_tbt_s)
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    spec.check_tp(tp)
    slots = available_slots(ClusterState(topo), tp)
    if len(slots) < 2:
        raise InvalidInputError(
            f"topology {topo.name!r} has room for {len(slots)} tp={tp} instances of {spec.name}; "
            "the simulation needs at least 2 (one prefill, one decode)"
        )
    make_system(system)  # check the name before any work
    base = _trace(trace, seed)
    if window_s is not None:
        base = base.window(*window_s)
    cost = compute or RooflineComputeModel(spec, topo.gpu_spec(topo.gpus()[0]), tp=tp)
    if len(base) > 1:
        scale = rate_scale
        if scale is None:
            scale = (
                TARGET_LOAD
                * capacity_rate_per_s(topo, spec, base, tp=tp, compute=cost)
                / base.rate_per_s
            )
        base = base.rescale(scale)
    scaler = None
    runner = make_system(system)
    if runner.autoscaled:
        scaler = autoscaler or PaperAutoscaler()
    mean_prompt = max(1, int(base.mean_prompt_tokens)) if len(base) else 1024
    ttft_slo = (
        slo_ttft_s
        if slo_ttft_s is not None
        else 5 * (spec.num_layers * cost.prefill_layer_s(mean_prompt) + cost.head_s(1))
    )
    tbt_slo = (
        slo_tbt_s
        if slo_tbt_s is not None
        else 5 * (spec.num_layers * cost.decode_layer_s(1, mean_prompt) + cost.head_s(1))
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
        failures=failures,
        drain_limit_s=drain_limit_s,
        progress=_progress_bar(started) if progress else None,
    )
    sim.run()
    wall = time.perf_counter() - started
    if progress:
        sys.stderr.write("\n")
    records = tuple(
        RequestRecord(
            r.arrival_s,
            r.prompt_tokens,
            r.output_tokens,
            r.first_token_s,
            r.finish_s,
            r.restarts,
            r.dropped,
        )
        for r in sim.requests
    )
    return SimReport(
        system=system,
        topology=topo.name,
        model=spec.name,
        trace=base.name,
        tp=tp,
        requests=records,
        gpu_timeline=(*sim.gpu_timeline, (sim.now, 0)),
        scale_events=tuple(sim.scale_events),
        failures=tuple(sim.failed_hosts),
        no_host_copy_s=sim.no_host_copy_s,
        events_processed=sim.events_processed,
        wall_s=wall,
        slo_ttft_s=ttft_slo,
        slo_tbt_s=tbt_slo,
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


def _progress_bar(started: float):  # type: ignore[no-untyped-def]
    def show(fraction: float) -> None:
        if time.perf_counter() - started < 3.0:
            return
        filled = int(40 * min(1.0, fraction))
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (40 - filled)}] {fraction:6.1%}")
        sys.stderr.flush()

    return show
