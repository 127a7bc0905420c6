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


class TickingClock(StillClock):
    """A :class:`StillClock` that moves on by ``tick_s`` at every read of ``perf_counter`` (the
    clock deadlines are read on) and counts the reads, those past ``deadline_s`` apart: how
    promptly code stops once the clock says its time is up, whatever the machine's speed."""

    def __init__(self, now: float = 100.0, tick_s: float = 1e-3) -> None:
        super().__init__(now)
        self.tick_s = tick_s
        self.reads = 0
        self.deadline_s = float("inf")
        self.reads_past = 0
        """Reads that returned a time past ``deadline_s``."""

    def perf_counter(self) -> float:
        self.now += self.tick_s
        self.reads += 1
        if self.now > self.deadline_s:
            self.reads_past += 1
        return self.now
