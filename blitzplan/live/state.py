"""What an online policy sees (the relay state) and what it may decide (actions).

:class:`RelayView` is the live-execution state a policy reads: batches, new and old instances,
the relay queue, and the queries the policies ask. Every change to it is a transition of
:class:`~blitzplan.live.relay.RelayState` (the state machine); policies only read and return
actions (:class:`RunLayers`, :class:`RunRest`, :class:`Pin`), so the same policy objects drive
the offline prediction, the cluster simulator and real processes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Final, NamedTuple

from blitzplan.live.schedule import NewOp, OldOp

__all__ = [
    "DONE",
    "HANDED_OFF",
    "HELD",
    "ON_NEW",
    "ON_OLD",
    "UNRELEASED",
    "WAITING",
    "Pin",
    "RelayView",
    "RunLayers",
    "RunRest",
    "Started",
    "usable_from_units",
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


class Started(NamedTuple):
    """An operation :meth:`RelayState.decide` started, with its booked times.

    ``on_new``: layers ``first_layer .. first_layer + layers - 1`` on new instance ``worker``
    (``hand_off`` as decided); otherwise layers ``first_layer..L`` as one block on old instance
    ``worker``, with ``pulled`` when the activation leaves the batch's new instance only now.
    """

    on_new: bool
    worker: int
    batch: int
    first_layer: int
    layers: int
    start_s: float
    end_s: float
    hand_off: bool = False
    pulled: bool = False


def usable_from_units(unit_ready_s: Sequence[float]) -> tuple[float, ...]:
    """When each layer may start on a new instance, from when each unit (embedding, layers,
    head) is complete there: a layer needs every unit before it, the last layer also the head."""
    units = list(unit_ready_s)
    for u in range(1, len(units)):
        units[u] = max(units[u], units[u - 1])
    return (*units[1:-2], units[-1])


class RelayView:
    """What a policy reads: batches, instances and the relay queue at time ``now_s``.

    Per batch: ``phase``, ``done`` (layers run on a new instance), ``holder`` (that new
    instance, or -1), ``last_end_s`` (end of its last layer there), ``ready_s`` (when a handed-off
    activation arrives), ``pinned``, ``rank`` (its place in release order), ``split`` and
    ``completion_s`` (booked when its last operation starts, measured when a driver says so),
    ``tokens`` (for KV admission). Per new instance: ``usable_s`` (when each layer may start),
    ``loaded`` (layers usable now), ``free_at_s``, ``held`` (its batches, oldest first),
    ``running`` (``(batch, hand_off)`` or None), ``kv_capacity_tokens``, ``kv_held_tokens``,
    ``admitting``, ``new_active``. Per old instance: ``old_free_at_s``, ``old_running`` (batch
    or -1), ``old_active``. ``waiting``: released batches not started, oldest first; ``handed``:
    handed-off batches, oldest first.
    """

    def __init__(
        self, num_layers: int, *, old_order: str = "free", record_ops: bool = True
    ) -> None:
        self.num_layers, self.old_order, self.record_ops = num_layers, old_order, record_ops
        self.now_s = 0.0
        self.release_s: list[float] = []
        self.new_layer_s: list[float] = []
        self.old_layer_s: list[float] = []
        self.handoff_s: list[float] = []
        self.tokens: list[int] = []
        self.rank: list[int] = []
        self.phase: list[int] = []
        self.done: list[int] = []
        self.holder: list[int] = []
        self.last_end_s: list[float] = []
        self.ready_s: list[float] = []
        self.pinned: list[bool] = []
        self.split: list[int] = []
        self.completion_s: list[float] = []
        self.usable_s: list[tuple[float, ...]] = []
        self.loaded: list[int] = []
        self.free_at_s: list[float] = []
        self.held: list[list[int]] = []
        self.running: list[tuple[int, bool] | None] = []
        self.kv_capacity_tokens: list[float] = []
        self.kv_held_tokens: list[int] = []
        self.new_active: list[bool] = []
        self.admitting: list[bool] = []
        self.old_free_at_s: list[float] = []
        self.old_running: list[int] = []
        self.old_active: list[bool] = []
        self.waiting: deque[int] = deque()
        self.handed: list[int] = []
        self.fifo_order: list[int] = []
        self.finished = 0
        self.new_ops: list[NewOp] = []
        self.old_ops: list[OldOp] = []
        self._fifo_pos: list[int] = []
        self._fifo_next = 0
        self._releases: list[tuple[float, int, int]] = []
        self._suffix: dict[tuple[int, float], list[float]] = {}

    # --- what there is ------------------------------------------------------------------------

    @property
    def num_batches(self) -> int:
        return len(self.phase)

    def idle_new(self, worker: int) -> bool:
        return (
            self.new_active[worker]
            and self.running[worker] is None
            and self.free_at_s[worker] <= self.now_s
        )

    def idle_old(self, worker: int) -> bool:
        return (
            self.old_active[worker]
            and self.old_running[worker] < 0
            and self.old_free_at_s[worker] <= self.now_s
        )

    def can_admit(self, worker: int, batch: int) -> bool:
        """Whether ``worker`` admits batches and its KV memory has room for ``batch`` besides
        what it holds."""
        room = self.kv_held_tokens[worker] + self.tokens[batch] <= self.kv_capacity_tokens[worker]
        return room and self.admitting[worker]

    def fully_loaded(self, worker: int) -> bool:
        return self.loaded[worker] == self.num_layers

    def next_due_s(self) -> float | None:
        """The next release, layer arrival or old instance freed of earlier work, if any."""
        due = [self._releases[0][0]] if self._releases else []
        for w, usable in enumerate(self.usable_s):
            if self.new_active[w] and self.loaded[w] < len(usable):
                due.append(usable[self.loaded[w]])
        for w, free_at in enumerate(self.old_free_at_s):
            if self.old_active[w] and self.old_running[w] < 0:
                due.append(free_at)
        later = [t for t in due if t > self.now_s]
        return min(later) if later else None

    # --- what policies ask --------------------------------------------------------------------

    def release_order(self) -> list[int]:
        """Batches in the order they are released."""
        return sorted(range(self.num_batches), key=lambda b: (self.release_s[b], self.rank[b]))

    def fifo_head(self) -> int:
        """Under ``old_order="fifo"``: the oldest released batch O may still take, or -1 (and
        -1 while an older batch is still to be released)."""
        order = self.fifo_order
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
        suffix maxima of ``usable_l - l * p`` computed once per (instance, layer time).
        """
        worker, k, p = self.holder[batch], self.done[batch], self.new_layer_s[batch]
        suffix = self._suffix.get((worker, p))
        if suffix is None:
            suffix = self._suffix_maxima(worker, p)
            self._suffix[(worker, p)] = suffix
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
