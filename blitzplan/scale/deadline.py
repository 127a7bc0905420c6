"""The deadline rule of :func:`~blitzplan.plan`: a ``deadline_s`` shorter than the cheapest plan.

Under ``deadline_s`` the planner places only the new instances the deadline affords on the line
of recent planning times on the cluster, at the load they met, and asks again at the multicast's
checkpoint (:mod:`blitzplan.multicast.planning_rate`). When it
affords none (the deadline is shorter than a plan of even one new instance there), nothing is
planned and the call returns at once, without the rules that cost time: no new instance, role
change or release; every requested change is in ``missing`` and a note says the deadline was too
short and what plans recently took there. The old instances keep serving; the plan's milestones are
theirs (their queues drained alone). Before any plan is recorded on the cluster no deadline is
known to be too short: the call plans; nor for good: every
:data:`~blitzplan.multicast.planning_rate.BACKOFF`-th call the line refuses plans anyway, under
its checkpoints (:func:`~blitzplan.multicast.planning_rate.retry_refused`), and records what
it cost. A deadline shorter than what recent calls spent before their first checkpoint (laying
the multicast's problem out) also gets the plan of nothing at once: no checkpoint could stop
it sooner. Inside a call under a deadline the garbage collector does not run (a pass over
earlier calls' objects is not its work), and live pairs carry no relaxation bound.

The same plan of nothing answers a call whose checkpoints found the time out while it planned
(:class:`~blitzplan.multicast.planning_rate.DeadlinePassed`: the time left was what this answer
takes): the note names the checkpoint. Each such answer records its CPU time on the cluster,
freeing the partial plan included
(:func:`~blitzplan.multicast.planning_rate.record_answer`): the checkpoints keep that much time.
A stop with nothing planned also makes the next few calls under a deadline no longer than its
answer at once (:func:`~blitzplan.multicast.planning_rate.stopped_before`), noted so.
"""

from __future__ import annotations

import time

from blitzplan.cluster import ClusterState, Instance
from blitzplan.models import ModelSpec
from blitzplan.multicast.planning_rate import (
    BACKOFF,
    DeadlinePassed,
    affordable,
    layout_cost,
    planning_costs,
    recent_load,
    record_answer,
    retry_refused,
    stop_at,
    stopped_before,
)
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import Targets, at_efficiency, realize
from blitzplan.scale.types import ScalePlan, ScaleRequest

__all__ = ["too_short", "too_short_plan"]


def too_short(state: ClusterState, request: ScaleRequest, run: Planning) -> str | None:
    """None when ``run``'s deadline may afford a new instance on ``state``'s cluster; else why
    not (the plan's note): the line affords none, or a call under a deadline at least as long
    was stopped there with nothing planned a few calls ago
    (:func:`~blitzplan.multicast.planning_rate.stopped_before`)."""
    deadline = run.options.deadline_s
    if deadline is None:
        return None
    topology = at_efficiency(state, run.options.link_efficiency).topology
    refused = affordable(topology, 1, deadline, run.used(), recent_load(topology)) == 0
    if refused and not retry_refused(topology):
        fixed, per = planning_costs(topology) or (0.0, 0.0)
        return (
            f"deadline_s: {deadline:g} s is too short for any plan on this cluster "
            f"(recent plans took {fixed * 1e3:.1f} ms + {per * 1e3:.2f} ms per new instance of "
            f"CPU time, {recent_load(topology):.1f} s of wall-clock per CPU second); nothing "
            "was planned"
        )
    layout, load = layout_cost(topology), recent_load(topology)
    if layout is not None and run.used() + layout * load > stop_at(topology, deadline):
        return (
            f"deadline_s: {deadline:g} s is too short for any plan on this cluster (recent "
            f"calls spent at least {layout * 1e3:.1f} ms of CPU time before their first "
            f"checkpoint, {load:.1f} s of wall-clock per CPU second); nothing was planned"
        )
    stopped = stopped_before(topology, deadline)
    if stopped is not None:
        return (
            f"deadline_s: {deadline:g} s is too short: a call under {stopped:g} s ran out of "
            f"time on this cluster within the last {BACKOFF} calls; nothing was planned"
        )
    return None


def too_short_plan(
    state: ClusterState,
    spec: ModelSpec,
    request: ScaleRequest,
    run: Planning,
    mine: list[Instance],
    recorded: dict[str, int],
    reason: str | tuple[DeadlinePassed, float],
) -> ScalePlan:
    """The plan of nothing (module docstring); ``mine`` are the old instances of ``spec``,
    ``recorded`` what the plan records of the request, ``reason`` why the deadline was too
    short (:func:`too_short`), or the checkpoint that found the time out and the thread's CPU
    time when it was caught."""
    started: float | None = None
    if isinstance(reason, str):
        why, short = reason, "too short"
    else:
        passed, started = reason
        why, short = _out_of_time(run, passed), "out of time"
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
    if started is not None:  # a stop: what its answer took, the partial plan freed
        record_answer(topology, time.thread_time() - started)
    return answer


def _out_of_time(run: Planning, passed: DeadlinePassed) -> str:
    """The note of a call its checkpoint ``passed`` stopped."""
    return (
        f"deadline_s: {run.options.deadline_s:g} s ran out while planning ({passed.stage} "
        f"checkpoint, {run.used() * 1e3:.1f} ms in); nothing was planned"
    )
