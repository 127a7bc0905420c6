"""A stand-in for :mod:`time` that the tests move by hand, so that nothing they assert depends
on the wall clock."""

from __future__ import annotations


class StillClock:
    """A stand-in for :mod:`time` whose clocks (``perf_counter``, ``monotonic``,
    ``thread_time``) all read ``now`` and stand still until a test moves it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def thread_time(self) -> float:
        return self.now
