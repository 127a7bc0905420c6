"""Which bytes of a device's buffers are there since when (overlaps count as duplicates)."""

from __future__ import annotations

import bisect
import itertools
import math
import threading
from collections.abc import Sequence

from blitzplan.executor.runtime.failures import Failure, TransferError


def equal_chunks(lo: int, hi: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into ``ceil(bytes / chunk_bytes)`` chunks of equal size (to a byte): a
    tiny last chunk right behind a full one would wait on TCP's small-segment rule (Nagle's
    algorithm, which gloo leaves on) for the previous one's acknowledgement."""
    size = hi - lo
    count = max(0, -(-size // chunk_bytes))
    return list(itertools.pairwise(lo + size * k // max(count, 1) for k in range(count + 1)))


class Coverage:
    """The present byte ranges of one buffer of ``size`` bytes, with their arrival times."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.present_bytes = 0
        self.duplicate_bytes = 0
        self.complete_s: float | None = None
        self._lows: list[int] = []
        self._pieces: list[tuple[int, int, float]] = []

    def add(self, lo: int, hi: int, at_s: float) -> bool:
        """Bytes ``[lo, hi)`` are here at ``at_s``; True when that completes the buffer."""
        k = max(0, bisect.bisect_right(self._lows, lo) - 1)
        end = k
        merged = (lo, hi, at_s)
        while end < len(self._pieces) and self._pieces[end][0] < hi:
            a, b, t = self._pieces[end]
            if b > lo:  # overlaps: merge it
                self.duplicate_bytes += min(b, hi) - max(a, lo)
                self.present_bytes -= b - a
                merged = (min(a, merged[0]), max(b, merged[1]), max(t, merged[2]))
                del self._pieces[end], self._lows[end]
            else:
                end += 1
        self._pieces.insert(end, merged)
        self._lows.insert(end, merged[0])
        self.present_bytes += merged[1] - merged[0]
        if self.complete_s is None and self.present_bytes >= self.size:
            self.complete_s = at_s
            return True
        return False

    def since(self, lo: int, hi: int) -> float | None:
        """When every byte of ``[lo, hi)`` was here (None while one is missing)."""
        k = max(0, bisect.bisect_right(self._lows, lo) - 1)
        at, latest = lo, -math.inf
        for a, b, t in itertools.islice(self._pieces, k, None):
            if a > at:
                return None
            if b > at:
                at, latest = b, max(latest, t)
            if at >= hi:
                return latest
        return None


class ByteStore:
    """A device's Coverage of every unit (``sizes`` bytes each), written by its loop; another
    thread (live serving's compute) may wait for a whole unit, or the loop's failure."""

    def __init__(self, sizes: Sequence[int]) -> None:
        self.coverage = [Coverage(n) for n in sizes]
        self.whole = [threading.Event() for _ in sizes]
        self.error: TransferError | None = None

    def fail(self, error: TransferError) -> None:
        """Keep the first failure and wake every waiter with it."""
        self.error = self.error or error
        for event in self.whole:
            event.set()

    def arrived(self, unit: int, lo: int, hi: int, at_s: float) -> bool:
        """Bytes ``[lo, hi)`` of ``unit`` are here; True when that completes the unit."""
        done = self.coverage[unit].add(lo, hi, at_s)
        if done:
            self.whole[unit].set()
        return done

    def wait_unit(self, unit: int, timeout_s: float) -> None:
        """Wait until every byte of ``unit`` is here; raise the loop's failure or a timeout."""
        if not self.whole[unit].wait(timeout_s):
            raise TransferError(Failure(f"timed out waiting for unit {unit}", unit))
        if self.coverage[unit].complete_s is None and self.error is not None:
            raise self.error

    def complete_s(self, unit: int) -> float:
        done = self.coverage[unit].complete_s
        return math.nan if done is None else done
