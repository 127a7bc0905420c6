"""The coordinator of a live run: the relay state, the policy, and the two processes it drives.

It holds a :class:`~blitzplan.live.state.RelayState` built from the predicted
:class:`~blitzplan.live.instance.LiveScalingInstance` and asks the policy what each idle instance
runs next, as :func:`blitzplan.live.loop.simulate` does (old instance first, then new); it sends
the decision to the instance's process and updates the state from what the processes measure:
which layers have arrived on the new instance (``loaded``), when operations end
(``last_end_s``, ``free_at_s``), hand-offs. At dispatch it books predicted times, as the
simulator would, and overwrites them with the measured ones when the operation ends.
"""

from __future__ import annotations

import math
import time

from blitzplan.errors import BlitzplanError
from blitzplan.executor.faults import Event
from blitzplan.executor.processes import WATCHDOG_FACTOR, Workers
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.policies import Policy
from blitzplan.live.schedule import NewOp, OldOp
from blitzplan.live.state import DONE, HANDED_OFF, HELD, ON_NEW, ON_OLD, WAITING, Pin, RelayState

__all__ = ["IDLE_WAKE_S", "Coordinator"]

IDLE_WAKE_S = 0.1
"""With nothing due, the coordinator still looks at the processes this often."""


class Coordinator:
    """The relay state, the policy, and the two processes it drives (one new, one old)."""

    def __init__(
        self,
        policy: Policy,
        instance: LiveScalingInstance,
        workers: Workers,
        ranks: tuple[int, int],
        old_order: str,
    ) -> None:
        self.policy, self.workers = policy, workers
        self.new_rank, self.old_rank = ranks
        self.st = RelayState(instance, instance.fleet(), old_order)
        n, units = instance.num_batches, instance.num_layers + 2
        self.arrival_s: list[float | None] = [None] * units
        self.new_job: tuple[int, bool] | None = None
        self.old_job = -1
        self.split, self.completion = [0] * n, [math.nan] * n
        self.logits: dict[int, tuple[float, ...]] = {}
        self.new_ops: list[NewOp] = []
        self.old_ops: list[OldOp] = []
        self.releases = self.st.release_order()
        self.next_release = self.finished = 0
        self.t0 = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run(self, t0: float) -> None:
        self.t0 = t0
        heard = time.monotonic()
        while self.finished < len(self.split):
            self.advance(self.now())
            self.decide()
            event = self.workers.next_event(self._wait_s())
            if event is not None:
                heard = time.monotonic()
                self.on_event(event)
            elif time.monotonic() - heard > WATCHDOG_FACTOR * self.workers.timeout_s:
                self.workers.fail_stalled([self.new_rank, self.old_rank])

    def _wait_s(self) -> float:
        if self.next_release < len(self.releases):
            due = self.st.release_s[self.releases[self.next_release]] - self.now()
            return max(0.0, min(due, IDLE_WAKE_S))
        return IDLE_WAKE_S

    def advance(self, now_s: float) -> None:
        """Releases up to ``now_s``; ``loaded`` from the measured arrivals."""
        st = self.st
        st.now_s = now_s
        self.next_release = st.release_due(self.releases, self.next_release, now_s)
        here = self.arrival_s
        loaded = 0
        while loaded < st.num_layers and here[loaded] is not None and here[loaded + 1] is not None:
            if loaded + 1 == st.num_layers and here[-1] is None:
                break
            loaded += 1
        st.loaded[0] = loaded

    def decide(self) -> None:
        """Ask the policy, old instance first (as the simulator's loop does)."""
        st = self.st
        while self.old_job < 0:
            action = self.policy.decide_old(st, 0)
            if isinstance(action, Pin):
                if st.pinned[action.batch] or st.phase[action.batch] != HELD:
                    raise BlitzplanError(f"{self.policy.name}: cannot pin {action.batch}")
                st.pinned[action.batch] = True
                continue
            if action is not None:
                self.dispatch_old(action.batch)
            break
        if self.new_job is None:
            choice = self.policy.decide_new(st, 0)
            if choice is not None:
                self.dispatch_new(choice.batch, choice.layers, choice.hand_off)

    def dispatch_new(self, batch: int, layers: int, hand_off: bool) -> None:
        st = self.st
        if st.phase[batch] == WAITING:
            st.waiting.remove(batch)
            st.holder[batch] = 0
            st.held[0].append(batch)
            st.held[0].sort(key=st.rank.__getitem__)
        elif st.phase[batch] != HELD or st.holder[batch] != 0:
            raise BlitzplanError(f"{self.policy.name}: the new instance cannot run batch {batch}")
        if not 1 <= layers <= st.num_layers - st.done[batch]:
            raise BlitzplanError(f"{self.policy.name}: cannot run {layers} more layers")
        first, clock = st.done[batch] + 1, st.now_s
        for layer in range(first, first + layers):
            usable = clock if layer <= st.loaded[0] else st.usable_s[0][layer - 1]
            start = max(clock, usable, st.last_end_s[batch])
            clock = st.last_end_s[batch] = start + st.new_layer_s[batch]
            st.done[batch] = layer
        if st.done[batch] == st.num_layers:
            st.pinned[batch] = True
        st.phase[batch], st.free_at_s[0] = ON_NEW, clock
        self.new_job = (batch, hand_off)
        self.workers.tell(self.new_rank, ("run", batch, first, layers))

    def dispatch_old(self, batch: int) -> None:
        st = self.st
        phase, k = st.phase[batch], st.done[batch]
        if phase == WAITING:
            st.waiting.remove(batch)
            start = st.now_s
        elif phase == HELD:
            st.held[st.holder[batch]].remove(batch)
            start = st.now_s + st.handoff_s[batch]
        elif phase == HANDED_OFF:
            st.handed.remove(batch)
            start = max(st.now_s, st.ready_s[batch])
        else:
            raise BlitzplanError(f"{self.policy.name}: the old instance cannot take batch {batch}")
        st.phase[batch] = ON_OLD
        st.old_free_at_s[0] = start + (st.num_layers - k) * st.old_layer_s[batch]
        self.split[batch], self.old_job = k, batch
        if k > 0:
            self.workers.tell(self.new_rank, ("send", batch, k))
        self.workers.tell(self.old_rank, ("run", batch, k + 1))

    def on_event(self, event: Event) -> None:
        if event.kind == "unit" and event.rank == self.new_rank:
            unit, at_s = event.data
            self.arrival_s[unit] = at_s
        elif event.kind == "op":
            batch, layer, start, end = event.data
            self.new_ops.append(NewOp(batch, layer, start, end, 0))
        elif event.kind == "new_done":
            self._new_done(*event.data)
        elif event.kind == "old_done":
            batch, start, end, logits = event.data
            self.old_ops.append(OldOp(batch, self.split[batch] + 1, start, end, 0))
            self._finish(batch, end, logits)
            self.st.old_free_at_s[0], self.old_job = end, -1

    def _new_done(self, batch: int, end: float, logits: tuple[float, ...] | None) -> None:
        st = self.st
        if self.new_job is None or self.new_job[0] != batch:
            raise BlitzplanError(
                f"the new instance finished batch {batch}, which it was not running"
            )
        hand_off = self.new_job[1]
        self.new_job = None
        st.last_end_s[batch] = st.free_at_s[0] = end
        if st.done[batch] == st.num_layers:
            st.held[0].remove(batch)
            self.split[batch] = st.num_layers
            self._finish(batch, end, logits)
        elif hand_off:
            st.phase[batch] = HANDED_OFF
            st.held[0].remove(batch)
            st.ready_s[batch] = end + st.handoff_s[batch]
            st.handed.append(batch)
            st.handed.sort(key=st.rank.__getitem__)
        else:
            st.phase[batch] = HELD

    def _finish(self, batch: int, end: float, logits: tuple[float, ...] | None) -> None:
        if logits is None:
            raise BlitzplanError(f"batch {batch} finished without logits")
        self.st.phase[batch] = DONE
        self.completion[batch] = end
        self.logits[batch] = logits
        self.finished += 1
