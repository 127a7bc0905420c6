"""The schedule validator: it accepts a valid schedule and catches every kind of broken one."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from blitzplan import Fleet, LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live import NewOp, OldOp, Schedule
from blitzplan.solvers import SolveStatus

# L=2, three batches at 0, 1 s per layer, hand-off 0.5 s, layers land at 1 and 2 (head at 2).
INSTANCE = LiveScalingInstance([1.0, 2.0], [0.0, 0.0, 0.0], 1.0, 1.0, 0.5)


def _valid() -> Schedule:
    """b0 on O 0..2; b1: layer 1 on N 1..2, hand-off 0.5, layer 2 on O 2.5..3.5; b2 on N 2..4."""
    return Schedule(
        split=(0, 1, 2),
        new_ops=(NewOp(1, 1, 1.0, 2.0), NewOp(2, 1, 2.0, 3.0), NewOp(2, 2, 3.0, 4.0)),
        old_ops=(OldOp(0, 1, 0.0, 2.0), OldOp(1, 2, 2.5, 3.5)),
        completion_s=(2.0, 3.5, 4.0),
        objective=(2.0 + 3.5 + 4.0) / 3,
        status=SolveStatus.FEASIBLE,
        solve_s=0.0,
        method="hand",
        bound=1.0,
        gap=1 - 3 / 9.5,
    )


def test_a_hand_built_schedule_is_valid() -> None:
    report = validate_schedule(INSTANCE, _valid())
    assert report.ok, report.violations
    assert report.objective == pytest.approx(9.5 / 3)
    assert report.completion_s == (2.0, 3.5, 4.0)


def _with_new(ops: tuple[NewOp, ...], **changes: object) -> Schedule:
    return replace(_valid(), new_ops=ops, **changes)  # type: ignore[arg-type]


BROKEN = {
    "layer before its arrival": _with_new(
        (NewOp(1, 1, 0.5, 1.5), NewOp(2, 1, 2.0, 3.0), NewOp(2, 2, 3.0, 4.0))
    ),
    "two layers at once on N": _with_new(
        (NewOp(1, 1, 1.0, 2.0), NewOp(2, 1, 1.5, 2.5), NewOp(2, 2, 3.0, 4.0))
    ),
    "wrong layer length": _with_new(
        (NewOp(1, 1, 1.0, 2.0), NewOp(2, 1, 2.0, 2.5), NewOp(2, 2, 3.0, 4.0))
    ),
    "layers out of order": _with_new(
        (NewOp(1, 1, 1.0, 2.0), NewOp(2, 2, 2.0, 3.0), NewOp(2, 1, 3.0, 4.0))
    ),
    "a layer missing on N": _with_new((NewOp(1, 1, 1.0, 2.0), NewOp(2, 1, 2.0, 3.0))),
    "hand-off too early": replace(
        _valid(),
        old_ops=(OldOp(0, 1, 0.0, 2.0), OldOp(1, 2, 2.2, 3.2)),
        completion_s=(2.0, 3.2, 4.0),
    ),
    "two blocks at once on O": replace(
        _valid(),
        old_ops=(OldOp(0, 1, 0.0, 2.0), OldOp(1, 2, 1.5, 2.5)),
        completion_s=(2.0, 2.5, 4.0),
    ),
    "O before it is free": replace(
        _valid(),
        old_ops=(OldOp(0, 1, -0.5, 1.5), OldOp(1, 2, 2.5, 3.5)),
        completion_s=(1.5, 3.5, 4.0),
    ),
    "wrong first layer on O": replace(
        _valid(), old_ops=(OldOp(0, 1, 0.0, 2.0), OldOp(1, 1, 2.5, 3.5))
    ),
    "missing O block": replace(_valid(), old_ops=(OldOp(0, 1, 0.0, 2.0),)),
    "split out of range": replace(_valid(), split=(0, 1, 3)),
    "wrong completion": replace(_valid(), completion_s=(2.0, 3.5, 3.9)),
    "wrong objective": replace(_valid(), objective=3.0),
    "FEASIBLE without a bound": replace(_valid(), bound=None, gap=None),
    "bound above the objective": replace(_valid(), bound=4.0),
    "OPTIMAL without operations": replace(
        _valid(), new_ops=(), old_ops=(), completion_s=(), split=(), status=SolveStatus.OPTIMAL
    ),
    "fifo broken": replace(
        _valid(),
        old_order="fifo",
        split=(0, 1, 0),
        new_ops=(NewOp(1, 1, 1.0, 2.0),),
        old_ops=(OldOp(1, 2, 2.5, 3.5), OldOp(0, 1, 3.5, 5.5), OldOp(2, 1, 5.5, 7.5)),
        completion_s=(5.5, 3.5, 7.5),
        objective=(5.5 + 3.5 + 7.5) / 3,
    ),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_every_broken_schedule_is_caught(name: str) -> None:
    report = validate_schedule(INSTANCE, BROKEN[name])
    assert not report.ok, f"{name} passed the validator"


def test_the_same_blocks_are_valid_under_a_free_order() -> None:
    """The fifo case above is a valid schedule when O's order is free."""
    report = validate_schedule(INSTANCE, replace(BROKEN["fifo broken"], old_order="free"))
    assert report.ok, report.violations


def test_head_arrival_gates_the_last_layer_on_new() -> None:
    """With the head at 5, b2's layer 2 may not start at 3 any more."""
    late_head = LiveScalingInstance([1.0, 2.0], [0.0] * 3, 1.0, 1.0, 0.5, head_ready_s=5.0)
    assert not validate_schedule(late_head, _valid()).ok


def test_an_answer_without_a_schedule_needs_an_infinite_objective() -> None:
    empty = replace(
        _valid(), split=(), new_ops=(), old_ops=(), completion_s=(), status=SolveStatus.INFEASIBLE
    )
    assert not validate_schedule(INSTANCE, empty).ok
    assert validate_schedule(INSTANCE, replace(empty, objective=math.inf)).ok


def test_fleet_rules_are_checked_per_instance() -> None:
    """Two new instances: a batch may not move between them, and each has its own arrivals."""
    fleet = Fleet(new_layer_ready_s=[[1.0, 2.0], [3.0, 4.0]], old_free_at_s=[0.0])
    moved = replace(
        _valid(), new_ops=(NewOp(1, 1, 1.0, 2.0), NewOp(2, 1, 2.0, 3.0), NewOp(2, 2, 3.0, 4.0, 1))
    )
    report = validate_schedule(INSTANCE, moved, fleet=fleet)
    assert any("several new instances" in v for v in report.violations)
    assert any("before" in v for v in report.violations)  # layer 2 lands at 4 on instance 1


def test_heuristic_outputs_validate_and_their_objective_is_recomputed() -> None:
    for method in ("stop_the_world", "best_effort", "zigzag"):
        schedule = schedule_live(INSTANCE, method=method)
        report = validate_schedule(INSTANCE, schedule)
        assert report.ok, report.violations
        assert report.objective == pytest.approx(schedule.objective, rel=1e-12)
