"""Seeded hypothesis properties of every live-scaling method and backend."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import Fleet, LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live import (
    OBJECTIVES,
    POLICIES,
    ZigZag,
    lower_bound,
    relaxation_bound,
    simulate,
)
from blitzplan.live.exact.cpsat import solve_cpsat
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.exact.milp import solve_milp
from blitzplan.solvers import SolveStatus, available_backends

HEURISTICS = ["stop_the_world", "best_effort", "zigzag"]
REL = 1e-5  # OPTIMAL is proven within this relative gap
OBJECTIVE_NAMES = sorted(OBJECTIVES)

half_steps = st.integers(min_value=0, max_value=10).map(lambda k: k / 2)  # ties are likely


@st.composite
def instances(draw: st.DrawFn, max_layers: int = 4, max_batches: int = 4) -> LiveScalingInstance:
    L = draw(st.integers(1, max_layers))
    n = draw(st.integers(1, max_batches))
    arrivals = sorted(draw(st.lists(half_steps, min_size=L, max_size=L)))
    per_batch = st.lists(st.floats(0.25, 2.0), min_size=n, max_size=n)
    p_new = draw(per_batch)
    same_gpu = draw(st.booleans())
    return LiveScalingInstance(
        arrivals,
        draw(st.lists(half_steps, min_size=n, max_size=n)),
        p_new,
        p_new if same_gpu else draw(per_batch),
        draw(st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.5]), min_size=n, max_size=n)),
        old_free_at_s=draw(half_steps),
        head_ready_s=arrivals[-1] + draw(st.sampled_from([0.0, 0.5])),
        slo_s=draw(st.lists(st.floats(1.0, 12.0), min_size=n, max_size=n)),
    )


def _tiny(instance: LiveScalingInstance, old_order: str = "free") -> bool:
    return count_schedules(instance, old_order=old_order) <= 3_000


def _check(instance: LiveScalingInstance, schedule) -> None:
    report = validate_schedule(instance, schedule)
    assert report.ok, report.violations
    if schedule.has_ops:
        assert report.objective == schedule.objective or math.isclose(
            report.objective, schedule.objective, rel_tol=1e-12
        )
    if schedule.status is SolveStatus.FEASIBLE:
        assert schedule.bound is not None and schedule.gap is not None
        assert schedule.bound <= schedule.objective


@settings(max_examples=150)
@given(
    instances(max_layers=6, max_batches=6),
    st.sampled_from(OBJECTIVE_NAMES),
    st.sampled_from(["free", "fifo"]),
)
def test_every_heuristic_schedule_validates(instance, objective: str, old_order: str) -> None:
    """Property: stop-the-world, best-effort, ZigZag and improve return valid schedules whose
    objective the validator recomputes to the reported value, with a bound when FEASIBLE."""
    for method in [*HEURISTICS, "improve"]:
        limit = 0.005 if method == "improve" else None
        schedule = schedule_live(
            instance, method=method, objective=objective, old_order=old_order, time_limit_s=limit
        )
        _check(instance, schedule)


@settings(max_examples=150)
@given(instances(max_layers=3, max_batches=3), st.sampled_from(OBJECTIVE_NAMES))
def test_exact_is_no_worse_than_any_heuristic(instance, objective: str) -> None:
    """Property: the enumerated optimum is <= every heuristic and improve, the bound each of them
    reports, the cheap and the relaxation bounds are <= it, and it validates."""
    assume(_tiny(instance))
    exact = schedule_live(instance, method="exact", backend="enumerate", objective=objective)
    _check(instance, exact)
    assert exact.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE)
    for method in [*HEURISTICS, "improve"]:
        other = schedule_live(instance, method=method, objective=objective, time_limit_s=0.005)
        _check(instance, other)
        assert exact.objective <= other.objective + 1e-9 * max(1.0, abs(other.objective))
        if other.bound is not None:
            assert other.bound <= exact.objective + 1e-9 * max(1.0, abs(exact.objective))
    bound, _, complete = relaxation_bound(instance, objective=objective)
    assert complete
    assert lower_bound(instance, objective) <= exact.objective + 1e-9
    assert bound <= exact.objective + 1e-9


@settings(max_examples=50)
@given(instances(max_layers=3, max_batches=3), st.sampled_from(["mean_latency", "makespan"]))
def test_fifo_optimum_is_no_better_than_the_free_one(instance, objective: str) -> None:
    """Property: fixing O's order can only cost; the fifo relaxation is exact when N is free."""
    assume(_tiny(instance))
    free = schedule_live(instance, method="exact", backend="enumerate", objective=objective)
    fifo = schedule_live(
        instance, method="exact", backend="enumerate", objective=objective, old_order="fifo"
    )
    _check(instance, fifo)
    assert free.objective <= fifo.objective + 1e-9


@pytest.mark.skipif(
    not {"highs", "cbc", "cpsat"} <= set(available_backends()), reason="solver missing"
)
@settings(max_examples=40)
@given(
    instances(max_layers=3, max_batches=3),
    st.sampled_from(OBJECTIVE_NAMES),
    st.sampled_from(["free", "fifo"]),
)
def test_backends_agree_wherever_two_prove_optimality(instance, objective, old_order) -> None:
    """Property: branch and bound, HiGHS, CBC, CP-SAT and enumeration (and the MILP and CP-SAT
    models without the relaxation cut) agree on the optimum whenever two of them prove it; all
    validate."""
    assume(_tiny(instance, old_order))
    hint = schedule_live(instance, method="zigzag", objective=objective, old_order=old_order)
    kwargs = {"objective": objective, "old_order": old_order, "time_limit_s": 30.0}
    answers = {
        backend: schedule_live(instance, method="exact", backend=backend, **kwargs)
        for backend in ("bnb", "highs", "cbc", "cpsat", "enumerate")
    }
    answers["highs-model"] = solve_milp(
        instance, backend="highs", hint=hint, use_relaxation=False, **kwargs
    )
    answers["cpsat-model"] = solve_cpsat(instance, hint=hint, use_relaxation=False, **kwargs)
    proven = {}
    for name, schedule in answers.items():
        _check(instance, schedule)
        if schedule.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
            proven[name] = schedule.objective
    assert len(proven) >= 2
    values = list(proven.values())
    for value in values:
        if math.isinf(values[0]):
            assert math.isinf(value), proven
        else:
            assert value == pytest.approx(values[0], rel=REL, abs=1e-9), proven


@settings(max_examples=10)
@given(instances(max_layers=6, max_batches=5), st.sampled_from(["bnb", "highs", "cbc", "cpsat"]))
def test_a_time_limit_gives_a_bound_and_a_gap(instance, backend: str) -> None:
    """Property: with a short limit an exact backend returns a valid schedule; unless proven
    OPTIMAL it is FEASIBLE with bound <= objective and gap = (objective - bound) / objective."""
    schedule = schedule_live(instance, method="exact", backend=backend, time_limit_s=0.3)
    _check(instance, schedule)
    if schedule.status is SolveStatus.FEASIBLE:
        assert schedule.gap == pytest.approx(
            (schedule.objective - schedule.bound) / schedule.objective
        )
    else:
        assert schedule.status is SolveStatus.OPTIMAL
        assert schedule.gap is not None and schedule.gap <= REL


@settings(max_examples=40)
@given(
    instances(max_layers=5, max_batches=6),
    st.lists(half_steps, min_size=1, max_size=3),
    st.integers(1, 3),
    st.sampled_from(["free", "fifo"]),
)
def test_policies_drive_fleets(instance, old_free, extra_new: int, old_order: str) -> None:
    """Property: with several new instances (shifted arrivals) and several old ones on one
    queue, every policy finishes every batch and the schedule validates against the fleet."""
    shifted = [[a + 0.5 * w for a in instance.layer_ready_s] for w in range(extra_new)]
    fleet = Fleet(
        new_layer_ready_s=[instance.layer_ready_s, *shifted],
        new_head_ready_s=[instance.head_ready_s, *(a[-1] for a in shifted)],
        old_free_at_s=old_free,
    )
    for policy in POLICIES.values():
        schedule = simulate(policy(), instance, fleet=fleet, old_order=old_order)
        report = validate_schedule(instance, schedule, fleet=fleet)
        assert report.ok, report.violations


@settings(max_examples=40)
@given(instances(max_layers=5, max_batches=5))
def test_zigzag_gives_a_valid_schedule_with_any_window(instance) -> None:
    """Property: one batch at a time, two, or eight: ZigZag's schedule validates."""
    for window in (1, 2, 8):
        policy = ZigZag(window_start=window, window_min=window)
        schedule = simulate(policy, instance)
        assert validate_schedule(instance, schedule).ok
