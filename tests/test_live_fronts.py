"""The Pareto merge the relaxation's programs share
(:func:`~blitzplan.live.bound.fronts.staircase`) against a plain loop."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from blitzplan.live.bound.fronts import staircase

RANKS = st.sampled_from([0.0, 0.5, 1.0, 2.0, 2.0, -math.inf, math.inf])


def _plain(rows: list[tuple[int, float]]) -> list[bool]:
    """Each row kept when it is its set's first or below every rank before it in its set."""
    least: dict[int, float] = {}
    kept = []
    for group, rank in rows:
        kept.append(group not in least or rank < least[group])
        least[group] = min(least.get(group, rank), rank)
    return kept


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 3), RANKS), max_size=40))
def test_the_staircase_keeps_each_sets_first_and_every_new_least(
    rows: list[tuple[int, float]],
) -> None:
    """Property: with sets (adjacent) and as one set, a state stays when it is the first of its
    set or strictly below every earlier state of its set (an infinite first state too)."""
    rows.sort(key=lambda row: row[0])  # stable: each set's order kept
    rank = np.asarray([r for _, r in rows], dtype=float)
    sets = np.asarray([g for g, _ in rows], dtype=np.int64)
    assert staircase(rank, sets).tolist() == _plain(rows)
    assert staircase(rank).tolist() == _plain([(0, r) for _, r in rows])
