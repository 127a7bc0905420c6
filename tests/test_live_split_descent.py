"""The split descent with N in the preemptive program's order (:mod:`blitzplan.live.split_descent`)
and its offer in the exact search (:meth:`~blitzplan.live.exact.offers.Offers.programmed`).

Checked: the descent's end is a schedule the independent checker passes at the value it
reports, O's order FIFO over the batches O serves; the program's value at its end is never
above the start's (it only keeps moves that lower it) and is lower on many cases; it starts
nothing past its deadline; the search's offer keeps only a better, valid incumbent, and only
from a capacity program's plan at a gap of :data:`~blitzplan.live.exact.offers.DESCENT_GAP`
or more with :data:`~blitzplan.live.exact.offers.DESCENT_MIN_LEFT_S` or more left. (An
incumbent step: no bound changes, so no oracle.)"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from blitzplan import validate_schedule
from blitzplan.live.bound.relaxation import RelaxedPlan
from blitzplan.live.exact import offers as offers_module
from blitzplan.live.exact.common import decode, start_point
from blitzplan.live.exact.offers import Offers
from blitzplan.live.preemptive_order import order_program
from blitzplan.live.split_descent import split_descent
from blitzplan.solvers import SolveStatus
from tests.improved_check import built
from tests.test_live_preemptive_order import _case


def test_the_descent_ends_at_a_valid_schedule_no_worse_by_the_program() -> None:
    """Property: FIFO blocks, a schedule the checker passes at the reported value, and the
    program's value at the end at most the start's (lower on some)."""
    lowered = 0
    for seed in range(60):
        inst, split, _, old = _case(seed)
        found = split_descent(inst, split, old, deadline_s=math.inf)
        assert found is not None
        L = inst.num_layers
        assert all(0 <= k <= L for k in found.split)
        assert found.old == [b for b in inst.fifo_order if found.split[b] < L]
        schedule = built(inst, found.split, found.new, found.old, old_order="fifo")
        assert validate_schedule(inst, schedule).ok
        assert schedule.objective == pytest.approx(found.value, rel=1e-12)
        before = order_program(inst, split, old)[0]
        after = order_program(inst, found.split, found.old)[0]
        assert after <= before + 1e-12
        lowered += after < before - 1e-9
    assert lowered > 20


def test_no_descent_starts_past_the_deadline() -> None:
    inst, split, _, old = _case(0)
    assert split_descent(inst, split, old, deadline_s=time.perf_counter()) is None


def _plan(split: list[int], old: list[int]) -> RelaxedPlan:
    return RelaxedPlan(tuple(old), tuple(split), 0.0, tuple(0.0 for _ in old))


def test_the_offer_keeps_a_better_valid_incumbent(monkeypatch: pytest.MonkeyPatch) -> None:
    """From a poor incumbent and a program's plan at another split: the incumbent after the
    offer passes the checker and is no worse (lower on some); no plan, no descent; at a gap
    under :data:`~blitzplan.live.exact.offers.DESCENT_GAP` or with too little time left,
    none either."""
    monkeypatch.setattr(offers_module, "PREEMPTIVE_GAP", math.inf)  # the jump apart
    lowered = 0
    for seed in range(40):
        inst, split, new, old = _case(seed)
        start = start_point(
            inst,
            objective="mean_latency",
            old_order="fifo",
            backend="bnb",
            time_limit_s=60.0,
            hint=None,
            relax=False,
            warm=False,
        )
        start.incumbent = decode(inst, split, new, old, "mean_latency", "fifo", "bnb")
        before = start.incumbent.objective
        start.bound = 0.0
        offers = Offers(start)
        offers.preempted(start.deadline_s)  # no program's plan kept
        assert start.incumbent.objective == before
        L = inst.num_layers
        other = [L - k for k in split]
        plan = _plan(other, [b for b in inst.fifo_order if other[b] < L])
        monkeypatch.setattr(offers_module, "DESCENT_GAP", math.inf)
        offers.programs.append(plan)
        offers.preempted(start.deadline_s)
        assert not offers.programs
        monkeypatch.setattr(offers_module, "DESCENT_GAP", 0.01)
        offers.programs.append(plan)
        offers.preempted(time.perf_counter() + 0.5 * offers_module.DESCENT_MIN_LEFT_S)
        assert start.incumbent.objective == before and not offers.programs  # too little left
        offers.programs.append(plan)
        offers.preempted(start.deadline_s)
        assert validate_schedule(inst, replace(start.incumbent, status=SolveStatus.UNKNOWN)).ok
        assert start.incumbent.objective <= before
        lowered += start.incumbent.objective < before
    assert lowered > 5
