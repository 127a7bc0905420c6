"""The busy bound (:mod:`blitzplan.live.bound.busy`) held against the exhaustive oracle on
crowded tiny instances, O in FIFO order, at every layer arrival and release, over split ranges
around the optimum's; and the same check catching a charge made too large."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from unittest import mock

import numpy as np

from blitzplan.live.bound import busy as relaxation_busy
from blitzplan.live.bound.busy import busy_bound, busy_point
from blitzplan.live.bound.dp import solve_relaxation
from blitzplan.live.bound.relaxation import Relaxation, Restriction
from blitzplan.live.exact import node_bound
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.exact.node_bound import node_capacity
from tests.test_live_capacity_bound import crowded_cases


def _nodes(seed: int, count: int) -> Iterator[tuple[Relaxation, float, float, float]]:
    """(restricted relaxation, the least over its schedules (the optimum's split range keeps the
    optimum), the N-capacity relaxation's value, a point ``t``), per FIFO case, four split
    ranges around the optimum's and every arrival and release; all in objective units."""
    rng = random.Random(seed)
    for inst, order, oracle in crowded_cases(seed, count):
        if order != "fifo":
            continue
        split, n, layers = oracle.split, inst.num_batches, inst.num_layers
        for trial in range(4):
            low = tuple(rng.randint(0, k) for k in split) if trial else split
            high = tuple(rng.randint(k, layers) for k in split) if trial else split
            relax = Relaxation(inst, "mean_latency", Restriction(low, high, ((),) * n))
            plain, _, _ = solve_relaxation(relax, old_order="fifo")
            for at in sorted({*inst.usable_s, *inst.release_s}):
                yield relax, oracle.objective, relax.obj.final(plain), at


def _uncharged(work: np.ndarray, at: float, top: np.ndarray) -> np.ndarray:
    return np.zeros(np.shape(top))


def _check(charge: Callable[..., np.ndarray] | None = None) -> tuple[int, int, int]:
    """(nodes, bounds the last completion's charge raises, bounds above the optimum) over the
    cases, at the default work levels, at 1 s levels (states merged across most works) and at
    0.1 ms levels made coarser while a merge keeps more than two states."""
    tried = lifted = over = 0
    patch = mock.patch.object(relaxation_busy, "last_charge", charge) if charge else nullcontext()
    with patch:
        for grid, most in ((relaxation_busy.BUSY_GRID_S, None), (1.0, None), (1e-4, 2)):
            with (
                mock.patch.object(relaxation_busy, "BUSY_GRID_S", grid),
                mock.patch.object(relaxation_busy, "BUSY_MAX_STATES", most or 10**9),
            ):
                for relax, optimum, plain, at in _nodes(41, 60):
                    upper = relax.obj.scaled(2 * optimum + 10)
                    bound = relax.obj.final(busy_bound(relax, upper, at, math.inf))
                    assert bound >= plain - 1e-9 * max(1.0, plain)
                    with mock.patch.object(relaxation_busy, "last_charge", _uncharged):
                        without = relax.obj.final(busy_bound(relax, upper, at, math.inf))
                    tried += 1
                    lifted += bound > without + 1e-9 * max(1.0, without)
                    over += bound > optimum + 1e-9 * max(1.0, optimum)
    return tried, lifted, over


def test_the_busy_bound_never_exceeds_the_enumerated_optimum() -> None:
    """Every restricted node keeps the optimum; no bound passes it or falls under the
    N-capacity relaxation, and the last completion's charge raises some."""
    tried, lifted, over = _check()
    assert over == 0
    assert tried >= 1000 and lifted >= 80


def test_the_oracle_check_catches_a_charge_too_large() -> None:
    """The same check with the last completion's charge tripled finds bounds above the
    optimum: the check can fail."""

    def tripled(work: np.ndarray, at: float, top: np.ndarray) -> np.ndarray:
        return np.asarray(3.0 * np.where(work > 0, np.maximum(0.0, at + work - top), 0.0))

    _, _, over = _check(tripled)
    assert over > 0


def test_a_cut_short_search_bounds_nothing_and_the_point_is_an_arrival() -> None:
    """Past its instant the search returns -inf (no claim); the point is a layer arrival."""
    inst, _, _ = next(crowded_cases(7, 1))
    relax = Relaxation(inst, "mean_latency")
    assert busy_bound(relax, math.inf, inst.usable_s[0], time.perf_counter() - 1.0) == -math.inf
    assert busy_point(relax, (inst.num_layers,) * inst.num_batches) in inst.usable_s


def test_the_node_bound_with_the_busy_bound_is_at_most_the_node_optimum() -> None:
    """On restricted nodes (split ranges and start limits on N; the node bound's tests'
    instances), O in FIFO order, with an incumbent 50% above the node's optimum, the busy bound
    run at any gap and the optimum's splits as the incumbent's: the node bound never passes the
    node's optimum; the busy bound lifts some of them above the capacity program."""
    from tests.test_live_node_bound import (
        MAX_COMBINATIONS,
        _combinations,
        _crowded,
        _random_restriction,
        _value,
    )

    rng = random.Random("busy-nodes")
    checked = lifted = 0
    for seed in range(1, 40, 2):
        inst = _crowded(seed)
        if count_schedules(inst, old_order="fifo") > MAX_COMBINATIONS:
            continue
        combos = list(_combinations(inst, "fifo"))
        for r in [Restriction.none(inst)] + [_random_restriction(inst, rng) for _ in range(6)]:
            values = [(_value(inst, r, c, "mean_latency"), c[0]) for c in combos]
            best, split = min(values)
            if math.isinf(best):
                continue
            relax = Relaxation(inst, "mean_latency", r)
            upper = relax.obj.scaled(best) * 1.5
            with mock.patch.object(node_bound, "NODE_BUSY_GAP", 1.0):
                bound = node_capacity(relax, upper, "fifo", upper, math.inf, split)
            plain = node_capacity(relax, upper, "fifo", upper, math.inf)
            assert relax.obj.final(bound) <= best * (1 + 1e-9) + 1e-9, (seed, r, bound, best)
            checked += 1
            lifted += bound > plain + 1e-9 * max(1.0, abs(plain))
    assert checked >= 40 and lifted >= 3
