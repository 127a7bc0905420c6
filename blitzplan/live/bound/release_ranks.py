"""Release-aware order statistics of the batches left on N: the ``m`` that complete first ran
all their work on N, one operation at a time, each batch from its release on.

The capacity conditions (:meth:`~blitzplan.live.bound.conditions.Capacity.left_on_new`) bound
the ``m``-th completion ``c_m`` of the batches left on N (the set ``F``) by ``a_l`` plus the
``m`` smallest works from layer ``l`` on, and by the ``m``-th smallest alone end. The ``m``
smallest works may belong to batches released late: on (80,16) FIFO seed 8 of
``benchmarks/partition.py`` the root program's cheapest states leave on N early long batches
(released at 0) and late short ones (released at 2.53, 2.59 and 3.01 s), and the order
statistics count the late ones' small works from ``a_1``.

*The bound.* Let ``S`` be the ``m`` batches of ``F`` that complete first. N ran all their
layers by ``c_m``, one operation at a time, and no layer of batch ``i`` before ``q_i``, the
start of its alone chain's first layer (its release, the first arrival, a node's start
limits). So ``c_m`` is at least the least makespan of one machine running the jobs ``(q_i,
L pN_i)`` of ``S`` (preemption does not lower a makespan), which is what serving them in
order of ``q`` gives: ``t <- max(t, q_i) + L pN_i``. ``S`` is not known: ``c_m`` is at least
the least of that makespan over every ``m`` batches of ``F``, which a dynamic program over
the batches in order of ``q`` gives exactly (its state, the count chosen, keeps the least
``t``: the step does not fall as ``t`` grows). Each bound on ``c_m`` is valid alone, so the
largest of these and the other order statistics counts.

*Where it counts.* Only on the capacity program's complete states still under the best known
(:meth:`~blitzplan.live.bound.subset_table._Table.done`, either O order), as what the raised order
statistics add to the program's sum (:func:`~blitzplan.live.bound.ranks.release_gain`), and in
the ends the rank and deadline terms lift (:func:`lifted`; their terms then include that
gain): the program's own order statistics, its crowding term and the busy bound keep the plain
ones (a term measured against a raised last completion would charge less). On (80,16) FIFO
seed 8 the root capacity bound rises from 0.9055 to 0.9192 of the 10 s incumbent; the nine
other seeds' roots and (80,8)'s are unchanged (their cheap states leave early batches on N).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity
    from blitzplan.live.bound.relaxation import Relaxation

__all__ = ["RELEASES", "RELEASES_MAX_LEFT", "Releases", "lifted"]

RELEASES = True
"""Whether the capacity conditions count the release-aware order statistics."""

RELEASES_MAX_LEFT = 8
"""States that leave more batches on N do without them (the program completes every state it
holds, most of them with many batches left and far above the best known; on (80,16) FIFO of
``benchmarks/partition.py`` the root program's cheapest states leave 2-6)."""


class Releases:
    """Per batch, ``q_i`` and its whole work on N, in order of ``q``."""

    def __init__(self, relax: Relaxation) -> None:
        inst = relax.instance
        p_new = np.asarray(inst.new_layer_s, dtype=float)
        first = np.asarray([o.chain_end[1] for o in relax.options])
        self.start = first - p_new
        """Per batch, the start of its alone chain's first layer (``q_i``)."""
        self.work = inst.num_layers * p_new
        self.order = np.argsort(self.start, kind="stable")

    def ends(self, left: np.ndarray) -> np.ndarray:
        """(states x batches): per state (``left``: the batches left on N), in column ``m - 1``
        the least makespan of any ``m`` of them (module docstring), ascending; +inf past
        ``|F|``, and everywhere in states that leave more than :data:`RELEASES_MAX_LEFT`. The
        batches that start first together are the ``m`` least works from that start (what the
        program gives them); the program runs over the others."""
        states, n = left.shape
        out = np.full((states, n), math.inf)
        count = left.sum(axis=1)
        rows = np.flatnonzero((count > 0) & (count <= RELEASES_MAX_LEFT))
        if not rows.size:
            return out
        left = left[rows]
        size = int(count[rows].max())  # the columns that can be finite
        early = self.start <= self.start.min()
        works = np.sort(np.where(left & early[None, :], self.work[None, :], math.inf), axis=1)
        best = np.full((rows.size, size + 1), math.inf)
        best[:, 0] = -math.inf
        best[:, 1:] = self.start.min() + np.cumsum(works[:, :size], axis=1)
        for i in self.order:
            on = left[:, i]
            if early[i] or not on.any():
                continue
            q, p = self.start[i], self.work[i]
            grown = np.maximum(best[:, :-1], q) + p  # one more chosen: i last
            take = np.minimum(best[:, 1:], grown)
            best[:, 1:] = np.where(on[:, None], take, best[:, 1:])
        out[rows, :size] = best[:, 1:]
        return out


def lifted(cap: Capacity, left: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ends`` (per state the order statistics of the batches left on N, ascending, +inf past
    them: :func:`~blitzplan.live.bound.ranks._rank_ends`) raised to the release-aware ones,
    and per state what that adds to their sum (0 without :attr:`Capacity.releases`)."""
    if cap.releases is None:
        return ends, np.zeros(ends.shape[0])
    raised = np.maximum(ends, cap.releases.ends(left))
    finite = np.isfinite(ends)
    gain = (np.where(finite, raised, 0.0) - np.where(finite, ends, 0.0)).sum(axis=1)
    return np.asarray(raised), np.asarray(gain)
