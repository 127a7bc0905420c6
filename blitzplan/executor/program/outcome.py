"""What a program run measured, beside what its document predicted; a table of it.

Times are seconds from the shared start (the start of the plan). A step's measured start is its
first byte out (the sender had the bytes and began the chunk's pacing window), its end the last
byte in at the destination; a unit is ready on a new instance when every byte of it is on every
GPU of the instance (held bytes count from the start).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from blitzplan._table import format_table
from blitzplan.executor.program.jobs import checked_gpus

if TYPE_CHECKING:
    from blitzplan.executor.program.jobs import Stage
    from blitzplan.executor.program.session import DeviceReport

__all__ = ["InstanceResult", "ProgramRun", "StepResult", "format_program_run", "summarize"]


@dataclass(frozen=True)
class StepResult:
    """One step (``id`` in its document; ``program`` 1 for a replan's): first byte out and last
    byte in as the document predicts them (from the run's start) and as measured; the bytes it
    was to move and moved; when its sender was done (``sent_s``: the last chunk sent)."""

    program: int
    id: int
    kind: str
    source: str
    destination: str
    bytes: int
    predicted_start_s: float
    predicted_end_s: float
    start_s: float
    end_s: float
    moved_bytes: int
    sent_s: float


@dataclass(frozen=True)
class InstanceResult:
    """One new instance: per unit, predicted (``layer_ready_s``) and measured ready times, and
    per GPU per unit whether its buffer is bit-exact."""

    name: str
    gpus: tuple[str, ...]
    predicted_s: tuple[float, ...]
    ready_s: tuple[float, ...]
    bit_exact: Mapping[str, tuple[bool, ...]]


@dataclass(frozen=True)
class ProgramRun:
    """A document's transfer program run for real (:func:`~blitzplan.executor.program.
    run_program`). ``plan_s`` is the last predicted byte in; ``devices`` the processes, by rank;
    ``duplicate_bytes`` bytes a new GPU received that it already had; ``transport`` the
    transport; ``wall_s`` the first byte out to the last byte in, measured."""

    plan_id: str
    transport: str
    plan_s: float
    devices: tuple[str, ...]
    steps: tuple[StepResult, ...]
    instances: tuple[InstanceResult, ...]
    duplicate_bytes: int

    @property
    def bit_exact(self) -> bool:
        """Every unit on every GPU of every new instance is its rank buffer, byte for byte."""
        return all(all(units) for inst in self.instances for units in inst.bit_exact.values())

    @property
    def moved_bytes(self) -> int:
        return sum(s.moved_bytes for s in self.steps)

    def start_errors_s(self) -> dict[int, float]:
        """Measured minus predicted first byte out, per step."""
        return {k: s.start_s - s.predicted_start_s for k, s in enumerate(self.steps)}

    def end_errors_s(self) -> dict[int, float]:
        """Measured minus predicted last byte in, per step."""
        return {k: s.end_s - s.predicted_end_s for k, s in enumerate(self.steps)}

    @property
    def wall_s(self) -> float:
        return max(s.end_s for s in self.steps) - min(s.start_s for s in self.steps)

    def ready_errors_s(self) -> dict[str, tuple[float, ...]]:
        """Measured minus predicted ready time, per new instance and unit."""
        return {
            inst.name: tuple(m - p for m, p in zip(inst.ready_s, inst.predicted_s, strict=True))
            for inst in self.instances
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain types for JSON (a time that never came is None)."""
        start, end = self.start_errors_s().values(), self.end_errors_s().values()
        ready = [e for errors in self.ready_errors_s().values() for e in errors]
        return {
            "plan_id": self.plan_id,
            "transport": self.transport,
            "wall_s": self.wall_s,
            "plan_s": self.plan_s,
            "processes": len(self.devices),
            "bit_exact": self.bit_exact,
            "moved_bytes": self.moved_bytes,
            "duplicate_bytes": self.duplicate_bytes,
            "errors_s": {
                "start": _spread(start),
                "end": _spread(end),
                "ready": _spread(ready),
            },
            "steps": [{k: _finite(v) for k, v in vars(s).items()} for s in self.steps],
            "instances": [
                {
                    "name": inst.name,
                    "gpus": list(inst.gpus),
                    "predicted_s": [_finite(t) for t in inst.predicted_s],
                    "ready_s": [_finite(t) for t in inst.ready_s],
                    "bit_exact": {g: list(b) for g, b in inst.bit_exact.items()},
                }
                for inst in self.instances
            ],
        }


def _finite(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _spread(errors: Sequence[float] | Any) -> dict[str, float | None]:
    """Median and worst absolute error (None when a time never came)."""
    values = [abs(e) for e in errors]
    if not values or not all(math.isfinite(v) for v in values):
        return {"median": None, "worst": None}
    return {"median": statistics.median(values), "worst": max(values)}


def summarize(
    parts: list[Stage],
    devices: list[str],
    reports: Mapping[int, DeviceReport],
    *,
    transport: str,
) -> ProgramRun:
    """A ProgramRun from the devices' reports (ranks in ``devices`` order)."""
    rank_of = {d: r for r, d in enumerate(devices)}
    steps = []
    for k, part in enumerate(parts):
        for s in part.program.steps:
            key, src, dst = (
                part.offset + s.id,
                reports[rank_of[s.source]],
                reports[rank_of[s.destination]],
            )
            if key not in dst.received_bytes:
                continue  # nothing left of it to send (a step the replan took over)
            steps.append(
                StepResult(
                    program=k,
                    id=s.id,
                    kind=s.kind,
                    source=s.source,
                    destination=s.destination,
                    bytes=s.bytes,
                    predicted_start_s=part.at_s + s.start_s,
                    predicted_end_s=part.at_s + s.end_s,
                    start_s=src.sent_start_s.get(key, math.nan),
                    end_s=dst.received_end_s.get(key, math.nan),
                    moved_bytes=dst.received_bytes[key],
                    sent_s=src.sent_end_s.get(key, math.nan),
                )
            )
    checked, units = set(checked_gpus(parts)), len(parts[0].program.unit_bytes)
    found = {i.name: (part, i) for part in parts for i in part.program.new_instances}
    instances = tuple(
        InstanceResult(
            name=inst.name,
            gpus=inst.gpus,
            predicted_s=tuple(part.at_s + t for t in inst.predicted_s),
            ready_s=tuple(
                max(reports[rank_of[g]].complete_s[u] for g in inst.gpus) for u in range(units)
            ),
            bit_exact={g: reports[rank_of[g]].bit_exact for g in inst.gpus},
        )
        for part, inst in found.values()
        if set(inst.gpus) <= checked
    )
    return ProgramRun(
        plan_id=parts[-1].program.plan_id,
        transport=transport,
        plan_s=max(p.at_s + p.program.plan_s for p in parts),
        devices=tuple(devices),
        steps=tuple(steps),
        instances=instances,
        duplicate_bytes=sum(reports[rank_of[g]].duplicate_bytes for g in checked),
    )


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


def _ms(value: float) -> str:
    return f"{value * 1e3:.1f}" if math.isfinite(value) else "-"


def format_program_run(run: ProgramRun) -> str:
    """Per step predicted vs measured start and end (ms), then per new instance its ready time
    and bit-exactness, then the median and worst errors."""
    rows = [
        [
            f"{s.id}" + ("'" if s.program else ""),
            s.kind,
            f"{s.source} -> {s.destination}",
            s.moved_bytes,
            *(_ms(t) for t in (s.predicted_start_s, s.start_s, s.predicted_end_s, s.end_s)),
        ]
        for s in run.steps
    ]
    headers = ["step", "kind", "route", "bytes", "start ms", "measured", "end ms", "measured"]
    ready = [
        [
            inst.name,
            " ".join(inst.gpus),
            _ms(max(inst.predicted_s)),
            _ms(max(inst.ready_s)),
            all(all(b) for b in inst.bit_exact.values()),
        ]
        for inst in run.instances
    ]
    errors = run.to_dict()["errors_s"]
    lines = [
        format_table(headers, rows),
        "(a replan's steps are marked ')",
        format_table(["instance", "gpus", "ready ms", "measured", "bit-exact"], ready),
        "",
        *(
            f"{what:>5} error: median {_ms(_or_nan(e['median']))} ms, worst "
            f"{_ms(_or_nan(e['worst']))} ms (plan {run.plan_s * 1e3:.1f} ms)"
            for what, e in errors.items()
        ),
        f"{len(run.devices)} processes over {run.transport}, {run.moved_bytes} bytes moved, "
        f"{run.duplicate_bytes} received twice, bit-exact: {run.bit_exact}",
    ]
    return "\n".join(lines)
