"""The slot relaxation's master LP with exact block values and clique cuts
(:mod:`blitzplan.live.bound.master`): every cut and block value holds for every schedule, and
the bound never exceeds the exhaustive oracle's optimum."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound.master import Cut, _Priced, master_bound
from blitzplan.live.bound.slots import default_horizon_s
from blitzplan.live.exact.enumerate import count_schedules
from tests.test_live_properties import instances
from tests.test_live_slot_blocks import every_schedule, slots_of

pytest.importorskip("highspy")

GRID_SLOTS = 12
"""O's slots in the checks of every cut (coarse, so that blocks span several)."""


def _grid(instance: LiveScalingInstance) -> _Priced:
    return _Priced(instance, default_horizon_s(instance), GRID_SLOTS)


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
    for split, starts, _ in every_schedule(instance):
        for choice in itertools.product(
            *[slots_of(prices, s) if split[i] < L else [-1] for i, s in enumerate(starts)]
        ):
            total = np.zeros(len(cuts))
            for i, c in enumerate(choice):
                if c >= 0:
                    total += tables[:, i, split[i], c]
            assert total.max() <= 1.0, [cuts[j] for j in np.nonzero(total > 1)[0]]
            tight += int(total.max() == 1.0)
    assume(tight > 0)


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


def test_a_crowded_pair_is_bounded_near_its_optimum() -> None:
    """On a pair where O's blocks crowd (four batches of two layers, one usable late), the
    master with and without cuts comes within 0.5% of the optimum and does not pass it; the
    cuts take nothing away."""
    inst = LiveScalingInstance([0.0, 3.0], [0.0, 0.0, 0.5, 1.0], 1.0, 1.0, 0.5, old_free_at_s=0.5)
    oracle = schedule_live(inst, method="exact", backend="enumerate")
    args = {"completion_s": oracle.completion_s, "upper_bound": oracle.objective}
    plain = master_bound(inst, **args, time_limit_s=60.0, slots=20, cuts=False)
    lifted = master_bound(inst, **args, time_limit_s=60.0, slots=20)
    assert 0.995 * oracle.objective < plain.bound <= lifted.bound * (1 + 1e-9)
    assert lifted.bound <= oracle.objective * (1 + 1e-9)
