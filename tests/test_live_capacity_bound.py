"""The capacity bound (:func:`blitzplan.live.bound.dp.capacity_bound`): a hand-computed
case, and the bound held against the exhaustive oracle on random tiny instances, in both O
orders and for every objective; uncut, it is never below the N-capacity relaxation."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound import served_blocks
from blitzplan.live.bound.conditions import Layer
from blitzplan.live.bound.dp import capacity_bound, solve_relaxation
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.work import work_bound
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.schedule import OBJECTIVES, Schedule
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


def test_a_batch_left_on_new_shares_new_with_the_served_prefix() -> None:
    """Two layers usable at 0, two batches of 1 s a layer queued at 0, O busy until 2, no
    hand-off. The N-capacity relaxation leaves both on N alone (each ends at 2: mean 2). With
    N shared by the batches left on it (they end at 2 and 4), the best is one on N (ends at 2)
    and the other one layer on N and one on O (ends at 3): mean 2.5. But N cannot run both:
    with O's last block ending at ``T``, the served batch's layer on N ends by ``T - 1`` and
    N's work, 2 s of the batch on N plus ``4 - T`` of the served batch, ends by ``max(c, T -
    1)``: either
    the batch on N ends at ``c >= 2 + (4 - T)`` or ``T - 1 >= 2 + (4 - T)``, ``T >= 3.5``.
    The least added is 0.5: 5.5 in all, mean 2.75. The optimum is 3 (N runs 3 layers, O one,
    or N two and O two). Under FIFO the served batch's own block is counted apart
    (:func:`~blitzplan.live.bound.served_blocks.last_block`): when N's last layer is
    the served batch's, at ``Z >= 2 + x``, its block of ``2 - x`` follows, ``T >= 4``: the
    bound is the optimum, 3."""
    inst = LiveScalingInstance([0.0, 0.0], [0.0, 0.0], 1.0, 1.0, 0.0, old_free_at_s=2.0)
    plain, _, _ = solve_relaxation(Relaxation(inst, "mean_latency"), old_order="free")
    assert plain / 2 == pytest.approx(2.0)
    assert capacity_bound(inst, old_order="free") == pytest.approx(2.75)
    assert capacity_bound(inst, old_order="fifo") == pytest.approx(3.0)
    for order in ("free", "fifo"):
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=order)
        assert oracle.objective == pytest.approx(3)


def _crowded(rng: random.Random) -> LiveScalingInstance:
    """A tiny instance where O is often busy long and N crowded."""
    layers, n = rng.randint(1, 3), rng.randint(2, 4)
    arrivals = sorted(rng.choice([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]) for _ in range(layers))
    p_new = [rng.choice([0.5, 1.0, 1.5, 2.0]) for _ in range(n)]
    p_old = p_new if rng.random() < 0.7 else [rng.choice([0.5, 1.0, 2.0]) for _ in range(n)]
    return LiveScalingInstance(
        arrivals,
        [rng.choice([0.0, 0.0, 0.5, 1.0]) for _ in range(n)],
        p_new,
        p_old,
        [rng.choice([0.0, 0.0, 0.5]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 1.0, 2.0, 4.0, 6.0]),
        head_ready_s=arrivals[-1] + rng.choice([0.0, 0.5]),
    )


def crowded_cases(
    seed: int, count: int, draw: Callable[[random.Random], LiveScalingInstance] = _crowded
) -> Iterator[tuple[LiveScalingInstance, str, Schedule]]:
    """``count`` tiny instances (``draw``, crowded by default: :func:`_crowded`, drawn from
    ``seed``), each in both orders where it has at most 3,000 schedules, with its enumerated
    optimum."""
    rng = random.Random(seed)
    for _ in range(count):
        inst = draw(rng)
        for order in ("free", "fifo"):
            if count_schedules(inst, old_order=order) <= 3_000:
                oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=order)
                yield inst, order, oracle


def test_crowding_raises_the_bound_and_never_past_the_optimum() -> None:
    """On 80 crowded tiny instances, in both orders: the bound never exceeds the enumerated
    optimum, and the crowding term (the batches left on N against the served batches' layers
    on N) raises it on some of them."""
    from blitzplan.live.bound.conditions import Capacity

    def uncrowded(self: Capacity, layer: Layer, *_: object) -> np.ndarray:
        return np.zeros(layer.free.shape)

    raised, tried = 0, 0
    for inst, order, oracle in crowded_cases(23, 80):
        tried += 1
        bound = capacity_bound(inst, old_order=order)
        assert bound <= oracle.objective + 1e-9 * max(1.0, oracle.objective)
        with (
            mock.patch.object(Capacity, "extra_s", uncrowded),
            mock.patch.object(served_blocks, "served_extra_s", uncrowded),
        ):
            without = capacity_bound(inst, old_order=order)
        raised += bound > without + 1e-9
    assert tried >= 80 and raised >= 5


def test_no_work_after_a_point_crowds_nothing() -> None:
    """Batch 2 (released at 4 s, when O frees) is served whole; batches 0 and 1 finish on N
    before 4 s, so nothing of theirs runs after that release: the crowding term must not
    charge N's last operation from it (it did: 0.6 against the optimum 0.5)."""
    inst = LiveScalingInstance(
        [0.45790480495695596],
        [0.5, 2.0, 4.0],
        [0.25, 1.0, 2.0],
        [1.0, 1.0, 0.25],
        [0.3, 0.1, 0.3],
        old_free_at_s=4.0,
    )
    for order in ("free", "fifo"):
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=order)
        assert oracle.objective == pytest.approx(0.5)
        assert capacity_bound(inst, old_order=order) <= oracle.objective * (1 + 1e-9)


def test_without_open_floors_the_bound_is_the_same_uncut_and_valid_cut() -> None:
    """``open_floors=False`` (the short free call's probe): on 40 crowded tiny instances, in
    both orders, a program that ends gives the bound it gives with them, and one cut at once
    (its open states bounded by their costs alone) stays at most the enumerated optimum."""
    tried = 0
    for inst, order, oracle in crowded_cases(31, 40):
        tried += 1
        full = capacity_bound(inst, old_order=order)
        uncut = capacity_bound(inst, old_order=order, time_limit_s=60.0, open_floors=False)
        assert uncut == pytest.approx(full, rel=1e-12, abs=1e-12)
        cut = capacity_bound(inst, old_order=order, time_limit_s=0.0, open_floors=False)
        assert cut <= oracle.objective + 1e-9 * max(1.0, oracle.objective)
    assert tried >= 40
