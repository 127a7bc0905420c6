"""The work relaxation (:mod:`blitzplan.live.bound.work`): a hand-computed case, and the
bound held against the exhaustive oracle on random tiny instances."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live import relaxation_bound
from blitzplan.live.bound.dp import solve_relaxation
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.work import work_bound
from blitzplan.live.exact.enumerate import count_schedules
from tests.test_live_properties import instances


def test_four_unit_batches_on_two_instances() -> None:
    """One layer usable at 0, four batches of 1 s queued at 0, O free, no hand-off. Each batch
    alone ends at 1 (the N-capacity relaxation: mean latency 1); two instances end them at 1,
    1, 2, 2 (the optimum, 1.5). SRPT on the merged machine of speed 2 ends them at 0.5, 1, 1.5,
    2; with each at least 1: (1 + 1 + 1.5 + 2) / 4 = 1.375; the makespan is at least 2."""
    inst = LiveScalingInstance([0.0], [0.0] * 4, 1.0, 1.0, 0.0)
    relaxed, _, complete = solve_relaxation(Relaxation(inst, "mean_latency"), old_order="free")
    assert complete and relaxed / 4 == pytest.approx(1.0)
    assert work_bound(inst, "mean_latency") == pytest.approx(1.375)
    assert work_bound(inst, "makespan") == pytest.approx(2.0)
    assert work_bound(inst, "max_latency") == -math.inf
    assert relaxation_bound(inst)[0] == pytest.approx(1.375)
    best = schedule_live(inst, method="exact")
    assert best.objective == pytest.approx(1.5)


def test_the_new_instance_waits_for_its_first_layer() -> None:
    """N is no help before its first layer (at 10): one 2 s batch on O from 0 ends at 2."""
    inst = LiveScalingInstance([10.0], [0.0], 2.0, 2.0, 0.0)
    assert work_bound(inst, "makespan") == pytest.approx(2.0)


@settings(max_examples=150)
@given(instances(max_layers=4, max_batches=4), st.sampled_from(["mean_latency", "makespan"]))
def test_the_work_bound_never_exceeds_the_enumerated_optimum(instance, objective: str) -> None:
    """Property: over every schedule (the exhaustive oracle), none is better than the bound."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate", objective=objective)
    assume(math.isfinite(oracle.objective))
    bound = work_bound(instance, objective)
    assert bound <= oracle.objective + 1e-9 * max(1.0, abs(oracle.objective))
