"""The descent on the preemptive program's score (:mod:`blitzplan.live.preemptive_descent`) and
its offer under a free O order (:meth:`~blitzplan.live.exact.offers.Offers.preempted`)."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from blitzplan import validate_schedule
from blitzplan.live.exact import offers as offers_module
from blitzplan.live.exact.common import decode, start_point
from blitzplan.live.exact.offers import Offers
from blitzplan.live.preemptive_descent import SPLIT_STEPS, preemptive_descent
from blitzplan.live.preemptive_order import greedy_order
from blitzplan.live.split_jump import old_after_move
from blitzplan.solvers import SolveStatus
from tests.improved_check import built
from tests.test_live_preemptive_order import _case


def _neighbours(inst, split, old):  # type: ignore[no-untyped-def]
    """Every point one step of the descent reaches from ``split`` and ``old`` (free order)."""
    L = inst.num_layers
    for batch, k in enumerate(split):
        for target in sorted({0, L, *(k + d for d in SPLIT_STEPS)} - {k}):
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
        found = preemptive_descent(inst, split, old, deadline_s=math.inf)
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


def test_under_fifo_o_keeps_its_order_and_no_step_runs_past_the_deadline() -> None:
    """Without ``free`` O's order only loses and gains batches (at their release-order place);
    with the deadline passed the descent scores nothing."""
    for seed in range(30):
        inst, split, _, old = _case(seed)
        found = preemptive_descent(inst, split, old, deadline_s=math.inf, free=False)
        if found is not None:
            assert found[2] == [b for b in inst.fifo_order if found[0][b] < inst.num_layers]
    inst, split, _, old = _case(0)
    assert preemptive_descent(inst, split, old, deadline_s=time.perf_counter()) is None


def _start(seed: int, old_order: str):  # type: ignore[no-untyped-def]
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


def test_the_root_offers_the_descent_under_a_free_order_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``preempted(..., descend=True)`` under a free order runs the descent (not the jump) and
    keeps a better incumbent that passes the checker (on most of 40 poor incumbents); without
    ``descend``, or under FIFO, the descent does not run."""
    called: list[str] = []
    real = offers_module.preemptive_descent

    def descent(*args, **kwargs):  # type: ignore[no-untyped-def]
        called.append("descent")
        return real(*args, **kwargs)

    monkeypatch.setattr(offers_module, "preemptive_descent", descent)
    lowered = 0
    for seed in range(40):
        start = _start(seed, "free")
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
    fifo = _start(0, "fifo")
    Offers(fifo).preempted(fifo.deadline_s, descend=True)
    assert called == []
