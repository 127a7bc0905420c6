"""From a checked program (and a replan taking it over) to one job per device.

A device is a process: every GPU and host memory a step names, and every new GPU. Its buffers sit
back to back in one *arena*: per unit a GPU's rank buffer (``B_u`` bytes of
:func:`blitzplan.layout`; a serving GPU's of its own TP degree), host memory and relays every
rank's buffer (rank ``r`` at ``r * B_u``), then the bytes resharding steps pack.

**A replan taking over** (``replan`` with ``at_s``), the data plane's contract for failures: the
running program's steps stop where the replan's ``held`` says they were. A step into a GPU the
replan still loads delivers exactly the bytes ``held`` claims there (finishing them when the run
is behind its prediction) and nothing more; a step into an instance the plan had complete by
``at_s`` delivers everything; a step into anything else (a relay, a lost GPU) only what a
continuing step forwards from there. Those bytes stay; the replan's steps start at ``at_s``
(their times count from it) and send a byte once it is at their source. A replan whose ``held``
claims a byte the running program never delivers is refused before any process starts, naming
the GPU, the unit and the bytes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from blitzplan.errors import InvalidInputError
from blitzplan.executor.program.rules import memory_devices, rank_base, source_holds
from blitzplan.models.layout import layout

if TYPE_CHECKING:
    from blitzplan.executor.program.reader import Program, ProgramStep
    from blitzplan.executor.smallmodel.checkpoint import Checkpoint

Piece = tuple[int, int, int, int]
"""``(unit, source offset, destination offset, length)``: bytes of the unit's buffers."""
Spans = dict[tuple[str, int], list[tuple[int, int]]]


@dataclass(frozen=True)
class Stage:
    """One program of a run: its steps (keys ``offset + id``), starting ``at_s`` into the run,
    and which bytes of each step it sends (None: all)."""

    program: Program
    at_s: float = 0.0
    offset: int = 0
    kept: dict[int, tuple[Piece, ...]] | None = None

    def pieces(self, step: ProgramStep) -> tuple[Piece, ...]:
        if self.kept is not None:
            return self.kept.get(step.id, ())
        return tuple((u, off, off, n) for u, off, n in step.pieces())


@dataclass(frozen=True)
class SendPlan:
    """A step as its sender runs it. ``reshard = (source_tp, source_rank, rank)``: the sender
    holds another TP degree's buffer and packs rank ``rank``'s bytes first."""

    step: int
    peer: int
    pieces: tuple[Piece, ...]
    pace_bytes_per_s: float | None
    not_before_s: float = 0.0
    after: tuple[int, ...] = ()
    store_and_forward: bool = False
    feeds: tuple[int, ...] = ()
    reshard: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class RecvPlan:
    step: int
    peer: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class DeviceJob:
    """Everything one device does: what its buffers are (``memory``: every rank's; ``holds``:
    a serving GPU's ``(tp, rank)``), what is in them before the start (``holds``,
    ``every_rank`` from the checkpoint, ``held`` byte ranges of rank ``gpu_rank``'s buffer),
    its steps, and ``check``: compare every unit with its rank buffer at the end."""

    rank: int
    label: str
    program: Program = field(repr=False)
    checkpoint: Checkpoint
    memory: bool = False
    holds: tuple[int, int] | None = None
    every_rank: bool = False
    held: tuple[tuple[int, int, int], ...] = ()
    gpu_rank: int | None = None
    check: bool = False
    sends: tuple[SendPlan, ...] = ()
    recvs: tuple[RecvPlan, ...] = ()
    peer_bases: dict[int, tuple[int, ...]] = field(default_factory=dict)
    transport: str = "torch"
    run: str = ""
    paced: bool = True

    def unit_sizes(self) -> tuple[int, ...]:
        return unit_sizes(self.program, self.holds, self.memory)


def unit_sizes(program: Program, holds: tuple[int, int] | None, memory: bool) -> tuple[int, ...]:
    own = layout(program.spec, holds[0]).unit_bytes if holds else program.unit_bytes
    return tuple(n * (program.tp if memory else 1) for n in own)


def arena_bases(sizes: tuple[int, ...]) -> tuple[int, ...]:
    """Where each unit's buffer starts in the arena, and (last) where the packed bytes do."""
    bases = [0]
    for size in sizes:
        bases.append(bases[-1] + size)
    return tuple(bases)


def devices_of(programs: Iterable[Program]) -> list[str]:
    """Every device, one process each: those holding weights before the start first, then every
    other source and destination in step order, then new GPUs no step names."""
    found: list[str] = []
    for program in programs:
        found += [s.source for s in program.steps if s.holder in ("instance", "memory", "disk")]
        found += [d for s in program.steps for d in (s.source, s.destination)]
        found += [g for inst in program.new_instances for g in inst.gpus]
    return list(dict.fromkeys(found))


def stages(program: Program, replan: Program | None = None, at_s: float = 0.0) -> list[Stage]:
    """The run's programs: ``program`` alone, or cut where ``replan`` takes over (module
    docstring), then ``replan`` from ``at_s``."""
    if replan is None:
        return [Stage(program)]
    if replan.spec.identity != program.spec.identity or replan.tp != program.tp:
        raise InvalidInputError("the replan is of another model or TP degree than the program")
    kept = _kept(program, replan, at_s)
    offset = max(s.id for s in program.steps) + 1
    return [Stage(program, kept=kept), Stage(replan, at_s=at_s, offset=offset)]


def _kept(old: Program, new: Program, at_s: float) -> dict[int, tuple[Piece, ...]]:
    """Per old step, the bytes it still delivers (module docstring), checked against ``held``."""
    memory = memory_devices(old)
    complete = {g for inst in old.new_instances if max(inst.predicted_s) <= at_s for g in inst.gpus}
    need: Spans = defaultdict(list)
    for gpu, spans in new.held.items():
        if old.gpu_rank.get(gpu, new.gpu_rank[gpu]) != new.gpu_rank[gpu] or gpu in memory:
            raise InvalidInputError(f"the replan loads {gpu!r} as another buffer than the program")
        for unit, lo, hi in spans:
            need[(gpu, unit)].append((lo, hi))
    for gpu in complete:
        for unit, size in enumerate(old.unit_bytes):
            need[(gpu, unit)].append((0, size))
    kept: dict[int, tuple[Piece, ...]] = {}
    changed = True
    while changed:  # grows only: at most one round per step of a forwarding chain
        changed = False
        for step in old.steps:
            pieces = _within(old, step, need, memory)
            if pieces != kept.get(step.id, ()):
                kept[step.id], changed = pieces, True
                if step.holder == "plan":
                    for unit, off, _, n in pieces:
                        base = rank_base(old, step.rank, unit, memory=step.source in memory)
                        need[(step.source, unit)].append((base + off, base + off + n))
    _check_held(old, new, kept, memory)
    return kept


def _within(old: Program, step: ProgramStep, need: Spans, memory: set[str]) -> tuple[Piece, ...]:
    """The parts of ``step``'s pieces whose destination bytes are in ``need``."""
    out: list[Piece] = []
    for unit, off, n in step.pieces():
        base = rank_base(old, step.rank, unit, memory=step.destination in memory)
        for lo, hi in _merged(need.get((step.destination, unit), [])):
            a, b = max(lo, base + off), min(hi, base + off + n)
            if a < b:
                out.append((unit, a - base, a - base, b - a))
    return tuple(out)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _check_held(
    old: Program, new: Program, kept: dict[int, tuple[Piece, ...]], memory: set[str]
) -> None:
    delivered: Spans = defaultdict(list)
    for gpu, spans in old.held.items():
        for unit, lo, hi in spans:
            delivered[(gpu, unit)].append((lo, hi))
    for step in old.steps:
        for unit, off, _, n in kept.get(step.id, ()):
            base = rank_base(old, step.rank, unit, memory=step.destination in memory)
            delivered[(step.destination, unit)].append((base + off, base + off + n))
    for gpu, spans in new.held.items():
        for unit, lo, hi in spans:
            at = lo
            for a, b in _merged(delivered[(gpu, unit)]):
                if a <= at < b:
                    at = b
            if at < hi:
                raise InvalidInputError(
                    f"the replan's held says {gpu!r} has bytes [{at}, {hi}) of unit {unit}, "
                    "which the running program never delivers to it; refusing a replan that "
                    "would leave a hole"
                )


def device_jobs(
    parts: list[Stage], checkpoint: Checkpoint, *, transport: str, run: str, paced: bool
) -> tuple[DeviceJob, ...]:
    """One DeviceJob per device, ranks in :func:`devices_of` order."""
    devices = devices_of(p.program for p in parts)
    rank_of = {d: r for r, d in enumerate(devices)}
    first, roles = parts[0].program, dict[str, _Role]()
    for part in reversed(parts):  # the first program that names a device says what it is
        roles.update(_roles(part.program, first_stage=part is parts[0]))
    sends: dict[str, list[SendPlan]] = defaultdict(list)
    recvs: dict[str, list[RecvPlan]] = defaultdict(list)
    for part in parts:
        program, memory = part.program, memory_devices(part.program)
        for step in program.steps:
            pieces = _placed(program, step, part.pieces(step), memory)
            if not pieces:
                continue
            key = part.offset + step.id
            send = _send_plan(part, step, pieces, rank_of[step.destination], paced=paced)
            sends[step.source].append(send)
            recvs[step.destination].append(RecvPlan(key, rank_of[step.source], pieces))
    checked = set(checked_gpus(parts))
    for device, plans in sends.items():
        if any(p.reshard for p in plans) and roles[device].holds is None:
            raise InvalidInputError(
                f"{device!r} reshards its buffer for the replan, but the running program loads it"
            )
    bases = {
        rank_of[d]: arena_bases(unit_sizes(first, roles[d].holds, roles[d].memory)) for d in devices
    }
    return tuple(
        DeviceJob(
            rank=rank_of[d],
            label=d,
            program=first,
            checkpoint=checkpoint,
            sends=tuple(sends[d]),
            recvs=tuple(recvs[d]),
            peer_bases={p.peer: bases[p.peer] for p in sends[d]},
            transport=transport,
            run=run,
            paced=paced,
            memory=roles[d].memory,
            holds=roles[d].holds,
            every_rank=roles[d].every_rank,
            held=roles[d].held,
            gpu_rank=roles[d].gpu_rank,
            check=d in checked,
        )
        for d in devices
    )


def checked_gpus(parts: list[Stage]) -> list[str]:
    """The GPUs a run checks at the end: the last program's new GPUs and, when it is a replan,
    those of the running program's instances complete by ``at_s`` (the surviving GPUs)."""
    last = parts[-1]
    done = [
        g
        for inst in parts[0].program.new_instances
        if len(parts) > 1 and max(inst.predicted_s) <= last.at_s
        for g in inst.gpus
    ]
    return list(dict.fromkeys([*last.program.gpu_rank, *done]))


@dataclass(frozen=True)
class _Role:
    memory: bool
    holds: tuple[int, int] | None
    every_rank: bool
    held: tuple[tuple[int, int, int], ...]
    gpu_rank: int | None


def _roles(program: Program, *, first_stage: bool) -> dict[str, _Role]:
    """What each device of ``program`` is and holds before the start (``held`` only in the
    first program: a replan's held bytes come from the program it takes over)."""
    memory, holds = memory_devices(program), source_holds(program)
    filled = {s.source for s in program.steps if s.holder in ("memory", "disk")}
    return {
        device: _Role(
            memory=device in memory,
            holds=holds.get(device),
            every_rank=device in filled,
            held=tuple(program.held.get(device, ())) if first_stage else (),
            gpu_rank=program.gpu_rank.get(device),
        )
        for device in devices_of([program])
    }


def _placed(
    program: Program, step: ProgramStep, pieces: tuple[Piece, ...], memory: set[str]
) -> tuple[Piece, ...]:
    """``pieces`` at offsets of the source's and the destination's unit buffers."""
    out = []
    for unit, src, dst, n in pieces:
        into = rank_base(program, step.rank, unit, memory=step.destination in memory)
        out.append((unit, src, into + dst, n))
    return tuple(out)


def _send_plan(
    part: Stage, step: ProgramStep, pieces: tuple[Piece, ...], peer: int, *, paced: bool
) -> SendPlan:
    program, memory = part.program, memory_devices(part.program)
    holds = step.source_layout
    reshard = None
    if holds is not None and holds != (program.tp, step.rank):
        reshard = (holds[0], holds[1], step.rank)
    out_of = step.source in memory and reshard is None
    placed = tuple(
        (u, rank_base(program, step.rank, u, memory=out_of) + s, d, n) for u, s, d, n in pieces
    )
    shift = part.offset
    return SendPlan(
        step=shift + step.id,
        peer=peer,
        pieces=placed,
        pace_bytes_per_s=step.pace_bytes_per_s if paced else None,
        not_before_s=part.at_s + step.not_before_s,
        after=tuple(shift + a for a in step.after),
        store_and_forward=step.store_and_forward,
        feeds=tuple(shift + f for f in step.feeds),
        reshard=reshard,
    )
