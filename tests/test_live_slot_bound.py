"""The slot bound (:mod:`blitzplan.live.bound.slots`): a small case where it counts both
instances' capacity, and the bound held against the exhaustive oracle on random tiny instances
(any O order: it bounds the free order, so FIFO too), with and without a restriction; the
schedules its priced choices make (``priced_orders``, ``bnb``'s priced search) are valid."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.bound import slots as relaxation_slots
from blitzplan.live.bound.dp import relaxation_bound
from blitzplan.live.bound.relaxation import Restriction
from blitzplan.live.bound.slot_prices import (
    SlotPath,
    SlotPrices,
    _first_least,
    _least_cells,
    slot_usage,
    solve_batches,
)
from blitzplan.live.bound.slots import (
    MIN_STEPS,
    QUICK_FAR,
    QUICK_HORIZONS,
    QUICK_SETUP_STEPS,
    QUICK_STEPS,
    priced_orders,
    quick_slot_bound,
    quick_step_count,
    quick_steps_s,
    slot_bound,
)
from blitzplan.live.exact.common import finish, start_point
from blitzplan.live.exact.enumerate import _interleavings, count_schedules, solve_enumerate
from blitzplan.live.exact.priced import SHORT_SLOTS, priced_search
from blitzplan.live.schedule import build_schedule, lower_bound
from blitzplan.solvers.backends import SolveStatus
from tests.test_live_properties import instances


def test_four_unit_batches_pay_for_both_instances() -> None:
    """One layer usable at 0, four batches of 1 s queued at 0, O free, no hand-off: the optimum
    ends them at 1, 1, 2, 2 (mean 1.5); each alone ends at 1. Priced, the bound passes 1.3 and
    stays at most the optimum."""
    inst = LiveScalingInstance([0.0], [0.0] * 4, 1.0, 1.0, 0.0)
    assert lower_bound(inst, "mean_latency") == pytest.approx(1.0)
    bound, prices = slot_bound(inst, upper_bound=1.5)
    assert prices is not None
    assert 1.3 < bound <= 1.5 + 1e-12


def test_it_declines_other_objectives() -> None:
    inst = LiveScalingInstance([0.0], [0.0] * 4, 1.0, 1.0, 0.0)
    assert slot_bound(inst, objective="makespan") == (-math.inf, None)


def _tolerance(value: float) -> float:
    return 1e-9 * max(1.0, abs(value))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=4), st.booleans(), st.booleans())
def test_the_slot_bound_never_exceeds_the_enumerated_optimum(
    instance: LiveScalingInstance, steered: bool, floored: bool
) -> None:
    """Property: no schedule (the exhaustive oracle, free order) beats the bound, whether the
    prices are steered toward the optimum itself or not, on the default grid or on the short
    free call's (:data:`~blitzplan.live.exact.priced.SHORT_SLOTS` slots, the latency
    floor)."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate")
    upper = oracle.objective if steered else math.inf
    slots = SHORT_SLOTS if floored else None
    bound, _ = slot_bound(
        instance, upper_bound=upper, iterations=60, slots=slots, latency_floor=floored
    )
    assert bound <= oracle.objective + _tolerance(oracle.objective)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(max_layers=3, max_batches=3), st.data())
def test_priced_restrictions_bound_the_schedules_that_keep_them(
    instance: LiveScalingInstance, data: st.DataObject
) -> None:
    """Property: with the whole problem's prices, the bound of a restriction (a split range
    and a start limit for one batch) is at most every schedule that keeps it (enumerated)."""
    assume(count_schedules(instance, old_order="free") <= 2_000)
    L, n = instance.num_layers, instance.num_batches
    batch = data.draw(st.integers(0, n - 1))
    low = data.draw(st.integers(0, L))
    high = data.draw(st.integers(low, L))
    restriction = Restriction.none(instance).at_least(batch, low).at_most(batch, high)
    if low >= 1:
        after = data.draw(st.sampled_from([0.0, 0.5, 1.5, 3.0]))
        restriction = restriction.starting_after(batch, low, after, L)
    oracle = solve_enumerate(instance, objective="mean_latency", old_order="free")
    _, prices = slot_bound(instance, upper_bound=oracle.objective, iterations=40)
    assert prices is not None
    bound = prices.bound(restriction)
    best = _best_keeping(instance, restriction)
    assert bound <= best + _tolerance(best)


def _best_keeping(instance: LiveScalingInstance, restriction: Restriction) -> float:
    """The least mean latency over the schedules that keep ``restriction``: every split in its
    ranges, every N order and O order, each operation as early as the orders and the start
    limits allow (inf when none)."""
    L = instance.num_layers
    ranges = [
        range(lo, hi + 1)
        for lo, hi in zip(restriction.split_min, restriction.split_max, strict=True)
    ]
    best = math.inf
    for split in itertools.product(*ranges):
        for new_sequence in _interleavings(list(split)):
            on_old = [b for b in range(len(split)) if split[b] < L]
            for old_sequence in itertools.permutations(on_old):
                completion = _timed(instance, restriction, split, new_sequence, old_sequence)
                latency = [c - r for c, r in zip(completion, instance.release_s, strict=True)]
                best = min(best, sum(latency) / len(latency))
    return best


def _timed(
    instance: LiveScalingInstance,
    restriction: Restriction,
    split: tuple[int, ...],
    new_sequence: tuple[int, ...],
    old_sequence: tuple[int, ...],
) -> list[float]:
    """Completions as :func:`~blitzplan.live.schedule.timetable` gives them, with the start
    limits of ``restriction`` on N."""
    L, done = instance.num_layers, [0] * instance.num_batches
    end = list(instance.release_s)
    clock = 0.0
    for batch in new_sequence:
        layer = done[batch] + 1
        after = restriction.start_after_s[batch]
        limit = after[layer - 1] if after else 0.0
        start = max(clock, instance.usable_s[layer - 1], end[batch], limit)
        clock = end[batch] = start + instance.new_layer_s[batch]
        done[batch] = layer
    completion = list(end)
    clock = instance.old_free_at_s
    for batch in old_sequence:
        k = split[batch]
        handed = end[batch] + instance.handoff_s[batch] * (k > 0)
        start = max(clock, instance.release_s[batch], handed)
        clock = completion[batch] = start + (L - k) * instance.old_layer_s[batch]
    return completion


@settings(max_examples=80, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=4))
def test_priced_choices_make_valid_schedules_no_better_than_the_optimum(
    instance: LiveScalingInstance,
) -> None:
    """Property: every step's priced choices, made a schedule by ``priced_orders``, pass the
    checker, keep each batch's priced split, and serve O in the order of the priced starts;
    none beats the exhaustive oracle, and the bound, its steps aimed at the best of them, stays
    at most the oracle's optimum."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate")
    values: list[float] = []

    def on_paths(paths: list[SlotPath]) -> float:
        split, new_sequence, old_sequence = priced_orders(instance, paths)
        schedule = build_schedule(
            instance,
            split,
            new_sequence,
            old_sequence,
            objective="mean_latency",
            method="exact",
            backend="bnb",
            old_order="free",
            status=SolveStatus.UNKNOWN,
            solve_s=0.0,
        )
        report = validate_schedule(instance, schedule)
        assert report.ok, report.violations
        L = instance.num_layers
        assert split == tuple(L if p.old_start is None else p.split for p in paths)
        starts = [paths[i].old_start for i in old_sequence]
        assert starts == sorted(starts)  # type: ignore[type-var]
        assert schedule.objective >= oracle.objective - _tolerance(oracle.objective)
        values.append(schedule.objective)
        return min(values)

    bound, _ = slot_bound(instance, iterations=40, on_paths=on_paths)
    assert values
    assert bound <= oracle.objective + _tolerance(oracle.objective)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(instances(max_layers=3, max_batches=4))
def test_the_priced_search_keeps_a_valid_schedule_and_bound(instance: LiveScalingInstance) -> None:
    """Property: ``bnb``'s priced search (slot bound, priced schedules, polish) leaves an
    incumbent that the checker passes and no better than the oracle's optimum, and a bound no
    higher than it."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate")
    start = start_point(
        instance,
        objective="mean_latency",
        old_order="free",
        backend="bnb",
        time_limit_s=None,
        hint=schedule_live(instance, method="zigzag"),
        relax=False,
    )
    priced_search(start, budget_s=0.5, polish_share=0.5, moves=200)
    found = finish(start)
    report = validate_schedule(instance, found)
    assert report.ok, report.violations
    tolerance = _tolerance(oracle.objective)
    assert oracle.objective - tolerance <= found.objective
    assert start.bound <= oracle.objective + tolerance


@settings(max_examples=40, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=4), st.floats(0.0, 3.0), st.floats(0.0, 3.0))
def test_a_choice_costs_its_value_less_its_prices_at_any_prices(
    instance: LiveScalingInstance, scale_new: float, scale_old: float
) -> None:
    """Each choice's ``value`` is its batch's share of the priced total, and what it costs
    without its prices does not depend on them: under other prices the batch's least value is
    at most that cost plus the new prices of the same slot time (what a column of the slot
    LP in ``benchmarks/slot_dual.py`` is)."""
    _, prices = slot_bound(instance, upper_bound=math.inf, iterations=10)
    assert prices is not None
    total, paths = solve_batches(prices, None, paths=True)
    assert sum(path.value for path in paths) == pytest.approx(total, rel=1e-9, abs=1e-12)
    L = instance.num_layers

    def use(i: int, path: SlotPath) -> tuple[np.ndarray, np.ndarray]:
        old = [] if path.old_start is None else [path.old_start]
        block = (L - path.split) * instance.old_layer_s[i]
        new_use = slot_usage(
            prices.new, list(path.new_starts), [instance.new_layer_s[i]] * len(path.new_starts)
        )
        old_use = slot_usage(prices.old, old, [block] * len(old))
        return new_use + prices.new.width, old_use + prices.old.width

    lam, mu = prices.lam, prices.mu
    columns = []
    for i, path in enumerate(paths):
        new_use, old_use = use(i, path)
        columns.append((path.value - float(lam @ new_use + mu @ old_use), new_use, old_use))
    lam2 = lam * scale_new + 0.5 * (1 - scale_new / 3)
    mu2 = mu * scale_old + 0.5 * (1 - scale_old / 3)
    prices.set(lam2, mu2)
    _, others = solve_batches(prices, None, paths=True)
    for (cost, new_use, old_use), path in zip(columns, others, strict=True):
        price = float(lam2 @ new_use + mu2 @ old_use)
        assert path.value <= cost + price + 1e-9 * max(1.0, abs(cost + price))


@settings(max_examples=100, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=4), st.booleans())
def test_the_quick_slot_bound_never_exceeds_the_enumerated_optimum(
    instance: LiveScalingInstance, from_optimum: bool
) -> None:
    """Property: ``quick_slot_bound`` (the printed bound's slot prices, on its own grid and
    steps) stays at most the exhaustive oracle's optimum, started from the optimum's own
    schedule or from ZigZag's, with the relaxation's bound as its floor."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate")
    known = oracle if from_optimum else schedule_live(instance, bound=False)
    floor, _, _ = relaxation_bound(instance, old_order="free", upper_bound=known.objective)
    bound = quick_slot_bound(
        instance,
        upper_bound=known.objective,
        completion_s=known.completion_s,
        time_limit_s=60.0,
        floor=floor,
        steps=30,
    )
    assert bound <= oracle.objective + _tolerance(oracle.objective)


def test_a_chain_shorter_than_a_step_takes_its_time() -> None:
    """Four layers of 0.1 s on N, all usable at 0, one batch, O 50 s a layer: the optimum ends
    at 0.4 on N. On a grid whose steps (0.625 s) are longer than a layer the chain is counted
    from its layers' own time, not its steps, so the program (plain or with the latency floor)
    ends it at 0.4, and no later."""
    inst = LiveScalingInstance([0.0] * 4, [0.0], 0.1, 50.0, 0.0)
    plain = SlotPrices(inst, 10.0, 4)
    floored = SlotPrices(inst, 10.0, 4, latency_floor=True)
    assert plain.bound() == pytest.approx(0.4)
    assert floored.bound() == pytest.approx(0.4)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=4), st.integers(2, 12), st.floats(0.0, 3.0))
def test_the_latency_floor_bounds_the_optimum_at_any_prices(
    instance: LiveScalingInstance, slots: int, scale: float
) -> None:
    """Property: with the latency floor, the program at any prices (here a ramp of ``scale``
    on both machines, on a coarse grid, where chains lose the most to the rounding) stays at
    most the exhaustive oracle's optimum, and at least the plain program's value."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate")
    horizon = max(oracle.completion_s)
    values = []
    for floor in (False, True):
        prices = SlotPrices(instance, horizon, slots, latency_floor=floor)
        lam = scale * np.linspace(1.0, 0.0, prices.new.count)
        mu = scale * np.linspace(0.5, 0.0, prices.old.count)
        prices.set(lam, mu)
        values.append(prices.bound())
    assert values[0] <= values[1] + _tolerance(values[1])
    assert values[1] <= oracle.objective + _tolerance(oracle.objective)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(1, 6), st.integers(1, 60), st.integers(0, 2**32 - 1))
def test_the_trace_finds_the_first_least_step_from_where_it_is(
    rows: int, size: int, seed: int
) -> None:
    """The trace's search (the first cell at or after ``at`` where the run meets its suffix
    least) picks, per row, the first step from ``at`` on that pays the row's least from
    there, as a plain scan does: on rows of few distinct values (ties) and infinities."""
    rng = np.random.default_rng(seed)
    run = rng.integers(0, 4, (rows, size)).astype(float)
    run[rng.random((rows, size)) < 0.3] = math.inf
    run[:, -1] = rng.integers(0, 4, rows)  # every row pays something at its last step
    best = np.minimum.accumulate(run[:, ::-1], axis=1)[:, ::-1]
    at = rng.integers(0, size, rows)
    offsets = np.arange(rows) * size
    plain = np.where(np.arange(size)[None, :] >= at[:, None], run, math.inf).argmin(1)
    assert (_first_least(_least_cells(run, best), offsets + at) == offsets + plain).all()


def _crowded() -> LiveScalingInstance:
    """One layer arriving at 1.5, three batches of 1.5-2 s a layer on either machine, O busy
    until 2: the relaxation (O's order exact, N's capacity dropped) is 17% under the best
    schedule known, so the printed bound takes the slot bound."""
    return LiveScalingInstance(
        [1.5], [0.0, 1.0, 0.0], [2.0, 1.5, 1.5], [2.0, 1.5, 2.0], [0.5, 0.0, 0.5], old_free_at_s=2.0
    )


def test_the_printed_bound_takes_the_slot_bound_on_a_crowded_pair() -> None:
    """The optimum is 3.5 (enumerated), ZigZag's 3.83, the relaxation's bound 3.17: the slot
    bound's prices lift the printed bound past 3.2 (3.49 on a quiet machine), and past 3.3 in
    40 steps from the optimum's own schedule; never past 3.5."""
    instance = _crowded()
    oracle = schedule_live(instance, method="exact", backend="enumerate")
    assert oracle.objective == pytest.approx(3.5)
    relaxed, _, _ = relaxation_bound(instance, old_order="free", upper_bound=3.9)
    assert relaxed == pytest.approx(19 / 6)
    printed = schedule_live(instance, old_order="free")
    assert printed.bound is not None
    assert 3.2 < printed.bound <= oracle.objective + _tolerance(oracle.objective)
    steps = quick_slot_bound(
        instance,
        upper_bound=oracle.objective,
        completion_s=oracle.completion_s,
        time_limit_s=60.0,
        floor=relaxed,
        steps=40,
    )
    assert 3.3 < steps <= oracle.objective + _tolerance(oracle.objective)


def test_the_printed_slot_bound_counts_its_steps_by_the_estimate() -> None:
    """The printed bound's slot steps are counted from the instance's size, not the clock (so
    a plan that prints it has the same id on every run that is not slowed past the estimate):
    the count and the set-up (the grids, the first prices' trial) fit in the budget by the
    estimate, fewer on a bigger pair, never none; and the same count gives the same bound on
    every call."""
    small, big = (
        _crowded(),
        LiveScalingInstance(
            [0.1] * 8, [0.0] * 6, [0.2] * 6, [0.3] * 6, [0.05] * 6, old_free_at_s=0.5
        ),
    )
    for instance in (small, big):
        per_step = quick_steps_s(instance) / QUICK_STEPS
        count = quick_step_count(instance, 0.15)
        assert count >= 1
        assert (count + QUICK_SETUP_STEPS) * per_step <= 0.15
    assert quick_step_count(big, 0.15) < quick_step_count(small, 0.15)
    assert quick_step_count(big, 1e-9) == 1
    oracle = schedule_live(small, method="exact", backend="enumerate")
    values = {
        quick_slot_bound(
            small,
            upper_bound=3.83,
            completion_s=oracle.completion_s,
            time_limit_s=60.0,
            steps=quick_step_count(small, 0.15),
        )
        for _ in range(2)
    }
    assert len(values) == 1


def test_the_printed_slot_bound_pays_its_horizons_from_its_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The printed bound's slot steps try horizons (:data:`QUICK_HORIZONS`, nearer while the
    first prices' bound gains): each after the first is paid from the counted steps
    (:data:`QUICK_SETUP_STEPS`), and none is tried when fewer than :data:`MIN_STEPS` would be
    left, and only when the known schedule is far (its ``floor`` under :data:`QUICK_FAR` of its
    value). On the crowded pair from ZigZag's schedule all four are tried in 40 steps; in 21,
    or with the relaxation's bound as the floor (0.83 of ZigZag's value), one."""
    solved = {True: 0, False: 0}

    def counting(prices: SlotPrices, restriction: None, *, paths: bool) -> object:
        solved[paths] += 1
        return solve_batches(prices, restriction, paths=paths)

    monkeypatch.setattr(relaxation_slots, "solve_batches", counting)
    instance = _crowded()
    zigzag = schedule_live(instance, bound=False)
    relaxed, _, _ = relaxation_bound(instance, old_order="free", upper_bound=zigzag.objective)
    assert relaxed > QUICK_FAR * zigzag.objective
    runs = ((40, -math.inf, len(QUICK_HORIZONS)), (MIN_STEPS + 1, -math.inf, 1), (40, relaxed, 1))
    for steps, floor, horizons in runs:
        solved[True] = solved[False] = 0
        value = quick_slot_bound(
            instance,
            upper_bound=zigzag.objective,
            completion_s=zigzag.completion_s,
            time_limit_s=60.0,
            floor=floor,
            steps=steps,
        )
        assert solved[False] == horizons  # each horizon's first prices: one program
        assert solved[True] + QUICK_SETUP_STEPS * (horizons - 1) <= steps
        assert value <= 3.5 + _tolerance(3.5)
