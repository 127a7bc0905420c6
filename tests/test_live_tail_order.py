"""The batches a schedule finishes on N, re-ordered there (:mod:`blitzplan.live.tail_order`):
the order returned is a schedule the independent checker passes, at the value returned, below
the schedule's; the operations of the batches O takes over start no later than before; and on
a schedule whose two batches on N share N layer by layer, shortest first is found."""

from __future__ import annotations

import random

import pytest

from blitzplan import LiveScalingInstance
from blitzplan.live.exact.common import decode, start_point
from blitzplan.live.schedule import evaluate_objective, timetable
from blitzplan.live.tail_order import reorder_tail
from tests.improved_check import checked_better


def _interleaved() -> tuple[LiveScalingInstance, list[int], list[int], list[int]]:
    """Two layers, both usable at once; batches 0 and 1 (1 s and 2 s a layer) finish on N,
    alternating layer by layer (ends 4 s and 6 s); batch 2 runs on O alone."""
    inst = LiveScalingInstance(
        [0.0, 0.0], [0.0, 0.0, 0.0], [1.0, 2.0, 1.0], [1.0, 2.0, 1.0], [0.1] * 3
    )
    return inst, [2, 2, 0], [0, 1, 0, 1], [2]


def test_shortest_first_found_on_interleaved_batches() -> None:
    inst, split, new, old = _interleaved()
    value = evaluate_objective(inst, timetable(inst, split, new, old)[2], "mean_latency")
    found = reorder_tail(inst, split, new, old, "mean_latency", value)
    assert found is not None
    order, better = found
    assert order == (0, 0, 1, 1)
    assert better == pytest.approx((2.0 + 6.0 + 2.0) / 3)
    assert better < value
    assert reorder_tail(inst, split, list(order), old, "mean_latency", better) is None


def _random_case(seed: int) -> tuple[LiveScalingInstance, list[int], list[int], list[int]]:
    """3-6 layers, 3-5 batches, a random split (some batches finishing on N), a random
    interleaving of N's layers and O in release order."""
    rng = random.Random(seed)
    L, n = rng.randint(3, 6), rng.randint(3, 5)
    p = [rng.choice([0.2, 0.5, 1.0, 1.5, 2.5]) for _ in range(n)]
    inst = LiveScalingInstance(
        sorted(rng.uniform(0.0, 3.0) for _ in range(L)),
        sorted(rng.choice([0.0, 0.0, 0.5, 1.0]) for _ in range(n)),
        p,
        p,
        [rng.choice([0.0, 0.1, 0.3]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 1.0, 3.0]),
    )
    split = [rng.choice([L, L, rng.randint(0, L - 1)]) for _ in range(n)]
    left = list(split)
    new: list[int] = []
    while any(left):
        batch = rng.choice([b for b in range(n) if left[b]])
        left[batch] -= 1
        new.append(batch)
    old = [b for b in range(n) if split[b] < L]
    return inst, split, new, old


@pytest.mark.parametrize("every_order", [True, False])
def test_reordered_schedules_are_valid_better_and_keep_o(every_order: bool) -> None:
    improved = 0
    for seed in range(300):
        inst, split, new, old = _random_case(seed)
        new_ops, old_ops, completion = timetable(inst, split, new, old)
        value = evaluate_objective(inst, completion, "mean_latency")
        found = reorder_tail(inst, split, new, old, "mean_latency", value, every_order=every_order)
        if found is None:
            continue
        improved += 1
        order, better = found
        schedule = checked_better(inst, (split, order, old), "mean_latency", better, value)
        kept = [op for op in new_ops if split[op.batch] < inst.num_layers]
        moved = {(op.batch, op.layer): op.start_s for op in schedule.new_ops}
        assert all(moved[op.batch, op.layer] <= op.start_s + 1e-9 for op in kept)
        for before, after in zip(old_ops, schedule.old_ops, strict=True):
            assert after.batch == before.batch
            assert after.end_s <= before.end_s + 1e-9
    assert improved >= 20  # the cases exercise it


def test_an_offered_schedule_is_kept_reordered() -> None:
    """The exact backends' incumbent takes an offered schedule with its batches on N
    re-ordered (:meth:`~blitzplan.live.exact.common.Start.offer`)."""
    inst, split, new, old = _interleaved()
    start = start_point(
        inst,
        objective="mean_latency",
        old_order="fifo",
        backend="bnb",
        time_limit_s=None,
        hint=None,
        relax=False,
        warm=False,
    )
    start.offer(decode(inst, split, new, old, "mean_latency", "fifo", "bnb"))
    assert start.incumbent.new_sequence() == (0, 0, 1, 1)
    assert start.incumbent.objective == pytest.approx(10.0 / 3)
