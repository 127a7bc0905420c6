"""The one small event loop that drives an online policy over a relay queue.

Events are releases, layer arrivals and the ends of operations. At each event time the loop
applies what finished, then asks every idle old instance and then every idle new instance (in
index order, so runs are deterministic) for a decision, and applies it. Several new and several
old instances may share the queue (a :class:`~blitzplan.live.instance.Fleet`).
"""

from __future__ import annotations

import heapq
import time

from blitzplan.errors import BlitzplanError, InvalidInputError
from blitzplan.live.instance import Fleet, LiveScalingInstance
from blitzplan.live.policies import Policy
from blitzplan.live.schedule import (
    NewOp,
    OldOp,
    Schedule,
    batch_lower_bounds,
    check_objective,
    evaluate_objective,
    relative_gap,
)
from blitzplan.live.state import (
    DONE,
    HANDED_OFF,
    HELD,
    ON_NEW,
    ON_OLD,
    WAITING,
    Pin,
    RelayState,
    RunLayers,
)
from blitzplan.solvers.backends import SolveStatus

__all__ = ["OLD_ORDERS", "simulate"]

OLD_ORDERS = ("free", "fifo")
"""How O may order its blocks: any order (default), or release order (the paper's assumption)."""


class _Loop:
    """One run: the state, the operations so far, and the pending wake-up times."""

    def __init__(self, policy: Policy, state: RelayState) -> None:
        self.policy, self.state = policy, state
        fleet = state.fleet
        self.new_ops: list[NewOp] = []
        self.old_ops: list[OldOp] = []
        self.split = [0] * len(state.phase)
        self.completion = [0.0] * len(state.phase)
        self.new_pending: list[tuple[int, bool] | None] = [None] * fleet.num_new
        self.old_pending: list[int] = [-1] * fleet.num_old
        self.wakeups: list[float] = []
        self.releases = state.release_order()
        self.next_release = 0
        self.finished = 0
        for free_at in state.old_free_at_s:
            self.wake(free_at)  # an old instance busy with earlier work becomes free

    def wake(self, at_s: float) -> None:
        heapq.heappush(self.wakeups, at_s)

    def advance(self, now_s: float) -> None:
        """Apply releases, finished operations and layer arrivals up to ``now_s``."""
        st = self.state
        st.now_s = now_s
        self.next_release = st.release_due(self.releases, self.next_release, now_s)
        for w, pending in enumerate(self.new_pending):
            if pending is not None and st.free_at_s[w] <= now_s:
                self._end_new(w, *pending)
        for w, batch in enumerate(self.old_pending):
            if batch >= 0 and st.old_free_at_s[w] <= now_s:
                st.phase[batch] = DONE
                self.old_pending[w] = -1
                self.finished += 1
        for w, usable in enumerate(st.usable_s):
            while st.loaded[w] < len(usable) and usable[st.loaded[w]] <= now_s:
                st.loaded[w] += 1

    def _end_new(self, w: int, batch: int, hand_off: bool) -> None:
        st = self.state
        self.new_pending[w] = None
        if st.done[batch] == st.num_layers:
            st.phase[batch] = DONE
            st.held[w].remove(batch)
            self.split[batch] = st.num_layers
            self.completion[batch] = st.last_end_s[batch]
            self.finished += 1
        elif hand_off:
            st.phase[batch] = HANDED_OFF
            st.held[w].remove(batch)
            st.ready_s[batch] = st.last_end_s[batch] + st.handoff_s[batch]
            st.handed.append(batch)
            st.handed.sort(key=st.rank.__getitem__)
        else:
            st.phase[batch] = HELD

    def run_layers(self, w: int, action: RunLayers) -> None:
        st, batch = self.state, action.batch
        if st.phase[batch] == WAITING:
            st.waiting.remove(batch)
            st.holder[batch] = w
            st.held[w].append(batch)
            st.held[w].sort(key=st.rank.__getitem__)
        elif st.phase[batch] != HELD or st.holder[batch] != w:
            raise BlitzplanError(f"{self.policy.name}: new instance {w} cannot run batch {batch}")
        if not 1 <= action.layers <= st.num_layers - st.done[batch]:
            raise BlitzplanError(f"{self.policy.name}: cannot run {action.layers} more layers")
        clock = st.now_s
        for _ in range(action.layers):
            layer = st.done[batch] + 1
            start = max(clock, st.usable_s[w][layer - 1], st.last_end_s[batch])
            clock = st.last_end_s[batch] = start + st.new_layer_s[batch]
            st.done[batch] = layer
            self.new_ops.append(NewOp(batch, layer, start, clock, w))
        if st.done[batch] == st.num_layers:
            st.pinned[batch] = True
        st.phase[batch] = ON_NEW
        st.free_at_s[w] = clock
        self.new_pending[w] = (batch, action.hand_off)
        self.wake(clock)

    def run_rest(self, w: int, batch: int) -> None:
        st = self.state
        phase, k = st.phase[batch], st.done[batch]
        if phase == WAITING:
            st.waiting.remove(batch)
            start = st.now_s
        elif phase == HELD:
            st.held[st.holder[batch]].remove(batch)
            start = st.now_s + st.handoff_s[batch]  # the activation moves when O pulls it
        elif phase == HANDED_OFF:
            st.handed.remove(batch)
            start = max(st.now_s, st.ready_s[batch])
        else:
            raise BlitzplanError(f"{self.policy.name}: old instance {w} cannot take batch {batch}")
        end = start + (st.num_layers - k) * st.old_layer_s[batch]
        st.phase[batch] = ON_OLD
        st.old_free_at_s[w] = end
        self.split[batch], self.completion[batch] = k, end
        self.old_ops.append(OldOp(batch, k + 1, start, end, w))
        self.old_pending[w] = batch
        self.wake(end)

    def decide(self) -> None:
        st, now = self.state, self.state.now_s
        for w in range(len(st.old_free_at_s)):
            while self.old_pending[w] < 0 and st.old_free_at_s[w] <= now:
                action = self.policy.decide_old(st, w)
                if isinstance(action, Pin):
                    if st.pinned[action.batch] or st.phase[action.batch] != HELD:
                        raise BlitzplanError(f"{self.policy.name}: cannot pin {action.batch}")
                    st.pinned[action.batch] = True
                    continue
                if action is not None:
                    self.run_rest(w, action.batch)
                break
        for w in range(len(st.free_at_s)):
            if self.new_pending[w] is None and st.free_at_s[w] <= now:
                choice = self.policy.decide_new(st, w)
                if choice is not None:
                    self.run_layers(w, choice)

    def next_time(self, now_s: float) -> float | None:
        st = self.state
        if self.next_release < len(self.releases):
            self.wake(st.release_s[self.releases[self.next_release]])
        for w, usable in enumerate(st.usable_s):
            if st.loaded[w] < len(usable):
                self.wake(usable[st.loaded[w]])
        while self.wakeups and self.wakeups[0] <= now_s:
            heapq.heappop(self.wakeups)
        return self.wakeups[0] if self.wakeups else None

    def run(self) -> None:
        now: float | None = 0.0
        while now is not None:
            self.advance(now)
            if self.finished == len(self.split):
                return
            self.decide()
            now = self.next_time(now)
        raise BlitzplanError(f"{self.policy.name} stopped with batches unfinished")


def simulate(
    policy: Policy,
    instance: LiveScalingInstance,
    *,
    fleet: Fleet | None = None,
    objective: str = "mean_latency",
    old_order: str = "free",
) -> Schedule:
    """Run ``policy`` over the instance's queue; a FEASIBLE Schedule with a cheap lower bound.

    ``fleet`` puts several new and old instances on the same relay queue (operations carry their
    instance index in ``worker``). The bound is every batch alone on the best pair of instances.
    """
    if old_order not in OLD_ORDERS:
        raise InvalidInputError(
            f"old_order must be one of {', '.join(OLD_ORDERS)}, got {old_order!r}"
        )
    check_objective(objective, instance)
    fleet = instance.fleet() if fleet is None else fleet
    fleet.check_matches(instance)
    started = time.perf_counter()
    loop = _Loop(policy, RelayState(instance, fleet, old_order))
    loop.run()
    value = evaluate_objective(instance, loop.completion, objective)
    bound = evaluate_objective(instance, batch_lower_bounds(instance, fleet=fleet), objective)
    return Schedule(
        split=tuple(loop.split),
        new_ops=tuple(loop.new_ops),
        old_ops=tuple(loop.old_ops),
        completion_s=tuple(loop.completion),
        objective=value,
        status=SolveStatus.FEASIBLE,
        solve_s=time.perf_counter() - started,
        method=policy.name,
        objective_name=objective,
        old_order=old_order,
        bound=bound,
        gap=relative_gap(value, bound),
    )
