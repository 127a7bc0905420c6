"""A node of the exact search solved whole on CP-SAT (:mod:`blitzplan.live.exact.node_cpsat`)
against the exhaustive oracle of each node, and the search that uses it watched node by node:
what CP-SAT proves about a node is at most the node's own optimum (the least objective over
every schedule its restriction allows), and the search stays OPTIMAL at the oracle's optimum."""

from __future__ import annotations

import math
import random
import sys
from unittest import mock

import pytest

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.bound.relaxation import Restriction
from blitzplan.live.exact import bnb
from blitzplan.live.exact.common import start_point
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.exact.node_cpsat import node_cpsat
from blitzplan.live.schedule import Schedule
from blitzplan.solvers import SolveStatus
from tests.test_live_bnb_nodes import _crowded
from tests.test_live_node_bound import (
    MAX_COMBINATIONS,
    _combinations,
    _deep,
    _random_restriction,
    _value,
)

REL = 1e-5

SEEDS = range(30)


@pytest.mark.parametrize("objective", ["mean_latency", "makespan"])
@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_what_cpsat_proves_of_a_node_is_at_most_its_optimum(old_order: str, objective: str) -> None:
    """For six random restrictions per instance, each under two caps (the instance's optimum,
    which many nodes cannot reach, and 1.2 times the node's optimum): the node's bound is at
    most the node's optimum, a node it closes under the higher cap has its optimum for bound
    (so a bound 5% higher fails), and its schedule is valid (re-timed from CP-SAT's orders, it
    may start earlier than the node's limits: a schedule, not necessarily the node's)."""
    rng = random.Random(f"cpsat-{old_order}-{objective}")
    checked = closed = shut = 0
    for seed in SEEDS:
        inst = _crowded(seed) if seed % 2 else _deep(seed)
        if count_schedules(inst, old_order=old_order) > MAX_COMBINATIONS:
            continue
        combos = list(_combinations(inst, old_order))
        optimum = min(_value(inst, Restriction.none(inst), c, objective) for c in combos)
        for _ in range(6):
            r = _random_restriction(inst, rng)
            best = min(_value(inst, r, c, objective) for c in combos)
            if math.isinf(best):
                continue
            for cap in (optimum, 1.2 * best):
                start = start_point(
                    inst,
                    objective=objective,
                    old_order=old_order,
                    backend="bnb",
                    time_limit_s=None,
                    hint=None,
                    relax=False,
                    warm=False,
                )
                solved = node_cpsat(start, r, cap, 10.0)
                assert solved is not None, (seed, r, cap)
                assert solved.bound <= best * (1 + REL) + 1e-9, (seed, r, cap, solved, best)
                checked += 1
                if solved.schedule is not None:
                    report = validate_schedule(inst, solved.schedule)
                    assert all(v.startswith("status") for v in report.violations), report
                    assert solved.schedule.objective >= optimum * (1 - REL) - 1e-9
                if solved.closed and cap > best:
                    closed += 1
                    assert solved.bound == pytest.approx(best, rel=1e-4, abs=1e-6), (seed, r)
                shut += solved.closed and solved.schedule is None
    assert checked >= 60, checked
    assert closed >= 20, closed
    assert shut >= 5, shut


def _watched(inst: LiveScalingInstance, old_order: str) -> tuple[Schedule, list[float], int]:
    """bnb's answer with no early share, its running bound at every node taken (objective
    units), and how many nodes it gave CP-SAT."""
    seen: list[float] = []
    calls: list[int] = []
    real_settle, real_cpsat = bnb._Search.settle, bnb.node_cpsat

    def settle(self: bnb._Search, node: bnb._Node) -> bool:
        low = min([self.floor, node.bound, *(other.bound for other in self.open)])
        seen.append(self.obj.final(low))
        return real_settle(self, node)

    def cpsat(*args: object) -> object:
        calls.append(1)
        return real_cpsat(*args)  # type: ignore[arg-type]

    with (
        mock.patch.object(bnb._Search, "settle", settle),
        mock.patch.object(bnb, "node_cpsat", cpsat),
        mock.patch.object(bnb, "EARLY_SEARCH_SHARE", 0.0),
    ):
        found = schedule_live(inst, method="exact", backend="bnb", old_order=old_order)
    return found, seen, len(calls)


@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_the_search_with_whole_nodes_on_cpsat_stays_optimal(old_order: str) -> None:
    """With CP-SAT on every node whose plan fits N only with preemption from the first node on
    (no early share): at every node taken the search's bound is at most the oracle's optimum,
    the answer is OPTIMAL at the optimum, and CP-SAT was given nodes."""
    given = 0
    for seed in range(0, 80, 3):
        inst = _crowded(seed) if seed < 60 else _deep(seed)
        if count_schedules(inst, old_order=old_order) > 20_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=old_order)
        found, seen, calls = _watched(inst, old_order)
        given += calls
        best = oracle.objective
        assert validate_schedule(inst, found).ok
        assert all(low <= best * (1 + REL) + 1e-9 for low in seen), (seed, best, max(seen))
        assert found.status is SolveStatus.OPTIMAL, (seed, found.message)
        assert found.objective == pytest.approx(best, rel=REL, abs=1e-9), seed
    assert given >= 5, given


def test_without_ortools_a_node_keeps_its_bound_and_the_search_still_proves() -> None:
    """OR-Tools is optional (the ``exact`` extra): without it no node goes to CP-SAT and the
    search answers as before."""
    inst = _crowded(3)
    start = start_point(
        inst,
        objective="mean_latency",
        old_order="free",
        backend="bnb",
        time_limit_s=None,
        hint=None,
        relax=False,
        warm=False,
    )
    absent = {"ortools.sat.python": None, "ortools.sat.python.cp_model": None}
    with mock.patch.dict(sys.modules, absent):
        assert node_cpsat(start, Restriction.none(inst), 100.0, 10.0) is None
        found = schedule_live(inst, method="exact", backend="bnb", old_order="free")
    oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="free")
    assert found.status is SolveStatus.OPTIMAL
    assert found.objective == pytest.approx(oracle.objective, rel=REL, abs=1e-9)
