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
from blitzplan.executor.program_timeline import program_timeline

if TYPE_CHECKING:
    from blitzplan.executor.program_doc import Program
    from blitzplan.executor.program_worker import DeviceReport

__all__ = ["InstanceResult", "ProgramRun", "StepResult", "format_program_run", "summarize"]


@dataclass(frozen=True)
class StepResult:
    """One step: first byte out and last byte in as the document predicts them, as its own
    rules give them (``rule_*``: :func:`~blitzplan.executor.program_timeline.program_timeline`)
    and as measured; bytes moved; when its sender was done (``sent_s``: the last chunk's pacing
    window over and sent)."""

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
    rule_start_s: float = math.nan
    rule_end_s: float = math.nan


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
    run_program`). ``plan_s`` is the document's last predicted byte in; ``devices`` the
    processes, by rank; ``duplicate_bytes`` bytes a new GPU received that it already had."""

    plan_id: str
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
        return {s.id: s.start_s - s.predicted_start_s for s in self.steps}

    def end_errors_s(self) -> dict[int, float]:
        """Measured minus predicted last byte in, per step."""
        return {s.id: s.end_s - s.predicted_end_s for s in self.steps}

    def overhead_s(self) -> dict[int, tuple[float, float]]:
        """Measured minus rule-given (start, end), per step: the executor's own lateness."""
        return {s.id: (s.start_s - s.rule_start_s, s.end_s - s.rule_end_s) for s in self.steps}

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
        overhead = self.overhead_s().values()
        return {
            "plan_id": self.plan_id,
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
            "overhead_s": {
                "start": _spread([o[0] for o in overhead]),
                "end": _spread([o[1] for o in overhead]),
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
    program: Program, devices: Sequence[str], reports: Mapping[int, DeviceReport]
) -> ProgramRun:
    """A ProgramRun from the devices' reports (ranks in ``devices`` order)."""
    rank_of = {d: r for r, d in enumerate(devices)}
    rules = program_timeline(program)
    steps = tuple(
        StepResult(
            id=s.id,
            kind=s.kind,
            source=s.source,
            destination=s.destination,
            bytes=s.bytes,
            predicted_start_s=s.start_s,
            predicted_end_s=s.end_s,
            start_s=reports[rank_of[s.source]].sent_start_s.get(s.id, math.nan),
            end_s=reports[rank_of[s.destination]].received_end_s.get(s.id, math.nan),
            moved_bytes=reports[rank_of[s.destination]].received_bytes.get(s.id, 0),
            sent_s=reports[rank_of[s.source]].sent_end_s.get(s.id, math.nan),
            rule_start_s=rules.get(s.id, (math.nan, math.nan))[0],
            rule_end_s=rules.get(s.id, (math.nan, math.nan))[1],
        )
        for s in program.steps
    )
    instances = tuple(
        InstanceResult(
            name=inst.name,
            gpus=inst.gpus,
            predicted_s=inst.predicted_s,
            ready_s=tuple(
                max(reports[rank_of[g]].complete_s[u] for g in inst.gpus)
                for u in range(len(program.unit_bytes))
            ),
            bit_exact={g: reports[rank_of[g]].bit_exact for g in inst.gpus},
        )
        for inst in program.new_instances
    )
    return ProgramRun(
        plan_id=program.plan_id,
        plan_s=program.plan_s,
        devices=tuple(devices),
        steps=steps,
        instances=instances,
        duplicate_bytes=sum(reports[rank_of[g]].duplicate_bytes for g in program.gpu_rank),
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
            s.id,
            s.kind,
            f"{s.source} -> {s.destination}",
            s.bytes,
            _ms(s.predicted_start_s),
            _ms(s.rule_start_s),
            _ms(s.start_s),
            _ms(s.predicted_end_s),
            _ms(s.rule_end_s),
            _ms(s.end_s),
        ]
        for s in run.steps
    ]
    headers = [
        "step",
        "kind",
        "route",
        "bytes",
        "start ms",
        "by rule",
        "measured",
        "end ms",
        "by rule",
        "measured",
    ]
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
    summary = run.to_dict()
    lines = [
        format_table(headers, rows),
        "",
        format_table(["instance", "gpus", "ready ms", "measured", "bit-exact"], ready),
        "",
        *(
            f"{what:>5} error: median {_ms(_or_nan(e['median']))} ms, worst "
            f"{_ms(_or_nan(e['worst']))} ms (plan {run.plan_s * 1e3:.1f} ms)"
            for what, e in summary["errors_s"].items()
        ),
        *(
            f"{what:>5} overhead (measured - by rule): median {_ms(_or_nan(e['median']))} ms, "
            f"worst {_ms(_or_nan(e['worst']))} ms"
            for what, e in summary["overhead_s"].items()
        ),
        f"{len(run.devices)} processes, {run.moved_bytes} bytes moved, "
        f"{run.duplicate_bytes} received twice, bit-exact: {run.bit_exact}",
    ]
    return "\n".join(lines)
