"""The slot relaxation's master LP, with clique cuts on O's blocks.

The slot bound (:mod:`blitzplan.live.bound.slots`) prices each slot's capacity on N and on
O; its Lagrangian dual is the time-indexed master LP, a convex mix of each batch's priced
choices ("paths": a split, N's layer starts, O's block start). Here that LP is solved by column
generation, the per-batch dynamic program (:func:`~blitzplan.live.bound.slot_prices.solve_batches`)
pricing, in HiGHS (one thread; ``highspy``, the ``exact`` extra, is imported when called). O's
blocks are charged as the program charges them (:mod:`blitzplan.live.bound.slot_blocks`: from their
own start, after their floor); a column's block starts where its value was found. With
``cuts``, a strengthening valid for every schedule:

- **Clique cuts** (Sousa and Wolsey's, for time-indexed single-machine scheduling). For a window
  ``W = [t1, t2)`` of O's slot edges and a batch ``l``, every schedule keeps::

      [l's block overlaps W]  +  sum over j != l of [j's block covers W]  <=  1

  (a block covering ``W`` overlaps every block that overlaps ``W``; two covering blocks
  overlap). A path is charged a cut's price when its block has the cut's property for *every*
  start in the O slot the program charges it in (:meth:`_Priced.coefficients`): at most the true
  indicator, so every priced value stays at most the path's true priced cost.

At any prices (``lam``, ``mu`` on the slots, ``sigma`` on the cuts, all ``>= 0``) the batches'
least priced values, less the prices' right-hand sides, bound every schedule's total latency
(weak duality); the bound returned is the best of them. Cuts violated by the master's optimum
are added when column generation has stalled for the cuts already in. On (32,16) of
``benchmarks/partition.py`` (docs/benchmarks.md, twelfth session) the cuts add 0.0-0.3% of the
best known value and the exact blocks (since then the program's own) 2.3-3.1% at 100 slots;
the master takes 1-25 s at 100 slots, minutes at 250: a research bound, not
``bnb``'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from blitzplan.live.bound.slot_blocks import least_start
from blitzplan.live.bound.slot_prices import SlotPath, SlotPrices, solve_batches
from blitzplan.live.instance import LiveScalingInstance

__all__ = ["MasterBound", "master_bound"]

SMOOTHING = 0.8
"""Wentges' rule: the prices tried are this share of the best so far, the rest the master's."""

CUTS_PER_ROUND = 20
"""The most violated cuts added at once."""

MIN_VIOLATION = 1e-3
"""A cut is added when the master's optimum exceeds its right-hand side (1) by this much."""

_EDGE_TOL = 1e-7
"""In slot widths: a block must reach this far past a window's edge to count (safe side)."""


@dataclass(frozen=True)
class MasterBound:
    """``bound``: a lower bound on the mean latency; ``master``: the master LP's last value
    (at least the dual's maximum over the cuts in; equal to ``bound`` when column generation
    ended, not the clock); the pricing ``steps``, the ``cuts`` added, ``seconds`` of wall
    clock."""

    bound: float
    master: float
    steps: int
    cuts: int
    seconds: float


@dataclass(frozen=True)
class Cut:
    """Batch ``batch``'s block overlaps O's window ``[edges[a], edges[b])``, or another's
    covers it."""

    batch: int
    a: int
    b: int


class _Priced(SlotPrices):
    """Slot prices and the cuts' prices, charged to O's blocks per (batch, split, O slot) in
    the program's table of blocks (``old_value``, ``old_suffix``)."""

    def __init__(self, instance: LiveScalingInstance, horizon_s: float, slots: int | None) -> None:
        self.cuts: list[Cut] = []
        self.sigma = np.zeros(0)
        self._cut_tables: dict[Cut, np.ndarray] = {}
        super().__init__(instance, horizon_s, slots, handover=False)
        self.ends = self.q / self.old.width  # [i, k]: a block's length in slots

    def set_all(self, lam: np.ndarray, mu: np.ndarray, sigma: np.ndarray) -> None:
        self.sigma = sigma
        self.set(lam, mu)

    def set(self, lam: np.ndarray, mu: np.ndarray) -> None:
        super().set(lam, mu)
        if not np.any(self.sigma > 0):
            return
        for cut, price in zip(self.cuts, self.sigma, strict=True):
            if price > 0:
                self.old_value += price * self.coefficients(cut)
        suffix = np.minimum.accumulate(self.old_value[:, :, ::-1], axis=2)[:, :, ::-1]
        self.old_suffix = np.subtract(suffix, self.release[:, None, None]).ravel()

    def coefficients(self, cut: Cut) -> np.ndarray:
        """``[i, k, c]``: whether every start in O slot ``c`` (closed) of batch ``i``'s block of
        split ``k`` has the cut's property (one past the last slot: never)."""
        known = self._cut_tables.get(cut)
        if known is not None:
            return known
        c = np.arange(self.old.count + 1)[None, None, :]
        ends = self.ends[:, :, None]
        out: np.ndarray = (c + 1 <= cut.a) & (c + ends >= cut.b + _EDGE_TOL)  # covers W
        overlaps = (c + 1 < cut.b) & (c + ends > cut.a + _EDGE_TOL)  # from any start in c
        out[cut.batch] = overlaps[cut.batch]
        out[:, :, -1] = False
        self._cut_tables[cut] = out
        return out


def master_bound(
    instance: LiveScalingInstance,
    *,
    completion_s: Sequence[float],
    upper_bound: float,
    time_limit_s: float,
    slots: int | None = None,
    cuts: bool = True,
) -> MasterBound:
    """A lower bound on the mean latency by column generation on the slot relaxation's master
    LP (``slots`` per machine, default the slot bound's), with clique cuts (see the module
    docstring) when asked; the slots end a little past the last of
    ``completion_s`` (a known schedule's, of value ``upper_bound``). Stops after
    ``time_limit_s`` (wall clock; the bound so far is valid) or when the master and the best
    priced value meet."""
    import highspy

    from blitzplan.live.bound.slots import HORIZON_PAST_LAST, _first_prices

    began = time.perf_counter()
    n = instance.num_batches
    horizon_s = HORIZON_PAST_LAST * max(completion_s)
    prices = _Priced(instance, horizon_s, slots)
    _first_prices(prices, completion_s)
    master = _Master(highspy, prices, upper_bound)
    best, center = -math.inf, (prices.lam, prices.mu, prices.sigma)
    value, share, step = math.inf, SMOOTHING, 0
    duals: tuple[np.ndarray, ...] | None = None
    while True:
        step += 1
        total, paths = solve_batches(prices, None, paths=True)
        priced = (total - prices.constant() - float(prices.sigma.sum())) / n
        if priced > best:
            best, center = priced, (prices.lam, prices.mu, prices.sigma)
        added = master.add_paths(paths, duals)
        if time.perf_counter() - began > time_limit_s or upper_bound <= best * (1 + 1e-9):
            break
        stalled = best * n >= value - 1e-7 * abs(value)  # the master's optimum is the dual's
        if stalled or (duals is not None and added == 0 and share == 0.0):
            if not cuts or not master.separate():
                break
            center = (center[0], center[1], _padded(center[2], len(prices.cuts)))
            added = 1  # the master changed: solve it again
        if duals is not None and added == 0:
            share = 0.0  # a mispricing: the master's own duals next
        else:
            share = SMOOTHING
            value, duals = master.solve()
        _, lam, mu, sigma = duals
        prices.set_all(
            share * center[0] + (1 - share) * lam,
            share * center[1] + (1 - share) * mu,
            share * center[2] + (1 - share) * sigma,
        )
    seconds = time.perf_counter() - began
    return MasterBound(min(best, upper_bound), value / n, step, len(prices.cuts), seconds)


def _padded(sigma: np.ndarray, count: int) -> np.ndarray:
    return np.concatenate([sigma, np.zeros(count - sigma.size)])


class _Master:
    """The restricted master LP: per batch a convexity row, per slot a capacity row on N and
    on O (``<=`` its width), per cut a row (``<= 1``); a column per path found, and an
    expensive artificial one per batch that keeps it feasible."""

    def __init__(self, highspy: Any, prices: _Priced, upper_bound: float) -> None:
        self.prices = prices
        lp = self.lp = highspy.Highs()
        for option, setting in (("output_flag", False), ("threads", 1), ("presolve", "off")):
            lp.setOptionValue(option, setting)
        n, cn, co = prices.instance.num_batches, prices.new.count, prices.old.count
        self.inf = highspy.kHighsInf
        lower = np.concatenate([np.ones(n), np.full(cn + co, -self.inf)])
        upper = np.concatenate([np.ones(n), np.full(cn, prices.new.width)])
        upper = np.concatenate([upper, np.full(co, prices.old.width)])
        empty = np.zeros(0, np.int32)
        lp.addRows(n + cn + co, lower, upper, 0, np.zeros(1, np.int32), empty, np.zeros(0))
        for i in range(n):
            lp.addCol(10 * n * upper_bound, 0.0, self.inf, 1, np.array([i], np.int32), [1.0])
        self.cols: list[tuple[int, int, int]] = [(i, -1, -1) for i in range(n)]
        """Per column: its batch, its split and O slot (-1, -1: artificial or no block)."""
        self.first_cut_row = n + cn + co

    def add_paths(self, paths: list[SlotPath], duals: tuple[np.ndarray, ...] | None) -> int:
        """Add each path whose reduced cost under ``duals`` is negative; how many. A column's
        cost is what the program charged for the path less its prices; a block's is its
        completion from where its value was found, less the release."""
        prices, added = self.prices, 0
        n, cn = prices.instance.num_batches, prices.new.count
        for i, path in enumerate(paths):
            new, old, slot, start = _use(prices, i, path)
            in_cuts = self._in_cuts(i, path.split, slot)
            cost = path.value - float(prices.lam @ new + prices.mu @ old + prices.sigma @ in_cuts)
            if slot >= 0:
                ready = max(start, float(prices.earliest[i, path.split]))
                cost = ready + float(prices.q[i, path.split]) - float(prices.release[i])
            if duals is not None:
                pi, lam, mu, sigma = duals
                reduced = cost + float(lam @ new + mu @ old + sigma @ in_cuts) - pi[i]
                if reduced >= -1e-9 * max(1.0, abs(pi[i])):
                    continue
            added += 1
            rn, ro, rc = (np.nonzero(x > 1e-12)[0] for x in (new, old, in_cuts))
            rows = np.concatenate([[i], n + rn, n + cn + ro, self.first_cut_row + rc])
            values = np.concatenate([[1.0], new[rn], old[ro], in_cuts[rc]])
            self.lp.addCol(cost, 0.0, self.inf, rows.size, rows.astype(np.int32), values)
            self.cols.append((i, path.split, slot))
        return added

    def _in_cuts(self, i: int, k: int, slot: int) -> np.ndarray:
        if slot < 0:
            return np.zeros(len(self.prices.cuts))
        tables = (self.prices.coefficients(cut) for cut in self.prices.cuts)
        return np.array([float(table[i, k, slot]) for table in tables])

    def solve(self) -> tuple[float, tuple[np.ndarray, ...]]:
        """The master's value and its duals (per batch; N's, O's and the cuts' prices)."""
        self.lp.run()
        value = float(self.lp.getInfo().objective_function_value)
        row = np.asarray(self.lp.getSolution().row_dual)
        n, cn = self.prices.instance.num_batches, self.prices.new.count
        parts = (row[n : n + cn], row[n + cn : self.first_cut_row], row[self.first_cut_row :])
        return value, (row[:n], *(np.maximum(-part, 0.0) for part in parts))

    def separate(self) -> bool:
        """Add the most violated clique cuts at the master's optimum; False when none is."""
        prices = self.prices
        chosen = _violated(prices, self.cols, np.asarray(self.lp.getSolution().col_value))
        blocks = [j for j, (_, _, c) in enumerate(self.cols) if c >= 0]
        for cut in chosen:
            prices.cuts.append(cut)
            table = prices.coefficients(cut)
            index = np.array([j for j in blocks if table[self.cols[j]]], np.int32)
            self.lp.addRow(-self.inf, 1.0, index.size, index, np.ones(index.size))
        prices.sigma = _padded(prices.sigma, len(prices.cuts))
        return bool(chosen)


def _violated(prices: _Priced, cols: list[tuple[int, int, int]], y: np.ndarray) -> list[Cut]:
    """The (batch, window) cliques the master's optimum ``y`` breaks most, every window of O's
    slot edges tried."""
    n, C = prices.instance.num_batches, prices.old.count
    support = [j for j in range(len(cols)) if y[j] > 1e-9 and cols[j][2] >= 0]
    if not support:
        return []
    batch = np.array([cols[j][0] for j in support])
    start = np.array([cols[j][2] for j in support], dtype=float)
    end = start + prices.ends[batch, [cols[j][1] for j in support]]
    weight = y[support]
    edge = np.arange(C + 1)[None, :]
    as_a = {"cover": start[:, None] + 1 <= edge, "over": end[:, None] > edge + _EDGE_TOL}
    as_b = {"cover": end[:, None] >= edge + _EDGE_TOL, "over": start[:, None] + 1 < edge}
    mixes = {name: np.zeros((n, C + 1, C + 1)) for name in as_a}
    for j in np.unique(batch):
        mine = batch == j
        for name, mix in mixes.items():
            mix[j] = (as_a[name][mine] * weight[mine, None]).T @ as_b[name][mine]
    lhs = mixes["over"] + mixes["cover"].sum(axis=0)[None] - mixes["cover"]  # [batch, a, b]
    lhs *= np.triu(np.ones((C + 1, C + 1)), k=1)[None]
    out = []
    for index in np.argsort(lhs.ravel())[::-1][:CUTS_PER_ROUND]:
        if lhs.ravel()[index] <= 1 + MIN_VIOLATION:
            break
        batch, a, b = np.unravel_index(index, lhs.shape)
        out.append(Cut(int(batch), int(a), int(b)))
    return out


def _use(prices: _Priced, i: int, path: SlotPath) -> tuple[np.ndarray, np.ndarray, int, float]:
    """The time batch ``i``'s path spends in each N slot and each O slot, the O slot its block
    is charged in and its start (-1, nan without a block): where the program's table found
    its least in that slot."""
    inst, L = prices.instance, prices.instance.num_layers

    def use(edges: np.ndarray, starts: Sequence[float], length: float) -> np.ndarray:
        if not starts:
            return np.zeros(edges.size - 1)
        clipped = np.clip(edges[None, :] - np.asarray(starts)[:, None], 0.0, length)
        return np.asarray(np.diff(clipped.sum(axis=0)))

    new = use(prices.new.edges, path.new_starts, inst.new_layer_s[i])
    if path.old_start is None:
        return new, np.zeros(prices.old.count), -1, math.nan
    k = path.split
    charged = path.value - float(prices.lam @ new) + float(prices.release[i])
    slot = _charged_slot(prices, i, k, path.old_start, charged)
    q, floor_s = float(prices.q[i, k]), float(prices.earliest[i, k])
    start = least_start(prices.old.edges, prices.cum_old, q, floor_s, slot)
    return new, use(prices.old.edges, [start], (L - k) * inst.old_layer_s[i]), slot, start


def _charged_slot(prices: SlotPrices, i: int, k: int, start_s: float, charged: float) -> int:
    """The O slot the program charged a block starting at ``start_s`` in (``charged``, its
    table's value there): the start's own, or, when the start is a slot edge, the slot before
    if that is the one whose value it charged."""
    at = (start_s - float(prices.old.edges[0])) / prices.old.width
    slot = min(math.floor(at + 1e-9), prices.old.count)
    if slot == 0 or abs(at - round(at)) > 1e-9:
        return slot
    values = prices.old_value[i, k]
    before = abs(values[slot - 1] - charged) <= abs(values[slot] - charged)
    return slot - 1 if before else slot
