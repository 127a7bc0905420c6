"""Split jumps (:mod:`blitzplan.live.split_jump`): what they return is a schedule the independent
checker passes (O's order still FIFO under FIFO), at the value returned, below the schedule's;
on a hand case where every split within the local search's reach of a batch is worse, the jump
to O finds the better schedule, and the polish of every exact backend gets it too."""

from __future__ import annotations

import math
import random

import pytest

from blitzplan import LiveScalingInstance, validate_schedule
from blitzplan.live.improve import polish
from blitzplan.live.schedule import evaluate_objective, timetable
from blitzplan.live.split_jump import jump_splits
from tests.improved_check import built, checked_better


def _stuck() -> tuple[LiveScalingInstance, list[int], list[int], list[int]]:
    """Eight layers usable at 0, O free, all released at 0. Batch 0 (0.5 s a layer on N) and
    batch 1 (1 s) finish on N, batch 1 after batch 0 (ends 4 s and 12 s); batch 2 runs on O
    (0.5 s a layer: 0-4 s). Batch 1 with ``k`` layers on N, ``0 < k < 8``, holds batch 2
    behind its N work (FIFO); whole on O it ends at 4 s and batch 2 at 8 s."""
    inst = LiveScalingInstance([0.0] * 8, [0.0] * 3, [0.5, 1.0, 0.5], [0.5, 0.5, 0.5], [0.0] * 3)
    return inst, [8, 8, 0], [0] * 8 + [1] * 8, [2]


def test_a_batch_jumps_whole_to_o() -> None:
    inst, split, new, old = _stuck()
    value = evaluate_objective(inst, timetable(inst, split, new, old)[2], "mean_latency")
    assert value == pytest.approx(20.0 / 3)
    for k in range(1, 8):  # every partial split of batch 1 is worse: no small step helps
        part = [8, k, 0]
        order = [0] * 8 + [1] * k
        assert (
            evaluate_objective(inst, timetable(inst, part, order, [1, 2])[2], "mean_latency")
            > value
        )
    found = jump_splits(inst, split, new, old, "mean_latency", value, deadline_s=math.inf)
    assert found is not None
    jumped, order, blocks, better = found
    assert (jumped, blocks) == ([8, 0, 0], [1, 2])
    assert better == pytest.approx(16.0 / 3)
    assert validate_schedule(inst, built(inst, jumped, order, blocks, old_order="fifo")).ok
    assert (
        jump_splits(inst, jumped, order, blocks, "mean_latency", better, deadline_s=math.inf)
        is None
    )


def test_the_polish_jumps() -> None:
    """:func:`~blitzplan.live.improve.polish` (every exact backend's incumbent) jumps first."""
    inst, split, new, old = _stuck()
    start = built(inst, split, new, old, old_order="fifo")
    found = polish(
        inst, start, objective="mean_latency", old_order="fifo", deadline_s=math.inf, max_moves=0
    )
    assert found.value == pytest.approx(16.0 / 3)


def _random_case(seed: int) -> tuple[LiveScalingInstance, list[int], list[int], list[int]]:
    """4-8 layers, 3-6 batches, a random split, a random interleaving of N's layers, O's
    blocks in release order."""
    rng = random.Random(seed)
    L, n = rng.randint(4, 8), rng.randint(3, 6)
    p_new = [rng.choice([0.2, 0.5, 1.0, 2.5]) for _ in range(n)]
    p_old = [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new]
    inst = LiveScalingInstance(
        sorted(rng.uniform(0.0, 3.0) for _ in range(L)),
        sorted(rng.choice([0.0, 0.0, 0.5, 2.0]) for _ in range(n)),
        p_new,
        p_old,
        [rng.choice([0.0, 0.1, 0.3]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 1.0, 3.0]),
    )
    split = [rng.choice([L, L, 0, rng.randint(0, L)]) for _ in range(n)]
    left = list(split)
    new: list[int] = []
    while any(left):
        batch = rng.choice([b for b in range(n) if left[b]])
        left[batch] -= 1
        new.append(batch)
    return inst, split, new, [b for b in inst.fifo_order if split[b] < L]


@pytest.mark.parametrize("objective", ["mean_latency", "makespan"])
def test_jumped_schedules_are_valid_and_better(objective: str) -> None:
    improved = 0
    for seed in range(300):
        inst, split, new, old = _random_case(seed)
        value = evaluate_objective(inst, timetable(inst, split, new, old)[2], objective)
        found = jump_splits(inst, split, new, old, objective, value, deadline_s=math.inf)
        if found is None:
            continue
        improved += 1
        jumped, order, blocks, better = found
        checked_better(inst, (jumped, order, blocks), objective, better, value, old_order="fifo")
    assert improved >= 50  # the cases exercise it
