"""The free-order capacity program's cheaper paths give the same values: the pair bound's lifts
taken in the merge (:func:`~blitzplan.live.bound.last_blocks.fill_pairs`) against every
child's own, and only for the levels where a state needs one (:class:`_PendingPairs`) against
every level's; the ends of every batch at once against one batch at a time; and one search
against the incumbent (``first_step=inf``) against rising targets."""

from __future__ import annotations

import math
import random
from unittest import mock

import numpy as np
import pytest

from blitzplan.live.bound import last_blocks
from blitzplan.live.bound.dp import capacity_bound
from blitzplan.live.bound.relaxation import Relaxation, Restriction
from blitzplan.live.bound.subsets import _pareto, _PendingPairs, _Table
from tests.test_live_capacity_bound import _crowded
from tests.test_live_pair_bound import _staggered

TOL = 1e-12


def _instances(seed: int, count: int) -> list:  # type: ignore[type-arg]
    rng = random.Random(seed)
    return [_crowded(rng) if k % 3 == 2 else _staggered(rng) for k in range(count)]


@pytest.mark.parametrize("seed", range(2))
def test_lifts_taken_in_the_merge_give_the_same_program(seed: int) -> None:
    """The capacity program with the lazy lifts equals the one that lifts every child, and the
    pair bound lifts some of these instances (else the check would hold trivially)."""
    lifted = 0
    for inst in _instances(40 + seed, 40):
        lazy = capacity_bound(inst, old_order="free")
        with mock.patch.object(last_blocks, "LAZY_PAIRS", False):
            eager = capacity_bound(inst, old_order="free")
        with mock.patch.object(last_blocks, "PAIRS", False):
            plain = capacity_bound(inst, old_order="free")
        assert lazy == pytest.approx(eager, rel=TOL, abs=TOL), inst
        lifted += lazy > plain + 1e-9
    assert lifted >= 3


def test_the_merge_leaves_out_only_lifts_the_carry_never_reads() -> None:
    """A random level merged with :func:`~blitzplan.live.bound.last_blocks.fill_pairs` keeps
    the lifts the eager merge keeps, and some dropped states' lifts are never taken."""
    inst = _instances(7, 1)[0]
    table = _Table(Relaxation(inst, "mean_latency"), capacity=True)
    cap = table.capacity
    assert cap is not None
    rng = np.random.default_rng(3)
    n, size = inst.num_batches, 300
    last = rng.integers(0, n, size)
    others = rng.integers(0, 1 << n, size) & ~(np.int64(1) << last)
    parent_free = rng.uniform(0.0, 2.0, size)
    grown = {
        "mask": others | (np.int64(1) << last),
        "free": parent_free + rng.uniform(0.0, 30.0, size),
        "cost": rng.uniform(0.0, 10.0, size),
        "parent": np.arange(size),
        "last": last,
    }
    served = cap.served(others)
    eager = np.zeros(size)
    for i in range(n):
        rows = np.flatnonzero(last == i)
        left = table.unplaced(grown["mask"][rows])
        on_new = (left @ (cap.layers * cap.p_new), cap.last_on_new(left))
        eager[rows] = last_blocks.pair_extra_s(
            cap, i, parent_free[rows], served[:, rows], grown["free"][rows], on_new
        )
    assert eager.max() > 0
    want = _pareto([{**grown, "pair": eager}], relative=True)
    taken: list[int] = []

    def fill(merged: dict[str, np.ndarray], keep: np.ndarray) -> None:
        last_blocks.fill_pairs(cap, parent_free, merged, keep)
        taken.append(int(np.count_nonzero(merged["pair"])))

    lifts = _PendingPairs(fill)
    got = _pareto([{**grown, "pair": np.zeros(size)}], relative=True, lifts=lifts)
    assert not taken and not got["pair"].any()  # none taken until needed
    lifts.out = got["pair"]
    lifts()
    assert np.array_equal(got["parent"], want["parent"])
    assert np.allclose(got["pair"], want["pair"], rtol=0, atol=TOL)
    assert taken and taken[0] < np.count_nonzero(eager)


@pytest.mark.parametrize("seed", range(2))
def test_lifts_taken_when_needed_give_the_same_program(seed: int) -> None:
    """The capacity program that takes a level's lifts only when a state needs one equals, to
    the bit, the one that takes every level's, and leaves some levels' lifts untaken."""
    calls = {"lazy": 0, "levels": 0}
    fill, done = last_blocks.fill_pairs, _Table.done

    def counted(*args: object, **kwargs: object) -> None:
        calls["lazy"] += 1
        fill(*args, **kwargs)  # type: ignore[arg-type]

    def every_level(self: _Table, *args: object) -> np.ndarray:
        if self.pending is not None:
            calls["levels"] += 1
            self.pending()
        return done(self, *args)  # type: ignore[arg-type]

    for inst in _instances(80 + seed, 30):
        upper = 1.05 * capacity_bound(inst, old_order="free")
        with mock.patch.object(last_blocks, "fill_pairs", counted):
            lazy = capacity_bound(inst, old_order="free", upper_bound=upper, first_step=math.inf)
        with mock.patch.object(_Table, "done", every_level):
            eager = capacity_bound(inst, old_order="free", upper_bound=upper, first_step=math.inf)
        assert lazy == eager, inst
    assert calls["lazy"] < calls["levels"]


def test_every_batch_at_once_ends_as_one_batch_at_a_time() -> None:
    """:meth:`_Table.ends` (every unplaced batch of every state at once, with the shared-work
    condition) equals, to the bit, :meth:`_Table.end` of one batch at a time."""
    for inst in _instances(9, 12):
        relax = Relaxation(inst, "mean_latency")
        table = _Table(relax, capacity=True)
        cap = table.capacity
        assert cap is not None
        rng = np.random.default_rng(inst.num_batches)
        n, size = inst.num_batches, 200
        mask = rng.integers(0, 1 << n, size)
        free = rng.uniform(0.0, 8.0, size)
        free[:3] = (0.0, math.inf, 1e-9)
        ends = table.ends(free, mask)
        served = cap.served(mask)
        for i in range(n):
            rows = (mask & (1 << i)) == 0
            one = table.end(i, free[rows], served[:, rows])
            assert np.array_equal(ends[rows, i], one)
            assert np.isinf(ends[~rows, i]).all()


@pytest.mark.parametrize("seed", range(2))
def test_one_search_against_the_incumbent_gives_about_the_rising_targets_value(seed: int) -> None:
    """Uncut, ``first_step=inf`` (one search at ``upper_bound``) gives the value of the
    rising targets on most instances, under a free order and FIFO, and never more (a search
    against a lower target grows fewer states, so its merge may keep a state a higher one
    drops for a state that completes lower: each search is a bound, the steps keep the
    largest)."""
    same = tried = 0
    for inst in _instances(60 + seed, 25):
        for order in ("free", "fifo"):
            upper = 1.5 * capacity_bound(inst, old_order=order) + 1.0
            steps = capacity_bound(inst, old_order=order, upper_bound=upper)
            once = capacity_bound(inst, old_order=order, upper_bound=upper, first_step=math.inf)
            assert once <= steps * (1 + 1e-9) + 1e-12
            tried += 1
            same += once == pytest.approx(steps, rel=1e-9, abs=1e-12)
    assert same >= 0.8 * tried


def test_ends_where_no_batch_may_end_on_o() -> None:
    """Every batch held on N by the restriction (no option on O): every end is inf, at once
    as one at a time."""
    inst = _instances(5, 1)[0]
    n, layers = inst.num_batches, inst.num_layers
    restriction = Restriction((layers,) * n, (layers,) * n, ((),) * n)
    table = _Table(Relaxation(inst, "mean_latency", restriction), capacity=True)
    mask, free = np.zeros(3, dtype=np.int64), np.asarray([0.0, 1.0, math.inf])
    assert np.isinf(table.ends(free, mask)).all()
    assert np.isinf(table.end(0, free, None)).all()
