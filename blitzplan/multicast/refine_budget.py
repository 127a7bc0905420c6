"""``RefineBudget``: how long the greedy multicast's refinements (its local search, then its
linear program) may run: ``factor`` times the greedy's own planning time, at least
:data:`REFINE_MIN_S` (small plans keep their full, quick refinement).

A clock, not a count: a refinement cut short keeps the best plan found so far (a refinement
never makes a plan worse), but which plan that is then depends on the machine's speed and load.
``factor=None`` sets no limit, and equal input then gives an identical plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from blitzplan.errors import InvalidInputError

__all__ = ["REFINE_MIN_S", "RefineBudget"]

REFINE_MIN_S = 0.5
"""Seconds the refinements may always take, whatever the greedy took."""


class RefineBudget:
    """At most ``factor`` times the greedy's planning time for its refinements, at least
    ``floor_s`` seconds (None: no limit; 0: none); ``clock`` gives seconds (tests pass a fake
    one). ``cut`` tells afterwards whether a refinement stopped for the budget."""

    def __init__(
        self,
        factor: float | None,
        clock: Callable[[], float] = time.perf_counter,
        floor_s: float = REFINE_MIN_S,
    ) -> None:
        if factor is not None and (
            isinstance(factor, bool) or not isinstance(factor, int | float) or not factor >= 0
        ):
            raise InvalidInputError(f"refine_budget must be a number >= 0 or None, got {factor!r}")
        self.factor = factor
        self.clock = clock
        self.floor_s = floor_s
        self.until: float | None = None
        self.begun: float | None = None
        self.begun_cpu: float | None = None
        self.cut = False

    def start(self, greedy_s: float) -> None:
        """The greedy took ``greedy_s`` seconds: the refinements may take ``factor`` times that
        (at least ``floor_s``; 0 with ``factor`` 0) from now."""
        self.begun, self.begun_cpu = self.clock(), time.thread_time()
        if self.factor is not None:
            allowed = max(self.factor * greedy_s, self.floor_s) if self.factor > 0 else 0.0
            self.until = self.clock() + allowed

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
