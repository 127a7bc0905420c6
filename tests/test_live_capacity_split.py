"""The capacity program's shared-work condition with the batch's own split apart
(:meth:`~blitzplan.live.bound.conditions.Capacity.shared`), and the subset program's merge
under a free order (:func:`~blitzplan.live.bound.subsets._pareto`): each completion the
condition gives is checked against every schedule of crowded tiny instances (and of random
nodes), the bound against the exhaustive oracle, and the merge against the program without it."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
import pytest

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan.live.bound import last_blocks as relaxation_pairs
from blitzplan.live.bound import splits as relaxation_splits
from blitzplan.live.bound import subsets as relaxation_subsets
from blitzplan.live.bound.conditions import Capacity
from blitzplan.live.bound.dp import capacity_bound
from blitzplan.live.bound.relaxation import Relaxation, Restriction
from blitzplan.live.bound.subset_table import _Table
from blitzplan.live.exact.enumerate import count_schedules
from tests.test_live_bnb_nodes import _crowded as _nodes_crowded
from tests.test_live_capacity_bound import _crowded
from tests.test_live_capacity_served import _restriction
from tests.test_live_node_bound import _combinations, _timed

TOL = 1e-9

_SHARED = Capacity.shared


def _shared_alone(self: Capacity, served: np.ndarray, i: int, free: np.ndarray) -> np.ndarray:
    """The condition before: shared work only, ``i``'s split not apart."""
    total = self.b_old + served[0] + self.whole[i]
    x = (total - self.a1 - self.p_old[i]) / (1 + self.ratio)
    return np.asarray(total - np.maximum(x, 0.0))


def _late_layer() -> LiveScalingInstance:
    """Two layers landing at 0 and 2.5, two batches of 0.25 and 1 s a layer (both instances)
    queued at 0, hand-offs 0.1 s, O free at 1 (found by a search of random tiny instances):
    shared work alone lets N take the long batch's second layer, which lands too late."""
    return LiveScalingInstance(
        [0.0, 2.5], [0.0, 0.0], [0.25, 1.0], [0.25, 1.0], [0.1, 0.1], old_free_at_s=1.0
    )


def _checked(inst: LiveScalingInstance, r: Restriction, old_order: str) -> tuple[int, int]:
    """Every schedule that keeps ``r``: each served batch completes no earlier than the
    condition says, given the batches O served before it and O's free time then. Returns how
    many completions were checked and on how many the split apart rose above shared work."""
    cap = _Table(Relaxation(inst, "mean_latency", r), capacity=True).capacity
    assert cap is not None
    checked = raised = 0
    for combo in _combinations(inst, old_order):
        split, _, old = combo
        if any(
            not lo <= k <= hi for k, lo, hi in zip(split, r.split_min, r.split_max, strict=True)
        ):
            continue
        completion, before = _timed(inst, r, combo)
        mask = 0
        for b in old:
            served, free = cap.served(np.array([mask])), np.array([before[b]])
            bound = float(cap.shared(served, b, free)[0])
            assert bound <= completion[b] + TOL, (inst, r, combo, b, bound, completion[b])
            checked += 1
            raised += bound > float(_shared_alone(cap, served, b, free)[0]) + TOL
            mask |= 1 << b
    return checked, raised


def _handed_off(rng: random.Random) -> LiveScalingInstance:
    """A tiny instance whose hand-offs may outlast a layer on O (which batch N ran last
    matters), with unequal layer times on the two instances."""
    layers, n = rng.randint(2, 3), rng.randint(2, 3)
    p_new = [rng.choice([0.25, 0.5, 1.0]) for _ in range(n)]
    return LiveScalingInstance(
        sorted(rng.choice([0.0, 0.5, 1.0, 2.0]) for _ in range(layers)),
        [rng.choice([0.0, 0.0, 0.5]) for _ in range(n)],
        p_new,
        [p * rng.choice([0.5, 1.0, 2.0]) for p in p_new],
        [rng.choice([0.0, 0.5, 1.0, 1.5]) for _ in range(n)],
        old_free_at_s=rng.choice([0.0, 1.0, 2.0]),
    )


@pytest.mark.parametrize("groups", [1, 8])
@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_no_schedule_completes_a_served_batch_before_the_condition(
    old_order: str, groups: int
) -> None:
    """Property: on crowded tiny instances, :func:`_handed_off` ones and :func:`_late_layer`,
    every schedule (every split, N order and O order), timed as early as it can be, completes
    each served batch no earlier than the condition with its split apart, and that rises
    above shared work alone on some of them. With one group (every split but 0 together) the
    groups' own bounds are checked too (with eight, on these sizes, each split is alone)."""
    rng = random.Random(1517)
    cases = [_crowded(rng) for _ in range(40)] + [_nodes_crowded(s) for s in range(20)]
    cases += [_handed_off(rng) for _ in range(30)]
    checked = raised = 0
    with mock.patch.object(relaxation_splits, "SPLIT_GROUPS", groups):
        for inst in [*cases, _late_layer()]:
            if count_schedules(inst, old_order=old_order) > 20_000:
                continue
            got = _checked(inst, Restriction.none(inst), old_order)
            checked, raised = checked + got[0], raised + got[1]
    assert checked >= 10_000 and raised >= 100, (checked, raised)


@pytest.mark.parametrize("groups", [1, 8])
def test_no_schedule_of_a_node_completes_a_served_batch_before_the_condition(groups: int) -> None:
    """Property: the same on random nodes (narrowed split ranges, start limits on N), whose
    split groups and alone chains are the node's."""
    rng, checked, raised = random.Random(2315), 0, 0
    with mock.patch.object(relaxation_splits, "SPLIT_GROUPS", groups):
        for seed in range(30):
            inst = _nodes_crowded(seed)
            if count_schedules(inst, old_order="free") > 20_000:
                continue
            for _ in range(3):
                got = _checked(inst, _restriction(inst, rng), "free")
                checked, raised = checked + got[0], raised + got[1]
    assert checked >= 5_000 and raised >= 20, (checked, raised)


def test_the_split_apart_lifts_the_bound_on_a_late_layer_and_not_past_the_optimum() -> None:
    """On :func:`_late_layer` under a free order the capacity bound is 1.75 with shared work
    alone and 1.775 with the split apart (the pair bound off); the enumerated optimum is 1.8
    (in both orders), which the pair bound (:mod:`blitzplan.live.bound.last_blocks`) reaches."""
    inst = _late_layer()
    for order in ("free", "fifo"):
        oracle = schedule_live(inst, method="exact", backend="enumerate", old_order=order)
        assert oracle.objective == pytest.approx(1.8)
        assert capacity_bound(inst, old_order=order) <= oracle.objective + TOL
    assert capacity_bound(inst, old_order="free") == pytest.approx(1.8)
    with mock.patch.object(relaxation_pairs, "PAIRS", False):
        assert capacity_bound(inst, old_order="free") == pytest.approx(1.775)
        with mock.patch.object(Capacity, "shared", _shared_alone):
            assert capacity_bound(inst, old_order="free") == pytest.approx(1.75)


def _merge_all(grown: list[dict[str, np.ndarray]], **_: bool) -> dict[str, np.ndarray]:
    """No merge at all: every state kept."""
    return {key: np.concatenate([g[key] for g in grown]) for key in grown[0]}


def _merged_away() -> LiveScalingInstance:
    """Found by a search of random tiny instances: merged on O free time and cost, the free
    order's capacity program is 2.91875 (mean latency), kept whole 2.875 (optimum 3.125),
    without the pair bound (:mod:`blitzplan.live.bound.last_blocks`; with it 3.0 either way)."""
    return LiveScalingInstance(
        [0.0, 2.0],
        [0.5, 1.0, 0.0, 1.0],
        [1.0, 1.0, 1.5, 1.0],
        [1.0, 1.0, 1.0, 0.25],
        [0.5, 0.5, 0.1, 0.5],
        old_free_at_s=2.0,
        head_ready_s=2.5,
    )


def test_the_merge_never_lifts_the_free_program_above_it_kept_whole() -> None:
    """Property: under a free order the capacity program with its merge is at most the program
    that keeps every state (the merge only drops states that cannot complete lower), on
    crowded tiny instances and on :func:`_merged_away`, where the merge on cost alone
    (``relative=False``) rises above it."""
    rng = random.Random(296)
    for inst in [_merged_away(), *(_crowded(rng) for _ in range(60))]:
        merged = capacity_bound(inst, old_order="free")
        with (  # kept whole, every state takes its own lift (none is left to the merge)
            mock.patch.object(relaxation_subsets, "_pareto", _merge_all),
            mock.patch.object(relaxation_pairs, "LAZY_PAIRS", False),
        ):
            whole = capacity_bound(inst, old_order="free")
        assert merged <= whole + TOL * max(1.0, whole), (inst, merged, whole)
    real = relaxation_subsets._pareto
    with mock.patch.object(relaxation_pairs, "PAIRS", False):  # the values before the pair bound
        with mock.patch.object(
            relaxation_subsets, "_pareto", lambda grown, **_: real(grown, relative=False)
        ):
            assert capacity_bound(_merged_away(), old_order="free") == pytest.approx(2.91875)
        assert capacity_bound(_merged_away(), old_order="free") == pytest.approx(2.875)
    assert capacity_bound(_merged_away(), old_order="free") == pytest.approx(3.0)  # pair bound
