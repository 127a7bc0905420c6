"""The capacity conditions of the subset program (:mod:`blitzplan.live.bound.subsets`).

The N-capacity relaxation (:mod:`blitzplan.live.bound.relaxation`) drops N's one-operation-at-a-time
rule. :class:`Capacity` puts part of it back, and O's, as necessary conditions on the
completions of a state of the subset program (O served a set of batches, the rest left on N):
every schedule meets them, so the program's optimum under them is still a lower bound.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from blitzplan.live.bound import pair_history, served_blocks
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.splits import split_groups

if TYPE_CHECKING:
    from blitzplan.live.bound.subset_table import _Table

__all__ = ["CAPACITY_THRESHOLDS", "Capacity", "Crowding", "Layer"]

CAPACITY_THRESHOLDS = 12
"""Layer arrivals the bound on the batches left on N is taken at (any subset is valid)."""


class Layer(NamedTuple):
    """Per state, the terms of :meth:`Capacity.extra_s` (and
    :func:`~blitzplan.live.bound.served_blocks.served_extra_s`) at one point ``s``
    (:attr:`Capacity.points`)."""

    free: np.ndarray  # O's last completion in the program
    last: np.ndarray  # the last completion of the batches left on N in the program
    total: np.ndarray  # B = b_O + sum L pO over the served batches
    below: np.ndarray  # the served batches' work on N that may run before s
    work: np.ndarray  # s plus the layers of the batches left on N that cannot start before s
    ready: np.ndarray  # the least pO plus the least hand-off among the served batches
    none_left: np.ndarray  # whether no batch is left on N


class Crowding(NamedTuple):
    """Per state, :meth:`Capacity.crowded`'s term (0 where O served none), at each of the
    arrivals' points (states x points) :meth:`Capacity.extra_s`, ``work`` and ``below``, and
    the terms the :class:`Layer` at any point is made of (:meth:`Capacity.refined`)."""

    layer: Layer  # below and work: 0 (they depend on the point)
    extra: np.ndarray
    extras: np.ndarray
    works: np.ndarray
    belows: np.ndarray
    mask: np.ndarray
    placed: np.ndarray  # (states x batches): 1.0 where O served the batch
    left: np.ndarray  # (states x batches): 1.0 where the batch is left on N


class Capacity:
    """Necessary conditions on completions that count the capacity of both instances.

    *Shared work.* Let O serve the set ``P`` up to and including batch ``j``, with splits
    ``k``. O has run ``sum (L - k_i) pO_i`` from ``b_O`` by ``C_j``; N has run every layer of
    ``P`` on it (``sum k_i pN_i``) from ``a_1`` before O starts ``j``, which then runs at least
    one layer (``pO_j``). With ``x = sum k_i pO_i`` and ``rho = min pN / pO``:
    ``C_j >= max(a_1 + rho x + pO_j, b_O + sum L pO_i - x)``, so ``C_j`` is at least the least
    over ``x >= 0`` of that maximum. With ``j``'s own split ``k`` apart (:meth:`shared`), its
    N layers, its alone chain and its block of ``L - k`` layers count together.

    *Left on N.* Among the batches ``F`` that finish on N, the ``m``-th to complete has, with
    the ``m - 1`` before it, run layers ``l..L`` on N after ``a_l``: it completes at least
    ``a_l + (L - l + 1)`` times the ``m`` smallest ``pN`` of ``F`` after ``a_l`` (for any
    ``l``), and at least the ``m``-th smallest completion of the batches of ``F`` alone.
    Summed, this bounds their total latency whichever batch completes when.

    *Crowding.* Those two count N's work apart: the batches left on N, and the served batches
    against O. A complete plan also pays for both on N at once: after ``a_l`` N runs the layers from
    ``l`` on of the batches left on N and of the served ones (after a release ``r``, every layer of
    the batches released from ``r`` on, and of each other batch the layers its alone chain cannot
    start before ``r``), and the second grow as O's blocks end earlier (O runs less of the served
    work). So either the last batch left on N or O's last block ends later than the plan says, and
    under FIFO every served block whose O work, with that before it, the plan's N share does not
    leave room for (:meth:`extra_s`). (The *left on N* order statistics already count the batches
    the program finishes on N together, for the set each state chooses; on (80,8) FIFO seed 7 of
    ``benchmarks/partition.py`` the program's best state finishes one batch on N and serves one of
    20.85 ms a layer with 49 layers on N: what it misses there is N's crowding by the served
    batches, which this counts.)
    """

    def __init__(self, relax: Relaxation, table: _Table, *, split_apart: bool = True) -> None:
        inst = relax.instance
        L = inst.num_layers
        p_new, p_old = np.asarray(inst.new_layer_s), np.asarray(inst.old_layer_s)
        self.table, self.p_old = table, p_old
        self.a1, self.b_old = inst.usable_s[0], inst.old_free_at_s
        self.ratio = float(np.min(p_new / p_old))
        self.whole, self.p_new, self.layers = L * p_old, p_new, L
        self.handoff = np.asarray(inst.handoff_s)
        grid = sorted({int(x) for x in np.linspace(0, L - 1, CAPACITY_THRESHOLDS)})
        self.points = [(inst.usable_s[j], j * p_new) for j in grid]
        starts = np.asarray([o.chain_end[1:] for o in relax.options]) - p_new[:, None]
        times = sorted({inst.usable_s[j] for j in grid} | set(inst.release_s))
        self.points += [(at, (starts < at).sum(axis=1) * p_new) for at in times]
        """(``s``, per batch ``pN`` times its layers that may start on N before ``s``) for the
        times the crowding bound is taken at: the grid's layer arrivals ``u_l`` (the layers
        under ``l``), then those and every release again, with the layers each batch's alone
        chain lets start before ``s`` (its release, the arrivals, a node's start limits and
        its earlier layers keep the others after it: at most the layers under ``l``)."""
        self.point_at = np.asarray([at for at, _ in self.points])
        self.point_groups = [np.arange(len(grid)), np.arange(len(grid), len(self.points))]
        """The arrivals' points and the chains': the every-block term is taken at each group's
        best (the first alone would pick the point it picked before these were counted)."""
        self.by_new = np.argsort(p_new, kind="stable")
        self.sorted_new = p_new[self.by_new]
        self.thresholds = [(inst.usable_s[j], float(L - j)) for j in grid]
        self.alone_end = np.asarray([o.chain_end[-1] for o in relax.options])
        self.alone_end = np.where(np.isinf(table.on_new), math.inf, self.alone_end)
        most = np.minimum(np.asarray(relax.restriction.split_max), L - 1)
        self.most_share = np.maximum(most, 0) * p_old
        """Per batch, the most of it N runs when O serves it (in O's time)."""
        self.after = self.handoff + p_old
        """Per batch, its hand-off and one layer on O: what follows N's last layer of it
        before a later block on O may start."""
        self.starts = pair_history.earliest_starts(relax)
        """Per batch, the earliest its block on O may start (:mod:`.pair_history`)."""
        none = (np.zeros(0, dtype=bool), *(np.zeros(0) for _ in range(4)))
        self.groups = [
            split_groups(relax, i) if split_apart else none for i in range(inst.num_batches)
        ]
        """Per batch, its groups of splits (:meth:`shared`); none without ``split_apart``.
        Under FIFO the program does without: on ``benchmarks/partition.py``'s (32,16),
        (40,12) and (80,8), seeds 0-9, it lifted one root capacity bound of 30 (by 0.06%) at
        up to 2.5 times the CPU."""
        self.padded = _padded(self.groups)
        """The groups as (batches x most groups) arrays, padded with groups that lift nothing
        (an infinite chained end), and per batch whether it has any: :meth:`shared` of one
        batch per state at once."""

    def served(self, mask: np.ndarray) -> np.ndarray:
        """(2 x states): the whole work (on O) of the batches O has served, and the least
        ``d_t + pO_t`` among them (inf when none)."""
        placed = ~self.table.unplaced(mask)
        work = placed.astype(float) @ self.whole
        return np.stack([work, np.where(placed, self.after, math.inf).min(axis=1)])

    def shared(self, served: np.ndarray, i: int | np.ndarray, free: np.ndarray) -> np.ndarray:
        """Per state, a least completion of batch ``i`` (or of ``i[s]`` for state ``s``) served
        next on O, free at ``free`` (``served``: :meth:`served` before ``i``).

        *Shared work* (the class docstring), and with ``i``'s own split ``k`` apart: N ran the
        served batches' N layers (at least ``rho w`` for ``w = sum k_t pO_t`` over those before
        ``i``, and ``k pN_i``) from ``a_1``, then its last such operation's batch was handed off
        (``d_i``, or ``d_t + pO_t`` for an earlier one, whose block comes first), then ``i``'s
        block of ``(L - k) pO_i``: ``C_i >= P_k + rho w`` with ``P_k = a_1 + ready + L pO_i +
        k (pN_i - pO_i)``; and O ran the rest, ``C_i >= B - k pO_i - w``, so ``C_i`` is at
        least ``A_k``, the least over ``w >= 0`` of the larger (without N work, ``k = w = 0``:
        ``B``). Also ``C_i >= max(free, start_k) + (L - k) pO_i`` (``start_k`` its alone
        chain's ``k``-th end plus ``d_i``). Each group of splits
        (:func:`~blitzplan.live.bound.splits.split_groups`) is bounded by its least
        ``P_k``, ``B - k pO_i``, ``start_k + (L - k) pO_i`` and ``L - k``; ``C_i`` is at least
        the least over the groups."""
        work, prior = served
        i = np.broadcast_to(i, free.shape)
        whole, p_old = self.whole[i], self.p_old[i]
        total = self.b_old + work + whole
        x = (total - self.a1 - p_old) / (1 + self.ratio)
        alone = total - np.maximum(x, 0.0)
        grouped, zero, most, lift, chained, left = (value[i] for value in self.padded)
        if not most.shape[-1]:
            return np.asarray(alone)
        ready = np.where(zero, prior[:, None], np.minimum(self.handoff[i], prior)[:, None])
        low = self.a1 + ready + whole[:, None] + lift  # P_k, least over the group
        high = total[:, None] - most * p_old[:, None]  # B - k pO_i, least over the group
        least = np.maximum(low, (low + self.ratio * high) / (1 + self.ratio))
        least = np.where(zero, np.minimum(least, total[:, None]), least)
        block = np.maximum(free[:, None] + left, chained)  # a padded group's: inf
        coupled = np.maximum(least, block).min(axis=1)
        return np.asarray(np.where(grouped, np.maximum(alone, coupled), alone))

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

    def last_on_new(self, unplaced: np.ndarray) -> np.ndarray:
        """Per state, :meth:`left_on_new`'s bound on the last completion alone, without its
        sorts: the largest threshold's floor over all the batches left and their largest
        alone end (-inf when none is left)."""
        work = unplaced @ self.p_new
        floor = np.max([at + layers * work for at, layers in self.thresholds], axis=0)
        alone = np.where(unplaced, self.alone_end, -math.inf).max(axis=1)
        return np.asarray(np.where(unplaced.any(axis=1), np.maximum(floor, alone), -math.inf))

    def crowded(
        self, mask: np.ndarray, free: np.ndarray, unplaced: np.ndarray, last: np.ndarray
    ) -> Crowding:
        """Per complete state (O served ``mask``, its last completion at least ``free``; the
        unplaced batches on N, the last of them done at least at ``last``), what N's capacity
        adds to that bound's total: :meth:`extra_s` at the arrivals' points, counting O's last
        block (each point is valid alone: the largest counts), and what it was made of."""
        placed = (~unplaced).astype(float)
        total = self.b_old + placed @ self.whole
        ready = np.where(placed > 0, self.p_old, math.inf).min(axis=1)
        ready += np.where(placed > 0, self.handoff, math.inf).min(axis=1)
        zero = np.zeros(free.shape)
        layer = Layer(free, last, total, zero, zero, ready, np.asarray(~unplaced.any(axis=1)))
        crowd = Crowding(layer, zero, zero, zero, zero, mask, placed, unplaced.astype(float))
        extras, works, belows = self._points(crowd, self.points[: self.point_groups[0].size])
        extra = np.where(mask == 0, 0.0, extras.max(axis=1))
        return crowd._replace(extra=extra, extras=extras, works=works, belows=belows)

    def refined(self, crowd: Crowding, rows: np.ndarray, *, every_block: bool) -> np.ndarray:
        """The crowding term of the states ``rows`` of ``crowd`` at every point (the chains'
        too, :attr:`points`); with ``every_block`` (under FIFO) also, at the point of each
        group where :meth:`extra_s` is largest, every served block
        (:mod:`~blitzplan.live.bound.served_blocks`)."""
        layer = Layer(*(value[rows] for value in crowd.layer))
        c = Crowding(layer, *(value[rows] for value in crowd[1:]))
        chains = self._points(c, self.points[self.point_groups[0].size :])
        pairs = zip((c.extras, c.works, c.belows), chains, strict=True)
        extras, works, belows = (np.concatenate(pair, axis=1) for pair in pairs)
        extra = extras.max(axis=1)
        if every_block:
            free, total = c.layer.free, c.layer.total
            leads = served_blocks.leads(self, c.mask, c.placed, free, total)
            paid = served_blocks.kinks(leads)  # the leads' kinks, once
            tail = served_blocks.last_block(self, c.placed, free, total)
            for group in self.point_groups:  # each group's best point
                pick = group[np.argmax(extras[:, group], axis=1)][:, None]
                work = np.take_along_axis(works, pick, axis=1)[:, 0]
                below = np.take_along_axis(belows, pick, axis=1)[:, 0]
                at = self.point_at[pick[:, 0]]
                layer = self._at_point(c.layer, at, below, work)
                extra = np.maximum(extra, served_blocks.served_extra_s(self, layer, paid, tail))
        return np.where(c.mask == 0, 0.0, extra)

    def _points(
        self, crowd: Crowding, points: list[tuple[float, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(states x points): :meth:`extra_s`, ``work`` and ``below`` at each of ``points``."""
        out = np.empty((3, crowd.mask.size, len(points)))
        for k, (at, under) in enumerate(points):  # after s N runs the layers that cannot start
            out[1, :, k] = at + crowd.left @ (self.layers * self.p_new - under)  # before it
            out[2, :, k] = crowd.placed @ under  # the served batches' layers that may run before s
        # every point at once, one column each (the same element-wise operations)
        ats = np.asarray([at for at, _ in points], dtype=float)
        layer = Layer(*(value[:, None] for value in crowd.layer))
        out[0] = self.extra_s(self._at_point(layer, ats, out[2], out[1]))
        return out[0], out[1], out[2]

    @staticmethod
    def _at_point(
        layer: Layer, at: float | np.ndarray, below: np.ndarray, work: np.ndarray
    ) -> Layer:
        """``layer`` at the point ``at``: ``below``, ``work``, and ``none_left`` also where the
        batches left on N have no work after ``at`` (they may all complete before it: only the
        served batches' work then crowds N after it)."""
        none_left = layer.none_left | (work <= at)
        return layer._replace(below=below, work=work, none_left=none_left)

    def extra_s(self, layer: Layer) -> np.ndarray:
        """The least ``(T - free) + (c - last)`` over the real last O completion ``T >= free``
        and last N-only completion ``c >= last`` (arrays, one entry per state).

        After a point ``s`` (:attr:`points`) N runs the N-only batches' layers that cannot
        start before it (``work`` is ``s`` plus them) and the served batches', at least ``rho
        (B - T) - below`` with ``B = total = b_O + sum L pO`` (O ran the rest by ``T``) and
        ``below`` the served batches' work that may run before ``s``. When that is work at
        all, N is busy until ``Z(T) = work + max(0, rho (B - T) - below)`` or later, and a
        served batch's N layers end by ``T - ready`` (the least ``pO`` plus the least hand-off
        among them: the last block on O runs a layer). So either ``c >= Z(T)`` (the least is
        at ``free`` or a kink of ``(T - free) + (Z(T) - last)^+``), or ``T - ready >= Z(T)``;
        without N-only batches (``none_left``) also any ``T`` past the kink, where N's share
        is 0.
        """
        free, last, total, below, work, ready, none_left = layer
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


def _padded(groups: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """Per batch whether it has groups of splits, and its groups (:meth:`Capacity.shared`)
    as rows of (batches x most groups) arrays, each padded with groups whose chained end is
    inf (so the least over a row is its batch's)."""
    n, width = len(groups), max((g[1].size for g in groups), default=0)
    zero, most = np.zeros((n, width), dtype=bool), np.zeros((n, width))
    lift, chained, left = np.zeros((n, width)), np.full((n, width), math.inf), np.zeros((n, width))
    for i, (z, m, li, c, le) in enumerate(groups):
        size = m.size
        zero[i, :size], most[i, :size], lift[i, :size] = z, m, li
        chained[i, :size], left[i, :size] = c, le
    grouped = np.asarray([g[1].size > 0 for g in groups], dtype=bool)
    return grouped, zero, most, lift, chained, left
