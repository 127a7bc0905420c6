"""Can N carry out a relaxed plan? Windows, the preemptive overload test, and a sequencer.

A relaxed plan (:class:`~blitzplan.live.bound.relaxation.RelaxedPlan`) fixes every batch's split and
O's order and start times, assuming N runs each batch's layers alone. N can carry it out exactly
when its operations fit their windows: layer ``l`` of batch ``i`` starts no earlier than its alone
chain allows (its *release*, which folds in the layer's arrival, the batch's release and the
restriction) and ends no later than its *due* time (the planned O start minus the hand-off, less
the batch's later layers on N; a batch that finishes on N is due at the end of its alone chain).
Within these windows the chain order of a batch's layers comes for free: its layers have equal
lengths and windows that rise with the layer, so any feasible order can be relabelled into one
that keeps each batch's layers in order.

:func:`overload` runs preemptive earliest-due-first: when it misses a due time, the operations
released in the interval it was busy with due ones form a set whose work does not fit there
(Horn's condition), which the exact search branches on. :func:`sequence` looks for a
non-preemptive order by depth-first search over active schedules, earliest due first.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from blitzplan.live.bound.relaxation import Relaxation, RelaxedPlan

__all__ = ["CHECK_OPS_PER_STEP", "NOp", "Overload", "overload", "plan_ops", "sequence"]

CHECK_OPS_PER_STEP = 4
"""The preemptive test on ``m`` operations counts as ``m // CHECK_OPS_PER_STEP`` steps of
:func:`sequence` (it costs about that many choices)."""

_TOL = 1e-9
"""Relative slack on times when deciding that an operation misses its due time."""


class NOp(NamedTuple):
    """Layer ``layer`` of ``batch`` on N: its window and its length."""

    release_s: float
    due_s: float
    length_s: float
    batch: int
    layer: int


class Overload(NamedTuple):
    """Operations released at or after ``start_s`` and due by ``end_s`` whose total work,
    ``work_s``, exceeds ``end_s - start_s``: one of them ends at ``start_s + work_s`` or later."""

    start_s: float
    end_s: float
    work_s: float
    ops: tuple[NOp, ...]


def _late(finish_s: float, due_s: float) -> bool:
    return finish_s > due_s + _TOL * max(1.0, abs(due_s))


def plan_ops(relax: Relaxation, plan: RelaxedPlan) -> list[NOp]:
    """Every operation the plan runs on N, with its window (see the module docstring)."""
    inst, L = relax.instance, relax.instance.num_layers
    ops = []
    for i, k in enumerate(plan.split):
        chain, p = relax.options[i].chain_end, inst.new_layer_s[i]
        due = chain[L] if k == L else plan.planned_old_start_s[i] - inst.handoff_s[i]
        ops += [NOp(chain[j] - p, due - (k - j) * p, p, i, j) for j in range(1, k + 1)]
    return ops


def overload(
    ops: Sequence[NOp], *, from_s: float = -math.inf, worst: bool = False
) -> Overload | None:
    """A set of operations that cannot fit their windows even with preemption (none of them
    starting before ``from_s``), or None: the first found, or with ``worst`` the one of the
    operation that preemptive earliest-due-first ends latest past its due time (its excess
    of work over the interval is the largest of all such sets)."""
    by_release = sorted(ops, key=lambda op: max(op.release_s, from_s))
    release = [max(op.release_s, from_s) for op in by_release]
    ready: list[tuple[float, int]] = []  # (due, index into by_release)
    left = [op.length_s for op in by_release]
    segments: list[tuple[float, float, float]] = []  # (start, end, due of what ran)
    clock, nxt = -math.inf, 0
    latest = (-math.inf, 0, 0.0)  # (lateness, segments until then, due) of the latest so far
    while nxt < len(by_release) or ready:
        if not ready:
            clock = max(clock, release[nxt])
        while nxt < len(by_release) and release[nxt] <= clock:
            heapq.heappush(ready, (by_release[nxt].due_s, nxt))
            nxt += 1
        due, index = ready[0]
        run = min(left[index], (release[nxt] if nxt < len(release) else math.inf) - clock)
        segments.append((clock, clock + run, due))
        clock += run
        left[index] -= run
        if left[index] <= 0.0:
            heapq.heappop(ready)
            if _late(clock, due):
                if not worst:
                    return _overloaded(by_release, release, segments, due)
                if clock - due > latest[0]:
                    latest = (clock - due, len(segments), due)
    if latest[1]:
        return _overloaded(by_release, release, segments[: latest[1]], latest[2])
    return None


def _overloaded(
    ops: Sequence[NOp],
    release: Sequence[float],
    segments: list[tuple[float, float, float]],
    due_s: float,
) -> Overload | None:
    """The interval ending at ``due_s`` in which preemptive EDF ran only work due by then."""
    start = segments[-1][0]
    for seg_start, seg_end, due in reversed(segments):
        if due > due_s or seg_end < start - _TOL * max(1.0, abs(start)):
            break  # something due later ran, or N was idle: the busy interval starts here
        start = seg_start
    inside = tuple(
        op for op, r in zip(ops, release, strict=True) if r >= start and op.due_s <= due_s
    )
    work = math.fsum(op.length_s for op in inside)
    if not _late(start + work, due_s):
        return None  # rounding: nothing provably overloaded
    return Overload(start, due_s, work, inside)


def sequence(
    ops: Sequence[NOp], *, deadline_s: float, max_steps: int
) -> tuple[tuple[int, ...] | None, bool]:
    """(N order as batch indices, proven): an order of ``ops`` that meets every due time.

    Depth-first over active schedules (an operation may start only before the earliest moment
    another could finish), earliest due first. A choice point whose first choice failed is
    pruned when what is left cannot fit even with preemption. The order is None when none
    exists (proven True) or when ``max_steps`` or ``deadline_s`` (a ``time.perf_counter()``
    instant) ran out first (proven False).
    """
    queues = _by_batch(ops)
    position = dict.fromkeys(queues, 0)
    chosen: list[int] = []
    frames = [_Frame(-math.inf, _choices(queues, position, -math.inf))]
    steps = 0
    while frames:
        if len(chosen) == len(ops):
            return tuple(chosen), True
        if time.perf_counter() > deadline_s:  # read before every step and every backtrack:
            return None, False  # backing out of a deep dead end prunes at every level
        frame = frames[-1]
        if frame.tried and not frame.checked:
            steps += _prune(frame, _left(queues, position))
        if not frame.choices:  # every choice here failed: undo the one that led here
            frames.pop()
            if chosen:
                position[chosen.pop()] -= 1
            continue
        steps += 1
        if steps > max_steps:
            return None, False
        batch = frame.choices.pop()
        frame.tried = True
        op = queues[batch][position[batch]]
        chosen.append(batch)
        position[batch] += 1
        finish = max(frame.clock, op.release_s) + op.length_s
        frames.append(_Frame(finish, _choices(queues, position, finish)))
    return None, True


@dataclass
class _Frame:
    """A node of the sequencer's search: N's clock, the batches still to try (best last)."""

    clock: float
    choices: list[int]
    tried: bool = False
    checked: bool = False


def _prune(frame: _Frame, left: list[NOp]) -> int:
    """Drop the frame's choices if ``left`` cannot fit even with preemption from its clock;
    returns what the test costs in steps."""
    frame.checked = True
    if overload(left, from_s=frame.clock) is not None:
        frame.choices.clear()
    return len(left) // CHECK_OPS_PER_STEP


def _left(queues: dict[int, list[NOp]], position: dict[int, int]) -> list[NOp]:
    return [op for b, q in queues.items() for op in q[position[b] :]]


def _by_batch(ops: Sequence[NOp]) -> dict[int, list[NOp]]:
    queues: dict[int, list[NOp]] = {}
    for op in sorted(ops, key=lambda op: (op.batch, op.layer)):
        queues.setdefault(op.batch, []).append(op)
    return queues


def _choices(queues: dict[int, list[NOp]], position: dict[int, int], clock: float) -> list[int]:
    """The batches whose next operation may run next, latest due first (so that ``pop()``
    gives the earliest); none when one of them is already late."""
    heads = [q[position[b]] for b, q in queues.items() if position[b] < len(q)]
    if not heads:
        return []
    starts = [max(clock, op.release_s) for op in heads]
    if any(_late(start + op.length_s, op.due_s) for start, op in zip(starts, heads, strict=True)):
        return []
    soonest = min(start + op.length_s for start, op in zip(starts, heads, strict=True))
    pairs = zip(starts, heads, strict=True)
    active = [(op.due_s, op.batch) for start, op in pairs if start < soonest]
    return [batch for _, batch in sorted(active, reverse=True)]
