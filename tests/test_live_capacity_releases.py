"""The capacity program's crowding term counts N's work after every release, not only after
the layers' arrivals (:attr:`~blitzplan.live.bound.conditions.Capacity.points`): a batch
released at ``s`` runs every one of its layers on N after ``s``. Held against the exhaustive
oracle on tiny instances whose batches arrive while the layers do, for the whole problem
(both orders) and for random nodes of the search (FIFO), and shown to raise the bound."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
import pytest

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound.conditions import CAPACITY_THRESHOLDS, Capacity
from blitzplan.live.bound.dp import capacity_bound
from blitzplan.live.bound.relaxation import Relaxation
from tests.test_live_capacity_bound import crowded_cases
from tests.test_live_capacity_served import node_cases
from tests.test_live_node_bound import _bound

REL = 1e-9

_INIT = Capacity.__init__


def _arrivals_only(self: Capacity, *args: object, **kwargs: object) -> None:
    """The crowding term before: taken at the grid's layer arrivals only, each batch's layers
    from the arrived one on counted after it."""
    _INIT(self, *args, **kwargs)  # type: ignore[arg-type]
    inst = self.table.relax.instance
    grid = sorted({int(x) for x in np.linspace(0, inst.num_layers - 1, CAPACITY_THRESHOLDS)})
    self.points = [(inst.usable_s[j], j * self.p_new) for j in grid]
    self.point_groups = [np.arange(len(grid))]


def _staggered(rng: random.Random) -> LiveScalingInstance:
    """A tiny instance whose batches are released while the layers land, N crowded."""
    layers, n = rng.randint(1, 3), rng.randint(2, 4)
    arrivals = sorted(rng.choice([0.0, 0.5, 1.0, 1.5]) for _ in range(layers))
    p_new = [rng.choice([0.5, 1.0, 1.5, 2.0]) for _ in range(n)]
    p_old = p_new if rng.random() < 0.7 else [rng.choice([0.5, 1.0, 2.0]) for _ in range(n)]
    return LiveScalingInstance(
        arrivals,
        sorted(rng.choice([0.0, 0.0, 0.5, 1.0, 1.5, 2.0]) for _ in range(n)),
        p_new,
        p_old,
        [rng.choice([0.0, 0.0, 0.5]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 1.0, 2.0, 4.0, 6.0]),
        head_ready_s=arrivals[-1] + rng.choice([0.0, 0.5]),
    )


def _late_pair() -> LiveScalingInstance:
    """Two layers usable at 0 and 1.5; batches of 2 s a layer on N, 2 and 0.5 s on O,
    released at 0.5 and 1.5, no hand-off; O busy until 4."""
    return LiveScalingInstance(
        [0.0, 1.5], [0.5, 1.5], [2.0, 2.0], [2.0, 0.5], [0.0, 0.0], old_free_at_s=4.0
    )


def test_a_late_release_lifts_the_bound_to_the_optimum() -> None:
    """On :func:`_late_pair` under FIFO (mean latency) the enumerated optimum is 3.75; the
    crowding term taken at the layers' arrivals gives 3.5, and taken also at batch 1's
    release (all its layers run on N after 1.5) the bound meets the optimum."""
    inst = _late_pair()
    oracle = schedule_live(inst, method="exact", backend="enumerate", old_order="fifo")
    assert oracle.objective == pytest.approx(3.75)
    assert capacity_bound(inst, old_order="fifo") == pytest.approx(3.75)
    with mock.patch.object(Capacity, "__init__", _arrivals_only):
        assert capacity_bound(inst, old_order="fifo") == pytest.approx(3.5)


def test_the_releases_never_lift_the_bound_past_the_optimum() -> None:
    """Property: on 150 staggered tiny instances, in both orders (mean latency), the capacity
    bound is at most the enumerated optimum and at least the bound taken at the arrivals
    alone; it is higher on some."""
    tried, raised = 0, 0
    for inst, order, oracle in crowded_cases(1502, 150, _staggered):
        tried += 1
        bound = capacity_bound(inst, old_order=order)
        assert bound <= oracle.objective + REL * max(1.0, oracle.objective), (inst, order)
        with mock.patch.object(Capacity, "__init__", _arrivals_only):
            before = capacity_bound(inst, old_order=order)
        assert bound >= before - REL * max(1.0, bound)
        raised += bound > before + 1e-9
    assert tried >= 150 and raised >= 5, (tried, raised)


def test_the_releases_never_lift_a_node_past_its_optimum() -> None:
    """Property: on staggered tiny instances under FIFO, four random restrictions each (split
    ranges, sometimes a start limit), the node's capacity bound is at most the node's optimum
    (every schedule the restriction allows), and higher than taken at the arrivals alone on
    some."""
    rng, checked, raised = random.Random(1503), 0, 0
    for inst, r, best in node_cases(rng, ((_staggered(rng), 4) for _ in range(60)), 3_000):
        bound = _bound(inst, r, "mean_latency", "fifo")
        assert bound <= best * (1 + REL) + 1e-9, (inst, r, bound, best)
        with mock.patch.object(Capacity, "__init__", _arrivals_only):
            raised += bound > _bound(inst, r, "mean_latency", "fifo") + 1e-9
        checked += 1
    assert checked >= 100 and raised >= 3, (checked, raised)


def test_the_points_count_every_release() -> None:
    """The crowding term is taken at the arrivals (the layers under each, as before) and at
    the arrivals and releases again, each batch's layers that may start on N before the point
    counted apart: at 1.5 on :func:`_late_pair`, the layer under layer 2 of both batches, then
    batch 0's first layer (from 0.5) and none of batch 1's (released at 1.5)."""
    inst = _late_pair()
    cap = Capacity(Relaxation(inst, "mean_latency"), mock.Mock(on_new=np.zeros(2)))
    assert [at for at, _ in cap.points] == [0.0, 1.5, 0.0, 0.5, 1.5]
    assert [list(layers) for _, layers in cap.points[1::3]] == [[2.0, 2.0], [2.0, 0.0]]
