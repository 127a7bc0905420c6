"""The deadline rule of :func:`~blitzplan.plan`: a ``deadline_s`` shorter than the cheapest plan.

Under ``deadline_s`` the planner places only the new instances the deadline affords on the line
of recent planning times on the cluster, at the load they met, and asks again at the multicast's
checkpoint (:mod:`blitzplan.multicast.planning_rate`). When it
affords none (the deadline is shorter than a plan of even one new instance there), nothing is
planned and the call returns at once, without the rules that cost time: no new instance, role
change or release; every requested change is in ``missing`` and a note says the deadline was too
short and what plans recently took there. The old instances keep serving; the plan's milestones are
theirs (their queues drained alone). Before any plan is recorded on the cluster no deadline is
known to be too short: the call plans.

The same plan of nothing answers a call whose checkpoints found the time out while it planned
(:class:`~blitzplan.multicast.planning_rate.DeadlinePassed`: the time left was what this answer
takes): the note names the checkpoint. Each answer records its CPU time on the cluster
(:func:`~blitzplan.multicast.planning_rate.record_answer`): the checkpoints keep that much time.
"""

from __future__ import annotations

import time

from blitzplan.cluster import ClusterState, Instance
from blitzplan.models import ModelSpec
from blitzplan.multicast.planning_rate import (
    DeadlinePassed,
    affordable,
    planning_costs,
    recent_load,
    record_answer,
)
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import Targets, at_efficiency, realize
from blitzplan.scale.types import ScalePlan, ScaleRequest
from blitzplan.topologies import Topology

__all__ = ["too_short", "too_short_plan"]


def too_short(state: ClusterState, request: ScaleRequest, run: Planning) -> bool:
    """Whether ``run``'s deadline affords not even one new instance on ``state``'s cluster."""
    deadline = run.options.deadline_s
    if deadline is None:
        return False
    topology = at_efficiency(state, run.options.link_efficiency).topology
    return affordable(topology, 1, deadline, run.used(), recent_load(topology)) == 0


def too_short_plan(
    state: ClusterState,
    spec: ModelSpec,
    request: ScaleRequest,
    run: Planning,
    mine: list[Instance],
    recorded: dict[str, int],
    stopped: tuple[DeadlinePassed, float] | None = None,
) -> ScalePlan:
    """The plan of nothing (module docstring); ``mine`` are the old instances of ``spec``,
    ``recorded`` what the plan records of the request, ``stopped`` the checkpoint that found
    the time out and the thread's CPU time when it was caught (None: the deadline was too short
    from the start)."""
    passed, started = stopped or (None, time.thread_time())
    topology = at_efficiency(state, run.options.link_efficiency).topology
    asked = [
        f"{count:+d} {role}"
        for role, count in (
            ("prefill", request.prefill),
            ("decode", request.decode),
            ("colocated", request.colocated),
        )
        if count
    ]
    why, short = _why(topology, run, passed)
    missing = [f"deadline_s: {', '.join(asked) or 'nothing'} not planned ({short})"]
    answer = realize(
        state,
        spec,
        request.tp,
        Targets(),
        run,
        request=recorded,
        staying=mine,
        mutated=[],
        releases=(),
        missing=missing,
        notes=[why],
    )
    record_answer(topology, time.thread_time() - started)
    return answer


def _why(topology: Topology, run: Planning, passed: DeadlinePassed | None) -> tuple[str, str]:
    """The note of a plan of nothing, and its word in ``missing``."""
    deadline = run.options.deadline_s
    if passed is not None:
        return (
            f"deadline_s: {deadline:g} s ran out while planning ({passed.stage} checkpoint, "
            f"{run.used() * 1e3:.1f} ms in); nothing was planned",
            "out of time",
        )
    fixed, per = planning_costs(topology) or (0.0, 0.0)
    return (
        f"deadline_s: {deadline:g} s is too short for any plan on this cluster "
        f"(recent plans took {fixed * 1e3:.1f} ms + {per * 1e3:.2f} ms per new instance of CPU "
        f"time, {recent_load(topology):.1f} s of wall-clock per CPU second); nothing was planned",
        "too short",
    )
