"""The relay state machine: every transition of the live-execution state.

:class:`RelayState` is the :class:`~blitzplan.live.state.RelayView` policies read, plus every
change to it: a batch's release, the start and end of layer runs on a new instance, the start
and end of a remaining-layers block on an old instance, pins, layer arrivals, and (online)
instances joining, leaving or failing and batches restarting.
:meth:`RelayState.decide` asks a policy for every idle instance and applies what it says.

Three drivers run it and differ only in where time comes from: the offline event loop
(:mod:`blitzplan.live.loop`, booked times), the cluster simulator (:mod:`blitzplan.sim.prefill`,
booked times and requests arriving online) and the executor's coordinator
(:mod:`blitzplan.executor.serving.serve`, measured times). A driver with booked times calls
:meth:`~RelayState.advance`; a driver that measures calls :meth:`~RelayState.release_due`,
:meth:`~RelayState.set_loaded`, :meth:`~RelayState.end_layers` and
:meth:`~RelayState.end_block` with what it measured.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from blitzplan.errors import BlitzplanError
from blitzplan.live.instance import Fleet, LiveScalingInstance
from blitzplan.live.schedule import NewOp, OldOp
from blitzplan.live.state import (
    DONE,
    HANDED_OFF,
    HELD,
    ON_NEW,
    ON_OLD,
    UNRELEASED,
    WAITING,
    Pin,
    RelayView,
    RunLayers,
    Started,
)

if TYPE_CHECKING:
    from blitzplan.live.policies import Policy

__all__ = ["RelayState"]


class RelayState(RelayView):
    """The relay state and its transitions (see the module docstring)."""

    @classmethod
    def from_instance(
        cls,
        instance: LiveScalingInstance,
        fleet: Fleet | None = None,
        old_order: str = "free",
        *,
        record_ops: bool = True,
    ) -> RelayState:
        """The state at time 0 of a live-scaling problem on ``fleet`` (default: its one pair)."""
        fleet = instance.fleet() if fleet is None else fleet
        state = cls(instance.num_layers, old_order=old_order, record_ops=record_ops)
        rank = [0] * instance.num_batches
        for position, batch in enumerate(instance.fifo_order):
            rank[batch] = position
        for i in range(instance.num_batches):
            state.add_batch(
                instance.release_s[i],
                instance.new_layer_s[i],
                instance.old_layer_s[i],
                instance.handoff_s[i],
                rank=rank[i],
            )
        for w in range(fleet.num_new):
            state.add_new(fleet.usable_s(w))
        for free_at in fleet.old_free_at_s:
            state.add_old(free_at)
        return state

    # --- what there is ------------------------------------------------------------------------

    def add_batch(
        self,
        release_s: float,
        new_layer_s: float,
        old_layer_s: float,
        handoff_s: float,
        *,
        tokens: int = 0,
        rank: int | None = None,
    ) -> int:
        """A batch released at ``release_s``; its index. Ranks default to the order of adding
        (add batches in release order); ties in release time break by rank."""
        batch = len(self.phase)
        for values, value in (
            (self.release_s, release_s),
            (self.new_layer_s, new_layer_s),
            (self.old_layer_s, old_layer_s),
            (self.handoff_s, handoff_s),
            (self.last_end_s, release_s),
        ):
            values.append(value)
        self.tokens.append(tokens)
        self.rank.append(batch if rank is None else rank)
        self.phase.append(UNRELEASED)
        self.done.append(0)
        self.holder.append(-1)
        self.ready_s.append(0.0)
        self.pinned.append(False)
        self.split.append(0)
        self.completion_s.append(math.nan)
        self._fifo_pos.append(-1)
        heapq.heappush(self._releases, (release_s, self.rank[batch], batch))
        return batch

    def grow_batch(
        self, batch: int, new_layer_s: float, old_layer_s: float, handoff_s: float, tokens: int
    ) -> None:
        """A batch that has not started takes more requests: its new per-layer times."""
        if self.phase[batch] not in (UNRELEASED, WAITING):
            raise BlitzplanError(f"batch {batch} has started; it cannot grow")
        self.new_layer_s[batch], self.old_layer_s[batch] = new_layer_s, old_layer_s
        self.handoff_s[batch], self.tokens[batch] = handoff_s, tokens

    def add_new(self, usable_s: Sequence[float], *, kv_capacity_tokens: float = math.inf) -> int:
        """A new instance whose layer ``l`` may start from ``usable_s[l - 1]``; its index."""
        if len(usable_s) != self.num_layers:
            raise BlitzplanError(
                f"usable_s gives {len(usable_s)} layers, the relay has {self.num_layers}"
            )
        self.usable_s.append(tuple(usable_s))
        self.loaded.append(0)
        self.free_at_s.append(0.0)
        self.held.append([])
        self.running.append(None)
        self.kv_capacity_tokens.append(kv_capacity_tokens)
        self.kv_held_tokens.append(0)
        self.new_active.append(True)
        self.admitting.append(True)
        return len(self.usable_s) - 1

    def retime_new(self, worker: int, usable_s: Sequence[float]) -> None:
        """New layer times for ``worker`` (its load was replanned); layers it has keep theirs."""
        have = self.loaded[worker]
        self.usable_s[worker] = (*self.usable_s[worker][:have], *tuple(usable_s)[have:])
        for key in [k for k in self._suffix if k[0] == worker]:
            del self._suffix[key]

    def add_old(self, free_at_s: float | None = None) -> int:
        """An old instance (the whole model), idle from ``free_at_s`` (default now)."""
        self.old_free_at_s.append(self.now_s if free_at_s is None else free_at_s)
        self.old_running.append(-1)
        self.old_active.append(True)
        return len(self.old_free_at_s) - 1

    def close_admission(self, worker: int) -> None:
        """``worker`` takes no new batch (it finishes those it holds: the paper's refractory
        phase at the end of loading)."""
        self.admitting[worker] = False

    def retire_new(self, worker: int) -> None:
        """``worker`` leaves the relay (it holds nothing)."""
        if self.held[worker] or self.running[worker] is not None:
            raise BlitzplanError(f"new instance {worker} still holds batches")
        self.new_active[worker] = False

    def retire_old(self, worker: int) -> None:
        """``worker`` takes no more blocks (the one it runs still ends)."""
        self.old_active[worker] = False

    # --- time passing -------------------------------------------------------------------------

    def advance(self, now_s: float) -> list[int]:
        """Everything due by ``now_s`` with booked times: releases, ends of operations, layer
        arrivals. Returns the batches that finished, in order."""
        self.release_due(now_s)
        finished = []
        for w, running in enumerate(self.running):
            if running is None or self.free_at_s[w] > now_s:
                continue
            if self.end_layers(w) == DONE:
                finished.append(running[0])
        for w, batch in enumerate(self.old_running):
            if batch >= 0 and self.old_free_at_s[w] <= now_s:
                finished.append(self.end_block(w))
        for w, usable in enumerate(self.usable_s):
            while self.loaded[w] < len(usable) and usable[self.loaded[w]] <= now_s:
                self.loaded[w] += 1
        return finished

    def release_due(self, now_s: float) -> None:
        """The clock moves to ``now_s``; batches released by then join the queue."""
        self.now_s = now_s
        while self._releases and self._releases[0][0] <= now_s:
            _, _, batch = heapq.heappop(self._releases)
            if self.phase[batch] == UNRELEASED:
                self._enqueue(batch)
                self._fifo_pos[batch] = len(self.fifo_order)
                self.fifo_order.append(batch)

    def set_loaded(self, worker: int, layers: int) -> None:
        """A driver that measures arrivals: ``layers`` layers are usable on ``worker``."""
        self.loaded[worker] = layers

    # --- decisions ----------------------------------------------------------------------------

    def decide(self, policy: Policy) -> list[Started]:
        """Ask ``policy`` what every idle old instance and then every idle new instance (in
        index order) runs now, and start it."""
        started = []
        for w in range(len(self.old_free_at_s)):
            while self.idle_old(w):
                action = policy.decide_old(self, w)
                if isinstance(action, Pin):
                    self.pin(action.batch, policy.name)
                    continue
                if action is not None:
                    started.append(self.take(w, action.batch, policy.name))
                break
        for w in range(len(self.free_at_s)):
            if self.idle_new(w):
                choice = policy.decide_new(self, w)
                if choice is not None:
                    started.append(self.start_layers(w, choice, policy.name))
        return started

    def pin(self, batch: int, who: str = "driver") -> None:
        if self.pinned[batch] or self.phase[batch] != HELD:
            raise BlitzplanError(f"{who}: cannot pin {batch}")
        self.pinned[batch] = True

    def start_layers(self, worker: int, action: RunLayers, who: str = "driver") -> Started:
        """New instance ``worker`` runs ``action``: each layer once it is usable (now, if loaded)
        and the previous one ended."""
        batch = action.batch
        if self.phase[batch] == WAITING:
            self.waiting.remove(batch)
            self.holder[batch] = worker
            self._hold(worker, batch)
        elif self.phase[batch] != HELD or self.holder[batch] != worker:
            raise BlitzplanError(f"{who}: new instance {worker} cannot run batch {batch}")
        if not 1 <= action.layers <= self.num_layers - self.done[batch]:
            raise BlitzplanError(f"{who}: cannot run {action.layers} more layers")
        first, clock = self.done[batch] + 1, self.now_s
        start_s = math.inf
        for layer in range(first, first + action.layers):
            usable = clock if layer <= self.loaded[worker] else self.usable_s[worker][layer - 1]
            start = max(clock, usable, self.last_end_s[batch])
            clock = self.last_end_s[batch] = start + self.new_layer_s[batch]
            start_s = min(start_s, start)
            if self.record_ops:
                self.new_ops.append(NewOp(batch, layer, start, clock, worker))
        self.done[batch] = first + action.layers - 1
        if self.done[batch] == self.num_layers:
            self.pinned[batch] = True
        self.phase[batch] = ON_NEW
        self.free_at_s[worker] = clock
        self.running[worker] = (batch, action.hand_off)
        return Started(True, worker, batch, first, action.layers, start_s, clock, action.hand_off)

    def end_layers(self, worker: int, at_s: float | None = None) -> int:
        """The run on ``worker`` ended (at ``at_s`` when measured); the batch's new phase."""
        running = self.running[worker]
        if running is None:
            raise BlitzplanError(f"new instance {worker} ended a run it was not running")
        batch, hand_off = running
        self.running[worker] = None
        if at_s is not None:
            self.last_end_s[batch] = self.free_at_s[worker] = at_s
        if self.done[batch] == self.num_layers:
            self._unhold(worker, batch)
            self.split[batch] = self.num_layers
            self._finish(batch, self.last_end_s[batch])
        elif hand_off:
            self._unhold(worker, batch)
            self.phase[batch] = HANDED_OFF
            self.ready_s[batch] = self.last_end_s[batch] + self.handoff_s[batch]
            self.handed.append(batch)
            self.handed.sort(key=self.rank.__getitem__)
        else:
            self.phase[batch] = HELD
        return self.phase[batch]

    def take(self, worker: int, batch: int, who: str = "driver") -> Started:
        """Old instance ``worker`` runs every remaining layer of ``batch`` as one block."""
        phase, k = self.phase[batch], self.done[batch]
        if phase == WAITING:
            self.waiting.remove(batch)
            start = self.now_s
        elif phase == HELD:
            self._unhold(self.holder[batch], batch)
            start = self.now_s + self.handoff_s[batch]  # the activation moves when O pulls it
        elif phase == HANDED_OFF:
            self.handed.remove(batch)
            start = max(self.now_s, self.ready_s[batch])
        else:
            raise BlitzplanError(f"{who}: old instance {worker} cannot take batch {batch}")
        end = start + (self.num_layers - k) * self.old_layer_s[batch]
        self.phase[batch] = ON_OLD
        self.old_free_at_s[worker] = end
        self.old_running[worker] = batch
        self.split[batch], self.completion_s[batch] = k, end
        if self.record_ops:
            self.old_ops.append(OldOp(batch, k + 1, start, end, worker))
        pulled = phase == HELD
        return Started(False, worker, batch, k + 1, self.num_layers - k, start, end, False, pulled)

    def end_block(self, worker: int, at_s: float | None = None) -> int:
        """The block on old ``worker`` ended (at ``at_s`` when measured); the batch."""
        batch = self.old_running[worker]
        if batch < 0:
            raise BlitzplanError(f"old instance {worker} ended a block it was not running")
        self.old_running[worker] = -1
        if at_s is not None:
            self.old_free_at_s[worker] = at_s
        self._finish(batch, self.completion_s[batch] if at_s is None else at_s)
        return batch

    # --- failures -----------------------------------------------------------------------------

    def restart(self, batch: int) -> None:
        """``batch`` starts over from the queue (what it ran is lost); it keeps its rank."""
        phase = self.phase[batch]
        if phase in (UNRELEASED, WAITING, DONE):
            raise BlitzplanError(f"batch {batch} is not in progress; it cannot restart")
        worker = self.holder[batch]
        if phase in (HELD, ON_NEW):
            running = self.running[worker]
            if running is not None and running[0] == batch:
                self.running[worker] = None
                self.free_at_s[worker] = self.now_s
            self._unhold(worker, batch)
        elif phase == HANDED_OFF:
            self.handed.remove(batch)
        else:  # ON_OLD: the block is abandoned
            for w, taken in enumerate(self.old_running):
                if taken == batch:
                    self.old_running[w] = -1
                    self.old_free_at_s[w] = self.now_s
        self.done[batch], self.holder[batch], self.pinned[batch] = 0, -1, False
        self.last_end_s[batch] = self.now_s
        self.split[batch], self.completion_s[batch] = 0, math.nan
        self._enqueue(batch)
        self._fifo_next = min(self._fifo_next, self._fifo_pos[batch])

    def fail_new(self, worker: int) -> list[int]:
        """New instance ``worker`` is gone: every unfinished batch whose first layers (and their
        KV cache) it holds restarts. Returns them."""
        lost = [
            b
            for b in range(self.num_batches)
            if self.holder[b] == worker and self.done[b] > 0 and self.phase[b] != DONE
        ]
        for batch in lost:
            self.restart(batch)
        self.new_active[worker] = False
        return lost

    def fail_old(self, worker: int) -> list[int]:
        """Old instance ``worker`` is gone: the block it ran restarts. Returns it."""
        batch = self.old_running[worker]
        self.old_active[worker] = False
        if batch < 0:
            return []
        self.restart(batch)
        return [batch]

    # --- bookkeeping --------------------------------------------------------------------------

    def _enqueue(self, batch: int) -> None:
        """Into the waiting queue at its rank (a release appends; a restart may cut in)."""
        self.phase[batch] = WAITING
        key = self.rank[batch]
        if not self.waiting or self.rank[self.waiting[-1]] < key:
            self.waiting.append(batch)
            return
        position = next(i for i, b in enumerate(self.waiting) if self.rank[b] > key)
        self.waiting.insert(position, batch)

    def _hold(self, worker: int, batch: int) -> None:
        self.held[worker].append(batch)
        self.held[worker].sort(key=self.rank.__getitem__)
        self.kv_held_tokens[worker] += self.tokens[batch]

    def _unhold(self, worker: int, batch: int) -> None:
        self.held[worker].remove(batch)
        self.kv_held_tokens[worker] -= self.tokens[batch]

    def _finish(self, batch: int, at_s: float) -> None:
        self.phase[batch] = DONE
        self.completion_s[batch] = at_s
        self.finished += 1
