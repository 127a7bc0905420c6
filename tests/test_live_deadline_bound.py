"""The deadline bound (:mod:`blitzplan.live.bound.deadlines`) held against the exhaustive
oracle: the capacity program with it, O in FIFO order, on restricted nodes around the enumerated
optimum of tiny instances shaped like (80,16)'s (long batches first in the queue, short ones
after, which O serves with a share on N); the same check catching the bound made 1% larger; and
the program solved another way (a mixed-integer program) on states of (80,16)."""

from __future__ import annotations

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
from blitzplan.live.exact.enumerate import count_schedules
from tests.bound_oracle import lift_counts, program


def _queued(rng: random.Random) -> LiveScalingInstance:
    """Two layers; long batches released first, short ones after (some late), ``pN = pO`` or
    N a little faster."""
    long_, short = rng.choice([(1, 2), (1, 3), (2, 2), (1, 4), (2, 3)])
    p = [rng.choice([1.5, 2.0, 3.0, 4.0]) for _ in range(long_)]
    p += [rng.choice([0.25, 0.5, 0.75, 1.0, 1.5]) for _ in range(short)]
    fast = rng.choice([1.0, 1.0, 0.8])
    second = rng.choice([0.25, 0.5, 1.0])
    release = [0.0] * long_ + sorted(rng.choice([0.0, 0.0, 0.25, 0.5, 1.0]) for _ in range(short))
    return LiveScalingInstance(
        [0.0, second],
        release,
        [fast * x for x in p],
        p,
        [rng.choice([0.0, 0.05]) for _ in p],
        old_free_at_s=rng.choice([0.25, 0.5, 1.0, 2.0, 3.0]),
        head_ready_s=second + rng.choice([0.0, 0.5, 1.0]),
    )


def _nodes(seed: int, count: int) -> Iterator[tuple[Relaxation, float]]:
    """(restricted relaxation, its least schedule value): per instance, the root, the optimum's
    split and two random split ranges around it (each keeps the optimum)."""
    rng = random.Random(seed)
    for _ in range(count):
        inst = _queued(rng)
        if count_schedules(inst, old_order="fifo") > 30_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="fifo")
        split, n, layers = oracle.split, inst.num_batches, inst.num_layers
        yield Relaxation(inst, "mean_latency"), oracle.objective
        for trial in range(3):
            low = tuple(rng.randint(0, k) for k in split) if trial else split
            high = tuple(rng.randint(k, layers) for k in split) if trial else split
            restriction = Restriction(low, high, ((),) * n)
            yield Relaxation(inst, "mean_latency", restriction), oracle.objective


def _check(scale: float = 1.0) -> tuple[int, int, int]:
    """(nodes, nodes the deadline bound lifts over the rank bound, nodes above the optimum),
    the deadline bound's term times ``scale``."""
    term = (relaxation_deadlines, "deadline_extra_s")
    switch = (relaxation_deadlines, "DEADLINES")
    return lift_counts(
        _nodes(21, 40), partial(program, fifo=True, deadlines=True), term, switch, scale
    )


def test_the_deadline_bound_never_exceeds_the_enumerated_optimum() -> None:
    """No node's bound passes the optimum; the deadline bound lifts some of them above the rank
    bound."""
    tried, lifted, over = _check()
    assert over == 0
    assert tried >= 80 and lifted >= 4


def test_the_deadline_bound_at_every_point_never_exceeds_the_enumerated_optimum() -> None:
    """The same at every point of the capacity conditions (layer arrivals and releases, where
    the served work may partly run before the point), not only the first."""
    with mock.patch.object(relaxation_deadlines, "DEADLINES_POINTS", tuple(range(40))):
        tried, lifted, over = _check()
    assert over == 0
    assert tried >= 80 and lifted >= 4


def test_the_oracle_check_catches_a_bound_one_percent_larger() -> None:
    """The same check with the deadline bound's term 1% larger finds bounds above the optimum."""
    _, _, over = _check(1.01)
    assert over > 0


def test_the_deadline_bound_needs_fifo_and_is_zero_without_served_batches() -> None:
    """Under a free order it is refused; a state where O served none gets nothing; and it is
    never below the rank bound's term, which it generalises (one prefix, the last block)."""
    inst = _queued(random.Random(3))
    relax = Relaxation(inst, "mean_latency")
    free_table = _Table(relax, capacity=True, fifo=False)
    table = _Table(relax, capacity=True, fifo=True)
    cap, free_cap = table.capacity, free_table.capacity
    assert cap is not None and free_cap is not None
    n = inst.num_batches
    masks = np.arange(1 << n, dtype=np.int64)
    unplaced = table.unplaced(masks)
    _, last = cap.left_on_new(unplaced)
    frees = np.full(masks.size, inst.old_free_at_s + 2.0)
    crowd = cap.crowded(masks, frees, unplaced, last)
    rows = np.arange(masks.size)
    got = relaxation_deadlines.deadline_extra_s(cap, crowd, rows)
    assert got[0] == 0.0
    rank = relaxation_ranks.rank_extra_s(cap, crowd, rows)
    assert np.all(got >= rank - 1e-6)
    with pytest.raises(ValueError, match="FIFO"):
        relaxation_deadlines.deadline_extra_s(free_cap, crowd, rows)
