"""The large-neighbourhood search on the exact search's incumbent
(:mod:`blitzplan.live.exact.neighbourhood`) against the exhaustive oracle on tiny instances: a
schedule it keeps passes the independent checker and is never better than the oracle's
optimum, it takes no bound from a neighbourhood, and the branch and bound that runs it stays
OPTIMAL only at the oracle's optimum."""

from __future__ import annotations

import math
from unittest import mock

import pytest

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.exact import bnb, neighbourhood
from blitzplan.live.exact.common import Start, decode, start_point
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.solvers import SolveStatus
from tests.test_live_bnb_nodes import _crowded, _watched

REL = 1e-5  # OPTIMAL is proven within this relative gap

SEEDS = range(60)


def _cases(old_order: str):  # type: ignore[no-untyped-def]
    for seed in SEEDS:
        inst = _crowded(seed)
        if count_schedules(inst, old_order=old_order) <= 20_000:
            oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=old_order)
            yield seed, inst, oracle.objective


def _poor_start(inst: LiveScalingInstance, old_order: str) -> Start:
    """A start with no bound whose incumbent runs every batch on O alone, in FIFO order."""
    start = start_point(
        inst,
        objective="mean_latency",
        old_order=old_order,
        backend="bnb",
        time_limit_s=None,
        hint=None,
        relax=False,
        warm=False,
    )
    n = inst.num_batches
    start.incumbent = decode(inst, (0,) * n, (), inst.fifo_order, "mean_latency", old_order, "bnb")
    return start


@pytest.mark.parametrize("window_reach", [(1, 1), (neighbourhood.WINDOW, neighbourhood.REACH)])
@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_the_neighbourhood_search_keeps_valid_schedules_never_below_the_optimum(
    old_order: str, window_reach: tuple[int, int]
) -> None:
    """From every batch on O alone (a poor schedule), on the crowded tiny instances: the
    incumbent left is valid and at least the oracle's optimum, the bound is untouched (no
    neighbourhood's bound is a bound of the problem), and the search improved many incumbents
    (the check is not vacuous)."""
    improved = 0
    window, reach = window_reach
    for seed, inst, best in _cases(old_order):
        start = _poor_start(inst, old_order)
        first, bound = start.incumbent.objective, start.bound
        with (
            mock.patch.object(neighbourhood, "WINDOW", window),
            mock.patch.object(neighbourhood, "REACH", reach),
            mock.patch.object(neighbourhood, "GAP", math.inf),
        ):
            calls = neighbourhood.neighbourhood_search(start, math.inf)
        assert calls is not None and calls > 0, seed
        found = start.incumbent
        report = validate_schedule(inst, found)  # FEASIBLE: its bound is set by the caller
        assert all(v.startswith("status") for v in report.violations), (seed, report)
        assert found.objective >= best * (1 - REL) - 1e-9, (seed, found.objective, best)
        assert start.bound == bound, seed
        improved += found.objective < first
    assert improved >= 20, improved


def test_the_neighbourhood_search_waits_for_a_small_gap() -> None:
    """Nothing is done while the gap to the bound given is above ``GAP``."""
    start = _poor_start(_crowded(1), "fifo")
    upper = start.incumbent.objective
    low = upper * (1 - 2 * neighbourhood.GAP)
    assert neighbourhood.neighbourhood_search(start, math.inf, search_bound=low) is None
    assert (
        neighbourhood.neighbourhood_search(
            start, math.inf, search_bound=upper * (1 - neighbourhood.GAP / 2)
        )
        is not None
    )


@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_the_search_with_the_neighbourhood_stays_optimal_only_at_the_optimum(
    old_order: str,
) -> None:
    """With no early share and the neighbourhood search at any gap, in small windows (so that a
    neighbourhood is not the whole problem): at every node taken the search's bound is at
    most the oracle's optimum, the answer is valid and OPTIMAL at the optimum, and the
    neighbourhood search ran on many instances."""
    ran: list[int] = []
    real = neighbourhood.neighbourhood_search

    def search(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls = real(*args, **kwargs)
        ran.extend([] if calls is None else [calls])
        return calls

    for seed, inst, best in _cases(old_order):
        with (
            mock.patch.object(bnb, "EARLY_SEARCH_MAX_S", 0.0),
            mock.patch.object(bnb, "neighbourhood_search", search),
            mock.patch.object(neighbourhood, "GAP", math.inf),
            mock.patch.object(neighbourhood, "WINDOW", 1),
            mock.patch.object(neighbourhood, "REACH", 1),
        ):
            found, seen, _ = _watched(inst, old_order, "default")
        assert validate_schedule(inst, found).ok, seed
        assert all(low <= best * (1 + REL) + 1e-9 for low in seen), (seed, best, max(seen))
        assert found.status is SolveStatus.OPTIMAL, (seed, found.message)
        assert found.objective == pytest.approx(best, rel=REL, abs=1e-9), seed
    assert sum(calls > 0 for calls in ran) >= 10, ran
