"""Run a ScalePlan's transfer program for real, from its JSON alone (DESIGN.md section 8):
refuse what this executor cannot run before a process starts, run one job per device
(:mod:`.devices`) on a :class:`Workers` process, return what they measured beside the prediction
(seconds from the run's start). A step's pace stands for its ``relay``, ``nic`` and ``link``.
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from blitzplan._checks import is_finite_number
from blitzplan.errors import InvalidInputError
from blitzplan.executor.program.devices import DeviceJob, device_jobs
from blitzplan.executor.program.jobs import Stage, check_runnable, stages
from blitzplan.executor.program.session import DeviceReport, program_job
from blitzplan.executor.runtime.failures import InjectedFault
from blitzplan.executor.runtime.pool import Workers, run_jobs
from blitzplan.executor.smallmodel.llama import model_dims
from blitzplan.executor.transports import check_transport
from blitzplan.wire.plan_program import plan_program_json
from blitzplan.wire.scaleprogram import ScaleProgram, read_program_json

Document = str | Path
"""A ScalePlan or its program export: its JSON text or the path of its file."""
_FULL = re.compile(r'"schema"\s*:\s*"blitzplan\.scaleplan"')


@dataclass(frozen=True)
class StepResult:
    """A step (``program`` 1 for a replan's): predicted and measured first byte out and last
    byte in, the bytes it moved, when its sender was done."""

    program: int
    id: int
    kind: str
    source: str
    destination: str
    predicted_start_s: float
    predicted_end_s: float
    start_s: float
    end_s: float
    moved_bytes: int
    sent_s: float


@dataclass(frozen=True)
class InstanceResult:
    """A new instance: per unit its predicted and measured ready time (every byte on every GPU);
    per GPU per unit whether its buffer is bit-exact."""

    name: str
    gpus: tuple[str, ...]
    predicted_s: tuple[float, ...]
    ready_s: tuple[float, ...]
    bit_exact: Mapping[str, tuple[bool, ...]]


@dataclass(frozen=True)
class ProgramRun:
    """A run: ``plan_s`` the last predicted byte in; ``devices`` the processes by rank;
    ``duplicate_bytes`` bytes its lanes bring a checked GPU twice."""

    plan_id: str
    transport: str
    plan_s: float
    devices: tuple[str, ...]
    steps: tuple[StepResult, ...]
    instances: tuple[InstanceResult, ...]
    duplicate_bytes: int

    @property
    def bit_exact(self) -> bool:
        """Every unit on every surviving new GPU is its rank buffer, byte for byte."""
        return all(all(units) for inst in self.instances for units in inst.bit_exact.values())

    @property
    def moved_bytes(self) -> int:
        return sum(s.moved_bytes for s in self.steps)

    @property
    def wall_s(self) -> float:
        """First byte out to last byte in, measured."""
        return max(s.end_s for s in self.steps) - min(s.start_s for s in self.steps)

    def errors_s(self, time: str) -> list[float]:
        """Measured minus predicted ``time`` (``start`` or ``end``), per step."""
        return [getattr(s, f"{time}_s") - getattr(s, f"predicted_{time}_s") for s in self.steps]


def read_program(document: Document) -> ScaleProgram:
    """The checked program of a document this executor can run; a full ScalePlan is read as its
    program export (:func:`~blitzplan.wire.plan_program.plan_program_json`)."""
    text = str(document)
    if isinstance(document, Path) or not text.lstrip().startswith("{"):
        if not Path(text).is_file():
            raise InvalidInputError(f"document {text!r} is not a file (nor JSON text)")
        text = Path(text).read_text()
    program = read_program_json(plan_program_json(text) if _FULL.search(text) else text)
    check_runnable(program)
    return program


def check_fault(fault: InjectedFault, jobs: tuple[DeviceJob, ...]) -> None:
    """A fault fires where its rank moves its unit: refuse one that never could."""
    if not 0 <= fault.rank < len(jobs):
        raise InvalidInputError(f"fault names rank {fault.rank}, the run has {len(jobs)} devices")
    job = jobs[fault.rank]
    moved = sorted({c.unit for lane in (*job.out, *job.into) for c in lane.chunks})
    if fault.layer not in moved:
        raise InvalidInputError(
            f"fault names unit {fault.layer} of rank {fault.rank} ({job.label}), which never "
            f"moves it (it moves units {moved}): the fault could never fire"
        )


def prepare(
    document: Document,
    *,
    replan: Document | None = None,
    at_s: float | None = None,
    transport: str = "torch",
    paced: bool = True,
) -> tuple[list[Stage], tuple[DeviceJob, ...]]:
    """Read and check everything; the run's stages and its device jobs."""
    program = read_program(document)
    model_dims(program.spec)  # a model the executor runs
    check_transport(transport)
    if (replan is None) != (at_s is None):
        raise InvalidInputError("replan and at_s go together: a replan takes over at at_s")
    if at_s is not None and not (is_finite_number(at_s) and at_s >= 0):
        raise InvalidInputError(f"at_s must be a finite time >= 0, got {at_s!r}")
    parts = stages(program, read_program(replan) if replan is not None else None, at_s or 0.0)
    run = uuid.uuid4().hex[:12]
    return parts, device_jobs(parts, transport=transport, run=run, paced=paced)


def run_program(
    document: Document,
    *,
    replan: Document | None = None,
    at_s: float | None = None,
    transport: str = "torch",
    device: str = "cpu",
    timeout_s: float = 30.0,
    paced: bool = True,
    workers: Workers | None = None,
    fault: InjectedFault | None = None,
) -> ProgramRun:
    """Run the transfer program of ``document`` (module docstring). ``paced``: each step keeps to
    its ``pace_bytes_per_s``. ``workers`` reuses a running pool (its first ranks run the devices);
    else one runs on ``device``. ``fault`` kills a device (rank: its index, holders first)."""
    parts, jobs = prepare(document, replan=replan, at_s=at_s, transport=transport, paced=paced)
    if fault is not None:
        check_fault(fault, jobs)
    launched = {job.rank: (program_job, job) for job in jobs}
    labels = [job.label for job in jobs]
    reports = run_jobs(
        launched, labels, workers=workers, device=device, timeout_s=timeout_s, fault=fault
    )
    return summarize(parts, jobs, reports)


def summarize(
    parts: list[Stage], jobs: Sequence[DeviceJob], reports: Mapping[int, DeviceReport]
) -> ProgramRun:
    """A ProgramRun from the devices' reports (by rank)."""
    rank_of = {job.label: job.rank for job in jobs}
    steps = []
    for k, part in enumerate(parts):
        for s in part.program.steps:
            key = part.offset + s.id
            out, into = reports[rank_of[s.source]], reports[rank_of[s.destination]]
            if key in into.received_bytes:  # else nothing was left of it to send
                steps.append(
                    StepResult(
                        *(k, s.id, s.kind, s.source, s.destination),
                        *(part.at_s + s.start_s, part.at_s + s.end_s),
                        out.sent_start_s.get(key, math.nan),
                        into.received_end_s.get(key, math.nan),
                        into.received_bytes[key],
                        out.sent_end_s.get(key, math.nan),
                    )
                )
    checked = {job.label for job in jobs if job.check}
    units = range(len(parts[0].program.unit_bytes))
    found = {i.name: (part, i) for part in parts for i in part.program.new_instances}
    instances = tuple(
        InstanceResult(
            inst.name,
            inst.gpus,
            tuple(part.at_s + t for t in inst.layer_ready_s),
            tuple(max(reports[rank_of[g]].complete_s[u] for g in inst.gpus) for u in units),
            {g: reports[rank_of[g]].bit_exact for g in inst.gpus},
        )
        for part, inst in found.values()
        if set(inst.gpus) <= checked
    )
    return ProgramRun(
        parts[-1].program.plan_id,
        jobs[0].transport,
        max(p.at_s + s.end_s for p in parts for s in p.program.steps),
        tuple(rank_of),
        tuple(steps),
        instances,
        sum(job.duplicate_bytes for job in jobs if job.check),
    )
