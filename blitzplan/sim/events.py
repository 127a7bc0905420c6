"""The simulator's typed events and the queue that orders them.

Entries are ``(time, priority, sequence, event)``: at equal times every ordinary event comes
before a relay's step (``late``), so a relay decides once on everything that happened at that
instant, as the offline loop does; remaining ties break by insertion order, with a counter owned
by the queue, so two runs of the same input are identical.

The clock never goes back: the queue knows the time of the last event it gave out, and an event
booked before it is an internal error (:class:`ClockError`), raised where it is booked. An event
can be cancelled by the number :meth:`EventQueue.push` returned: it is never given out (a decode
run cut short by a new request, :mod:`.decode`).

A run's arrivals are known at the start: they come as a *stream* (the queue's first numbers, in
order), and only the next of them waits in the heap, so the heap holds the events in flight, not
the whole trace; the order is the one of pushing them all first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

from blitzplan.errors import BlitzplanError

if TYPE_CHECKING:
    from blitzplan.sim.instances import SimInstance, SimRequest

__all__ = [
    "Arrival",
    "ClockError",
    "CopyRestored",
    "DecodeStep",
    "Event",
    "EventQueue",
    "FlowDone",
    "HostFailure",
    "Iteration",
    "LoadDone",
    "RelayStep",
    "Tick",
]


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request arrives at the router."""

    request: SimRequest


@dataclass(frozen=True, slots=True)
class RelayStep:
    """A relay applies what is due and asks its policy (late at its instant): the prefill tier's
    (``owner`` None) or a colocated replica's live group (``owner`` its old replica's id)."""

    owner: str | None = None


@dataclass(frozen=True, slots=True)
class FlowDone:
    """A KV transfer may be complete (``version`` tells a stale estimate from the current one)."""

    flow: int
    version: int


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """A decode instance finished the last step of a run of steps of its first ``size`` running
    requests (:mod:`.decode`)."""

    instance: SimInstance
    size: int


@dataclass(frozen=True, slots=True)
class Iteration:
    """A colocated replica's iteration ``number`` ended."""

    instance: SimInstance
    number: int


@dataclass(frozen=True, slots=True)
class LoadDone:
    """An instance's weights are all there (if its load was not replanned since)."""

    instance: SimInstance
    ready_s: float


@dataclass(frozen=True, slots=True)
class Tick:
    """The autoscaler decides."""


@dataclass(frozen=True, slots=True)
class HostFailure:
    """``host`` fails (``trace_s``: the time as given, on the trace's own axis)."""

    host: str
    trace_s: float


@dataclass(frozen=True, slots=True)
class CopyRestored:
    """The one host copy is rebuilt (if ``attempt`` is still the current rebuild)."""

    attempt: int


Event = (
    Arrival
    | RelayStep
    | FlowDone
    | DecodeStep
    | Iteration
    | LoadDone
    | Tick
    | HostFailure
    | CopyRestored
)


class ClockError(BlitzplanError):
    """An internal error: an event was booked before the simulator's clock."""


class EventQueue:
    """A heap of events by time, then priority, then insertion; ``now_s`` is the time of the
    last event given out, and nothing may be booked before it. ``stream``: the times of events
    booked first, in order (sorted), ``event(i)`` the i-th of them, made when it enters the heap
    (module docstring)."""

    def __init__(
        self,
        stream: Sequence[float] = (),
        event: Callable[[int], Event] | None = None,
    ) -> None:
        if any(b < a for a, b in pairwise(stream)) or not all(t >= 0.0 for t in stream):
            raise ClockError("internal error: a queue's stream must be sorted times >= 0")
        if stream and event is None:
            raise ClockError("internal error: a queue's stream needs its events")
        self._heap: list[tuple[float, int, int, Event]] = []
        self._stream, self._make = stream, event
        self._seq = len(stream)
        self._cancelled: set[int] = set()
        self.now_s = 0.0
        self._streamed = 0
        self._stream_next(0)

    def __len__(self) -> int:
        return len(self._heap) + len(self._stream) - self._streamed - len(self._cancelled)

    def _stream_next(self, number: int) -> None:
        """Stream event ``number`` enters the heap (if there is one)."""
        if number < len(self._stream) and self._make is not None:
            self._streamed = number + 1
            heapq.heappush(self._heap, (self._stream[number], 0, number, self._make(number)))

    def push(self, time_s: float, event: Event, *, late: bool = False) -> int:
        """Book ``event`` at ``time_s``; the number that :meth:`cancel` takes."""
        if not time_s >= self.now_s:  # also refuses NaN
            raise ClockError(
                f"internal error: {type(event).__name__} booked at {time_s!r} s, before the "
                f"simulator's clock ({self.now_s!r} s); the clock never goes back"
            )
        heapq.heappush(self._heap, (time_s, int(late), self._seq, event))
        self._seq += 1
        return self._seq - 1

    def cancel(self, number: int) -> None:
        """The event booked as ``number`` (not given out yet) will not be."""
        self._cancelled.add(number)

    def pop(self) -> tuple[float, Event]:
        self._skip_cancelled()
        time_s, _, number, event = heapq.heappop(self._heap)
        if number < len(self._stream):
            self._stream_next(number + 1)
        self.now_s = time_s
        return time_s, event

    def next_s(self) -> float | None:
        """When the next event is due (None: none is)."""
        self._skip_cancelled()
        return self._heap[0][0] if self._heap else None

    def _skip_cancelled(self) -> None:
        heap, cancelled = self._heap, self._cancelled
        while cancelled and heap and heap[0][2] in cancelled:
            cancelled.discard(heapq.heappop(heap)[2])
