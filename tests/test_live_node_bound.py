"""The node capacity bound of the exact search (:mod:`blitzplan.live.exact.node_bound`) against
the exhaustive oracle of each node: on tiny crowded instances, for the restrictions the search
itself makes and for random ones, the bound is at most the least objective over every schedule
the restriction allows (every split in its range, every order of N's layers and O's blocks,
each operation started as early as the orders and the start limits allow)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from unittest import mock

import pytest

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound.relaxation import Relaxation, Restriction
from blitzplan.live.exact import bnb
from blitzplan.live.exact.enumerate import _interleavings, _old_orders, count_schedules
from blitzplan.live.exact.node_bound import node_capacity
from blitzplan.live.schedule import evaluate_objective
from blitzplan.solvers import SolveStatus
from tests.test_live_bnb_nodes import _crowded

REL = 1e-9

SEEDS = range(40)

MAX_COMBINATIONS = 6_000
"""Instances with more (split, N order, O order) combinations are left out (time)."""


def _combinations(inst: LiveScalingInstance, old_order: str) -> Iterator[tuple]:
    import itertools

    for split in itertools.product(range(inst.num_layers + 1), repeat=inst.num_batches):
        for new in _interleavings(list(split)):
            for old in _old_orders(inst, split, old_order):
                yield split, new, old


def _value(inst: LiveScalingInstance, r: Restriction, combo: tuple, objective: str) -> float:
    """The objective of the combination timed as early as its orders and ``r``'s start limits
    allow; inf when its split is out of ``r``'s range."""
    split = combo[0]
    if any(not lo <= k <= hi for k, lo, hi in zip(split, r.split_min, r.split_max, strict=True)):
        return math.inf
    return evaluate_objective(inst, _timed(inst, r, combo)[0], objective)


def _timed(inst: LiveScalingInstance, r: Restriction, combo: tuple) -> tuple[list[float], ...]:
    """(completions, O's free time before each batch) of the combination timed as early as its
    orders and ``r``'s start limits allow."""
    split, new, old = combo
    L, n = inst.num_layers, inst.num_batches
    done, last, clock = [0] * n, list(inst.release_s), 0.0
    for b in new:
        layer = done[b] + 1
        limit = r.start_after_s[b][layer - 1] if r.start_after_s[b] else 0.0
        start = max(clock, inst.usable_s[layer - 1], last[b], limit)
        clock = last[b] = start + inst.new_layer_s[b]
        done[b] = layer
    completion, before, clock = list(last), [math.nan] * n, inst.old_free_at_s
    for b in old:
        k = split[b]
        before[b] = clock
        start = max(clock, inst.release_s[b], last[b] + inst.handoff_s[b] * (k > 0))
        clock = completion[b] = start + (L - k) * inst.old_layer_s[b]
    return completion, before


def _bound(inst: LiveScalingInstance, r: Restriction, objective: str, old_order: str) -> float:
    relax = Relaxation(inst, objective, r)
    cost = node_capacity(relax, -math.inf, old_order, math.inf, math.inf)
    return relax.obj.final(cost)


def _deep(seed: int) -> LiveScalingInstance:
    """Two batches of 4-6 layers (wider split ranges than :func:`_crowded`'s), the first
    layer landing at 0-3 s (O may be done with a batch before N can run any)."""
    rng = random.Random(f"deep-{seed}")
    L, first = rng.choice([4, 5, 6]), rng.choice([0.0, 1.0, 3.0])
    p_new = [rng.choice([0.25, 0.5, 1.0]) for _ in range(2)]
    return LiveScalingInstance(
        sorted(first + rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(L)),
        [rng.choice([0.0, 0.0, 0.5]) for _ in range(2)],
        p_new,
        [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new],
        [rng.choice([0.0, 0.1, 0.5]) for _ in range(2)],
        old_free_at_s=rng.choice([0.0, 1.0, 2.0, 4.0]),
    )


def _random_restriction(inst: LiveScalingInstance, rng: random.Random) -> Restriction:
    r = Restriction.none(inst)
    L = inst.num_layers
    for _ in range(rng.randint(1, 3)):
        b = rng.randrange(inst.num_batches)
        pick = rng.random()
        if pick < 0.35:
            r = r.at_least(b, rng.randint(1, L))
        elif pick < 0.6:
            r = r.at_most(b, rng.randint(0, L - 1))
        else:
            r = r.starting_after(b, rng.randint(1, L), rng.choice([0.5, 1.0, 2.0, 3.0]), L)
    return r


def _searched_restrictions(
    inst: LiveScalingInstance, old_order: str, optimum: float
) -> list[Restriction]:
    """The restrictions of the nodes the search gives a capacity bound (no early share, so
    every node taken gets one); its answer is OPTIMAL at ``optimum``."""
    seen: list[Restriction] = []
    real = bnb.node_capacity

    def watched(relax: Relaxation, *args: object, **kwargs: bool) -> float:
        seen.append(relax.restriction)
        return real(relax, *args, **kwargs)  # type: ignore[arg-type]

    with (
        mock.patch.object(bnb, "node_capacity", watched),
        mock.patch.object(bnb, "EARLY_SEARCH_SHARE", 0.0),
    ):
        found = schedule_live(inst, method="exact", backend="bnb", old_order=old_order)
    assert found.status is SolveStatus.OPTIMAL, found.message
    assert found.objective == pytest.approx(optimum, rel=1e-5, abs=1e-9)
    return seen


@pytest.mark.parametrize("objective", ["mean_latency", "makespan"])
@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_the_node_bound_is_at_most_the_node_optimum(old_order: str, objective: str) -> None:
    """For every restriction the search bounds and five random ones per instance (crowded
    ones, and two deeper batches): the node capacity bound is at most the node's optimum,
    and the search's answer is OPTIMAL at the oracle's optimum. The check is not vacuous: on
    many nodes the bound is above the same program's without the restriction (the
    restriction counts), and on many it is within 5% of the node's optimum (a bound 5%
    higher fails)."""
    rng = random.Random(f"{old_order}-{objective}")
    checked = lifted = tight = 0
    for seed in SEEDS:
        inst = _crowded(seed) if seed % 2 else _deep(seed)
        if count_schedules(inst, old_order=old_order) > MAX_COMBINATIONS:
            continue
        combos = list(_combinations(inst, old_order))
        restrictions = [_random_restriction(inst, rng) for _ in range(5)]
        if objective == "mean_latency":
            optimum = min(_value(inst, Restriction.none(inst), c, objective) for c in combos)
            restrictions += _searched_restrictions(inst, old_order, optimum)[:12]
        free = _bound(inst, Restriction.none(inst), objective, old_order)
        for r in restrictions:
            best = min(_value(inst, r, c, objective) for c in combos)
            if math.isinf(best):
                continue
            bound = _bound(inst, r, objective, old_order)
            assert bound <= best * (1 + REL) + 1e-9, (seed, r, bound, best)
            checked += 1
            lifted += bound > free * (1 + 1e-9) + 1e-9
            tight += 1.05 * bound > best * (1 + REL) + 1e-9
    assert checked >= 60, checked
    assert lifted >= 10, lifted
    assert tight >= 10, tight
