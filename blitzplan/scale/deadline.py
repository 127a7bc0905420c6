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

A call whose checkpoints found the time out while it planned
(:class:`~blitzplan.multicast.planning_rate.DeadlinePassed`: the time left was what this answer
takes) gets the best plan found so far (:func:`stopped_plan`): the role changes that move no
weights (rebalances in place) and the releases, no new instance (a multicast plan is only
timed, and its program only right, for all of its lanes), every load and the mutations waiting
for one in ``missing``; the note names the checkpoint. Each such answer records its CPU time on
the cluster, freeing the partial plan included
(:func:`~blitzplan.multicast.planning_rate.record_answer`): the checkpoints keep that much time.
A deadline no longer than that answer's time is answered at once, before any work; so is a
retry of a refused deadline when the plan of none recorded there would not fit in it. A stop
does not make the next calls answer at once: those under a deadline no longer than a stopped
one plan for a raised load (twice the recorded one per stop:
:func:`~blitzplan.multicast.planning_rate.record_stop`), so they place the
smaller share of the new instances that load affords (:mod:`.realize`), noted so. Only when it
affords not even one is the call answered at once with nothing; each call that then fits, and
every :data:`~blitzplan.multicast.planning_rate.BACKOFF`-th call answered so, halves the raised
load back.

The cyclic garbage collector: :func:`~blitzplan.plan` pauses it from its first line to its
return (``gc.disable()``, the caller's setting restored on the way out, also on an error), so no
pass over the caller's heap (a full one walks every live object: 38-100 ms of CPU after plans of
the busy fleet) runs inside the call unbudgeted; the call's allocations still count. The pass
they made due would run at the first allocation after the call, which in a tight loop is the
start of the caller's next call. :func:`collect_due` runs it before the call returns when twice
its cost, projected long (:func:`collect_cost`), fits in the time left to the deadline at the
call's own load; when the due pass is of an older generation and does not fit, the youngest
generation's alone may (its cost is the call's own objects': 0.3 ms after +64, up to 27 ms
after +1,000): it resets the count, so the older pass runs at a later allocation of the caller,
with the collector on; else the pass is left as it was. A plan makes no cyclic garbage, so a
pass put off holds no memory of the call's.
"""

from __future__ import annotations

import gc
import time

from blitzplan.cluster import ClusterState, Instance
from blitzplan.models import ModelSpec
from blitzplan.multicast.planning_rate import (
    DeadlinePassed,
    affordable,
    answer_cost,
    layout_cost,
    none_cost,
    planning_costs,
    raised_load,
    recent_load,
    record_answer,
    relax_load,
    retry_refused,
    stop_at,
)
from blitzplan.scale.mutations import RoleChanges
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import Targets, at_efficiency, realize
from blitzplan.scale.types import Release, ScalePlan, ScaleRequest

__all__ = [
    "COLLECT_MARGIN",
    "KEPT_PASSES",
    "OLDER_S",
    "YOUNG_S",
    "collect_cost",
    "collect_due",
    "due_generation",
    "stopped_plan",
    "too_short",
    "too_short_plan",
]

YOUNG_S = 5e-7
"""CPU seconds per young object a collection of the youngest generation is taken to cost at
least (measured after plans of the busy fleet: 50-200 ns per object counted on a quiet core,
0.3 ms after +64 to 27 ms after +1,000, up to about 350 ns on a loaded one: the objects' mix of
references varies)."""

OLDER_S = (0.025, 0.1)
"""CPU seconds a collection of the middle, then the oldest generation is taken to cost (beyond
its young objects') before :func:`collect_due` has timed one (measured after plans of the busy
fleet: 0.1-21 ms; a full pass 38-100 ms, the caller's whole heap)."""

COLLECT_MARGIN = 2.0
"""A due pass runs inside a call only when this many times its projected cost fits: the young
count undercounts the young objects when the call frees older ones (each free counts one
down): passes of 2.9-3.5 ms ran where 500 ns per counted object projected under 2 ms."""

KEPT_PASSES = 8
"""Recent collections :func:`collect_due` keeps the cost of, per generation."""

_PASSES: dict[int, list[float]] = {}
"""Per generation, the recent collections :func:`collect_due` ran: CPU seconds per young object
(the youngest), CPU seconds beyond the young objects' (the older two). The collector is the
process's: so is this record."""


def too_short(state: ClusterState, request: ScaleRequest, run: Planning) -> str | None:
    """None when ``run``'s deadline may afford a new instance on ``state``'s cluster; else why
    not (the plan's note): the cheapest answer, the line (at the recorded load, or at the load
    raised by recent stops) or the layout leaves no time for one."""
    deadline = run.options.deadline_s
    if deadline is None:
        return None
    topology = at_efficiency(state, run.options.link_efficiency).topology
    limit, load = stop_at(topology, deadline), recent_load(topology)
    if run.used() >= limit:
        return (
            f"deadline_s: {deadline:g} s is too short for any plan on this cluster (the "
            f"cheapest answer takes {answer_cost(topology) * 1e3:.1f} ms of CPU time, "
            f"{load:.1f} s of wall-clock per CPU second); nothing was planned"
        )
    refused = affordable(topology, 1, deadline, run.used(), load) == 0
    none = none_cost(topology)  # a retry costs at least that: no use when it does not fit
    retried = refused and (none is None or run.used() + none * load <= limit)
    if refused and not (retried and retry_refused(topology)):
        fixed, per = planning_costs(topology) or (0.0, 0.0)
        return (
            f"deadline_s: {deadline:g} s is too short for any plan on this cluster "
            f"(recent plans took {fixed * 1e3:.1f} ms + {per * 1e3:.2f} ms per new instance of "
            f"CPU time, {recent_load(topology):.1f} s of wall-clock per CPU second); nothing "
            "was planned"
        )
    raised, stopped = raised_load(topology, deadline)
    if raised > 1.0 and affordable(topology, 1, deadline, run.used(), load * raised) == 0:
        relax_load(topology, deadline, refused=True)  # every BACKOFF-th halves it: a spike passes
        return (
            f"deadline_s: {deadline:g} s is too short for any plan on this cluster now (a call "
            f"under {stopped:g} s ran out of time here lately: at {raised:g}x the recorded load, "
            f"{load:.1f} s of wall-clock per CPU second, recent plans afford no new instance); "
            "nothing was planned"
        )
    layout = layout_cost(topology)
    if layout is not None and run.used() + layout * load > limit:
        return (
            f"deadline_s: {deadline:g} s is too short for any plan on this cluster (recent "
            f"calls spent at least {layout * 1e3:.1f} ms of CPU time before their first "
            f"checkpoint, {load:.1f} s of wall-clock per CPU second); nothing was planned"
        )
    return None


def too_short_plan(
    state: ClusterState,
    spec: ModelSpec,
    request: ScaleRequest,
    run: Planning,
    mine: list[Instance],
    why: str,
) -> ScalePlan:
    """The plan of nothing, answered at once (module docstring): ``mine`` are the old
    instances of ``spec``, ``why`` the note (:func:`too_short`)."""
    missing = [f"deadline_s: {_asked(_counts(request)) or 'nothing'} not planned (too short)"]
    return _answer(state, spec, request, run, (mine, [], ()), missing, why)


def stopped_plan(
    state: ClusterState,
    spec: ModelSpec,
    request: ScaleRequest,
    run: Planning,
    changes: RoleChanges,
    stop: tuple[DeadlinePassed, float, list[str]],
) -> ScalePlan:
    """The best plan found when a checkpoint found the time out (module docstring): the role
    changes that move no weights (rebalances in place) and the releases of ``changes``, every
    new instance in ``missing`` (beside ``stop``'s lines from the rules before) and a note
    naming the checkpoint; ``stop`` is the checkpoint's exception, the thread's CPU time when
    it was caught and those lines. Its CPU time is recorded on the cluster."""
    passed, started, said = stop
    rebalanced = changes.mutated[changes.replaced :]
    kept = [*changes.staying, *changes.mutated[: changes.replaced]]  # their replacements: none
    # every removal is planned (or ``said`` has why not): only additions are left
    left = {role: max(count, 0) for role, count in _counts(request).items()}
    left["decode"] -= len(rebalanced)
    asked = _asked(left)
    missing = [*said, *([f"deadline_s: {asked} not planned (out of time)"] if asked else [])]
    done = f"{len(rebalanced)} role changes in place, {len(changes.releases)} releases"
    planned = f"planned only {done} (they move no weights)"
    why = (
        f"deadline_s: {run.options.deadline_s:g} s ran out while planning ({passed.stage} "
        f"checkpoint, {run.used() * 1e3:.1f} ms in); "
        + (planned if rebalanced or changes.releases else "nothing was planned")
    )
    parts = (kept, rebalanced, changes.releases)
    answer = _answer(state, spec, request, run, parts, missing, why)
    topology = at_efficiency(state, run.options.link_efficiency).topology
    record_answer(topology, time.thread_time() - started)  # the partial plan freed included
    return answer


def _answer(
    state: ClusterState,
    spec: ModelSpec,
    request: ScaleRequest,
    run: Planning,
    parts: tuple[list[Instance], list[Instance], tuple[Release, ...]],
    missing: list[str],
    why: str,
) -> ScalePlan:
    """The plan that loads no new instance: ``parts`` are the old instances that keep serving,
    those that change role in place and the releases."""
    staying, mutated, releases = parts
    counts = {"prefill": request.prefill, "decode": request.decode, "tp": request.tp}
    recorded = counts | ({"colocated": request.colocated} if request.colocated else {})
    return realize(
        state,
        spec,
        request.tp,
        Targets(),
        run,
        request=recorded,
        staying=staying,
        mutated=mutated,
        releases=releases,
        missing=missing,
        notes=[why],
        replaced=0,
    )


def _counts(request: ScaleRequest) -> dict[str, int]:
    return {"prefill": request.prefill, "decode": request.decode, "colocated": request.colocated}


def _asked(counts: dict[str, int]) -> str:
    """``+4 prefill, -1 decode``: the nonzero ``counts``."""
    return ", ".join(f"{count:+d} {role}" for role, count in counts.items() if count)


def due_generation() -> int | None:
    """The generation the collector collects at the next allocation (CPython's rule: the
    oldest whose count exceeds its threshold once the youngest's does; a full pass also waits
    for enough long-lived objects, which is not visible here, so 2 may be a pass of 1), or None
    when none is due (whether the collector is on is the caller's to ask)."""
    counts, limits = gc.get_count(), gc.get_threshold()
    if limits[0] == 0 or counts[0] <= limits[0]:
        return None
    return max(g for g in range(3) if g == 0 or counts[g] > limits[g])


def collect_cost(generation: int, young: int) -> float:
    """CPU seconds a collection of ``generation`` is taken to cost with ``young`` objects in the
    youngest generation: the most per young object of the recent ones, at least
    :data:`YOUNG_S`, times ``young``, and for an older generation the most the recent ones of it
    took beyond that, at least its :data:`OLDER_S`: a projection errs long (the recent ones only
    raise it, on a slower machine)."""
    per = max([YOUNG_S, *_PASSES.get(0, [])])
    if generation == 0:
        return per * young
    return per * young + max([OLDER_S[generation - 1], *_PASSES.get(generation, [])])


def collect_due(run: Planning) -> None:
    """Under ``run``'s deadline, with a collection due (:func:`due_generation`): run it now when
    :data:`COLLECT_MARGIN` times its cost (:func:`collect_cost`) at the call's load fits in the
    time left to the deadline;
    else, for an older generation, the youngest's when that fits (its cost is the call's own
    objects'; the count it resets no longer makes the older pass run at the caller's next
    allocation, which may be the start of its next call: it runs at a later one); else leave
    it. Called with the collector paused, which it was on before (an allocation here must not
    start a pass on its own)."""
    deadline, generation = run.options.deadline_s, due_generation()
    if deadline is None or generation is None or run.started is None:
        return
    used, cpu, young = run.used(), run.used_cpu(), gc.get_count()[0]
    load = max(1.0, used / cpu) if cpu > 0 else 1.0
    for tried in dict.fromkeys((generation, 0)):
        if used + COLLECT_MARGIN * collect_cost(tried, young) * load <= deadline:
            break
    else:
        return
    began = time.thread_time()
    gc.collect(tried)
    spent = time.thread_time() - began
    per = max([YOUNG_S, *_PASSES.get(0, [])])
    kept = _PASSES.setdefault(tried, [])
    kept.append(spent / max(young, 1) if tried == 0 else max(0.0, spent - per * young))
    del kept[:-KEPT_PASSES]
