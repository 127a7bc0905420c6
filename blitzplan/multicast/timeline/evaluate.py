"""Evaluating a built plan: fair-share rates per phase, then the timeline of every lane (the
recurrence of :mod:`~blitzplan.multicast.timeline.lane_times`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from blitzplan.multicast.allocation.plan_builder import PlanBuilder
from blitzplan.multicast.timeline.lane_times import Timeline, run_lanes
from blitzplan.topologies import Flow, Topology, fair_share_after

__all__ = ["evaluate", "phase_rates"]


def evaluate(
    builder: PlanBuilder,
    unit_bytes: Sequence[int],
    chunk_bytes: int,
    background: Sequence[Flow] = (),
    *,
    tp: int = 1,
    check: Callable[[str], None] | None = None,
) -> Timeline:
    """Fair-share rates per phase, then the recurrence over lanes in dependency order;
    ``check`` (a deadline's checkpoint, which raises to stop the call) is called with ``rates``
    once the rates are known and with ``timeline`` per level of the recurrence."""
    rates = phase_rates(builder.topology, builder.flows, builder.flow_phase, background, check)
    if check is not None:
        check("rates")
    hops = builder.hops()
    return run_lanes(
        builder.lanes,
        builder.nodes,
        hops,
        builder.instances,
        rates,
        builder.flow_latency_s,
        unit_bytes,
        chunk_bytes,
        tp=tp,
        known=builder.deps,
        check=check,
    )


def phase_rates(
    topology: Topology,
    flows: Sequence[Flow],
    phases: Sequence[int],
    background: Sequence[Flow],
    check: Callable[[str], None] | None = None,
) -> tuple[float, ...]:
    """Each phase's flows' max-min fair rates after ``background``; ``check`` (a deadline's
    checkpoint) is called per group of flows sharing links. Phases of the same flows in the
    same order (the middle phases of a plan in time slices) share one computation: the rates
    are a function of those flows."""
    rates = [0.0] * len(flows)
    by_phase: dict[int, list[int]] = {}
    for i, p in enumerate(phases):
        by_phase.setdefault(p, []).append(i)
    known: dict[tuple[Flow, ...], tuple[float, ...]] = {}
    for phase in sorted(by_phase):
        ids = by_phase[phase]
        these = tuple(flows[i] for i in ids)
        shared = known.get(these)
        if shared is None:
            shared = known[these] = fair_share_after(these, topology.capacity, background, check)
        for i, rate in zip(ids, shared, strict=True):
            rates[i] = rate
    return tuple(rates)
