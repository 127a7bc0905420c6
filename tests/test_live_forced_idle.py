"""N's forced idle time in the pair bound (:mod:`blitzplan.live.bound.forced_idle`) held
against schedules and the exhaustive oracle: no schedule's N runs work ``W`` by ``Z`` with
``a_1 + W`` past a stretch's start ``y_j`` unless ``Z >= a_1 + W + I_j``; the free-order
capacity program with the idle lift never above the enumerated optimum on tiny instances whose
layers land far apart (the root and random split ranges around the optimum's split), and the
same check catching the lift made 1% larger."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound import forced_idle
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.subsets import subset_search
from tests.bound_oracle import free_nodes

TOL = 1e-9


def _sparse(rng: random.Random) -> LiveScalingInstance:
    """Two or three layers landing far apart (N runs out of work between them), two to four
    short batches, some queued late, hand-offs up to a quarter second."""
    layers, n = rng.randint(2, 3), rng.randint(2, 4)
    step = rng.choice([1.0, 1.5, 2.0, 3.0])
    p_new = [rng.choice([0.25, 0.5, 0.75, 1.0, 1.5]) for _ in range(n)]
    p_old = p_new if rng.random() < 0.6 else [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new]
    return LiveScalingInstance(
        [j * step for j in range(layers)],
        sorted(rng.choice([0.0, 0.0, 0.5, 1.0, 2.0]) for _ in range(n)),
        p_new,
        p_old,
        [rng.choice([0.0, 0.05, 0.25]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 0.5, 1.0, 2.0]),
        head_ready_s=(layers - 1) * step + rng.choice([0.0, 0.5]),
    )


def test_no_schedule_runs_past_a_stretch_without_its_idle() -> None:
    """For every schedule the search and the heuristics return on sparse instances, and every
    operation on N (``W`` the work N ended by its end ``Z``): ``a_1 + W > y_j`` implies ``Z >=
    a_1 + W + I_j``; some stretches are reached (else the check is empty)."""
    rng = random.Random(11)
    reached = 0
    for _ in range(60):
        inst = _sparse(rng)
        steps = forced_idle.idle_steps(Relaxation(inst, "mean_latency"))
        a1 = inst.usable_s[0]
        for method in ("zigzag", "best_effort", "stop_the_world"):
            sched = schedule_live(inst, method=method)
            work = 0.0
            for op in sorted(sched.new_ops, key=lambda o: o.end_s):
                work += op.end_s - op.start_s
                for y, idle in steps:
                    if a1 + work > y + TOL:
                        reached += 1
                        assert op.end_s >= a1 + work + idle - TOL, (inst, method, y, idle)
    assert reached >= 50


def _nodes(seed: int, count: int) -> Iterator[tuple[Relaxation, float]]:
    """(restricted relaxation, its least schedule value): per sparse instance, the root and
    two random split ranges around the optimum's split."""
    rng = random.Random(seed)
    return free_nodes((_sparse(rng) for _ in range(count)), rng)


def _check(scale: float = 1.0) -> tuple[int, int, int]:
    """(nodes, nodes the idle lift lifts, nodes above the optimum), the lift times ``scale``."""
    real = forced_idle.idle_extra_s

    def scaled(*args: object) -> np.ndarray:
        return np.asarray(scale * real(*args))  # type: ignore[arg-type]

    tried = lifted = over = 0
    for relax, optimum in _nodes(3, 70):
        upper = relax.obj.scaled(2 * optimum + 10)
        with mock.patch.object(forced_idle, "idle_extra_s", scaled):
            cost, _, _ = subset_search(relax, upper, math.inf, math.inf, capacity=True)
        with mock.patch.object(forced_idle, "FORCED_IDLE", False):
            plain, _, _ = subset_search(relax, upper, math.inf, math.inf, capacity=True)
        bound, without = relax.obj.final(cost), relax.obj.final(plain)
        assert bound >= without - TOL * max(1.0, without)
        tried += 1
        lifted += bound > without + TOL * max(1.0, without)
        over += bound > optimum * (1 + TOL)
    return tried, lifted, over


def test_the_idle_lift_never_exceeds_the_enumerated_optimum() -> None:
    """No node's bound passes the optimum; the idle lift lifts some of them."""
    tried, lifted, over = _check()
    assert over == 0
    assert tried >= 150 and lifted >= 5


def test_the_oracle_check_catches_an_idle_lift_one_percent_larger() -> None:
    """The same check with the lift 1% larger finds bounds above the optimum."""
    _, _, over = _check(1.01)
    assert over > 0


def test_the_idle_steps_of_a_hand_case() -> None:
    """Layers at 0 and 2, two batches of 0.5 s a layer queued at 0: N runs both first layers
    by 1 and waits for the second layer until 2 (the stretch starts at work 1, idle 1), then
    runs both second layers."""
    inst = LiveScalingInstance([0.0, 2.0], [0.0, 0.0], [0.5, 0.5], [0.5, 0.5], 0.0)
    steps = forced_idle.idle_steps(Relaxation(inst, "mean_latency"))
    assert len(steps) == 1
    assert steps[0] == pytest.approx((1.0, 1.0))
