"""The capacity conditions of the subset program (:mod:`blitzplan.live.relaxation_subsets`).

The N-capacity relaxation (:mod:`blitzplan.live.relaxation`) drops N's one-operation-at-a-time
rule. :class:`Capacity` puts part of it back, and O's, as necessary conditions on the
completions of a state of the subset program (O served a set of batches, the rest left on N):
every schedule meets them, so the program's optimum under them is still a lower bound.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from blitzplan.live.relaxation import Relaxation

if TYPE_CHECKING:
    from blitzplan.live.relaxation_subsets import _Table

__all__ = ["CAPACITY_THRESHOLDS", "Capacity"]

CAPACITY_THRESHOLDS = 12
"""Layer arrivals the bound on the batches left on N is taken at (any subset is valid)."""


class Capacity:
    """Necessary conditions on completions that count the capacity of both instances.

    *Shared work.* Let O serve the set ``P`` up to and including batch ``j``, with splits
    ``k``. O has run ``sum (L - k_i) pO_i`` from ``b_O`` by ``C_j``; N has run every layer of
    ``P`` on it (``sum k_i pN_i``) from ``a_1`` before O starts ``j``, which then runs at least
    one layer (``pO_j``). With ``x = sum k_i pO_i`` and ``rho = min pN / pO``:
    ``C_j >= max(a_1 + rho x + pO_j, b_O + sum L pO_i - x)``, so ``C_j`` is at least the least
    over ``x >= 0`` of that maximum.

    *Left on N.* Among the batches ``F`` that finish on N, the ``m``-th to complete has, with
    the ``m - 1`` before it, run layers ``l..L`` on N after ``a_l``: it completes at least
    ``a_l + (L - l + 1)`` times the ``m`` smallest ``pN`` of ``F`` after ``a_l`` (for any
    ``l``), and at least the ``m``-th smallest completion of the batches of ``F`` alone.
    Summed, this bounds their total latency whichever batch completes when.

    *Crowding.* Those two count N's work apart: the batches left on N, and the served batches
    against O. A complete plan also pays for both on N at once: after ``a_l`` N runs the
    layers from ``l`` on of the batches left on N and of the served ones, and the second grow
    as O's last block ends earlier (O runs less of the served work). So either the last batch
    left on N or O's last block ends later than the plan says (:meth:`extra_s`).
    """

    def __init__(self, relax: Relaxation, table: _Table) -> None:
        inst = relax.instance
        L = inst.num_layers
        p_new, p_old = np.asarray(inst.new_layer_s), np.asarray(inst.old_layer_s)
        self.table, self.p_old = table, p_old
        self.a1, self.b_old = inst.usable_s[0], inst.old_free_at_s
        self.ratio = float(np.min(p_new / p_old))
        self.whole, self.p_new, self.layers = L * p_old, p_new, L
        self.handoff = np.asarray(inst.handoff_s)
        grid = sorted({int(x) for x in np.linspace(0, L - 1, CAPACITY_THRESHOLDS)})
        self.arrivals = [(inst.usable_s[j], float(j)) for j in grid]
        """(``u_l``, ``l - 1``) for the layers ``l`` the crowding bound is taken at."""
        self.by_new = np.argsort(p_new, kind="stable")
        self.sorted_new = p_new[self.by_new]
        picks = sorted({int(x) for x in np.linspace(0, L - 1, CAPACITY_THRESHOLDS)})
        self.thresholds = [(inst.usable_s[j], float(L - j)) for j in picks]
        self.alone_end = np.asarray([o.chain_end[-1] for o in relax.options])
        self.alone_end = np.where(np.isinf(table.on_new), math.inf, self.alone_end)

    def served(self, mask: np.ndarray) -> np.ndarray:
        """Per state, the whole work (on O) of the batches O has served."""
        placed = (mask[:, None] & self.table.bits[None, :]) != 0
        return np.asarray(placed.astype(float) @ self.whole)

    def shared(self, served: np.ndarray, i: int) -> np.ndarray:
        """Per state, the least completion of batch ``i`` served next on O (shared work)."""
        total = served + self.whole[i]
        x = (self.b_old + total - self.a1 - self.p_old[i]) / (1 + self.ratio)
        return np.asarray(self.b_old + total - np.maximum(x, 0.0))

    def left_on_new(self, unplaced: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per state, a bound on the total latency of the unplaced batches, all left on N, and
        the bound on the last of their completions in it (-inf when none is left)."""
        left = unplaced[:, self.by_new]
        prefix = np.cumsum(np.where(left, self.sorted_new, 0.0), axis=1)
        floor = np.max([at + layers * prefix for at, layers in self.thresholds], axis=0)
        floor = np.sort(np.where(left, floor, -math.inf), axis=1)
        alone = np.sort(np.where(unplaced, self.alone_end, -math.inf), axis=1)
        ends = np.maximum(floor, alone)  # -inf where nothing is left: placed batches
        total = np.where(np.isneginf(ends), 0.0, ends).sum(axis=1)
        total -= np.where(unplaced, self.table.release, 0.0).sum(axis=1)
        return np.asarray(total), np.asarray(ends[:, -1])

    def crowded(
        self, mask: np.ndarray, free: np.ndarray, unplaced: np.ndarray, last: np.ndarray
    ) -> np.ndarray:
        """Per complete state (O served ``mask``, its last completion at least ``free``; the
        unplaced batches on N, the last of them done at least at ``last``), what N's capacity
        adds to that bound's total: :meth:`extra_s` at every layer of the grid."""
        placed = ((mask[:, None] & self.table.bits[None, :]) != 0).astype(float)
        total, sigma = self.b_old + placed @ self.whole, placed @ self.p_new
        ready = np.where(placed > 0, self.p_old, math.inf).min(axis=1)
        ready += np.where(placed > 0, self.handoff, math.inf).min(axis=1)
        alone = np.asarray(unplaced.astype(float) @ self.p_new)
        extra = np.zeros(free.shape)
        for usable, below in self.arrivals:
            work = usable + (self.layers - below) * alone  # the N-only layers from l on
            least = self.extra_s(free, last, total, below * sigma, work, ready, alone == 0)
            extra = np.maximum(extra, least)
        return np.where(mask == 0, 0.0, extra)

    def extra_s(
        self,
        free: np.ndarray,
        last: np.ndarray,
        total: np.ndarray,
        below: np.ndarray,
        work: np.ndarray,
        ready: np.ndarray,
        none_left: np.ndarray,
    ) -> np.ndarray:
        """The least ``(T - free) + (c - last)`` over the real last O completion ``T >= free``
        and last N-only completion ``c >= last`` (arrays, one entry per state).

        After ``u_l`` N runs the N-only batches' layers from ``l`` on (``work`` is ``u_l`` plus
        them) and the served batches' layers from ``l`` on, at least ``rho (B - T) - below``
        with ``B = total = b_O + sum L pO`` (O ran the rest by ``T``) and ``below = (l - 1)
        sigma`` (the layers under ``l``). When that is work at all, N is busy until ``Z(T) =
        work + max(0, rho (B - T) - below)`` or later, and a served batch's N layers end by
        ``T - ready`` (the least ``pO`` plus the least hand-off among them: the last block on O
        runs a layer). So either ``c >= Z(T)`` (the least is at ``free`` or a kink of ``(T -
        free) + (Z(T) - last)^+``), or ``T - ready >= Z(T)``; without N-only batches
        (``none_left``) also any ``T`` past the kink, where N's share is 0.
        """
        rho = self.ratio
        kink = total - below / rho  # where N's share of the served work reaches 0

        def over(at: np.ndarray) -> np.ndarray:
            busy = work + np.maximum(0.0, rho * (total - at) - below)
            return np.asarray((at - free) + np.maximum(0.0, busy - last))

        meets = total - (last - work + below) / rho  # where Z(T) = last, sloped part
        least = over(free)
        for at in (kink, meets):
            least = np.minimum(least, over(np.maximum(at, free)))
        crossing = (work + ready + rho * total - below) / (1 + rho)  # T - ready = Z(T)
        fixed = np.where(work + ready >= kink, work + ready, crossing)
        fixed = np.where(none_left, np.minimum(kink, crossing), fixed)
        return np.asarray(np.maximum(0.0, np.minimum(least, np.maximum(fixed, free) - free)))
