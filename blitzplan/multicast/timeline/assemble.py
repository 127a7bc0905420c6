"""From built lanes to a finished MulticastPlan: evaluate, score, freeze."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from blitzplan._collector import collector_paused
from blitzplan.multicast.allocation.plan_builder import PlanBuilder
from blitzplan.multicast.plan_types import AllGather, Hop, MulticastPlan, NewInstance
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.evaluate import evaluate
from blitzplan.multicast.timeline.lane_times import Timeline
from blitzplan.solvers import SolveStatus

__all__ = ["OBJECTIVES", "Built", "Frozen", "base_builder", "finish", "freeze", "run", "score"]

OBJECTIVES = ("all_ready", "sum_ready", "live_ready")
"""all_ready: every new instance complete; sum_ready: sum of ready times; live_ready: the live
instances complete."""


@dataclass(frozen=True)
class Frozen:
    """The finished plan's tuples of a built plan (:func:`freeze`)."""

    hops: tuple[Hop, ...]
    allgathers: tuple[AllGather, ...]
    lane_arrival_s: tuple[tuple[float, ...], ...]
    lane_start_s: tuple[float, ...]


@dataclass(frozen=True)
class Built:
    """A built and evaluated plan, before it is frozen."""

    builder: PlanBuilder
    timeline: Timeline
    ready_at_s: dict[str, float]
    live: tuple[str, ...]
    frozen: Frozen | None = field(default=None, compare=False)
    """Its finished plan's tuples when they were made ahead (:func:`freeze`): a step with a
    deadline makes them in its own time (a plan of 10^5 lanes: tenths of a second, more on a
    loaded machine), so that :func:`finish` only puts them in place."""


def base_builder(problem: Problem) -> PlanBuilder:
    """A builder holding the problem's sources, then its target nodes, and the new instances."""
    builder = PlanBuilder(problem.topology)
    for node in (*problem.sources, *problem.targets):
        builder.add_node(node)
    offset = len(problem.sources)
    builder.instances.extend(
        NewInstance(inst.name, inst.gpus, inst.node + offset, inst.startup_s)
        for inst in problem.instances
    )
    return builder


def run(
    problem: Problem,
    builder: PlanBuilder,
    live: Sequence[str],
    check: Callable[[str], None] | None = None,
) -> Built:
    """Evaluate a built plan whose live instances are ``live``; ``check`` (a deadline's
    checkpoint) is called as :func:`~blitzplan.multicast.timeline.evaluate.evaluate` says."""
    timeline = evaluate(
        builder,
        problem.unit_bytes,
        problem.chunk_bytes,
        problem.state.background_flows,
        tp=problem.tp,
        check=check,
    )
    ready = {name: max(times, default=0.0) for name, times in timeline.layer_ready_s.items()}
    return Built(builder, timeline, ready, tuple(live))


def score(objective: str, ready_at_s: Mapping[str, float], live: Sequence[str]) -> float:
    if objective == "sum_ready":
        return sum(ready_at_s.values())
    if objective == "live_ready":
        return max((ready_at_s[name] for name in live), default=math.inf)
    return max(ready_at_s.values(), default=0.0)


def _arrival_rows(t: Timeline, step: Callable[[str], None]) -> tuple[tuple[float, ...], ...]:
    """``lane_arrival_s`` as tuples, lanes timed alike sharing one tuple (``step`` called
    every :data:`_ROWS` rows)."""
    if t.timed_arrival_s is None or t.lane_row is None:
        return _rows(t.lane_arrival_s, step)
    rows = _rows(t.timed_arrival_s, step)
    return tuple(map(rows.__getitem__, t.lane_row.tolist()))


_ROWS = 4096
"""Rows made into tuples between two checkpoints (:func:`freeze`)."""


def _rows(array: np.ndarray, step: Callable[[str], None]) -> tuple[tuple[float, ...], ...]:
    """The rows of ``array`` as tuples, ``step`` called before every :data:`_ROWS` of them."""
    out: list[tuple[float, ...]] = []
    for at in range(0, len(array), _ROWS):
        step("frozen")
        out.extend(map(tuple, array[at : at + _ROWS].tolist()))
    return tuple(out)


def freeze(built: Built, check: Callable[[str], None] | None = None) -> Frozen:
    """The tuples the finished plan of ``built`` holds, made with the collector paused: tuples
    of floats by the hundred thousand, none in a cycle, whose collections took 2-4x the making
    itself (34 k lanes: 0.1-0.33 s, 0.06-0.09 s paused, the pass they earn after included).
    ``check`` (a deadline's checkpoint) is called with ``frozen`` between its parts and
    every :data:`_ROWS` rows of arrivals (the bulk of its time)."""
    b, t = built.builder, built.timeline
    step = check or _unchecked
    with collector_paused():
        hops = b.hops()
        step("frozen")
        allgathers = b.allgathers()
        arrivals = _arrival_rows(t, step)
        step("frozen")
        starts = tuple(t.lane_start_s.tolist()) if t.lane_start_s is not None else ()
    return Frozen(hops, allgathers, arrivals, starts)


def _unchecked(_: str) -> None:
    """No checkpoint."""


def finish(
    problem: Problem,
    built: Built,
    *,
    method: str,
    objective: str,
    status: SolveStatus,
    lower_bound_s: float,
    started_s: float,
) -> MulticastPlan:
    """The plan ``built`` makes, its ``solve_s`` counted from ``started_s`` (``perf_counter``)
    to when it is made: making the plan's tuples (:func:`freeze`, unless ``built`` has them) is
    part of what a caller waits for (about 2 us a lane)."""
    b, t = built.builder, built.timeline
    parts = built.frozen or freeze(built)
    values: dict[str, Any] = dict(
        model=problem.model.identity,
        method=method,
        objective=objective,
        status=status,
        objective_s=score(objective, built.ready_at_s, built.live),
        lower_bound_s=float(lower_bound_s),
        solve_s=0.0,  # below: the plan's time to the end of its making
        unit_bytes=problem.unit_bytes,
        chunk_bytes=problem.chunk_bytes,
        nodes=tuple(b.nodes),
        instances=tuple(b.instances),
        hops=parts.hops,
        allgathers=parts.allgathers,
        flows=tuple(b.flows),
        flow_phase=tuple(b.flow_phase),
        rates=t.rates,
        background=problem.state.background_flows,
        arrival_s=t.hop_arrival_s,
        lane_arrival_s=parts.lane_arrival_s,
        lane_start_s=parts.lane_start_s,
        lane_feeds=t.lane_feeds,
        layer_ready_s=dict(t.layer_ready_s),
        ready_at_s=dict(built.ready_at_s),
        live=built.live,
        allow_prefill_sources=problem.allow_prefill_sources,
        delivered=dict(problem.delivered),
        bound_kind=getattr(lower_bound_s, "kind", ""),
    )
    values["solve_s"] = time.perf_counter() - started_s
    return MulticastPlan(**values)
