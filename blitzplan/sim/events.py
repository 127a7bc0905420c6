"""The simulator's typed events and the queue that orders them.

Entries are ``(time, priority, sequence, event)``: at equal times every ordinary event comes
before a relay's step (``late``), so a relay decides once on everything that happened at that
instant, as the offline loop does; remaining ties break by insertion order, with a counter owned
by the queue, so two runs of the same input are identical.

The clock never goes back: the queue knows the time of the last event it gave out, and an event
booked before it is an internal error (:class:`ClockError`), raised where it is booked. An event
can be cancelled by the number :meth:`EventQueue.push` returned: it is never given out (a decode
run cut short by a new request, :mod:`.decode`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
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
    last event given out, and nothing may be booked before it."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0
        self._cancelled: set[int] = set()
        self.now_s = 0.0

    def __len__(self) -> int:
        return len(self._heap) - len(self._cancelled)

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
        time_s, _, _, event = heapq.heappop(self._heap)
        self.now_s = time_s
        return time_s, event

    def peek_s(self) -> float:
        self._skip_cancelled()
        return self._heap[0][0]

    def _skip_cancelled(self) -> None:
        heap, cancelled = self._heap, self._cancelled
        while cancelled and heap and heap[0][2] in cancelled:
            cancelled.discard(heapq.heappop(heap)[2])
