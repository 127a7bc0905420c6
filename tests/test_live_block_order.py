"""O's blocks re-ordered at fixed splits and N order (:mod:`blitzplan.live.block_order`): what
it returns is a schedule the independent checker passes, at the value returned, below the
schedule's, with the splits and N's order unchanged; on a hand case it finds the best order
(the enumerated optimum), and the polish of every exact backend gets it under a free order."""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest

from blitzplan import LiveScalingInstance
from blitzplan.live.block_order import order_blocks
from blitzplan.live.exact import offers as offers_module
from blitzplan.live.exact.common import start_point
from blitzplan.live.exact.offers import Offers
from blitzplan.live.improve import polish
from blitzplan.live.schedule import evaluate_objective, timetable
from tests.improved_check import built, checked_better


def _value(
    inst: LiveScalingInstance,
    split: list[int],
    new: list[int],
    old: list[int],
    objective: str = "mean_latency",
) -> float:
    return evaluate_objective(inst, timetable(inst, split, new, old)[2], objective)


def _long_first() -> tuple[LiveScalingInstance, list[int], list[int], list[int]]:
    """Two layers usable at 0, O free at 0. Batch 0 (3 s a layer on O) and batch 2 (1 s)
    released at 0 run whole on O; batch 1 runs its first layer on N (1 s, ends at 1 s, no
    hand-off) and its second on O (1 s). O's order 0, 1, 2 ends them at 6, 7, 9 s (mean
    22/3 s); the best order 2, 1, 0 ends batch 2 at 2 s, batch 1 at 3 s, batch 0 at 9 s
    (mean 14/3 s)."""
    inst = LiveScalingInstance([0.0, 0.0], [0.0] * 3, [1.0] * 3, [3.0, 1.0, 1.0], [0.0] * 3)
    return inst, [0, 1, 0], [1], [0, 1, 2]


def test_the_best_order_on_a_hand_case() -> None:
    inst, split, new, old = _long_first()
    value = _value(inst, split, new, old)
    assert value == pytest.approx(22.0 / 3)
    best = min(_value(inst, split, new, list(o)) for o in itertools.permutations(old))
    assert best == pytest.approx(14.0 / 3)
    found = order_blocks(inst, split, new, old, "mean_latency", value, deadline_s=math.inf)
    assert found is not None
    order, better = found
    assert better == pytest.approx(best)
    checked_better(inst, (split, new, order), "mean_latency", better, value)
    assert (
        order_blocks(inst, split, new, order, "mean_latency", better, deadline_s=math.inf) is None
    )


def test_the_free_polish_orders_blocks() -> None:
    """:func:`~blitzplan.live.improve.polish` asked for it (bnb's polishes after its root
    bounds) orders O's blocks under a free order, with no random move: here N is too slow
    for any split jump (100 s a layer), and O serves 6, 2 and 2 s blocks released at 0
    longest first (mean 8 s, shortest first 16/3 s). Under FIFO it leaves O's order alone."""
    inst = LiveScalingInstance([0.0, 0.0], [0.0] * 3, [100.0] * 3, [3.0, 1.0, 1.0], [0.0] * 3)
    start = built(inst, [0, 0, 0], [], [0, 1, 2])
    assert start.objective == pytest.approx(8.0)
    found = polish(
        inst,
        start,
        objective="mean_latency",
        old_order="free",
        deadline_s=math.inf,
        max_moves=0,
        blocks=True,
    )
    assert (found.split, found.old, found.value) == ([0, 0, 0], [1, 2, 0], pytest.approx(16 / 3))
    fifo = polish(
        inst,
        start,
        objective="mean_latency",
        old_order="fifo",
        deadline_s=math.inf,
        max_moves=0,
        blocks=True,
    )
    assert (fifo.old, fifo.value) == ([0, 1, 2], pytest.approx(8.0))


def _random_case(seed: int) -> tuple[LiveScalingInstance, list[int], list[int], list[int]]:
    """4-8 layers, 3-7 batches, a random split, a random interleaving of N's layers, O's
    blocks in a random order."""
    rng = random.Random(seed)
    L, n = rng.randint(4, 8), rng.randint(3, 7)
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
    split = [rng.choice([0, 0, L, rng.randint(0, L)]) for _ in range(n)]
    left = list(split)
    new: list[int] = []
    while any(left):
        batch = rng.choice([b for b in range(n) if left[b]])
        left[batch] -= 1
        new.append(batch)
    old = [b for b in range(n) if split[b] < L]
    rng.shuffle(old)
    return inst, split, new, old


@pytest.mark.parametrize("objective", ["mean_latency", "makespan", "max_latency"])
def test_ordered_blocks_are_valid_and_better(objective: str) -> None:
    improved = optimal = 0
    for seed in range(300):
        inst, split, new, old = _random_case(seed)
        value = _value(inst, split, new, old, objective)
        found = order_blocks(inst, split, new, old, objective, value, deadline_s=math.inf)
        if found is None:
            continue
        improved += 1
        order, better = found
        assert sorted(order) == sorted(old)
        checked_better(inst, (split, new, order), objective, better, value)
        best = min(
            _value(inst, split, new, list(o), objective) for o in itertools.permutations(old)
        )
        optimal += better <= best * (1 + 1e-12)
    assert improved >= 50  # the cases exercise it
    assert optimal >= 0.9 * improved  # few blocks: the descent finds the best order mostly


@pytest.mark.parametrize(
    ("old_order", "gap", "owed"),
    [("free", 0.05, True), ("free", 0.001, False), ("fifo", 0.05, False)],
)
def test_the_root_incumbent_is_polished_again_at_a_wide_free_gap(
    monkeypatch: pytest.MonkeyPatch, old_order: str, gap: float, owed: bool
) -> None:
    """After the root bounds (:meth:`~blitzplan.live.exact.offers.Offers.rooted`) the search's
    first repolish polishes the root's incumbent again, in ``WIDE_SHARE`` of the time left,
    only under a free order at a gap of ``WIDE_GAP`` or more; then not again."""
    inst, split, new, old = _long_first()
    start = start_point(
        inst,
        objective="mean_latency",
        old_order=old_order,
        backend="bnb",
        time_limit_s=100.0,
        hint=built(inst, split, new, sorted(old), old_order=old_order),
        relax=False,
    )
    start.bound = (1 - gap) * start.incumbent.objective
    given: list[tuple[float, dict[str, object]]] = []
    monkeypatch.setattr(start, "polish", lambda seconds, **kw: given.append((seconds, kw)))
    offers = Offers(start)
    offers.rooted()
    until = time.perf_counter() + 10.0
    offers.repolish(until)
    offers.polished_at = -math.inf
    offers.repolish(until)
    assert len(given) == owed
    if owed:
        seconds, kwargs = given[0]
        assert seconds == pytest.approx(offers_module.WIDE_SHARE * 10.0, rel=1e-2)
        assert kwargs["blocks"] is True
