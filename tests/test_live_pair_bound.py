"""The pair bound (:mod:`blitzplan.live.bound.last_blocks`) held against the exhaustive oracle: the
free-order capacity program with it, on tiny instances where O's last blocks wait for N (the
root and random split ranges around the enumerated optimum), never above the optimum, and
the same check catching the lift made 1% larger; the merge's carry of dropped states' lifts;
a hand case."""

from __future__ import annotations

import random
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound import last_blocks
from blitzplan.live.bound.dp import capacity_bound
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.subset_table import _Table
from blitzplan.live.bound.subsets import _pareto
from blitzplan.live.exact.enumerate import count_schedules
from tests.bound_oracle import free_nodes, lift_counts, program
from tests.test_live_capacity_bound import _crowded

TOL = 1e-9


def _staggered(rng: random.Random) -> LiveScalingInstance:
    """Two or three layers landing one step apart, two to four batches of mixed lengths (often
    equal on both instances), hand-offs up to a quarter second: O's last blocks often wait for
    the layers N runs of them."""
    layers, n = rng.randint(2, 3), rng.randint(2, 4)
    step = rng.choice([0.25, 0.5, 1.0])
    p_new = [rng.choice([0.25, 0.5, 1.0, 1.5, 2.0, 3.0]) for _ in range(n)]
    p_old = p_new if rng.random() < 0.7 else [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new]
    return LiveScalingInstance(
        [j * step for j in range(layers)],
        sorted(rng.choice([0.0, 0.0, 0.25, 0.5]) for _ in range(n)),
        p_new,
        p_old,
        [rng.choice([0.0, 0.05, 0.25]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 0.25, 0.5, 1.0]),
        head_ready_s=(layers - 1) * step + rng.choice([0.0, 0.5]),
    )


def _nodes(seed: int, count: int) -> Iterator[tuple[Relaxation, float]]:
    """(restricted relaxation, its least schedule value): per instance (staggered, one in
    four crowded), the root and two random split ranges around the optimum's split."""
    rng = random.Random(seed)
    made = (_crowded(rng) if index % 4 == 3 else _staggered(rng) for index in range(count))
    return free_nodes(made, rng)


def _check(scale: float = 1.0) -> tuple[int, int, int]:
    """(nodes, nodes the pair bound lifts, nodes above the optimum), the lift times ``scale``."""
    term, switch = (last_blocks, "pair_extra_s"), (last_blocks, "PAIRS")
    return lift_counts(_nodes(1, 60), program, term, switch, scale)


def test_the_pair_bound_never_exceeds_the_enumerated_optimum() -> None:
    """No node's bound passes the optimum; the pair bound lifts some of them (on some to the
    optimum: there a larger lift passes it)."""
    tried, lifted, over = _check()
    assert over == 0
    assert tried >= 140 and lifted >= 10


def test_the_oracle_check_catches_a_lift_one_percent_larger() -> None:
    """The same check with the lift 1% larger finds bounds above the optimum."""
    _, _, over = _check(1.01)
    assert over > 0


def test_a_last_block_waits_for_the_work_new_took_of_the_one_before() -> None:
    """Two layers landing at 0 and 1, batches of 0.5 and 2 s a layer on both instances, queued
    at 0, O free at 0.5, no hand-off. Without the pair bound the program serves the short
    batch first with a layer on N (it ends at 1) and the long one after with a layer on N
    (ends at 4, as if N had run nothing else: each block picks its own share): mean 2.5.
    Ending the short block at ``C < 1.5`` leaves N ``1.5 - C`` of it before the long batch's
    layer: ``C + C_1 >= 1.5 + 4``, mean 2.75, the enumerated optimum (the short batch on O, the
    long one's first layer on N)."""
    inst = LiveScalingInstance(
        [0.0, 1.0], [0.0, 0.0], [0.5, 2.0], [0.5, 2.0], 0.0, old_free_at_s=0.5
    )
    oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="free")
    assert oracle.objective == pytest.approx(2.75)
    with mock.patch.object(last_blocks, "PAIRS", False):
        assert capacity_bound(inst, old_order="free") == pytest.approx(2.5)
    assert capacity_bound(inst, old_order="free") == pytest.approx(2.75)
    assert capacity_bound(inst, old_order="free") <= oracle.objective


def test_the_merge_passes_a_dropped_state_its_lift() -> None:
    """Random states of one level merged: every dropped state's kept dominator (the kept state
    before it in its set, by O's free time) completes no higher with its carried lift, and
    every kept state keeps at most its own lift."""
    rng = np.random.default_rng(5)
    size = 400
    grown = {
        "mask": rng.integers(1, 4, size).astype(np.int64),
        "free": rng.choice([1.0, 1.5, 2.0, 2.5, 3.0], size),
        "cost": rng.choice([2.0, 3.0, 4.0, 5.0, 6.0], size),
        "parent": np.arange(size),
        "last": np.zeros(size, dtype=np.int64),
        "pair": rng.choice([0.0, 0.25, 0.5, 1.0, 2.0], size),
    }
    kept = _pareto([grown], relative=True)
    assert kept["cost"].size < size
    own = grown["pair"][kept["parent"]]
    assert np.all(kept["pair"] <= own + TOL)
    assert np.any(kept["pair"] < own - TOL)  # some kept state took a lower lift
    for d in range(size):
        same = (kept["mask"] == grown["mask"][d]) & (kept["free"] <= grown["free"][d])
        rank = kept["cost"] - kept["free"]
        rows = np.flatnonzero(same & (rank <= grown["cost"][d] - grown["free"][d]))
        assert rows.size  # dominated, or kept itself
        reach = kept["cost"][rows] + kept["pair"][rows]
        assert reach.min() <= grown["cost"][d] + grown["pair"][d] + TOL


def test_the_pair_bound_is_free_order_mean_latency_only() -> None:
    """FIFO and other objectives carry no lift (their merges are on cost alone)."""
    inst = LiveScalingInstance([0.0, 1.0], [0.0, 0.0], [0.5, 2.0], [0.5, 2.0], 0.0)
    assert _Table(Relaxation(inst, "mean_latency"), capacity=True).pairs
    assert not _Table(Relaxation(inst, "mean_latency"), capacity=True, fifo=True).pairs
    assert not _Table(Relaxation(inst, "makespan"), capacity=True).pairs
    assert not _Table(Relaxation(inst, "mean_latency")).pairs
    with mock.patch.object(last_blocks, "PAIRS", False):
        assert not _Table(Relaxation(inst, "mean_latency"), capacity=True).pairs


@pytest.mark.parametrize("seed", range(3))
def test_the_bound_stays_under_the_optimum_on_random_instances(seed: int) -> None:
    """The whole capacity bound (rising targets) under the optimum on staggered instances."""
    rng = random.Random(100 + seed)
    for _ in range(15):
        inst = _staggered(rng)
        if count_schedules(inst, old_order="free") > 20_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="free")
        bound = capacity_bound(inst, old_order="free")
        assert bound <= oracle.objective * (1 + TOL)
