"""``apply_plan()``: the cluster part-way through a ScalePlan, or after it.

What ``apply_plan(state, plan, at_s=t)`` gives, every time relative to the new "now" (``t``
seconds into the plan):

* **New instances** join under their plan names: those whose every unit is ready by ``t`` with
  their planned role (sources for later plans); the others as ``loading``, with a
  :class:`~blitzplan.cluster.Loading` record of their planned role and when each unit arrives
  (seconds from ``t``, 0 for units they have). A later plan may take weights from such an
  instance as from one of its planned role (a future decode or idle instance; a future prefill
  one only with ``allow_prefill_sources``), each unit no earlier than it arrives: overlapping
  plans chain. Instances still loading under an earlier plan move on the same way (and serve
  in their role once every unit is there).
* **Mutations** are done (they happen at once): the instance is a decode instance and its queued
  requests sit where the plan moved them. **Releases** whose queue is done by ``t`` are gone;
  the others still drain.
* **Live pairs**: requests whose batch the pair's schedule completes by ``t`` have left the old
  instance's queue; the rest wait, their arrival times shifted by ``t``.
* **Transfers still running** (steps that end after ``t``) are background flows on their
  routes at their planned rates until they end (``ClusterState.flow_end_s``), so a plan made
  now shares the links with them; the state's own flows that end by ``t`` are gone, the others
  end ``t`` sooner. Each loading record says what its arrivals still depend on (its plan's
  sources, forwarders, memories and links: :class:`~blitzplan.cluster.Loading`), so a replan
  after a failure knows when the record went stale.

The plan must have been made on ``state`` (its new GPUs free, its instances present).

A :class:`~blitzplan.scale.types.MultiPlan` (several requests) applies as a whole: each
request's evictions go, then its part starts, in order, all at the same moment; ``at_s`` into
it, every part is ``at_s`` in. Nothing is half-done: a part that was not made on the cluster
the ones before it leave raises InvalidInputError naming it, and ``state`` is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import replace

from blitzplan.cluster import ClusterState, Loading, QueuedRequest, Role
from blitzplan.errors import InvalidInputError
from blitzplan.scale.types import MultiPlan, ScalePlan
from blitzplan.topologies import Flow

__all__ = ["apply_plan"]


def apply_plan(state: ClusterState, plan: ScalePlan | MultiPlan, *, at_s: float) -> ClusterState:
    """The cluster ``at_s`` seconds into ``plan`` (module docstring); ``state`` is unchanged."""
    if isinstance(plan, MultiPlan):
        _check_time(at_s)
        return _apply_multi(state, plan, at_s)
    if not isinstance(plan, ScalePlan):
        raise InvalidInputError(
            f"plan must be a ScalePlan or a MultiPlan, got {type(plan).__name__}"
        )
    _check_time(at_s)
    _check_made_on(state, plan)
    after = state.copy()
    done = _completed_requests(plan, at_s)
    moved = {request: target for m in plan.mutations for request, target in m.moved}
    queued = {q.id: q for inst in state.instances for q in inst.queue}
    gone = {r.instance for r in plan.releases if r.at_s <= at_s}
    mutated = {m.instance for m in plan.mutations}
    touched = mutated | set(moved.values())
    for inst in state.instances:
        if inst.id in gone:
            after.remove_instance(inst.id)
            continue
        if (
            at_s == 0
            and inst.loading is None
            and inst.id not in touched
            and not any(q.id in moved or q.id in done for q in inst.queue)
        ):
            continue  # nothing of it changes
        keep = [q for q in inst.queue if q.id not in moved and q.id not in done]
        keep += [queued[r] for r, target in moved.items() if target == inst.id and r not in done]
        role = Role.DECODE if inst.id in mutated else inst.role
        loading = None
        if inst.loading is not None:  # loading under an earlier plan: its clock moves on too
            loading = inst.loading.advanced(at_s)
            role = role if loading is not None else inst.loading.role
        after.update_instance(
            inst.id, role=role, queue=[_shift(q, at_s) for q in keep], loading=loading
        )
    relieves = {pair.new: pair.old for pair in plan.live_pairs}
    for info in plan.new_instances:
        known = all(math.isfinite(t) for t in info.layer_ready_s)  # else: never completes
        loading = None
        if known:
            needs, edges = _needs(state, plan, info.gpus, at_s)
            loading = Loading(
                Role(info.role), info.layer_ready_s, needs, edges, relieves.get(info.name)
            ).advanced(at_s)
        ready = all(t <= at_s for t in info.layer_ready_s)
        after.add_instance(
            plan.spec,
            gpus=list(info.gpus),
            role=Role(info.role) if ready else Role.LOADING,
            instance_id=info.name,
            loading=loading,
        )
    _running(after, state, plan, at_s)
    return after


def _check_time(at_s: float) -> None:
    if isinstance(at_s, bool) or not isinstance(at_s, int | float) or not 0 <= at_s < math.inf:
        raise InvalidInputError(f"at_s must be a finite time >= 0, got {at_s!r}")


def _apply_multi(state: ClusterState, multi: MultiPlan, at_s: float) -> ClusterState:
    """The cluster ``at_s`` into every part of ``multi``: the parts before the last start at 0
    (as they were planned), the last is applied at ``at_s``, which moves every earlier part's
    loading, flows and arrivals on too; then the earlier parts' drains and live batches done
    by ``at_s`` are done."""
    current, last = state, len(multi.plans) - 1
    for k, part in enumerate(multi.plans):
        current = current.copy()
        try:
            for e in (e for e in multi.evictions if e.request == k):
                if e.instance not in {i.id for i in current.instances}:
                    raise InvalidInputError(f"its eviction names instance {e.instance!r}")
                current.remove_instance(e.instance)
            current = apply_plan(current, part, at_s=at_s if k == last else 0.0)
        except InvalidInputError as exc:
            raise InvalidInputError(f"plans[{k}] ({part.spec.name}): {exc}") from None
    for part in multi.plans[:last]:
        done = _completed_requests(part, at_s)
        for inst in current.instances:
            if any(q.id in done for q in inst.queue):
                current.update_instance(inst.id, queue=[q for q in inst.queue if q.id not in done])
        for release in part.releases:
            if release.at_s <= at_s and release.instance in {i.id for i in current.instances}:
                current.remove_instance(release.instance)
    return current


def _running(after: ClusterState, state: ClusterState, plan: ScalePlan, at_s: float) -> None:
    """The background flows ``at_s`` later: those of ``state`` that still run, and the plan's
    steps that end after ``at_s``, each until it ends."""
    after.clear_background_flows()
    for flow in state.background_flows:
        if state.flow_end_s(flow) > at_s:
            after.add_flow(flow, until_s=state.flow_end_s(flow) - at_s)
    if plan.multicast is None:
        return
    for step in plan.steps:
        if step.end_s > at_s:
            flow = plan.multicast.flows[step.id]
            rate = plan.multicast.rates[step.id]
            after.add_flow(
                Flow(flow.edges, rate, f"{plan.plan_id[:8]} step {step.id}"),
                until_s=step.end_s - at_s,
            )


def _needs(
    state: ClusterState, plan: ScalePlan, gpus: tuple[str, ...], at_s: float
) -> tuple[frozenset[str], frozenset[tuple[str, str]]]:
    """What the arrivals at ``gpus`` after ``at_s`` depend on (:class:`Loading`): the steps
    into them still running and, through ``feeds`` and ``after``, every running step they wait
    for; the processes of their sources and forwarders, the memories they read, their links."""
    if plan.multicast is None:
        return frozenset(), frozenset()
    by_id = {step.id: step for step in plan.steps}
    owner = {g: i.id for i in state.instances for g in i.gpus}
    owner |= {g: info.name for info in plan.new_instances for g in info.gpus}
    todo = [step for step in plan.steps if step.destination in gpus and step.end_s > at_s]
    seen: set[int] = set()
    needs: set[str] = set()
    while todo:
        step = todo.pop()
        if step.id in seen:
            continue
        seen.add(step.id)
        needs.add(owner.get(step.source, step.source))  # a process, or a memory or relay
        todo += [by_id[x] for x in (*step.feeds, *step.after) if x in by_id]
    edges = {edge for x in seen for edge in plan.multicast.flows[x].edges}
    return frozenset(needs), frozenset(edges)


def _check_made_on(state: ClusterState, plan: ScalePlan) -> None:
    plan.check_cluster(state)
    free = set(state.free_gpus())
    for info in plan.new_instances:
        busy = [g for g in info.gpus if g not in free]
        if busy:
            raise InvalidInputError(
                f"plan was not made on this state: {info.name}'s GPUs {busy} are not free"
            )
    ids = {i.id for i in state.instances}
    named = {r.instance for r in plan.releases} | {m.instance for m in plan.mutations}
    named |= {p.old for p in plan.live_pairs}
    for name in sorted(named - ids):
        raise InvalidInputError(f"plan was not made on this state: it names instance {name!r}")


def _completed_requests(plan: ScalePlan, at_s: float) -> set[str]:
    """Ids of requests the plan's live pairs finish by ``at_s``."""
    done: set[str] = set()
    for pair in plan.live_pairs:
        for batch, end in zip(pair.batches, pair.schedule.completion_s, strict=False):
            if end <= at_s:
                done.update(batch)
    return done


def _shift(request: QueuedRequest, at_s: float) -> QueuedRequest:
    return replace(request, arrival_s=request.arrival_s - at_s)
