"""The one independent certificate checker for live-scaling schedules (DESIGN.md section 4).

It shares no code with the methods that build schedules: it reads the operations, checks every
rule, recomputes each batch's completion from the operations and the objective from those
completions, and compares them with what the schedule reports. :func:`measured_violations`
checks a run the executor measured against the same rules (its times as they came).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from blitzplan._checks import is_integer
from blitzplan.errors import InvalidInputError
from blitzplan.live.instance import Fleet, LiveScalingInstance
from blitzplan.live.schedule import OBJECTIVES, SLO_TOL_S, NewOp, OldOp, Schedule
from blitzplan.solvers.backends import SolveStatus

__all__ = ["MeasuredRun", "ScheduleReport", "measured_violations", "validate_schedule"]

REL_TOL = 1e-9
"""Relative float tolerance on times (absolute below 1 s)."""


@dataclass(frozen=True)
class ScheduleReport:
    """What :func:`validate_schedule` found: an empty ``violations`` means the schedule is valid."""

    violations: tuple[str, ...]
    objective: float
    completion_s: tuple[float, ...]

    @property
    def ok(self) -> bool:
        return not self.violations


def _tol(*times: float) -> float:
    return REL_TOL * max([1.0, *(abs(t) for t in times if math.isfinite(t))])


class _Checker:
    """Collects violations; one method per rule family."""

    def __init__(self, instance: LiveScalingInstance, fleet: Fleet, schedule: Schedule) -> None:
        self.inst, self.fleet, self.sched = instance, fleet, schedule
        self.errors: list[str] = []
        self.L, self.n = instance.num_layers, instance.num_batches

    def fail(self, message: str) -> None:
        self.errors.append(message)

    def split(self) -> bool:
        split = self.sched.split
        if len(split) != self.n:
            self.fail(f"split has {len(split)} entries for {self.n} batches")
            return False
        for i, k in enumerate(split):
            if not is_integer(k) or not 0 <= k <= self.L:
                self.fail(f"split[{i}]={k!r} is not an integer in 0..{self.L}")
                return False
        return True

    def new_ops(self) -> dict[int, list[NewOp]]:
        by_batch: dict[int, list[NewOp]] = defaultdict(list)
        for op in self.sched.new_ops:
            if not 0 <= op.batch < self.n or not 0 <= op.worker < self.fleet.num_new:
                self.fail(f"{op} names an unknown batch or new instance")
                continue
            by_batch[op.batch].append(op)
        for i in range(self.n):
            ops = sorted(by_batch[i], key=lambda op: op.layer)
            if [op.layer for op in ops] != list(range(1, self.sched.split[i] + 1)):
                self.fail(
                    f"batch {i}: N runs layers {[op.layer for op in ops]}, split says "
                    f"1..{self.sched.split[i]}"
                )
                continue
            if len({op.worker for op in ops}) > 1:
                self.fail(f"batch {i}: its layers run on several new instances")
            self.new_chain(i, ops)
            by_batch[i] = ops
        return by_batch

    def new_chain(self, i: int, ops: list[NewOp]) -> None:
        inst = self.inst
        previous_end = inst.release_s[i]
        for op in ops:
            usable = self.fleet.usable_s(op.worker)[op.layer - 1]
            earliest = max(previous_end, usable, inst.embed_ready_s if op.layer == 1 else 0.0)
            if op.start_s < earliest - _tol(earliest):
                self.fail(
                    f"batch {i} layer {op.layer} starts on N at {op.start_s!r}, before "
                    f"{earliest!r} (release, layer arrival or its previous layer)"
                )
            if abs(op.end_s - op.start_s - inst.new_layer_s[i]) > _tol(op.end_s):
                self.fail(f"batch {i} layer {op.layer} lasts {op.end_s - op.start_s!r} on N")
            previous_end = op.end_s

    def old_ops(self, new_by_batch: dict[int, list[NewOp]]) -> dict[int, OldOp]:
        blocks: dict[int, OldOp] = {}
        for op in self.sched.old_ops:
            if not 0 <= op.batch < self.n or not 0 <= op.worker < self.fleet.num_old:
                self.fail(f"{op} names an unknown batch or old instance")
            elif op.batch in blocks:
                self.fail(f"batch {op.batch} has more than one block on O")
            else:
                blocks[op.batch] = op
        for i, k in enumerate(self.sched.split):
            block = blocks.get(i)
            if (block is None) != (k == self.L):
                self.fail(f"batch {i} with split {k} has {'no' if block is None else 'a'} O block")
            elif block is not None:
                self.old_block(i, k, block, new_by_batch[i])
        return blocks

    def old_block(self, i: int, k: int, block: OldOp, new: list[NewOp]) -> None:
        inst = self.inst
        if block.first_layer != k + 1:
            self.fail(f"batch {i}: O starts at layer {block.first_layer}, split is {k}")
        if k and len(new) != k:
            return  # its N chain is already reported broken
        handed = new[-1].end_s + inst.handoff_s[i] if k else 0.0
        earliest = max(self.fleet.old_free_at_s[block.worker], inst.release_s[i], handed)
        if block.start_s < earliest - _tol(earliest):
            self.fail(f"batch {i} starts on O at {block.start_s!r}, before {earliest!r}")
        lasts = block.end_s - block.start_s
        if abs(lasts - (self.L - k) * inst.old_layer_s[i]) > _tol(block.end_s):
            self.fail(f"batch {i}: O block lasts {lasts!r}")

    def one_at_a_time(self, name: str, ops: list[tuple[int, float, float]]) -> None:
        by_worker: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for worker, start, end in ops:
            if not (math.isfinite(start) and math.isfinite(end) and start >= 0):
                self.fail(f"{name} operation at {start!r}..{end!r} is not finite and >= 0")
            by_worker[worker].append((start, end))
        for worker, spans in by_worker.items():
            spans.sort()
            for (s0, e0), (s1, e1) in itertools.pairwise(spans):
                if s1 < e0 - _tol(e0):
                    self.fail(f"{name} {worker} runs {s0!r}..{e0!r} and {s1!r}..{e1!r} at once")

    def fifo(self, blocks: dict[int, OldOp]) -> None:
        by_worker: dict[int, list[OldOp]] = defaultdict(list)
        for op in blocks.values():
            by_worker[op.worker].append(op)
        for ops in by_worker.values():
            started = [op.batch for op in sorted(ops, key=lambda op: (op.start_s, op.batch))]
            ordered = sorted(started, key=lambda i: (self.inst.release_s[i], i))
            if started != ordered:
                self.fail(f"old_order='fifo' but O runs batches {started}, release order {ordered}")


def _completion(i: int, blocks: dict[int, OldOp], new: dict[int, list[NewOp]]) -> float:
    """The end of the batch's last layer: its O block, else its last layer on N."""
    if i in blocks:
        return blocks[i].end_s
    return new[i][-1].end_s if new[i] else math.nan


def _objective(inst: LiveScalingInstance, completion: list[float], name: str) -> float:
    latency = [c - r for c, r in zip(completion, inst.release_s, strict=True)]
    late = [lat > s + SLO_TOL_S for lat, s in zip(latency, inst.slo_s or (), strict=False)]
    values = {
        "mean_latency": math.fsum(latency) / len(latency),
        "max_latency": max(latency),
        "makespan": max(completion),
        "slo_violations": float(sum(late)),
    }
    if name == "hard_slo":
        return math.inf if any(late) else values["mean_latency"]
    return values[name]


def _status(check: _Checker, objective: float) -> None:
    sched = check.sched
    if sched.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE) and math.isinf(objective):
        check.fail(f"status {sched.status.name} with an infinite objective")
    if sched.status is SolveStatus.FEASIBLE and (sched.bound is None or sched.gap is None):
        check.fail("status FEASIBLE without a bound and a gap")
    if sched.bound is not None and sched.bound > objective + _tol(objective) * 1e3:
        check.fail(f"bound {sched.bound!r} exceeds the objective {objective!r}")


def validate_schedule(
    instance: LiveScalingInstance, schedule: Schedule, *, fleet: Fleet | None = None
) -> ScheduleReport:
    """Check ``schedule`` against every rule of DESIGN.md section 4 and recompute its objective.

    Rules: every batch runs layers ``1..k_i`` on one new instance, one layer per operation, in
    order, each no earlier than its release, the layer's arrival there (the last layer: the
    head's) and the end of its previous layer; then layers ``k_i+1..L`` as one block on one old
    instance, no earlier than the old instance is free, the release, and the end of layer
    ``k_i`` plus the hand-off; each instance runs one operation at a time; under
    ``schedule.old_order == "fifo"`` O runs blocks in release order. A ``fleet`` describes
    several new and old instances sharing the queue (default: the instance's one of each).
    """
    fleet = instance.fleet() if fleet is None else fleet
    fleet.check_matches(instance)
    if schedule.objective_name not in OBJECTIVES:
        raise InvalidInputError(f"schedule.objective_name {schedule.objective_name!r} is unknown")
    check = _Checker(instance, fleet, schedule)
    if not schedule.has_ops:
        if schedule.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
            check.fail(f"status {schedule.status.name} without a schedule")
        if schedule.new_ops or schedule.old_ops or not math.isinf(schedule.objective):
            check.fail("a schedule without completions must have no operations and objective inf")
        return ScheduleReport(tuple(check.errors), math.inf, ())
    if not check.split():
        return ScheduleReport(tuple(check.errors), math.nan, ())
    new_by_batch = check.new_ops()
    blocks = check.old_ops(new_by_batch)
    check.one_at_a_time("new instance", [(o.worker, o.start_s, o.end_s) for o in schedule.new_ops])
    check.one_at_a_time("old instance", [(o.worker, o.start_s, o.end_s) for o in schedule.old_ops])
    if schedule.old_order == "fifo":
        check.fifo(blocks)
    completion = [_completion(i, blocks, new_by_batch) for i in range(check.n)]
    for i, (ours, theirs) in enumerate(zip(completion, schedule.completion_s, strict=False)):
        if not abs(ours - theirs) <= _tol(ours):
            check.fail(f"batch {i} completes at {ours!r}, the schedule says {theirs!r}")
    if len(schedule.completion_s) != check.n:
        check.fail(f"completion_s has {len(schedule.completion_s)} entries for {check.n} batches")
    objective = _objective(instance, completion, schedule.objective_name)
    reported = schedule.objective
    if not (objective == reported or abs(objective - reported) <= _tol(objective)):
        check.fail(f"objective recomputes to {objective!r}, the schedule says {reported!r}")
    _status(check, objective)
    return ScheduleReport(tuple(check.errors), objective, tuple(completion))


class MeasuredRun(Protocol):
    """What :func:`measured_violations` reads of a run: ``unit_arrival_s`` when each unit was
    complete on the new instance, the rest as in a Schedule, measured."""

    @property
    def release_s(self) -> Sequence[float]: ...
    @property
    def split(self) -> Sequence[int]: ...
    @property
    def new_ops(self) -> Sequence[NewOp]: ...
    @property
    def old_ops(self) -> Sequence[OldOp]: ...
    @property
    def completion_s(self) -> Sequence[float]: ...
    @property
    def unit_arrival_s(self) -> Sequence[float]: ...


def measured_violations(run: MeasuredRun, *, tol_s: float = 1e-6) -> tuple[str, ...]:
    """Rules of DESIGN.md section 4 a measured run (the executor's LiveRun) breaks, its layers
    usable at their measured arrivals and its operations taking what they took.

    Every batch runs layers ``1..k`` on the new instance, in order, each starting after its
    release, its layer's arrival (the embedding's for layer 1, the head's for layer L) and the
    previous layer; the rest as one block on the old instance after the last of those; no two
    operations overlap on one instance; completion is the end of the last operation."""
    problems: list[str] = []
    arrival, L = run.unit_arrival_s, len(run.unit_arrival_s) - 2
    for i, k in enumerate(run.split):
        ops = sorted((op for op in run.new_ops if op.batch == i), key=lambda op: op.layer)
        if [op.layer for op in ops] != list(range(1, k + 1)):
            problems.append(f"batch {i}: new instance ran layers {[op.layer for op in ops]}, k={k}")
            continue
        ready = run.release_s[i]
        for op in ops:
            needed = [arrival[op.layer]] + ([arrival[0]] if op.layer == 1 else [])
            needed += [arrival[-1]] if op.layer == L else []
            if op.start_s < max(ready, *needed) - tol_s:
                problems.append(f"batch {i} layer {op.layer} starts before it could ({op})")
            ready = op.end_s
        blocks = [op for op in run.old_ops if op.batch == i]
        if k < L and (len(blocks) != 1 or blocks[0].first_layer != k + 1):
            problems.append(f"batch {i}: expected one block from layer {k + 1}, got {blocks}")
        elif k == L and blocks:
            problems.append(f"batch {i} finished on the new instance and ran on the old too")
        for block in blocks:
            if block.start_s < ready - tol_s:
                problems.append(f"batch {i}: block starts before its inputs are there ({block})")
            ready = block.end_s
        if abs(run.completion_s[i] - ready) > tol_s:
            problems.append(f"batch {i}: completion {run.completion_s[i]} is not its last end")
    for label, timeline in (("new", run.new_ops), ("old", run.old_ops)):
        spans = sorted((op.start_s, op.end_s, op.batch) for op in timeline)
        for a, b in itertools.pairwise(spans):
            if b[0] < a[1] - tol_s:
                problems.append(f"the {label} instance runs batches {a[2]} and {b[2]} at once")
    return tuple(problems)
