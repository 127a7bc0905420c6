"""The live-scaling partition problem's data (DESIGN.md section 4), validated on construction.

One new instance N whose layers arrive over time and one old instance O with the full model share
``n`` queued batches. Layers are numbered ``1..L`` (as in DESIGN.md), batches ``0..n-1`` (Python
indices). :class:`Fleet` describes several new and several old instances sharing one relay queue,
for the online policies; the exact models stay one new plus one old.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from blitzplan._checks import (
    MAX_BYTES,
    MAX_BYTES_PER_S,
    MAX_SECONDS,
    MIN_BYTES_PER_S,
    check_bounded,
    is_number,
)
from blitzplan.cluster import QueuedRequest
from blitzplan.compute import ComputeModel
from blitzplan.errors import InvalidInputError
from blitzplan.live.queue_cache import (
    batch_times,
    batched,
    instance_key,
    keep_instance,
    kept_instance,
)
from blitzplan.models import ModelSpec

__all__ = [
    "Fleet",
    "LiveScalingInstance",
    "instance_from_queue",
    "queue_batches",
    "unit_ready_from_link",
]

PerBatch = float | Sequence[float]
"""A per-batch quantity: one number for every batch, or one per batch."""


def _time(name: str, value: object, *, positive: bool = False) -> float:
    """A finite time in seconds, >= 0 (or > 0 when ``positive``), at most MAX_SECONDS."""
    if type(value) is not float and not is_number(value):  # float: the common case, fast
        raise InvalidInputError(f"{name} must be a number of seconds, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        bound = "> 0" if positive else ">= 0"
        raise InvalidInputError(f"{name} must be finite and {bound}, got {value!r}")
    if number > MAX_SECONDS:
        raise InvalidInputError(f"{name} must be at most {MAX_SECONDS:g} s, got {value!r}")
    return number


def _rate(name: str, value: object) -> float:
    """A link rate in bytes per second (see blitzplan._checks for the bounds)."""
    return check_bounded(name, value, MIN_BYTES_PER_S, MAX_BYTES_PER_S, "bytes/s")


def _times(name: str, values: object, *, positive: bool = False) -> tuple[float, ...]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | Iterable):
        raise InvalidInputError(f"{name} must be a sequence of seconds, got {values!r}")
    out = tuple(values)
    fine = all(type(v) is float and 0 <= v <= MAX_SECONDS for v in out)  # floats: the fast path
    if not fine or (positive and 0 in out):  # else find the culprit
        out = tuple(_time(f"{name}[{i}]", v, positive=positive) for i, v in enumerate(out))
    if not out:
        raise InvalidInputError(f"{name} must not be empty, got {values!r}")
    return out


def _per_batch(name: str, values: object, n: int, *, positive: bool) -> tuple[float, ...]:
    if isinstance(values, bool):
        raise InvalidInputError(
            f"{name} must be seconds (one number or one per batch), got {values!r}"
        )
    if not isinstance(values, list | tuple) and is_number(values):
        return (_time(name, values, positive=positive),) * n
    out = _times(name, values, positive=positive)
    if len(out) != n:
        raise InvalidInputError(
            f"{name} must have one entry per batch ({n}, as release_s), got {len(out)}"
        )
    return out


def _non_decreasing(name: str, values: tuple[float, ...]) -> None:
    for i in range(1, len(values)):
        if values[i] < values[i - 1]:
            raise InvalidInputError(
                f"{name} must be non-decreasing, got {name}[{i - 1}]={values[i - 1]!r} > "
                f"{name}[{i}]={values[i]!r}"
            )


@dataclass(frozen=True, init=False)
class LiveScalingInstance:
    """Layers arriving on a new instance, batches queued, and the old instance's availability.

    ``layer_ready_s[l - 1]`` is when layer ``l`` is usable on N (non-decreasing). Per batch ``i``:
    ``release_s`` (``r_i``), ``new_layer_s`` and ``old_layer_s`` (seconds per layer on N and on
    O), ``handoff_s`` (activation transfer N -> O), optional ``slo_s`` (latency target). O is busy
    until ``old_free_at_s``. ``embed_ready_s <= layer_ready_s[0]`` and ``head_ready_s >=
    layer_ready_s[-1]`` default to those bounds; a batch can run its last layer on N (and finish
    there) only once the head has arrived, so layer ``L`` is usable on N from ``head_ready_s``.
    Per-batch arguments accept one number for all batches.
    """

    layer_ready_s: tuple[float, ...]
    release_s: tuple[float, ...]
    new_layer_s: tuple[float, ...]
    old_layer_s: tuple[float, ...]
    handoff_s: tuple[float, ...]
    old_free_at_s: float
    embed_ready_s: float
    head_ready_s: float
    slo_s: tuple[float, ...] | None

    def __init__(
        self,
        layer_ready_s: Sequence[float],
        release_s: Sequence[float],
        new_layer_s: PerBatch,
        old_layer_s: PerBatch,
        handoff_s: PerBatch,
        *,
        old_free_at_s: float = 0.0,
        embed_ready_s: float | None = None,
        head_ready_s: float | None = None,
        slo_s: PerBatch | None = None,
    ) -> None:
        layers = _times("layer_ready_s", layer_ready_s)
        _non_decreasing("layer_ready_s", layers)
        release = _times("release_s", release_s)
        n = len(release)
        embed = layers[0] if embed_ready_s is None else _time("embed_ready_s", embed_ready_s)
        head = layers[-1] if head_ready_s is None else _time("head_ready_s", head_ready_s)
        if embed > layers[0]:
            raise InvalidInputError(
                f"embed_ready_s must be <= layer_ready_s[0]={layers[0]!r}, got {embed!r}"
            )
        if head < layers[-1]:
            raise InvalidInputError(
                f"head_ready_s must be >= layer_ready_s[-1]={layers[-1]!r}, got {head!r}"
            )
        set_ = object.__setattr__
        set_(self, "layer_ready_s", layers)
        set_(self, "release_s", release)
        set_(self, "new_layer_s", _per_batch("new_layer_s", new_layer_s, n, positive=True))
        set_(self, "old_layer_s", _per_batch("old_layer_s", old_layer_s, n, positive=True))
        set_(self, "handoff_s", _per_batch("handoff_s", handoff_s, n, positive=False))
        set_(self, "old_free_at_s", _time("old_free_at_s", old_free_at_s))
        set_(self, "embed_ready_s", embed)
        set_(self, "head_ready_s", head)
        set_(self, "slo_s", None if slo_s is None else _per_batch("slo_s", slo_s, n, positive=True))

    @property
    def num_layers(self) -> int:
        """``L``."""
        return len(self.layer_ready_s)

    @property
    def num_batches(self) -> int:
        """``n``."""
        return len(self.release_s)

    @cached_property
    def usable_s(self) -> tuple[float, ...]:
        """When N may start layer ``l`` (index ``l - 1``); the last layer waits for the head."""
        return (*self.layer_ready_s[:-1], self.head_ready_s)

    @cached_property
    def fifo_order(self) -> tuple[int, ...]:
        """Batches by release time, ties by index: the order ``old_order="fifo"`` imposes on O."""
        return tuple(sorted(range(self.num_batches), key=lambda i: (self.release_s[i], i)))

    def fleet(self) -> Fleet:
        """The one new and one old instance of this problem, as a :class:`Fleet`."""
        return Fleet(
            new_layer_ready_s=(self.layer_ready_s,),
            new_head_ready_s=(self.head_ready_s,),
            old_free_at_s=(self.old_free_at_s,),
        )


@dataclass(frozen=True, init=False)
class Fleet:
    """Several new instances (each with its own layer arrivals) and several old ones.

    They share one relay queue of the batches of a :class:`LiveScalingInstance`; per-batch compute
    and hand-off times are the instance's. Used by the online policies only.
    """

    new_layer_ready_s: tuple[tuple[float, ...], ...]
    new_head_ready_s: tuple[float, ...]
    old_free_at_s: tuple[float, ...]

    def __init__(
        self,
        *,
        new_layer_ready_s: Sequence[Sequence[float]],
        old_free_at_s: Sequence[float],
        new_head_ready_s: Sequence[float] | None = None,
    ) -> None:
        ready = tuple(_times(f"new_layer_ready_s[{w}]", a) for w, a in enumerate(new_layer_ready_s))
        if not ready:
            raise InvalidInputError("new_layer_ready_s must list at least one new instance, got []")
        for w, a in enumerate(ready):
            _non_decreasing(f"new_layer_ready_s[{w}]", a)
            if len(a) != len(ready[0]):
                raise InvalidInputError(
                    f"new_layer_ready_s[{w}] has {len(a)} layers, new_layer_ready_s[0] has "
                    f"{len(ready[0])}"
                )
        heads = (
            tuple(a[-1] for a in ready)
            if new_head_ready_s is None
            else _times("new_head_ready_s", new_head_ready_s)
        )
        if len(heads) != len(ready) or any(h < a[-1] for h, a in zip(heads, ready, strict=False)):
            raise InvalidInputError(
                f"new_head_ready_s must give one time per new instance, each >= its last layer, "
                f"got {new_head_ready_s!r}"
            )
        object.__setattr__(self, "new_layer_ready_s", ready)
        object.__setattr__(self, "new_head_ready_s", heads)
        object.__setattr__(self, "old_free_at_s", _times("old_free_at_s", old_free_at_s))

    @property
    def num_new(self) -> int:
        return len(self.new_layer_ready_s)

    @property
    def num_old(self) -> int:
        return len(self.old_free_at_s)

    def usable_s(self, worker: int) -> tuple[float, ...]:
        """When new instance ``worker`` may start each layer (the last needs the head)."""
        ready = self.new_layer_ready_s[worker]
        return (*ready[:-1], self.new_head_ready_s[worker])

    def check_matches(self, instance: LiveScalingInstance) -> None:
        """Raise unless every new instance has the problem's number of layers."""
        if len(self.new_layer_ready_s[0]) != instance.num_layers:
            raise InvalidInputError(
                f"fleet has {len(self.new_layer_ready_s[0])} layers per new instance, the "
                f"instance has {instance.num_layers}"
            )


def unit_ready_from_link(
    unit_bytes: Sequence[int],
    *,
    bytes_per_s: float,
    start_s: float = 0.0,
    latency_s: float = 0.0,
) -> tuple[float, ...]:
    """When each unit (embedding, layers, head) is complete after one link sends them in order.

    The simplest timeline: one hop at a constant rate. The multicast planner's timelines take
    chains, sharding and fair sharing into account; both give one time per unit.
    """
    rate = _rate("bytes_per_s", bytes_per_s)
    clock = _time("start_s", start_s) + _time("latency_s", latency_s)
    ready = []
    for i, size in enumerate(unit_bytes):
        if not is_number(size) or not 0 <= size <= MAX_BYTES:
            raise InvalidInputError(
                f"unit_bytes[{i}] must be a size in [0, {MAX_BYTES:g}] bytes, got {size!r}"
            )
        clock += size / rate
        ready.append(clock)
    if len(ready) < 3:
        raise InvalidInputError(
            "unit_bytes must hold the embedding, at least one layer and the head, "
            f"got {unit_bytes!r}"
        )
    return tuple(ready)


def queue_batches(
    queue: Iterable[QueuedRequest | tuple[float, int]], max_batch_tokens: int | None
) -> list[list[QueuedRequest]]:
    """The batches :func:`instance_from_queue` makes of ``queue``: by arrival, one request per
    batch, or consecutive requests up to ``max_batch_tokens`` prompt tokens together."""
    return [list(batch) for batch in batched(queue, max_batch_tokens)]


def instance_from_queue(
    model: ModelSpec,
    compute: ComputeModel,
    unit_ready_s: Sequence[float],
    queue: Iterable[QueuedRequest | tuple[float, int]],
    *,
    handoff_bytes_per_s: float,
    handoff_latency_s: float = 0.0,
    old_compute: ComputeModel | None = None,
    old_free_at_s: float = 0.0,
    slo_s: float | None = None,
    max_batch_tokens: int | None = None,
) -> LiveScalingInstance:
    """A LiveScalingInstance for prefilling a queue of (arrival_s, prompt_tokens) requests.

    ``unit_ready_s`` is the new instance's timeline from the multicast plan: when the embedding,
    each layer and the head are complete on it (``model.num_layers + 2`` times; for a
    tensor-parallel instance, the latest over its GPUs). One batch per request, or consecutive
    requests grouped up to ``max_batch_tokens`` prompt tokens; a batch is released when its last
    request arrives. Layer times come from ``compute`` (N) and ``old_compute`` (O, default the
    same); the hand-off moves the batch's hidden states at ``handoff_bytes_per_s``. The lm_head's
    prefill work (one token per request) is small and folded into the last layer. Times are
    relative to now (0): a request that arrived earlier is released at 0 (the wait it already
    had is a constant no schedule changes).

    Equal problems share one instance: with roofline compute models (frozen), float times and
    a list or tuple of QueuedRequest records, the instance is kept per model, compute models,
    arrivals, requests' arrivals and prompt lengths and hand-off (a fleet of equal pairs builds
    it once; :mod:`.queue_cache`).
    """
    old = compute if old_compute is None else old_compute
    key = instance_key(
        model,
        (compute, old),
        unit_ready_s,
        queue,
        (handoff_bytes_per_s, handoff_latency_s, old_free_at_s, slo_s, max_batch_tokens),
    )
    found = kept_instance(key, model, compute, old)
    if found is not None:
        return found
    arrived = _times("unit_ready_s", unit_ready_s)
    if len(arrived) != model.num_units:
        raise InvalidInputError(
            f"unit_ready_s must give {model.num_units} times for {model.name} (embedding, "
            f"{model.num_layers} layers, head), got {len(arrived)}"
        )
    # a layer is usable once it and every unit before it are there (layers run in order)
    units = list(itertools.accumulate(arrived, max))
    rate = _rate("handoff_bytes_per_s", handoff_bytes_per_s)
    latency = _time("handoff_latency_s", handoff_latency_s)
    release, new, old_s, handoff = batch_times(
        model, compute, old, queue, max_batch_tokens, rate, latency
    )
    instance = LiveScalingInstance(
        units[1:-1],
        release,
        new,
        old_s,
        handoff,
        old_free_at_s=old_free_at_s,
        embed_ready_s=units[0],
        head_ready_s=units[-1],
        slo_s=slo_s,
    )
    keep_instance(key, model, compute, old, instance)
    return instance
