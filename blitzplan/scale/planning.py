"""``Planning``: what one planning call carries through the rules: its options, the compute
model beside them, and its clock for ``deadline_s``."""

from __future__ import annotations

import time
from dataclasses import dataclass

from blitzplan.compute import ComputeModel
from blitzplan.scale.plan_options import PlanOptions

__all__ = ["Planning"]


@dataclass(frozen=True)
class Planning:
    """One call's options, its compute model (None: rooflines) and when it started (None: no
    clock): under a deadline the multicast skips its refinements (their time is not bounded),
    pairing stops once the deadline has passed."""

    options: PlanOptions
    compute: ComputeModel | None = None
    started: float | None = None

    def used(self) -> float:
        """Seconds since the call started (0 without a clock)."""
        return 0.0 if self.started is None else time.monotonic() - self.started

    def bounded(self) -> bool:
        """Whether a deadline bounds the call."""
        return self.options.deadline_s is not None

    def passed(self) -> bool:
        deadline = self.options.deadline_s
        return deadline is not None and self.used() > deadline
