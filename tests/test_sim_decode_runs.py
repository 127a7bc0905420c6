"""Coalesced decode runs (one event per run of steps between batch changes, what a multi-model
run uses) give exactly the results of one event per decode step: every request's first token,
finish, restarts and drops, on a single-model run with host failures that cut runs short and on
a multi-model run; and the event queue's cancellation that cutting relies on."""

from __future__ import annotations

import functools

import pytest

import blitzplan.sim.replay as replay
from blitzplan.sim import SimReport, simulate, simulate_fleet, synthetic_trace, zipf_workloads
from blitzplan.sim.events import EventQueue, Tick


def _outcomes(report: SimReport) -> list[tuple[float, float, float, int, str]]:
    return [
        (r.arrival_s, r.first_token_s, r.finish_s, r.restarts, r.dropped) for r in report.requests
    ]


def _single(coalesce: bool, monkeypatch: pytest.MonkeyPatch) -> SimReport:
    engine = functools.partial(replay.Simulator, coalesce_decode=coalesce)
    with monkeypatch.context() as patched:
        patched.setattr(replay, "Simulator", engine)
        return simulate(
            "paper-a100-16",
            "llama-3-8b",
            synthetic_trace(duration_s=90, rate_per_s=3, burstiness=8, seed=5),
            tp=1,
            rate_scale=1.0,
            failures=[(20.0, "h0"), (60.0, "h1")],
        )


def test_coalesced_runs_match_one_event_per_step_through_host_failures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    steps, runs = _single(False, monkeypatch), _single(True, monkeypatch)
    assert _outcomes(runs) == _outcomes(steps)
    assert sum(r.restarts for r in steps.requests) > 0  # the failures cut decoding runs
    assert runs.summary()["requests_finished"] > 0
    assert runs.events_processed < steps.events_processed / 2


def test_coalesced_runs_match_one_event_per_step_in_a_fleet() -> None:
    workloads = zipf_workloads(4, duration_s=45, rate_per_s=6, seed=2, bursts_per_hour=120)
    runs, steps = (
        simulate_fleet("paper-a800-32", workloads, system="serverlessllm", coalesce_decode=c)
        for c in (True, False)
    )
    for a, b in zip(runs.reports, steps.reports, strict=True):
        assert _outcomes(a) == _outcomes(b) and len(a.finished) > 0
    assert runs.copies == steps.copies
    assert sum(r.events_processed for r in runs.reports) < sum(
        r.events_processed for r in steps.reports
    )


def test_a_cancelled_event_is_never_given_out() -> None:
    queue = EventQueue()
    first, second = queue.push(1.0, Tick()), queue.push(2.0, Tick())
    queue.push(3.0, Tick())
    queue.cancel(first)
    assert len(queue) == 2 and queue.peek_s() == 2.0
    queue.cancel(second)
    assert queue.pop()[0] == 3.0 and len(queue) == 0
