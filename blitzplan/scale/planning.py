"""``Planning``: what one planning call carries through the rules: its options, the compute
model beside them, and its clocks for ``deadline_s``."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from blitzplan.compute import ComputeModel
from blitzplan.multicast.planning_rate import (
    STAGE_DONE,
    TAIL,
    DeadlinePassed,
    TooSlow,
    planning_costs,
    record_layout,
    record_rate,
    recut_share,
    stage_share,
    stop_at,
)
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.topologies import Topology

__all__ = ["DEFAULT_SIZE", "Planning"]

DEFAULT_SIZE = 64
"""The plan size a checkpoint projects at when it is not told the count an attempt plans."""


@dataclass(frozen=True)
class Planning:
    """One call's options, its compute model (None: rooflines) and when it started, by the
    wall-clock and by the calling thread's CPU time (None: no clock): under a deadline the
    multicast skips its refinements (their time is not bounded) and plans the new instances the
    time left affords, its checkpoints stop the call when only the cheapest answer still fits
    (:meth:`checkpoint`), pairing stops once the deadline has passed."""

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

    def checkpoint(
        self, topology: Topology, *, recut: bool = True, sizes: Sequence[int] = ()
    ) -> Callable[[str], None] | None:
        """Under a deadline, a checkpoint: called with the name of a stage, it raises
        :class:`~blitzplan.multicast.planning_rate.DeadlinePassed` once the call has reached
        :func:`~blitzplan.multicast.planning_rate.stop_at`, or would by the time the stage's
        next step ends (the step as long as its last one: a loop's checkpoint stops the loop
        before a step that cannot end in time). At the stages of
        :data:`~blitzplan.multicast.planning_rate.STAGE_DONE` (the first call of each) it
        projects the work since the greedy began (stage ``problem``) at its pace so far, done
        to the share of a plan of ``sizes[-1]`` new instances (the count the attempt plans,
        :func:`~blitzplan.multicast.planning_rate.stage_share`; :data:`DEFAULT_SIZE` when
        empty) (:func:`~blitzplan.multicast.planning_rate.recut_share`, a fresh plan's setup
        being what this attempt spent before that stage, its fixed work counted): with
        ``recut``, work that would end past that point is not gone on with: the call stops
        with :class:`~blitzplan.multicast.planning_rate.TooSlow` (a fresh plan of the share it
        affords follows) when that share is at least one instance; a projection never stops
        a call with nothing (the clock stops it in time anyway), so without ``recut`` (the last
        attempt) there is none. Once the program
        is built (``programmed``) what is left but the live pairs (they stop themselves),
        :data:`~blitzplan.multicast.planning_rate.TAIL` of the work so far, has no checkpoint:
        when it would end past the stop point the call stops with DeadlinePassed (None: no
        deadline or no clock)."""
        deadline, started = self.options.deadline_s, self.started
        if deadline is None or started is None:
            return None
        limit = stop_at(topology, deadline)
        clock = time.monotonic
        opened = clock() - started  # this attempt's layout (a recut's setup) starts here
        begun: list[float] = []
        last: dict[str, float] = {}

        def check(stage: str) -> None:
            now = clock() - started
            before = last.get(stage)
            last[stage] = now
            if now >= limit or (before is not None and 2.0 * now - before >= limit):
                raise DeadlinePassed(stage)
            if before is not None:
                return  # a loop's later steps: the stage's share of the work was projected
            if stage == "layout":  # the first checkpoint: no call under a deadline stops sooner
                record_layout(topology, self.used_cpu())
            elif stage == "problem" and not begun:
                begun.append(now)
            elif begun and stage == "programmed":
                if now + TAIL * (now - begun[0]) >= limit:
                    raise DeadlinePassed(stage)
            elif begun and recut and stage in STAGE_DONE:
                size = sizes[-1] if sizes else DEFAULT_SIZE
                done = stage_share(stage, size)
                share = recut_share(begun[0], now, done, limit, begun[0] - opened, size)
                if share is not None and math.floor(size * share) >= 1:
                    # the attempt's projected time over its time so far, for the record
                    scale = (begun[0] - opened + (now - begun[0]) / done) / max(now - opened, 1e-9)
                    raise TooSlow(stage, share, scale)

        return check

    def given_up(
        self,
        topology: Topology,
        tried: Sequence[int],
        since: tuple[float, float],
        scale: float | None,
    ) -> None:
        """Record on ``topology`` the attempt of ``tried[-1]`` new instances given up (its CPU
        and wall-clock time since ``since``, :meth:`used_cpu` and :meth:`used` then): times
        ``scale``, its projected cost, when a projection gave it up; else (None: the clock
        stopped it) its time so far only when that is more than the line expects of it (a lower
        bound would otherwise pull the line down: it takes each size's fastest record)."""
        if not tried or self.started is None:
            return
        cpu_s, wall_s = self.used_cpu() - since[0], self.used() - since[1]
        if scale is None:
            line = planning_costs(topology)
            if line is not None and cpu_s <= line[0] + line[1] * tried[-1]:
                return
            scale = 1.0
        record_rate(topology, tried[-1], cpu_s * scale, wall_s * scale)

    def bounded(self) -> bool:
        """Whether a deadline bounds the call."""
        return self.options.deadline_s is not None

    def passed(self, topology: Topology | None = None, ahead_s: float = 0.0) -> bool:
        """Whether the deadline has passed, or will have in ``ahead_s`` seconds (the next
        step's time); with ``topology``, whether the call has reached (or will have)
        :func:`~blitzplan.multicast.planning_rate.stop_at` there (what is left of the
        deadline is what the cheapest answer takes: the milestones fit in it)."""
        deadline = self.options.deadline_s
        if deadline is None:
            return False
        limit = deadline if topology is None else stop_at(topology, deadline)
        return self.used() + ahead_s > limit
