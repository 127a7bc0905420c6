"""What a state's path tells the pair bound (:mod:`blitzplan.live.bound.pair_history`), held
against schedules and the exhaustive oracle: the free-order capacity program with the credit of
O's waits, and with the batches that may end O's blocks, never above the enumerated optimum on
tiny instances (the root and random split ranges around the optimum's split), the credit's
check catching it made 1% larger; no schedule ends O's served blocks sooner after N's last
operation than :func:`~blitzplan.live.bound.pair_history.ready_after` says (and 1% more is
caught); the merge's carries; the root's offer of the program's best plan."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from unittest import mock

import numpy as np
import pytest

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.bound import pair_history
from blitzplan.live.bound.dp import capacity_bound
from blitzplan.live.bound.relaxation import Relaxation, RelaxedPlan, repair
from blitzplan.live.bound.subset_table import _Table
from blitzplan.live.bound.subsets import _pareto
from blitzplan.live.exact import root_bounds
from blitzplan.live.exact.common import decode, start_point
from blitzplan.live.exact.offers import Offers
from blitzplan.live.schedule import Schedule
from tests.bound_oracle import free_nodes, lift_counts, program
from tests.improved_check import built
from tests.test_live_capacity_bound import _crowded

TOL = 1e-9


def _waiting(rng: random.Random) -> LiveScalingInstance:
    """Two or three layers one step apart, two to four short batches queued up to 1.5 s late,
    O free early: O's blocks often end before the next batch is queued."""
    layers, n = rng.randint(2, 3), rng.randint(2, 4)
    step = rng.choice([0.25, 0.5, 1.0])
    p_new = [rng.choice([0.1, 0.25, 0.5, 1.0, 1.5]) for _ in range(n)]
    p_old = p_new if rng.random() < 0.7 else [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new]
    return LiveScalingInstance(
        [j * step for j in range(layers)],
        sorted(rng.choice([0.0, 0.0, 0.5, 1.0, 1.5]) for _ in range(n)),
        p_new,
        p_old,
        [rng.choice([0.0, 0.05, 0.25]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 0.25, 0.5, 1.0]),
        head_ready_s=(layers - 1) * step + rng.choice([0.0, 0.5]),
    )


def _handoffs(rng: random.Random) -> LiveScalingInstance:
    """Three or four batches queued at once (one in four later), hand-offs from a tenth to all
    of a layer's time: a short batch with a short hand-off beside long ones."""
    layers, n = rng.randint(2, 3), rng.randint(3, 4)
    step = rng.choice([0.25, 0.5, 1.0])
    p_new = [rng.choice([0.1, 0.5, 1.0, 2.0]) for _ in range(n)]
    p_old = p_new if rng.random() < 0.8 else [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new]
    return LiveScalingInstance(
        [j * step for j in range(layers)],
        sorted(rng.choice([0.0, 0.0, 0.0, 0.5]) for _ in range(n)),
        p_new,
        p_old,
        [p * rng.choice([0.1, 0.3, 1.0]) for p in p_new],
        old_free_at_s=rng.choice([0.0, 0.5, 1.0, 2.0]),
        head_ready_s=(layers - 1) * step + rng.choice([0.0, 0.5]),
    )


def _nodes(seed: int, count: int, draw: object) -> Iterator[tuple[Relaxation, float]]:
    rng = random.Random(seed)
    made = (
        _crowded(rng) if index % 4 == 3 else draw(rng)  # type: ignore[operator]
        for index in range(count)
    )
    return free_nodes(made, rng)


def _idle_check(scale: float = 1.0) -> tuple[int, int, int]:
    term, switch = (pair_history, "step"), (pair_history, "OLD_IDLE")
    return lift_counts(_nodes(1, 60, _waiting), program, term, switch, scale)


def test_the_credit_of_old_waits_never_lifts_past_the_enumerated_optimum() -> None:
    """No node's bound passes the optimum; the credit lifts some of them."""
    tried, lifted, over = _idle_check()
    assert over == 0
    assert tried >= 130 and lifted >= 3


def test_the_oracle_check_catches_a_credit_one_percent_larger() -> None:
    _, _, over = _idle_check(1.01)
    assert over > 0


def test_the_batches_ending_old_blocks_never_lift_past_the_enumerated_optimum() -> None:
    """The same check for :func:`~blitzplan.live.bound.pair_history.ready_after` (it rarely
    lifts a tiny instance: N is seldom busy enough there; the schedules' check below is the
    one that catches it made larger)."""
    term, switch = (pair_history, "ready_after"), (pair_history, "LAST_READY")
    tried, lifted, over = lift_counts(_nodes(13, 40, _handoffs), program, term, switch)
    assert over == 0
    assert tried >= 80 and lifted >= 1


def _cases(seed: int, count: int) -> Iterator[tuple[LiveScalingInstance, Schedule]]:
    rng = random.Random(seed)
    for _ in range(count):
        inst = _handoffs(rng)
        L, n = inst.num_layers, inst.num_batches
        for _ in range(20):
            split = [rng.choice([0, L - 1, L - 1, L]) for _ in range(n)]
            new = [b for b in range(n) for _ in range(split[b])]
            rng.shuffle(new)
            old = [b for b in range(n) if split[b] < L]
            rng.shuffle(old)
            yield inst, built(inst, split, new, old)


def _ready_check(scale: float) -> tuple[int, int]:
    """(claims checked, claims broken): per schedule and O block ``i`` after at least one
    other, where N's last operation on the batches O served up to ``i`` is a served batch's
    (not ``i``'s), O's block before ``i`` ends at least ``scale`` times
    :func:`~blitzplan.live.bound.pair_history.ready_after` after that operation (the set
    served before ``i``, ending with the block before ``i``)."""
    checked = broken = 0
    for inst, sched in _cases(3, 80):
        cap = _Table(Relaxation(inst, "mean_latency"), capacity=True).capacity
        assert cap is not None
        blocks = sorted(sched.old_ops, key=lambda o: o.start_s)
        bits = cap.table.bits
        for j in range(1, len(blocks)):
            before = [o.batch for o in blocks[:j]]
            ops = [o for o in sched.new_ops if o.batch in before or o.batch == blocks[j].batch]
            if not ops:
                continue
            last_op = max(ops, key=lambda o: o.end_s)
            if last_op.batch == blocks[j].batch:
                continue
            mask = np.asarray([sum(int(bits[b]) for b in before)], dtype=np.int64)
            lasts = np.asarray([int(bits[before[-1]])], dtype=np.int64)
            ready = scale * float(pair_history.ready_after(cap, mask, lasts)[0])
            checked += 1
            broken += blocks[j - 1].end_s < last_op.end_s + ready - TOL
    return checked, broken


def test_no_schedule_ends_old_blocks_sooner_after_new_than_ready_after() -> None:
    checked, broken = _ready_check(1.0)
    assert broken == 0
    assert checked >= 100


def test_the_schedules_check_catches_ready_after_one_percent_larger() -> None:
    _, broken = _ready_check(1.01)
    assert broken > 0


def test_ready_after_counts_another_block_unless_the_batch_may_end_them() -> None:
    """Three layers, batches of 0.1 s (hand-off 0) and 1 s (hand-off 0.5) a layer served: the
    short one ends O's blocks (it may: 0.1, its one layer) or a layer of the long one follows
    (0.1 + 1); the long one ending them: 0.5 + 1."""
    inst = LiveScalingInstance([0.0, 1.0, 2.0], [0.0, 0.0], [0.1, 1.0], [0.1, 1.0], [0.0, 0.5])
    cap = _Table(Relaxation(inst, "mean_latency"), capacity=True).capacity
    assert cap is not None
    both = np.asarray([3], dtype=np.int64)
    ready = pair_history.ready_after(cap, np.repeat(both, 3), np.asarray([1, 2, 3]))
    assert ready == pytest.approx([0.1, 1.1, 0.1])
    none = pair_history.ready_after(cap, np.asarray([0]), np.asarray([0]))
    assert math.isinf(none[0])


def test_the_merge_passes_credits_and_last_blocks() -> None:
    """Random states of one level merged: every dropped state's kept dominator keeps a credit
    no higher than the dropped credit plus what its ``cost - free`` is lower, and the dropped
    state's possible last blocks."""
    rng = np.random.default_rng(7)
    size = 400
    grown = {
        "mask": rng.integers(1, 4, size).astype(np.int64),
        "free": rng.choice([1.0, 1.5, 2.0, 2.5, 3.0], size),
        "cost": rng.choice([2.0, 3.0, 4.0, 5.0, 6.0], size),
        "parent": np.arange(size),
        "last": np.zeros(size, dtype=np.int64),
        "idle": rng.choice([0.0, 0.25, 0.5, 1.0, 2.0], size),
        "lasts": rng.choice([1, 2, 4], size).astype(np.int64),
    }
    kept = _pareto([grown], relative=True)
    assert kept["cost"].size < size
    own = kept["parent"]
    assert np.all(kept["idle"] <= grown["idle"][own] + TOL)
    assert np.any(kept["idle"] < grown["idle"][own] - TOL)
    assert np.all((kept["lasts"] & grown["lasts"][own]) == grown["lasts"][own])
    rank = kept["cost"] - kept["free"]
    for d in range(size):
        same = (kept["mask"] == grown["mask"][d]) & (kept["free"] <= grown["free"][d])
        rows = np.flatnonzero(same & (rank <= grown["cost"][d] - grown["free"][d]))
        assert rows.size  # dominated, or kept itself
        slack = grown["cost"][d] - grown["free"][d] - rank[rows]
        assert np.any(kept["idle"][rows] <= grown["idle"][d] + slack + TOL)
        assert np.any((kept["lasts"][rows] & grown["lasts"][d]) == grown["lasts"][d])


def test_the_credit_counts_a_wait_for_a_late_batch() -> None:
    """A hand case: two layers landing at 0 and 1, batches of 0.5 s and 1 s a layer queued at
    0 and one of 0.1 s a layer queued at 0.5, O free at 0, no hand-off. The capacity bound
    without the credit of O's waits is 1.2; with it 3.7 / 3, the enumerated optimum."""
    inst = LiveScalingInstance(
        [0.0, 1.0], [0.0, 0.5, 0.0], [0.5, 0.1, 1.0], [0.5, 0.1, 1.0], 0.0, old_free_at_s=0.0
    )
    oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="free")
    assert oracle.objective == pytest.approx(3.7 / 3)
    with mock.patch.object(pair_history, "OLD_IDLE", False):
        assert capacity_bound(inst, old_order="free") == pytest.approx(1.2)
    assert capacity_bound(inst, old_order="free") == pytest.approx(3.7 / 3)
    assert capacity_bound(inst, old_order="free") <= oracle.objective * (1 + TOL)


def test_the_root_offers_the_programs_best_plan_repaired() -> None:
    """The exact search's root gives the capacity program the hook that offers its best
    relaxed plan, repaired, to the incumbent; the hook keeps the repaired schedule where it
    is better (the one of O's best sequence is the optimum here, the incumbent before it a
    worse FIFO schedule)."""
    inst = LiveScalingInstance(
        [0.0, 1.0], [0.0, 0.5, 0.0], [0.5, 0.1, 1.0], [0.5, 0.1, 1.0], 0.0, old_free_at_s=0.0
    )
    args = {"objective": "mean_latency", "old_order": "free", "backend": "bnb"}
    start = start_point(inst, **args, time_limit_s=None, hint=None, relax=False, warm=False)
    fifo = schedule_live(inst, method="stop_the_world")
    start.offer(decode(inst, fifo.split, fifo.new_sequence(), fifo.old_sequence(), *args.values()))
    before = start.incumbent.objective
    plans: list[RelaxedPlan] = []
    capacity_bound(inst, old_order="free", upper_bound=before, on_plan=plans.append)
    assert plans
    Offers(start).repaired(plans[-1])
    oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="free")
    assert start.incumbent.objective == pytest.approx(oracle.objective)
    assert before > oracle.objective + TOL
    with mock.patch.object(root_bounds, "capacity_bound", wraps=capacity_bound) as program:
        root_bounds.strengthen(start_point(inst, **args, time_limit_s=5.0, hint=fifo), -math.inf)
    hooks = [call.kwargs.get("on_plan") for call in program.call_args_list]
    assert hooks and all(hook is not None for hook in hooks)


def test_the_capacity_bound_hands_its_best_plan() -> None:
    """``capacity_bound``'s ``on_plan`` gets relaxed plans whose repair is a schedule the
    checker passes, never below the bound returned."""
    rng = random.Random(9)
    handed = 0
    for _ in range(30):
        inst = _crowded(rng)
        plans: list[RelaxedPlan] = []
        bound = capacity_bound(inst, old_order="free", upper_bound=1e6, on_plan=plans.append)
        for plan in plans:
            sched = built(inst, *repair(inst, plan))
            assert validate_schedule(inst, sched).ok
            assert sched.objective >= bound - TOL * max(1.0, bound)
            handed += 1
    assert handed >= 10
