"""The simulator's typed events and the queue that orders them.

Entries are ``(time, priority, sequence, event)``: at equal times every ordinary event comes
before the relay's step (``late``), so the prefill relay decides once on everything that happened
at that instant, as the offline loop does; remaining ties break by insertion order, with a counter
owned by the queue, so two runs of the same input are identical.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blitzplan.sim.instances import SimInstance, SimRequest

__all__ = [
    "Arrival",
    "CopyRestored",
    "DecodeStep",
    "Event",
    "EventQueue",
    "FlowDone",
    "HostFailure",
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
    """The prefill relay applies what is due and asks its policy (late at its instant)."""


@dataclass(frozen=True, slots=True)
class FlowDone:
    """A KV transfer may be complete (``version`` tells a stale estimate from the current one)."""

    flow: int
    version: int


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """A decode instance finished one step of its first ``size`` running requests."""

    instance: SimInstance
    size: int


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


Event = Arrival | RelayStep | FlowDone | DecodeStep | LoadDone | Tick | HostFailure | CopyRestored


class EventQueue:
    """A heap of events by time, then priority, then insertion."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Event]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time_s: float, event: Event, *, late: bool = False) -> None:
        heapq.heappush(self._heap, (time_s, int(late), self._seq, event))
        self._seq += 1

    def pop(self) -> tuple[float, Event]:
        time_s, _, _, event = heapq.heappop(self._heap)
        return time_s, event

    def peek_s(self) -> float:
        return self._heap[0][0]
