"""The descent over the splits (and, under a free O order, O's blocks) on the preemptive
program's score (:mod:`blitzplan.live.preemptive_descent`) and its offers in the exact search.

Nothing here is a bound: the descent's schedules are only offered. What is checked: the
schedule it returns passes the independent checker at the value it reports, its O order is FIFO
where the start's was, its greedy score is below the start's, it starts nothing past its
deadline, and the search's offer (:meth:`Offers.preempted`) keeps only a better, valid
incumbent, the descent lowering some incumbents the jump alone leaves; from the capacity
program's plan (:meth:`Offers.programmed`) only at a gap of
:data:`~blitzplan.live.exact.offers.PROGRAM_DESCENT_GAP` or more with
:data:`~blitzplan.live.exact.offers.PROGRAM_DESCENT_MIN_LEFT_S` or more left. Under a free
order the descent ends at a local minimum of its score (every neighbour enumerated) and is
offered at the root alone."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from blitzplan import validate_schedule
from blitzplan.live.bound.relaxation import RelaxedPlan
from blitzplan.live.exact import offers as offers_module
from blitzplan.live.exact.offers import Offers
from blitzplan.live.preemptive_descent import FREE_STEPS, kicks, preemptive_descent
from blitzplan.live.preemptive_order import greedy_order
from blitzplan.live.split_jump import old_after_move
from blitzplan.solvers import SolveStatus
from tests.improved_check import built
from tests.test_live_preemptive_order import _case, poor_start

ROUNDS = offers_module.DESCENT_ROUNDS


def test_descents_are_valid_schedules_scored_below_their_start() -> None:
    """Property: where the descent returns splits, their schedule passes the checker at the
    value it reports, O's order stays FIFO and the greedy score is below the start's."""
    found_some = 0
    for seed in range(120):
        inst, split, _, old = _case(seed)
        found = preemptive_descent(inst, split, old, deadline_s=math.inf)
        if found is None:
            continue
        found_some += 1
        moved, new, blocks, value = found
        assert blocks == [b for b in inst.fifo_order if moved[b] < inst.num_layers]
        assert greedy_order(inst, moved, blocks)[0] < greedy_order(inst, split, old)[0]
        schedule = built(inst, moved, new, blocks, old_order="fifo")
        assert validate_schedule(inst, schedule).ok
        assert schedule.objective == pytest.approx(value, rel=1e-12)
    assert found_some > 30


def test_kicks_move_the_batches_at_an_end_to_the_middle() -> None:
    inst, _, _, _ = _case(3)
    L, n = inst.num_layers, inst.num_batches
    split = [L, 0, 1, L, 0] + [2] * (n - 5)
    late = sorted(range(n), key=lambda i: -inst.release_s[i])
    expected = [i for i in late if i in (1, 4)] + [i for i in late if i in (0, 3)]
    assert list(kicks(inst, split)) == [(i, L // 2) for i in expected]


def test_no_descent_starts_past_the_deadline() -> None:
    inst, split, _, old = _case(0)
    assert preemptive_descent(inst, split, old, deadline_s=time.perf_counter()) is None


def _offered(seed: int, descent: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[float, float]:
    """(the incumbent before, after) :meth:`Offers.preempted` from a poor incumbent."""
    monkeypatch.setattr(offers_module, "DESCENT_ROUNDS", ROUNDS if descent else 0)
    start = poor_start(seed)
    inst = start.instance
    before = start.incumbent.objective
    Offers(start).preempted(start.deadline_s)
    assert validate_schedule(inst, replace(start.incumbent, status=SolveStatus.UNKNOWN)).ok
    assert start.incumbent.objective <= before
    return before, start.incumbent.objective


def test_the_offer_with_the_descent_keeps_a_better_valid_incumbent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The offer with the descent: a valid incumbent, no worse than before nor than the jump's
    alone on every case, and lower than the jump's alone on some."""
    lower = 0
    for seed in range(40):
        _, jump = _offered(seed, False, monkeypatch)
        _, both = _offered(seed, True, monkeypatch)
        assert both <= jump + 1e-12
        lower += both < jump - 1e-12
    assert lower > 3


def _plan(split: list[int], old: list[int]) -> RelaxedPlan:
    return RelaxedPlan(tuple(old), tuple(split), 0.0, tuple(0.0 for _ in old))


def test_the_programs_plan_descended_keeps_a_better_valid_incumbent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From a poor incumbent and a program's plan at another split: the incumbent after the
    offer passes the checker and is no worse (lower on some); no plan, no descent; at a gap
    under :data:`~blitzplan.live.exact.offers.PROGRAM_DESCENT_GAP` or with too little time left,
    none either."""
    monkeypatch.setattr(offers_module, "PREEMPTIVE_GAP", math.inf)  # the jump and its descent apart
    lowered = 0
    for seed in range(40):
        start = poor_start(seed)
        inst, split = start.instance, list(start.incumbent.split)
        before = start.incumbent.objective
        start.bound = 0.0
        offers = Offers(start)
        offers.preempted(start.deadline_s)  # no program's plan kept
        assert start.incumbent.objective == before
        L = inst.num_layers
        other = [L - k for k in split]
        plan = _plan(other, [b for b in inst.fifo_order if other[b] < L])
        monkeypatch.setattr(offers_module, "PROGRAM_DESCENT_GAP", math.inf)
        offers.programs.append(plan)
        offers.preempted(start.deadline_s)
        assert not offers.programs
        monkeypatch.setattr(offers_module, "PROGRAM_DESCENT_GAP", 0.01)
        offers.programs.append(plan)
        offers.preempted(time.perf_counter() + 0.5 * offers_module.PROGRAM_DESCENT_MIN_LEFT_S)
        assert start.incumbent.objective == before and not offers.programs  # too little left
        offers.programs.append(plan)
        offers.preempted(start.deadline_s)
        assert validate_schedule(inst, replace(start.incumbent, status=SolveStatus.UNKNOWN)).ok
        assert start.incumbent.objective <= before
        lowered += start.incumbent.objective < before
    assert lowered > 5


def _neighbours(inst, split, old):  # type: ignore[no-untyped-def]
    """Every point one step of the descent reaches from ``split`` and ``old`` (free order)."""
    L = inst.num_layers
    for batch, k in enumerate(split):
        for target in sorted({0, L, *(k + d for d in FREE_STEPS)} - {k}):
            if 0 <= target <= L:
                moved = [*split[:batch], target, *split[batch + 1 :]]
                yield moved, old_after_move(inst, old, batch, k, target)
    for place in range(len(old)):
        for to in range(len(old)):
            if to != place:
                order = [b for b in old if b != old[place]]
                order.insert(to, old[place])
                yield list(split), order


def test_the_descent_ends_at_a_valid_schedule_at_a_local_minimum_of_the_score() -> None:
    """Property: from a random split and O order the descent returns a schedule that passes the
    checker at the value it reports, every batch O serves in its O order once, its score
    (the program's greedy form) below the start's and no step from it scoring lower; None only
    where no step from the start lowers the score."""
    moved_count = 0
    for seed in range(60):
        inst, split, _, old = _case(seed)
        old = old[::-1]  # a free order: not FIFO
        start_score = greedy_order(inst, split, old)[0]
        found = preemptive_descent(inst, split, old, deadline_s=math.inf, free=True)
        if found is None:
            for trial, order in _neighbours(inst, split, old):
                assert greedy_order(inst, trial, order)[0] >= start_score * (1 - 1e-12)
            continue
        moved_count += 1
        moved, new, blocks, value = found
        assert sorted(blocks) == [b for b in range(inst.num_batches) if moved[b] < inst.num_layers]
        schedule = built(inst, moved, new, blocks, old_order="free")
        assert validate_schedule(inst, schedule).ok
        assert schedule.objective == pytest.approx(value, rel=1e-12)
        score = greedy_order(inst, moved, blocks)[0]
        assert score < start_score
        for trial, order in _neighbours(inst, moved, blocks):
            assert greedy_order(inst, trial, order)[0] >= score * (1 - 1e-12)
    assert moved_count > 30


def test_the_root_offers_the_descent_under_a_free_order_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``preempted(..., descend=True)`` under a free order runs the descent (not the jump) and
    keeps a better incumbent that passes the checker (on most of 40 poor incumbents); without
    ``descend`` nothing runs."""
    called: list[str] = []
    real = offers_module.preemptive_descent

    def descent(*args, **kwargs):  # type: ignore[no-untyped-def]
        called.append("descent")
        return real(*args, **kwargs)

    monkeypatch.setattr(offers_module, "preemptive_descent", descent)
    lowered = 0
    for seed in range(40):
        start = poor_start(seed, "free")
        before = start.incumbent.objective
        Offers(start).preempted(start.deadline_s)
        assert called == [] and start.incumbent.objective == before  # no jump under free
        Offers(start).preempted(start.deadline_s, descend=True)
        assert called == ["descent"]
        called.clear()
        unsettled = replace(start.incumbent, status=SolveStatus.UNKNOWN)
        assert validate_schedule(start.instance, unsettled).ok
        assert start.incumbent.objective <= before
        lowered += start.incumbent.objective < before
    assert lowered > 10
