"""Which plan to cut into time slices, and into how many: the exact method's last step.

Every candidate plan (of one phase, its hops waiting for none) is cut into :data:`SLICES`
plain and :data:`STAGGERED_SLICES` staggered slices (plans of few atoms also
:data:`FINE_SLICES`, while none is within :data:`FINE_ABOVE` of the bound), by
:func:`~blitzplan.multicast.exact.phase_slices.slice_phases`, each count on every candidate
before the next count: the plan that times fastest in one phase is
often not the one that slices best. Staggered by sender and by lane depth
(:mod:`~blitzplan.multicast.exact.slice_layout`) are both timed at the smallest staggered
count, and the faster is the plan's staggering past it. Each slicing is first timed from its pattern
(:func:`~blitzplan.multicast.exact.slice_timing.sliced_ready`: the full plan's ready times
without building it, in a fraction of the time); only the fastest is then built and evaluated
in full (the next fastest if its phases meet on a link), and the slicings the pattern cannot
time are built in full after it, as time allows. :class:`SliceSearch` does this in two calls,
so the exact method can time the slicings of the plans it has before its search and leave the
search's time to building the fastest of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from blitzplan._collector import collector_paused
from blitzplan.errors import InvalidInputError
from blitzplan.multicast.exact.phase_slices import Late, deadline_check, sliced_until
from blitzplan.multicast.exact.slice_fit import (
    FINE_ABOVE,
    FINE_MAX_LANES,
    FINE_SLICES,
    FINE_STEP,
    fine_count,
)
from blitzplan.multicast.exact.slice_layout import Shape, pattern_ready, plan_shape
from blitzplan.multicast.exact.slice_pace import BUILD_MARGIN, SlicePace
from blitzplan.multicast.exact.slice_timing import SlicedTimes
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, score

__all__ = [
    "SLICES",
    "STAGGERED_SLICES",
    "SliceSearch",
    "sliced_refinement",
]

SLICES = (4, 8, 16, 32)
"""The plain slice counts tried, in turn."""
STAGGERED_SLICES = (64, 128, 256)
"""The staggered slice counts tried then (a hop ``d`` deep ends ``d`` slices later, so
staggering pays only once slices are thin: 16 and 32 were rarely the fastest), for one count
the plan fastest so far first. Those of the leading plan left for lack of time are timed
after the search, the most slices first (:meth:`SliceSearch.time`)."""
SLICE_WITHIN = 1.3
"""A plan's slicings are timed only within this factor of the fastest plan or slicing timed:
slicing takes off per-hop lag (at most case 60's 1.158 -> 1.005), not a slow route (case
193's packing, 2.0x the greedy's 64 slices, took 1.1 s of slicings none under 2.4x)."""
_BETTER = 1 - 1e-9
"""A slicing replaces a plan when it is faster by more than float noise."""
_Key = tuple[int, int, int]  # (slices, staggered: 0, BY_LANE or BY_SENDER, candidate)
_KEPT = 3
"""The times of this many of the fastest slicings timed are kept for their builds (the
fallbacks of the fastest too: its phases may meet, its build may not fit)."""


def _first(item: tuple[float, _Key, SlicedTimes]) -> float:
    return item[0]


class SliceSearch:
    """Slicings of candidate plans timed from their patterns (:meth:`time`), then the fastest
    built in full (:meth:`best`). A pattern is timed only when, at its predicted time
    (:class:`~blitzplan.multicast.exact.slice_pace.SlicePace`: its plan's rate measured on its
    largest pattern so far, the slowest of any plan before its first, with a margin), it ends
    by the deadline given with time left to build the fastest slicing timed so far; that
    slicing is the one to build only when its predicted build (with
    :data:`~blitzplan.multicast.exact.slice_pace.BUILD_MARGIN`) ends by the build deadline. A
    build starts when it would end by its deadline at the rate measured, and stops once its
    own pace says it would not."""

    def __init__(self, problem: Problem, objective: str, *, bound_s: float = 0.0) -> None:
        self.problem, self.objective = problem, objective
        self.fine_above = (1 + FINE_ABOVE) * bound_s  # fine slices only while none is this fast
        self.bound_s = bound_s
        self.plans: list[Built] = []
        self.shapes: list[Shape] = []
        self.timed: list[tuple[float, int, int, int]] = []
        self.untimed: list[_Key] = []  # slicings the pattern could not time
        self.target = math.inf  # the fastest timed slicing that could be built in time
        self.reserve_s = 0.0  # ... its predicted time to build in full
        self.pattern_s = 0.0  # the time spent timing patterns
        self.pace = SlicePace()  # how long patterns and builds take in this run
        self.took: dict[_Key, float] = {}  # each timed slicing's pattern's seconds
        self.kept: list[tuple[float, _Key, SlicedTimes]] = []  # the fastest timed's times
        self.pending: list[_Key] = []  # slicings not timed for lack of time: tried again
        self.build_by: float | None = None  # the last call's build deadline

    def raise_bound(self, bound_s: float) -> None:
        """The bound given, raised (512 slices then stop sooner, :meth:`_tried`)."""
        self.fine_above = max(self.fine_above, (1 + FINE_ABOVE) * bound_s)
        self.bound_s = max(self.bound_s, bound_s)

    def needed_s(self) -> float:
        """The time to keep for what is left: building the fastest slicing timed, or timing
        the most sliced of the leading plan's (whose own or sliced time is the fastest so far)
        slicings waiting for time that fits by the last call's build deadline and building it,
        predicted without margins (each step is checked again, and a build stops itself, when
        it comes)."""
        lead = self._leader()
        for m, _, j in sorted(
            (key for key in self.pending if key[2] == lead and key[1]), reverse=True
        ):
            m = (self._fine_count(j) or m) if m > STAGGERED_SLICES[-1] else m
            pattern = self.pace.pattern_s(j, self.shapes[j][1] * m, 1.0)
            needed = pattern + max(self.reserve_s, self.pace.build_s(pattern))
            if _fits(needed, self.build_by):
                return needed
        return self.reserve_s

    def time(
        self,
        candidates: Sequence[Built],
        deadline: float | None,
        build_by: float | None = None,
        *,
        staggered_first: bool = False,
        leader_only: bool = False,
    ) -> None:
        """Add ``candidates`` (those of one phase whose hops wait for none, and not timed as
        one added before) and time their slicings from their patterns by ``deadline`` (a
        :func:`time.perf_counter` value), counting on building the fastest by ``build_by``
        (None: ``deadline``). The slicings an earlier call had no time for come first, the
        most slices first (at one count, the plan's staggering, :meth:`_staggering`, first),
        when they are the leading plan's staggered ones (:meth:`needed_s`), last otherwise.
        ``staggered_first``: the new plans' plain slicings after their staggered ones, but for
        the two fewest, still first (a plan's first pattern is timed unpredicted, and a
        staggered one of thousands of atoms can take seconds; those two predict the rest, a
        fixed part and a part per slice: from the fewest alone, case 193's 64 by lane depth
        was predicted at 1.8 s and waited, and took 0.51 s when timed later). The
        exact method's first call, on the greedy's plan alone in a short window: its staggered
        slicings are the ones that get near the bound (case 193's 64 by lane depth 1.0475
        against 1.1005 at 32 plain). ``leader_only``: only the leading plan's waiting staggered
        slicings, the others left waiting (the exact method's call before its search when the
        leader is near the bound, with no ``candidates``)."""
        build_by = deadline if build_by is None else build_by
        self.build_by = build_by
        added = len(self.plans)
        for plan in candidates:
            b = plan.builder
            if any(p != 0 for p in b.flow_phase) or any(spec[4] for spec in b.hop_specs):
                continue
            v = self._value(plan)
            if any(abs(v - self._value(o)) <= 1e-12 * v for o in self.plans):
                continue
            self.plans.append(plan)
            self.shapes.append(plan_shape(self.problem, plan))
            self.target = min(self.target, v)
        new = [j for j in range(added, len(self.plans)) if self._sliceable(j)]
        began = time.perf_counter()
        lead, waiting, self.pending = self._leader(), self.pending, []
        first = sorted(  # the most slices first, the plan's staggering first at a count
            (key for key in waiting if key[2] == lead and key[1]),
            key=lambda key: (key[0], key[1] == self._staggering(lead)),
            reverse=True,
        )
        self._patterns(first, deadline, build_by)
        if leader_only:  # the rest wait for the next call (the new plans' too)
            self.pending += [key for key in waiting if key not in first]
            self.pattern_s += time.perf_counter() - began
            return
        plain = [(m, False, j) for m in SLICES for j in new]
        if staggered_first:  # the two fewest plain slices still first: the pace of the rest
            self._patterns(plain[: 2 * len(new)], deadline, build_by)
            del plain[: 2 * len(new)]
        else:
            self._patterns(plain, deadline, build_by)
        fastest = {j: self._value(self.plans[j]) for j in new}  # each plan's, sliced or not
        for v, _, _, j in self.timed:
            fastest[j] = min(fastest.get(j, v), v)
        ranked = sorted(new, key=fastest.__getitem__)
        smallest, *more = STAGGERED_SLICES
        both = [(smallest, by, j) for j in ranked for by in self.shapes[j][0] if by]
        self._patterns(both, deadline, build_by)
        chosen = [(m, self._staggering(j), j) for m in more for j in ranked]
        self._patterns([key for key in chosen if key[1]], deadline, build_by)
        fine = [(FINE_SLICES, self._staggering(j), j) for j in ranked]  # counts when timed
        self._patterns([key for key in fine if key[1] and self._tried(key)], deadline, build_by)
        if staggered_first:
            self._patterns(plain, deadline, build_by)
        self._patterns([key for key in waiting if key not in first], deadline, build_by)
        self.pattern_s += time.perf_counter() - began

    def _sliceable(self, j: int) -> bool:
        """Whether plan ``j`` is within :data:`SLICE_WITHIN` of the fastest plan or slicing
        timed so far (its slicings are timed only then)."""
        return self._value(self.plans[j]) <= SLICE_WITHIN * self.target

    def _staggering(self, j: int) -> int:
        """Plan ``j``'s staggering past the smallest staggered count: the faster of its two
        timed at that count (they order its lanes differently, and which slices faster is
        the plan's: case 76's search plan 1.0806 by lane depth against 1.097 by sender at 64
        slices), else :func:`staggering`'s (0: no staggered layout)."""
        keys = [by for by in self.shapes[j][0] if by]
        smallest = STAGGERED_SLICES[0]
        timed = [(v, by) for v, m, by, i in self.timed if i == j and m == smallest and by]
        return min(timed)[1] if timed else (keys[0] if keys else 0)

    def _tried(self, key: _Key) -> bool:
        """Whether slicing ``key`` is tried: every count up to :data:`STAGGERED_SLICES`'s last,
        :data:`FINE_SLICES` (:meth:`_fine_count`) only up to :data:`FINE_MAX_LANES` lanes while no
        plan, nor slicing timed whose build was predicted to fit (``target``), is within
        :data:`FINE_ABOVE` of the bound given (checked again as each is timed,
        :meth:`_patterns`: after every plan's 256 slices)."""
        if key[0] <= STAGGERED_SLICES[-1]:
            return True
        count = self._fine_count(key[2])
        lanes = self.shapes[key[2]][1] * (
            FINE_STEP + STAGGERED_SLICES[-1] if count is None else count
        )
        return lanes <= FINE_MAX_LANES and self.target > self.fine_above

    def _fine_count(self, j: int) -> int | None:
        """Plan ``j``'s fine slice count: :data:`FINE_SLICES`, or with a bound given the fewest
        its 128 and 256 slices (its staggering's) predict near it (:func:`fine_count`; None
        while those are not both timed)."""
        by = self._staggering(j)
        if self.bound_s <= 0:
            return FINE_SLICES
        at = {m: v for v, m, b, i in self.timed if i == j and b == by}
        return fine_count(at, self.bound_s, STAGGERED_SLICES[-2:], FINE_SLICES)

    def _leader(self) -> int:
        """The plan whose own time or a timed slicing's is the fastest so far (-1: none)."""
        values = [(self._value(p), j) for j, p in enumerate(self.plans)]
        values += [(v, j) for v, _, _, j in self.timed]
        return min(values, default=(0.0, -1))[1]

    def _patterns(
        self, trials: Sequence[_Key], deadline: float | None, build_by: float | None
    ) -> None:
        """Each slicing of ``trials`` timed from its pattern when it fits (:meth:`time`). Until
        a pattern has been timed, none predicts the others: only the fewest plain slices are
        tried then (case 193's first call at load 11 had no time, and its second began with
        256 staggered slices, unpredicted: 5.4 s past a 0.28 s window). A fine slicing
        (past :data:`STAGGERED_SLICES`) takes its plan's count (:meth:`_fine_count`) when it
        comes, after the coarse ones of these trials when that needs them."""
        unfit: list[_Key] = []  # fine slicings whose plan's count needs its coarse ones
        for phases, staggered, j in trials:
            if not self._tried((phases, staggered, j)):  # a fine slicing no longer needed
                continue
            if phases > STAGGERED_SLICES[-1]:
                count = self._fine_count(j)
                if count is None:
                    unfit.append((phases, staggered, j))
                    continue
                phases = count
            if not self.pace.any_pattern() and (phases, staggered) != (SLICES[0], False):
                self.pending.append((phases, staggered, j))
                continue
            size = self.shapes[j][1] * phases
            predicted = self.pace.pattern_s(j, size)
            kept = max(self.reserve_s, self.pace.build_s(predicted))  # the target's or its own
            if not (_fits(predicted, deadline) and _fits(predicted + kept, build_by)):
                self.pending.append((phases, staggered, j))
                continue
            start = time.perf_counter()
            try:
                found = pattern_ready(
                    self.problem, self.plans[j], phases, staggered, self.shapes[j], _check(deadline)
                )
            except Late:  # the load rose: past the deadline, none of the rest fits either
                self.pending.append((phases, staggered, j))
                continue
            took = time.perf_counter() - start
            self.pace.pattern_took(j, size, took)
            if found is None:
                self.untimed.append((phases, staggered, j))
                continue
            v = score(self.objective, found.ready_at_s, self.plans[j].live)
            self.timed.append((v, phases, staggered, j))
            self.took[phases, staggered, j] = took
            self.kept = sorted([*self.kept, (v, (phases, staggered, j), found)], key=_first)
            del self.kept[_KEPT:]
            build = self.pace.build_s(took)
            if v < self.target * _BETTER:  # with the margin if it fits, else as predicted
                fitting = [r for r in (BUILD_MARGIN * build, build) if _fits(r, build_by)]
                if fitting:
                    self.target, self.reserve_s = v, fitting[0]
        ready = [key for key in unfit if self._fine_count(key[2]) is not None]
        self.pending += [key for key in unfit if key not in ready]
        if ready:
            self._patterns(ready, deadline, build_by)

    def best(
        self, candidates: Sequence[Built], deadline: float | None, *, untimed: bool = True
    ) -> Built:
        """The fastest of ``candidates`` (the first of the fastest when no slicing beats them)
        and of the slicings timed, built in full by ``deadline``, fastest first, whose phases
        stay apart on every link; then the slicings the pattern could not time, as time
        allows, the fewest slices first (in the order :meth:`time` finds them, plain first, but
        for ``staggered_first``: case 10's greedy plan, whose slicings the pattern cannot time,
        then built 64 staggered slices first and had no time left for its 32 plain, 1.0043);
        ``untimed`` False: not those (a call before the last). A timed slicing built keeps no
        time reserved for it after (:meth:`needed_s`).
        The collector stays paused throughout: one pass over the builds kept after the last
        (0.15-0.6 s of wall at load 8 on case 115), not one after each."""
        with collector_paused():
            best = min(candidates, key=self._value)
            value = self._value(best)
            for v, phases, staggered, j in sorted(self.timed):
                if v >= value * _BETTER:
                    break
                trial = self._full((phases, staggered, j), deadline, timed=True)
                if trial is not None:
                    best, value = trial, self._value(trial)
                    self.reserve_s = 0.0  # built: no time kept for it (a later call's own)
                    break
            for key in sorted(self.untimed if untimed else [], key=_slices_of):  # fewest first
                trial = self._full(key, deadline, timed=False)
                if trial is not None and self._value(trial) < value * _BETTER:
                    best, value = trial, self._value(trial)
            return best

    def _value(self, plan: Built) -> float:
        return score(self.objective, plan.ready_at_s, plan.live)

    def _full(self, key: _Key, deadline: float | None, *, timed: bool) -> Built | None:
        """Slicing ``key`` built and evaluated (``timed``: its times from its pattern, put in
        place), if its phases stay apart on every link (None: no time for it, its waits form
        a cycle, or its phases meet)."""
        phases, staggered, j = key
        size = self.shapes[j][1] * phases
        times = next((found for _, at, found in self.kept if at == key), None)
        if not timed:
            predicted = self.pace.untimed_s(size)
        elif times is None:  # its pattern again, then the build
            predicted = (1 + self.pace.per_pattern) * self.took[key]
        else:
            predicted = self.pace.build_s(self.took[key])
        if not _fits(predicted, deadline):
            return None
        plan, shape = self.plans[j], self.shapes[j]
        try:
            if timed and times is None:
                check = _check(deadline)
                times = pattern_ready(self.problem, plan, phases, staggered, shape, check)
            start = time.perf_counter()
            pace = self.pace.build
            trial = sliced_until(self.problem, plan, phases, staggered, times, deadline, pace)
        except InvalidInputError:  # its waits form a cycle: this slicing cannot run
            return None
        except Late:  # its pattern did not end by the deadline
            return None
        took = time.perf_counter() - start
        if not timed:  # built or cut short (then its time is a floor of its rate)
            self.pace.built_untimed(took, size)
        if trial is None or not timed:  # None: it would not end in time, or its phases meet
            return trial
        self.pace.built(took, self.took[key])
        return trial


def _slices_of(key: _Key) -> int:
    return key[0]


def _check(deadline: float | None) -> Callable[[str], None] | None:
    """A pattern's checkpoint: :class:`~blitzplan.multicast.exact.phase_slices.Late` past
    ``deadline`` (None: no clock)."""
    return None if deadline is None else deadline_check(deadline)


def _fits(seconds: float, deadline: float | None) -> bool:
    """Whether ``seconds`` from now ends by ``deadline`` (None: no clock)."""
    return deadline is None or time.perf_counter() + seconds <= deadline


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
