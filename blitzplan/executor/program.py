"""Run a ScalePlan document's transfer program for real, from the JSON alone.

:func:`run_program` reads the document (:func:`~blitzplan.executor.program_doc.read_program`:
``json``, no planner object), checks the checkpoint holds the document's model, and starts one
process per device the steps name (every GPU and host memory that sends or receives, and every
new GPU), over gloo (also with ``device="cuda"``, where the buffers live on the GPU and chunks
cross through host memory: NCCL's point-to-point calls have no tags to keep a device's
concurrent steps apart). Per unit, a GPU holds its rank buffer (``B_u`` bytes of
:func:`blitzplan.layout`), host memory every rank's buffer back to back (rank ``r`` at
``r * B_u``); a serving instance's GPU is filled from the checkpoint with its own rank buffer
(of ``source_layout``'s TP degree when set), host memory with every rank's, a new GPU with the
bytes ``held`` says it has. Each step then runs as :mod:`~blitzplan.executor.program_worker`
says; ``relay``, ``nic`` and ``link`` have no CPU counterpart (the step's pace stands for its
route). The result (:class:`~blitzplan.executor.program_result.ProgramRun`) compares every new
GPU's final buffers with its rank buffer built from the checkpoint, and each step's measured
first byte out and last byte in, and each unit's ready time, with the document's predictions.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from blitzplan.errors import InvalidInputError
from blitzplan.executor.checkpoint import Checkpoint, check_identity, load_checkpoint
from blitzplan.executor.faults import InjectedFault
from blitzplan.executor.processes import Workers
from blitzplan.executor.program_checks import memory_devices, rank_base, source_holds
from blitzplan.executor.program_doc import Program, ProgramStep, read_program
from blitzplan.executor.program_result import ProgramRun, summarize
from blitzplan.executor.program_worker import DeviceJob, RecvPlan, SendPlan, program_job
from blitzplan.models.layout import layout

__all__ = ["device_jobs", "devices_of", "run_program"]


def devices_of(program: Program) -> list[str]:
    """Every device of the program, one process each: the devices that hold weights before the
    start, then every other source and destination in step order, then new GPUs no step names."""
    holders = [s.source for s in program.steps if s.holder in ("instance", "memory", "disk")]
    rest = [d for s in program.steps for d in (s.source, s.destination)]
    gpus = [g for inst in program.new_instances for g in inst.gpus]
    return list(dict.fromkeys([*holders, *rest, *gpus]))


def _send_plan(
    program: Program, step: ProgramStep, peer: int, *, memory: bool, paced: bool
) -> SendPlan:
    holds = step.source_layout
    reshard = None
    if holds is not None and holds != (program.tp, step.rank):
        reshard = (holds[0], holds[1], step.rank)
        _check_reshard(program, step, holds)
    pieces = tuple(
        (unit, (0 if reshard else rank_base(program, step.rank, unit, memory=memory)) + off, n)
        for unit, off, n in step.pieces()
    )
    return SendPlan(
        step=step.id,
        peer=peer,
        pieces=pieces,
        pace_bytes_per_s=step.pace_bytes_per_s if paced else None,
        not_before_s=step.not_before_s,
        after=step.after,
        store_and_forward=step.store_and_forward,
        feeds=step.feeds,
        reshard=reshard,
    )


def _check_reshard(program: Program, step: ProgramStep, holds: tuple[int, int]) -> None:
    """The serving rank must hold every byte it is to send (InvalidInputError otherwise)."""
    target, source = layout(program.spec, program.tp), layout(program.spec, holds[0])
    for unit, offset, length in step.pieces():
        size = program.unit_bytes[unit]
        lo, hi = Fraction(offset, size), Fraction(offset + length, size)
        try:
            target.reshard(unit, source, holds[1], step.rank, lo, hi)
        except InvalidInputError as exc:
            raise InvalidInputError(f"step {step.id} (source_layout {holds}): {exc}") from None


def device_jobs(
    program: Program, checkpoint: Checkpoint, *, paced: bool = True
) -> tuple[DeviceJob, ...]:
    """One DeviceJob per device, ranks in :func:`devices_of` order."""
    devices = devices_of(program)
    rank_of = {d: r for r, d in enumerate(devices)}
    memory, holds = memory_devices(program), source_holds(program)
    sends: dict[str, list[SendPlan]] = {d: [] for d in devices}
    recvs: dict[str, list[RecvPlan]] = {d: [] for d in devices}
    for step in program.steps:
        into = step.destination in memory
        sends[step.source].append(
            _send_plan(
                program, step, rank_of[step.destination], memory=step.source in memory, paced=paced
            )
        )
        pieces = tuple(
            (unit, rank_base(program, step.rank, unit, memory=into) + off, n)
            for unit, off, n in step.pieces()
        )
        recvs[step.destination].append(RecvPlan(step.id, rank_of[step.source], pieces))
    filled = {s.source for s in program.steps if s.holder in ("memory", "disk")}
    return tuple(
        DeviceJob(
            rank=rank_of[d],
            label=d,
            spec=program.spec,
            tp=program.tp,
            checkpoint=checkpoint,
            chunk_bytes=program.chunk_bytes,
            memory=d in memory,
            holds=holds.get(d),
            every_rank=d in filled,
            held=program.held.get(d, ()),
            gpu_rank=program.gpu_rank.get(d),
            check=d in program.gpu_rank,
            sends=tuple(sends[d]),
            recvs=tuple(recvs[d]),
        )
        for d in devices
    )


def _checkpoint(checkpoint: Checkpoint | str | Path) -> Checkpoint:
    if isinstance(checkpoint, Checkpoint):
        return checkpoint
    if isinstance(checkpoint, str | Path):
        return load_checkpoint(checkpoint)
    raise InvalidInputError(
        f"checkpoint must be a Checkpoint or a directory, got {type(checkpoint).__name__}"
    )


def run_program(
    document: str | Path,
    checkpoint: Checkpoint | str | Path,
    *,
    device: str = "cpu",
    timeout_s: float = 30.0,
    paced: bool = True,
    workers: Workers | None = None,
    fault: InjectedFault | None = None,
) -> ProgramRun:
    """Run the transfer program of ``document`` (a path or the JSON text) with the weights of
    ``checkpoint`` (a Checkpoint or its directory); see the module docstring.

    Everything is checked before a process starts (InvalidInputError naming the field, the step
    or the device). ``paced``: each step keeps to its ``pace_bytes_per_s`` (so that measured
    times compare with the predicted ones where transfers dominate). ``workers`` reuses a
    running gloo pool of at least as many ranks (its first ranks run the devices); otherwise
    one is started on ``device`` and ended. A device that dies or stalls raises RankFailedError
    after every process has been ended; ``fault`` makes one do so (its rank is the device's
    index in :func:`devices_of`; a sender applies it as it starts sending that unit)."""
    program = read_program(document)
    weights = _checkpoint(checkpoint)
    check_identity(weights, program.identity)
    jobs = device_jobs(program, weights, paced=paced)
    labels = [job.label for job in jobs]
    own = workers is None
    pool = workers or Workers(labels, device=device, timeout_s=timeout_s, backend="gloo")
    try:
        if pool.world_size < len(jobs) or pool.backend != "gloo":
            raise InvalidInputError(
                f"workers must be a gloo pool of at least {len(jobs)} ranks, got "
                f"{pool.world_size} ranks over {pool.backend}"
            )
        pool.relabel(dict(enumerate(labels)))
        launched: dict[int, tuple[Any, Any]] = {job.rank: (program_job, job) for job in jobs}
        pool.launch(launched, num_layers=program.spec.num_layers, fault=fault)
        reports: Mapping[int, Any] = pool.collect([job.rank for job in jobs])
    finally:
        if own:
            pool.close()
    return summarize(program, labels, reports)
