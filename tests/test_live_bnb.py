"""The branch-and-bound backend (``backend="bnb"``): its N checks, its restrictions, and its
optimum against the exhaustive oracle and the independent MILP and CP-SAT bounds.

Nothing here times a solve; the time limits are loose promises checked with a generous margin
(speed is measured in ``benchmarks/partition.py`` and ``benchmarks/limits.py``).
"""

from __future__ import annotations

import math
import random
import subprocess
import sys
import time

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.bound.dp import solve_relaxation
from blitzplan.live.bound.relaxation import (
    Relaxation,
    RelaxedPlan,
    Restriction,
    alone_chain_s,
    repair,
)
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.exact.nmachine import NOp, overload, sequence
from blitzplan.live.schedule import OBJECTIVES, timetable
from blitzplan.solvers import SolveStatus, available_backends
from tests.test_live_properties import instances

REL = 1e-5  # OPTIMAL is proven within this relative gap


def _op(release: float, due: float, length: float, batch: int, layer: int = 1) -> NOp:
    return NOp(release, due, length, batch, layer)


def test_repair_runs_the_batches_that_end_on_n_shortest_first() -> None:
    """Two layers usable at 0, batches of 3 s and 1 s a layer, both finishing on N: alone they
    would end at 6 and 2, so each is as urgent as the other (no slack). Shortest first ends
    them at 8 and 2 (sum 10); the long one first, at 6 and 8 (sum 14)."""
    inst = LiveScalingInstance([0.0, 0.0], [0.0, 0.0], [3.0, 1.0], [3.0, 1.0], 0.0)
    plan = RelaxedPlan((), (2, 2), 4.0, (math.inf, math.inf))
    split, new, old = repair(inst, plan)
    _, _, completion = timetable(inst, split, new, old)
    assert completion == pytest.approx((8.0, 2.0))


def test_overload_names_work_that_cannot_fit_even_preempted() -> None:
    """Three unit operations released at 0 and due by 2: 3 s of work in 2 s."""
    ops = [_op(0.0, 2.0, 1.0, b) for b in range(3)]
    found = overload(ops)
    assert found is not None
    assert (found.start_s, found.end_s, found.work_s) == (0.0, 2.0, 3.0)
    assert sorted(op.batch for op in found.ops) == [0, 1, 2]
    assert overload(ops[:2]) is None  # two fit exactly


def test_overload_starts_where_the_busy_interval_does() -> None:
    """An early operation due late does not belong to the overloaded set released at 5."""
    ops = [_op(0.0, 100.0, 1.0, 0), _op(5.0, 6.0, 1.0, 1), _op(5.0, 6.0, 1.0, 2)]
    found = overload(ops)
    assert found is not None and found.start_s == 5.0 and found.work_s == 2.0


def test_the_sequencer_waits_when_running_now_would_be_late() -> None:
    """A 3 s operation free at 0 and a 1 s one released at 1, due at 2: starting the long one
    first (what a list schedule does) is late; the sequencer runs the short one at 1."""
    ops = [_op(0.0, 10.0, 3.0, 0), _op(1.0, 2.0, 1.0, 1)]
    order, proven = sequence(ops, deadline_s=math.inf, max_steps=100)
    assert order == (1, 0) and proven


def test_the_sequencer_proves_that_no_order_exists_or_says_it_gave_up() -> None:
    ops = [_op(0.0, 1.5, 1.0, 0), _op(0.0, 1.5, 1.0, 1)]
    assert sequence(ops, deadline_s=math.inf, max_steps=100) == (None, True)
    feasible = [_op(0.0, 2.0, 1.0, 0), _op(0.0, 2.0, 1.0, 1)]
    assert sequence(feasible, deadline_s=math.inf, max_steps=0) == (None, False)
    assert sequence(feasible, deadline_s=time.perf_counter() - 1, max_steps=100) == (None, False)


def test_a_restriction_narrows_the_relaxation() -> None:
    """Layers at 1 and 2, one batch, O free: all on O ends at 2. Forcing one layer onto N after
    5 s makes the best relaxed completion 5 + 1 (N) + 1 (O) = 7."""
    inst = LiveScalingInstance([1.0, 2.0], [0.0], 1.0, 1.0, 0.0)
    free = Restriction.none(inst)
    late = free.at_least(0, 1).at_most(0, 1).starting_after(0, 1, 5.0, inst.num_layers)
    assert alone_chain_s(inst, 0, late) == (0.0, 6.0, 7.0)
    assert not late.empty and free.at_least(0, 2).at_most(0, 1).empty
    for restriction, expected in ((free, 2.0), (late, 7.0)):
        cost, _, complete = solve_relaxation(
            Relaxation(inst, "makespan", restriction), old_order="free"
        )
        assert complete and cost == pytest.approx(expected)


@settings(max_examples=120)
@given(
    instances(max_layers=3, max_batches=4),
    st.sampled_from(sorted(OBJECTIVES)),
    st.sampled_from(["free", "fifo"]),
)
def test_bnb_finds_the_enumerated_optimum(instance, objective: str, old_order: str) -> None:
    """Property: on tiny instances branch and bound proves the oracle's optimum (or that a hard
    SLO is infeasible), its schedule validates, and no heuristic is better."""
    assume(count_schedules(instance, old_order=old_order) <= 3_000)
    options = {"objective": objective, "old_order": old_order}
    oracle = schedule_live(instance, method="exact", backend="enumerate", **options)
    found = schedule_live(instance, method="exact", backend="bnb", **options)
    report = validate_schedule(instance, found)
    assert report.ok, report.violations
    assert found.status is oracle.status, (found.status, oracle.status, found.message)
    if math.isinf(oracle.objective):
        assert math.isinf(found.objective)
        return
    assert found.objective == pytest.approx(oracle.objective, rel=REL, abs=1e-9)
    for method in ("stop_the_world", "best_effort", "zigzag", "improve"):
        other = schedule_live(instance, method=method, time_limit_s=0.005, **options)
        assert found.objective <= other.objective * (1 + REL) + 1e-9


@pytest.mark.parametrize("share", [0.0, 1.0])
@settings(max_examples=40)
@given(instances(max_layers=3, max_batches=4), st.sampled_from(["free", "fifo"]))
def test_the_early_search_share_changes_no_answer(share: float, instance, old_order: str) -> None:
    """Property: whether the search runs before the local search and the capacity and
    Lagrangian bounds (share 1) or only after them (share 0, the order before the early share),
    branch and bound proves the oracle's optimum."""
    from unittest import mock

    from blitzplan.live.exact import bnb

    assume(count_schedules(instance, old_order=old_order) <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate", old_order=old_order)
    with mock.patch.object(bnb, "EARLY_SEARCH_SHARE", share):
        found = schedule_live(instance, method="exact", backend="bnb", old_order=old_order)
    assert validate_schedule(instance, found).ok
    assert found.status is oracle.status is SolveStatus.OPTIMAL, found.message
    assert found.objective == pytest.approx(oracle.objective, rel=REL, abs=1e-9)


@settings(max_examples=40)
@given(instances(max_layers=3, max_batches=4), st.sampled_from(["free", "fifo"]))
def test_the_search_is_exact_when_the_sequencer_always_gives_up(instance, old_order: str) -> None:
    """Property: with a sequencer that never finds an order (what the back-off assumes of it on
    large instances), repaired plans and branching still prove the oracle's optimum."""
    from unittest import mock

    from blitzplan.live.exact import offers

    assume(count_schedules(instance, old_order=old_order) <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate", old_order=old_order)
    with mock.patch.object(offers, "sequence", lambda ops, **_: (None, False)):
        found = schedule_live(instance, method="exact", backend="bnb", old_order=old_order)
    assert validate_schedule(instance, found).ok
    assert found.status is oracle.status is SolveStatus.OPTIMAL, found.message
    assert found.objective == pytest.approx(oracle.objective, rel=REL, abs=1e-9)


def _medium(layers: int, batches: int, seed: int) -> LiveScalingInstance:
    """Like the benchmark's: a layer lands every 10 units, per-layer times spread 0.5..5, half
    the batches queued, the rest arriving, the old instance busy for a while."""
    rng = random.Random(seed)
    p = [rng.choice([0.5, 1.0, 2.0, 3.0, 5.0]) for _ in range(batches)]
    release = [0.0 if i < batches // 2 else rng.uniform(0, 10 * layers) for i in range(batches)]
    return LiveScalingInstance(
        [10.0 * (k + 1) for k in range(layers)],
        release,
        p,
        p,
        [0.2 * x for x in p],
        old_free_at_s=rng.uniform(0, 20),
    )


@pytest.mark.skipif(not {"highs", "cpsat"} <= set(available_backends()), reason="solver missing")
@pytest.mark.parametrize("old_order", ["free", "fifo"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bnb_optimum_is_never_below_an_independent_bound(old_order: str, seed: int) -> None:
    """Every OPTIMAL answer of branch and bound on a medium instance is at or above the bound
    HiGHS and CP-SAT prove from their own models (no relaxation, no shared code but the
    checker), and equal to their optimum wherever they prove one."""
    from blitzplan.live.exact.cpsat import solve_cpsat
    from blitzplan.live.exact.milp import solve_milp

    inst = _medium(6, 4, seed)
    found = schedule_live(inst, method="exact", backend="bnb", old_order=old_order, time_limit_s=30)
    assert validate_schedule(inst, found).ok
    assert found.status is SolveStatus.OPTIMAL, found.message
    hint = schedule_live(inst, method="zigzag", old_order=old_order)
    options = {"objective": "mean_latency", "old_order": old_order, "time_limit_s": 20.0}
    for other in (
        solve_milp(inst, backend="highs", hint=hint, use_relaxation=False, **options),
        solve_cpsat(inst, hint=hint, use_relaxation=False, **options),
    ):
        assert validate_schedule(inst, other).ok
        assert other.bound is not None and other.bound <= found.objective * (1 + REL) + 1e-9
        if other.status is SolveStatus.OPTIMAL:
            assert other.objective == pytest.approx(found.objective, rel=REL)


def _hard() -> LiveScalingInstance:
    """80 layers and 16 batches with N heavily loaded: nothing proves it in a fraction of a
    second."""
    rng = random.Random(16)
    p = [rng.uniform(0.5, 20.0) for _ in range(16)]
    release = [0.0] * 8 + sorted(rng.uniform(0, 2000) for _ in range(8))
    return LiveScalingInstance(
        [50.0 + 35.0 * k for k in range(80)],
        release,
        p,
        p,
        [0.4 * x for x in p],
        old_free_at_s=300.0,
    )


@pytest.mark.parametrize("backend", ["bnb", "highs", "cbc", "cpsat"])
def test_a_tiny_limit_on_a_hard_instance_is_kept_loosely(backend: str) -> None:
    """With 0.05 s on a hard instance every backend answers FEASIBLE with a valid bound (or
    UNKNOWN without a schedule), and returns well within 2 s of the limit (the tight numbers are
    in benchmarks/limits.py; the machine running the tests may be loaded)."""
    if backend not in available_backends():
        pytest.skip(f"{backend} is not installed")
    inst = _hard()
    schedule_live(inst, method="exact", backend=backend, time_limit_s=0.01)  # imports
    limit = 0.05
    started = time.perf_counter()
    found = schedule_live(inst, method="exact", backend=backend, time_limit_s=limit)
    elapsed = time.perf_counter() - started
    assert elapsed < limit + 2.0, (elapsed, found.message)
    assert found.status in (SolveStatus.FEASIBLE, SolveStatus.UNKNOWN), found.message
    report = validate_schedule(inst, found)
    assert report.ok, report.violations
    if found.status is SolveStatus.FEASIBLE:
        assert found.bound is not None and found.bound <= found.objective


def test_the_default_exact_backend_needs_no_solver_library() -> None:
    """With PuLP, HiGHS and OR-Tools blocked, ``method="exact"`` still proves an optimum (the
    branch and bound needs none; OR-Tools only helps it on deep nodes) and never imports them."""
    from tests.test_import import _BLOCK

    code = _BLOCK + (
        "import sys\n"
        "import blitzplan\n"
        "inst = blitzplan.LiveScalingInstance([1.0, 2.0], [0.0] * 3, 1.0, 1.0, 0.0)\n"
        "best = blitzplan.schedule_live(inst, method='exact', time_limit_s=30)\n"
        "assert best.status.value == 'optimal' and best.objective == 3.0, best\n"
        "print(sorted(m for m in ('pulp', 'highspy', 'ortools') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
