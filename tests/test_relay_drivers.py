"""One relay state machine, three drivers: the offline loop, the simulator's prefill tier and the
executor's coordinator, run on the same inputs, make the same decisions at the same times.

The coordinator runs against processes that do exactly what the model says on a simulated clock
(so its measured times are the booked ones); one run on real CPU processes checks the same
coordinator against the certificate of DESIGN.md section 4.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from blitzplan.executor.runtime.failures import Event
from blitzplan.executor.serving.serve import Coordinator
from blitzplan.live import Fleet, LiveScalingInstance, NewOp, OldOp, Schedule, simulate
from blitzplan.live.policies import POLICIES, Policy
from blitzplan.sim.events import Arrival, EventQueue, RelayStep
from blitzplan.sim.instances import SimInstance, SimRequest
from blitzplan.sim.prefill import PrefillTier

NEW_RANK, OLD_RANK = 0, 1


@st.composite
def instances(draw: st.DrawFn, *, fleets: bool = True) -> tuple[LiveScalingInstance, Fleet]:
    layers = draw(st.integers(1, 6))
    batches = draw(st.integers(1, 7))
    times = st.floats(0.0, 3.0, allow_nan=False).map(lambda t: round(t, 2))
    layer_s = st.floats(0.05, 1.0).map(lambda t: round(t, 2))
    ready = sorted(draw(st.lists(times, min_size=layers, max_size=layers)))
    inst = LiveScalingInstance(
        ready,
        draw(st.lists(times, min_size=batches, max_size=batches)),
        (per_layer := draw(st.lists(layer_s, min_size=batches, max_size=batches))),
        per_layer,  # the simulator's instances are the same GPUs: equal layer times
        draw(st.lists(st.sampled_from([0.0, 0.1, 0.5]), min_size=batches, max_size=batches)),
        old_free_at_s=draw(times),
        head_ready_s=ready[-1] + draw(st.sampled_from([0.0, 0.3])),
    )
    if not fleets or not draw(st.booleans()):
        return inst, inst.fleet()
    other = sorted(draw(st.lists(times, min_size=layers, max_size=layers)))
    olds = draw(st.lists(times, min_size=1, max_size=3))
    return inst, Fleet(new_layer_ready_s=[ready, other], old_free_at_s=olds)


# --- the simulator's driver ------------------------------------------------------------------


def _worker(name: str) -> SimInstance:
    return SimInstance(name, "prefill", (), "h0", 0.0, 0.0, kv_capacity=math.inf)


def lone_tier(
    num_layers: int, policy: Policy, **options: Any
) -> tuple[EventQueue, set[float], PrefillTier]:
    """A prefill tier of ``num_layers`` layers of 1 s each, with free handoffs, outside a
    simulator: its queue, the instants it booked a step at (a late RelayStep, one an instant, as
    inside :class:`~blitzplan.sim.engine.Simulator`; the caller discards an instant it ran) and the
    tier. ``options``: PrefillTier's token_budget, kv_bytes_per_token, ..."""
    queue, wakes = EventQueue(), set()

    def wake(at_s: float) -> None:
        if at_s not in wakes:
            wakes.add(at_s)
            queue.push(at_s, RelayStep(), late=True)

    tier = PrefillTier(
        num_layers,
        lambda tokens, requests: 1.0,
        policy=policy,
        handoff_bytes_per_s=1.0,
        handoff_latency_s=0.0,
        activation_bytes_per_token=0.0,
        wake=wake,
        **options,
    )
    return queue, wakes, tier


def run_prefill_tier(
    policy: Policy, inst: LiveScalingInstance, fleet: Fleet
) -> tuple[list[int], list[float], PrefillTier]:
    """The simulator's prefill tier on ``inst``: batches arrive as events at their release times,
    the tier steps late in each instant, as inside :class:`~blitzplan.sim.engine.Simulator`."""
    queue, wakes, tier = lone_tier(
        inst.num_layers,
        policy,
        token_budget=1,
        kv_bytes_per_token=0.0,
        end_of_loading=False,  # offline, a loaded new instance stays one
    )
    tier.relay.record_ops = True
    for w in range(fleet.num_new):
        usable = fleet.usable_s(w)
        tier.join_new(_worker(f"new{w}"), (usable[0], *usable[:-1], usable[-1], usable[-1]))
    for w, free_at in enumerate(fleet.old_free_at_s):
        tier.join_old(_worker(f"old{w}"), free_at)
    for position, batch in enumerate(inst.fifo_order):  # request ids are release ranks
        queue.push(inst.release_s[batch], Arrival(SimRequest(position, 0.0, 1, 1)))
    split, completion = [-1] * inst.num_batches, [math.nan] * inst.num_batches
    while queue:
        now, event = queue.pop()
        if isinstance(event, Arrival):
            b = inst.fifo_order[event.request.id]
            tier.submit_batch(
                [event.request], now, inst.new_layer_s[b], inst.old_layer_s[b], inst.handoff_s[b]
            )
            continue
        wakes.discard(now)
        for done in tier.step(now):
            for request in done.requests:
                b = inst.fifo_order[request.id]
                split[b], completion[b] = done.split, now
    return split, completion, tier


# --- the executor's driver -------------------------------------------------------------------


class ModelProcesses:
    """The new and old instance's processes, doing exactly what the model says, on a simulated
    clock; the clock jumps to the next event (or the end of a wait)."""

    timeout_s = 10.0

    def __init__(self, inst: LiveScalingInstance) -> None:
        self.inst, self.now = inst, 0.0
        self.events: list[tuple[float, int, Event]] = []
        self.last_end = list(inst.release_s)
        self.coordinator: Coordinator | None = None
        units = (inst.embed_ready_s, *inst.layer_ready_s, inst.head_ready_s)
        for unit, at_s in enumerate(units):
            self._emit(at_s, Event(NEW_RANK, "unit", (unit, at_s)))

    def _emit(self, at_s: float, event: Event) -> None:
        heapq.heappush(self.events, (at_s, len(self.events), event))

    def clock(self) -> float:
        return self.now

    def tell(self, rank: int, message: Any) -> None:
        if message[0] == "run" and rank == NEW_RANK:
            self._run_new(*message[1:])
        elif message[0] == "run":
            self._run_old(message[1])

    def _run_new(self, batch: int, first: int, count: int) -> None:
        clock, inst, ops = self.now, self.inst, []
        for layer in range(first, first + count):
            start = max(clock, inst.usable_s[layer - 1], self.last_end[batch])
            clock = self.last_end[batch] = start + inst.new_layer_s[batch]
            ops.append((layer, start, clock))
        logits = (0.0,) if first + count - 1 == inst.num_layers else None
        kept = b"" if logits is None else None
        self._emit(clock, Event(NEW_RANK, "new_done", (batch, ops, logits, kept)))

    def _run_old(self, batch: int) -> None:
        assert self.coordinator is not None
        relay = self.coordinator.relay
        end = relay.completion_s[batch]  # the block as booked: start + remaining layers
        start = end - (relay.num_layers - relay.split[batch]) * relay.old_layer_s[batch]
        self._emit(end, Event(OLD_RANK, "old_done", (batch, start, end, (0.0,))))

    def next_event(self, timeout_s: float) -> Event | None:
        if self.events and self.events[0][0] <= self.now + timeout_s:
            at_s, _, event = heapq.heappop(self.events)
            self.now = max(self.now, at_s)
            return event
        assert self.coordinator is not None
        if timeout_s <= 0:
            return None  # a poll: no time passes (else a due time 1 ulp ahead would be reached)
        due = self.coordinator.relay.next_due_s()  # wake exactly at a release, not 1 ulp early
        target = self.now + timeout_s
        self.now = max(self.now, due) if due is not None and due <= target + 1e-9 else target
        return None

    def fail_stalled(self, ranks: list[int]) -> None:
        raise AssertionError(f"ranks {ranks} stalled")


def run_coordinator(policy: Policy, inst: LiveScalingInstance) -> Coordinator:
    processes = ModelProcesses(inst)
    coordinator = Coordinator(policy, inst, (NEW_RANK, OLD_RANK), clock=processes.clock)
    processes.coordinator = coordinator
    coordinator.run(processes, 0.0)
    return coordinator


# --- the comparisons -------------------------------------------------------------------------


def _same_schedule(schedule: Schedule, split: list[int], completion: list[float]) -> None:
    assert tuple(split) == schedule.split
    assert tuple(completion) == pytest.approx(schedule.completion_s, abs=1e-9)


# at 2.5 the old instance frees, the new one ends batch 2's layer 1 and layer 5 arrives: O
# declines batch 2 (a tie), then N starts batch 1's last layer; the coordinator asked the policy
# again at its next idle wake-up (2.6) and the hand-off rule, now true, moved batch 2 to O
WAKE = LiveScalingInstance(
    (0, 0, 0, 0, 2.5), (0, 0, 0), (0.5,) * 3, (0.5,) * 3, (0, 0, 0), old_free_at_s=0.0
)


@given(case=instances())
@example(case=(WAKE, WAKE.fleet()))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_loop_and_the_simulator_drive_the_same_machine(
    name: str, case: tuple[LiveScalingInstance, Fleet]
) -> None:
    """Property: on any instance and fleet, the simulator's prefill tier makes exactly the
    offline loop's decisions: same splits, completions and operations, in the same order."""
    inst, fleet = case
    schedule = simulate(POLICIES[name](), inst, fleet=fleet)
    split, completion, tier = run_prefill_tier(POLICIES[name](), inst, fleet)
    _same_schedule(schedule, split, completion)
    ranks = inst.fifo_order
    rebatched = (  # the tier numbers batches in release order
        [NewOp(ranks[op.batch], *op[1:]) for op in tier.relay.new_ops],
        [OldOp(ranks[op.batch], *op[1:]) for op in tier.relay.old_ops],
    )
    assert rebatched == (list(schedule.new_ops), list(schedule.old_ops))


# the new instance frees 1 ulp before the old one (0.6 * 3 < 1.8): a zero-timeout poll that moved
# the harness's clock to the old one's due time gave the FIFO head to the wrong instance
TIE = LiveScalingInstance(
    (0, 0, 0), (1.0, 0, 0), (1.0, 0.6, 1.0), (1.0, 0.6, 1.0), (0, 0, 0), old_free_at_s=1.8
)


@given(case=instances(fleets=False))
@example(case=(TIE, TIE.fleet()))
@example(case=(WAKE, WAKE.fleet()))
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_loop_and_the_coordinator_drive_the_same_machine(
    name: str, case: tuple[LiveScalingInstance, Fleet]
) -> None:
    """Property: the executor's coordinator, fed measurements equal to the model's times, makes
    the loop's decisions: same splits, completions and (measured) operations."""
    inst, _ = case
    schedule = simulate(POLICIES[name](), inst)
    coordinator = run_coordinator(POLICIES[name](), inst)
    _same_schedule(schedule, coordinator.relay.split, coordinator.completion)
    for measured, booked in ((coordinator.new_ops, schedule.new_ops),):
        got, want = sorted(measured), sorted(booked)
        assert [(op.batch, op.layer) for op in got] == [(op.batch, op.layer) for op in want]
        assert [t for op in got for t in op[2:4]] == pytest.approx(
            [t for op in want for t in op[2:4]]
        )
    old = sorted(coordinator.old_ops)
    expected = sorted(schedule.old_ops)
    assert [(op.batch, op.first_layer) for op in old] == [
        (op.batch, op.first_layer) for op in expected
    ]
    assert [op.end_s for op in old] == pytest.approx([op.end_s for op in expected])
