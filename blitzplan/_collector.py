"""Python's cyclic garbage collector held back while a hot loop makes many short-lived objects.

A full pass walks every live object; a large export being read (~10^5 records, none in a cycle)
or a simulated hour (~10^6 events over ~10^5 live requests) would trigger thousands of them.
Both context managers restore the collector's previous setting on exit, also on an error.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

RELAXED_THRESHOLDS = (50_000, 20, 20)
"""While relaxed: allocations between young passes, and young (then middle) passes between
middle (then full) ones; CPython's defaults are (700, 10, 10)."""


class collector_paused:  # lower case: used like the function it was
    """No collection at all inside; the pass its allocations earn runs after it, at the caller's
    next allocation. A class, not a generator: a generator's exit allocates (and may collect)
    after the collector is back on, still inside."""

    def __enter__(self) -> None:
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            gc.enable()


@contextlib.contextmanager
def collector_relaxed() -> Iterator[None]:
    """Collections RELAXED_THRESHOLDS apart inside, never more often than before (cycles are
    still collected, rarely); for long runs whose objects may form cycles."""
    before = gc.get_threshold()
    gc.set_threshold(*(max(b, r) for b, r in zip(before, RELAXED_THRESHOLDS, strict=True)))
    try:
        yield
    finally:
        gc.set_threshold(*before)
