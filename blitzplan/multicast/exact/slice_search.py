"""Which plan to cut into time slices, and into how many: the exact method's last step.

Every candidate plan (of one phase, its hops waiting for none) is cut into :data:`SLICES`
plain and :data:`STAGGERED_SLICES` staggered slices
(:func:`~blitzplan.multicast.exact.phase_slices.slice_phases`), each count on every candidate
before the next count: the plan that times fastest in one phase is often not the one that
slices best. Each slicing is first timed from its pattern
(:func:`~blitzplan.multicast.exact.slice_timing.sliced_ready`: the full plan's ready times
without building it, in a fraction of the time); only the fastest is then built and evaluated
in full (the next fastest if its phases meet on a link), and the slicings the pattern cannot
time are built in full after it, as time allows. :class:`SliceSearch` does this in two calls,
so the exact method can time the slicings of the plans it has before its search and leave the
search's time to building the fastest of them.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence

from blitzplan.errors import InvalidInputError
from blitzplan.multicast.exact.phase_slices import (
    _atom_cuts,
    _depths,
    _groups,
    _sharing,
    phases_apart,
    slice_phases,
)
from blitzplan.multicast.exact.slice_timing import SlicedTimes, atoms_of, sliced_ready
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, score

__all__ = ["SLICES", "STAGGERED_SLICES", "SliceSearch", "sliced_refinement"]

SLICES = (4, 8, 16, 32)
"""The plain slice counts tried, in turn."""
STAGGERED_SLICES = (64, 128, 256)
"""The staggered slice counts tried then (a hop ``d`` deep ends ``d`` slices later, so
staggering pays only once slices are thin: 16 and 32 were rarely the fastest)."""
_MARGIN = 1.5
"""A step's predicted time: this many times the slowest per lane and slice so far."""
_FULL_PRIOR_S = 50e-6
"""Before any slicing was built in full, its predicted seconds per lane and slice: the pattern
again, the plan built with those times and its phases checked (40-55 us on a 2-core x86_64
shared by about 7 busy processes, 15-20 us quiet)."""
_BETTER = 1 - 1e-9
"""A slicing replaces a plan when it is faster by more than float noise."""

_Shape = tuple[list[tuple[int, int, bool]], list[int], list[list[int]], bool, int]


class SliceSearch:
    """Slicings of candidate plans timed from their patterns (:meth:`time`), then the fastest
    built in full (:meth:`best`); each step only when, at its predicted time (:data:`_MARGIN`
    times the slowest time per lane and slice so far of its kind), it ends by the deadline
    given (None: no clock) with time left to build the fastest slicing timed so far."""

    def __init__(self, problem: Problem, objective: str) -> None:
        self.problem, self.objective = problem, objective
        self.plans: list[Built] = []
        self.shapes: list[_Shape] = []
        self.timed: list[tuple[float, int, bool, int]] = []
        self.untimed: list[tuple[int, bool, int]] = []  # slicings the pattern could not time
        self.target = math.inf  # the fastest timed slicing that could be built in time
        self.reserve_s = 0.0  # ... its predicted time to build in full
        self.pattern_s = 0.0  # the time spent timing patterns
        self.rate = {"pattern": 0.0, "full": _FULL_PRIOR_S}

    def time(self, candidates: Sequence[Built], deadline: float | None) -> None:
        """Add ``candidates`` (those of one phase whose hops wait for none, and not timed as
        one added before) and time their slicings from their patterns, by ``deadline`` (a
        :func:`time.perf_counter` value)."""
        added = len(self.plans)
        for plan in candidates:
            b = plan.builder
            if any(p != 0 for p in b.flow_phase) or any(spec[4] for spec in b.hop_specs):
                continue
            v = self._value(plan)
            if any(abs(v - self._value(o)) <= 1e-12 * v for o in self.plans):
                continue
            self.plans.append(plan)
            self.shapes.append(_shape(self.problem, plan))
            self.target = min(self.target, v)
        new = range(added, len(self.plans))
        trials = [(m, False, j) for m in SLICES for j in new]
        trials += [(m, True, j) for m in STAGGERED_SLICES for j in new if self.shapes[j][3]]
        began = time.perf_counter()
        for phases, staggered, j in trials:
            size = self.shapes[j][4] * phases
            if not self._fits("pattern", size, deadline, self.reserve_s):
                continue
            with self._timing("pattern", size):
                found = _pattern_ready(
                    self.problem, self.plans[j], phases, staggered, self.shapes[j]
                )
            if found is None:
                self.untimed.append((phases, staggered, j))
                continue
            v = score(self.objective, found.ready_at_s, self.plans[j].live)
            self.timed.append((v, phases, staggered, j))
            if v < self.target * _BETTER and self._fits("full", size, deadline):
                self.target, self.reserve_s = v, self._predict("full", size)
        self.pattern_s += time.perf_counter() - began

    def best(self, candidates: Sequence[Built], deadline: float | None) -> Built:
        """The fastest of ``candidates`` (the first of the fastest when no slicing beats them)
        and of the slicings timed, built in full by ``deadline``, fastest first, whose phases
        stay apart on every link; then the slicings the pattern could not time, as time
        allows."""
        best = min(candidates, key=self._value)
        value = self._value(best)
        for v, phases, staggered, j in sorted(self.timed):
            if v >= value * _BETTER:
                break
            trial = self._full(j, phases, staggered, deadline, timed=True)
            if trial is not None:
                best, value = trial, self._value(trial)
                break
        for phases, staggered, j in self.untimed:
            trial = self._full(j, phases, staggered, deadline, timed=False)
            if trial is not None and self._value(trial) < value * _BETTER:
                best, value = trial, self._value(trial)
        return best

    def _value(self, plan: Built) -> float:
        return score(self.objective, plan.ready_at_s, plan.live)

    def _full(
        self,
        j: int,
        phases: int,
        staggered: bool,
        deadline: float | None,
        *,
        timed: bool,
    ) -> Built | None:
        """Plan ``j`` sliced, built and evaluated (``timed``: its times from its pattern, put
        in place), if its phases stay apart on every link (None: no time for it, its waits form
        a cycle, or its phases meet)."""
        size = self.shapes[j][4] * phases
        if not self._fits("full", size, deadline):
            return None
        with self._timing("full", size):
            plan, shape = self.plans[j], self.shapes[j]
            times = _pattern_ready(self.problem, plan, phases, staggered, shape) if timed else None
            try:
                trial = slice_phases(self.problem, plan, phases, staggered=staggered, timed=times)
            except InvalidInputError:  # its waits form a cycle: this slicing cannot run
                return None
            return trial if phases_apart(self.problem, trial) else None

    def _predict(self, kind: str, size: int) -> float:
        return _MARGIN * self.rate[kind] * size

    def _fits(self, kind: str, size: int, deadline: float | None, reserve: float = 0.0) -> bool:
        if deadline is None:
            return True
        return time.perf_counter() + self._predict(kind, size) + reserve <= deadline

    @contextlib.contextmanager
    def _timing(self, kind: str, size: int) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.rate[kind] = max(self.rate[kind], took / size)


def sliced_refinement(
    problem: Problem,
    candidates: Sequence[Built],
    objective: str,
    time_left_s: float | None,
) -> Built:
    """:class:`SliceSearch` in one call: the fastest of ``candidates`` and of their slicings
    within ``time_left_s`` (None: no clock, all tried)."""
    deadline = None if time_left_s is None else time.perf_counter() + time_left_s
    search = SliceSearch(problem, objective)
    search.time(candidates, deadline)
    return search.best(candidates, deadline)


def _shape(problem: Problem, plan: Built) -> _Shape:
    """A plan's groups, each lane's group, the groups sharing a link with each, whether its
    hops' depths differ (else staggering changes nothing) and its lanes' atoms (the lanes of
    one slice)."""
    groups, group_of = _groups(plan.builder)
    sharing = _sharing(plan.builder, len(groups), group_of)
    cuts = _atom_cuts(plan.builder.lanes, problem.tp)
    atoms = sum(len(atoms_of(lane, cuts)) for lane in plan.builder.lanes)
    return groups, group_of, sharing, len(set(_depths(groups))) > 1, max(1, atoms)


def _pattern_ready(
    problem: Problem, plan: Built, phases: int, staggered: bool, shape: _Shape
) -> SlicedTimes | None:
    groups, group_of, sharing, _, _ = shape
    offsets = _depths(groups) if staggered else [0] * len(groups)
    cuts = _atom_cuts(plan.builder.lanes, problem.tp)
    return sliced_ready(problem, plan, phases, (groups, group_of, offsets, sharing), cuts)
