"""The coordinator of a live run: the measured driver of the relay state machine.

Like the offline loop and the simulator, it holds a :class:`~blitzplan.live.relay.RelayState`,
asks the policy what each idle instance runs next, sends it to the instance's process and feeds
the state what the processes measure (``set_loaded``, ``end_layers``, ``end_block``). Events
that arrive together are decided on together.

It asks the policy only where the loop would: when the state changed (an operation ended, a
layer became usable) or something fell due (a release, an old instance freed of earlier work).
A wake-up with nothing new only watches the processes: a time-dependent rule (ZigZag's hand-off)
asked again later in the same state would decide on the polling period, not the protocol.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from blitzplan.errors import BlitzplanError
from blitzplan.executor.runtime.failures import Event
from blitzplan.executor.runtime.pool import WATCHDOG_FACTOR, Workers
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.policies import Policy
from blitzplan.live.relay import RelayState
from blitzplan.live.schedule import NewOp, OldOp
from blitzplan.live.state import DONE, Started

IDLE_WAKE_S = 0.1
"""With nothing due, the coordinator still looks at the processes this often."""


class Coordinator:
    """The relay state, the policy, and the two processes it drives (one new, one old) through
    ``workers`` (a Workers pool, or anything with its ``timeout_s``, ``tell``, ``next_event`` and
    ``fail_stalled``)."""

    def __init__(
        self,
        policy: Policy,
        instance: LiveScalingInstance,
        workers: Workers,
        ranks: tuple[int, int],
        old_order: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy, self.workers, self.clock = policy, workers, clock
        self.new_rank, self.old_rank = ranks
        self.relay = RelayState.from_instance(instance, old_order=old_order, record_ops=False)
        self.arrival_s: list[float | None] = [None] * (instance.num_layers + 2)
        self.logits: dict[int, tuple[float, ...]] = {}
        self.new_ops: list[NewOp] = []
        self.old_ops: list[OldOp] = []
        self.t0 = 0.0
        self._changed = True  # the state changed (or is new) since the policy was last asked
        self._due_s: float | None = None  # the next thing due, as of the last decision

    @property
    def split(self) -> list[int]:
        return self.relay.split

    @property
    def completion(self) -> list[float]:
        """Measured completion per batch (nan until it finished)."""
        return [
            c if p == DONE else math.nan
            for c, p in zip(self.relay.completion_s, self.relay.phase, strict=True)
        ]

    def now(self) -> float:
        return self.clock() - self.t0

    def run(self, t0: float) -> None:
        """Until every batch is done: apply everything heard, then advance and decide, then
        wait for the next event or the next thing due."""
        self.t0 = t0
        heard = self.clock()
        while True:
            event = self.workers.next_event(0.0)
            while event is not None:
                heard = self.clock()
                self.on_event(event)
                event = self.workers.next_event(0.0)
            if self.relay.finished == self.relay.num_batches:
                return
            now = self.now()
            self.advance(now)
            if self._changed or (self._due_s is not None and now >= self._due_s):
                self._changed = False
                for op in self.relay.decide(self.policy):
                    self.dispatch(op)
                self._due_s = self.relay.next_due_s()
            event = self.workers.next_event(self._wait_s())
            if event is not None:
                heard = self.clock()
                self.on_event(event)
            elif self.clock() - heard > WATCHDOG_FACTOR * self.workers.timeout_s:
                self.workers.fail_stalled([self.new_rank, self.old_rank])

    def _wait_s(self) -> float:
        due = self.relay.next_due_s()
        if due is None:
            return IDLE_WAKE_S
        return max(0.0, min(due - self.now(), IDLE_WAKE_S))

    def advance(self, now_s: float) -> None:
        """Releases up to ``now_s``; the layers usable on the new instance, as measured (a layer
        needs every unit before it, the last layer also the head)."""
        relay = self.relay
        relay.release_due(now_s)
        here, loaded = self.arrival_s, 0
        while loaded < relay.num_layers and None not in (here[loaded], here[loaded + 1]):
            if loaded + 1 == relay.num_layers and here[-1] is None:
                break
            loaded += 1
        if loaded != relay.loaded[0]:
            relay.set_loaded(0, loaded)
            self._changed = True

    def dispatch(self, op: Started) -> None:
        """Send a started operation to its process."""
        if op.on_new:
            self.workers.tell(self.new_rank, ("run", op.batch, op.first_layer, op.layers))
            return
        if op.first_layer > 1:
            self.workers.tell(self.new_rank, ("send", op.batch, op.first_layer - 1))
        self.workers.tell(self.old_rank, ("run", op.batch, op.first_layer))

    def on_event(self, event: Event) -> None:
        if event.kind == "unit" and event.rank == self.new_rank:
            unit, at_s = event.data
            self.arrival_s[unit] = at_s
        elif event.kind == "op":
            batch, layer, start, end = event.data
            self.new_ops.append(NewOp(batch, layer, start, end, 0))
        elif event.kind == "new_done":
            batch, end, logits = event.data
            running = self.relay.running[0]
            if running is None or running[0] != batch:
                raise BlitzplanError(
                    f"the new instance finished batch {batch}, which it was not running"
                )
            self._changed = True
            if self.relay.end_layers(0, at_s=end) == DONE:
                self._logits(batch, logits)
        elif event.kind == "old_done":
            batch, start, end, logits = event.data
            self.old_ops.append(OldOp(batch, self.relay.split[batch] + 1, start, end, 0))
            self._changed = True
            self.relay.end_block(0, at_s=end)
            self._logits(batch, logits)

    def _logits(self, batch: int, logits: tuple[float, ...] | None) -> None:
        if logits is None:
            raise BlitzplanError(f"batch {batch} finished without logits")
        self.logits[batch] = logits
