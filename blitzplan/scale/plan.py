"""``plan()``: one scaling decision, from the cluster state and a request to a ScalePlan.

The steps, each a rule a serving stack can predict:

1. **Scale-down.** Removing prefill instances drains those with the fewest queued prompt tokens;
   removing decode instances drains those with the fewest KV bytes in use.
2. **Decode by mutation.** Each added decode instance first comes from a prefill instance turning
   into a decode instance in place (the one with the fewest KV bytes in use; no transfer); a new
   prefill instance is live-scaled in its place. Its queued requests move to the least loaded
   remaining prefill instance, so the last prefill instance never mutates. Decode instances
   beyond the prefill instances that may mutate are loaded like any new instance.
3. **Decode pre-scaling** (only with ``prescale_decode=True``). A prefill scale-up that at
   least multiplies the model's prefill instances by :data:`LARGE_SCALE_UP` also loads decode
   instances in the serving ratio
   (``ceil(prefill_added * decode / prefill)``): the burst's decode load follows within seconds.
4. **Multicast.** All new instances are loaded by one :func:`~blitzplan.plan_multicast` call;
   as many chain tails as there are overloaded old prefill instances (with a queue) are live.
5. **Live pairs.** Live tails, earliest first layer first, pair with the old prefill instances,
   most queued tokens first; each pair's predicted schedule comes from
   :func:`~blitzplan.schedule_live` over the old instance's queue.
6. **Milestones**: first and full added capacity, queue drain; with ``compare_baselines=True``
   also those of the AllCache and ServerlessLLM data planes on the same GPUs.

A request that cannot be met in full (not enough free GPUs, fewer instances to remove than
asked) gives a plan for what is possible and lists what is missing, unless ``strict=True``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from blitzplan.cluster import ClusterState, Instance, QueuedRequest, Role, memory_misfit
from blitzplan.compute import ComputeModel, RooflineComputeModel
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.hardware import GpuSpec
from blitzplan.live.instance import LiveScalingInstance, instance_from_queue, queue_batches
from blitzplan.live.schedule import Schedule
from blitzplan.live.solve import METHODS as LIVE_METHODS
from blitzplan.live.solve import schedule_live
from blitzplan.models import ModelSpec, load_model
from blitzplan.multicast import DEFAULT_CHUNK_BYTES, plan_multicast, validate_multicast
from blitzplan.multicast.plan_types import MulticastPlan
from blitzplan.scale.byte_checks import check_source_bytes
from blitzplan.scale.delivered import Held
from blitzplan.scale.program import program
from blitzplan.scale.types import (
    LivePair,
    MilestoneFigures,
    Milestones,
    Mutation,
    NewInstanceInfo,
    PlanOptions,
    Release,
    ScalePlan,
    ScaleRequest,
)
from blitzplan.topologies.links import LINK_EFFICIENCY, link_efficiency_table

__all__ = [
    "BASELINE_PLANES",
    "LARGE_SCALE_UP",
    "Options",
    "Targets",
    "live_instance",
    "plan",
    "realize",
    "validate_plan",
]

LARGE_SCALE_UP = 4.0
"""A prefill scale-up adding at least this many times the current prefill instances is large."""
BASELINE_PLANES = ("allcache", "serverlessllm")
"""Data planes whose milestones every plan reports beside its own."""


def plan(
    state: ClusterState,
    request: ScaleRequest,
    *,
    method: str = "greedy",
    live_method: str = "zigzag",
    time_limit_s: float | None = None,
    strict: bool = False,
    compute: ComputeModel | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    startup_s: float = 0.0,
    max_batch_tokens: int | None = None,
    prescale_decode: bool = False,
    compare_baselines: bool = False,
    mutate_decode: bool = True,
    allow_prefill_sources: bool = False,
    link_efficiency: float | Mapping[str, float] | None = None,
    deadline_s: float | None = None,
) -> ScalePlan:
    """Plan the scaling ``request`` asks for on ``state`` (see the module docstring).

    ``method`` plans the multicast (``greedy`` or ``exact``, or a baseline data plane);
    ``live_method`` predicts each live pair (any :func:`~blitzplan.schedule_live` method);
    ``time_limit_s`` bounds the exact searches. ``compute`` times layers (default: a roofline on
    each GPU's spec); ``max_batch_tokens`` groups queued requests into batches. With
    ``compare_baselines`` the milestones also hold the AllCache and ServerlessLLM figures.
    ``mutate_decode=False`` loads every added decode instance instead of mutating prefill ones.
    ``allow_prefill_sources`` lets prefill instances send weights (when nothing else holds them).
    ``link_efficiency``: each link medium's achieved fraction of line rate the plan's times are
    computed at (None: the measured defaults of :data:`blitzplan.topologies.links.
    LINK_EFFICIENCY`; ``1.0``: line rate; or a table per medium). ``prescale_decode`` and
    ``compare_baselines`` are off by default (a control loop gets what it asked for, fast).
    ``deadline_s`` bounds the whole call: the greedy skips its refinements and live tails stop
    pairing once it has passed, and the plan's ``notes`` say what was left out.
    """
    started = time.monotonic()
    if deadline_s is not None and (
        isinstance(deadline_s, bool)
        or not isinstance(deadline_s, int | float)
        or not deadline_s > 0
    ):
        raise InvalidInputError(f"deadline_s must be a number of seconds > 0, got {deadline_s!r}")
    if not isinstance(request, ScaleRequest):
        raise InvalidInputError(f"request must be a ScaleRequest, got {type(request).__name__}")
    spec = request.model if isinstance(request.model, ModelSpec) else load_model(request.model)
    spec.check_tp(request.tp)
    mine = [i for i in state.instances if i.identity == spec.identity]
    missing: list[str] = []
    releases = _releases(mine, request, missing)
    released = {r.instance for r in releases}
    prefill_old = [i for i in mine if i.role is Role.PREFILL and i.id not in released]
    decode_old = [i for i in mine if i.role is Role.DECODE and i.id not in released]
    add_decode = max(request.decode, 0)
    add_prefill = max(request.prefill, 0)
    mutable = max(0, len(prefill_old) - 1)  # never the last prefill instance
    by_kv = sorted(prefill_old, key=lambda i: (i.kv_bytes_used, _tokens(i), i.id))
    mutated = by_kv[: min(add_decode, mutable)] if mutate_decode else []
    prescale = 0
    if (
        prescale_decode
        and prefill_old
        and decode_old
        and add_prefill >= LARGE_SCALE_UP * len(prefill_old)
    ):
        prescale = math.ceil(add_prefill * len(decode_old) / len(prefill_old))
    new_prefill = add_prefill + len(mutated)
    new_decode = add_decode - len(mutated) + prescale
    new_prefill, new_decode = _fit(
        state, spec, request.tp, (new_prefill, new_decode, prescale), missing
    )
    if strict and missing:
        raise InfeasibleError("; ".join(missing))
    options = Options(
        method,
        live_method,
        time_limit_s,
        compute,
        chunk_bytes,
        startup_s,
        max_batch_tokens,
        compare_baselines,
        allow_prefill_sources,
        strict,
        link_efficiency_table(link_efficiency),
        deadline_s,
    )
    staying = [i for i in prefill_old if i not in mutated]
    targets = Targets(count=new_prefill + new_decode, prefill=new_prefill)
    return realize(
        state,
        spec,
        request.tp,
        targets,
        options,
        request={"prefill": request.prefill, "decode": request.decode, "tp": request.tp},
        staying=staying,
        mutated=mutated,
        releases=releases,
        missing=missing,
        started=started,
    )


@dataclass(frozen=True)
class Options:
    """The knobs :func:`plan` and :func:`replan` pass through."""

    method: str = "greedy"
    live_method: str = "zigzag"
    time_limit_s: float | None = None
    compute: ComputeModel | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    startup_s: float = 0.0
    max_batch_tokens: int | None = None
    compare_baselines: bool = False
    allow_prefill_sources: bool = False
    strict: bool = False
    link_efficiency: Mapping[str, float] = field(default_factory=lambda: dict(LINK_EFFICIENCY))
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        if self.live_method not in LIVE_METHODS:
            raise InvalidInputError(
                f"live_method must be one of {', '.join(LIVE_METHODS)}, got {self.live_method!r}"
            )

    @property
    def recorded(self) -> PlanOptions:
        """What the plan records of these options (all but the compute model)."""
        return PlanOptions(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(PlanOptions)}
        )

    @classmethod
    def of(cls, recorded: PlanOptions, compute: ComputeModel | None = None) -> Options:
        """The options a plan recorded, with ``compute`` again."""
        return cls(compute=compute, **dataclasses.asdict(recorded))


@dataclass(frozen=True)
class Targets:
    """The new instances to load: ``count`` placed by the planner, or explicit GPU groups with
    names and units already delivered (a replan); ``prefill`` of them are prefill instances."""

    count: int = 0
    prefill: int = 0
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
    options: Options,
    *,
    request: Mapping[str, int],
    staying: list[Instance],
    mutated: list[Instance],
    releases: tuple[Release, ...],
    missing: list[str],
    held: Held | None = None,
    started: float | None = None,
    notes: Sequence[str] = (),
) -> ScalePlan:
    """Multicast, roles, live pairs, milestones and the transfer program for a fixed set of
    new instances (``held``: bytes the new GPUs already have, a replan's), on ``state``'s links
    at ``options.link_efficiency``; ``notes`` start the plan's notes."""
    clock = _Deadline(started, options.deadline_s)
    notes = list(notes)
    state = at_efficiency(state, options.link_efficiency)
    queues, moved = _requeue(staying, mutated)
    loaded = [i for i in staying if queues[i.id]]
    live: int | tuple[str, ...] = min(targets.prefill, len(loaded))
    if targets.live is not None:
        live = targets.live
    multicast = None
    if targets.total:
        explicit = bool(targets.groups)
        multicast = plan_multicast(
            state,
            spec,
            count=None if explicit else targets.count,
            targets=[list(g) for g in targets.groups] if explicit else None,
            names=list(targets.names) if explicit else _fresh_names(state, targets.count),
            delivered=dict(targets.delivered) if explicit else None,
            tp=tp,
            method=options.method,
            live=live,
            chunk_bytes=options.chunk_bytes,
            startup_s=dict(targets.startup_s) if targets.startup_s else options.startup_s,
            time_limit_s=options.time_limit_s,
            allow_prefill_sources=options.allow_prefill_sources,
            polish_evaluations=0 if clock.tight() else None,
        )
        if clock.tight():
            notes.append("deadline_s: the greedy multicast plan without its refinements")
        notes += _waits(state, multicast)
    roles = dict(targets.roles) if targets.roles else _roles(multicast, targets.prefill)
    pairs = _pairs(
        state, spec, multicast, loaded, queues, options, tp, keep=targets.pairs, clock=clock
    )
    if multicast is not None and len(pairs) < min(len(multicast.live), len(loaded)):
        notes.append(
            f"deadline_s: {min(len(multicast.live), len(loaded)) - len(pairs)} live instances "
            "left without a pair (they load, but help no queue)"
        )
    draining = [i for i in state.instances if i.id in {r.instance for r in releases} and i.queue]
    for inst in draining:  # a released instance finishes its own queue first
        queues.setdefault(inst.id, list(inst.queue))
    milestones = _milestones(
        state, spec, multicast, roles, pairs, [*staying, *draining], queues, tp, options
    )
    steps = program(multicast, state.topology, held) if multicast else ()
    return ScalePlan(
        model=spec.identity,
        spec=spec,
        request=dict(request),
        method=options.method,
        live_method=options.live_method,
        multicast=multicast,
        new_instances=_infos(multicast, roles),
        live_pairs=pairs,
        mutations=_mutations(mutated, multicast, roles, moved),
        releases=_timed_releases(state, spec, releases, options),
        milestones=milestones,
        missing=tuple(missing),
        notes=tuple(notes),
        options=options.recorded,
        steps=steps,
        held={gpu: dict(units) for gpu, units in (held or {}).items()},
        cluster=state.topology.name,
    )


def _waits(state: ClusterState, multicast: MulticastPlan) -> list[str]:
    """A note when the plan waits for background flows that end (an earlier plan's steps)."""
    kept = set(multicast.background)
    ended = [state.flow_end_s(f) for f in state.background_flows if f not in kept]
    if not ended:
        return []
    return [
        f"the new instances start in {max(ended):.3f} s, once an earlier plan's steps end: "
        "until then they fill every route to one of them"
    ]


def at_efficiency(state: ClusterState, efficiency: Mapping[str, float]) -> ClusterState:
    """``state`` with its topology's links at ``efficiency`` (the derated topology is kept on
    the original, so repeated plans reuse its route caches)."""
    if dict(state.topology.link_efficiency) == dict(efficiency):
        return state
    key = tuple(sorted(efficiency.items()))
    cache = state.topology.memo.setdefault("derated", {})
    if key not in cache:
        cache[key] = state.topology.with_link_efficiency(dict(efficiency))
    derated = state.copy()
    derated.topology = cache[key]
    return derated


def validate_plan(state: ClusterState, plan: ScalePlan) -> tuple[str, ...]:
    """Every rule ``plan``'s multicast breaks on ``state`` (the state it was made on), checked
    at the link efficiency the plan was computed at (:func:`~blitzplan.validate_multicast`),
    and every byte a step sends from an instance of another TP degree that its source rank
    lacks (:func:`~blitzplan.scale.byte_checks.check_source_bytes`)."""
    if plan.multicast is None:
        return ()
    derated = at_efficiency(state, plan.options.link_efficiency)
    return validate_multicast(derated, plan.multicast) + check_source_bytes(plan)


@dataclass(frozen=True)
class _Deadline:
    """``plan()``'s ``deadline_s`` from its start: refinements are skipped when it is tight
    (half of it gone), pairing stops once it has passed."""

    started: float | None
    deadline_s: float | None

    def _used(self) -> float:
        return 0.0 if self.started is None else time.monotonic() - self.started

    def tight(self) -> bool:
        return self.deadline_s is not None and self._used() > self.deadline_s / 2

    def passed(self) -> bool:
        return self.deadline_s is not None and self._used() > self.deadline_s


def _fresh_names(state: ClusterState, count: int) -> list[str]:
    """``new<k>`` names the state never handed out (released instances' names included)."""
    return state.fresh_names("new", count)


def _timed_releases(
    state: ClusterState, spec: ModelSpec, releases: tuple[Release, ...], options: Options
) -> tuple[Release, ...]:
    """Each release with the requests it finishes first and when it is free."""
    out = []
    for release in releases:
        inst = state.instance(release.instance)
        drain = _solo_drain_s(state, spec, inst, list(inst.queue), options.compute)
        out.append(
            dataclasses.replace(release, at_s=drain, requests=tuple(q.id for q in inst.queue))
        )
    return tuple(out)


def _tokens(instance: Instance) -> int:
    return sum(q.prompt_tokens for q in instance.queue)


def _releases(
    mine: list[Instance], request: ScaleRequest, missing: list[str]
) -> tuple[Release, ...]:
    out: list[Release] = []
    for role, count, key in (
        (Role.PREFILL, -request.prefill, lambda i: (_tokens(i), i.kv_bytes_used, i.id)),
        (Role.DECODE, -request.decode, lambda i: (i.kv_bytes_used, _tokens(i), i.id)),
    ):
        if count <= 0:
            continue
        candidates = sorted((i for i in mine if i.role is role), key=key)
        if count > len(candidates):
            missing.append(
                f"asked to remove {count} {role.value} instances, only {len(candidates)} serve"
            )
        out.extend(Release(i.id, role.value, i.gpus) for i in candidates[:count])
    return tuple(out)


def _fit(
    state: ClusterState,
    spec: ModelSpec,
    tp: int,
    counts: tuple[int, int, int],
    missing: list[str],
) -> tuple[int, int]:
    """Shrink the new-instance counts to what the free GPUs hold: pre-scaled decode first,
    then decode, then prefill. ``counts`` are the prefill, decode and pre-scaled decode wanted."""
    prefill, decode, prescale = counts
    room = len(state.free_slots(tp, model=spec))
    wanted = prefill + decode
    if wanted <= room:
        return prefill, decode
    cut = wanted - room
    drop_prescale = min(cut, prescale)
    drop_decode = min(cut, decode)
    drop_prefill = cut - drop_decode
    missing.append(
        f"free GPUs hold {room} new tp={tp} instances, {wanted} wanted: "
        f"{drop_prescale} pre-scaled decode, {drop_decode - drop_prescale} decode and "
        f"{drop_prefill} prefill instances are not planned"
    )
    topo = state.topology
    misfits = {memory_misfit(spec, tp, topo.gpu_spec(g).memory_bytes) for g in state.free_gpus()}
    missing += sorted(f"free GPUs refused: {m}" for m in misfits if m)
    return prefill - drop_prefill, decode - drop_decode


def _requeue(
    staying: list[Instance], mutated: list[Instance]
) -> tuple[dict[str, list[QueuedRequest]], dict[str, tuple[tuple[str, str], ...]]]:
    """Queues after mutation: a mutated instance's requests go to the least loaded prefill;
    per mutated instance, ``(request id, where it went)``."""
    queues = {i.id: list(i.queue) for i in staying}
    moved: dict[str, tuple[tuple[str, str], ...]] = {}
    for inst in mutated:
        moves = []
        for request in inst.queue:
            if queues:
                target = min(queues, key=lambda k: (sum(q.prompt_tokens for q in queues[k]), k))
                queues[target].append(request)
                moves.append((request.id, target))
        moved[inst.id] = tuple(moves)
    return queues, moved


def _roles(multicast: MulticastPlan | None, new_prefill: int) -> dict[str, str]:
    if multicast is None:
        return {}
    order = list(multicast.live) + sorted(
        (i.name for i in multicast.instances if i.name not in multicast.live),
        key=lambda name: (multicast.ready_at_s[name], name),
    )
    return {name: ("prefill" if k < new_prefill else "decode") for k, name in enumerate(order)}


def _mutations(
    mutated: list[Instance],
    multicast: MulticastPlan | None,
    roles: dict[str, str],
    moved: Mapping[str, tuple[tuple[str, str], ...]],
) -> tuple[Mutation, ...]:
    replacements = [name for name, role in roles.items() if role == "prefill"]
    replacements.sort(key=lambda name: (name not in (multicast.live if multicast else ()), name))
    return tuple(
        Mutation(
            inst.id,
            "prefill",
            "decode",
            replacements[k] if k < len(replacements) else None,
            at_s=0.0,
            moved=moved.get(inst.id, ()),
        )
        for k, inst in enumerate(mutated)
    )


def _compute_for(
    state: ClusterState, spec: ModelSpec, gpu: str, tp: int, compute: ComputeModel | None
) -> ComputeModel:
    if compute is not None:
        return compute
    return _roofline(spec, state.topology.gpu_spec(gpu), tp)


@functools.lru_cache(maxsize=64)
def _roofline(spec: ModelSpec, gpu: GpuSpec, tp: int) -> RooflineComputeModel:
    """One roofline model per model, GPU and TP degree (its layer times cached inside)."""
    return RooflineComputeModel(spec, gpu, tp=tp)


def live_instance(
    state: ClusterState,
    spec: ModelSpec,
    new_gpus: Sequence[str],
    unit_ready_s: Sequence[float],
    old: Instance,
    queue: Sequence[QueuedRequest],
    options: Options,
    tp: int,
) -> LiveScalingInstance:
    """The live-scaling problem of one pair: the new instance's unit arrivals, the old one's
    queue, layer times from the compute model, hand-off over the path between them."""
    topo = state.topology
    return instance_from_queue(
        spec,
        _compute_for(state, spec, new_gpus[0], tp, options.compute),
        unit_ready_s,
        queue,
        handoff_bytes_per_s=topo.bottleneck_bytes_per_s(new_gpus[0], old.gpus[0]),
        handoff_latency_s=topo.path_latency_s(new_gpus[0], old.gpus[0]),
        old_compute=_compute_for(state, spec, old.gpus[0], old.tp, options.compute),
        max_batch_tokens=options.max_batch_tokens,
    )


def _live_schedule(
    state: ClusterState,
    spec: ModelSpec,
    new_gpus: Sequence[str],
    unit_ready_s: Sequence[float],
    old: Instance,
    queue: list[QueuedRequest],
    policy: str,
    options: Options,
    tp: int,
) -> Schedule:
    instance = live_instance(state, spec, new_gpus, unit_ready_s, old, queue, options, tp)
    limit = options.time_limit_s if policy in ("exact", "improve") else None
    return schedule_live(instance, method=policy, time_limit_s=limit)


def _pairs(
    state: ClusterState,
    spec: ModelSpec,
    multicast: MulticastPlan | None,
    loaded: list[Instance],
    queues: dict[str, list[QueuedRequest]],
    options: Options,
    tp: int,
    *,
    keep: Mapping[str, str] | None = None,
    clock: _Deadline | None = None,
) -> tuple[LivePair, ...]:
    """Live tails with old prefill instances: the pairs in ``keep`` whose old instance still has
    a queue, then the other tails, earliest first layer first, with the most loaded olds left."""
    if multicast is None or not multicast.live:
        return ()
    tails = sorted(multicast.live, key=lambda n: (multicast.layer_ready_s[n][1], n))
    topo = state.topology

    def linked(name: str, old: Instance) -> bool:  # activations cross both ways
        new_gpu, old_gpu = multicast.instance(name).gpus[0], old.gpus[0]
        return topo.has_path(new_gpu, old_gpu) and topo.has_path(old_gpu, new_gpu)

    by_id = {i.id: i for i in loaded}
    chosen = [
        (n, by_id[keep[n]])
        for n in tails
        if keep and keep.get(n) in by_id and linked(n, by_id[keep[n]])
    ]
    taken = {n for n, _ in chosen} | {old.id for _, old in chosen}
    olds = sorted(
        (i for i in loaded if i.id not in taken),
        key=lambda i: (-sum(q.prompt_tokens for q in queues[i.id]), i.id),
    )
    for name in tails:
        if name in taken:
            continue
        old = next((o for o in olds if o.id not in taken and linked(name, o)), None)
        if old is not None:
            chosen.append((name, old))
            taken |= {name, old.id}
    pairs = []
    for name, old in chosen:
        if clock is not None and clock.passed():
            break  # past the deadline: the rest load without a pair (the plan notes it)
        new = multicast.instance(name)
        schedule = _live_schedule(
            state,
            spec,
            new.gpus,
            multicast.layer_ready_s[name],
            old,
            queues[old.id],
            options.live_method,
            options,
            tp,
        )
        batches = tuple(
            tuple(q.id for q in batch)
            for batch in queue_batches(queues[old.id], options.max_batch_tokens)
        )
        pairs.append(
            LivePair(name, old.id, options.live_method, schedule, len(queues[old.id]), batches)
        )
    return tuple(pairs)


def _solo_drain_s(
    state: ClusterState,
    spec: ModelSpec,
    old: Instance,
    queue: list[QueuedRequest],
    compute: ComputeModel | None,
) -> float:
    """When an old instance alone finishes its queue, first come first served."""
    model = _compute_for(state, spec, old.gpus[0], old.tp, compute)
    clock = 0.0
    for request in sorted(queue, key=lambda q: q.arrival_s):
        clock = max(clock, request.arrival_s)
        clock += spec.num_layers * model.prefill_layer_s(request.prompt_tokens) + model.head_s(1)
    return clock


def _figures(
    multicast: MulticastPlan | None,
    roles: dict[str, str],
    drain_s: float,
    first_s: float | None = None,
) -> MilestoneFigures:
    if multicast is None:
        return MilestoneFigures(0.0, 0.0, drain_s)
    prefill = [n for n, r in roles.items() if r == "prefill"] or list(roles)
    first = min(multicast.ready_at_s[n] for n in prefill) if first_s is None else first_s
    return MilestoneFigures(first, max(multicast.ready_at_s.values()), drain_s)


def _milestones(
    state: ClusterState,
    spec: ModelSpec,
    multicast: MulticastPlan | None,
    roles: dict[str, str],
    pairs: tuple[LivePair, ...],
    staying: list[Instance],
    queues: dict[str, list[QueuedRequest]],
    tp: int,
    options: Options,
) -> Milestones:
    paired = {p.old for p in pairs}
    solo = [
        _solo_drain_s(state, spec, i, queues[i.id], options.compute)
        for i in staying
        if i.id not in paired and queues[i.id]
    ]
    drain = max([*solo, *(max(p.schedule.completion_s, default=0.0) for p in pairs)], default=0.0)
    first_live = None
    if multicast is not None and pairs:
        first_live = min(max(multicast.layer_ready_s[p.new][:2]) for p in pairs)
    own = _figures(multicast, roles, drain, first_live)
    baselines: dict[str, MilestoneFigures] = {}
    if multicast is not None and options.compare_baselines:
        targets = [list(i.gpus) for i in multicast.instances]
        by_id = {i.id: i for i in staying}
        for plane in BASELINE_PLANES:
            try:
                other = plan_multicast(
                    state,
                    spec,
                    targets=targets,
                    tp=tp,
                    method=plane,
                    chunk_bytes=options.chunk_bytes,
                    startup_s=options.startup_s,
                    names=[i.name for i in multicast.instances],
                    delivered=multicast.delivered,
                )
            except InfeasibleError:
                continue  # this data plane cannot run here (a failure cut its routes): no figure
            waits = [
                max(
                    _live_schedule(
                        state,
                        spec,
                        other.instance(p.new).gpus,
                        other.layer_ready_s[p.new],
                        by_id[p.old],
                        queues[p.old],
                        "stop_the_world",
                        options,
                        tp,
                    ).completion_s,
                    default=0.0,
                )
                for p in pairs
            ]
            baselines[plane] = _figures(other, roles, max([*solo, *waits], default=0.0))
    return Milestones(own.first_capacity_s, own.full_capacity_s, own.queue_drain_s, baselines)


def _infos(multicast: MulticastPlan | None, roles: dict[str, str]) -> tuple[NewInstanceInfo, ...]:
    if multicast is None:
        return ()
    return tuple(
        NewInstanceInfo(
            name=i.name,
            gpus=i.gpus,
            role=roles[i.name],
            live=i.name in multicast.live,
            ready_at_s=multicast.ready_at_s[i.name],
            layer_ready_s=multicast.layer_ready_s[i.name],
        )
        for i in multicast.instances
    )
