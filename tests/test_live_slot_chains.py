"""N's chains in the slot program (:mod:`blitzplan.live.bound.slot_chains`): at any prices, on any
grid, no schedule (every split and order of tiny instances, each operation started as early as
its orders allow or later by random waits) pays, batch by batch, less than the program charges
that batch; and a chain of layers shorter than a step takes its time."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from blitzplan import LiveScalingInstance
from blitzplan.live.bound.slot_prices import SlotPrices, solve_batches
from blitzplan.live.bound.slots import default_horizon_s
from blitzplan.live.exact.enumerate import _interleavings, count_schedules
from tests.test_live_properties import instances


def timed(
    instance: LiveScalingInstance,
    split: tuple[int, ...],
    new_sequence: tuple[int, ...],
    old_sequence: tuple[int, ...],
    waits: np.ndarray,
) -> tuple[list[list[float]], list[float], list[float]]:
    """(N starts per batch, O start per batch or nan, completions) of the schedule with these
    orders, each operation ``waits[j]`` after the earliest it may start (``j``: its place, N's
    operations first)."""
    L, n = instance.num_layers, instance.num_batches
    end = list(instance.release_s)
    starts: list[list[float]] = [[] for _ in range(n)]
    clock = 0.0
    for j, batch in enumerate(new_sequence):
        layer = len(starts[batch]) + 1
        start = max(clock, instance.usable_s[layer - 1], end[batch]) + waits[j]
        starts[batch].append(start)
        clock = end[batch] = start + instance.new_layer_s[batch]
    completion, old_start = list(end), [math.nan] * n
    clock = instance.old_free_at_s
    for j, batch in enumerate(old_sequence, start=len(new_sequence)):
        k = split[batch]
        handed = end[batch] + instance.handoff_s[batch] * (k > 0)
        old_start[batch] = max(clock, instance.release_s[batch], handed) + waits[j]
        clock = completion[batch] = old_start[batch] + (L - k) * instance.old_layer_s[batch]
    return starts, old_start, completion


def paid(edges: np.ndarray, cum: np.ndarray, start: float, length: float) -> float:
    """The price of an operation ``[start, start + length]`` (nothing past the last edge)."""
    return float(np.interp(start + length, edges, cum) - np.interp(start, edges, cum))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    instances(max_layers=3, max_batches=3),
    st.integers(2, 16),
    st.booleans(),
    st.integers(0, 2**31 - 1),
)
def test_no_schedule_pays_a_batch_less_than_the_program_charges_it(
    instance: LiveScalingInstance, slots: int, floor: bool, seed: int
) -> None:
    """Property: at random prices on both machines, on grids of 2-16 slots (coarse, so that
    layers are shorter and longer than a step) with and without the latency floor, every
    schedule of every split and both orders, with and without random waits, pays each batch
    its latency and the prices of its operations at least the program's value for that batch
    (its choice's ``value``)."""
    assume(count_schedules(instance, old_order="free") <= 1_500)
    rng = np.random.default_rng(seed)
    prices = SlotPrices(instance, default_horizon_s(instance), slots, latency_floor=floor)
    prices.set(rng.exponential(1.0, prices.new.count), rng.exponential(1.0, prices.old.count))
    _, paths = solve_batches(prices, None, paths=True)
    charged = [path.value for path in paths]
    L, n = instance.num_layers, instance.num_batches
    for split in itertools.product(range(L + 1), repeat=n):
        on_old = [i for i in range(n) if split[i] < L]
        for new_sequence in _interleavings(list(split)):
            for old_sequence in itertools.permutations(on_old):
                for scale in (0.0, 0.3, 1.5):
                    waits = scale * rng.exponential(1.0, len(new_sequence) + len(old_sequence))
                    schedule = timed(instance, split, new_sequence, old_sequence, waits)
                    _check(instance, prices, split, schedule, charged)


def _check(
    instance: LiveScalingInstance,
    prices: SlotPrices,
    split: tuple[int, ...],
    schedule: tuple[list[list[float]], list[float], list[float]],
    charged: list[float],
) -> None:
    starts, old_start, completion = schedule
    L = instance.num_layers
    for i in range(instance.num_batches):
        cost = completion[i] - instance.release_s[i]
        for s in starts[i]:
            cost += paid(prices.new.edges, prices.cum_new, s, instance.new_layer_s[i])
        if split[i] < L:
            block = (L - split[i]) * instance.old_layer_s[i]
            cost += paid(prices.old.edges, prices.cum_old, old_start[i], block)
        assert charged[i] <= cost + 1e-9 * max(1.0, cost)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(instances(max_layers=4, max_batches=3), st.integers(2, 16), st.integers(0, 2**31 - 1))
def test_every_start_in_a_layers_window_pays_at_least_its_charge(
    instance: LiveScalingInstance, slots: int, seed: int
) -> None:
    """Property: at random prices, for every layer, batch and step it may run from, a layer
    whose chain position lies in the step (``u`` in ``[t_b, t_b + delta]``, so that it starts
    at ``u + (l - 1) pN``) pays at least the charge the program reads for it, at the window's
    ends and at random positions inside."""
    rng = np.random.default_rng(seed)
    prices = SlotPrices(instance, default_horizon_s(instance), slots)
    prices.set(rng.exponential(1.0, prices.new.count), rng.exponential(1.0, prices.old.count))
    chains, edges, cum = prices.chains, prices.new.edges, prices.cum_new
    charge = prices.run_price[chains.charge_at]  # [l - 1, i, b]
    for i in range(instance.num_batches):
        p, delta = instance.new_layer_s[i], float(chains.delta_s[i])
        for layer in range(1, instance.num_layers + 1):
            for b in range(int(chains.first[i, layer - 1]), chains.size):
                for u in (0.0, 1.0, *rng.random(3)):
                    start = chains.times[i, b] + u * delta + (layer - 1) * p
                    price = paid(edges, cum, start, p)
                    assert charge[layer - 1, i, b] <= price + 1e-9 * max(1.0, price)


def test_a_chain_of_short_layers_is_charged_its_time_and_its_slots() -> None:
    """One batch of 16 layers of 0.05 s on N, all usable at 0, O 50 s a layer, a grid of 8
    slots of 0.25 s (each step longer than a layer) with N's price 1 in every slot: the best
    choice ends at 0.8 and pays 0.8 s of N, so the program charges 1.6: the chain's time is
    counted from its layers, not from the steps it starts in (a grid over the starts
    themselves ran the chain inside one step: 0.8 charged)."""
    inst = LiveScalingInstance([0.0] * 16, [0.0], 0.05, 50.0, 0.0)
    prices = SlotPrices(inst, 2.0, 8)
    prices.set(np.ones(prices.new.count), np.zeros(prices.old.count))
    total, _ = solve_batches(prices, None, paths=False)
    assert total == pytest.approx(1.6)
