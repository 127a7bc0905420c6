"""The floor of a relaxed plan's splits and O order
(:func:`~blitzplan.live.bound.plan_floor.plan_floor`) is at most the objective of every
schedule that keeps them, and meets it where N runs nothing (so a floor 1% larger fails)."""

from __future__ import annotations

import math
import random

import pytest

from blitzplan.live.bound.plan_floor import plan_floor
from blitzplan.live.bound.relaxation import RelaxedPlan, repair
from blitzplan.live.schedule import evaluate_objective, timetable
from tests.test_live_capacity_bound import _crowded
from tests.test_live_pair_bound import _staggered

OBJECTIVES = ("mean_latency", "max_latency", "makespan")


def _plan(rng: random.Random, layers: int, n: int, on_new: float = 0.5) -> RelaxedPlan:
    split = [rng.randint(0, layers) if rng.random() < on_new else 0 for _ in range(n)]
    old = [i for i in range(n) if split[i] < layers]
    rng.shuffle(old)
    return RelaxedPlan(tuple(old), tuple(split), 0.0, (0.0,) * n)


def _n_order(rng: random.Random, split: tuple[int, ...]) -> list[int]:
    """A random order of N's layers (each batch's in order: the timetable numbers them)."""
    order = [i for i, k in enumerate(split) for _ in range(k)]
    rng.shuffle(order)
    return order


@pytest.mark.parametrize("seed", range(3))
def test_no_schedule_of_the_plan_is_below_its_floor(seed: int) -> None:
    rng = random.Random(seed)
    for k in range(60):
        inst = _crowded(rng) if k % 2 else _staggered(rng)
        plan = _plan(rng, inst.num_layers, inst.num_batches)
        for objective in OBJECTIVES:
            floor = plan_floor(inst, plan, objective)
            orders = [list(repair(inst, plan)[1])] + [_n_order(rng, plan.split) for _ in range(5)]
            for new in orders:
                _, _, completion = timetable(inst, plan.split, new, plan.old_sequence)
                assert floor <= evaluate_objective(inst, completion, objective)


@pytest.mark.parametrize("seed", range(2))
def test_the_floor_meets_a_plan_that_leaves_n_idle(seed: int) -> None:
    """Everything on O (N idle) or one batch on N: the floor is the schedule's value, so a
    floor 1% larger would lie above it."""
    rng = random.Random(100 + seed)
    met = 0
    for k in range(40):
        inst = _crowded(rng) if k % 2 else _staggered(rng)
        n, layers = inst.num_batches, inst.num_layers
        split = [0] * n
        if k % 3:
            split[rng.randrange(n)] = rng.randint(1, layers)
        old = [i for i in range(n) if split[i] < layers]
        rng.shuffle(old)
        plan = RelaxedPlan(tuple(old), tuple(split), 0.0, (0.0,) * n)
        new = [i for i in range(n) for _ in range(split[i])]
        _, _, completion = timetable(inst, plan.split, new, plan.old_sequence)
        value = evaluate_objective(inst, completion, "mean_latency")
        floor = plan_floor(inst, plan, "mean_latency")
        assert floor == value
        met += math.isfinite(value) and value > 0
    assert met >= 30
