"""The rules every transfer program obeys (:mod:`blitzplan.scale.program`), checked from the
document alone: what ``ScalePlan.from_json``, the program export's reader and a data plane's
reader (the executor's) refuse before anything runs. Each error names the step and the value.

* **new instances**: unique names; each has one GPU per TP rank; no GPU in two of them;
* **held**: names new GPUs and units of the model, with stripe intervals ``0 <= lo <= hi <= 1``;
* **fields**: unique step ids; a known ``kind``, ``holder`` and ``link``; ``rank`` in
  ``0..tp-1`` or ``-1`` (every rank, between host-memory devices); byte ranges inside the
  unit's buffer (``length > 0``, ``offset >= 0``, ``offset + length`` at most the buffer), and
  ``bytes`` their sum; paces positive or null; finite times ``>= 0``; ``source_layout`` a TP
  degree the model splits into, of a serving-instance source, and a rank of it;
* **devices**: source and destination differ; a step into a new instance goes to that instance's
  GPU of its rank; a serving, loading, memory or disk source receives nothing in the plan; a
  ``plan`` source receives in the plan or held bytes before it; a new GPU is not also a
  host-memory device (relays, ``rank -1`` destinations and memory sources hold every rank);
* **dependencies**: ``feeds`` name steps into the source, ``after`` existing steps; no step
  waits for itself through ``after`` and store-and-forward ``feeds``;
* **bytes**: every byte a ``plan`` source sends, it held before the start or a step brings it;
* **live pairs** (:mod:`.pair_rules`): a known ``policy``; ``new`` a live new instance and
  ``old`` an instance that serves on (neither a new instance nor one the document releases or
  mutates), each in one pair; ``batches`` of request ids, each in one batch of one pair.

What a particular data plane cannot run (the executor refuses ``loading`` sources) is that data
plane's own check, made after these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from blitzplan.errors import InvalidInputError
from blitzplan.wire.pair_rules import LIVE_POLICIES, Named, Pair, check_live_pairs
from blitzplan.wire.program_bytes import check_bytes_at_sources
from blitzplan.wire.program_screen import (
    ALL_RANKS,
    HOLDERS,
    LINKS,
    MEMORY_FIELDS,
    STEP_KINDS,
    memory_of,
    screen,
    step_columns,
)

if TYPE_CHECKING:
    from blitzplan.models import ModelSpec

__all__ = ["ALL_RANKS", "HOLDERS", "LINKS", "LIVE_POLICIES", "STEP_KINDS", "check_program_rules"]

Span = tuple[int, int, int, int]
"""``(first_unit, last_unit, offset, length)``."""


class _Instance(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def gpus(self) -> Sequence[str]: ...
    @property
    def live(self) -> bool: ...


def _spans(ranges: Sequence[Any]) -> tuple[Span, ...]:
    """Byte ranges as a tuple of 4-tuples (from ByteRange-like records or 4-item sequences)."""
    if not ranges:
        return ()
    if type(ranges) is tuple and type(ranges[0]) is tuple and len(ranges[0]) == 4:
        return ranges  # already spans (the program export's)
    if isinstance(ranges[0], tuple | list):
        return tuple((r[0], r[1], r[2], r[3]) for r in ranges)
    return tuple((r.first_unit, r.last_unit, r.offset, r.length) for r in ranges)


def check_program_rules(
    steps: Sequence[Any],
    *,
    tp: int,
    unit_bytes: Sequence[int],
    new_instances: Sequence[_Instance],
    held: Mapping[str, Mapping[int, Sequence[tuple[float, float]]]],
    live_pairs: Sequence[Pair],
    leaving: Sequence[Named],
    spec: ModelSpec | None = None,
) -> None:
    """Raise InvalidInputError for the first rule ``steps`` break (module docstring).

    ``steps`` are step records with the fields of
    :class:`~blitzplan.scale.transfer_steps.TransferStep` (``link``, ``stripe``,
    ``chunk_bytes`` and ``rate_bytes_per_s`` are checked when present;
    ``ranges`` hold ByteRange-like records or ``(first_unit, last_unit, offset, length)``);
    ``unit_bytes`` each unit's per-rank buffer at ``tp``; ``held`` the document's ``held``;
    ``live_pairs`` its live pairs and ``leaving`` its releases and mutations (records naming an
    ``instance``); ``spec`` the model (to check ``source_layout`` TP degrees; skipped when None)."""
    gpu_rank = _check_instances(new_instances, tp)
    _check_held(held, gpu_rank, len(unit_bytes))
    check_live_pairs(live_pairs, new_instances, {x.instance for x in leaving})
    cols = step_columns(steps)
    ids = cols["id"]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise InvalidInputError(f"step ids must be unique, these repeat: {repeated}")
    spans = tuple(map(_spans, cols["ranges"]))
    memory = memory_of(cols)
    instances = {i.name: i for i in new_instances}
    try:
        passed = screen(cols, spans, tp, unit_bytes, instances, held, memory)
    except (TypeError, ValueError, IndexError, OverflowError):  # the itemised checks name it
        passed = False
    if not passed:
        for step, step_spans in zip(steps, spans, strict=True):
            _check_fields(step, tp)
            _check_ranges(step, step_spans, tp, unit_bytes)
        _check_devices(steps, instances, set(gpu_rank), held, memory)
        _check_links(steps)
    if set(cols["source_layout"]) - {None}:
        for step in steps:
            if step.source_layout is not None:
                _check_source_layout(step, spec)
    _check_acyclic(steps)
    check_bytes_at_sources(steps, cols, spans, unit_bytes, held, memory)


def _check_instances(instances: Sequence[_Instance], tp: int) -> dict[str, int]:
    gpu_rank: dict[str, int] = {}
    names: set[str] = set()
    for inst in instances:
        if inst.name in names:
            raise InvalidInputError(f"new instance name {inst.name!r} repeats")
        names.add(inst.name)
        if len(inst.gpus) != tp:
            raise InvalidInputError(
                f"new instance {inst.name!r} has {len(inst.gpus)} GPUs {list(inst.gpus)}, "
                f"not one per TP rank (tp={tp})"
            )
        for rank, gpu in enumerate(inst.gpus):
            if gpu in gpu_rank:
                raise InvalidInputError(f"GPU {gpu!r} belongs to two new instances")
            gpu_rank[gpu] = rank
    return gpu_rank


def _check_held(
    held: Mapping[str, Mapping[int, Sequence[tuple[float, float]]]],
    gpu_rank: Mapping[str, int],
    units: int,
) -> None:
    for gpu, per_unit in held.items():
        if gpu not in gpu_rank:
            raise InvalidInputError(f"held names {gpu!r}, which is no new instance's GPU")
        for unit, intervals in per_unit.items():
            if not 0 <= unit < units:
                raise InvalidInputError(
                    f"held[{gpu!r}] names unit {unit}; the model has units 0..{units - 1}"
                )
            for lo, hi in intervals:
                if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo <= hi <= 1):
                    raise InvalidInputError(
                        f"held[{gpu!r}][{unit}] has the interval {[lo, hi]}, not 0 <= lo <= hi <= 1"
                    )


def _time(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def _check_fields(step: Any, tp: int) -> None:
    where = f"step {step.id}"
    for name, allowed in (("kind", STEP_KINDS), ("holder", HOLDERS), ("link", LINKS)):
        value = getattr(step, name, allowed[0])
        if value not in allowed:
            raise InvalidInputError(
                f"{where}: {name} must be one of {', '.join(allowed)}, got {value!r}"
            )
    if not (step.rank == ALL_RANKS or 0 <= step.rank < tp):
        raise InvalidInputError(f"{where}: rank must be -1 or in 0..{tp - 1}, got {step.rank!r}")
    pace = step.pace_bytes_per_s
    if pace is not None and not (math.isfinite(pace) and pace > 0):
        raise InvalidInputError(f"{where}: pace_bytes_per_s must be > 0 or null, got {pace!r}")
    for name in ("not_before_s", "start_s", "end_s", "rate_bytes_per_s"):
        value = getattr(step, name, 0.0)
        if not _time(value):
            raise InvalidInputError(f"{where}: {name} must be finite and >= 0, got {value!r}")
    if getattr(step, "chunk_bytes", 1) < 1:
        raise InvalidInputError(f"{where}: chunk_bytes must be >= 1, got {step.chunk_bytes!r}")
    lo, hi = getattr(step, "stripe", (0.0, 1.0))
    if not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi <= 1):
        raise InvalidInputError(f"{where}: stripe {[lo, hi]} is not 0 <= lo < hi <= 1")


def _check_ranges(step: Any, spans: Sequence[Span], tp: int, unit_bytes: Sequence[int]) -> None:
    where, total = f"step {step.id}", 0
    scale = tp if step.rank == ALL_RANKS else 1
    for first, last, offset, length in spans:
        if not 0 <= first <= last < len(unit_bytes):
            raise InvalidInputError(
                f"{where}: units {first}..{last} are not units of the model "
                f"(0..{len(unit_bytes) - 1})"
            )
        smallest = min(unit_bytes[first : last + 1]) * scale
        if offset < 0 or length <= 0 or offset + length > smallest:
            raise InvalidInputError(
                f"{where}: bytes [{offset}, {offset + length}) of units {first}..{last} are not "
                f"inside their buffers (the smallest has {smallest} bytes; length must be > 0)"
            )
        total += (last - first + 1) * length
    if total != step.bytes:
        raise InvalidInputError(
            f"{where}: its ranges hold {total} bytes, 'bytes' says {step.bytes}"
        )


def _check_source_layout(step: Any, spec: ModelSpec | None) -> None:
    where = f"step {step.id}"
    if step.holder not in ("instance", "loading"):
        raise InvalidInputError(
            f"{where}: source_layout is set, but its source is a {step.holder!r} holder, not a "
            "serving instance"
        )
    tp, rank = step.source_layout
    if spec is not None:
        try:
            spec.check_tp(tp)
        except InvalidInputError as exc:
            raise InvalidInputError(f"{where}: source_layout tp={tp!r}: {exc}") from None
    if not 0 <= rank < tp:
        raise InvalidInputError(f"{where}: source_layout rank {rank!r} is not in 0..{tp - 1}")
    if step.rank == ALL_RANKS:
        raise InvalidInputError(f"{where}: a resharding source sends one rank, not rank -1")


def memory_devices(steps: Sequence[Any]) -> set[str]:
    """Devices that hold every rank's buffer: memory and disk sources, relays (destinations of
    no new instance) and destinations of ``rank -1`` steps."""
    return memory_of(step_columns(steps, MEMORY_FIELDS))


def _check_devices(
    steps: Sequence[Any],
    instances: Mapping[str, _Instance],
    new_gpus: set[str],
    held: Mapping[str, Any],
    memory: set[str],
) -> None:
    receivers = {s.destination for s in steps}
    for step in steps:
        where = f"step {step.id}"
        if step.source == step.destination:
            raise InvalidInputError(f"{where}: source and destination are both {step.source!r}")
        if step.rank == ALL_RANKS and step.source not in memory:
            raise InvalidInputError(
                f"{where}: rank -1 (every rank) needs a host-memory source, got {step.source!r}"
            )
        if step.instance is not None:
            inst = instances.get(step.instance)
            if inst is None:
                raise InvalidInputError(
                    f"{where}: instance {step.instance!r} is not a new instance of the document "
                    f"({', '.join(instances) or 'none'})"
                )
            if step.rank == ALL_RANKS or inst.gpus[step.rank] != step.destination:
                raise InvalidInputError(
                    f"{where}: destination {step.destination!r} is not rank {step.rank} of "
                    f"{inst.name} {list(inst.gpus)}"
                )
        if step.holder != "plan" and step.source in receivers:
            raise InvalidInputError(
                f"{where}: source {step.source!r} is a {step.holder!r} holder but also receives "
                "in this plan (its holder is 'plan')"
            )
        if step.holder == "plan" and step.source not in receivers and step.source not in held:
            raise InvalidInputError(
                f"{where}: source {step.source!r} is unknown: it neither receives in this plan "
                "nor holds bytes before it"
            )
        if step.destination in new_gpus and step.destination in memory:
            raise InvalidInputError(
                f"{where}: {step.destination!r} is a new GPU but also a host-memory device (a "
                "rank -1 destination or a relay)"
            )


def _check_links(steps: Sequence[Any]) -> None:
    """``feeds`` name steps into the source; ``after`` names other steps."""
    by_id = {s.id: s for s in steps}
    for step in steps:
        for feed in step.feeds:
            if feed not in by_id or by_id[feed].destination != step.source:
                raise InvalidInputError(
                    f"step {step.id}: feeds names step {feed}, which does not bring bytes to its "
                    f"source {step.source!r}"
                )
        for prior in step.after:
            if prior not in by_id or prior == step.id:
                raise InvalidInputError(
                    f"step {step.id}: after names step {prior}, which is not another step"
                )


def waits(step: Any) -> tuple[int, ...]:
    """The steps ``step`` waits for to end before it starts: its ``after`` and, store and
    forward, its ``feeds`` (the one definition the rules and a data plane share)."""
    return (*step.after, *(step.feeds if step.store_and_forward else ()))


def _check_acyclic(steps: Sequence[Any]) -> None:
    """No step waits for itself through ``after`` and store-and-forward ``feeds``."""
    waiting = {s.id: waits(s) for s in steps if s.after or s.store_and_forward}
    state: dict[int, int] = {}  # 1: on the path being walked, 2: done
    for root in waiting:
        if root in state:
            continue
        path, stack = [root], [iter(waiting[root])]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                raise InvalidInputError(f"steps wait for each other in a cycle: {[*path, nxt]}")
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(waiting.get(nxt, ())))
