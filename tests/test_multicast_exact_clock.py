"""The exact method's clock on a stand-in: a step starts only when it ends in time at the pace
measured in this run (no wall time asserted: a clock that advances by what the steps take)."""

from __future__ import annotations

import types

import blitzplan.multicast.exact.exact_search as exact_search_module
from blitzplan.multicast.exact.exact_search import exact_search
from blitzplan.multicast.planners.greedy import build, context, greedy_choice
from tests.test_multicast_overlay import _problem
from tests.test_multicast_phase_slices import CHUNK, one_gpu_hosts


class _Clock:
    """A stand-in for :mod:`time` whose ``perf_counter`` moves only when a step says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def perf_counter(self) -> float:
        return self.now


def _four_targets():
    """A decode source on h0 and four one-GPU targets, with the greedy's choice and plan."""
    state, spec = one_gpu_hosts(5)
    targets = [[f"h{k}/gpu0"] for k in range(1, 5)]
    problem = _problem(state, spec, targets=targets, tp=1, live=0, chunk_bytes=CHUNK)
    ctx = context(problem)
    choice = greedy_choice(problem, ctx, "all_ready")
    return problem, ctx, (choice, build(problem, ctx, choice))


def _slow_search(monkeypatch, step_s: float) -> tuple[_Clock, list[float]]:
    """Every evaluation of a choice takes ``step_s`` on the stand-in clock; every order of the
    four targets is a candidate (their labels made distinct) within the fluid window."""
    clock = _Clock()
    ended: list[float] = []

    def evaluated(problem, ctx, choice):
        clock.now += step_s
        ended.append(clock.now)
        return []

    monkeypatch.setattr(
        exact_search_module, "time", types.SimpleNamespace(perf_counter=clock.perf_counter)
    )
    monkeypatch.setattr(exact_search_module, "_builds", evaluated)
    monkeypatch.setattr(
        exact_search_module, "_types", lambda problem, ctx: {t: t for t in ctx.targets}
    )
    monkeypatch.setattr(exact_search_module, "fluid_time", lambda *args: 1.0)
    return clock, ended


def test_the_search_starts_no_evaluation_it_cannot_end_in_time(monkeypatch) -> None:
    """Evaluations of 1 s with 2.5 s given: the first starts (the incumbent's measured at 0),
    the second ends at 2 s, and no third starts (it would end at 3 s): the search ends
    before its deadline, unfinished. Before, it started one while any time was left and ended
    at 3 s."""
    problem, ctx, incumbent = _four_targets()
    clock, ended = _slow_search(monkeypatch, 1.0)
    began = clock.now
    result = exact_search(problem, ctx, "all_ready", incumbent, time_limit_s=2.5)
    assert ended == [began + 1.0, began + 2.0]
    assert clock.now <= began + 2.5
    assert result.evaluated == 2 and not result.finished
    assert result.enumerated == 24


def test_the_incumbents_measured_evaluation_is_the_first_prediction(monkeypatch) -> None:
    """The incumbent's own build and linear program measured at 3 s in this run: with 2.5 s
    given no evaluation starts; measured at 1 s, two do, as above."""
    problem, ctx, incumbent = _four_targets()
    _, ended = _slow_search(monkeypatch, 1.0)
    result = exact_search(problem, ctx, "all_ready", incumbent, time_limit_s=2.5, evaluation_s=3.0)
    assert ended == [] and result.evaluated == 0
    assert result.best is incumbent[1]
    result = exact_search(problem, ctx, "all_ready", incumbent, time_limit_s=2.5, evaluation_s=1.0)
    assert result.evaluated == 2


def test_without_a_limit_every_candidate_is_evaluated(monkeypatch) -> None:
    """No time limit: the stand-in clock's pace stops nothing (all 24 orders but the
    incumbent's own)."""
    problem, ctx, incumbent = _four_targets()
    _, ended = _slow_search(monkeypatch, 1.0)
    result = exact_search(problem, ctx, "all_ready", incumbent, time_limit_s=None)
    assert result.finished
    assert len(ended) == result.evaluated >= 23
