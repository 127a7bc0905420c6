"""What the executor's two byte stores share (the planner-object path's :mod:`.transfer` and the
ScalePlan path's :mod:`.program_store`): cutting ranges into chunks, and waiting for bytes until
they are there, the worker failed, or a deadline passed."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable

from blitzplan.executor.faults import Failure, TransferError

__all__ = ["WaitingStore", "equal_chunks"]


def equal_chunks(lo: int, hi: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut into ``ceil(bytes / chunk_bytes)`` chunks of equal size (to a byte).

    Equal rather than full chunks and a remainder: a tiny last chunk right behind a full one
    waits on TCP's small-segment rule (Nagle's algorithm, which gloo leaves on) for the previous
    one's acknowledgement, milliseconds on loopback."""
    size = hi - lo
    if size <= 0:
        return []
    count = -(-size // chunk_bytes)
    edges = [lo + size * k // count for k in range(count + 1)]
    return list(itertools.pairwise(edges))


class WaitingStore:
    """A worker's store that its threads wait on: the first failure is kept and raised to every
    waiter; a subclass notifies (``with self._cond: ... notify_all()``) when bytes arrive."""

    def __init__(self) -> None:
        self.error: TransferError | None = None
        self._cond = threading.Condition()

    def fail(self, error: TransferError) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            self._cond.notify_all()

    def _wait(self, ready: Callable[[], float | None], timeout_s: float, late: Failure) -> float:
        """``ready()`` (called under the lock) once it is not None; the store's failure, or
        ``late`` after ``timeout_s``, raised instead."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (value := ready()) is None:
                if self.error is not None:
                    raise self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferError(late)
                self._cond.wait(left)
            return value
