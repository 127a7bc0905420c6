"""Run a ScalePlan document's transfer program for real, from the JSON alone.

:func:`run_program` reads the document (:func:`~blitzplan.executor.program.reader.read_program`:
``json``, no planner object), checks that the checkpoint holds its model, builds one job per
device (:mod:`~blitzplan.executor.program.jobs`) and runs them on one process each
(:class:`~blitzplan.executor.runtime.pool.Workers`) over the chosen transport
(:mod:`~blitzplan.executor.transports`). ``relay``, ``nic`` and ``link`` have no counterpart on
one machine: the step's pace stands for its route. With ``replan`` and ``at_s`` the replan takes
the running program over at ``at_s`` (the contract is :mod:`~blitzplan.executor.program.jobs`'s
docstring). The result (:class:`~blitzplan.executor.program.outcome.ProgramRun`) compares every
surviving new GPU's buffers with its rank buffer built from the checkpoint, and each step's
measured first byte out and last byte in with the document's predictions.

Failures: everything is checked before a process starts (InvalidInputError naming the field,
the step or the device; an injected fault that could never fire too). A device that dies or
stalls raises RankFailedError naming the rank, the unit, the step and the chunk, after every
process has been ended.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from blitzplan._checks import is_number
from blitzplan.errors import InvalidInputError
from blitzplan.executor.program.jobs import DeviceJob, device_jobs, stages
from blitzplan.executor.program.outcome import ProgramRun, summarize
from blitzplan.executor.program.reader import read_program
from blitzplan.executor.program.session import program_job
from blitzplan.executor.runtime.failures import InjectedFault
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.runtime.worker import check_device
from blitzplan.executor.smallmodel.checkpoint import Checkpoint, check_identity, load_checkpoint
from blitzplan.executor.transports import check_transport


def _checkpoint(checkpoint: Checkpoint | str | Path) -> Checkpoint:
    if isinstance(checkpoint, Checkpoint):
        return checkpoint
    if isinstance(checkpoint, str | Path):
        return load_checkpoint(checkpoint)
    raise InvalidInputError(
        f"checkpoint must be a Checkpoint or a directory, got {type(checkpoint).__name__}"
    )


def check_fault(fault: InjectedFault, jobs: tuple[DeviceJob, ...]) -> None:
    """A fault fires where its rank moves its unit (sends or receives a chunk of it): refuse one
    that never could, naming what the rank moves."""
    if not 0 <= fault.rank < len(jobs):
        raise InvalidInputError(f"fault names rank {fault.rank}, the run has {len(jobs)} devices")
    job = jobs[fault.rank]
    moved = sorted({p[0] for plan in job.sends for p in plan.pieces})
    moved = sorted({*moved, *(p[0] for plan in job.recvs for p in plan.pieces)})
    if fault.layer not in moved:
        raise InvalidInputError(
            f"fault names unit {fault.layer} of rank {fault.rank} ({job.label}), which never "
            f"moves it (it moves units {moved}): the fault could never fire"
        )


def _check_nccl(jobs: tuple[DeviceJob, ...], backend: str) -> None:
    if backend != "nccl":
        return
    pairs = Counter((job.rank, send.peer) for job in jobs for send in job.sends)
    crowded = [pair for pair, count in pairs.items() if count > 1]
    if crowded:
        raise InvalidInputError(
            f"ranks {crowded[0]} exchange several steps: NCCL has no tags to keep them apart; "
            "use the nixl transport (or gloo through host memory) for this document"
        )


def prepare(
    document: str | Path,
    checkpoint: Checkpoint | str | Path,
    *,
    replan: str | Path | None = None,
    at_s: float | None = None,
    transport: str = "torch",
    paced: bool = True,
) -> tuple[list[Any], tuple[DeviceJob, ...]]:
    """Read and check everything; the run's stages and its device jobs."""
    program = read_program(document)
    weights = _checkpoint(checkpoint)
    check_identity(weights, program.identity)
    check_transport(transport)
    if (replan is None) != (at_s is None):
        raise InvalidInputError("replan and at_s go together: a replan takes over at at_s")
    if at_s is not None and not (is_number(at_s) and math.isfinite(at_s) and at_s >= 0):
        raise InvalidInputError(f"at_s must be a finite time >= 0, got {at_s!r}")
    parts = stages(program, read_program(replan) if replan is not None else None, at_s or 0.0)
    run = uuid.uuid4().hex[:12]
    jobs = device_jobs(parts, weights, transport=transport, run=run, paced=paced)
    return parts, jobs


def run_program(
    document: str | Path,
    checkpoint: Checkpoint | str | Path,
    *,
    replan: str | Path | None = None,
    at_s: float | None = None,
    transport: str = "torch",
    device: str = "cpu",
    timeout_s: float = 30.0,
    paced: bool = True,
    workers: Workers | None = None,
    fault: InjectedFault | None = None,
) -> ProgramRun:
    """Run the transfer program of ``document`` (a path or the JSON text) with the weights of
    ``checkpoint`` (a Checkpoint or its directory); see the module docstring.

    ``transport``: ``torch`` or ``nixl``. ``paced``: each step keeps to its
    ``pace_bytes_per_s``. ``workers`` reuses a running pool of at least as many ranks (its first
    ranks run the devices); otherwise one is started on ``device`` and ended. ``fault`` makes a
    device die or stall (its rank is the device's index in the run, holders first)."""
    parts, jobs = prepare(
        document, checkpoint, replan=replan, at_s=at_s, transport=transport, paced=paced
    )
    if fault is not None:
        check_fault(fault, jobs)
    labels = [job.label for job in jobs]
    _check_nccl(jobs, workers.backend if workers else check_device(device, len(jobs)))
    own = workers is None
    pool = workers or Workers(labels, device=device, timeout_s=timeout_s)
    try:
        if pool.world_size < len(jobs):
            raise InvalidInputError(
                f"workers must have at least {len(jobs)} ranks, got {pool.world_size}"
            )
        pool.relabel(dict(enumerate(labels)))
        launched = {job.rank: (program_job, job) for job in jobs}
        num_layers = parts[0].program.spec.num_layers
        pool.launch(launched, num_layers=num_layers, fault=fault)
        reports: Mapping[int, Any] = pool.collect([job.rank for job in jobs])
    finally:
        if own:
            pool.close()
    return summarize(parts, labels, reports, transport=transport)
