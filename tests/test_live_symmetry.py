"""Identical batches: groups, the work cut, canonical relabelling, and exactness with them."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.exact.cpsat import solve_cpsat
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.exact.milp import solve_milp
from blitzplan.live.exact.symmetry import canonical, identical_groups, work_cut_s
from blitzplan.solvers import SolveStatus

TOY = LiveScalingInstance([6.0 * (k + 1) for k in range(7)], [0.0] * 7, 1.0, 1.0, 0.0)


def test_groups_are_batches_with_equal_data() -> None:
    inst = LiveScalingInstance([1.0, 2.0], [0.0, 0.0, 1.0, 0.0], [1.0, 2.0, 1.0, 1.0], 1.0, 0.0)
    assert identical_groups(inst) == [[0, 3]]
    assert identical_groups(TOY) == [list(range(7))]


def test_work_cut_arithmetic_on_the_toy() -> None:
    """O runs from 0 and N from 6 (its first layer), one layer per time unit each: the first
    7 layers end at 6 + (7 - 6) / 2 = 6.5; 14 layers at 6 + 8 / 2 = 10."""
    cuts = work_cut_s(TOY, list(range(7)))
    assert cuts[:2] == pytest.approx([6.5, 10.0])
    optimum = schedule_live(TOY, method="exact", backend="highs", objective="makespan")
    assert sorted(optimum.completion_s)[-1] >= cuts[-1]
    for rank, completion in enumerate(sorted(optimum.completion_s)):
        assert completion >= cuts[rank] - 1e-9


def test_canonical_relabels_a_group_into_completion_order() -> None:
    zigzag = schedule_live(TOY, method="zigzag")
    relabelled = canonical(TOY, zigzag)
    assert list(relabelled.completion_s) == sorted(zigzag.completion_s)
    assert relabelled.objective == zigzag.objective
    report = validate_schedule(TOY, relabelled)
    assert report.ok, report.violations


@st.composite
def grouped(draw: st.DrawFn) -> LiveScalingInstance:
    """Two kinds of batch, several of each: groups of identical batches are likely."""
    L = draw(st.integers(1, 3))
    arrivals = sorted(
        draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]), min_size=L, max_size=L))
    )
    kind = st.tuples(
        st.sampled_from([0.0, 1.0]), st.sampled_from([0.5, 1.0, 1.5]), st.sampled_from([0.0, 0.3])
    )
    kinds = draw(st.lists(kind, min_size=1, max_size=2))
    picks = draw(st.lists(st.sampled_from(kinds), min_size=2, max_size=3))
    return LiveScalingInstance(
        arrivals,
        [k[0] for k in picks],
        [k[1] for k in picks],
        [k[1] for k in picks],
        [k[2] for k in picks],
        old_free_at_s=draw(st.sampled_from([0.0, 1.5])),
    )


@settings(max_examples=40)
@given(
    grouped(),
    st.sampled_from(["mean_latency", "max_latency", "makespan"]),
    st.sampled_from(["free", "fifo"]),
)
def test_symmetry_breaking_keeps_the_optimum(instance, objective: str, old_order: str) -> None:
    """Property: with completion-order symmetry breaking and the work cut, the MILP (HiGHS) and
    CP-SAT models alone (no relaxation) still find the enumerated optimum and prove it."""
    assume(identical_groups(instance) and count_schedules(instance, old_order=old_order) <= 3_000)
    options = {"objective": objective, "old_order": old_order, "time_limit_s": 30.0}
    exact = schedule_live(instance, method="exact", backend="enumerate", **options)
    hint = schedule_live(instance, method="zigzag", objective=objective, old_order=old_order)
    for schedule in (
        solve_milp(instance, backend="highs", hint=hint, use_relaxation=False, **options),
        solve_cpsat(instance, hint=hint, use_relaxation=False, **options),
        solve_cpsat(instance, hint=None, use_relaxation=False, warm_start=False, **options),
    ):
        assert validate_schedule(instance, schedule).ok
        assert schedule.status is SolveStatus.OPTIMAL
        assert schedule.objective == pytest.approx(exact.objective, rel=1e-5)
