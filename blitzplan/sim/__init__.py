"""The cluster simulator: replay a trace on a topology under a system and an autoscaler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from blitzplan._checks import MAX_SECONDS, is_finite_number
from blitzplan.compute import ComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.live.policies import POLICIES, Policy
from blitzplan.models import ModelSpec, load_model
from blitzplan.sim.autoscaler import Autoscaler, PaperAutoscaler
from blitzplan.sim.capacity import capacity_rate_per_s
from blitzplan.sim.colocated import IterationRecord
from blitzplan.sim.fleet import FLEET_SYSTEMS, FleetReport, simulate_fleet, with_host_dram
from blitzplan.sim.options import check_colocated_options, fixed_fleet, is_colocated
from blitzplan.sim.replay import TARGET_LOAD, Replay
from blitzplan.sim.report import SimReport, plot_reports
from blitzplan.sim.serving import ROUTERS, ServingOptions
from blitzplan.sim.synthetic import synthetic_trace
from blitzplan.sim.systems import SYSTEMS, make_system
from blitzplan.sim.traces import MAX_TRACE_S, Request, Trace, load_trace
from blitzplan.sim.workloads import Workload, trace_workloads, zipf_workloads
from blitzplan.topologies import Topology, load_topology

__all__ = [
    "FLEET_SYSTEMS",
    "MAX_TRACE_S",
    "ROUTERS",
    "SYSTEMS",
    "TARGET_LOAD",
    "FleetReport",
    "IterationRecord",
    "PaperAutoscaler",
    "Request",
    "ServingOptions",
    "SimReport",
    "Trace",
    "Workload",
    "capacity_rate_per_s",
    "load_trace",
    "plot_reports",
    "simulate",
    "simulate_fleet",
    "synthetic_trace",
    "trace_workloads",
    "with_host_dram",
    "zipf_workloads",
]


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
    serving: str | None = None,
    prefill: int | None = None,
    decode: int | None = None,
    colocated: int | None = None,
    scheduler: str = "chunked",
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    long_prefill_tokens: int = 0,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    max_model_len: int | None = None,
    router: str = "least-outstanding",
    record: bool = False,
    record_iterations: bool = False,
    progress: bool = False,
) -> SimReport:
    """Replay ``trace`` (a Trace, a CSV path, or None for a seeded synthetic burst) on
    ``topology`` with ``system`` (see :data:`SYSTEMS`) and return what it measured.

    ``window_s`` cuts the trace (seconds from its first request; a window after its last
    request is refused); ``rate_scale`` multiplies its rate (None: rescale to half the cluster's
    capacity, the paper's setting). ``failures`` are ``(time_s, host)`` host failures, times on
    the trace's own axis (the axis of ``window_s``, before rescaling), inside the replayed span.
    ``live_policy`` drives live loading instances (``zigzag``, ``best_effort``,
    ``stop_the_world`` or a Policy object; only ``blitzscale`` has live instances).
    ``link_efficiency`` sets each link medium's achieved fraction of line rate for every system
    and the planner (None: the measured defaults of :data:`~blitzplan.topologies.LINK_EFFICIENCY`;
    ``1.0``: line rate). SLOs default to 5x the unloaded TTFT of a mean prompt and 5x an unloaded
    decode step.

    The fleet (:mod:`.options`): ``serving`` is ``"disaggregated"`` or ``"colocated"`` (None:
    the system's own); ``system="fixed"`` serves ``prefill`` and ``decode`` instances, or
    ``colocated`` replicas, preloaded. A colocated fleet takes vLLM's engine options, each
    documented with its default and source in :mod:`.serving`: ``scheduler``
    (``"chunked"`` or ``"prefill-first"``), ``max_num_batched_tokens``, ``max_num_seqs``,
    ``long_prefill_tokens``, ``gpu_memory_utilization``, ``block_size``, ``max_model_len`` and
    ``router`` (``"least-outstanding"`` or ``"round-robin"``). ``record`` keeps a per-request
    event log in the report, ``record_iterations`` every colocated iteration
    (:class:`~.colocated.IterationRecord`).
    """
    _check_times(drain_limit_s, slo_ttft_s, slo_tbt_s)
    topo = topology if isinstance(topology, Topology) else load_topology(topology)
    topo = topo.with_link_efficiency(link_efficiency)
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    spec.check_tp(tp)
    fleet = fixed_fleet(system, prefill, decode, colocated)
    make_system(system)  # checks the name before any work
    colocated_run = is_colocated(system, serving, fleet)
    options = ServingOptions(
        scheduler=scheduler,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        long_prefill_tokens=long_prefill_tokens,
        gpu_memory_utilization=gpu_memory_utilization,
        block_size=block_size,
        max_model_len=max_model_len,
        router=router,
    )
    check_colocated_options(colocated_run, options)
    setting = Replay(topo, spec, tp, system, fleet, colocated_run, options)
    return setting.replay(
        _trace(trace, seed),
        window_s=window_s,
        rate_scale=rate_scale,
        failures=failures,
        autoscaler=autoscaler,
        compute=compute,
        live_policy=_policy(live_policy),
        slos=(slo_ttft_s, slo_tbt_s),
        drain_limit_s=drain_limit_s,
        record=(record, record_iterations),
        progress=progress,
    )


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
