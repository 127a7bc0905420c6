"""One job per device of a run: its arena, what fills it, its lanes, what each write waits for.

Every step is cut into chunks of the document's ``chunk_bytes`` (equal sizes, to a byte); the
chunks between two devices in one direction form their *lane*, in one order both ends follow: by
the chunk's predicted start (a step's chunks spread evenly over its time), the step's depth in
``after`` chains, the step and the chunk.
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING

from blitzplan.errors import InvalidInputError
from blitzplan.executor.program.jobs import Buffer, Piece, Stage, buffers, complete_gpus, gpu_ranks
from blitzplan.executor.transports import Chunk, Lane, runs, writes
from blitzplan.models.layout import Layout, layout
from blitzplan.wire.program_bytes import held_bytes, rank_base, subtract, union
from blitzplan.wire.program_rules import memory_devices, waits
from blitzplan.wire.scaleprogram import ScaleProgram, StepRecord

if TYPE_CHECKING:
    from blitzplan.models import ModelSpec

Lanes = dict[tuple[int, int], list[tuple[tuple[float, int, int, int], Chunk]]]
"""Per (source, destination) rank its chunks, each keyed by its place in the lane's order."""
BATCH = 64
"""Most chunks in one write of an unpaced step (each message costs a wake-up on both ends)."""


def equal_chunks(lo: int, hi: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into ``ceil(bytes / chunk_bytes)`` chunks of equal size (to a byte): a tiny
    last chunk would wait on TCP's Nagle rule (gloo leaves it on) for the previous one's ack."""
    size = hi - lo
    count = max(0, -(-size // chunk_bytes))
    return list(itertools.pairwise(lo + size * k // max(count, 1) for k in range(count + 1)))


@dataclass(frozen=True)
class SendStep:
    """A step as its sender runs it: its pace (None: unpaced), and when it may start (times
    from the run's start): not before ``not_before_s`` and the end of the steps in ``after``
    (those the step :func:`~blitzplan.wire.program_rules.waits` for that still send)."""

    pace_bytes_per_s: float | None
    not_before_s: float
    after: tuple[int, ...]


@dataclass
class DeviceJob:
    """Everything one device does. Its arena holds its ``buffer`` of each unit (``sizes`` bytes
    each), all of it before the start (``filled``) or the ranges ``held``, then ``packs``
    ``(unit, own offset, arena offset, length)`` for its resharding steps. It sends on ``out``
    (``sends`` by step key), receives on ``into``, tells the store when the steps in ``tells``
    end (a third device's step waits for them); ``check``: compare every unit at the end.
    ``have``, ``needs``, ``whole`` and ``duplicate_bytes``: see :func:`_link`."""

    rank: int
    label: str
    spec: ModelSpec = field(repr=False)
    tp: int
    transport: str
    run: str
    buffer: Buffer
    filled: bool = False
    check: bool = False
    held: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    packs: list[tuple[int, int, int, int]] = field(default_factory=list)
    out: list[Lane] = field(default_factory=list)
    into: list[Lane] = field(default_factory=list)
    sends: dict[int, SendStep] = field(default_factory=dict)
    tells: set[int] = field(default_factory=set)
    arena_bytes: int = 0
    have: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    needs: list[tuple[int, ...]] = field(default_factory=list)
    whole: list[bool] = field(default_factory=list)
    duplicate_bytes: int = 0

    def __post_init__(self) -> None:
        self.arena_bytes = self.arena_bytes or sum(self.sizes)

    @property
    def ranks(self) -> tuple[Layout, tuple[int, ...]]:
        """The layout of the device's rank buffers, and the ranks it holds (back to back)."""
        if self.buffer is None:
            return layout(self.spec, self.tp), tuple(range(self.tp))
        return layout(self.spec, self.buffer[0]), self.buffer[1:]

    @functools.cached_property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(self.ranks[1]) * n for n in self.ranks[0].unit_bytes)

    @functools.cached_property
    def bases(self) -> tuple[int, ...]:
        """Where each unit's buffer starts in the arena, and (last) where packed bytes do."""
        return (0, *itertools.accumulate(self.sizes))


def device_jobs(
    parts: list[Stage], *, transport: str, run: str, paced: bool
) -> tuple[DeviceJob, ...]:
    """One DeviceJob per device, ranked in :func:`.jobs.devices_of` order over the programs; the
    first program that names a device says whether it is filled (``held``: the first
    program's). Checked: the last program's new GPUs and, after a replan, the running
    program's GPUs complete by ``at_s`` (the surviving GPUs)."""
    first, last = parts[0].program, parts[-1]
    survivors = complete_gpus(first, last.at_s) if len(parts) > 1 else []
    checked = {*gpu_ranks(last.program), *survivors}
    held = held_bytes(first.held, first.unit_bytes)
    jobs: dict[str, DeviceJob] = {}
    for part in parts:
        for name, (buffer, filled) in buffers(part.program).items():
            if name not in jobs:
                jobs[name] = DeviceJob(
                    *(len(jobs), name, first.spec, first.tp, transport, run, buffer),
                    filled=filled,
                    check=name in checked,
                    held=held.get(name, {}),
                )
    lanes: Lanes = defaultdict(list)
    for part in parts:
        _add_stage(part, jobs, lanes, paced=paced)
    ranked = list(jobs.values())
    for (src, dst), keyed in sorted(lanes.items()):
        cut = _writes([chunk for _, chunk in sorted(keyed)], ranked[src].sends)
        ranked[src].out.append(Lane(dst, cut))
        ranked[dst].into.append(Lane(src, cut))
    for job in jobs.values():
        _link(job)
    return tuple(jobs.values())


def _link(job: DeviceJob) -> None:
    """Per unit the bytes the device has at the start; per write it sends, the writes it
    receives (by index) that bring a byte of it the device lacks then; per unit whether it ends
    whole (InvalidInputError for a checked GPU that does not); the bytes it receives twice."""
    have = job.have
    for unit, size in enumerate(job.sizes):
        have[unit] = [(0, size)] if job.filled else job.held.get(unit, [])
    into: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for k, write in enumerate(writes(job.into)):
        for unit, lo, hi in runs(write, "lo"):
            into[unit].append((lo, hi, k))
    for write in writes(job.out):
        found: set[int] = set()
        for unit, lo, hi in runs(write, "held"):
            if subtract((lo, hi), have[unit]):
                found.update(k for a, b, k in into[unit] if a < hi and b > lo)
        job.needs.append(tuple(found))
    for unit, size in enumerate(job.sizes):
        spans = [*have[unit], *((a, b) for a, b, _ in into[unit])]
        gaps = subtract((0, size), union(spans))
        if gaps and job.check:
            raise InvalidInputError(
                f"{job.label!r} would end without bytes [{gaps[0][0]}, {gaps[0][1]}) of unit "
                f"{unit}: it does not hold them and no step brings them (a replan's held claims "
                "bytes the running program never delivers?); refusing a run that leaves a hole"
            )
        job.whole.append(not gaps)
        job.duplicate_bytes += sum(b - a for a, b in spans) - size + sum(b - a for a, b in gaps)


def _writes(chunks: list[Chunk], sends: dict[int, SendStep]) -> tuple[tuple[Chunk, ...], ...]:
    """A lane's chunks cut into writes, in the order of their first chunks: a paced step's one
    chunk each, an unpaced step's as few equal writes of at most BATCH chunks as it takes."""
    count = Counter(chunk.step for chunk in chunks)
    size = {k: -(-n // -(-n // BATCH)) for k, n in count.items()}
    size |= {k: 1 for k in count if sends[k].pace_bytes_per_s is not None}
    writes: list[list[Chunk]] = []
    open_: dict[int, list[Chunk]] = {}  # per step: its last write
    for chunk in chunks:
        write = open_.get(chunk.step)
        if write is None or len(write) == size[chunk.step]:
            write = open_[chunk.step] = []
            writes.append(write)
        write.append(chunk)
    return tuple(tuple(write) for write in writes)


def _add_stage(part: Stage, jobs: dict[str, DeviceJob], lanes: Lanes, *, paced: bool) -> None:
    """The chunks of every step of ``part`` on their lanes, each keyed by its place in the
    lane's order, and what their devices do with them."""
    program, memory = part.program, memory_devices(part.program.steps)
    starts = _starts(part)
    running = {s.id: part.pieces(s) for s in program.steps}
    by_id = {s.id: s for s in program.steps}
    for step in program.steps:
        if not running[step.id]:
            continue
        key = part.offset + step.id
        source, destination = jobs[step.source], jobs[step.destination]
        made = list(_chunks(part, step, running[step.id], source, destination, memory))
        begin_s, depth = starts[step.id]
        span_s = max(0.0, step.end_s - step.start_s)
        for k, chunk in enumerate(made):
            order = (begin_s + span_s * k / len(made), depth, key, k)
            lanes[(source.rank, destination.rank)].append((order, chunk))
        after = [a for a in waits(step) if running[a]]
        for prior in (by_id[a] for a in after):
            if step.source not in (prior.source, prior.destination):
                jobs[prior.destination].tells.add(part.offset + prior.id)
        source.sends[key] = SendStep(
            pace_bytes_per_s=step.pace_bytes_per_s if paced else None,
            not_before_s=part.at_s + step.not_before_s,
            after=tuple(part.offset + a for a in after),
        )


def _starts(part: Stage) -> dict[int, tuple[float, int]]:
    """Per step: the predicted start its chunks are ordered from (after ``not_before_s`` and the
    predicted ends of the steps in ``after``) and its depth in ``after`` chains."""
    by_id = {s.id: s for s in part.program.steps}

    @functools.cache
    def start(sid: int) -> tuple[float, int]:
        step = by_id[sid]
        begin = part.at_s + max(step.start_s, step.not_before_s)
        depth = 0
        for prior in step.after:
            at, level = start(prior)
            begin = max(begin, at + max(0.0, by_id[prior].end_s - by_id[prior].start_s))
            depth = max(depth, level + 1)
        return begin, depth

    return {sid: start(sid) for sid in by_id}


def _chunks(
    part: Stage,
    step: StepRecord,
    moved: tuple[Piece, ...],
    source: DeviceJob,
    destination: DeviceJob,
    memory: set[str],
) -> Iterable[Chunk]:
    """``step``'s chunks: its pieces at the source's and the destination's arena offsets; a
    resharding source's bytes packed into its arena first (:func:`_pack`)."""
    program, key = part.program, part.offset + step.id
    reshards = step.source_layout not in (None, (program.tp, step.rank))
    from_memory, to_memory = step.source in memory, step.destination in memory
    for unit, off, n in moved:
        into = rank_base(program.unit_bytes, step.rank, unit, memory=to_memory) + off
        if reshards:
            held, src = None, _pack(program, step, source, unit, off, n)
        else:
            held = rank_base(program.unit_bytes, step.rank, unit, memory=from_memory) + off
            src = source.bases[unit] + held
        for a, b in equal_chunks(0, n, program.chunk_bytes):
            at = None if held is None else held + a
            yield Chunk(
                key, unit, src + a, destination.bases[unit] + into + a, into + a, into + b, at
            )


def _pack(
    program: ScaleProgram, step: StepRecord, source: DeviceJob, unit: int, offset: int, n: int
) -> int:
    """Where in the source's arena a piece resharded from its own buffer (another TP degree's) is
    packed, its copies added to the source's packs; InvalidInputError where it cannot be."""
    if not source.filled or step.source_layout is None:
        raise InvalidInputError(
            f"{step.source!r} reshards its buffer for the replan, but the running program loads it"
        )
    size, (tp, rank) = program.unit_bytes[unit], step.source_layout
    target, own = layout(program.spec, program.tp), layout(program.spec, tp)
    try:
        copies = target.reshard(
            unit, own, rank, step.rank, Fraction(offset, size), Fraction(offset + n, size)
        )
    except InvalidInputError as exc:
        raise InvalidInputError(
            f"step {step.id} (source_layout {step.source_layout}): {exc}"
        ) from None
    at = source.arena_bytes
    source.packs += [(unit, src, at + dst - offset, length) for src, dst, length in copies]
    source.arena_bytes += n
    return at
