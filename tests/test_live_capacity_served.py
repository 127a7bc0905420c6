"""The capacity program's crowding term under FIFO counts every served batch's block on O,
not only the last (:func:`~blitzplan.live.bound.served_blocks.leads`), and O's last
block's own share of N apart (:func:`~blitzplan.live.bound.served_blocks.last_block`): held
against the exhaustive oracle on crowded tiny instances, for the whole problem and for random
nodes of the search, and shown to raise the bound (a known answer)."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator
from unittest import mock

import numpy as np
import pytest

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound import deadlines as relaxation_deadlines
from blitzplan.live.bound import ranks as relaxation_ranks
from blitzplan.live.bound import served_blocks
from blitzplan.live.bound.conditions import Capacity, Crowding
from blitzplan.live.bound.dp import capacity_bound
from blitzplan.live.bound.relaxation import Restriction
from blitzplan.live.exact.enumerate import count_schedules
from tests.test_live_bnb_nodes import _crowded as _nodes_crowded
from tests.test_live_capacity_bound import crowded_cases
from tests.test_live_node_bound import _bound, _combinations, _value

REL = 1e-9


_LEADS = served_blocks.leads


def _last_only(self: Capacity, crowd: Crowding, rows: np.ndarray, **_: bool) -> np.ndarray:
    """The crowding term before: only the last served block (``B - free``) pays (at the
    arrivals' points)."""
    return crowd.extra[rows]


def _checked_leads(
    self: Capacity, mask: np.ndarray, placed: np.ndarray, free: np.ndarray, total: np.ndarray
) -> np.ndarray:
    """The leads, with the replay checked: the last served batch's lead is ``B - free``."""
    out = _LEADS(self, mask, placed, free, total)
    if self.table.fifo_rank is not None:
        rank = np.where(placed > 0, self.table.fifo_rank[None, :], -1)
        rows = np.flatnonzero(mask != 0)
        last = out[rows, rank[rows].argmax(axis=1)]
        assert np.allclose(last, (total - free)[rows])
    return out


def _two_long() -> LiveScalingInstance:
    """Two layers usable at 0.5 and 1 (the head), batches of 0.25, 0.25, 2 and 2 s a layer
    (both instances), released at 0.5, 0, 0, 0, hand-offs 0.1, 0.1, 0.1, 0; O free at 1."""
    return LiveScalingInstance(
        [0.5, 1.0],
        [0.5, 0.0, 0.0, 0.0],
        [0.25, 0.25, 2.0, 2.0],
        [0.25, 0.25, 2.0, 2.0],
        [0.1, 0.1, 0.1, 0.0],
        old_free_at_s=1.0,
    )


def test_the_earlier_blocks_pay_for_the_crowding_and_meet_the_optimum() -> None:
    """On :func:`_two_long` under FIFO the program's best state crowds N: charging the last
    O block alone, the bound is 3.09375 (mean latency); counting every served block, 3.125,
    the enumerated optimum. The rank bound (:mod:`blitzplan.live.bound.ranks`) meets it
    too, alone, and so does the deadline bound (:mod:`blitzplan.live.bound.deadlines`):
    both are off for the last-block-only bound."""
    inst = _two_long()
    oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="fifo")
    assert oracle.objective == pytest.approx(3.125)
    with (
        mock.patch.object(relaxation_ranks, "RANKS", False),
        mock.patch.object(relaxation_deadlines, "DEADLINES", False),
    ):
        assert capacity_bound(inst, old_order="fifo") == pytest.approx(3.125)
        with mock.patch.object(Capacity, "refined", _last_only):
            assert capacity_bound(inst, old_order="fifo") == pytest.approx(3.09375)
    for module, flag in ((relaxation_deadlines, "DEADLINES"), (relaxation_ranks, "RANKS")):
        with (
            mock.patch.object(Capacity, "refined", _last_only),
            mock.patch.object(module, flag, False),
        ):
            assert capacity_bound(inst, old_order="fifo") == pytest.approx(3.125)


def test_the_served_blocks_never_lift_the_bound_past_the_optimum() -> None:
    """Property: on 120 crowded tiny instances, in both orders (mean latency), the capacity
    bound is at most the enumerated optimum and at least the bound charging the last block
    alone; under FIFO the replayed completions meet the program's."""
    tried = 0
    for inst, order, oracle in crowded_cases(1423, 120):
        tried += 1
        with mock.patch.object(served_blocks, "leads", _checked_leads):
            bound = capacity_bound(inst, old_order=order)
        assert bound <= oracle.objective + REL * max(1.0, oracle.objective)
        with mock.patch.object(Capacity, "refined", _last_only):
            before = capacity_bound(inst, old_order=order)
        assert bound >= before - REL * max(1.0, bound)
    assert tried >= 120, tried


def _restriction(inst: object, rng: random.Random) -> Restriction:
    """A random node: some split ranges narrowed, sometimes a start limit."""
    L, n = inst.num_layers, inst.num_batches  # type: ignore[attr-defined]
    r = Restriction.none(inst)  # type: ignore[arg-type]
    for b in rng.sample(range(n), rng.randint(1, n)):
        low = rng.randint(0, L)
        r = r.at_least(b, low).at_most(b, rng.randint(low, L))
    if rng.random() < 0.4:
        b = rng.randrange(n)
        r = r.starting_after(b, rng.randint(1, L), rng.choice([0.25, 0.5, 1.0]), L)
    return r


def node_cases(
    rng: random.Random, cases: Iterable[tuple[LiveScalingInstance, int]], most: int
) -> Iterator[tuple[LiveScalingInstance, Restriction, float]]:
    """Per instance of ``cases`` with at most ``most`` FIFO schedules, its count of random
    restrictions (:func:`_restriction`, from ``rng``; ``cases`` is read as the nodes are
    drawn), each with its optimum (every schedule it allows, mean latency) where finite."""
    for inst, nodes in cases:
        if count_schedules(inst, old_order="fifo") > most:
            continue
        combos = list(_combinations(inst, "fifo"))
        for _ in range(nodes):
            r = _restriction(inst, rng)
            best = min(_value(inst, r, c, "mean_latency") for c in combos)
            if not math.isinf(best):
                yield inst, r, best


def test_the_served_blocks_never_lift_a_node_past_its_optimum() -> None:
    """Property: on crowded tiny instances under FIFO (four random restrictions each) and on
    :func:`_two_long` (twenty), the node's capacity bound is at most the node's optimum
    (every schedule the restriction allows); it rises above the last block's alone on some
    of :func:`_two_long`'s nodes."""
    rng, checked, raised = random.Random(2314), 0, 0
    cases = [(_nodes_crowded(seed), 4) for seed in range(40)] + [(_two_long(), 20)]
    for inst, r, best in node_cases(rng, cases, 8_000):
        bound = _bound(inst, r, "mean_latency", "fifo")
        assert bound <= best * (1 + REL) + 1e-9, (inst, r, bound, best)
        with mock.patch.object(Capacity, "refined", _last_only):
            before = _bound(inst, r, "mean_latency", "fifo")
        checked += 1
        raised += bound > before + 1e-9
    assert checked >= 80 and raised >= 2, (checked, raised)
