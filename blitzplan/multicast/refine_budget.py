"""``RefineBudget``: whether the greedy multicast's refinements (its local search, its linear
program, its tree packing) run, and how long they may.

They could gain at most the greedy plan's time above its per-instance cut bound, and a control
loop's instances are ready after the call and its transfers. So they run only when ``factor``
times that gain pays for at least one more plan of the local search, at the nominal
:data:`PLAN_S` plus :data:`LANE_S` per lane of the greedy's plan (measured on a 2-core machine;
a count of the plan, not a clock, so the same input always decides the same way), and then
take at most ``factor`` times that gain, at least :data:`REFINE_MIN_S`.

That allowance is a clock: a refinement cut short keeps the best plan found so far (a
refinement never makes a plan worse), but which plan that is then depends on the machine's
speed and load. ``factor=None`` skips nothing and sets no limit, and equal input then gives an
identical plan.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from blitzplan.errors import InvalidInputError

__all__ = ["LANE_S", "PLAN_S", "REFINE_MIN_S", "RefineBudget"]

PLAN_S = 0.5e-3
"""The nominal seconds of building one plan of the local search, beside ..."""
LANE_S = 20e-6
"""... these per lane of the plan (the greedy's build, measured: 0.7-85 ms for 4-3,200 lanes)."""
REFINE_MIN_S = 0.05
"""Seconds the refinements may always take once they run (a small gain's full, quick
refinement: 5-15 ms of linear program on an 8-GPU host)."""


class RefineBudget:
    """At most ``factor`` times the refinements' possible gain for them, at least ``floor_s``
    seconds (None: no limit; 0: none), and none past ``deadline`` (a ``clock`` reading; None:
    none); ``clock`` gives seconds (tests pass a fake one).
    ``cut`` tells afterwards whether a refinement stopped for the budget, ``skipped`` whether
    none ran because the gain could not pay for them."""

    def __init__(
        self,
        factor: float | None,
        clock: Callable[[], float] = time.perf_counter,
        floor_s: float = REFINE_MIN_S,
        *,
        deadline: float | None = None,
    ) -> None:
        if factor is not None and (
            isinstance(factor, bool) or not isinstance(factor, int | float) or not factor >= 0
        ):
            raise InvalidInputError(f"refine_budget must be a number >= 0 or None, got {factor!r}")
        self.factor = factor
        self.deadline = math.inf if deadline is None else deadline
        self.clock = clock
        self.floor_s = floor_s
        self.gain_s = 0.0
        self.until: float | None = deadline
        self.begun: float | None = None
        self.begun_cpu: float | None = None
        self.cut = False
        self.skipped = False

    def worth(self, lanes: int, gain_s: float) -> bool:
        """Whether the refinements run on a greedy plan of ``lanes`` lanes ``gain_s`` seconds
        above its bound: always without a limit, never with ``factor`` 0, else when
        ``factor * gain_s`` pays for one more plan (:data:`PLAN_S` + :data:`LANE_S` per lane).
        When not, ``cut`` and ``skipped`` are set."""
        self.gain_s = gain_s
        if self.factor is None or (
            self.factor > 0 and self.factor * gain_s >= PLAN_S + LANE_S * lanes
        ):
            return True
        self.cut = self.skipped = True
        return False

    def start(self) -> None:
        """The refinements start now: their clock and allowance, ``factor`` times the gain
        given to :meth:`worth`, at least ``floor_s`` (0 with ``factor`` 0), begin; it ends by
        the ``deadline`` given, if earlier."""
        self.begun, self.begun_cpu = self.clock(), time.thread_time()
        if self.factor is not None:
            allowed = max(self.factor * self.gain_s, self.floor_s) if self.factor > 0 else 0.0
            self.until = min(self.begun + allowed, self.deadline)

    def refining_s(self) -> float:
        """Seconds since the refinements started (0 when they never did): what a plan took
        beyond its greedy, which a plan under ``deadline_s`` skips."""
        return 0.0 if self.begun is None else max(0.0, self.clock() - self.begun)

    def refining_cpu_s(self) -> float:
        """This thread's CPU seconds since the refinements started (0 when they never did)."""
        return 0.0 if self.begun_cpu is None else max(0.0, time.thread_time() - self.begun_cpu)

    def left(self) -> float | None:
        """Seconds left (None: no limit)."""
        return None if self.until is None else max(0.0, self.until - self.clock())

    def spent(self) -> bool:
        """Whether the budget is spent (then ``cut`` is set: the caller stops refining)."""
        left = self.left()
        if left is not None and left <= 0:
            self.cut = True
        return self.cut

    def note(self) -> str:
        """The plan's note once the budget skipped or cut the refinements short (``cut``)."""
        gain = f"{self.gain_s * 1e3:.3g} ms" if self.gain_s < 1 else f"{self.gain_s:.3g} s"
        could = f"{self.factor:g}x the {gain} they could gain at most"
        if self.skipped:
            return (
                f"refine_budget: the multicast's refinements were skipped ({could} pays for "
                "no more plan); the greedy's plan is kept"
            )
        return (
            f"refine_budget: the multicast's refinements were cut short ({could}, at least "
            f"{self.floor_s:g} s); the best plan found is kept"
        )
