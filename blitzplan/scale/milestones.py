"""Milestones, a planning rule of :func:`~blitzplan.plan`: when added capacity first does work,
when all of it is there, and when the queues are drained.

``first_capacity_s`` is when the first live pair's new instance has its embedding and first
layer (it serves layer by layer), else when the first new instance that takes prompts (prefill
or colocated) is complete. An old instance without a pair drains its queue alone, first come
first served. With ``compare_baselines`` the same figures for the AllCache and ServerlessLLM
data planes on the same GPUs (whole instances only: their live pairs stop the world).
"""

from __future__ import annotations

from blitzplan.cluster import ClusterState, Instance, QueuedRequest
from blitzplan.compute import ComputeModel
from blitzplan.errors import InfeasibleError
from blitzplan.models import ModelSpec
from blitzplan.multicast import plan_multicast
from blitzplan.multicast.plan_types import MulticastPlan
from blitzplan.scale.pairing import compute_for, live_schedule
from blitzplan.scale.planning import Planning
from blitzplan.scale.types import LivePair, MilestoneFigures, Milestones

__all__ = ["BASELINE_PLANES", "PROMPT_ROLES", "milestones", "solo_drain_s"]

BASELINE_PLANES = ("allcache", "serverlessllm")
"""Data planes whose milestones a plan reports beside its own (``compare_baselines``)."""
PROMPT_ROLES = ("prefill", "colocated")
"""The roles whose instances take prompts (and so can be live and pair)."""


def solo_drain_s(
    state: ClusterState,
    spec: ModelSpec,
    old: Instance,
    queue: list[QueuedRequest],
    compute: ComputeModel | None,
) -> float:
    """When an old instance alone finishes its queue, first come first served (on a roofline,
    memoised per roofline and queue: a control loop asks it of every queued instance, each
    plan)."""
    key = None
    if compute is None:  # a roofline: a pure function of the model, the GPU and the TP degree
        gpu = state.topology.gpu_spec(old.gpus[0])
        key = (spec, gpu, old.tp, tuple([(q.arrival_s, q.prompt_tokens) for q in queue]))
        found = _DRAINS.get(key)
        if found is not None:
            return found
    model = compute_for(state, spec, old.gpus[0], old.tp, compute)
    clock = 0.0
    for request in sorted(queue, key=lambda q: q.arrival_s):
        clock = max(clock, request.arrival_s)
        clock += spec.num_layers * model.prefill_layer_s(request.prompt_tokens) + model.head_s(1)
    if key is not None:
        if len(_DRAINS) >= _DRAIN_MEMOS:
            _DRAINS.clear()
        _DRAINS[key] = clock
    return clock


_DRAIN_MEMOS = 4096
_DRAINS: dict[tuple[object, ...], float] = {}
"""Solo drain times on rooflines by (model, GPU spec, TP degree, queue as (arrival, prompt
tokens))."""


def _figures(
    multicast: MulticastPlan | None,
    roles: dict[str, str],
    drain_s: float,
    first_s: float | None = None,
) -> MilestoneFigures:
    if multicast is None:
        return MilestoneFigures(0.0, 0.0, drain_s)
    prompts = [n for n, r in roles.items() if r in PROMPT_ROLES] or list(roles)
    first = min(multicast.ready_at_s[n] for n in prompts) if first_s is None else first_s
    return MilestoneFigures(first, max(multicast.ready_at_s.values()), drain_s)


def milestones(
    state: ClusterState,
    spec: ModelSpec,
    multicast: MulticastPlan | None,
    roles: dict[str, str],
    pairs: tuple[LivePair, ...],
    staying: list[Instance],
    queues: dict[str, list[QueuedRequest]],
    tp: int,
    run: Planning,
) -> Milestones:
    """The plan's milestones (module docstring); ``staying`` are the old instances that finish
    queues (``queues`` by instance id)."""
    paired = {p.old for p in pairs}
    solo = [
        solo_drain_s(state, spec, i, queues[i.id], run.compute)
        for i in staying
        if i.id not in paired and queues[i.id]
    ]
    drain = max([*solo, *(max(p.schedule.completion_s, default=0.0) for p in pairs)], default=0.0)
    first_live = None
    if multicast is not None and pairs:
        first_live = min(max(multicast.layer_ready_s[p.new][:2]) for p in pairs)
    own = _figures(multicast, roles, drain, first_live)
    baselines: dict[str, MilestoneFigures] = {}
    if multicast is not None and run.options.compare_baselines:
        for plane in BASELINE_PLANES:
            figures = _baseline(
                state, spec, multicast, roles, pairs, staying, queues, tp, run, plane, solo
            )
            if figures is not None:
                baselines[plane] = figures
    return Milestones(own.first_capacity_s, own.full_capacity_s, own.queue_drain_s, baselines)


def _baseline(
    state: ClusterState,
    spec: ModelSpec,
    multicast: MulticastPlan,
    roles: dict[str, str],
    pairs: tuple[LivePair, ...],
    staying: list[Instance],
    queues: dict[str, list[QueuedRequest]],
    tp: int,
    run: Planning,
    plane: str,
    solo: list[float],
) -> MilestoneFigures | None:
    """The figures of data plane ``plane`` on the same GPUs (None: it cannot run here, e.g. a
    failure cut its routes)."""
    try:
        other = plan_multicast(
            state,
            spec,
            targets=[list(i.gpus) for i in multicast.instances],
            tp=tp,
            method=plane,
            chunk_bytes=run.options.chunk_bytes,
            startup_s=run.options.startup_s,
            names=[i.name for i in multicast.instances],
            delivered=multicast.delivered,
        )
    except InfeasibleError:
        return None
    by_id = {i.id: i for i in staying}
    waits = [
        max(
            live_schedule(
                state,
                spec,
                other.instance(p.new).gpus,
                other.layer_ready_s[p.new],
                by_id[p.old],
                queues[p.old],
                "stop_the_world",
                run,
                tp,
            ).completion_s,
            default=0.0,
        )
        for p in pairs
    ]
    return _figures(other, roles, max([*solo, *waits], default=0.0))
