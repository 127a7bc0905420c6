"""The Pareto merge the relaxation's dynamic programs share: of states ordered by O's free
time, keep those that cost less than every state before them.

A state that frees O no sooner and costs no less than another cannot complete lower, so each
program merges its states to that staircase: :mod:`.dp` (FIFO) on (O free time, cost),
:mod:`.subsets` per set of batches (on ``cost - free`` under its capacity conditions), and
:mod:`.lagrange`'s priced program, which orders equal free times as they come (both may stay)
and then adds its own delay dominance. Each orders its states itself; this is the step after.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

__all__ = ["staircase"]


def staircase(rank: np.ndarray, sets: np.ndarray | None = None) -> NDArray[np.bool_]:
    """Whether each state is on its set's front: the first of its set, or ``rank`` (its cost,
    the states ordered by O free time within each set) strictly below every earlier state's
    of its set. ``sets``: each state's set, a set's states adjacent (None: all one set)."""
    keep = np.ones(rank.size, dtype=bool)
    if sets is None:
        keep[1:] = rank[1:] < np.minimum.accumulate(rank)[:-1]
        return keep
    if not rank.size:
        return keep
    before = np.full(rank.size, math.inf)  # least rank earlier in the same set
    before[1:] = np.where(sets[1:] == sets[:-1], rank[:-1], math.inf)
    starts = np.flatnonzero(np.r_[True, sets[1:] != sets[:-1], True])
    longest = int(np.diff(starts).max())
    shift = 1
    while shift < longest:  # a segmented running minimum, by doubling
        same = sets[shift:] == sets[:-shift]
        before[shift:] = np.where(same, np.minimum(before[shift:], before[:-shift]), before[shift:])
        shift *= 2
    keep = rank < before
    keep[starts[:-1]] = True
    return keep
