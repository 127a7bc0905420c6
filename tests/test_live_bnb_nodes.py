"""The branch and bound's search (``backend="bnb"``) watched node by node against the exhaustive
oracle, on tiny instances built to crowd N (so that the search branches).

A node is bounded when made and checked against N (and offered as a schedule) only when taken
to be branched; the branching may take the overload of the operation that ends latest past its
due time. Neither may lift the search's running bound above the optimum: at every node taken,
the least bound over that node, the open nodes and the nodes set aside is at most the oracle's
optimum, and an OPTIMAL answer is the optimum.
"""

from __future__ import annotations

import math
import random
from unittest import mock

import pytest

from blitzplan import LiveScalingInstance, schedule_live, validate_schedule
from blitzplan.live.exact import bnb
from blitzplan.live.exact.enumerate import count_schedules
from blitzplan.live.exact.nmachine import NOp, overload
from blitzplan.live.schedule import Schedule
from blitzplan.solvers import SolveStatus

REL = 1e-5  # OPTIMAL is proven within this relative gap

SEEDS = range(60)


def _crowded(seed: int) -> LiveScalingInstance:
    """2-3 layers landing by 0.5 s, 3-4 batches of 0.25-1.5 s a layer mostly queued at 0, O
    busy for up to 4 s: N is wanted by several batches at once."""
    rng = random.Random(seed)
    L, n = rng.choice([2, 3]), rng.choice([3, 4])
    p_new = [rng.choice([0.25, 0.5, 1.0, 1.5]) for _ in range(n)]
    p_old = p_new if rng.random() < 0.5 else [rng.choice([0.25, 0.5, 1.0]) for _ in range(n)]
    return LiveScalingInstance(
        sorted(rng.choice([0.0, 0.25, 0.5]) for _ in range(L)),
        [rng.choice([0.0, 0.0, 0.0, 0.5, 1.0]) for _ in range(n)],
        p_new,
        p_old,
        [rng.choice([0.0, 0.1, 0.5]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 1.0, 2.0, 4.0]),
    )


BRANCHING = {"first": (False, True), "worst": (True, False), "default": (True, True)}
"""(WORST_OVERLOAD, FIRST_OVERLOAD_EARLY) per way of choosing the overload to branch on: the
first found throughout, the worst throughout, and the shipped one (first in the early share)."""


def _watched(
    instance: LiveScalingInstance, old_order: str, branching: str
) -> tuple[Schedule, list[float], int]:
    """bnb's answer, the search's running bound at every node taken (objective units), and how
    many nodes were branched."""
    worst, first_early = BRANCHING[branching]
    seen: list[float] = []
    real = bnb._Search.settle

    def settle(self: bnb._Search, node: bnb._Node) -> bool:
        low = min([self.floor, node.bound, *(other.bound for other in self.open)])
        seen.append(self.obj.final(low))
        return real(self, node)

    with (
        mock.patch.object(bnb._Search, "settle", settle),
        mock.patch.object(bnb, "WORST_OVERLOAD", worst),
        mock.patch.object(bnb, "FIRST_OVERLOAD_EARLY", first_early),
    ):
        found = schedule_live(instance, method="exact", backend="bnb", old_order=old_order)
    branched = int(found.message.split(" node(s) branched")[0].split()[-1])
    return found, seen, branched


@pytest.mark.parametrize("branching", sorted(BRANCHING))
@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_the_running_bound_never_passes_the_optimum(old_order: str, branching: str) -> None:
    """On 60 crowded tiny instances: at every node taken the search's bound is at most the
    oracle's optimum, the answer is OPTIMAL at the optimum, and the search branched on many
    of them (the check is not vacuous)."""
    branched = 0
    for seed in SEEDS:
        inst = _crowded(seed)
        if count_schedules(inst, old_order=old_order) > 20_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=old_order)
        found, seen, nodes = _watched(inst, old_order, branching)
        branched += nodes > 0
        assert validate_schedule(inst, found).ok
        best = oracle.objective
        assert all(low <= best * (1 + REL) + 1e-9 for low in seen), (seed, best, max(seen))
        assert found.status is SolveStatus.OPTIMAL, (seed, found.message)
        assert found.objective == pytest.approx(best, rel=REL, abs=1e-9), seed
    assert branched >= 10, branched


def test_the_worst_overload_is_an_overload_at_least_as_late_as_the_first() -> None:
    """The set taken for the operation that ends latest past its due is released from its
    start on, due by its end, and holds more work than fits between them; its excess is at
    least the first set's. Three unit operations due at 2 from 0, then six due at 8 from 4."""
    ops = [NOp(0.0, 2.0, 1.0, b, 1) for b in range(3)]
    ops += [NOp(4.0, 8.0, 1.0, 3 + b, 1) for b in range(6)]
    first, worst = overload(ops), overload(ops, worst=True)
    assert first is not None and worst is not None
    assert (first.start_s, first.end_s, first.work_s) == (0.0, 2.0, 3.0)
    assert (worst.start_s, worst.end_s, worst.work_s) == (4.0, 8.0, 6.0)
    for found in (first, worst):
        assert all(op.release_s >= found.start_s and op.due_s <= found.end_s for op in found.ops)
        assert math.fsum(op.length_s for op in found.ops) == found.work_s
        assert found.work_s > found.end_s - found.start_s
    assert overload(ops[:2], worst=True) is None


@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_the_restart_from_the_root_never_passes_the_optimum(old_order: str) -> None:
    """On 60 crowded tiny instances with no early share (the root bounds come first, then the
    search starts again from the root at the whole problem's bound): at every node taken the
    search's bound is at most the oracle's optimum, the answer is OPTIMAL at the optimum, and
    the restart was taken on many of them (the check is not vacuous)."""
    restarts: list[float] = []
    real = bnb._Search.restart

    def restart(self: bnb._Search, ended: bool = False) -> None:
        restarts.append(self.start.bound)
        real(self, ended)

    for seed in SEEDS:
        inst = _crowded(seed)
        if count_schedules(inst, old_order=old_order) > 20_000:
            continue
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=old_order)
        with (
            mock.patch.object(bnb, "EARLY_SEARCH_MAX_S", 0.0),
            mock.patch.object(bnb._Search, "restart", restart),
        ):
            found, seen, _ = _watched(inst, old_order, "default")
        best = oracle.objective
        assert validate_schedule(inst, found).ok
        assert all(low <= best * (1 + REL) + 1e-9 for low in seen), (seed, best, max(seen))
        assert found.status is SolveStatus.OPTIMAL, (seed, found.message)
        assert found.objective == pytest.approx(best, rel=REL, abs=1e-9), seed
    assert len(restarts) >= 10, len(restarts)
