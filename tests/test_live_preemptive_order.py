"""N in the preemptive program's order (:mod:`blitzplan.live.preemptive_order`).

Oracle: on tiny fixed-split problems (every split with at most 6 layers on N, O's blocks in a
fixed order: FIFO, or a random one) the program's value is never above the least schedule
over every order of N's layers (enumerated and timed by ``timetable``), and meets it on many,
so the check fails with the value made 1% larger. The program's sets' makespans match a direct
count; its greedy form is a path of the program (never below it); the list schedule and the
jumps are schedules the independent checker passes at the value they report; the search's
offer keeps only a better, valid incumbent and starts nothing past its deadline."""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from blitzplan import LiveScalingInstance, validate_schedule
from blitzplan.live.exact.common import Start, decode, start_point
from blitzplan.live.exact.enumerate import _interleavings
from blitzplan.live.exact.offers import Offers
from blitzplan.live.preemptive_order import (
    alone_chains,
    greedy_order,
    list_sequence,
    makespans,
    order_program,
    preemptive_jump,
)
from blitzplan.live.schedule import evaluate_objective, timetable
from blitzplan.solvers import SolveStatus
from tests.improved_check import built

TOL = 1e-9


def _tiny(rng: random.Random) -> LiveScalingInstance:
    """2-4 batches, 2-3 layers, the head late or not, O busy or not."""
    L, n = rng.randint(2, 3), rng.randint(2, 4)
    ready = sorted(rng.uniform(0.0, 2.0) for _ in range(L))
    p_new = [rng.choice([0.2, 0.5, 1.0]) for _ in range(n)]
    return LiveScalingInstance(
        ready,
        sorted(rng.choice([0.0, 0.0, 0.3, 1.0, 2.0]) for _ in range(n)),
        p_new,
        [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new],
        [rng.choice([0.0, 0.1, 0.4]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 0.5, 2.0]),
        head_ready_s=ready[-1] + rng.choice([0.0, 0.0, 1.5]),
    )


def _problems() -> Iterator[tuple[LiveScalingInstance, list[int], list[int]]]:
    """(instance, split, O order): every split with at most 6 N layers, O in FIFO order and,
    for every other split, in a random order."""
    rng = random.Random(23)
    for _ in range(45):
        inst = _tiny(rng)
        L = inst.num_layers
        for split in itertools.product(range(L + 1), repeat=inst.num_batches):
            if sum(split) > 6:
                continue
            old = [b for b in inst.fifo_order if split[b] < L]
            yield inst, list(split), old
            if len(old) > 1 and rng.random() < 0.5:
                yield inst, list(split), rng.sample(old, len(old))


def _least(inst: LiveScalingInstance, split: list[int], old: list[int]) -> float:
    """The least mean latency over every order of N's layers."""
    return min(
        evaluate_objective(inst, timetable(inst, split, order, old)[2], "mean_latency")
        for order in _interleavings(list(split))  # it counts down its argument
    )


def test_the_program_is_below_every_schedule_at_its_splits() -> None:
    """Property: at fixed splits and O order, the program's value is at most the least
    schedule's, and equal on many problems (the check fails with it 1% larger)."""
    tried = tight = 0
    for inst, split, old in _problems():
        bound, order = order_program(inst, split, old)
        least = _least(inst, split, old)
        assert bound <= least * (1 + TOL) + TOL
        assert sorted(order) == [b for b in range(inst.num_batches) if split[b] > 0]
        tried += 1
        tight += 1.01 * bound > least * (1 + TOL) + TOL
    assert tried > 1_000
    assert tight > tried // 2


def test_makespans_count_the_work_released_from_each_point() -> None:
    rng = random.Random(5)
    for _ in range(30):
        inst = _tiny(rng)
        split = [rng.randint(0, inst.num_layers) for _ in range(inst.num_batches)]
        starts, _ = alone_chains(inst, split)
        items = [b for b in range(inst.num_batches) if split[b] > 0]
        found = makespans(inst, starts, items)
        for mask in range(1 << len(items)):
            chosen = [items[b] for b in range(len(items)) if mask >> b & 1]
            points = [t for i in chosen for t in starts[i]]
            direct = max(
                (
                    t + sum(inst.new_layer_s[i] * sum(s >= t for s in starts[i]) for i in chosen)
                    for t in points
                ),
                default=-math.inf,
            )
            assert found[mask] == pytest.approx(direct, rel=1e-12)


def test_the_greedy_order_is_a_path_of_the_program() -> None:
    """Property: the greedy form's value is the program's value of one order, so never
    below the program's; its order lists every batch with N work once."""
    equal = 0
    for count, (inst, split, old) in enumerate(_problems()):
        if count % 7:
            continue
        bound, _ = order_program(inst, split, old)
        value, order = greedy_order(inst, split, old)
        assert value >= bound - TOL
        assert sorted(order) == [b for b in range(inst.num_batches) if split[b] > 0]
        equal += value <= bound + TOL
    assert equal > 0


def test_the_list_schedule_is_valid_and_above_the_program() -> None:
    for count, (inst, split, old) in enumerate(_problems()):
        if count % 5:
            continue
        bound, order = order_program(inst, split, old)
        sequence = list_sequence(inst, split, order)
        schedule = built(inst, split, sequence, old, old_order="free")
        assert validate_schedule(inst, schedule).ok
        assert schedule.objective >= bound - TOL


def _case(seed: int) -> tuple[LiveScalingInstance, list[int], list[int], list[int]]:
    """6-10 layers, 4-7 batches, a random split, N's layers interleaved at random, O FIFO."""
    rng = random.Random(seed)
    L, n = rng.randint(6, 10), rng.randint(4, 7)
    p_new = [rng.choice([0.2, 0.5, 1.0, 2.5]) for _ in range(n)]
    inst = LiveScalingInstance(
        sorted(rng.uniform(0.0, 4.0) for _ in range(L)),
        sorted(rng.choice([0.0, 0.0, 0.5, 2.0, 4.0]) for _ in range(n)),
        p_new,
        [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new],
        [rng.choice([0.0, 0.1, 0.3]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 1.0, 3.0]),
    )
    split = [rng.choice([L, 0, rng.randint(0, L)]) for _ in range(n)]
    left, new = list(split), []
    while any(left):
        batch = rng.choice([b for b in range(n) if left[b]])
        left[batch] -= 1
        new.append(batch)
    return inst, split, new, [b for b in inst.fifo_order if split[b] < L]


def poor_start(seed: int, old_order: str = "fifo") -> Start:
    """A 60 s start of the exact search on :func:`_case`'s instance with its poor schedule as
    the incumbent (no warm start, no relaxation)."""
    inst, split, new, old = _case(seed)
    start = start_point(
        inst,
        objective="mean_latency",
        old_order=old_order,
        backend="bnb",
        time_limit_s=60.0,
        hint=None,
        relax=False,
        warm=False,
    )
    start.incumbent = decode(inst, split, new, old, "mean_latency", old_order, "bnb")
    return start


def test_jumps_are_valid_schedules_at_their_value() -> None:
    """Property: the jump moves one batch's split to 0 or L, keeps O's order FIFO, and its
    schedule passes the checker at the value it reports."""
    for seed in range(120):
        inst, split, _, old = _case(seed)
        found = preemptive_jump(inst, split, old, deadline_s=math.inf)
        assert found is not None
        moved, new, blocks, value = found
        changed = [b for b in range(inst.num_batches) if moved[b] != split[b]]
        assert len(changed) == 1 and moved[changed[0]] in (0, inst.num_layers)
        assert blocks == [b for b in inst.fifo_order if moved[b] < inst.num_layers]
        schedule = built(inst, moved, new, blocks, old_order="fifo")
        assert validate_schedule(inst, schedule).ok
        assert schedule.objective == pytest.approx(value, rel=1e-12)


def test_no_jump_is_scored_past_the_deadline() -> None:
    inst, split, _, old = _case(0)
    assert preemptive_jump(inst, split, old, deadline_s=time.perf_counter()) is None


def test_the_offer_keeps_a_better_valid_incumbent() -> None:
    """The search's offer (:meth:`Offers.preempted`) from a poor incumbent: the incumbent
    after it passes the checker and is no worse; with no time left it does nothing."""
    lowered = 0
    for seed in range(40):
        start = poor_start(seed)
        inst = start.instance
        before = start.incumbent.objective
        Offers(start).preempted(time.perf_counter())
        assert start.incumbent.objective == before
        Offers(start).preempted(start.deadline_s)
        assert validate_schedule(inst, replace(start.incumbent, status=SolveStatus.UNKNOWN)).ok
        assert start.incumbent.objective <= before
        lowered += start.incumbent.objective < before
    assert lowered > 10
