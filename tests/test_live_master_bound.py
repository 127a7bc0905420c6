"""The slot relaxation's master LP with exact block values and clique cuts
(:mod:`blitzplan.live.relaxation_master`): every cut and block value holds for every schedule, and
the bound never exceeds the exhaustive oracle's optimum."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.exact.enumerate import _interleavings, count_schedules
from blitzplan.live.relaxation_master import (
    Cut,
    _Priced,
    block_values,
    earliest_starts,
    master_bound,
)
from blitzplan.live.relaxation_slots import default_horizon_s
from blitzplan.live.schedule import timetable
from tests.test_live_properties import instances

pytest.importorskip("highspy")

GRID_SLOTS = 12
"""O's slots in the checks of every cut (coarse, so that blocks span several)."""


def _schedules(instance: LiveScalingInstance) -> list[tuple[list[int], list[float], list[float]]]:
    """Every semi-active schedule (as the oracle tries them): (split, O starts or nan,
    completions)."""
    out = []
    L, n = instance.num_layers, instance.num_batches
    for split in itertools.product(range(L + 1), repeat=n):
        on_old = [i for i in range(n) if split[i] < L]
        for new_sequence in _interleavings(list(split)):
            for old_sequence in itertools.permutations(on_old):
                _, old_ops, completion = timetable(instance, split, new_sequence, old_sequence)
                starts = [math.nan] * n
                for op in old_ops:
                    starts[op.batch] = op.start_s
                out.append((list(split), starts, list(completion)))
    return out


def _slots_of(prices: _Priced, start_s: float) -> list[int]:
    """The O slots (closed) that hold ``start_s``, one past the last included."""
    at = (start_s - float(prices.old.edges[0])) / prices.old.width
    near = round(at)
    if abs(at - near) <= 1e-9:
        return [c for c in (near - 1, near) if 0 <= c <= prices.old.count]
    return [min(math.floor(at), prices.old.count)]


def _grid(instance: LiveScalingInstance) -> _Priced:
    return _Priced(instance, default_horizon_s(instance), GRID_SLOTS, exact=True)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(max_layers=3, max_batches=3))
def test_every_schedule_keeps_every_clique_cut(instance: LiveScalingInstance) -> None:
    """Property: for every semi-active schedule, every window of O's slot edges and every
    batch ``l``, the cut's coefficients (taken at any slot that holds each block's start) sum
    to at most 1; and some cut is met with equality (the check is not vacuous). Made one slot
    longer, the "covers" window breaks this test."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    prices = _grid(instance)
    L, n, C = instance.num_layers, instance.num_batches, prices.old.count
    cuts = [Cut(j, a, b) for j in range(n) for a in range(C + 1) for b in range(a + 1, C + 1)]
    tables = np.stack([prices.coefficients(cut) for cut in cuts])  # [cut, i, k, c]
    tight = 0
    for split, starts, _ in _schedules(instance):
        for choice in itertools.product(
            *[_slots_of(prices, s) if split[i] < L else [-1] for i, s in enumerate(starts)]
        ):
            total = np.zeros(len(cuts))
            for i, c in enumerate(choice):
                if c >= 0:
                    total += tables[:, i, split[i], c]
            assert total.max() <= 1.0, [cuts[j] for j in np.nonzero(total > 1)[0]]
            tight += int(total.max() == 1.0)
    assume(tight > 0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(max_layers=3, max_batches=3), st.integers(0, 2**31 - 1))
def test_no_block_pays_less_than_its_slots_value(instance: LiveScalingInstance, seed: int) -> None:
    """Property: at random prices on O's slots, in every semi-active schedule, a batch whose
    block starts in O slot ``c`` pays its prices plus its completion at least
    :func:`block_values` of that slot (what the master's pricing charges)."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    prices = _grid(instance)
    rng = np.random.default_rng(seed)
    prices.set(np.zeros(prices.new.count), rng.exponential(1.0, prices.old.count))
    table = block_values(prices, earliest_starts(instance))
    edges, cum, L = prices.old.edges, prices.cum_old, instance.num_layers
    for split, starts, completion in _schedules(instance):
        for i, start in enumerate(starts):
            if split[i] == L:
                continue
            paid = np.interp(completion[i], edges, cum) - np.interp(start, edges, cum)
            for c in _slots_of(prices, start):
                assert table[i, split[i], c] <= paid + completion[i] + 1e-9


@settings(max_examples=40, deadline=None, derandomize=True)
@given(instances(max_layers=3, max_batches=4))
def test_the_master_bound_never_exceeds_the_enumerated_optimum(
    instance: LiveScalingInstance,
) -> None:
    """Property: with exact blocks and cuts, on a coarse and a fine grid, no schedule (the
    exhaustive oracle, free order) beats the bound; the master, when column generation ends
    by itself, meets the bound."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    oracle = schedule_live(instance, method="exact", backend="enumerate")
    for slots in (8, 40):
        found = master_bound(
            instance,
            completion_s=oracle.completion_s,
            upper_bound=oracle.objective,
            time_limit_s=60.0,
            slots=slots,
        )
        assert found.bound <= oracle.objective * (1 + 1e-9) + 1e-12
        if found.bound < oracle.objective * (1 - 1e-6):
            assert found.master == pytest.approx(found.bound, rel=1e-6)


def test_four_unit_batches_are_bounded_near_their_optimum() -> None:
    """One layer usable at 0, four batches of 1 s queued at 0, O free, no hand-off: the optimum
    ends them at 1, 1, 2, 2 (mean 1.5); on 100 slots the master comes within 1% of it."""
    inst = LiveScalingInstance([0.0], [0.0] * 4, 1.0, 1.0, 0.0)
    found = master_bound(
        inst, completion_s=[1.0, 1.0, 2.0, 2.0], upper_bound=1.5, time_limit_s=60.0, slots=100
    )
    assert 1.485 < found.bound <= 1.5 + 1e-12


def test_exact_blocks_and_cuts_lift_a_crowded_pair() -> None:
    """On a pair where O's blocks crowd (four batches of two layers, one usable late), the
    exact blocks and cuts give more than the plain master, and neither passes the optimum."""
    inst = LiveScalingInstance([0.0, 3.0], [0.0, 0.0, 0.5, 1.0], 1.0, 1.0, 0.5, old_free_at_s=0.5)
    oracle = schedule_live(inst, method="exact", backend="enumerate")
    args = {"completion_s": oracle.completion_s, "upper_bound": oracle.objective}
    plain = master_bound(inst, **args, time_limit_s=60.0, slots=20, cuts=False, exact_blocks=False)
    lifted = master_bound(inst, **args, time_limit_s=60.0, slots=20)
    assert plain.bound < lifted.bound <= oracle.objective * (1 + 1e-9)
