"""Step sizes for the subgradient ascent of a Lagrangian bound (the FIFO Lagrangian and the slot
bound): Polyak's rule aimed part of the way from the best bound so far to a known schedule's
value, halved after ``patience`` steps without a better bound; or aimed a share ``rise`` above
the best bound so far (or a known lower bound, ``floor``), the share halved instead."""

from __future__ import annotations

import math


class PolyakSteps:
    """The ascent's state: ``best`` (the best bound seen), the step and how long it is stale.
    ``target`` is a known schedule's value (``inf`` when none: each step then aims 5% above
    the last value); each step aims ``aim_share`` of the way from ``best`` to it. With
    ``rise``, each step aims that share above the larger of ``best`` and ``floor`` (at most
    ``target``), and it is the share that halves when the bound is stale."""

    def __init__(
        self,
        target: float,
        aim_share: float,
        patience: int,
        step: float = 1.0,
        *,
        rise: float | None = None,
        floor: float = -math.inf,
    ) -> None:
        self.target, self.aim_share, self.patience = target, aim_share, patience
        self.step, self.best, self.stale = step, -math.inf, 0
        self.rise, self.floor = rise, floor

    def seen(self, value: float) -> bool:
        """Record a step's bound ``value``; whether it is a new best."""
        if value > self.best + 1e-12 * abs(value):
            self.best, self.stale = value, 0
            return True
        self.stale += 1
        if self.stale >= self.patience:
            self.stale = 0
            if self.rise is None:
                self.step /= 2
            else:
                self.rise /= 2
        return False

    def size(self, value: float, norm: float) -> float:
        """How far along a subgradient of squared norm ``norm`` to move from ``value``."""
        if self.rise is not None:
            low = max(self.best, self.floor)
            aim = min(low + self.rise * abs(low), self.target)
        elif math.isfinite(self.target):
            aim = self.best + self.aim_share * (self.target - self.best)
        else:
            aim = value + 0.05 * abs(value) + 1e-9
        return self.step * (aim - value) / norm
