"""``plan(state, [request, ...])``: several scaling requests at once (several models, one
cluster), one :class:`~blitzplan.scale.types.MultiPlan`.

What "at once" means, honestly: the requests share the cluster **in priority order**, not in a
joint optimum. Request k is planned by :func:`~blitzplan.plan` on the cluster as
:func:`~blitzplan.apply_plan` leaves it at the start of the plans before it: their new
instances hold their GPUs (loading; a later request for the same model may stream from them as
their records allow), their mutations are done, and their steps are background flows on their
routes at their planned rates until they end. So every flow of a later request shares NICs and
links with the earlier requests' flows and gets what they leave (max-min fair on what is left;
an earlier request is never slowed by a later one); the order of the requests is their
priority. No search over orders or joint allocations is made: a later request may wait for a
link an earlier one could have left it. The GPUs an earlier request's steps send from or relay
through (spare GPUs forwarding over their NICs or PCIe) are held while the later ones are
planned, even once free (a source a request releases at once still sends), so no later request
places an instance or relays there (a relay holds the model's bytes it forwards). The
parts together are one transfer program (:meth:`MultiPlan.program_json`) whose parts obey the
rules between parts of :func:`~blitzplan.wire.multiprogram.check_joint`.

**When GPUs run short**, a request that finds too few free GPUs for its instances takes GPUs back
under one documented rule: idle instances of *other* models are released, the least loaded
first: an instance is idle when it has no queued request and no KV in use, and among the idle
ones the most recently added goes first (the highest id number). Never released: an instance of
the requesting model, and one an earlier plan of this call relies on (its loading new instances,
the instances it streams from, mutates, drains or pairs live). Instances are released until the
request fits, or until no idle one is left (then the request gets what :func:`~blitzplan.plan`
gives on the GPUs there are). The releases are :attr:`MultiPlan.evictions`, each naming the
request it made room for; the parts themselves do not carry them.

**All or nothing**: a request :func:`~blitzplan.plan` refuses (``strict``, no copy of the model
anywhere) raises :class:`~blitzplan.errors.InfeasibleError` naming the request, and no plan is
returned for any request; ``state`` is never changed. ``deadline_s`` bounds the whole call:
each request gets an equal share of the time left when its turn comes.

**Replanning a MultiPlan** after failures (:func:`replan_parts`, what ``replan(multi, ...)``
does) repairs each part with the one-request :func:`~blitzplan.replan`, in the same priority
order and on the same terms: part k is replanned on the cluster as the replans of the parts
before it leave it at the moment of replanning (their surviving new instances loading, their
complete ones serving, their steps background flows on their routes), so the parts' flows again
share NICs and links in one program; the GPUs of the later parts' new instances, and those the
earlier replans send from or relay through, are held so that no replan relays there. Each part
keeps its own delivered bytes (:func:`~blitzplan.scale.validate_replan` checks each part against
its old part). A failure that names a new instance applies to the part it belongs to; a
cancelled name must be a new instance of some part. The evictions are done (they were made when
the MultiPlan started): the replan has none, and instances it evicted still in ``state`` are
taken out. All or nothing, as for ``plan``: a part the one-request replan refuses raises naming
``plans[k]``. ``recover(multi, state, ...)`` gives the degraded cluster the replanned parts start
from (evictions done, every part's complete new instances serving): ``apply_plan`` of the replan
on it is the cluster that many seconds into the replan.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from blitzplan.cluster import ClusterState, Instance, Role
from blitzplan.compute import ComputeModel
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec, load_model
from blitzplan.scale.apply import apply_plan
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.recovery import Failure, recover, without_evictions
from blitzplan.scale.types import Eviction, MultiPlan, NewInstanceInfo, ScalePlan, ScaleRequest

__all__ = ["plan_requests", "replan_parts"]

_HOLD = "held-relay:"
"""Id prefix of the placeholder instances that hold an earlier request's relay GPUs."""
_LATER = "held-later:"
"""Id prefix of the placeholders that hold a later part's GPUs while a part is replanned."""


def plan_requests(
    state: ClusterState,
    requests: Sequence[ScaleRequest],
    plan: Callable[..., ScalePlan],
    *,
    options: PlanOptions | None = None,
    compute: ComputeModel | None = None,
    **keywords: Any,
) -> MultiPlan:
    """Plan ``requests`` in order on ``state`` (module docstring), each by ``plan`` (the
    one-request :func:`~blitzplan.plan`); ``options``, ``keywords`` and ``compute`` as for one
    request. ``state`` is unchanged."""
    started = time.monotonic()
    options = PlanOptions.of(options, **keywords)
    _check(state, requests)
    current, plans, evictions = state.copy(), [], []
    kept: set[str] = set()
    used: set[str] = set()
    for k, request in enumerate(requests):
        for victim in _room(current, request, kept):
            inst = current.remove_instance(victim)
            evictions.append(Eviction(k, inst.id, inst.model.name, str(inst.role), inst.gpus))
        share = _share(options, started, len(requests) - k)
        try:
            made = plan(current, request, options=share, compute=compute)
        except InfeasibleError as exc:
            raise InfeasibleError(f"requests[{k}] ({_name(request)}): {exc}") from None
        plans.append(made)
        kept |= _relied_on(current, made)
        used |= _used(current, made)
        current = apply_plan(current, made, at_s=0.0)
        kept |= _hold(current, used)
    return MultiPlan(tuple(plans), tuple(evictions))


def replan_parts(
    multi: MultiPlan,
    state: ClusterState,
    replan: Callable[..., ScalePlan],
    *,
    at_s: float,
    now_s: float | None = None,
    failed: Iterable[Failure] = (),
    cancelled: Iterable[str] = (),
    options: PlanOptions | None = None,
    compute: ComputeModel | None = None,
) -> MultiPlan:
    """A MultiPlan that completes every surviving new instance of every part of ``multi``
    (module docstring), each part by ``replan`` (the one-request :func:`~blitzplan.replan`,
    whose arguments these are). ``state`` is the cluster now, without the parts' new
    instances; it is unchanged."""
    if not isinstance(multi, MultiPlan) or not isinstance(state, ClusterState):
        raise InvalidInputError(
            f"replan_parts takes a MultiPlan and a ClusterState, got {type(multi).__name__} "
            f"and {type(state).__name__}"
        )
    failures, dropped = _listed("failed", failed), set(_listed("cancelled", cancelled))
    every = {info.name for part in multi.plans for info in part.new_instances}
    for name in sorted(str(n) for n in dropped - every):
        raise InvalidInputError(f"cancelled names {name!r}, which is no part's new instance")
    current = without_evictions(multi, state)  # released when the MultiPlan started
    plans: list[ScalePlan] = []
    used: set[str] = set()
    for k, part in enumerate(multi.plans):
        mine = {info.name for info in part.new_instances}
        ids = {i.id for i in current.instances}
        own = [f for f in failures if not isinstance(f, str) or f in mine | ids or f not in every]
        trial = _held_for_later(current, multi.plans[k + 1 :], k)
        cut = sorted(dropped & mine)
        try:
            made = replan(
                part,
                trial,
                at_s=at_s,
                now_s=now_s,
                failed=own,
                cancelled=cut,
                options=options,
                compute=compute,
            )
            complete = recover(part, trial, at_s=at_s, failed=own, cancelled=cut).complete
        except (InfeasibleError, InvalidInputError) as exc:
            raise type(exc)(f"plans[{k}] ({part.spec.name}): {exc}") from None
        plans.append(made)
        current = _after(current, part, made, complete)
        used |= _used(current, made)
        _hold(current, used)
    return MultiPlan(tuple(plans), ())


def _after(
    state: ClusterState,
    part: ScalePlan,
    made: ScalePlan,
    complete: Sequence[NewInstanceInfo],
) -> ClusterState:
    """The cluster as part ``made`` (the replan of ``part``) leaves it when it starts: the
    part's complete new instances serve, its survivors load under ``made``."""
    state = state.copy()
    for info in complete:
        state.add_instance(part.spec, gpus=list(info.gpus), role=info.role, instance_id=info.name)
    return apply_plan(state, made, at_s=0.0)


def _listed(what: str, items: Iterable[Any]) -> list[Any]:
    if isinstance(items, str) or not isinstance(items, Iterable):
        raise InvalidInputError(f"{what} must be a collection, got {items!r}")
    return list(items)


def _held_for_later(state: ClusterState, later: Sequence[ScalePlan], k: int) -> ClusterState:
    """``state`` with the free GPUs of the later parts' new instances held (placeholders), so
    that part ``k``'s replan neither places nor relays there."""
    trial = state.copy()
    free = set(trial.free_gpus())
    gpus = sorted({g for part in later for info in part.new_instances for g in info.gpus} & free)
    for gpu in gpus:
        trial.add_instance(
            _placeholder(), gpus=[gpu], role=Role.IDLE, instance_id=f"{_LATER}{k}:{gpu}"
        )
    return trial


def _check(state: ClusterState, requests: Sequence[ScaleRequest]) -> None:
    if not isinstance(state, ClusterState):
        raise InvalidInputError(f"state must be a ClusterState, got {type(state).__name__}")
    if isinstance(requests, ScaleRequest | str) or not isinstance(requests, Sequence):
        raise InvalidInputError(f"requests must be a list of ScaleRequest, got {requests!r}")
    if not requests:
        raise InvalidInputError("requests is empty: give at least one ScaleRequest")
    for k, request in enumerate(requests):
        if not isinstance(request, ScaleRequest):
            raise InvalidInputError(f"requests[{k}] must be a ScaleRequest, got {request!r}")


def _share(options: PlanOptions, started: float, left: int) -> PlanOptions:
    """``options`` with ``deadline_s`` an equal share of the time left (module docstring)."""
    if options.deadline_s is None:
        return options
    remaining = options.deadline_s - (time.monotonic() - started)
    return dataclasses.replace(options, deadline_s=max(remaining / left, 1e-6))


def _relied_on(state: ClusterState, made: ScalePlan) -> set[str]:
    """Ids of the instances of ``state`` that ``made`` streams from, mutates, drains or pairs
    live."""
    senders = {step.source for step in made.steps}
    ids = {i.id for i in state.instances if senders & set(i.gpus)}
    ids |= {m.instance for m in made.mutations} | {p.old for p in made.live_pairs}
    return ids | {r.instance for r in made.releases}


def _hold(state: ClusterState, used: set[str]) -> set[str]:
    """Hold the free GPUs of ``used`` (the GPUs the plans so far send from or relay through)
    with placeholder instances of a tiny model no request names, so that later requests
    neither place nor relay there; their ids."""
    held = []
    for gpu in sorted(used & set(state.free_gpus())):
        inst = state.add_instance(
            _placeholder(), gpus=[gpu], role=Role.IDLE, instance_id=f"{_HOLD}{gpu}"
        )
        held.append(inst.id)
    return set(held)


def _used(state: ClusterState, made: ScalePlan) -> set[str]:
    """The GPUs ``made``'s steps send from or relay through."""
    used = {s.destination for s in made.steps if s.instance is None}
    return (used | {s.source for s in made.steps}) & set(state.topology.gpus())


@functools.cache
def _placeholder() -> ModelSpec:
    config = {
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
        "vocab_size": 64,
        "torch_dtype": "bfloat16",
    }
    return load_model("blitzplan-relay-hold", config=config)


def _room(state: ClusterState, request: ScaleRequest, kept: set[str]) -> list[str]:
    """The idle instances of other models to release so that ``request``'s new instances find
    GPUs (module docstring), none when enough are free or when releasing cannot help."""
    need = max(request.prefill, 0) + max(request.decode, 0) + max(request.colocated, 0)
    spec = request.model if not isinstance(request.model, str) else load_model(request.model)
    have = len(state.free_slots(request.tp, model=spec))
    if have >= need:
        return []
    idle = [
        i for i in state.instances if _idle(i) and i.identity != spec.identity and i.id not in kept
    ]
    order = sorted(idle, key=lambda i: _number(i.id), reverse=True)
    chosen: list[str] = []
    trial = state.copy()
    for inst in order:
        if len(trial.free_slots(request.tp, model=spec)) >= need:
            break
        trial.remove_instance(inst.id)
        chosen.append(inst.id)
    return chosen


def _idle(inst: Instance) -> bool:
    return (
        inst.role in (Role.PREFILL, Role.DECODE, Role.COLOCATED, Role.IDLE)
        and not inst.queue
        and inst.kv_bytes_used == 0
    )


def _number(instance_id: str) -> tuple[int, str]:
    digits = "".join(c for c in instance_id if c.isdigit())
    return (int(digits) if digits else -1, instance_id)


def _name(request: ScaleRequest) -> str:
    return request.model if isinstance(request.model, str) else request.model.name
