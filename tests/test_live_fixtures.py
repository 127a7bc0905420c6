"""Hand-computed live-scaling fixtures, run against every method and every backend.

Each fixture states its arithmetic; every schedule is also checked by the validator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.solvers import SolveStatus, available_backends


@dataclass(frozen=True)
class Fixture:
    name: str
    instance: LiveScalingInstance
    expected: dict[str, float]
    """Mean latency per method; "exact" is the optimum."""


FIXTURES = [
    # L=2, one batch at 0, 1 s per layer on either side, O free now, layers land at 1 s and 2 s.
    # All on O: 0 -> 2. On N: layer 1 at 1..2, layer 2 at 2..3 -> 3. So O alone, latency 2, is
    # optimal and what every method does (O is idle when the batch arrives).
    Fixture(
        "old-is-free",
        LiveScalingInstance([1.0, 2.0], [0.0], 1.0, 1.0, 0.0),
        {"stop_the_world": 2.0, "best_effort": 2.0, "zigzag": 2.0, "improve": 2.0, "exact": 2.0},
    ),
    # L=2, every layer already there, O busy until 10: N runs both layers 0..1, 1..2 -> 2.
    # Stop-the-world (N is fully loaded at 0), best-effort (it has both layers) and ZigZag agree.
    Fixture(
        "old-is-busy",
        LiveScalingInstance([0.0, 0.0], [0.0], 1.0, 1.0, 0.5, old_free_at_s=10.0),
        {"stop_the_world": 2.0, "best_effort": 2.0, "zigzag": 2.0, "improve": 2.0, "exact": 2.0},
    ),
    # L=2, three batches at 0, 1 s per layer, no hand-off cost, layers land at 1 s and 2 s.
    # Stop-the-world: O runs b0 0..2 and b1 2..4; N, loaded at 2, runs b2 2..4: (2+4+4)/3.
    # Best-effort: O runs b0 0..2; N takes b1 at 1, runs layer 1 1..2 and hands it off; at 2 O
    # takes b1 (older than b2) 2..3; N, now complete, runs b2 2..4: (2+3+4)/3 = 3.
    # ZigZag: O runs b0 0..2; N admits b1 at 1 (layer 1 1..2); at 2 O would finish b1 at
    # 2+0+1 = 3, not before N alone (layer 2 at 2..3 = 3), so O takes b2 2..4 and N runs b1's
    # layer 2 2..3: (2+3+4)/3 = 3. Optimum: each machine finishes one 2-layer batch by 2 (O) or
    # 3 (N, whose first layer lands at 1), the third needs 2 more layer-times: 2+3+4 = 9, mean 3.
    Fixture(
        "three-batches",
        LiveScalingInstance([1.0, 2.0], [0.0, 0.0, 0.0], 1.0, 1.0, 0.0),
        {"stop_the_world": 10 / 3, "best_effort": 3.0, "zigzag": 3.0, "improve": 3.0, "exact": 3.0},
    ),
]

EXACT_BACKENDS = ["bnb", "highs", "cbc", "cpsat", "enumerate"]


def _run(fixture: Fixture, method: str, backend: str | None = None, warm_start: bool = True):
    limit = 30.0 if method == "exact" else None
    schedule = schedule_live(
        fixture.instance, method=method, backend=backend, time_limit_s=limit, warm_start=warm_start
    )
    report = validate_schedule(fixture.instance, schedule)
    assert report.ok, report.violations
    return schedule


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
@pytest.mark.parametrize("method", ["stop_the_world", "best_effort", "zigzag", "improve"])
def test_heuristics_match_hand_computation(fixture: Fixture, method: str) -> None:
    schedule = _run(fixture, method)
    assert schedule.objective == pytest.approx(fixture.expected[method], rel=1e-12)
    assert schedule.status in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE)
    assert schedule.bound is not None and schedule.bound <= schedule.objective + 1e-12


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f.name)
@pytest.mark.parametrize("backend", EXACT_BACKENDS)
@pytest.mark.parametrize("warm_start", [True, False], ids=["warm", "cold"])
def test_exact_backends_find_the_hand_computed_optimum(
    fixture: Fixture, backend: str, warm_start: bool
) -> None:
    if backend not in available_backends():
        pytest.skip(f"{backend} is not installed")
    schedule = _run(fixture, "exact", backend, warm_start)
    assert schedule.status is SolveStatus.OPTIMAL
    assert schedule.objective == pytest.approx(fixture.expected["exact"], rel=1e-9)
    assert schedule.gap is not None and schedule.gap <= 1e-5


def test_three_batches_schedules_in_detail() -> None:
    """The ZigZag schedule of the third fixture, operation by operation."""
    instance = FIXTURES[2].instance
    schedule = schedule_live(instance, method="zigzag")
    assert schedule.split == (0, 2, 0)
    assert [(op.batch, op.layer, op.start_s, op.end_s) for op in schedule.new_ops] == [
        (1, 1, 1.0, 2.0),
        (1, 2, 2.0, 3.0),
    ]
    assert [(op.batch, op.first_layer, op.start_s, op.end_s) for op in schedule.old_ops] == [
        (0, 1, 0.0, 2.0),
        (2, 1, 2.0, 4.0),
    ]
    assert schedule.completion_s == (2.0, 3.0, 4.0)


@pytest.mark.parametrize("method", ["stop_the_world", "best_effort", "zigzag", "improve"])
def test_an_impossible_slo_is_infeasible_for_heuristics(method: str) -> None:
    """A 2-layer batch needs at least 2 s; an SLO of 1 s is proven impossible by the bound."""
    instance = LiveScalingInstance([1.0, 2.0], [0.0], 1.0, 1.0, 0.0, slo_s=1.0)
    schedule = schedule_live(instance, method=method, objective="hard_slo")
    assert schedule.status is SolveStatus.INFEASIBLE
    assert math.isinf(schedule.objective) and not schedule.has_ops
    assert validate_schedule(instance, schedule).ok


@pytest.mark.parametrize("backend", EXACT_BACKENDS)
def test_an_impossible_slo_is_infeasible_for_exact_backends(backend: str) -> None:
    """Each batch alone meets 2.5 s, but only one can finish by then: infeasible together.

    Two batches at 0, L=2, 1 s per layer, layers there at 0 and 0: O can finish one by 2 and
    N one by 2; an SLO of 1.5 s is missed by both alone, so the relaxation proves it. With an
    SLO of 2.0 s both fit (one per instance) and the optimum is 2.
    """
    if backend not in available_backends():
        pytest.skip(f"{backend} is not installed")
    tight = LiveScalingInstance([0.0, 0.0], [0.0, 0.0], 1.0, 1.0, 0.0, slo_s=1.5)
    schedule = schedule_live(tight, method="exact", backend=backend, objective="hard_slo")
    assert schedule.status is SolveStatus.INFEASIBLE
    assert validate_schedule(tight, schedule).ok
    fits = LiveScalingInstance([0.0, 0.0], [0.0, 0.0], 1.0, 1.0, 0.0, slo_s=2.0)
    schedule = schedule_live(fits, method="exact", backend=backend, objective="hard_slo")
    assert schedule.status is SolveStatus.OPTIMAL
    assert schedule.objective == pytest.approx(2.0)
    assert validate_schedule(fits, schedule).ok


def test_an_slo_only_two_batches_together_miss_is_infeasible() -> None:
    """Three batches at 0 with every layer there: 6 layer-seconds of work on two instances end
    at 3 at the earliest, so an SLO of 2.9 s is infeasible though each batch alone meets it (2 s);
    the N-capacity relaxation cannot see this, the exact models must prove it."""
    instance = LiveScalingInstance([0.0, 0.0], [0.0] * 3, 1.0, 1.0, 0.0, slo_s=2.9)
    for backend in ("enumerate", "bnb", "highs", "cbc", "cpsat"):
        schedule = schedule_live(instance, method="exact", backend=backend, objective="hard_slo")
        assert schedule.status is SolveStatus.INFEASIBLE, backend
    zigzag = schedule_live(instance, method="zigzag", objective="hard_slo")
    assert zigzag.status is SolveStatus.UNKNOWN  # the cheap bound cannot prove it
    assert validate_schedule(instance, zigzag).ok


def test_a_failing_solver_process_keeps_the_incumbent_or_reports_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If the MILP solver process dies, the answer is the incumbent (never OPTIMAL unless the
    bound proves it), or ERROR when there was no starting schedule."""
    pulp = pytest.importorskip("pulp")
    import blitzplan.live.exact.milp as live_milp

    def dies(*args: object, **kwargs: object) -> None:
        raise pulp.PulpSolverError("killed")

    monkeypatch.setattr(live_milp, "solve_once", dies)
    instance = LiveScalingInstance([0.0, 0.0], [0.0] * 3, 1.0, 1.0, 0.0)  # relaxation is loose
    warm = schedule_live(instance, method="exact", backend="cbc", time_limit_s=5)
    assert warm.status is SolveStatus.FEASIBLE and "cbc failed: killed" in warm.message
    assert validate_schedule(instance, warm).ok
    cold = schedule_live(instance, method="exact", backend="cbc", time_limit_s=5, warm_start=False)
    assert cold.status is SolveStatus.ERROR and not cold.has_ops
    assert validate_schedule(instance, cold).ok
