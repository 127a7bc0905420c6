"""The Lagrangian bound (:func:`blitzplan.live.bound.lagrange.lagrangian_bound`): a small
case where it counts N's capacity that the N-capacity relaxation drops, and the bound held
against the exhaustive oracle on random tiny instances (O in FIFO order, mean latency); uncut,
it is never below the relaxation (its first step, with every multiplier 0)."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound import lagrange as relaxation_lagrange
from blitzplan.live.bound import lagrange_prices
from blitzplan.live.bound import printed as printed_bound
from blitzplan.live.bound import slots as relaxation_slots
from blitzplan.live.bound.dp import solve_relaxation
from blitzplan.live.bound.lagrange import (
    GRID_POINTS,
    _fifo_program,
    lagrangian_bound,
    quick_free_step_s,
)
from blitzplan.live.bound.lagrange_prices import Priced, Prices
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.exact.enumerate import count_schedules
from tests.test_live_properties import instances


def _relaxed(instance: LiveScalingInstance) -> float:
    relax = Relaxation(instance, "mean_latency")
    cost, _, _ = solve_relaxation(relax, old_order="fifo")
    return relax.obj.final(cost)


def test_four_unit_batches_count_the_new_instance_once() -> None:
    """One layer usable at 0, four batches of 1 s queued at 0, O free, no hand-off: the optimum
    ends them at 1, 1, 2, 2 (mean 1.5); the relaxation lets all of them end at 1 (1.0). Priced,
    N finishing several batches by ``t`` pays for ``t`` of capacity: the bound rises above 1.3
    and stays at most the optimum."""
    inst = LiveScalingInstance([0.0], [0.0] * 4, 1.0, 1.0, 0.0)
    assert _relaxed(inst) == pytest.approx(1.0)
    optimum = schedule_live(inst, method="exact", backend="enumerate", old_order="fifo")
    assert optimum.objective == pytest.approx(1.5)
    bound = lagrangian_bound(inst, old_order="fifo")
    assert 1.3 < bound <= 1.5 + 1e-12


def test_three_batches_of_two_layers_close_half_the_relaxation_gap() -> None:
    """Layers usable at 1.5 and 2, batches of 1.5 s a layer released at 1, 0.5 and 0.5, O free
    at 0.5, no hand-off, O in FIFO order: the optimum is 25/6 and the relaxation 3.5 (every
    batch runs its first layer on N from 1.5 as if alone). Priced, the bound passes 3.8."""
    inst = LiveScalingInstance([1.5, 2.0], [1.0, 0.5, 0.5], 1.5, 1.5, 0.0, old_free_at_s=0.5)
    assert _relaxed(inst) == pytest.approx(3.5)
    optimum = schedule_live(inst, method="exact", backend="enumerate", old_order="fifo")
    assert optimum.objective == pytest.approx(25 / 6)
    bound = lagrangian_bound(inst, old_order="fifo", upper_bound=optimum.objective)
    assert 3.8 < bound <= optimum.objective + 1e-12


def test_it_declines_what_it_does_not_bound() -> None:
    inst = LiveScalingInstance([0.0], [0.0] * 4, 1.0, 1.0, 0.0)
    assert lagrangian_bound(inst, old_order="free") == -math.inf
    assert lagrangian_bound(inst, old_order="fifo", objective="makespan") == -math.inf


@settings(max_examples=120, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=4), st.sampled_from([None, 1.0, 1.5]))
def test_the_lagrangian_bound_never_exceeds_the_enumerated_optimum(
    instance: LiveScalingInstance, steered: float | None
) -> None:
    """Property: over every schedule with O in FIFO order (the exhaustive oracle), none is
    better than the bound, whether the multipliers are steered toward the optimum itself, toward
    a value above it (as a heuristic's) or not; it is at least the relaxation's optimum."""
    assume(count_schedules(instance, old_order="fifo") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate", old_order="fifo")
    upper = math.inf if steered is None else oracle.objective * steered
    bound = lagrangian_bound(instance, old_order="fifo", upper_bound=upper, iterations=60)
    assert bound <= oracle.objective + 1e-9 * max(1.0, abs(oracle.objective))
    assert bound >= _relaxed(instance) - 1e-9 * max(1.0, abs(bound))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(
    instances(max_layers=4, max_batches=4),
    st.sampled_from([0.25, 1.0, 3.0]),
    st.sampled_from([None, 2.0]),
)
def test_rounding_o_free_time_down_keeps_the_bound_under_the_optimum(
    instance: LiveScalingInstance, free_step_s: float, steered: float | None
) -> None:
    """Property: with O's free time rounded down to coarse steps (a quarter of a second to
    three seconds, against batches of 0.25-2 s a layer) the Lagrangian bound, unsteered or
    steered toward twice the optimum (so that nothing caps it at the optimum), is still never
    above the exhaustive oracle's optimum."""
    assume(count_schedules(instance, old_order="fifo") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate", old_order="fifo")
    bound = lagrangian_bound(
        instance,
        old_order="fifo",
        upper_bound=math.inf if steered is None else oracle.objective * steered,
        iterations=30,
        free_step_s=free_step_s,
    )
    assert bound <= oracle.objective + 1e-9 * max(1.0, abs(oracle.objective))


def test_the_quick_step_is_a_small_share_of_o_work() -> None:
    inst = LiveScalingInstance([0.0, 1.0], [0.0, 0.0], 1.0, [1.0, 3.0], 0.0)
    assert quick_free_step_s(inst) == pytest.approx(1e-4 * 2 * 4.0)
    assert quick_free_step_s(inst, far=True) == pytest.approx(1e-3 * 2 * 4.0)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(instances(max_layers=6, max_batches=5), st.integers(0, 2**31))
def test_what_a_batch_pays_is_the_sum_over_its_counted_layers(
    instance: LiveScalingInstance, seed: int
) -> None:
    """Property: for random multipliers, the tabulated price of ``k`` layers whose last ends
    by grid point ``J`` equals the multipliers summed over what :meth:`Prices.used` counts
    (the tables are gathered from the counted pairs only)."""
    prices = Prices(instance, GRID_POINTS)
    mu = np.random.default_rng(seed).random(prices.mu.shape)
    prices.set(mu)
    L, G = mu.shape
    for i in range(instance.num_batches):
        for k in range(L + 1):
            for last in range(G + 1):
                expected = float(np.sum(mu * prices.used(i, k, last)))
                assert prices.pay[i][k, last] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def _plain_pareto(free: np.ndarray, cost: np.ndarray, later: int) -> np.ndarray:
    """The program's merge without the delay dominance (no later batch to cost anything)."""
    return _PARETO(free, cost, 0)


_PARETO = relaxation_lagrange._pareto


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    instances(max_layers=6, max_batches=7),
    st.integers(0, 2**31),
    st.sampled_from([0.05, 0.5, 2.0]),
    st.sampled_from([0.0, 0.3, 3.0]),
)
def test_the_delay_dominance_keeps_the_fifo_programs_value(
    instance: LiveScalingInstance, seed: int, free_step_s: float, scale: float
) -> None:
    """Property: at random multipliers (none, small, large), the FIFO program that also drops
    the states a later-freeing state beats by more than the delay can cost the batches after
    them (``relaxation_lagrange._pareto``) gives the value of the program that keeps every
    state off the plain Pareto front; with O's free time rounded down (no slack charged for
    it) its value lies between the plain program's rounded and unrounded values: at most the
    unrounded program's, so still a bound."""
    prices = Prices(instance, GRID_POINTS)
    rng = np.random.default_rng(seed)
    prices.set(scale * rng.random(prices.mu.shape) * (rng.random(prices.mu.shape) < 0.5))

    def program(step: float, plain: bool) -> float:
        args = (instance.fifo_order, instance.old_free_at_s, math.inf, math.inf, step)
        if not plain:
            return _fifo_program(Priced(prices), *args)[0]
        with mock.patch.object(relaxation_lagrange, "_pareto", _plain_pareto):
            return _fifo_program(Priced(prices), *args)[0]

    exact, exact_plain = program(0.0, False), program(0.0, True)
    assert exact == pytest.approx(exact_plain, rel=1e-9, abs=1e-9)
    rounded, rounded_plain = program(free_step_s, False), program(free_step_s, True)
    tol = 1e-9 * max(1.0, abs(exact_plain))
    assert rounded_plain - tol <= rounded <= exact_plain + tol


def test_the_delay_dominance_drops_states_of_a_small_pair() -> None:
    """One layer usable at 1.5, batches of 1.5, 1 and 0.5 s released at 0.5, 0 and 0, a hand-off
    of 0.5 s, O free at 0: of the plain front's nine states over the three batches the
    dominance keeps seven (the program's value unchanged, the property above)."""
    inst = LiveScalingInstance([1.5], [0.5, 0.0, 0.0], [1.5, 1.0, 0.5], [1.5, 1.0, 0.5], 0.5)
    sizes: dict[str, int] = {"pruned": 0, "plain": 0}

    def counted(name: str, merge):  # type: ignore[no-untyped-def]
        def run(free: np.ndarray, cost: np.ndarray, later: int) -> np.ndarray:
            kept = merge(free, cost, later)
            sizes[name] += kept.size
            return kept

        return run

    prices = Prices(inst, GRID_POINTS)
    args = (inst.fifo_order, inst.old_free_at_s, math.inf, math.inf, 0.0)
    with mock.patch.object(relaxation_lagrange, "_pareto", counted("pruned", _PARETO)):
        pruned, _ = _fifo_program(Priced(prices), *args)
    with mock.patch.object(relaxation_lagrange, "_pareto", counted("plain", _plain_pareto)):
        plain, _ = _fifo_program(Priced(prices), *args)
    assert pruned == pytest.approx(plain, rel=1e-12)
    assert (sizes["pruned"], sizes["plain"]) == (7, 9)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=4), st.sampled_from([1e-3, 0.05, 0.3]))
def test_the_printed_fifo_bound_on_a_far_pair_never_exceeds_the_enumerated_optimum(
    instance: LiveScalingInstance, share: float
) -> None:
    """Property: the bound ``plan()`` prints under FIFO, every pair taken as far from ZigZag (its
    Lagrangian on ``QUICK_GRID_POINTS``, O's free time rounded to ``share`` of O's work with no
    slack in the delay dominance, Polyak's aim), given all the steps it wants, is never above
    the optimum that enumerating every schedule finds."""
    assume(count_schedules(instance, old_order="fifo") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate", old_order="fifo")
    upper = schedule_live(instance, method="zigzag", old_order="fifo", bound=False).objective
    value = printed_bound.relaxation_value.__wrapped__  # type: ignore[attr-defined]
    with (
        mock.patch.object(relaxation_slots, "QUICK_FAR", 10.0),
        mock.patch.object(relaxation_lagrange, "QUICK_FAR_FREE_STEP_SHARE", share),
        mock.patch.object(printed_bound, "HEURISTIC_BOUND_S", 1.0),
    ):
        bound = value(instance, "mean_latency", "fifo", upper)
    assert bound <= oracle.objective + 1e-9 * max(1.0, abs(oracle.objective))


def _arrival_windows_only():  # type: ignore[no-untyped-def]
    """The windows before this session's change: row ``l`` opens at ``u_l`` and counts layers
    ``l..`` of every batch, whatever its release."""
    return (
        mock.patch.object(lagrange_prices, "_firsts", lambda starts, usable: None),
        mock.patch.object(lagrange_prices, "_opens", lambda starts, firsts: starts * -np.inf),
    )


def test_a_batch_released_after_its_layers_arrive_is_counted_from_its_release() -> None:
    """Layers usable at 0 and 0.5, batches of 1.5 s a layer released at 1, 2 and 1, no hand-off,
    O free at 4 (FIFO): every layer of a batch starts after its release, so the window opening
    at ``u_2`` = 0.5 counts the first layers of all three, and N can start none before 1. The
    bound rises by more than 0.1 over the arrival windows alone and stays under the optimum."""
    inst = LiveScalingInstance([0.0, 0.5], [1.0, 2.0, 1.0], 1.5, 1.5, 0.0, old_free_at_s=4.0)
    prices = Prices(inst, GRID_POINTS)
    assert [f.tolist() for f in prices.firsts if f is not None] == [[1, 1]] * 3
    opened = prices.grid - 1.0
    assert np.allclose(prices.slack, np.maximum(opened, 0.0)[None, :])
    optimum = schedule_live(inst, method="exact", backend="enumerate", old_order="fifo")
    bound = lagrangian_bound(inst, old_order="fifo", upper_bound=optimum.objective)
    first, second = _arrival_windows_only()
    with first, second:
        before = lagrangian_bound(inst, old_order="fifo", upper_bound=optimum.objective)
    assert before + 0.1 < bound <= optimum.objective + 1e-12


@st.composite
def _released_late(draw: st.DrawFn) -> LiveScalingInstance:
    """Tiny instances whose batches come after (some of) the layers, O often busy."""
    L, n = draw(st.integers(1, 3)), draw(st.integers(2, 4))
    arrivals = sorted(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=L, max_size=L)))
    releases = draw(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]), min_size=n, max_size=n)
    )
    p_new = draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 1.5]), min_size=n, max_size=n))
    handoff = draw(st.lists(st.sampled_from([0.0, 0.25]), min_size=n, max_size=n))
    busy = draw(st.sampled_from([0.0, 2.0, 4.0, 8.0]))
    return LiveScalingInstance(arrivals, releases, p_new, p_new, handoff, old_free_at_s=busy)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_released_late(), st.sampled_from([None, 1.0, 2.0]), st.sampled_from([0.0, 0.25]))
def test_the_release_windows_never_pass_the_enumerated_optimum(
    instance: LiveScalingInstance, steered: float | None, free_step_s: float
) -> None:
    """Property: with batches released after their first layers arrive (rows counted from a
    batch's first layer that cannot start before the window opens, windows opened at the
    earliest start of what they count), the Lagrangian bound, steered toward the optimum,
    twice it or nothing, O's free time rounded or not, is never above the exhaustive oracle."""
    assume(count_schedules(instance, old_order="fifo") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate", old_order="fifo")
    upper = math.inf if steered is None else oracle.objective * steered
    bound = lagrangian_bound(
        instance, old_order="fifo", upper_bound=upper, iterations=60, free_step_s=free_step_s
    )
    assert bound <= oracle.objective + 1e-9 * max(1.0, abs(oracle.objective))


@settings(max_examples=120, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=4), st.sampled_from([1.0, 1.5, 3.0]))
def test_the_far_settings_never_pass_the_enumerated_optimum(
    instance: LiveScalingInstance, steered: float
) -> None:
    """Property: given a plain relaxation's bound far under the known value (as at the exact
    search's root on (80,16)), the bound takes the far settings (the printed bound's grid, O's
    free time rounded to a thousandth of O's work, Polyak's aim) and, steered toward the
    optimum or above it, is still never above the exhaustive oracle's optimum."""
    assume(count_schedules(instance, old_order="fifo") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate", old_order="fifo")
    upper = oracle.objective * steered
    bound = lagrangian_bound(
        instance, old_order="fifo", upper_bound=upper, iterations=60, relaxed=0.0
    )
    assert bound <= oracle.objective + 1e-9 * max(1.0, abs(oracle.objective))


def test_far_means_the_relaxation_under_a_share_of_a_known_value() -> None:
    share = relaxation_lagrange.FAR_RELAXED
    assert relaxation_lagrange.far_from(0.5 * share, 1.0)
    assert not relaxation_lagrange.far_from(share, 1.0)
    assert not relaxation_lagrange.far_from(-math.inf, 1.0)
    assert not relaxation_lagrange.far_from(0.1, math.inf)


def test_a_relaxation_far_under_the_known_value_takes_the_far_settings() -> None:
    """The grid, rounding and aim follow ``relaxed``: under ``FAR_RELAXED`` of the known value
    the printed bound's far ones, at or above it (or not given) the defaults."""
    inst = LiveScalingInstance([1.5, 2.0], [1.0, 0.5, 0.5], 1.5, 1.5, 0.0, old_free_at_s=0.5)
    seen: list[tuple[object, ...]] = []
    real_prices, real_program = relaxation_lagrange.Prices, relaxation_lagrange._fifo_program

    def prices(instance: LiveScalingInstance, grid: tuple[int, int]) -> Prices:
        seen.append(("grid", grid))
        return real_prices(instance, grid)

    def program(*args: object, **kwargs: object) -> object:
        seen.append(("step", args[5]))
        return real_program(*args, **kwargs)  # type: ignore[arg-type]

    with (
        mock.patch.object(relaxation_lagrange, "Prices", prices),
        mock.patch.object(relaxation_lagrange, "_fifo_program", program),
    ):
        for relaxed in (1.0, 3.9, -math.inf):
            seen.clear()
            lagrangian_bound(
                inst, old_order="fifo", upper_bound=25 / 6, iterations=2, relaxed=relaxed
            )
            far = relaxed == 1.0
            step = quick_free_step_s(inst, far=True) if far else 0.0
            grid = relaxation_lagrange.QUICK_GRID_POINTS if far else GRID_POINTS
            assert seen[0] == ("grid", grid)
            assert {s for s in seen[1:]} == {("step", step)}
