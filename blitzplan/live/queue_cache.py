"""What building live-scaling instances keeps from call to call (:mod:`.instance`).

A plan and the replans after it pair the same old instances, whose queues (records that never
change) batch the same way and take the same layer times; and a fleet of equal pairs (the same
arrivals, queues equal but for their requests' ids) asks for equal instances. Everything here is
keyed on immutable inputs or on objects the entry itself holds (so an id is never another
object's), and bounded (the oldest entries go first).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from types import NoneType
from typing import TYPE_CHECKING, Any, cast

from blitzplan._checks import is_integer
from blitzplan.cluster import QueuedRequest
from blitzplan.compute import ComputeModel, RooflineComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec

if TYPE_CHECKING:
    from blitzplan.live.instance import LiveScalingInstance

__all__ = [
    "BATCHES_KEPT",
    "INSTANCES_KEPT",
    "batch_ids",
    "batch_times",
    "batched",
    "instance_key",
    "keep_instance",
    "kept_instance",
]


def batched(
    queue: Iterable[QueuedRequest | tuple[float, int]], max_batch_tokens: int | None
) -> tuple[tuple[QueuedRequest, ...], ...]:
    """:func:`~blitzplan.live.instance.queue_batches` as tuples, kept for a queue of
    QueuedRequest records (immutable: a plan and the replans after it batch the same queues
    again; the last :data:`BATCHES_KEPT` kept)."""
    if max_batch_tokens is not None and (not is_integer(max_batch_tokens) or max_batch_tokens < 1):
        raise InvalidInputError(
            f"max_batch_tokens must be a positive integer or None, got {max_batch_tokens!r}"
        )
    given = tuple(queue)
    if not all(type(q) is QueuedRequest for q in given):
        return _batched(given, max_batch_tokens)
    requests = cast(tuple[QueuedRequest, ...], given)
    # keyed on the records themselves (the entry holds them: their ids stay theirs)
    key = (*map(id, requests), max_batch_tokens)
    found = _BATCHES.get(key)
    if found is None or found[0] != requests:  # the same records: compared by identity first
        found = (requests, _batched(requests, max_batch_tokens))
        _keep(_BATCHES, key, found)
    return found[1]


def batch_ids(
    batches: tuple[tuple[QueuedRequest, ...], ...],
) -> tuple[tuple[str, ...], ...]:
    """The request ids of ``batches`` (as :func:`batched` answers them), kept per batches
    object (the entry holds it: its id stays its own)."""
    found = _IDS.get(id(batches))
    if found is None or found[0] is not batches:
        found = (batches, tuple(tuple(map(_REQUEST_ID, batch)) for batch in batches))
        _keep(_IDS, id(batches), found)
    return found[1]


_REQUEST_ID = operator.attrgetter("id")

BATCHES_KEPT = 4096
"""Batched queues kept (:func:`batched`), and per-batch times (:func:`batch_times`)."""

_BATCHES: dict[object, tuple[tuple[QueuedRequest, ...], tuple[tuple[QueuedRequest, ...], ...]]] = {}
_TIMES: dict[object, tuple[object, ...]] = {}
_IDS: dict[int, tuple[object, tuple[tuple[str, ...], ...]]] = {}


def _keep(kept: dict[Any, Any], key: object, value: object, most: int = BATCHES_KEPT) -> None:
    """``kept[key] = value``, the oldest entries dropped beyond ``most``."""
    while len(kept) >= most:
        kept.pop(next(iter(kept)), None)
    kept[key] = value


def _batched(
    queue: tuple[QueuedRequest | tuple[float, int], ...], max_batch_tokens: int | None
) -> tuple[tuple[QueuedRequest, ...], ...]:
    requests = sorted(
        (q if isinstance(q, QueuedRequest) else QueuedRequest(*q) for q in queue),
        key=lambda q: q.arrival_s,
    )
    if not requests:
        raise InvalidInputError("queue must hold at least one request, got none")
    batches: list[list[QueuedRequest]] = []
    for request in requests:
        last = batches[-1] if batches else None
        if (
            last is not None
            and max_batch_tokens is not None
            and sum(q.prompt_tokens for q in last) + request.prompt_tokens <= max_batch_tokens
        ):
            last.append(request)
        else:
            batches.append([request])
    return tuple(tuple(batch) for batch in batches)


INSTANCES_KEPT = 1024
"""Live-scaling instances kept (:func:`kept_instance`)."""

_INSTANCES: dict[object, tuple[object, ...]] = {}


def instance_key(
    model: ModelSpec,
    computes: tuple[ComputeModel, ComputeModel],
    unit_ready_s: Sequence[float],
    queue: Iterable[QueuedRequest | tuple[float, int]],
    scalars: tuple[object, ...],
) -> tuple[object, ...] | None:
    """What :func:`~blitzplan.live.instance.instance_from_queue`'s answer depends on, when it
    may be kept: roofline compute models (keyed on the objects, which the entry holds), float
    times (no int or bool that equals one), a list or tuple of QueuedRequest records (their
    arrival and prompt length: the ids do not matter) and an int or no ``max_batch_tokens``;
    else None."""
    if {*map(type, computes)} != {RooflineComputeModel}:  # no generator: one per pair
        return None
    if type(unit_ready_s) not in (tuple, list) or type(queue) not in (tuple, list):
        return None
    arrivals = tuple(unit_ready_s)
    *times, tokens = scalars
    if {*map(type, arrivals)} | ({*map(type, times)} - {NoneType}) != {float}:
        return None
    if (tokens is not None and type(tokens) is not int) or type(scalars[2]) is not float:
        return None
    requests = tuple(queue)
    if not {*map(type, requests)} <= {QueuedRequest}:
        return None
    shape = tuple(map(_SHAPE, cast(tuple[QueuedRequest, ...], requests)))
    return (id(model), *map(id, computes), arrivals, shape, *scalars)


_SHAPE = operator.attrgetter("arrival_s", "prompt_tokens")


_Times = tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...], tuple[float, ...]]


def batch_times(
    model: ModelSpec,
    compute: ComputeModel,
    old: ComputeModel,
    queue: Iterable[QueuedRequest | tuple[float, int]],
    max_batch_tokens: int | None,
    rate: float,
    latency: float,
) -> _Times:
    """Per batch of ``queue``: release, seconds per layer on N and on O, and hand-off. Kept
    when both compute models are rooflines (frozen: their answers depend on their fields
    only), keyed on the objects themselves (held by the entry, so never mistaken for others)."""
    batches = batched(queue, max_batch_tokens)
    if type(compute) is not RooflineComputeModel or type(old) is not RooflineComputeModel:
        return _times_of(model, compute, old, batches, rate, latency)
    key = (id(model), id(compute), id(old), id(batches), rate, latency)
    found = _TIMES.get(key)
    if found is None or found[:4] != (model, compute, old, batches):  # identity first
        found = (
            model,
            compute,
            old,
            batches,
            _times_of(model, compute, old, batches, rate, latency),
        )
        _keep(_TIMES, key, found)
    return cast(_Times, found[4])


def _times_of(
    model: ModelSpec,
    compute: ComputeModel,
    old: ComputeModel,
    batches: tuple[tuple[QueuedRequest, ...], ...],
    rate: float,
    latency: float,
) -> _Times:
    release, new, old_s, handoff = [], [], [], []
    for batch in batches:
        tokens = sum(q.prompt_tokens for q in batch)
        release.append(max(0.0, max(q.arrival_s for q in batch)))
        new.append(compute.prefill_layer_s(tokens, requests=len(batch)))
        old_s.append(old.prefill_layer_s(tokens, requests=len(batch)))
        handoff.append(latency + tokens * model.activation_bytes_per_token / rate)
    return tuple(release), tuple(new), tuple(old_s), tuple(handoff)


def kept_instance(
    key: tuple[object, ...] | None, model: ModelSpec, compute: ComputeModel, old: ComputeModel
) -> LiveScalingInstance | None:
    """The instance kept under ``key`` (:func:`instance_key`) for these very objects, if any."""
    if key is None:
        return None
    found = _INSTANCES.get(key)
    if found is None or found[:3] != (model, compute, old):  # identity first
        return None
    return cast("LiveScalingInstance", found[3])


def keep_instance(
    key: tuple[object, ...] | None,
    model: ModelSpec,
    compute: ComputeModel,
    old: ComputeModel,
    instance: LiveScalingInstance,
) -> None:
    """Keep ``instance`` under ``key`` (None: not kept), holding the objects the key names."""
    if key is not None:
        _keep(_INSTANCES, key, (model, compute, old, instance), INSTANCES_KEPT)
