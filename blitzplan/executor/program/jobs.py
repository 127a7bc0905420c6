"""A run's programs: what each device holds, and the stages of a program and its replan.

**A replan taking over** (``replan`` with ``at_s``), the data plane's contract for failures: the
running program's steps stop where the replan's ``held`` says they were. A step into a GPU the
replan still loads delivers exactly the bytes ``held`` claims there (finishing them when the run
is behind) and nothing more; a step into an instance complete by ``at_s`` delivers everything; a
step into anything else (a relay, a lost GPU) only what a continuing step forwards from there.
Those bytes stay; the replan's steps start at ``at_s`` and send a byte once it is at their
source. A run that would leave a checked GPU without a byte is refused before any process starts
(:mod:`.devices`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from blitzplan.errors import InvalidInputError
from blitzplan.wire.program_bytes import held_bytes, rank_base, union
from blitzplan.wire.program_rules import memory_devices
from blitzplan.wire.scaleprogram import ScaleProgram, StepRecord

Piece = tuple[int, int, int]
"""``(unit, offset, length)``: bytes of the unit's rank buffer a step moves."""
Spans = defaultdict[tuple[str, int], list[tuple[int, int]]]
"""Per (device, unit) byte ranges of its buffer."""
Buffer = tuple[int, int] | None
"""The ``(tp, rank)`` of the rank buffer a device holds of each unit; None: every rank's buffer
of the program's layout, back to back (rank ``r`` at ``r * B_u``)."""


def pieces(step: StepRecord) -> list[Piece]:
    """A step's bytes in sending order: unit by unit, then by offset."""
    return sorted((u, off, n) for a, b, off, n in step.ranges for u in range(a, b + 1))


def gpu_ranks(program: ScaleProgram) -> dict[str, int]:
    return {g: r for inst in program.new_instances for r, g in enumerate(inst.gpus)}


def complete_gpus(program: ScaleProgram, at_s: float) -> list[str]:
    """The GPUs of ``program``'s new instances that are complete by ``at_s``."""
    return [g for i in program.new_instances if max(i.layer_ready_s) <= at_s for g in i.gpus]


def devices_of(programs: Iterable[ScaleProgram]) -> list[str]:
    """Every device of the programs, in rank order: holders first (weights before the start),
    then every other source and destination in step order, then new GPUs no step names."""
    found: list[str] = []
    for program in programs:
        found += [s.source for s in program.steps if s.holder in ("instance", "memory", "disk")]
        found += [d for s in program.steps for d in (s.source, s.destination)]
        found += [g for inst in program.new_instances for g in inst.gpus]
    return list(dict.fromkeys(found))


def buffers(program: ScaleProgram) -> dict[str, tuple[Buffer, bool]]:
    """Per device of ``program``, in rank order: its buffer, and whether all of it is there
    before the start. A serving GPU holds one buffer (its ``source_layout``, else the step's
    rank's); a new GPU its rank's; host memory, disks and relays every rank's."""
    memory, ranks = memory_devices(program.steps), gpu_ranks(program)
    serving: dict[str, tuple[int, int]] = {}
    for step in program.steps:
        has = step.source_layout or (program.tp, step.rank)
        if step.holder == "instance" and serving.setdefault(step.source, has) != has:
            raise InvalidInputError(
                f"step {step.id}: serving GPU {step.source!r} would hold the buffer of "
                f"(tp, rank) {has}, another step says {serving[step.source]}; a GPU holds one"
            )
    filled = {s.source for s in program.steps if s.holder in ("memory", "disk")}
    found: dict[str, tuple[Buffer, bool]] = {}
    for device in devices_of([program]):
        if device in serving:
            found[device] = (serving[device], True)
        elif device in memory:
            found[device] = (None, device in filled)
        else:
            found[device] = ((program.tp, ranks[device]), False)
    return found


def _named(buffer: Buffer) -> str:
    return "every rank's buffer" if buffer is None else f"the buffer of (tp, rank) {buffer}"


def check_runnable(program: ScaleProgram) -> None:
    """What this executor refuses beyond the program rules: a program without steps, a source an
    earlier plan is still loading, a serving GPU asked for two buffers (:func:`buffers`)."""
    if not program.steps:
        raise InvalidInputError("the document has no transfer steps: nothing to run")
    for step in program.steps:
        if step.holder == "loading":
            raise InvalidInputError(
                f"step {step.id}: holder 'loading' sends from an instance an earlier plan is "
                "still loading; this executor runs one plan at a time (run the earlier one first)"
            )
    buffers(program)


@dataclass(frozen=True)
class Stage:
    """One program of a run: its steps (keys ``offset + id``), starting ``at_s`` into the run,
    and which bytes of each step it sends (None: all)."""

    program: ScaleProgram
    at_s: float = 0.0
    offset: int = 0
    kept: Mapping[int, tuple[Piece, ...]] | None = None

    def pieces(self, step: StepRecord) -> tuple[Piece, ...]:
        return tuple(pieces(step)) if self.kept is None else self.kept.get(step.id, ())


def stages(program: ScaleProgram, replan: ScaleProgram | None, at_s: float) -> list[Stage]:
    """The run's programs: ``program`` alone, or cut where ``replan`` takes over (module
    docstring), then ``replan`` from ``at_s``."""
    if replan is None:
        return [Stage(program)]
    if replan.model != program.model or replan.tp != program.tp:
        raise InvalidInputError("the replan is of another model or TP degree than the program")
    was = buffers(program)
    for name, (buffer, _) in buffers(replan).items():
        if name in was and was[name][0] != buffer:
            raise InvalidInputError(
                f"the replan loads {name!r} as {_named(buffer)}, the running program as "
                f"{_named(was[name][0])}; a device keeps its buffer"
            )
    offset = max(s.id for s in program.steps) + 1
    return [Stage(program, kept=_kept(program, replan, at_s)), Stage(replan, at_s, offset)]


def _kept(old: ScaleProgram, new: ScaleProgram, at_s: float) -> dict[int, tuple[Piece, ...]]:
    """Per old step, the bytes it still delivers (module docstring)."""
    memory = memory_devices(old.steps)
    need: Spans = defaultdict(list)
    for gpu, units in held_bytes(new.held, new.unit_bytes).items():
        for unit, spans in units.items():
            need[(gpu, unit)] += spans
    for gpu in complete_gpus(old, at_s):
        for unit, size in enumerate(old.unit_bytes):
            need[(gpu, unit)].append((0, size))
    kept: dict[int, tuple[Piece, ...]] = {}
    changed = True
    while changed:  # grows only: at most one round per step of a forwarding chain
        changed = False
        for step in old.steps:
            now = tuple(_within(old, step, need, memory))
            if now != kept.get(step.id, ()):
                kept[step.id], changed = now, True
                if step.holder == "plan":
                    relay = step.source in memory
                    for unit, off, n in now:
                        lo = rank_base(old.unit_bytes, step.rank, unit, memory=relay) + off
                        need[(step.source, unit)].append((lo, lo + n))
    return kept


def _within(old: ScaleProgram, step: StepRecord, need: Spans, memory: set[str]) -> Iterable[Piece]:
    """The parts of ``step``'s pieces whose destination bytes are in ``need``."""
    for unit, off, n in pieces(step):
        base = rank_base(old.unit_bytes, step.rank, unit, memory=step.destination in memory)
        for lo, hi in union(need.get((step.destination, unit), [])):
            a, b = max(lo, base + off), min(hi, base + off + n)
            if a < b:
                yield unit, a - base, b - a
