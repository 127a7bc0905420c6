"""Python's cyclic garbage collector held back while a hot loop makes many short-lived objects.

A full pass walks every live object; a large export being read (~10^5 records, none in a cycle)
or a simulated hour (~10^6 events over ~10^5 live requests) would trigger thousands of them.
Each context manager restores the collector's previous state on exit, also on an error; the
last keeps a solve's deadline from paying for full passes over the objects from before it.
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


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    """Keep the objects that exist when the block starts out of the cyclic collector's passes
    until it ends (:func:`gc.freeze`, then :func:`gc.unfreeze`), unless some are frozen
    already (the caller's: left as they are). A full pass walks every object of the process,
    and under load one took 0.4-0.57 s of wall time (33 ms of CPU; the process's modules and
    data most of it) in the middle of a solve, past its limit; frozen, the same passes took at
    most 2 ms of CPU."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
