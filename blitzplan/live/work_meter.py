"""Counted work: a clock that advances by estimated seconds of the work done, not by the wall.

A search that stops when its counted work reaches a budget does the same work, and returns the
same answer, on every run of the same input, however loaded the machine: this is how the bound
``plan()`` prints beside a heuristic's schedule is limited (:data:`blitzplan.live.
bound.printed.HEURISTIC_BOUND_S`), so that a plan and its ``plan_id`` do not change from run to
run. Each counted step is priced by a calibrated estimate of its CPU seconds on a 2-core x86_64
machine (the constants live beside the code they price), so a budget takes about that long there.

Real clocks are kept only as safety nets, far above the budget: the calling thread's CPU time
(``cpu_by_s``, :func:`time.thread_time`: a machine much slower than the estimates) and the wall
clock (``wall_by_s``, :func:`time.perf_counter`: a machine so loaded that the work would take
too long). Past either, every counted search stops (a bound stopped early is weaker but still
valid), and then its answer may differ from run to run. The CPU net is the one that matters on
a slow machine; the wall net lies further out because load stretches wall time, not work: on a
loaded 2-core machine a process gets a quarter to an eighth of a core.

A bounded search reads one :data:`Clock`: a :class:`WorkMeter`, or :data:`WALL_CLOCK` (instants
are ``time.perf_counter()`` values and nothing is counted), through the same calls.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["WALL_CLOCK", "Clock", "WallClock", "WorkMeter"]


class WorkMeter:
    """Estimated seconds of work counted so far (``spent_s``), and the instants of the calling
    thread's CPU clock (``cpu_by_s``) and of the wall clock (``wall_by_s``) past which every
    counted search stops as well (``inf``: no net).

    A counted search's instants are counted seconds on this meter (:data:`Clock`)."""

    def __init__(self, *, cpu_by_s: float = math.inf, wall_by_s: float = math.inf) -> None:
        self.spent_s = 0.0
        self.cpu_by_s, self.wall_by_s = cpu_by_s, wall_by_s

    @classmethod
    def with_safety(cls, *, cpu_s: float, wall_s: float) -> WorkMeter:
        """A meter whose nets lie ``cpu_s`` of this thread's CPU time and ``wall_s`` of wall
        clock from now."""
        return cls(cpu_by_s=time.thread_time() + cpu_s, wall_by_s=time.perf_counter() + wall_s)

    def spend(self, seconds: float) -> None:
        """Count ``seconds`` (estimated) of work done."""
        self.spent_s += seconds

    def now_s(self) -> float:
        """The counted seconds so far."""
        return self.spent_s

    def passed(self, counted_s: float) -> bool:
        """Whether the counted work has passed ``counted_s``, or a real clock its net."""
        return self.spent_s > counted_s or self.unsafe()

    def step_s(self, counted: Callable[[], float], measured_s: float) -> float:
        """What a step takes on this meter: its counted estimate, ``counted()``."""
        return counted()

    def unsafe(self) -> bool:
        """Whether the CPU clock or the wall clock has passed its safety net."""
        return time.perf_counter() > self.wall_by_s or time.thread_time() > self.cpu_by_s

    def wall_left_s(self) -> float:
        """Wall-clock seconds left before the wall clock's net."""
        return self.wall_by_s - time.perf_counter()


class WallClock:
    """The wall clock as a search reads it: its instants are ``time.perf_counter()`` values,
    and nothing is counted."""

    def now_s(self) -> float:
        """``time.perf_counter()``."""
        return time.perf_counter()

    def passed(self, instant: float) -> bool:
        """Whether the wall clock has passed ``instant``."""
        return time.perf_counter() > instant

    def spend(self, seconds: float) -> None:
        """Nothing: the wall clock counts itself."""

    def step_s(self, counted: Callable[[], float], measured_s: float) -> float:
        """What a step takes on the wall clock: ``measured_s``, measured on earlier steps."""
        return measured_s


WALL_CLOCK = WallClock()
"""The wall clock (it holds no state: every search may share it)."""

Clock = WallClock | WorkMeter
"""What a bounded search reads its time on, one interface either way: ``now_s()``, whether
an instant has ``passed()``, ``spend()`` (counted on a meter, nothing on the wall clock) and
``step_s()`` (what a step will take: counted or measured)."""
