"""refine_budget: the greedy multicast's refinements cut short keep a valid plan no worse than
the greedy's, and the plan's notes say so. Fake clocks and a zero budget: no wall-clock asserts."""

from __future__ import annotations

import itertools

import pytest

from blitzplan import ClusterState, InvalidInputError, load_topology
from blitzplan.multicast import CLOSE_ENOUGH, plan_multicast, validate_multicast
from blitzplan.multicast.refine_budget import REFINE_MIN_S, RefineBudget
from blitzplan.scale import PlanOptions, ScaleRequest, plan

MODEL = "llama-3-8b"


def _two_sources() -> ClusterState:
    """paper-a800-32 with two llama-3-8b decode instances: the greedy plan of 10 new instances
    is more than CLOSE_ENOUGH above its cut bound, so the refinements run."""
    topology = load_topology("paper-a800-32")
    state = ClusterState(topology, models=[MODEL])
    gpus = topology.gpus()
    for k in range(2):
        state.add_instance(MODEL, gpus=[gpus[4 * k]], role="decode")
    return state


def _ticks(step: float = 1.0):
    """A fake clock: every reading is ``step`` seconds after the last."""
    counter = itertools.count()
    return lambda: next(counter) * step


@pytest.mark.parametrize("readings", [0.0, 3.0])
def test_a_cut_short_refinement_keeps_a_valid_plan_no_worse_than_the_greedy(
    readings: float,
) -> None:
    state = _two_sources()
    greedy = plan_multicast(state, MODEL, count=10, polish_evaluations=0)
    gain = greedy.objective_s - greedy.lower_bound_s  # the most the refinements could gain
    assert gain > greedy.lower_bound_s * CLOSE_ENOUGH  # refinements run
    # each clock reading is a second and the budget allows ``readings`` seconds (no floor):
    # 0, none runs; 3, three readings
    budget = RefineBudget(readings / gain, clock=_ticks(), floor_s=0.0)
    cut = plan_multicast(state, MODEL, count=10, refine_budget=budget)
    assert budget.cut and budget.skipped == (readings == 0)
    assert validate_multicast(state, cut) == ()
    assert cut.objective_s <= greedy.objective_s * (1 + 1e-12)
    assert cut.lower_bound_s <= cut.objective_s
    if budget.skipped:  # the greedy's plan as it is
        assert cut == greedy


def test_the_refinements_run_when_their_gain_pays_for_a_plan() -> None:
    """Hand-computed: 2x a 0.1 s gain (0.2 s) pays for a plan of 1,000 lanes (0.5 ms + 1,000
    x 20 us = 20.5 ms), not for one of 10,000 (200.5 ms); it is then their allowance. 2x
    0.01 s pays for a plan of 100 lanes (2.5 ms), allowed REFINE_MIN_S; no limit without a
    factor, none at 0."""
    budget = RefineBudget(2.0, clock=lambda: 5.0)
    assert budget.worth(1_000, 0.1) and not budget.cut
    budget.start()
    assert budget.left() == pytest.approx(0.2)
    large = RefineBudget(2.0, clock=lambda: 5.0)
    assert not large.worth(10_000, 0.1) and large.cut and large.skipped
    assert "2x the 100 ms they could gain at most" in large.note()
    small = RefineBudget(2.0, clock=lambda: 5.0)
    assert small.worth(100, 0.01)
    small.start()
    assert small.left() == pytest.approx(REFINE_MIN_S)
    assert RefineBudget(None).worth(10**9, 1e-9)
    assert not RefineBudget(0).worth(0, 10.0)


def test_an_ample_budget_is_not_cut_and_matches_no_limit() -> None:
    state = _two_sources()
    ample = RefineBudget(100.0, clock=lambda: 0.0)  # a clock that never moves
    unlimited = plan_multicast(state, MODEL, count=10, refine_budget=RefineBudget(None))
    assert plan_multicast(state, MODEL, count=10, refine_budget=ample) == unlimited
    assert not ample.cut


def test_plan_notes_say_when_the_refinements_were_skipped() -> None:
    state = _two_sources()
    cut = plan(state, ScaleRequest(MODEL, prefill=10), refine_budget=0)
    greedy = plan(state, ScaleRequest(MODEL, prefill=10), deadline_s=60.0)  # no refinements
    assert any(n.startswith("refine_budget: ") and "skipped" in n for n in cut.notes)
    assert cut.multicast.objective_s <= greedy.multicast.objective_s * (1 + 1e-12)
    assert len(cut.new_instances) == 10 and not cut.missing
    assert validate_multicast(state, cut.multicast) == ()
    unlimited = plan(state, ScaleRequest(MODEL, prefill=10), refine_budget=None)
    assert not any(n.startswith("refine_budget") for n in unlimited.notes)


@pytest.mark.parametrize("bad", [-1.0, True, "1", float("nan")])
def test_refine_budget_must_be_a_number_at_least_zero(bad: object) -> None:
    with pytest.raises(InvalidInputError, match="refine_budget"):
        PlanOptions(refine_budget=bad)  # type: ignore[arg-type]


def test_the_refinements_time_is_kept_apart_from_the_greedys() -> None:
    """What a plan took beyond its greedy (a plan under ``deadline_s`` skips it) is measured
    from ``start``: 0 before it, then the clock's advance since."""
    readings = iter([10.0, 10.0, 13.5])
    budget = RefineBudget(None, clock=lambda: next(readings))
    assert budget.refining_s() == 0.0
    budget.start()  # reads 10.0
    assert budget.refining_s() == 0.0  # reads 10.0
    assert budget.refining_s() == 3.5  # reads 13.5


def test_a_deadline_ends_the_allowance_when_earlier() -> None:
    """A 2x allowance of a 1 s gain from 5.0 ends at 7.0, or at a deadline of 5.5; without a
    factor the deadline alone ends it (2 s left at 5.0), and a deadline past the allowance
    changes nothing."""
    for deadline, until in ((5.5, 5.5), (9.0, 7.0), (None, 7.0)):
        budget = RefineBudget(2.0, clock=lambda: 5.0, floor_s=0.0, deadline=deadline)
        assert budget.worth(0, 1.0)
        budget.start()
        assert budget.until == until
    budget = RefineBudget(None, clock=lambda: 5.0, deadline=7.0)
    budget.start()
    assert budget.left() == 2.0 and not budget.spent()
    assert RefineBudget(None, clock=lambda: 8.0, deadline=7.0).spent()
