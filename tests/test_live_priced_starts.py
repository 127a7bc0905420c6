"""``bnb``'s priced search polishes its best distinct priced schedules, best first, each from
its own start (:mod:`blitzplan.live.exact.priced`), and the root's polish shares under a free
order (:func:`~blitzplan.live.exact.priced.polish_shares`)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.exact import priced
from blitzplan.live.exact.common import finish, start_point
from blitzplan.live.schedule import Schedule


def _instance() -> LiveScalingInstance:
    """Six batches, eight layers arriving over time, O busy at first: many priced choices."""
    return LiveScalingInstance(
        layer_ready_s=[0.2 * (layer + 1) for layer in range(8)],
        release_s=[0.0, 0.0, 0.0, 0.3, 0.6, 1.1],
        new_layer_s=[0.10, 0.05, 0.08, 0.02, 0.12, 0.03],
        old_layer_s=[0.10, 0.05, 0.08, 0.02, 0.12, 0.03],
        handoff_s=[0.02, 0.01, 0.02, 0.005, 0.03, 0.01],
        old_free_at_s=0.4,
    )


def _start(instance: LiveScalingInstance, left_s: float | None) -> Any:
    return start_point(
        instance,
        objective="mean_latency",
        old_order="free",
        backend="bnb",
        time_limit_s=left_s,
        hint=schedule_live(instance, method="zigzag"),
        relax=False,
    )


@pytest.mark.parametrize("starts", [priced.PRICED_STARTS, 1])
def test_the_best_distinct_priced_schedules_are_polished_best_first(
    monkeypatch: pytest.MonkeyPatch, starts: int
) -> None:
    """Every priced schedule offered is recorded; the polished starts are the ``starts`` least
    distinct values among them, in increasing order, each polished once, and the incumbent
    left passes the checker at a value no worse than any of them."""
    instance = _instance()
    offered: list[float] = []
    polished: list[float] = []
    decode = priced.decode
    polish = priced.polish

    def recording_decode(*args: Any) -> Schedule:
        schedule = decode(*args)
        offered.append(schedule.objective)
        return schedule

    def recording_polish(instance: LiveScalingInstance, start: Schedule, **kw: Any) -> Any:
        polished.append(start.objective)
        return polish(instance, start, **kw)

    monkeypatch.setattr(priced, "decode", recording_decode)
    monkeypatch.setattr(priced, "polish", recording_polish)
    start = _start(instance, None)
    priced.priced_search(start, budget_s=math.inf, polish_share=0.5, moves=50, starts=starts)
    steps = offered[: len(offered) - len(polished)]  # the polished results are decoded last
    assert len(set(steps)) > starts  # the case has more than it keeps
    assert polished == sorted(set(steps))[:starts]
    found = finish(start)
    report = validate_schedule(instance, found)
    assert report.ok, report.violations
    assert found.objective <= min(steps) + 1e-12


def test_a_free_order_call_not_short_gives_the_priced_starts_the_polish() -> None:
    """Under a free order and mean latency a call of 10 s splits the polish as
    ``FREE_POLISH_SHARE`` first and ``PRICED_POLISH_SHARE`` after the slot bound, over
    ``PRICED_STARTS`` starts; a short call (or FIFO) keeps ``POLISH_SHARE_OF_LIMIT`` for both
    and the best priced schedule alone."""
    instance = _instance()
    long_call = _start(instance, 10.0)
    assert priced.polish_shares(long_call, short=False) == (
        priced.FREE_POLISH_SHARE,
        priced.PRICED_POLISH_SHARE,
        priced.PRICED_STARTS,
    )
    short_call = _start(instance, 1.0)
    plain = (priced.POLISH_SHARE_OF_LIMIT, priced.POLISH_SHARE_OF_LIMIT, 1)
    assert priced.polish_shares(short_call, short=True) == plain
    fifo = start_point(
        instance,
        objective="mean_latency",
        old_order="fifo",
        backend="bnb",
        time_limit_s=10.0,
        hint=schedule_live(instance, method="zigzag", old_order="fifo"),
        relax=False,
    )
    assert priced.polish_shares(fifo, short=False) == plain
