"""The Schedule every method returns, the objectives, and the timetable that times orders.

A schedule is fixed by three choices: the split ``k_i`` of every batch, the order of operations on
N (a sequence of batch indices; the ``j``-th occurrence of batch ``i`` is its layer ``j``) and the
order of the blocks on O. :func:`timetable` starts every operation as early as those orders allow
(a semi-active schedule); an optimal schedule can always be taken to be one, so the exact
backends decode a solver's answer into orders and re-time it here in floating point.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from blitzplan.errors import InvalidInputError
from blitzplan.live.instance import Fleet, LiveScalingInstance
from blitzplan.solvers.backends import SolveStatus

__all__ = [
    "OBJECTIVES",
    "SLO_TOL_S",
    "NewOp",
    "OldOp",
    "Schedule",
    "batch_lower_bounds",
    "build_schedule",
    "check_objective",
    "empty_schedule",
    "evaluate_objective",
    "lower_bound",
    "order_value",
    "relative_gap",
    "time_new",
    "time_old",
    "timetable",
]

OBJECTIVES: dict[str, str] = {
    "mean_latency": "mean of C_i - r_i over batches (the default)",
    "max_latency": "largest C_i - r_i",
    "slo_violations": "number of batches with C_i - r_i > slo_i (needs slo_s)",
    "makespan": "largest C_i",
    "hard_slo": "mean latency with every batch within its SLO; INFEASIBLE when impossible "
    "(needs slo_s)",
}
"""The closed table of objectives ``schedule_live`` minimises."""

SLO_TOL_S = 1e-9
"""A batch meets its SLO when ``C_i - r_i <= slo_i + SLO_TOL_S`` (1 ns of float slack)."""


class NewOp(NamedTuple):
    """Layer ``layer`` (1-based) of batch ``batch`` on new instance ``worker``."""

    batch: int
    layer: int
    start_s: float
    end_s: float
    worker: int = 0


class OldOp(NamedTuple):
    """Layers ``first_layer..L`` of ``batch`` as one uninterrupted block on old ``worker``."""

    batch: int
    first_layer: int
    start_s: float
    end_s: float
    worker: int = 0


@dataclass(frozen=True)
class Schedule:
    """What every method returns.

    ``split[i]`` layers of batch ``i`` run on N, the rest on O. ``objective`` is the value of
    ``objective_name`` for these times. ``status`` is OPTIMAL only when proven (within the
    backend's relative gap tolerance); FEASIBLE carries ``bound`` (a proven lower bound) and
    ``gap`` = (objective - bound) / objective; INFEASIBLE, ERROR and UNKNOWN may carry no
    operations and an infinite objective. ``solve_s`` is the wall time of the call;
    ``old_order`` ("free" or "fifo") is the rule O's order was chosen under.
    """

    split: tuple[int, ...]
    new_ops: tuple[NewOp, ...]
    old_ops: tuple[OldOp, ...]
    completion_s: tuple[float, ...]
    objective: float
    status: SolveStatus
    solve_s: float = field(compare=False)  # wall time: not part of what equality sees
    method: str
    objective_name: str = "mean_latency"
    old_order: str = "free"
    bound: float | None = None
    gap: float | None = None
    backend: str | None = None
    message: str = ""

    @property
    def has_ops(self) -> bool:
        """Whether the schedule places every batch (False for INFEASIBLE / ERROR answers)."""
        return bool(self.completion_s)

    def new_sequence(self) -> tuple[int, ...]:
        """Batch of every N operation in start order (what :func:`timetable` takes)."""
        ops = sorted(self.new_ops, key=lambda op: (op.start_s, op.batch, op.layer))
        return tuple(op.batch for op in ops)

    def old_sequence(self) -> tuple[int, ...]:
        """Batches of the O blocks in start order."""
        return tuple(op.batch for op in sorted(self.old_ops, key=lambda op: (op.start_s, op.batch)))

    def latency_s(self, instance: LiveScalingInstance) -> tuple[float, ...]:
        """``C_i - r_i`` per batch."""
        return tuple(c - r for c, r in zip(self.completion_s, instance.release_s, strict=True))


def check_objective(objective: str, instance: LiveScalingInstance) -> None:
    """Raise unless ``objective`` is in :data:`OBJECTIVES` and the instance has what it needs."""
    if objective not in OBJECTIVES:
        raise InvalidInputError(
            f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}"
        )
    if objective in ("slo_violations", "hard_slo") and instance.slo_s is None:
        raise InvalidInputError(f"objective {objective!r} needs an instance with slo_s, got None")


def evaluate_objective(
    instance: LiveScalingInstance, completion_s: Sequence[float], objective: str
) -> float:
    """The objective's value for these completion times (inf for a missed hard SLO)."""
    latency = [c - r for c, r in zip(completion_s, instance.release_s, strict=True)]
    if objective == "mean_latency":
        return sum(latency) / len(latency)
    if objective == "max_latency":
        return max(latency)
    if objective == "makespan":
        return max(completion_s)
    slo = instance.slo_s or ()
    late = sum(1 for lat, s in zip(latency, slo, strict=True) if lat > s + SLO_TOL_S)
    if objective == "slo_violations":
        return float(late)
    return math.inf if late else sum(latency) / len(latency)


def order_value(
    instance: LiveScalingInstance,
    split: Sequence[int],
    new_sequence: Iterable[int],
    old_sequence: Iterable[int],
    objective: str,
) -> float:
    """The objective's value of the schedule the split and the two orders make
    (:func:`timetable`)."""
    completion = timetable(instance, split, new_sequence, old_sequence)[2]
    return evaluate_objective(instance, completion, objective)


def relative_gap(objective: float, bound: float | None) -> float | None:
    """(objective - bound) / |objective|; 0 when they meet, inf for an infinite objective."""
    if bound is None:
        return None
    if math.isinf(objective):
        return math.inf
    if objective <= bound:
        return 0.0
    return (objective - bound) / max(abs(objective), 1e-12)


def timetable(
    instance: LiveScalingInstance,
    split: Sequence[int],
    new_sequence: Iterable[int],
    old_sequence: Iterable[int],
) -> tuple[tuple[NewOp, ...], tuple[OldOp, ...], tuple[float, ...]]:
    """Start every operation as early as the split and the two orders allow.

    ``new_sequence`` lists a batch once per layer it runs on N, in N's order; ``old_sequence``
    lists every batch with ``split[i] < L`` once, in O's order.
    """
    new_ops, new_end = time_new(instance, split, new_sequence)
    old_ops, completion = time_old(instance, split, old_sequence, new_end)
    return new_ops, old_ops, tuple(completion)


def time_new(
    instance: LiveScalingInstance, split: Sequence[int], new_sequence: Iterable[int]
) -> tuple[tuple[NewOp, ...], list[float]]:
    """N's part of :func:`timetable`: its operations, each as early as N's order allows, and
    each batch's end on N (its release when it runs no layer there)."""
    ready, p_new = instance.usable_s, instance.new_layer_s
    done = [0] * instance.num_batches
    last_end = list(instance.release_s)
    clock = 0.0
    new_ops = []
    for batch in new_sequence:
        layer = done[batch] + 1
        if layer > split[batch]:
            raise InvalidInputError(
                f"new_sequence runs batch {batch} more than split[{batch}]={split[batch]} times"
            )
        start = max(clock, ready[layer - 1], last_end[batch])
        clock = last_end[batch] = start + p_new[batch]
        done[batch] = layer
        new_ops.append(NewOp(batch, layer, start, clock))
    if done != list(split):
        raise InvalidInputError(f"new_sequence runs layers {done}, the split is {list(split)}")
    return tuple(new_ops), last_end


def time_old(
    instance: LiveScalingInstance,
    split: Sequence[int],
    old_sequence: Iterable[int],
    new_end: Sequence[float],
) -> tuple[tuple[OldOp, ...], list[float]]:
    """O's part of :func:`timetable`: its blocks in O's order, each as early as O, its batch's
    release and its hand-off allow (``new_end``: each batch's end on N, :func:`time_new`), and
    every batch's completion (``new_end`` for the batches N finishes)."""
    L, release = instance.num_layers, instance.release_s
    completion = list(new_end)
    clock = instance.old_free_at_s
    old_ops = []
    for batch in old_sequence:
        k = split[batch]
        if k >= L:
            raise InvalidInputError(f"old_sequence lists batch {batch}, which finishes on N")
        start = max(clock, release[batch], new_end[batch] + instance.handoff_s[batch] * (k > 0))
        clock = completion[batch] = start + (L - k) * instance.old_layer_s[batch]
        old_ops.append(OldOp(batch, k + 1, start, clock))
    if len(old_ops) != sum(1 for k in split if k < L):
        raise InvalidInputError(f"old_sequence {list(old_sequence)} misses a batch with split < L")
    return tuple(old_ops), completion


def build_schedule(
    instance: LiveScalingInstance,
    split: Sequence[int],
    new_sequence: Iterable[int],
    old_sequence: Iterable[int],
    *,
    objective: str,
    method: str,
    status: SolveStatus,
    solve_s: float,
    old_order: str = "free",
    bound: float | None = None,
    backend: str | None = None,
    message: str = "",
) -> Schedule:
    """Time the orders, evaluate the objective and wrap everything in a Schedule."""
    new_ops, old_ops, completion = timetable(instance, split, new_sequence, old_sequence)
    value = evaluate_objective(instance, completion, objective)
    if math.isinf(value) and status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        status = SolveStatus.UNKNOWN
    if bound is not None and status is SolveStatus.OPTIMAL:
        bound = min(bound, value)
    return Schedule(
        split=tuple(split),
        new_ops=new_ops,
        old_ops=old_ops,
        completion_s=completion,
        objective=value,
        status=status,
        solve_s=solve_s,
        method=method,
        objective_name=objective,
        old_order=old_order,
        bound=bound,
        gap=relative_gap(value, bound),
        backend=backend,
        message=message,
    )


def empty_schedule(
    *,
    status: SolveStatus,
    objective: str,
    method: str,
    solve_s: float,
    old_order: str = "free",
    backend: str | None = None,
    message: str = "",
) -> Schedule:
    """The answer without a schedule: INFEASIBLE, ERROR, or UNKNOWN with nothing found."""
    return Schedule(
        split=(),
        new_ops=(),
        old_ops=(),
        completion_s=(),
        objective=math.inf,
        status=status,
        solve_s=solve_s,
        method=method,
        objective_name=objective,
        old_order=old_order,
        backend=backend,
        message=message,
    )


def batch_lower_bounds(
    instance: LiveScalingInstance, *, fleet: Fleet | None = None
) -> tuple[float, ...]:
    """The earliest each batch could complete with a new and an old instance to itself.

    With a ``fleet``, the best over its pairs of new and old instances.
    """
    fleet = instance.fleet() if fleet is None else fleet
    return tuple(
        min(
            _alone_s(instance, i, fleet.usable_s(w), old_free)
            for w in range(fleet.num_new)
            for old_free in fleet.old_free_at_s
        )
        for i in range(instance.num_batches)
    )


def _alone_s(
    instance: LiveScalingInstance, i: int, usable: Sequence[float], old_free_at_s: float
) -> float:
    L, release = instance.num_layers, instance.release_s[i]
    p_new, p_old = instance.new_layer_s[i], instance.old_layer_s[i]
    start_old = max(old_free_at_s, release)
    best = start_old + L * p_old
    end_new = release
    for k in range(1, L + 1):
        end_new = max(end_new, usable[k - 1]) + p_new
        if k == L:
            best = min(best, end_new)
        else:
            handed = max(start_old, end_new + instance.handoff_s[i])
            best = min(best, handed + (L - k) * p_old)
    return best


def lower_bound(instance: LiveScalingInstance, objective: str) -> float:
    """A cheap valid lower bound on ``objective``: every batch alone on both instances.

    Every objective is non-decreasing in the completion times, so it is the objective of the
    per-batch bounds; an infinite value proves a hard SLO infeasible.
    """
    return evaluate_objective(instance, batch_lower_bounds(instance), objective)
