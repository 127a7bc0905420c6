"""O's blocks in the slot program (:mod:`blitzplan.live.bound.slot_blocks`): at any prices no
schedule's block pays less than the program charges its slot, and the traced start pays it."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance
from blitzplan.live.bound.slot_blocks import least_start
from blitzplan.live.bound.slot_prices import SlotPrices, solve_batches
from blitzplan.live.bound.slots import default_horizon_s
from blitzplan.live.exact.enumerate import _interleavings, count_schedules
from blitzplan.live.schedule import timetable
from tests.test_live_properties import instances

GRID_SLOTS = 12
"""O's slots in the checks of every block (coarse, so that blocks span several)."""


def every_schedule(
    instance: LiveScalingInstance,
) -> list[tuple[list[int], list[float], list[float]]]:
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


def slots_of(prices: SlotPrices, start_s: float) -> list[int]:
    """The O slots (closed) that hold ``start_s``, one past the last included."""
    at = (start_s - float(prices.old.edges[0])) / prices.old.width
    near = round(at)
    if abs(at - near) <= 1e-9:
        return [c for c in (near - 1, near) if 0 <= c <= prices.old.count]
    return [min(math.floor(at), prices.old.count)]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(max_layers=3, max_batches=3), st.integers(0, 2**31 - 1))
def test_no_block_pays_less_than_its_slots_value(instance: LiveScalingInstance, seed: int) -> None:
    """Property: at random prices on O's slots, in every semi-active schedule, a batch whose
    block starts in O slot ``c`` pays its prices plus its completion at least what the
    program charges a block of its split in that slot (``old_value``). Without the floor's own
    start among the candidates this fails (3.1064 against 3.0970)."""
    assume(count_schedules(instance, old_order="free") <= 3_000)
    prices = SlotPrices(instance, default_horizon_s(instance), GRID_SLOTS)
    rng = np.random.default_rng(seed)
    prices.set(np.zeros(prices.new.count), rng.exponential(1.0, prices.old.count))
    table = prices.old_value
    edges, cum, L = prices.old.edges, prices.cum_old, instance.num_layers
    for split, starts, completion in every_schedule(instance):
        for i, start in enumerate(starts):
            if split[i] == L:
                continue
            paid = np.interp(completion[i], edges, cum) - np.interp(start, edges, cum)
            for c in slots_of(prices, start):
                assert table[i, split[i], c] <= paid + completion[i] + 1e-9


@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(max_layers=3, max_batches=3), st.integers(0, 2**31 - 1))
def test_the_traced_start_pays_its_slots_value(instance: LiveScalingInstance, seed: int) -> None:
    """Property: at random prices, the start :func:`least_start` gives in each O slot lies in
    the slot (or past the last edge) and pays, with its completion after its floor, what the
    program charges that slot."""
    prices = SlotPrices(instance, default_horizon_s(instance), GRID_SLOTS)
    rng = np.random.default_rng(seed)
    prices.set(np.zeros(prices.new.count), rng.exponential(1.0, prices.old.count))
    edges, cum, C = prices.old.edges, prices.cum_old, prices.old.count
    n, L = instance.num_batches, instance.num_layers
    for i, k, c in itertools.product(range(n), range(L), range(C + 1)):
        q, floor_s = float(prices.q[i, k]), float(prices.earliest[i, k])
        start = least_start(edges, cum, q, floor_s, c)
        assert edges[min(c, C)] - 1e-12 <= start
        assert c == C or start <= edges[c + 1] + 1e-12
        paid = np.interp(start + q, edges, cum) - np.interp(start, edges, cum)
        assert paid + max(start, floor_s) + q == pytest.approx(
            prices.old_value[i, k, c], rel=1e-9, abs=1e-12
        )


def test_a_block_waits_for_its_hand_off_in_the_slot_it_is_handed_over_in() -> None:
    """One batch, two layers of 1 s on N (the second usable at 10), 2 s a layer on O, a 1 s
    hand-off; on 4 slots of 2.5 s, N's and O's first slots priced 10. Its chain runs layer 1
    from 1.25 (a start at 2.5 pays nothing), so the hand-off ends at 3.25 at the earliest,
    in O's slot [2.5, 5]: the block completes at 5.25, not at 4.5 from the slot's start
    (``handover``). No schedule pays less than 6.5 (layer 1 at 2.5, or O from 2.5)."""
    inst = LiveScalingInstance([0.0, 10.0], [0.0], 1.0, 2.0, 1.0)
    totals = []
    for handover in (False, True):
        prices = SlotPrices(inst, 10.0, 4, handover=handover)
        prices.set(np.array([10.0, 0.0, 0.0, 0.0]), np.array([10.0, 0.0, 0.0, 0.0]))
        totals.append(solve_batches(prices, None, paths=False)[0])
    assert totals == pytest.approx([4.5, 5.25])
