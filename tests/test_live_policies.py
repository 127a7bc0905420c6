"""The online policies and their event loop: windows, the hand-off rule, fleets, fifo."""

from __future__ import annotations

import copy

import pytest

from blitzplan import (
    BestEffort,
    Fleet,
    InvalidInputError,
    LiveScalingInstance,
    StopTheWorld,
    ZigZag,
    schedule_live,
    validate_schedule,
)
from blitzplan.live import Pin, RelayState, RunLayers, RunRest, simulate

POLICIES = [StopTheWorld(), BestEffort(), ZigZag()]


def test_zigzag_window_narrows_every_200_ms_down_to_two() -> None:
    zigzag = ZigZag()
    assert [zigzag.window(t) for t in (0.0, 0.19, 0.2, 0.39, 0.4, 0.6, 10.0)] == [
        4,
        4,
        3,
        3,
        2,
        2,
        2,
    ]
    assert ZigZag(window_start=6, window_min=1, narrow_every_s=1.0).window(2.5) == 4


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"window_start": 0}, "window_start must be a positive integer"),
        ({"window_min": 5}, r"window_min \(5\) must be <= window_start \(4\)"),
        ({"narrow_every_s": 0.0}, "narrow_every_s must be > 0"),
    ],
)
def test_zigzag_options_are_checked(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        ZigZag(**kwargs)  # type: ignore[arg-type]


def test_zigzag_keeps_a_batch_when_the_hand_off_costs_more_than_it_saves() -> None:
    """O is busy until 1.5; N runs layer 1 at 1..2. At 2, O would finish the batch at
    2 + 5 (hand-off) + 1 = 8, N alone at 3 (layer 2 is already there): N keeps it."""
    inst = LiveScalingInstance([1.0, 1.05], [0.0], 1.0, 1.0, 5.0, old_free_at_s=1.5)
    schedule = schedule_live(inst, method="zigzag")
    assert schedule.split == (2,) and schedule.completion_s == (3.0,)
    assert validate_schedule(inst, schedule).ok


def test_zigzag_hands_off_when_the_old_instance_is_sooner() -> None:
    """Same, with a 0.1 s hand-off and layer 2 landing at 10: O finishes at 2.1 + 1 = 3.1,
    N alone not before 11, so O pulls the batch with its activation."""
    inst = LiveScalingInstance([1.0, 10.0], [0.0], 1.0, 1.0, 0.1, old_free_at_s=1.5)
    schedule = schedule_live(inst, method="zigzag")
    assert schedule.split == (1,)
    assert schedule.completion_s == pytest.approx((3.1,))
    assert validate_schedule(inst, schedule).ok


def test_best_effort_hands_off_whatever_the_cost() -> None:
    """Best-effort runs the one layer it has at 1 and hands off: 1..2, then 2 + 5 on O."""
    inst = LiveScalingInstance([1.0, 1.05], [0.0], 1.0, 1.0, 5.0, old_free_at_s=1.5)
    schedule = schedule_live(inst, method="best_effort")
    assert schedule.split == (1,) and schedule.completion_s == (8.0,)


def test_zigzag_admits_no_more_than_its_window() -> None:
    """Six batches, O busy for long: N admits a batch only while it holds fewer than the window
    allows at that moment (batches it already holds stay when the window narrows)."""
    inst = LiveScalingInstance(
        [0.1 * (k + 1) for k in range(6)], [0.0] * 6, 0.01, 0.01, 0.0, old_free_at_s=100.0
    )
    schedule = schedule_live(inst, method="zigzag")
    spans: dict[int, tuple[float, float]] = {}
    for op in schedule.new_ops:
        first, last = spans.get(op.batch, (op.start_s, op.end_s))
        spans[op.batch] = (min(first, op.start_s), max(last, op.end_s))
    admissions = sorted((first, batch) for batch, (first, _) in spans.items())
    for t, batch in admissions:
        held = sum(1 for b, (first, last) in spans.items() if b != batch and first < t < last)
        assert held < ZigZag().window(t - inst.layer_ready_s[0]), (t, batch, held)
    assert len(admissions) == 6 and admissions[-1][0] > 0.5  # the last ones waited for room


def _fleet_instance() -> tuple[LiveScalingInstance, Fleet]:
    inst = LiveScalingInstance(
        [0.05 * (k + 1) for k in range(8)],
        [0.0, 0.0, 0.0, 0.02, 0.05, 0.05, 0.1, 0.3, 0.31, 0.4],
        [0.01, 0.02, 0.005, 0.01, 0.03, 0.01, 0.02, 0.01, 0.015, 0.01],
        [0.01, 0.02, 0.005, 0.01, 0.03, 0.01, 0.02, 0.01, 0.015, 0.01],
        0.002,
    )
    fleet = Fleet(
        new_layer_ready_s=[inst.layer_ready_s, [0.06 * (k + 1) for k in range(8)]],
        old_free_at_s=[0.0, 0.05, 0.1],
    )
    return inst, fleet


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
@pytest.mark.parametrize("old_order", ["free", "fifo"])
def test_several_new_and_old_instances_share_one_relay_queue(policy, old_order: str) -> None:
    inst, fleet = _fleet_instance()
    schedule = simulate(policy, inst, fleet=fleet, old_order=old_order)
    report = validate_schedule(inst, schedule, fleet=fleet)
    assert report.ok, report.violations
    assert len({op.worker for op in schedule.old_ops}) == 3  # every old instance served
    if policy.name != "stop_the_world":
        assert len({op.worker for op in schedule.new_ops}) == 2  # both new ones ran layers


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_fifo_is_respected_by_every_policy(policy) -> None:
    inst, _ = _fleet_instance()
    schedule = simulate(policy, inst, old_order="fifo")
    report = validate_schedule(inst, schedule)
    assert report.ok, report.violations


class _Spy:
    """Wraps a policy; checks that deciding leaves the state untouched and records decisions."""

    def __init__(self, policy) -> None:
        self.policy, self.decisions = policy, []

    @property
    def name(self) -> str:
        return self.policy.name

    def _same(self, state: RelayState, call, worker: int):
        before = copy.deepcopy({k: v for k, v in vars(state).items() if k != "_suffix"})
        action = call(state, worker)
        after = {k: v for k, v in vars(state).items() if k != "_suffix"}
        assert after == before, "a policy changed the state it reads"
        self.decisions.append(action)
        return action

    def decide_new(self, state: RelayState, worker: int) -> RunLayers | None:
        return self._same(state, self.policy.decide_new, worker)

    def decide_old(self, state: RelayState, worker: int) -> RunRest | Pin | None:
        return self._same(state, self.policy.decide_old, worker)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_policies_only_read_the_state_and_runs_are_deterministic(policy) -> None:
    inst, fleet = _fleet_instance()
    spy = _Spy(policy)
    first = simulate(spy, inst, fleet=fleet)
    again = simulate(policy, inst, fleet=fleet)
    assert first.new_ops == again.new_ops and first.old_ops == again.old_ops
    assert any(d is not None for d in spy.decisions)


def test_paper_toy_zigzag_beats_best_effort_and_exact_beats_both() -> None:
    """7 layers, loading a layer takes 6 layer-computations, 7 queued requests (section 6c of
    the benchmark). ZigZag keeps batches on N instead of handing off one-layer prefixes."""
    inst = LiveScalingInstance([6.0 * (k + 1) for k in range(7)], [0.0] * 7, 1.0, 1.0, 0.0)
    best_effort = schedule_live(inst, method="best_effort", objective="max_latency")
    zigzag = schedule_live(inst, method="zigzag", objective="max_latency")
    exact = schedule_live(inst, method="exact", backend="highs", objective="max_latency")
    for schedule in (best_effort, zigzag, exact):
        assert validate_schedule(inst, schedule).ok
    assert exact.objective <= zigzag.objective < best_effort.objective
    mean = {m: schedule_live(inst, method=m).objective for m in ("best_effort", "zigzag")}
    assert mean["zigzag"] < mean["best_effort"]


def test_schedule_live_answers_the_cached_schedule_with_every_field_and_its_own_time() -> None:
    """schedule_live copies the (cached) heuristic's schedule with its own ``solve_s`` without
    the frozen ``__init__``: the copy must equal ``dataclasses.replace`` field by field, which
    holds only while Schedule has no ``__post_init__``."""
    import dataclasses

    from blitzplan.live.schedule import Schedule

    inst, _ = _fleet_instance()
    first = schedule_live(inst, method="zigzag")
    again = schedule_live(inst, method="zigzag")
    assert not hasattr(Schedule, "__post_init__")
    assert type(again) is Schedule and again is not first
    assert vars(again) == vars(dataclasses.replace(first, solve_s=again.solve_s))
    assert again.solve_s >= 0.0
