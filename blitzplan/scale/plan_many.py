"""``plan_many()``: several scaling requests at once (several models, one cluster), planned in
order.

The rule, honestly stated: this is *not* one joint transfer program. Request k is planned by
:func:`~blitzplan.plan` on the cluster as :func:`~blitzplan.apply_plan` leaves it at the start of
the plans before it: their new instances hold their GPUs (loading; a later request for the same
model may stream from them as their records allow), their mutations are done, and their steps
are background flows on their routes at their planned rates until they end. So every flow of a
later request shares NICs and links with the earlier requests' flows, getting what they leave
(an earlier request is never slowed by a later one); the order of ``requests`` is their priority.

When GPUs run short, a request that finds too few free GPUs for its instances takes GPUs back
under one documented rule: idle instances of *other* models are released, the least loaded
first: an instance is idle when it has no queued request and no KV in use, and among the idle
ones the most recently added goes first (the highest id number). Never released: an instance of
the requesting model, and one an earlier plan of this call relies on (its loading new instances,
the instances it streams from, mutates or pairs live). Instances are released until the request
fits, or until no idle one is left (then the request gets what :func:`~blitzplan.plan` gives on
the GPUs there are). The releases are listed in :attr:`ManyPlans.released`; the plans themselves
do not carry them. A request :func:`~blitzplan.plan` refuses raises
:class:`~blitzplan.errors.InfeasibleError` naming the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from blitzplan.cluster import ClusterState, Instance, Role
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import load_model
from blitzplan.scale.apply import apply_plan
from blitzplan.scale.plan import plan
from blitzplan.scale.types import ScalePlan, ScaleRequest

__all__ = ["ManyPlans", "plan_many"]


@dataclass(frozen=True)
class ManyPlans:
    """One plan per request (in order), the instances of other models released to make room
    (``(request index, instance id)``), and the cluster once every plan has started."""

    plans: tuple[ScalePlan, ...]
    released: tuple[tuple[int, str], ...]
    state: ClusterState


def plan_many(state: ClusterState, requests: Sequence[ScaleRequest], **options: Any) -> ManyPlans:
    """Plan ``requests`` in order on ``state`` (module docstring); ``options`` go to every
    :func:`~blitzplan.plan` call. ``state`` is unchanged."""
    if not isinstance(state, ClusterState):
        raise InvalidInputError(f"state must be a ClusterState, got {type(state).__name__}")
    if isinstance(requests, ScaleRequest | str) or not isinstance(requests, Sequence):
        raise InvalidInputError(f"requests must be a list of ScaleRequest, got {requests!r}")
    for k, request in enumerate(requests):
        if not isinstance(request, ScaleRequest):
            raise InvalidInputError(f"requests[{k}] must be a ScaleRequest, got {request!r}")
    current, plans, released = state.copy(), [], []
    kept: set[str] = set()
    for k, request in enumerate(requests):
        for victim in _room(current, request, kept):
            current.remove_instance(victim)
            released.append((k, victim))
        try:
            made = plan(current, request, **options)
        except InfeasibleError as exc:
            raise InfeasibleError(f"requests[{k}] ({_name(request)}): {exc}") from None
        plans.append(made)
        kept |= _relied_on(current, made)
        current = apply_plan(current, made, at_s=0.0)
    return ManyPlans(tuple(plans), tuple(released), current)


def _relied_on(state: ClusterState, made: ScalePlan) -> set[str]:
    """Ids of the instances of ``state`` that ``made`` streams from, mutates or pairs live."""
    senders = {step.source for step in made.steps}
    ids = {i.id for i in state.instances if senders & set(i.gpus)}
    ids |= {m.instance for m in made.mutations} | {p.old for p in made.live_pairs}
    return ids


def _room(state: ClusterState, request: ScaleRequest, kept: set[str]) -> list[str]:
    """The idle instances of other models to release so that ``request``'s new instances find
    GPUs (module docstring), none when enough are free or when releasing cannot help."""
    need = max(request.prefill, 0) + max(request.decode, 0)
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
