"""The rank bound (:mod:`blitzplan.live.bound.ranks`) held against the exhaustive oracle:
the capacity program with it, O in FIFO order, on restricted nodes around the enumerated
optimum of tiny instances shaped like (80,16)'s (long batches first in the queue, which N
finishes, short ones O serves with a share on N); and the same check catching the bound made
1% larger."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from functools import partial
from unittest import mock

import numpy as np
import pytest

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound import deadlines as relaxation_deadlines
from blitzplan.live.bound import ranks as relaxation_ranks
from blitzplan.live.bound.relaxation import Relaxation, Restriction
from blitzplan.live.bound.subset_table import _Table
from blitzplan.live.bound.subsets import subset_search
from blitzplan.live.exact.enumerate import count_schedules
from tests.bound_oracle import lift_counts, program


@pytest.fixture(autouse=True)
def _rank_bound_alone() -> Iterator[None]:
    """The deadline bound (:mod:`blitzplan.live.bound.deadlines`), which generalises the
    rank bound, off: these tests hold the rank bound alone."""
    with mock.patch.object(relaxation_deadlines, "DEADLINES", False):
        yield


def _queued(rng: random.Random) -> LiveScalingInstance:
    """Two layers; long batches released first (O serving them would hold the short ones
    back), short ones after, all with ``pN = pO``."""
    long_, short = rng.choice([(2, 2), (2, 2), (1, 3), (3, 1)])
    p = [rng.choice([1.5, 2.0, 3.0, 4.0]) for _ in range(long_)]
    p += [rng.choice([0.25, 0.5, 0.75, 1.0]) for _ in range(short)]
    second = rng.choice([0.25, 0.5, 1.0])
    release = [0.0] * long_ + sorted(rng.choice([0.0, 0.0, 0.25, 0.5]) for _ in range(short))
    return LiveScalingInstance(
        [0.0, second],
        release,
        p,
        p,
        [rng.choice([0.0, 0.05]) for _ in p],
        old_free_at_s=rng.choice([0.25, 0.5, 1.0, 2.0]),
        head_ready_s=second + rng.choice([0.0, 0.5, 1.0]),
    )


def _nodes(seed: int, count: int) -> Iterator[tuple[Relaxation, float]]:
    """(restricted relaxation, its least schedule value): per instance, the optimum's split and
    three random split ranges around it (each keeps the optimum)."""
    rng = random.Random(seed)
    for _ in range(count):
        inst = _queued(rng)
        if count_schedules(inst, old_order="fifo") > 40_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="fifo")
        split, n, layers = oracle.split, inst.num_batches, inst.num_layers
        for trial in range(4):
            low = tuple(rng.randint(0, k) for k in split) if trial else split
            high = tuple(rng.randint(k, layers) for k in split) if trial else split
            restriction = Restriction(low, high, ((),) * n)
            yield Relaxation(inst, "mean_latency", restriction), oracle.objective


def _check(scale: float = 1.0) -> tuple[int, int, int]:
    """(nodes, nodes the rank bound lifts, nodes above the optimum), the rank bound's term
    times ``scale``."""
    term, switch = (relaxation_ranks, "rank_extra_s"), (relaxation_ranks, "RANKS")
    return lift_counts(_nodes(12, 25), partial(program, fifo=True), term, switch, scale)


def test_the_rank_bound_never_exceeds_the_enumerated_optimum() -> None:
    """No node's bound passes the optimum; the rank bound lifts some of them (to the optimum
    less its slack: there a larger term would pass it)."""
    tried, lifted, over = _check()
    assert over == 0
    assert tried >= 90 and lifted >= 3


def test_the_oracle_check_catches_a_bound_one_percent_larger() -> None:
    """The same check with the rank bound's term 1% larger finds bounds above the optimum."""
    _, _, over = _check(1.01)
    assert over > 0


def test_the_served_work_delays_every_batch_left_on_new() -> None:
    """Long batches 0 and 1 (first in the queue) finish on N or run a share on it, short 2 and
    3 are served: at the node where batch 1 runs at least one layer on N and 2 and 3 at most
    one, the rank bound counts that work against the batches N finishes (the node keeps the
    optimum, 4.125; the bound is 4.0625 without it)."""
    inst = LiveScalingInstance(
        [0.0, 1.0],
        [0.0, 0.0, 0.25, 0.25],
        [2.0, 2.0, 0.5, 1.0],
        [2.0, 2.0, 0.5, 1.0],
        0.0,
        old_free_at_s=0.5,
        head_ready_s=1.5,
    )
    oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="fifo")
    assert oracle.objective == pytest.approx(4.125)
    relax = Relaxation(inst, "mean_latency", Restriction((0, 1, 0, 0), (2, 2, 1, 1), ((),) * 4))
    assert all(
        lo <= k <= hi for lo, k, hi in zip((0, 1, 0, 0), oracle.split, (2, 2, 1, 1), strict=True)
    )

    def bound() -> float:
        cost, _, _ = subset_search(relax, math.inf, math.inf, math.inf, capacity=True, fifo=True)
        return relax.obj.final(cost)

    lifted = bound()
    with mock.patch.object(relaxation_ranks, "RANKS", False):
        without = bound()
    assert without == pytest.approx(4.0625)
    assert without < lifted <= oracle.objective * (1 + 1e-9)


def test_the_rank_bound_needs_fifo_and_is_zero_without_served_batches() -> None:
    """Under a free order it is refused; a state where O served none gets nothing."""
    inst = _queued(random.Random(3))
    relax = Relaxation(inst, "mean_latency")
    free_table = _Table(relax, capacity=True, fifo=False)
    table = _Table(relax, capacity=True, fifo=True)
    for t in (free_table, table):
        assert t.capacity is not None
    mask = np.zeros(1, dtype=np.int64)
    unplaced = table.unplaced(mask)
    cap = table.capacity
    assert cap is not None and free_table.capacity is not None
    _, last = cap.left_on_new(unplaced)
    crowd = cap.crowded(mask, np.array([inst.old_free_at_s]), unplaced, last)
    assert relaxation_ranks.rank_extra_s(cap, crowd, np.array([0]))[0] == 0.0
    with pytest.raises(ValueError, match="FIFO"):
        relaxation_ranks.rank_extra_s(free_table.capacity, crowd, np.array([0]))
