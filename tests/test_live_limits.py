"""Exact live-scaling solvers: no solver round loses the incumbent, rounds are given the wall
clock that is left, and a CBC process that overstays is killed.

Nothing here times a solve (speed is measured in ``benchmarks/limits.py``): the fakes and the
deadlines already past make every outcome deterministic.
"""

from __future__ import annotations

import itertools
import math
import stat
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.subsets import subset_search
from blitzplan.live.exact.common import start_point
from blitzplan.solvers import SolveStatus
from tests.clocks import StillClock
from tests.test_live_properties import instances

LOOSE = LiveScalingInstance([0.0, 0.0], [0.0] * 3, 1.0, 1.0, 0.0)
"""Three batches, every layer there: the relaxation's bound is loose, so a solver must run."""

TIGHT_SLO = LiveScalingInstance([0.0, 0.0], [0.0] * 3, 1.0, 1.0, 0.0, slo_s=2.9)
"""Infeasible under hard_slo, and ZigZag misses the SLO (no incumbent)."""


def _fake_rounds(monkeypatch: pytest.MonkeyPatch, *rounds: object) -> list[dict[str, float]]:
    """Replace the MILP's solver rounds by ``rounds`` (in turn); returns the calls' deadlines."""
    pytest.importorskip("pulp")
    import blitzplan.live.exact.milp as live_milp

    calls: list[dict[str, float]] = []
    answers = iter(rounds)

    def fake(pulp: object, prob: object, backend: str, **deadlines: float) -> object:
        calls.append(deadlines)
        return next(answers)

    monkeypatch.setattr(live_milp, "solve_once", fake)
    return calls


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_an_infeasible_round_never_discards_a_known_schedule(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    from blitzplan.solvers.pulp_run import Round

    _fake_rounds(monkeypatch, Round(False, True, math.inf))
    zigzag = schedule_live(LOOSE, method="zigzag")
    result = schedule_live(LOOSE, method="exact", backend=backend, time_limit_s=30)
    assert result.status is SolveStatus.FEASIBLE
    assert f"{backend} called a round infeasible though a schedule is known" in result.message
    assert result.has_ops and result.objective <= zigzag.objective
    assert result.gap is not None and result.gap > 0
    assert validate_schedule(LOOSE, result).ok


def test_an_infeasible_round_without_warm_start_is_an_error_not_infeasible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mean latency always has a schedule: a solver saying otherwise has failed."""
    from blitzplan.solvers.pulp_run import Round

    _fake_rounds(monkeypatch, Round(False, True, math.inf))
    result = schedule_live(LOOSE, method="exact", backend="cbc", time_limit_s=30, warm_start=False)
    assert result.status is SolveStatus.ERROR
    assert "cbc called a round infeasible though one always exists" in result.message
    assert validate_schedule(LOOSE, result).ok


def test_an_infeasible_round_proves_a_hard_slo_infeasible_when_nothing_meets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blitzplan.solvers.pulp_run import Round

    _fake_rounds(monkeypatch, Round(False, True, math.inf))
    result = schedule_live(TIGHT_SLO, method="exact", backend="highs", objective="hard_slo")
    assert result.status is SolveStatus.INFEASIBLE and not result.has_ops


def test_a_cpsat_infeasible_answer_never_discards_a_known_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cp_model = pytest.importorskip("ortools.sat.python.cp_model")
    monkeypatch.setattr(cp_model.CpSolver, "Solve", lambda self, model: cp_model.INFEASIBLE)
    result = schedule_live(LOOSE, method="exact", backend="cpsat", time_limit_s=30)
    assert result.status is SolveStatus.FEASIBLE
    assert "CP-SAT called a round infeasible though a schedule is known" in result.message
    assert validate_schedule(LOOSE, result).ok
    proven = schedule_live(TIGHT_SLO, method="exact", backend="cpsat", objective="hard_slo")
    assert proven.status is SolveStatus.INFEASIBLE


def test_a_round_the_hand_off_left_no_time_for_keeps_the_incumbent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blitzplan.solvers.pulp_run import NO_TIME, Round

    _fake_rounds(monkeypatch, Round(False, False, -math.inf, note=NO_TIME))
    result = schedule_live(LOOSE, method="exact", backend="highs", time_limit_s=30)
    assert result.status is SolveStatus.FEASIBLE and NO_TIME in result.message
    assert validate_schedule(LOOSE, result).ok


def test_every_round_is_due_before_the_call_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round is told to be over by the deadline of the whole call (counted from before the
    hint), and how long reading back may take; a round without an answer ends the solve."""
    from blitzplan.solvers.pulp_run import Round

    limit_s = 30.0
    unproven = Round(False, False, -math.inf)
    calls = _fake_rounds(monkeypatch, unproven)
    clock = StillClock()  # no time passes: a loaded machine cannot move the deadline
    monkeypatch.setattr(time, "perf_counter", clock.perf_counter)
    result = schedule_live(LOOSE, method="exact", backend="cbc", time_limit_s=limit_s)
    assert len(calls) == 1 and result.status is SolveStatus.FEASIBLE
    assert calls[0]["read_back_s"] >= 0
    assert calls[0]["stop_by_s"] <= clock.now + limit_s


def test_a_model_without_time_to_build_keeps_the_incumbent() -> None:
    pytest.importorskip("pulp")
    from blitzplan.live.exact.milp import solve_milp

    hint = schedule_live(LOOSE, method="zigzag")
    result = solve_milp(
        LOOSE,
        backend="highs",
        objective="mean_latency",
        old_order="free",
        time_limit_s=1e-9,
        hint=hint,
    )
    assert result.status is SolveStatus.FEASIBLE
    assert "no time left to build the highs model" in result.message
    assert validate_schedule(LOOSE, result).ok


def test_an_invalid_schedule_is_never_taken_as_the_incumbent() -> None:
    hint = schedule_live(LOOSE, method="zigzag")
    start = start_point(
        LOOSE,
        objective="mean_latency",
        old_order="free",
        backend="highs",
        time_limit_s=None,
        hint=hint,
        relax=False,
    )
    kept = start.incumbent
    start.offer(replace(kept, objective=kept.objective - 0.5))  # claims better than it is
    assert start.incumbent is kept
    shifted = replace(kept, completion_s=tuple(c - 1 for c in kept.completion_s))
    start.offer(replace(shifted, objective=kept.objective - 1))
    assert start.incumbent is kept


@pytest.mark.parametrize("backend", ["highs", "cbc"])
def test_a_round_past_its_deadline_does_not_start_the_solver(backend: str) -> None:
    pulp = pytest.importorskip("pulp")
    from blitzplan.solvers.pulp_run import NO_TIME, solve_once

    prob = pulp.LpProblem("tiny", pulp.LpMinimize)
    x = prob.add_variable("x", 0, 1, cat="Binary")
    prob += x
    prob += x >= 0
    found = solve_once(pulp, prob, backend, stop_by_s=time.perf_counter() - 1.0, read_back_s=0.0)
    assert found.note == NO_TIME and not found.has_solution
    finished = solve_once(pulp, prob, backend, stop_by_s=math.inf, read_back_s=0.0)
    assert finished.optimal and finished.has_solution and finished.note == ""


def _fake_cbc(tmp_path: Path, body: str) -> SimpleNamespace:
    script = tmp_path / "cbc"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return SimpleNamespace(path=str(script), getOptions=lambda: ["threads 1"])


def _cbc_files(tmp_path: Path) -> dict[str, str]:
    return {name: str(tmp_path / name) for name in ("model.mps", "start.mst", "out.sol")}


def test_a_cbc_process_that_overstays_is_killed(tmp_path: Path) -> None:
    from blitzplan.solvers.pulp_run import _run_cbc

    cbc = _fake_cbc(tmp_path, "exec sleep 60")
    assert _run_cbc(cbc, _cbc_files(tmp_path), 0.05, tmp_path / "log") is None


@pytest.mark.parametrize(("seconds", "asked"), [(5.0, "4.000"), (1.0, "0.500")])
def test_cbc_is_asked_to_stop_early(tmp_path: Path, seconds: float, asked: str) -> None:
    """CBC overshoots its own limit by its root node's time: it gets CBC_EARLY_S (1 s) less, or
    half when less is left."""
    from blitzplan.solvers.pulp_run import _run_cbc

    cbc = _fake_cbc(tmp_path, f'echo "$@" > {tmp_path / "args"}')
    assert _run_cbc(cbc, _cbc_files(tmp_path), seconds, tmp_path / "log") == 0
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("-sec") + 1] == asked
    assert args[args.index("-threads") + 1] == "1"


@given(instances(max_layers=3, max_batches=4), st.sampled_from(["mean_latency", "makespan"]))
def test_a_subset_search_stopped_by_the_clock_still_bounds(instance, objective: str) -> None:
    """Property: the subset search stopped at once bounds from its open states (each state's
    cost and floor in time, its cost alone past the deadline), below the relaxation's optimum,
    which is the least relaxed cost over every O sequence."""
    relax = Relaxation(instance, objective)
    optimum, _, complete = subset_search(relax, math.inf, math.inf, math.inf)
    assert complete
    every = min(
        relax.evaluate(order)
        for size in range(instance.num_batches + 1)
        for order in itertools.permutations(range(instance.num_batches), size)
    )
    assert optimum == pytest.approx(every, rel=1e-12, abs=1e-12)
    past = time.perf_counter() - 1.0
    in_time, _, finished = subset_search(relax, math.inf, past, math.inf)
    out_of_time, _, _ = subset_search(relax, math.inf, past, past)
    assert not finished
    assert out_of_time <= in_time + 1e-12 <= optimum + 2e-12
