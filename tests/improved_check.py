"""The check a schedule improver's answer passes: the schedule its orders make is valid, is
worth what the improver said, and beats the schedule it started from."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from blitzplan import LiveScalingInstance, validate_schedule
from blitzplan.live.schedule import Schedule, build_schedule
from blitzplan.solvers import SolveStatus


def built(
    inst: LiveScalingInstance,
    split: Sequence[int],
    new: Sequence[int],
    old: Sequence[int],
    *,
    objective: str = "mean_latency",
    old_order: str = "free",
) -> Schedule:
    """The schedule of ``split``, N's order ``new`` and O's order ``old``, timed, unsettled."""
    return build_schedule(
        inst,
        split,
        new,
        old,
        objective=objective,
        method="exact",
        old_order=old_order,
        status=SolveStatus.UNKNOWN,
        solve_s=0.0,
    )


def checked_better(
    inst: LiveScalingInstance,
    orders: tuple[Sequence[int], Sequence[int], Sequence[int]],
    objective: str,
    better: float,
    value: float,
    *,
    old_order: str = "free",
) -> Schedule:
    """The schedule of ``orders`` (split, N order, O order), checked: valid, its objective
    ``better`` (the improver's claim), below ``value`` (the schedule it started from)."""
    schedule = built(inst, *orders, objective=objective, old_order=old_order)
    assert validate_schedule(inst, schedule).ok
    assert schedule.objective == pytest.approx(better, rel=1e-12)
    assert better < value
    return schedule
