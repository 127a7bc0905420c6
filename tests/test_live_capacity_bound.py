"""The capacity bound (:func:`blitzplan.live.relaxation_dp.capacity_bound`): a hand-computed
case, and the bound held against the exhaustive oracle on random tiny instances, in both O
orders and for every objective; uncut, it is never below the N-capacity relaxation."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.relaxation import Relaxation
from blitzplan.live.relaxation_dp import capacity_bound, solve_relaxation
from blitzplan.live.relaxation_work import work_bound
from blitzplan.live.schedule import OBJECTIVES
from tests.test_live_properties import instances


def test_four_unit_batches_on_two_instances_meet_the_optimum() -> None:
    """One layer usable at 0, four batches of 1 s queued at 0, O free, no hand-off: the optimum
    ends them at 1, 1, 2, 2 (mean 1.5). Alone each ends at 1 (the N-capacity relaxation: 1.0);
    SRPT on a merged machine gives 1.375. With the capacity conditions, the batches left on N
    end at 1, 2, ... and those on O at 1, 2, ...: 1.5, the optimum, in both orders."""
    inst = LiveScalingInstance([0.0], [0.0] * 4, 1.0, 1.0, 0.0)
    relaxed, _, _ = solve_relaxation(Relaxation(inst, "mean_latency"), old_order="free")
    assert relaxed / 4 == pytest.approx(1.0)
    assert work_bound(inst, "mean_latency") == pytest.approx(1.375)
    for order in ("free", "fifo"):
        assert capacity_bound(inst, old_order=order) == pytest.approx(1.5)
    assert schedule_live(inst, method="exact").objective == pytest.approx(1.5)


def test_shared_work_delays_the_later_blocks_on_old() -> None:
    """Two layers usable at 0, batches of 2, 1 and 2 s a layer at 0, O free at 1, no hand-off,
    no head before 100 (every batch ends on O). Alone on N each batch has layer 1 done at 2, 1,
    2: the N-capacity relaxation serves O in the order 1, 0, 2 with one layer each on N, ending
    at 2, 4, 6 (mean 4). Shared work: O's j-th block ends no earlier than ``1 + w - x*`` with
    ``w`` the whole work so far and ``x* = (1 + w - pO_j) / 2`` (N from 0 runs the rest): 2,
    then 6 - 2.5 = 4.5, then 10 - 4.5 = 6.5 (mean 13/3); the optimum is 14/3."""
    inst = LiveScalingInstance(
        [0.0, 0.0],
        [0.0] * 3,
        [2.0, 1.0, 2.0],
        [2.0, 1.0, 2.0],
        0.0,
        old_free_at_s=1.0,
        head_ready_s=100.0,
    )
    plain, _, _ = solve_relaxation(Relaxation(inst, "mean_latency"), old_order="free")
    assert plain / 3 == pytest.approx(4.0)
    assert capacity_bound(inst) == pytest.approx(13 / 3)
    oracle = schedule_live(inst, method="exact", backend="enumerate")
    assert oracle.objective == pytest.approx(14 / 3)


@settings(max_examples=200, deadline=None)
@given(
    instances(max_layers=4, max_batches=4),
    st.sampled_from(sorted(OBJECTIVES)),
    st.sampled_from(["free", "fifo"]),
)
def test_the_capacity_bound_never_exceeds_the_enumerated_optimum(
    instance: LiveScalingInstance, objective: str, old_order: str
) -> None:
    """Property: over every schedule (the exhaustive oracle), none is better than the bound;
    uncut, it is at least the N-capacity relaxation's optimum."""
    assume(count_schedules(instance, old_order=old_order) <= 3_000)
    oracle = schedule_live(
        instance, method="exact", backend="enumerate", objective=objective, old_order=old_order
    )
    assume(math.isfinite(oracle.objective))
    bound = capacity_bound(instance, objective=objective, old_order=old_order)
    assert bound <= oracle.objective + 1e-9 * max(1.0, abs(oracle.objective))
    relax = Relaxation(instance, objective)
    plain, _, _ = solve_relaxation(relax, old_order=old_order)
    assert bound >= relax.obj.final(plain) - 1e-9 * max(1.0, abs(bound))
