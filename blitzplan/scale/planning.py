"""``Planning``: what one planning call carries through the rules: its options, the compute
model beside them, and its clocks for ``deadline_s``."""

from __future__ import annotations

import time
from dataclasses import dataclass

from blitzplan.compute import ComputeModel
from blitzplan.scale.plan_options import PlanOptions

__all__ = ["Planning"]


@dataclass(frozen=True)
class Planning:
    """One call's options, its compute model (None: rooflines) and when it started, by the
    wall-clock and by the calling thread's CPU time (None: no clock): under a deadline the
    multicast skips its refinements (their time is not bounded) and plans the new instances the
    time left affords, pairing stops once the deadline has passed."""

    options: PlanOptions
    compute: ComputeModel | None = None
    started: float | None = None
    started_cpu: float | None = None

    @classmethod
    def timed(cls, options: PlanOptions, compute: ComputeModel | None = None) -> Planning:
        """A call starting now."""
        return cls(options, compute, time.monotonic(), time.thread_time())

    def used(self) -> float:
        """Seconds since the call started (0 without a clock)."""
        return 0.0 if self.started is None else time.monotonic() - self.started

    def used_cpu(self) -> float:
        """CPU seconds this thread spent since the call started (0 without a clock)."""
        return 0.0 if self.started_cpu is None else time.thread_time() - self.started_cpu

    def bounded(self) -> bool:
        """Whether a deadline bounds the call."""
        return self.options.deadline_s is not None

    def passed(self) -> bool:
        deadline = self.options.deadline_s
        return deadline is not None and self.used() > deadline
