"""What a transfer program must satisfy before the executor runs it; each check names the step.

* every field in range: known kinds and holders, ranks of the new instances' TP degree (or
  ``-1``, every rank, into host memory), byte ranges inside the unit's buffer, ``bytes`` their
  sum, positive paces, finite times, ``source_layout`` a TP degree the model splits into;
* every device known: a step's destination is a GPU of a new instance (at the step's rank), a
  spare GPU that relays, or host memory; a serving instance's GPU only sends and holds one
  buffer; a ``plan`` source receives in the plan or holds bytes before it;
* every dependency runnable: ``feeds`` are steps into the source, ``after`` steps of the same
  sending device (the executor runs one process per device and orders a device's own steps;
  across devices it refuses them);
* every byte a ``plan`` source sends is one it holds before the start or receives in a step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from fractions import Fraction
from typing import TYPE_CHECKING

from blitzplan.errors import InvalidInputError
from blitzplan.models.layout import layout

if TYPE_CHECKING:
    from blitzplan.executor.program.reader import Program, ProgramStep

Spans = dict[tuple[str, int], list[tuple[int, int]]]


ALL_RANKS = -1
"""A step's ``rank`` when it moves a stripe of every rank's buffer (host memory to memory)."""
STEP_KINDS = ("network", "host_to_device", "device_to_device", "allgather", "disk_to_host")
HOLDERS = ("instance", "memory", "disk", "plan")
"""What a step's source is: a serving instance's GPU, host memory, an SSD, or a device that
receives in this plan."""


def memory_devices(program: Program) -> set[str]:
    """Devices that hold every rank's buffer: sources of ``memory``/``disk`` steps, destinations
    of ``rank = -1`` steps, and relays (GPUs that receive for no new instance: they stage each
    rank's bytes at that rank's place, as host memory does)."""
    found = {s.source for s in program.steps if s.holder in ("memory", "disk")}
    found |= {s.destination for s in program.steps if s.instance is None}
    return found | {s.destination for s in program.steps if s.rank == ALL_RANKS}


def source_holds(program: Program) -> dict[str, tuple[int, int]]:
    """What each serving instance's GPU holds: ``(tp, rank)`` of its buffer (its own TP degree
    when ``source_layout`` is set, else the new instances' at the step's rank)."""
    holds: dict[str, tuple[int, int]] = {}
    for step in program.steps:
        if step.holder != "instance":
            continue
        has = step.source_layout or (program.tp, step.rank)
        if holds.setdefault(step.source, has) != has:
            raise InvalidInputError(
                f"step {step.id}: serving GPU {step.source!r} would hold the buffer of "
                f"(tp, rank) {has}, another step says {holds[step.source]}; a GPU holds one"
            )
    return holds


def check_program(program: Program) -> None:
    """Raise InvalidInputError for the first thing the executor cannot run (module docstring)."""
    if not program.steps:
        raise InvalidInputError("the document has no transfer steps: nothing to run")
    ids = [s.id for s in program.steps]
    duplicated = sorted({i for i in ids if ids.count(i) > 1})
    if duplicated:
        raise InvalidInputError(f"step ids must be unique, these repeat: {duplicated}")
    memory = memory_devices(program)
    for step in program.steps:
        _check_fields(program, step, memory)
    _check_devices(program, memory)
    source_holds(program)
    _check_dependencies(program)
    _check_bytes_at_sources(program, memory)


def _check_fields(program: Program, step: ProgramStep, memory: set[str]) -> None:
    where = f"step {step.id}"
    if step.kind not in STEP_KINDS:
        raise InvalidInputError(
            f"{where}: kind must be one of {', '.join(STEP_KINDS)}, got {step.kind!r}"
        )
    if step.holder == "loading":
        raise InvalidInputError(
            f"{where}: holder 'loading' sends from an instance an earlier plan is still loading; "
            "this executor runs one plan at a time (run the earlier plan first)"
        )
    if step.holder not in HOLDERS:
        raise InvalidInputError(
            f"{where}: holder must be one of {', '.join(HOLDERS)}, got {step.holder!r}"
        )
    if not (step.rank == ALL_RANKS or 0 <= step.rank < program.tp):
        raise InvalidInputError(
            f"{where}: rank must be -1 or in 0..{program.tp - 1}, got {step.rank!r}"
        )
    if step.rank == ALL_RANKS and step.source not in memory:
        raise InvalidInputError(
            f"{where}: rank -1 (every rank) needs a host-memory source, got {step.source!r}"
        )
    pace = step.pace_bytes_per_s
    if pace is not None and not (math.isfinite(pace) and pace > 0):
        raise InvalidInputError(f"{where}: pace_bytes_per_s must be > 0 or null, got {pace!r}")
    for name in ("not_before_s", "start_s", "end_s"):
        value = getattr(step, name)
        if not (math.isfinite(value) and value >= 0):
            raise InvalidInputError(f"{where}: {name} must be a finite time >= 0, got {value!r}")
    _check_ranges(program, step)
    if step.source_layout is not None:
        _check_source_layout(program, step)


def _check_ranges(program: Program, step: ProgramStep) -> None:
    where, total = f"step {step.id}", 0
    scale = program.tp if step.rank == ALL_RANKS else 1
    for r in step.ranges:
        if not 0 <= r.first_unit <= r.last_unit < len(program.unit_bytes):
            raise InvalidInputError(
                f"{where}: units {r.first_unit}..{r.last_unit} are not units of the model "
                f"(0..{len(program.unit_bytes) - 1})"
            )
        for unit in range(r.first_unit, r.last_unit + 1):
            size = program.unit_bytes[unit] * scale
            if r.offset < 0 or r.length <= 0 or r.offset + r.length > size:
                raise InvalidInputError(
                    f"{where}: bytes [{r.offset}, {r.offset + r.length}) of unit {unit} are not "
                    f"inside its {size}-byte buffer"
                )
        total += (r.last_unit - r.first_unit + 1) * r.length
    if total != step.bytes:
        raise InvalidInputError(
            f"{where}: its ranges hold {total} bytes, its 'bytes' says {step.bytes}"
        )


def _check_source_layout(program: Program, step: ProgramStep) -> None:
    where = f"step {step.id}"
    if step.holder != "instance":
        raise InvalidInputError(
            f"{where}: source_layout is set, but its source is a "
            f"{step.holder!r} holder, not a serving instance"
        )
    tp, rank = step.source_layout or (0, 0)
    try:
        program.spec.check_tp(tp)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: source_layout tp={tp!r} is invalid: {exc}") from None
    if not 0 <= rank < tp:
        raise InvalidInputError(f"{where}: source_layout rank {rank!r} is not in 0..{tp - 1}")
    if step.rank == ALL_RANKS:
        raise InvalidInputError(f"{where}: a resharding source sends one rank, not rank -1")
    target, source = layout(program.spec, program.tp), layout(program.spec, tp)
    for unit, offset, length in step.pieces():  # the serving rank holds every byte it sends
        size = program.unit_bytes[unit]
        lo, hi = Fraction(offset, size), Fraction(offset + length, size)
        try:
            target.reshard(unit, source, rank, step.rank, lo, hi)
        except InvalidInputError as exc:
            raise InvalidInputError(f"{where} (source_layout {(tp, rank)}): {exc}") from None


def _check_devices(program: Program, memory: set[str]) -> None:
    new = {inst.name: inst for inst in program.new_instances}
    receivers = {s.destination for s in program.steps}
    for step in program.steps:
        where = f"step {step.id}"
        if step.source == step.destination:
            raise InvalidInputError(f"{where}: source and destination are both {step.source!r}")
        if step.instance is not None:
            inst = new.get(step.instance)
            if inst is None:
                raise InvalidInputError(
                    f"{where}: instance {step.instance!r} is not a new "
                    f"instance of the document ({', '.join(new) or 'none'})"
                )
            if step.rank == ALL_RANKS or inst.gpus[step.rank] != step.destination:
                raise InvalidInputError(
                    f"{where}: destination {step.destination!r} is not "
                    f"rank {step.rank} of {inst.name} {list(inst.gpus)}"
                )
        if step.holder in ("instance", "memory", "disk") and step.source in receivers:
            raise InvalidInputError(
                f"{where}: source {step.source!r} is a {step.holder!r} "
                "holder but also receives in this plan (holder 'plan')"
            )
        if step.holder == "plan" and step.source not in receivers | set(program.held):
            raise InvalidInputError(
                f"{where}: source {step.source!r} is unknown: it neither "
                "receives in this plan nor holds bytes before it"
            )
        is_gpu = step.destination in program.gpu_rank
        if is_gpu and step.destination in memory:
            raise InvalidInputError(
                f"{where}: {step.destination!r} is a new GPU but also "
                "host memory (a rank -1 destination)"
            )


def _check_dependencies(program: Program) -> None:
    steps = program.step
    for step in program.steps:
        for feed in step.feeds:
            if feed not in steps or steps[feed].destination != step.source:
                raise InvalidInputError(
                    f"step {step.id}: feeds names step {feed}, which does not bring bytes to "
                    f"its source {step.source!r}"
                )
        for prior in step.after:
            if prior not in steps:
                raise InvalidInputError(
                    f"step {step.id}: after names step {prior}, which does not exist"
                )
            if steps[prior].source != step.source:
                raise InvalidInputError(
                    f"step {step.id}: after step {prior} is not supported: step {prior} is sent "
                    f"by {steps[prior].source!r} and step {step.id} by {step.source!r}; the "
                    "executor orders only steps of the same sending device"
                )
    _check_acyclic(program)


def _check_acyclic(program: Program) -> None:
    """A step that must wait, through ``after`` and store-and-forward ``feeds``, for itself
    never starts."""
    steps = program.step
    waits = {s.id: [*s.after, *(s.feeds if s.store_and_forward else ())] for s in program.steps}
    state: dict[int, int] = {}

    def visit(node: int, path: list[int]) -> None:
        state[node] = 1
        for nxt in waits[node]:
            if state.get(nxt) == 1:
                raise InvalidInputError(f"steps wait for each other in a cycle: {[*path, nxt]}")
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for sid in steps:
        if sid not in state:
            visit(sid, [sid])


def _check_bytes_at_sources(program: Program, memory: set[str]) -> None:
    """Every byte a ``plan`` source sends, it holds before the start or some step brings it."""
    has: Spans = defaultdict(list)
    for gpu, spans in program.held.items():
        for unit, lo, hi in spans:
            has[(gpu, unit)].append((lo, hi))
    for step in program.steps:
        into = step.destination in memory
        for unit, offset, length in step.pieces():
            start = rank_base(program, step.rank, unit, memory=into) + offset
            has[(step.destination, unit)].append((start, start + length))
    for step in program.steps:
        if step.holder != "plan":
            continue
        out_of = step.source in memory
        for unit, offset, length in step.pieces():
            start = rank_base(program, step.rank, unit, memory=out_of) + offset
            if not _covered(has[(step.source, unit)], start, start + length):
                raise InvalidInputError(
                    f"step {step.id} sends bytes [{start}, {start + length}) of unit {unit} "
                    f"from {step.source!r}, which neither holds them nor receives them"
                )


def rank_base(program: Program, rank: int, unit: int, *, memory: bool) -> int:
    """Where rank ``rank``'s buffer of ``unit`` starts inside a device's buffer: at
    ``rank * B_u`` in host memory (which holds every rank; rank -1 means all of it), else 0."""
    return rank * program.unit_bytes[unit] if memory and rank != ALL_RANKS else 0


def _covered(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    at = lo
    for a, b in sorted(spans):
        if a <= at < b:
            at = b
        if at >= hi:
            return True
    return at >= hi
