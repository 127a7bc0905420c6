"""One device's buffers in a program run, and which bytes of each are there since when.

:class:`Coverage` keeps the byte ranges of one unit's buffer that are present, each with the time
it arrived, disjoint and sorted (a range that overlaps what is there merges with it and counts
its overlap as duplicate bytes: a correct program has none). :class:`DeviceStore` holds one
buffer per unit and one Coverage each, under one condition variable: the sending threads wait
for the bytes of their next chunk, the receiving threads add what arrived, and a failure in any
thread wakes every waiter with it.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

import torch

from blitzplan.executor.faults import Failure
from blitzplan.executor.waiting import WaitingStore

__all__ = ["Coverage", "DeviceStore"]


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


class DeviceStore(WaitingStore):
    """A device's buffer of every unit (``sizes`` bytes each, zeroed) on ``device``."""

    def __init__(self, sizes: Sequence[int], device: torch.device) -> None:
        super().__init__()
        self.buffers = [torch.zeros(n, dtype=torch.uint8, device=device) for n in sizes]
        self.coverage = [Coverage(n) for n in sizes]

    def fill(self, unit: int, lo: int, data: torch.Tensor, at_s: float = 0.0) -> None:
        """Bytes ``[lo, lo + len(data))`` of ``unit`` are ``data``, here since ``at_s``."""
        self.buffers[unit][lo : lo + data.numel()].copy_(data)
        self.arrived(unit, lo, lo + data.numel(), at_s)

    def arrived(self, unit: int, lo: int, hi: int, at_s: float) -> bool:
        """Bytes ``[lo, hi)`` of ``unit`` are here; True when that completes the unit."""
        with self._cond:
            done = self.coverage[unit].add(lo, hi, at_s)
            self._cond.notify_all()
            return done

    def wait_range(self, unit: int, lo: int, hi: int, timeout_s: float) -> float:
        """When bytes ``[lo, hi)`` of ``unit`` were all here; waits for them (or raises)."""
        late = Failure(f"timed out waiting for bytes [{lo}, {hi}) of unit {unit}", unit)
        return self._wait(lambda: self.coverage[unit].since(lo, hi), timeout_s, late)

    def complete_s(self, unit: int) -> float:
        done = self.coverage[unit].complete_s
        return math.nan if done is None else done

    @property
    def duplicate_bytes(self) -> int:
        return sum(c.duplicate_bytes for c in self.coverage)
