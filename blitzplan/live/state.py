"""What an online policy sees (the relay state) and what it may decide (actions).

The event loop owns and mutates a :class:`RelayState`; policies only read it and return actions.
The same policy objects can therefore drive the offline prediction, a cluster simulator or real
processes: all they need is this state, kept current by whoever runs them.
"""

from __future__ import annotations

from collections import deque
from typing import Final, NamedTuple

from blitzplan.live.instance import Fleet, LiveScalingInstance

__all__ = [
    "DONE",
    "HANDED_OFF",
    "HELD",
    "ON_NEW",
    "ON_OLD",
    "UNRELEASED",
    "WAITING",
    "Pin",
    "RelayState",
    "RunLayers",
    "RunRest",
]

# Phases of a batch (plain ints: policies compare them on every decision).
UNRELEASED: Final = 0
"""Not yet arrived."""
WAITING: Final = 1
"""In the relay queue, no layer run yet."""
HELD: Final = 2
"""Some layers done on a new instance, which keeps its activation; idle now."""
ON_NEW: Final = 3
"""Running layers on its new instance."""
HANDED_OFF: Final = 4
"""Its activation was sent to the relay queue; an old instance will run the rest."""
ON_OLD: Final = 5
"""Taken by an old instance (its block is running or about to)."""
DONE: Final = 6


class RunLayers(NamedTuple):
    """A new instance runs the next ``layers`` layers of ``batch``, one operation each.

    With ``hand_off`` the activation then goes to the relay queue (an old instance finishes).
    """

    batch: int
    layers: int = 1
    hand_off: bool = False


class RunRest(NamedTuple):
    """An old instance runs every remaining layer of ``batch`` as one block."""

    batch: int


class Pin(NamedTuple):
    """``batch`` will finish on its new instance; no old instance may take it any more."""

    batch: int


class RelayState:
    """Batches, instances and the relay queue at time ``now_s``.

    Per batch: ``phase``, ``done`` (layers run on a new instance), ``holder`` (that new
    instance, or -1), ``last_end_s`` (end of its last layer there), ``ready_s`` (when a handed-off
    activation arrives), ``pinned``. Per new instance: ``usable_s`` (when each layer may start),
    ``loaded`` (layers usable now), ``free_at_s``, ``held`` (its batches, oldest first). Per old
    instance: ``old_free_at_s``. ``waiting``: released batches not started, oldest first;
    ``handed``: handed-off batches, oldest first.
    """

    def __init__(self, instance: LiveScalingInstance, fleet: Fleet, old_order: str) -> None:
        n = instance.num_batches
        self.instance, self.fleet, self.old_order = instance, fleet, old_order
        self.num_layers = instance.num_layers
        self.now_s = 0.0
        self.release_s = instance.release_s
        self.new_layer_s, self.old_layer_s = instance.new_layer_s, instance.old_layer_s
        self.handoff_s = instance.handoff_s
        self.rank = [0] * n
        for position, batch in enumerate(instance.fifo_order):
            self.rank[batch] = position
        self.phase = [UNRELEASED] * n
        self.done = [0] * n
        self.holder = [-1] * n
        self.last_end_s = list(instance.release_s)
        self.ready_s = [0.0] * n
        self.pinned = [False] * n
        self.usable_s = [fleet.usable_s(w) for w in range(fleet.num_new)]
        self.loaded = [0] * fleet.num_new
        self.free_at_s = [0.0] * fleet.num_new
        self.held: list[list[int]] = [[] for _ in range(fleet.num_new)]
        self.old_free_at_s = list(fleet.old_free_at_s)
        self.waiting: deque[int] = deque()
        self.handed: list[int] = []
        self._fifo_next = 0
        self._suffix: dict[tuple[int, int], list[float]] = {}

    def release_order(self) -> list[int]:
        """Batches in the order they are released."""
        return sorted(range(len(self.phase)), key=self.rank.__getitem__)

    def release_due(self, order: list[int], start: int, now_s: float) -> int:
        """Mark waiting every batch of ``order[start:]`` released by ``now_s``; the next index."""
        while start < len(order) and self.release_s[order[start]] <= now_s:
            self.phase[order[start]] = WAITING
            self.waiting.append(order[start])
            start += 1
        return start

    def fifo_head(self) -> int:
        """Under ``old_order="fifo"``: the oldest batch O may still take, or -1."""
        order = self.instance.fifo_order
        while self._fifo_next < len(order):
            batch = order[self._fifo_next]
            if self.phase[batch] in (ON_OLD, DONE) or self.pinned[batch]:
                self._fifo_next += 1
            else:
                return batch
        return -1

    def finish_alone_s(self, batch: int) -> float:
        """When the batch's new instance would finish it, running only it from when it is free.

        Closed form of ``f = max(f, usable_l) + p`` over the remaining layers ``l``, with the
        suffix maxima of ``usable_l - l * p`` computed once per (instance, batch).
        """
        worker, k, p = self.holder[batch], self.done[batch], self.new_layer_s[batch]
        suffix = self._suffix.get((worker, batch))
        if suffix is None:
            suffix = self._suffix_maxima(worker, p)
            self._suffix[(worker, batch)] = suffix
        start = max(self.now_s, self.free_at_s[worker], self.last_end_s[batch])
        remaining = self.num_layers - k
        return max(start + remaining * p, suffix[k] + (self.num_layers + 1) * p)

    def _suffix_maxima(self, worker: int, p: float) -> list[float]:
        usable, L = self.usable_s[worker], self.num_layers
        out = [0.0] * L
        best = float("-inf")
        for layer in range(L, 0, -1):
            best = max(best, usable[layer - 1] - layer * p)
            out[layer - 1] = best
        return out
