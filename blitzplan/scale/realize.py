"""Realize, the last planning rule of :func:`~blitzplan.plan` (and all of
:func:`~blitzplan.replan`'s): for a fixed set of new instances, the multicast, their roles, the
live pairs, the milestones and the transfer program, as one ScalePlan.

All new instances load in one :func:`~blitzplan.plan_multicast` call, on the state's links at
the options' ``link_efficiency``. Live chain tails: per prompt-taking role (prefill, colocated),
as many as there are old instances of that role with a queue, at most the new instances of
that role. Roles: the live tails take the live prefill, then the live colocated roles; the
others, by ready time, prefill, then colocated, then decode. Live pairs come from
:mod:`.pairing`, milestones from :mod:`.milestones`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from blitzplan.cluster import ClusterState, Instance, Role
from blitzplan.models import ModelSpec
from blitzplan.multicast import CLOSE_ENOUGH, plan_multicast
from blitzplan.multicast.plan_types import MulticastPlan, built
from blitzplan.multicast.planning_rate import (
    RECUTS,
    DeadlinePassed,
    TooSlow,
    afford_now,
    affordable,
    planning_costs,
    raised_load,
    recent_load,
    record_rate,
    relax_load,
)
from blitzplan.multicast.refine_budget import RefineBudget
from blitzplan.scale.delivered import Held
from blitzplan.scale.milestones import milestones
from blitzplan.scale.mutations import mutation_records, requeue
from blitzplan.scale.pairing import live_pairs
from blitzplan.scale.planning import Planning
from blitzplan.scale.program import program
from blitzplan.scale.releases import timed_releases
from blitzplan.scale.transfer_steps import TransferStep
from blitzplan.scale.types import NewInstanceInfo, Release, ScalePlan
from blitzplan.topologies import Topology
from blitzplan.topologies.links import derated_kept

__all__ = ["Targets", "at_efficiency", "realize"]


@dataclass(frozen=True)
class Targets:
    """The new instances to load: ``count`` placed by the planner, or explicit GPU groups with
    names and units already delivered (a replan); ``prefill`` of them are prefill instances,
    ``colocated`` colocated ones, the rest decode instances."""

    count: int = 0
    prefill: int = 0
    colocated: int = 0
    groups: tuple[tuple[str, ...], ...] = ()
    names: tuple[str, ...] = ()
    delivered: Mapping[str, tuple[bool, ...]] = field(default_factory=dict)
    roles: Mapping[str, str] = field(default_factory=dict)
    """With ``groups``: each instance's role (a replan keeps them)."""
    live: tuple[str, ...] | None = None
    """With ``groups``: the instances that stay live (None: the planner picks)."""
    pairs: Mapping[str, str] = field(default_factory=dict)
    """Live pairs to keep, new instance name -> old instance id."""
    startup_s: Mapping[str, float] = field(default_factory=dict)
    """Startup still ahead per new instance (a replan), else the options' ``startup_s``."""

    @property
    def total(self) -> int:
        return len(self.groups) if self.groups else self.count


def realize(
    state: ClusterState,
    spec: ModelSpec,
    tp: int,
    targets: Targets,
    run: Planning,
    *,
    request: Mapping[str, int],
    staying: list[Instance],
    mutated: list[Instance],
    releases: tuple[Release, ...],
    missing: list[str],
    held: Held | None = None,
    notes: Sequence[str] = (),
    replaced: int | None = None,
) -> ScalePlan:
    """The ScalePlan of loading ``targets`` (module docstring): ``staying`` old instances keep
    serving, ``mutated`` change role, ``releases`` drain; ``held`` are bytes the new GPUs
    already have (a replan's); ``notes`` start the plan's notes; the first ``replaced`` of
    ``mutated`` (None: all) are replaced by new prefill instances."""
    notes = list(notes)
    state = at_efficiency(state, run.options.link_efficiency)
    queues, moved = requeue(staying, mutated)
    relieved = {i.loading.relieves for i in state.instances if i.loading is not None}
    loaded = [i for i in staying if queues[i.id] and i.id not in relieved]  # pairable
    live = _live_counts(targets, loaded)
    multicast, refined_s, steps, recut = _transfers(
        state, spec, tp, targets, run, sum(live), (notes, missing), held
    )
    roles = dict(targets.roles) if targets.roles else _roles(multicast, targets, live)
    pairs, unpaired = live_pairs(
        state, spec, multicast, loaded, queues, run, tp, roles=roles, keep=targets.pairs
    )
    if unpaired:
        notes.append(
            f"deadline_s: {unpaired} live instances left without a pair (they load, but help "
            "no queue)"
        )
    draining = [i for i in state.instances if i.id in {r.instance for r in releases} and i.queue]
    for inst in draining:  # a released instance finishes its own queue first
        queues.setdefault(inst.id, list(inst.queue))
    marks = milestones(state, spec, multicast, roles, pairs, [*staying, *draining], queues, tp, run)
    if targets.count and run.started is not None:  # planner-placed instances were asked
        planned = len(multicast.instances) if multicast is not None else 0
        # the whole call but the refinements (a plan under a deadline skips them) and an
        # attempt given up for a recut (recorded apart)
        cpu_s, wall_s = refined_s
        record_rate(state.topology, planned, run.used_cpu() - cpu_s, run.used() - wall_s)
        deadline = run.options.deadline_s
        if planned and deadline is not None and not recut and run.used() <= deadline:
            relax_load(state.topology, deadline)  # a load raised by a stop comes back down
    return ScalePlan(
        model=spec.identity,
        spec=spec,
        request=dict(request),
        method=run.options.method,
        live_method=run.options.live_method,
        multicast=multicast,
        new_instances=_infos(multicast, roles),
        live_pairs=pairs,
        mutations=mutation_records(mutated, multicast, roles, moved, replaced),
        releases=timed_releases(state, spec, releases, run, steps) if releases else (),
        milestones=marks,
        missing=tuple(missing),
        notes=tuple(notes),
        options=run.options,
        steps=steps,
        held={gpu: dict(units) for gpu, units in (held or {}).items()},
        cluster=state.topology.name,
    )


def _transfers(
    state: ClusterState,
    spec: ModelSpec,
    tp: int,
    targets: Targets,
    run: Planning,
    live_count: int,
    said: tuple[list[str], list[str]],
    held: Held | None,
) -> tuple[MulticastPlan | None, tuple[float, float], tuple[TransferStep, ...], bool]:
    """:func:`_multicast`'s plan, the CPU and wall-clock seconds not in its planning time (its
    refinements', an attempt given up), its transfer program and whether it was recut. Under a
    deadline (planner-placed instances) both stop at the deadline's checkpoints
    (:meth:`Planning.checkpoint`): one that finds the call too slow (TooSlow) has the share of
    the instances tried that the time left affords planned afresh (at most
    :data:`~blitzplan.multicast.planning_rate.RECUTS` times, each with a note); one that
    finds the time out has DeadlinePassed go on to the caller, which answers in time. An
    attempt given up is recorded for the line (:meth:`Planning.given_up`): at its projected
    cost when the projection gave it up, else its time so far when that is more than the line
    expects of it."""
    tried: list[int] = []

    def attempt(
        hooks: tuple[Callable[[str], None] | None, list[int], int | None],
    ) -> tuple[MulticastPlan | None, tuple[float, float], tuple[TransferStep, ...]]:
        plan, refined_s = _multicast(state, spec, tp, targets, run, live_count, said, hooks)
        steps = program(plan, state.topology, held, hooks[0]) if plan else ()
        if hooks[0] is not None and plan is not None:
            hooks[0]("programmed")  # what is left (pairs, milestones, the document) must fit
        return plan, refined_s, steps

    given_up = (0.0, 0.0)  # CPU and wall-clock seconds of the attempts given up for a recut
    cap: int | None = None  # a recut's count
    recuts = RECUTS
    try:
        while True:
            check = (
                run.checkpoint(state.topology, recut=recuts > 0, sizes=tried)
                if targets.count
                else None
            )
            try:
                plan, (cpu_s, wall_s), steps = attempt((check, tried, cap))
                return plan, (cpu_s + given_up[0], wall_s + given_up[1]), steps, cap is not None
            except TooSlow as slow:
                run.given_up(state.topology, tried, given_up, slow.scale)
                given_up = (run.used_cpu(), run.used())
                cap, stage = (math.floor(tried[-1] * slow.share) if tried else 0), slow.stage
                if cap < 1 or recuts < 1:
                    raise DeadlinePassed(stage) from None
            recuts -= 1
            said[0].append(
                f"deadline_s: a plan of {tried[-1]} new instances ran slower than recorded "
                f"({stage} checkpoint, {run.used() * 1e3:.1f} ms in); {cap} planned afresh"
            )
    except DeadlinePassed:
        run.given_up(state.topology, tried, given_up, None)
        raise


def _multicast(
    state: ClusterState,
    spec: ModelSpec,
    tp: int,
    targets: Targets,
    run: Planning,
    live_count: int,
    said: tuple[list[str], list[str]],
    hooks: tuple[Callable[[str], None] | None, list[int], int | None],
) -> tuple[MulticastPlan | None, tuple[float, float]]:
    """One multicast plan for every target (None: no targets), ``live_count`` of them live
    unless ``targets`` names them, and the CPU and wall-clock seconds its refinements took
    (a plan under a deadline skips them: they are not in the planning time); ``said`` are the
    plan's notes and missing lists it adds to. Under ``deadline_s`` it places only the new
    instances the time left affords (:mod:`blitzplan.multicast.planning_rate`: at the call's
    start, then once the multicast's problem is laid out), the rest go to ``missing``, and
    ``hooks`` are the deadline's checkpoint, which stops the greedy when the time is out, the
    list of the counts tried, which the checks append to, and a cap on the count (None:
    none)."""
    notes, missing = said
    check, tried, cap = hooks
    explicit = bool(targets.groups)
    count = targets.count
    deadline = run.options.deadline_s
    if deadline is not None and count:  # anytime: what the time left affords
        topology = state.topology
        load = recent_load(topology)
        asked = min(count, cap or count)
        count = affordable(topology, asked, deadline, run.used(), load)
        if cap is None and count:  # a recut's count already has the call's own pace
            count = _after_stops(topology, (asked, count), deadline, run.used(), load, notes)
        live_count = min(live_count, count)
        tried.append(count)
    if not (explicit or count):
        _left_out(targets.count, 0, notes, missing)
        return None, (0.0, 0.0)
    live: int | tuple[str, ...] = live_count
    if targets.live is not None:
        live = targets.live
    options = run.options
    refine = None if run.bounded() or explicit else RefineBudget(options.refine_budget)
    multicast = plan_multicast(
        state,
        spec,
        count=None if explicit else count,
        targets=[list(g) for g in targets.groups] if explicit else None,
        names=list(targets.names) if explicit else state.fresh_names("new", count),
        delivered=dict(targets.delivered) if explicit else None,
        tp=tp,
        method=options.method,
        live=live,
        chunk_bytes=options.chunk_bytes,
        startup_s=dict(targets.startup_s) if targets.startup_s else options.startup_s,
        time_limit_s=options.time_limit_s,
        allow_prefill_sources=options.allow_prefill_sources,
        # a replan (explicit groups) skips the refinements: fast, no LP solver to import
        polish_evaluations=0 if run.bounded() or explicit else None,
        refine_budget=refine,
        # under a deadline one layout, packed: weighing spreading lays a few instances out twice
        placement="auto" if deadline is None else "pack",
        afford=None if deadline is None or explicit else _checkpoint(state, run, tried),
        checkpoint=check,
    )
    if not explicit:
        _left_out(targets.count, len(multicast.instances), notes, missing)
    if refine is not None and refine.cut:
        notes.append(refine.note())
    if run.bounded() and not explicit and multicast.gap > CLOSE_ENOUGH:
        notes.append("deadline_s: the greedy multicast plan without its refinements")
    _waits(state, multicast, notes)
    spent = (0.0, 0.0) if refine is None else (refine.refining_cpu_s(), refine.refining_s())
    return multicast, spent


def _checkpoint(state: ClusterState, run: Planning, tried: list[int]) -> Callable[[int], int]:
    """How many of ``n`` new instances the time left affords at a checkpoint of the multicast
    (:func:`~blitzplan.multicast.planning_rate.afford_now`), appended to ``tried``."""
    deadline = run.options.deadline_s or 0.0

    def afford(n: int) -> int:
        left = afford_now(state.topology, n, deadline, run.used(), run.used_cpu())
        tried.append(max(1, min(n, left)))  # the multicast plans at least one
        return left

    return afford


def _after_stops(
    topology: Topology,
    counts: tuple[int, int],
    deadline: float,
    used_s: float,
    load: float,
    notes: list[str],
) -> int:
    """Of ``counts`` (new instances asked, and the at least one of them the recorded load
    affords), how many to plan after stops on ``topology`` raised the load calls plan for
    (:func:`~blitzplan.multicast.planning_rate.record_stop`): the share that load affords on
    the line (with no line, the count over the factor), at least one (a call it affords none
    was answered at once: :mod:`.deadline`); noted when fewer."""
    asked, count = counts
    raised, stopped = raised_load(topology, deadline)
    if raised <= 1.0:
        return count
    if planning_costs(topology) is None:
        share = math.floor(count / raised)
    else:
        share = affordable(topology, asked, deadline, used_s, load * raised)
    share = max(1, min(count, share))
    if share < count:
        notes.append(
            f"deadline_s: a call under {stopped:g} s ran out of time on this cluster lately; "
            f"planned for {raised:g}x the recorded load: {share} of the {count} new instances "
            "the recorded load affords"
        )
    return share


def _left_out(asked: int, planned: int, notes: list[str], missing: list[str]) -> None:
    """The note and the ``missing`` line of new instances a deadline left out."""
    if planned < asked:
        notes.append(f"deadline_s: {planned} of {asked} new instances planned")
        missing.append(f"deadline_s: {asked - planned} new instances not planned")


def _waits(state: ClusterState, multicast: MulticastPlan, notes: list[str]) -> None:
    """A note when the plan waits for background flows that end (an earlier plan's steps)."""
    kept = set(multicast.background)
    ended = [state.flow_end_s(f) for f in state.background_flows if f not in kept]
    if ended:
        notes.append(
            f"the new instances start in {max(ended):.3f} s, once an earlier plan's steps end: "
            "until then they fill every route to one of them"
        )


def at_efficiency(state: ClusterState, efficiency: Mapping[str, float]) -> ClusterState:
    """``state`` with its topology's links at ``efficiency`` (the derated topology is kept on
    the original, so repeated plans reuse its route caches)."""
    if dict(state.topology.link_efficiency) == dict(efficiency):
        return state
    derated = state.copy()
    derated.topology = derated_kept(state.topology, dict(efficiency))
    return derated


def _live_counts(targets: Targets, loaded: list[Instance]) -> tuple[int, int]:
    """How many new prefill and colocated instances are live: as many as old instances of
    their role have a queue."""
    olds = [i.role for i in loaded]
    return (
        min(targets.prefill, olds.count(Role.PREFILL)),
        min(targets.colocated, olds.count(Role.COLOCATED)),
    )


def _roles(
    multicast: MulticastPlan | None, targets: Targets, live: tuple[int, int]
) -> dict[str, str]:
    """Each new instance's role: the live tails take the live prefill, then the live colocated
    roles; the others, by ready time, prefill, then colocated, then decode."""
    if multicast is None:
        return {}
    rest = sorted(
        (i.name for i in multicast.instances if i.name not in multicast.live),
        key=lambda name: (multicast.ready_at_s[name], name),
    )
    prefill, colocated = targets.prefill - live[0], targets.colocated - live[1]
    tail = ["prefill"] * prefill + ["colocated"] * colocated
    wanted = ["prefill"] * live[0] + ["colocated"] * live[1] + tail
    order = list(multicast.live) + rest
    return {name: wanted[k] if k < len(wanted) else "decode" for k, name in enumerate(order)}


def _infos(multicast: MulticastPlan | None, roles: dict[str, str]) -> tuple[NewInstanceInfo, ...]:
    if multicast is None:
        return ()
    return tuple(
        built(  # NewInstanceInfo(...) without its frozen __init__: one per new instance
            NewInstanceInfo,
            name=i.name,
            gpus=i.gpus,
            role=roles[i.name],
            live=i.name in multicast.live,
            ready_at_s=multicast.ready_at_s[i.name],
            layer_ready_s=multicast.layer_ready_s[i.name],
        )
        for i in multicast.instances
    )
