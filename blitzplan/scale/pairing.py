"""Live pairing, a planning rule of :func:`~blitzplan.plan`: which live new instance helps which
overloaded old instance, and each pair's predicted schedule.

Live tails, earliest first layer first, pair with the old instances of their role that have
a queue, most queued prompt tokens first (pairs a replan keeps come first): a new prefill
instance with a prefill instance, a new colocated instance with a colocated one (the new one
runs the first layers of the old one's waiting prefills while the old one keeps decoding). A
pair needs a path both ways between the two (activations cross). Each pair's schedule is
:func:`~blitzplan.schedule_live` of the options' ``live_method`` over the old instance's queue,
with layer times from the compute model (default: a roofline on each GPU's spec).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from blitzplan.cluster import ClusterState, Instance, QueuedRequest
from blitzplan.compute import ComputeModel, RooflineComputeModel
from blitzplan.hardware import GpuSpec
from blitzplan.live.instance import LiveScalingInstance, instance_from_queue
from blitzplan.live.queue_cache import batch_ids, batched
from blitzplan.live.schedule import Schedule
from blitzplan.live.solve import schedule_live
from blitzplan.models import ModelSpec
from blitzplan.multicast.plan_types import MulticastPlan, built
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.planning import Planning
from blitzplan.scale.types import LivePair
from blitzplan.topologies import Topology

__all__ = ["compute_for", "live_instance", "live_pairs", "live_schedule"]


def compute_for(
    state: ClusterState, spec: ModelSpec, gpu: str, tp: int, compute: ComputeModel | None
) -> ComputeModel:
    """``compute``, else the roofline of ``gpu``'s spec."""
    if compute is not None:
        return compute
    kept = state.topology.memo.setdefault("rooflines", {})  # per GPU: no spec hashed each call
    found = kept.get((gpu, tp))
    if found is None or found[0] is not spec:
        found = kept[gpu, tp] = (spec, _roofline(spec, state.topology.gpu_spec(gpu), tp))
    return found[1]


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
    options: PlanOptions,
    tp: int,
    *,
    compute: ComputeModel | None = None,
) -> LiveScalingInstance:
    """The live-scaling problem of one pair: the new instance's unit arrivals, the old one's
    queue, layer times from ``compute`` (default: rooflines), hand-off over the path between
    them."""
    rate, latency = _handoff(state.topology, new_gpus[0], old.gpus[0])
    return instance_from_queue(
        spec,
        compute_for(state, spec, new_gpus[0], tp, compute),
        unit_ready_s,
        queue,
        handoff_bytes_per_s=rate,
        handoff_latency_s=latency,
        old_compute=compute_for(state, spec, old.gpus[0], old.tp, compute),
        max_batch_tokens=options.max_batch_tokens,
    )


def _handoff(topology: Topology, new_gpu: str, old_gpu: str) -> tuple[float, float]:
    """The bottleneck rate and the latency of the path from ``new_gpu`` to ``old_gpu``, kept
    per topology (its graph never changes)."""
    kept = topology.memo.setdefault("handoff", {})
    found = kept.get((new_gpu, old_gpu))
    if found is None:
        found = kept[new_gpu, old_gpu] = (
            topology.bottleneck_bytes_per_s(new_gpu, old_gpu),
            topology.path_latency_s(new_gpu, old_gpu),
        )
    return found


def live_schedule(
    state: ClusterState,
    spec: ModelSpec,
    new_gpus: Sequence[str],
    unit_ready_s: Sequence[float],
    old: Instance,
    queue: list[QueuedRequest],
    policy: str,
    run: Planning,
    tp: int,
) -> Schedule:
    """The schedule ``policy`` predicts for one pair."""
    instance = live_instance(
        state, spec, new_gpus, unit_ready_s, old, queue, run.options, tp, compute=run.compute
    )
    limit = run.options.time_limit_s if policy in ("exact", "improve") else None
    # under a deadline no relaxation bound: up to 0.25 s per distinct pair, not on its clock
    return schedule_live(instance, method=policy, time_limit_s=limit, bound=not run.bounded())


def live_pairs(
    state: ClusterState,
    spec: ModelSpec,
    multicast: MulticastPlan | None,
    loaded: list[Instance],
    queues: dict[str, list[QueuedRequest]],
    run: Planning,
    tp: int,
    *,
    roles: Mapping[str, str],
    keep: Mapping[str, str] | None = None,
) -> tuple[tuple[LivePair, ...], int]:
    """Live tails with old instances of their role (module docstring), and how many matched
    pairs were left out because the deadline passed (they load without a pair)."""
    if multicast is None or not multicast.live:
        return (), 0
    pairs: list[LivePair] = []
    matched = _matched(state, multicast, loaded, queues, roles, keep or {})
    gpus = {i.name: i.gpus for i in multicast.instances}
    longest = 0.0  # the longest pair's wall-clock so far: the next one may take as long
    for name, old in matched:
        if run.passed(state.topology, longest):
            break  # the deadline is near: the rest load without a pair (the plan notes it)
        began = run.used()
        schedule = live_schedule(
            state,
            spec,
            gpus[name],
            multicast.layer_ready_s[name],
            old,
            queues[old.id],
            run.options.live_method,
            run,
            tp,
        )
        batches = batch_ids(batched(queues[old.id], run.options.max_batch_tokens))
        method = run.options.live_method
        pairs.append(  # LivePair(...) without its frozen __init__: one per pair
            built(
                LivePair,
                new=name,
                old=old.id,
                policy=method,
                schedule=schedule,
                queued_requests=len(queues[old.id]),
                batches=batches,
            )
        )
        longest = max(longest, run.used() - began)
    return tuple(pairs), len(matched) - len(pairs)


def _matched(
    state: ClusterState,
    multicast: MulticastPlan,
    loaded: list[Instance],
    queues: dict[str, list[QueuedRequest]],
    roles: Mapping[str, str],
    keep: Mapping[str, str],
) -> list[tuple[str, Instance]]:
    """``(live tail, old instance)``: the kept pairs, then earliest tail with the most loaded
    old instance of its role."""
    tails = sorted(multicast.live, key=lambda n: (multicast.layer_ready_s[n][1], n))
    topo = state.topology
    first_gpu = {i.name: i.gpus[0] for i in multicast.instances}

    def linked(name: str, old: Instance) -> bool:  # same role; activations cross both ways
        new_gpu, old_gpu = first_gpu[name], old.gpus[0]
        return (
            roles.get(name) == old.role.value
            and topo.has_path(new_gpu, old_gpu)
            and topo.has_path(old_gpu, new_gpu)
        )

    by_id = {i.id: i for i in loaded}
    chosen = [
        (n, by_id[keep[n]]) for n in tails if keep.get(n) in by_id and linked(n, by_id[keep[n]])
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
    return chosen
