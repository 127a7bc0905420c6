"""The times a transfer program's own rules give its steps, with no overhead at all.

Each step is run on paper exactly as the executor runs it: units in order, each byte range in
equal chunks of at most ``chunk_bytes``, a chunk leaving once its bytes are at the source (held
before the start, or brought by a step in ``feeds``: when that step's chunk ended) and the
previous chunk's window is over, each chunk's window ``bytes / pace`` long (zero when uncapped),
the step not starting before ``not_before_s``, the end of the steps in ``after`` and, for
``store_and_forward``, the end of its feeds. A step's start is its first window's start, its end
the last window's end. Comparing these with the document's ``start_s``/``end_s`` checks the
planner's predictions against its own program; comparing them with a run's measurements shows
the executor's overhead alone.
"""

from __future__ import annotations

import math
from collections import defaultdict

from blitzplan.executor.program_checks import memory_devices, rank_base
from blitzplan.executor.program_doc import Program, ProgramStep
from blitzplan.executor.waiting import equal_chunks

__all__ = ["program_timeline"]

Arrivals = dict[tuple[str, int], list[tuple[int, int, float]]]


def _since(pieces: list[tuple[int, int, float]], lo: int, hi: int) -> float | None:
    """When every byte of ``[lo, hi)`` was there (None if one never is)."""
    at, latest = lo, 0.0
    for a, b, t in sorted(pieces):
        if a <= at < b:
            at, latest = b, max(latest, t)
        if at >= hi:
            return latest
    return None


def _run(
    program: Program, step: ProgramStep, gate_s: float, arrivals: Arrivals, memory: set[str]
) -> tuple[float, float] | None:
    """The step's start and end, its chunks added to ``arrivals``; None if a byte never comes."""
    free_s, start_s = gate_s, None
    rate = step.pace_bytes_per_s or math.inf
    out: list[tuple[tuple[str, int], tuple[int, int, float]]] = []
    for unit, offset, length in step.pieces():
        src = rank_base(program, step.rank, unit, memory=step.source in memory)
        dst = rank_base(program, step.rank, unit, memory=step.destination in memory)
        for a, b in equal_chunks(offset, offset + length, program.chunk_bytes):
            ready = 0.0
            if step.holder == "plan":
                found = _since(arrivals[(step.source, unit)], src + a, src + b)
                if found is None:
                    return None
                ready = found
            free_s = max(free_s, ready)
            start_s = free_s if start_s is None else start_s
            free_s += (b - a) / rate
            out.append(((step.destination, unit), (dst + a, dst + b, free_s)))
    for key, piece in out:
        arrivals[key].append(piece)
    return (gate_s if start_s is None else start_s), free_s


def program_timeline(program: Program) -> dict[int, tuple[float, float]]:
    """Per step id, ``(start_s, end_s)`` by the program's rules (module docstring); a step
    whose bytes or dependencies never come is left out."""
    memory = memory_devices(program)
    arrivals: Arrivals = defaultdict(list)
    for gpu, spans in program.held.items():
        for unit, lo, hi in spans:
            arrivals[(gpu, unit)].append((lo, hi, 0.0))
    times: dict[int, tuple[float, float]] = {}
    pending = list(program.steps)
    while pending:
        waiting = []
        for step in pending:
            needs = [*step.after, *(step.feeds if step.holder == "plan" else ())]
            if any(n not in times for n in needs) or (
                step.store_and_forward and any(f not in times for f in step.feeds)
            ):
                waiting.append(step)
                continue
            gate = max(
                [step.not_before_s, *(times[a][1] for a in step.after)]
                + [times[f][1] for f in step.feeds if step.store_and_forward]
            )
            result = _run(program, step, gate, arrivals, memory)
            if result is not None:
                times[step.id] = result
        if len(waiting) == len(pending):
            break  # the rest wait on each other or on bytes that never come
        pending = waiting
    return times
