"""What a run measured beside what its documents predicted.

Times are seconds from the run's start. A step's measured start is its first byte out, its end
its last byte in; a unit is ready on a new instance when every byte of it is on every GPU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blitzplan.executor.program.devices import checked_gpus

if TYPE_CHECKING:
    from blitzplan.executor.program.jobs import Stage
    from blitzplan.executor.program.session import DeviceReport


@dataclass(frozen=True)
class StepResult:
    """A step (``id`` in its document; ``program`` 1 for a replan's): predicted and measured
    first byte out and last byte in, the bytes it moved, when its sender was done."""

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
    """A new instance: per unit its predicted and measured ready time; per GPU per unit
    whether its buffer is bit-exact."""

    name: str
    gpus: tuple[str, ...]
    predicted_s: tuple[float, ...]
    ready_s: tuple[float, ...]
    bit_exact: Mapping[str, tuple[bool, ...]]


@dataclass(frozen=True)
class ProgramRun:
    """A run: ``plan_s`` the last predicted byte in; ``devices`` the processes by rank;
    ``duplicate_bytes`` bytes a new GPU received twice; ``cpu_s`` the CPU seconds of every
    device's process from the start to its transfers' end."""

    plan_id: str
    transport: str
    plan_s: float
    devices: tuple[str, ...]
    steps: tuple[StepResult, ...]
    instances: tuple[InstanceResult, ...]
    duplicate_bytes: int
    cpu_s: float

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
        """Measured minus predicted ``time`` (``start``: first byte out, ``end``: last byte in),
        per step in ``steps`` order."""
        return [getattr(s, f"{time}_s") - getattr(s, f"predicted_{time}_s") for s in self.steps]


def summarize(
    parts: list[Stage], devices: Sequence[str], reports: Mapping[int, DeviceReport], transport: str
) -> ProgramRun:
    """A ProgramRun from the devices' reports (ranks in ``devices`` order)."""
    rank_of = {d: r for r, d in enumerate(devices)}
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
    checked, units = set(checked_gpus(parts)), range(len(parts[0].program.unit_bytes))
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
    plan_s = max(p.at_s + s.end_s for p in parts for s in p.program.steps)
    duplicates = sum(reports[rank_of[g]].duplicate_bytes for g in checked)
    return ProgramRun(
        parts[-1].program.plan_id,
        transport,
        plan_s,
        tuple(devices),
        tuple(steps),
        instances,
        duplicates,
        sum(r.cpu_s for r in reports.values()),
    )
