"""The counted-time cost model of the subset program (:mod:`blitzplan.live.bound.subsets`).

Under a :class:`~blitzplan.live.work_meter.WorkMeter` the program counts, for every chunk of
states it bounds and expands and for every merge, these estimated seconds instead of reading
the clock, so it does the same work on every run however loaded the machine is.
"""

from __future__ import annotations

import numpy as np

from blitzplan.live.work_meter import Clock

__all__ = [
    "CHUNK_S_PER_BATCH",
    "MEASURED_MERGE_STATES",
    "MERGE_S_FIXED",
    "MERGE_S_PER_DISTINCT",
    "MERGE_S_PER_STATE",
    "STATE_S_PER_BATCH",
    "count_chunk",
    "distinct_share",
    "merge_s",
]

MEASURED_MERGE_STATES = 1_000
"""Merges of at least this many states set the time per state the next merge is judged by
(smaller ones are mostly fixed costs)."""

CHUNK_S_PER_BATCH = 2.4e-5
"""A chunk's counted seconds per batch of the instance, whatever its size (numpy calls per
batch). This and the following were least-squares fitted to thread CPU time per chunk and per
merge on 43 pairs (``benchmarks/partition.py``'s five classes, seeds 0-4, free order, and 18
paper pairs of equal and mixed queues; load 6): the pairs' CPU per counted second of the
relaxation 0.51-0.89 before, 0.87-1.35 after (above 1.1 only on pairs the search completes in
under 30 ms)."""

STATE_S_PER_BATCH = 3.5e-8
"""A chunk's (or an open state's bound's) counted seconds per state and batch."""

MERGE_S_PER_STATE = 6.6e-8
"""A merge's counted seconds per state merged, whatever their costs."""

MERGE_S_PER_DISTINCT = 1.6e-7
"""A merge's counted seconds per state merged, times the share of distinct costs among them
(:func:`distinct_share`): the sort is most of a merge, and equal costs sort at once. On equal
batches every state of a level has the same cost (16 equal 512-token batches: 40-70 ns a
state, counted 250 ns before), on the benchmark's classes all differ (180-380 ns)."""

MERGE_S_FIXED = 4.3e-5
"""A merge's counted seconds whatever its size."""

DISTINCT_SAMPLE = 1_000
"""The states :func:`distinct_share` samples."""


def merge_s(grown: list[dict[str, np.ndarray]], size: int) -> float:
    """A merge's counted seconds (:data:`MERGE_S_FIXED`, :data:`MERGE_S_PER_STATE`,
    :data:`MERGE_S_PER_DISTINCT`)."""
    return MERGE_S_FIXED + size * (MERGE_S_PER_STATE + MERGE_S_PER_DISTINCT * distinct_share(grown))


def distinct_share(grown: list[dict[str, np.ndarray]]) -> float:
    """The share of distinct costs among up to :data:`DISTINCT_SAMPLE` of the states to merge,
    taken evenly through them (the same on every run): what their sort costs depends on it."""
    cost = np.concatenate([part["cost"] for part in grown])
    sample = cost[:: max(1, cost.size // DISTINCT_SAMPLE)]
    return float(np.unique(sample).size / sample.size)


def count_chunk(clock: Clock, batches: int, states: int) -> None:
    """Count a chunk of ``states`` states on ``clock``."""
    clock.spend(batches * (CHUNK_S_PER_BATCH + STATE_S_PER_BATCH * states))
