"""From a chain structure to a finished MulticastPlan: build, evaluate, pick live tails, score."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from blitzplan.multicast.setup import Problem, hop_lanes
from blitzplan.multicast.timeline import PlanBuilder, Timeline, evaluate
from blitzplan.multicast.types import Chain, MulticastPlan
from blitzplan.solvers import SolveStatus

__all__ = [
    "OBJECTIVES",
    "Built",
    "base_builder",
    "build_chains",
    "evaluate_structure",
    "finish",
    "live_instances",
    "run",
    "score",
]

OBJECTIVES = ("all_ready", "sum_ready", "live_ready")
"""all_ready: every new instance complete; sum_ready: sum of ready times; live_ready: the live
instances complete."""


@dataclass(frozen=True)
class Built:
    """A built and evaluated structure, before it becomes a plan."""

    builder: PlanBuilder
    chains: tuple[Chain, ...]
    timeline: Timeline
    ready_at_s: dict[str, float]
    live: tuple[str, ...]


def build_chains(
    problem: Problem, structure: Sequence[tuple[int, Sequence[int]]]
) -> tuple[PlanBuilder, tuple[Chain, ...]]:
    """Plan nodes (sources, then targets) and one pipelined hop per chain link.

    ``structure`` holds ``(source index, target indices in order)`` per chain, indices into
    ``problem.sources`` and ``problem.targets``; the returned chains use plan node ids.
    """
    builder = base_builder(problem)
    offset = len(problem.sources)
    chains = []
    for source, targets in structure:
        sender = source
        for target in targets:
            receiver = target + offset
            lanes = hop_lanes(builder.nodes[sender], builder.nodes[receiver])
            builder.add_hop(sender, receiver, lanes)
            builder.add_allgather(receiver)
            sender = receiver
        chains.append(Chain(source, tuple(t + offset for t in targets)))
    return builder, tuple(chains)


def base_builder(problem: Problem) -> PlanBuilder:
    """A builder holding the problem's sources and target nodes and the new instances."""
    builder = PlanBuilder(problem.topology)
    for node in (*problem.sources, *problem.targets):
        builder.add_node(node)
    offset = len(problem.sources)
    builder.instances.extend(replace(inst, node=inst.node + offset) for inst in problem.instances)
    return builder


def live_instances(
    builder: PlanBuilder, ready_at_s: Mapping[str, float], live: int
) -> tuple[str, ...]:
    """Up to ``live`` instances of nodes that forward nothing (chain tails), earliest first."""
    senders = {hop.sender for hop in builder.hops}
    tails = [inst.name for inst in builder.instances if inst.node not in senders]
    return tuple(sorted(tails, key=lambda name: (ready_at_s[name], name))[:live])


def score(objective: str, ready_at_s: Mapping[str, float], live: Sequence[str]) -> float:
    if objective == "sum_ready":
        return sum(ready_at_s.values())
    if objective == "live_ready":
        return max(ready_at_s[name] for name in live)
    return max(ready_at_s.values())


def evaluate_structure(problem: Problem, structure: Sequence[tuple[int, Sequence[int]]]) -> Built:
    """Build and evaluate ``(source index, target indices)`` chains."""
    builder, chains = build_chains(problem, structure)
    return run(problem, builder, chains)


def run(problem: Problem, builder: PlanBuilder, chains: Sequence[Chain]) -> Built:
    """Evaluate a built structure and pick its live instances."""
    timeline = evaluate(
        builder, problem.unit_bytes, problem.chunk_bytes, problem.state.background_flows
    )
    ready = {inst.name: timeline.done_s[inst.node][-1] for inst in builder.instances}
    live = live_instances(builder, ready, problem.live)
    return Built(builder, tuple(chains), timeline, ready, live)


def finish(
    problem: Problem,
    built: Built,
    *,
    method: str,
    objective: str,
    status: SolveStatus,
    lower_bound_s: float,
    solve_s: float,
) -> MulticastPlan:
    b, t = built.builder, built.timeline
    layer_ready = {inst.name: t.done_s[inst.node] for inst in b.instances}
    return MulticastPlan(
        model=problem.model.identity,
        method=method,
        objective=objective,
        status=status,
        objective_s=score(objective, built.ready_at_s, built.live),
        lower_bound_s=lower_bound_s,
        solve_s=solve_s,
        unit_bytes=problem.unit_bytes,
        chunk_bytes=problem.chunk_bytes,
        nodes=tuple(b.nodes),
        instances=tuple(b.instances),
        chains=built.chains,
        hops=tuple(b.hops),
        allgathers=tuple(b.allgathers),
        flows=tuple(b.flows),
        flow_phase=tuple(b.flow_phase),
        rates=t.rates,
        background=problem.state.background_flows,
        arrival_s=t.arrival_s,
        layer_ready_s=layer_ready,
        ready_at_s=dict(built.ready_at_s),
        live=built.live,
        allow_prefill_sources=problem.allow_prefill_sources,
        delivered=dict(problem.delivered),
    )
