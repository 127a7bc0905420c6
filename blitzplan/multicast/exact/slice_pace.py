"""How long a slicing takes to time and to build, in this run: the slice search's clock.

:class:`~blitzplan.multicast.exact.slice_search.SliceSearch` decides which slicings to time
from their patterns and which to build; :class:`SlicePace` tells it how long each would take,
predicted from what this run measured (each candidate's patterns, the builds so far), so its
steps start only when they end in time and the predictions follow the machine's load.
"""

from __future__ import annotations

from blitzplan.multicast.exact.phase_slices import BuildPace

__all__ = ["BUILD_MARGIN", "SlicePace"]

BUILD_MARGIN = 1.5
"""The time kept for building the fastest slicing: this many times the rate measured (seconds
per lane and slice)."""
_PATTERN_MARGIN = 1.25
"""A pattern's predicted time: this many times its plan's rate measured (a pattern's time
grows with its slices at about one rate per plan; a late pattern only shortens the build,
which stops itself in time)."""
_BUILD_PER_PATTERN = 2.5
"""Before this run built a slicing timed from its pattern, its predicted build time (the lanes
made, the pattern's times put in place, the phases checked, the finished plan's tuples made;
the pattern itself kept from its timing): this many times the time its pattern took in this
run, so the prediction follows the machine's load. Measured on a 2-core x86_64: 1.2-3.5,
median 2, on 68 k-lane slicings at load 2-5 before the plan's tuples were made in the build;
1.6-3.0, median 2.1, with them, on 6-29 k lanes at load 5-6. Each build measures the ratio
again (the first replaces this, the largest so far is used) and stops as soon as its own
pace says it would not end by its deadline
(:func:`~blitzplan.multicast.exact.phase_slices.sliced_until`)."""
_UNTIMED_PRIOR_S = 50e-6
"""The same for a slicing the pattern could not time (built and evaluated lane by lane)."""


class SlicePace:
    """The times measured in one slice search and the predictions made from them: per
    candidate plan its patterns' sizes (lanes times slices) and seconds, a timed slicing's
    build per its pattern's time, an untimed one's per lane and slice, and a build's parts
    after its lanes (``build``, :class:`~blitzplan.multicast.exact.phase_slices.BuildPace`)."""

    def __init__(self) -> None:
        self.pattern_rate: dict[int, float] = {}  # per candidate: its largest pattern's rate
        self.sizes: dict[int, list[tuple[int, float]]] = {}  # ... its patterns' sizes, seconds
        self.untimed_rate = _UNTIMED_PRIOR_S  # a build of an untimed slicing per lane-slice
        self.per_pattern = _BUILD_PER_PATTERN  # a timed slicing's build per its pattern's time
        self.measured_build = False  # whether a timed slicing was built (its ratio measured)
        self.build = BuildPace()  # a build's parts after its lanes, as measured in this run

    def any_pattern(self) -> bool:
        """Whether a pattern was timed (until then, none predicts the others)."""
        return bool(self.pattern_rate)

    def pattern_s(self, j: int, size: int, margin: float = _PATTERN_MARGIN) -> float:
        """Plan ``j``'s pattern of ``size`` lanes and slices, ``margin`` times: beyond its
        largest pattern, that one's time and the growth per lane-slice from the one before
        (a pattern's time is a fixed part per plan and a part per slice), else that rate; a
        plan without a pattern timed, at the slowest plan's rate."""
        points = sorted(self.sizes.get(j, []))
        if not points:
            return margin * max(self.pattern_rate.values(), default=0.0) * size
        last, took = points[-1]
        if size <= last or len(points) < 2 or points[-2][0] >= last or points[-2][1] >= took:
            return margin * took * size / last
        growth = (took - points[-2][1]) / (last - points[-2][0])
        return margin * (took + growth * (size - last))

    def pattern_took(self, j: int, size: int, took: float) -> None:
        """Plan ``j``'s pattern of ``size`` lanes and slices took ``took`` seconds."""
        self.sizes.setdefault(j, []).append((size, took))
        if size >= max(self.sizes[j])[0]:
            self.pattern_rate[j] = took / size

    def build_s(self, pattern_s: float) -> float:
        """A timed slicing's build whose pattern took ``pattern_s``."""
        return self.per_pattern * pattern_s

    def untimed_s(self, size: int) -> float:
        """An untimed slicing's build of ``size`` lanes and slices."""
        return self.untimed_rate * size

    def built(self, took: float, pattern_s: float) -> None:
        """A timed slicing whose pattern took ``pattern_s`` was built in ``took``: the first
        measured replaces the prior, later ones only raise it."""
        if self.measured_build:
            self.per_pattern = max(self.per_pattern, took / pattern_s)
        else:
            self.per_pattern, self.measured_build = took / pattern_s, True

    def built_untimed(self, took: float, size: int) -> None:
        """An untimed slicing of ``size`` lanes and slices was built, or cut short, in ``took``
        (then its time is a floor of its rate)."""
        self.untimed_rate = max(self.untimed_rate, took / size)
