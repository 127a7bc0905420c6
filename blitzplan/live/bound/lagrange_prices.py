"""The price tables of the Lagrangian bound (:mod:`blitzplan.live.bound.lagrange`): the
grid of times, the multipliers on it, and what each batch's options pay under them.

A batch's option is its split ``k`` (layers on N) with the grid point its last N layer is counted
by; :class:`Prices` tabulates, per batch, what ``k`` layers on N pay when the last ends by each
grid point (summing only the pairs of grid points where some layer is counted), and
:class:`Priced` turns those tables into the least priced latency of each batch placed next on O
or left on N, the inputs of the program over O's batch sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blitzplan.live.bound.relaxation import alone_chain_s
from blitzplan.live.instance import LiveScalingInstance

__all__ = ["BatchOptions", "Priced", "Prices"]

_COUNT_TOL = 1e-9
"""Layers whose latest end is this close to a grid point are not counted by it (counting fewer
keeps the constraint valid)."""

_START_TOL = 1e-9
"""A layer counted in a window that opens at ``s`` must start at or after ``s`` plus this much
(relative)."""


@dataclass(frozen=True)
class BatchOptions:
    """One batch's options on O (``k = 0..L-1``) as arrays, and its data."""

    rho: np.ndarray
    """Earliest start on O per split ``k``."""
    q: np.ndarray
    """O's run of the layers left, per split ``k``."""
    p_new: float
    handoff_s: float
    release_s: float
    alone_end_s: float
    """When it ends on N alone (all ``L`` layers)."""


class Prices:
    """The grid of times, the multipliers, and what each option pays under them."""

    def __init__(self, instance: LiveScalingInstance, grid_points: tuple[int, int]) -> None:
        """``grid_points``: (points among the arrivals, points after them)."""
        L, (most, tail) = instance.num_layers, grid_points
        self.usable = np.asarray(instance.usable_s)
        work = L * float(np.sum(instance.new_layer_s))  # all of it on N: N is done by then
        span = max(self.usable[-1] - self.usable[0], work / 2, 1e-9)
        after = self.usable[-1] + span * np.arange(1, tail + 1) / tail
        arrivals = self.usable[np.linspace(0, L - 1, min(L, most)).astype(int)]
        self.grid = np.unique(np.concatenate([arrivals, after]))
        self.mu = np.zeros((L, self.grid.size))
        self.batches = [_batch(instance, i) for i in range(instance.num_batches)]
        starts = [_starts(instance, i) for i in range(instance.num_batches)]
        self.firsts = [_firsts(start, self.usable) for start in starts]
        pairs = zip(starts, self.firsts, strict=True)
        opens = np.min([_opens(start, first) for start, first in pairs], axis=0)
        opens = np.maximum(opens, self.usable)  # equal: a layer counted on row l starts >= u_l
        self.slack = np.maximum(self.grid[None, :] - opens[:, None], 0.0)  # (L, G)
        self.own_tables = sum(f is not None for f in self.firsts)
        """The batches whose tables :meth:`set` computes apart (their rows move)."""
        self.early = [self._early(b.p_new) for b in self.batches]
        self.gathers = [self._gather(early) for early in self.early]
        self.pay: list[np.ndarray] = []
        self.set(self.mu)

    def _early(self, p: float) -> np.ndarray:
        """``[k, J, j]``: how many of ``k`` layers on N end by grid point ``j < J`` when the
        last ends at grid point ``J`` (layer ``m`` ends by ``h - (k - m) p``); 0 for ``j >= J``."""
        G, L = self.grid.size, self.mu.shape[0]
        behind = (self.grid[:, None] - self.grid[None, :]) / p  # [J, j]
        behind = np.where(np.arange(G)[None, :] < np.arange(G)[:, None], behind, np.inf)
        k = np.arange(L + 1, dtype=float)[:, None, None]
        done = np.floor(np.minimum(k - behind[None, :, :] - _COUNT_TOL, k))
        return np.asarray(np.clip(done, 0, L).astype(np.int16))

    def _gather(self, early: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where ``early`` counts anything (``j < J``, some layer): per such pair, sorted by
        ``J``, the flat index of ``own[early[k, J, j], j]`` for every ``k``; the first pair of
        each ``J``; those ``J``. :meth:`set` sums only these (half the pairs or fewer)."""
        G = self.grid.size
        J, j = np.nonzero(early[-1])  # row-major: sorted by J; early[-1] > 0 only for j < J
        index = early[:, J, j].astype(np.int64) * G + j[None, :]
        first = np.flatnonzero(np.r_[True, J[1:] != J[:-1]]) if J.size else J
        return index, first, J[first]

    def set(self, mu: np.ndarray) -> None:
        """Take multipliers ``mu`` (L x G) and tabulate, per batch, ``pay[k, J]``: what ``k``
        layers on N pay when the last ends by grid point ``J`` (``G``: past the grid, 0)."""
        self.mu = mu
        L, G = mu.shape
        shared = _tables(mu)
        self.pay = []
        for b, (index, first, J), firsts in zip(
            self.batches, self.gathers, self.firsts, strict=True
        ):
            if firsts is None:
                own, suffix = shared
            else:
                moved = np.zeros_like(mu)
                rows = np.flatnonzero(np.r_[True, firsts[1:] != firsts[:-1]])
                moved[firsts[rows] - 1] = np.add.reduceat(mu, rows, axis=0)
                own, suffix = _tables(moved)
            partial = np.zeros((L + 1, G + 1))
            if J.size:
                partial[:, J] = np.add.reduceat(own.ravel()[index], first, axis=1)
            self.pay.append(b.p_new * (suffix + partial))

    def used(self, i: int, k: int, last: int) -> np.ndarray:
        """(L x G) N work batch ``i`` puts in each constraint with ``k`` layers on N, the last
        ending by grid point ``last``."""
        L, G = self.mu.shape
        if last >= G:  # past the grid: it pays nothing, and counts nowhere
            return np.zeros((L, G))
        counted = np.full(G, k, dtype=np.int64)
        counted[:last] = self.early[i][k, last, :last]
        firsts = self.firsts[i]
        layers = (np.arange(1, L + 1) if firsts is None else firsts)[:, None]
        return np.asarray(self.batches[i].p_new * np.maximum(counted[None, :] - layers + 1, 0))

    def constant(self) -> float:
        return float(np.sum(self.mu * self.slack))

    def first(self, h: np.ndarray) -> np.ndarray:
        """The first grid point at or after ``h``."""
        return np.searchsorted(self.grid, h, side="left")

    def later(self, i: int, k: np.ndarray, d: float) -> tuple[np.ndarray, np.ndarray]:
        """Per split in ``k`` and first grid point ``J``: the least ``t_j + d + pay`` over
        starts just after ``t_j + d`` (``j >= J``: the last N layer ends in ``(t_j, t_j+1]``),
        and the grid point it is then counted by."""
        G, pay = self.grid.size, self.pay[i]
        value = np.full((k.size, G + 1), math.inf)
        value[:, :G] = self.grid[None, :] + d + pay[k][:, 1:]
        backwards = value[:, ::-1]
        best = np.minimum.accumulate(backwards, axis=1)
        at = np.where(backwards <= best, np.arange(G + 1)[None, :], 0)
        chosen = G - np.maximum.accumulate(at, axis=1)[:, ::-1]  # the least value's j, from J on
        arg = np.minimum(chosen + 1, G)  # its last N layer ends in (t_j, t_j+1]: counted from j+1
        best = best[:, ::-1]
        return best, arg


def _tables(mu: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    L, G = mu.shape
    own = np.zeros((L + 1, G))  # own[m, j]: m layers counted at j, per second of pN
    own[1:] = np.cumsum(np.cumsum(mu, axis=0), axis=0)
    suffix = np.zeros((L + 1, G + 1))
    suffix[:, :-1] = np.cumsum(own[:, ::-1], axis=1)[:, ::-1]
    return own, suffix


def _starts(instance: LiveScalingInstance, i: int) -> np.ndarray:
    """``[m - 1]``: the earliest start of layer ``m`` of batch ``i`` on N (its alone chain)."""
    return np.asarray(alone_chain_s(instance, i)[1:]) - instance.new_layer_s[i]


def _firsts(starts: np.ndarray, usable: np.ndarray) -> np.ndarray | None:
    """Per row ``l``: the first layer of the batch counted there, the first that cannot start
    before ``u_l`` (at most ``l``); None when that is ``l`` on every row."""
    L = usable.size
    margin = usable + _START_TOL * (1.0 + np.abs(usable))
    firsts = np.minimum(np.searchsorted(starts, margin, side="left") + 1, np.arange(1, L + 1))
    return None if np.all(firsts == np.arange(1, L + 1)) else firsts


def _opens(starts: np.ndarray, firsts: np.ndarray | None) -> np.ndarray:
    """Per row: the earliest start of the first layer the batch counts there."""
    return starts if firsts is None else starts[firsts - 1]


def _batch(instance: LiveScalingInstance, i: int) -> BatchOptions:
    L = instance.num_layers
    chain = alone_chain_s(instance, i)
    d, r = instance.handoff_s[i], instance.release_s[i]
    rho = np.asarray([r, *(chain[k] + d for k in range(1, L))])
    q = (L - np.arange(L)) * instance.old_layer_s[i]
    return BatchOptions(rho, q, instance.new_layer_s[i], d, r, chain[L])


class Priced:
    """Every batch's priced options under the current multipliers."""

    def __init__(self, prices: Prices) -> None:
        self.prices = prices
        L = prices.mu.shape[0]
        self.k = np.arange(L)
        n = len(prices.batches)
        self.later = [prices.later(i, self.k, prices.batches[i].handoff_s) for i in range(n)]
        self.on_new = [self._on_new(i, L) for i in range(n)]

    def _on_new(self, i: int, L: int) -> tuple[float, int]:
        """(least priced latency, grid point counted by) of batch ``i`` ending on N."""
        prices, b = self.prices, self.prices.batches[i]
        j = int(prices.first(np.asarray([b.alone_end_s]))[0])
        now = b.alone_end_s + prices.pay[i][L, j]
        best, arg = prices.later(i, np.asarray([L]), 0.0)
        if best[0, j] < now:
            return float(best[0, j]) - b.release_s, int(arg[0, j])
        return now - b.release_s, j

    def on_old(self, i: int, free: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(states x splits) for batch ``i`` placed next on O when O is free at ``free``:
        O's next free time, the least priced latency, and the grid point counted by."""
        b, prices = self.prices.batches[i], self.prices
        start = np.maximum(free[:, None], b.rho[None, :])
        j = prices.first(start - b.handoff_s)
        now = start + prices.pay[i][self.k[None, :], j]
        best, arg = self.later[i]
        later = best[self.k[None, :], j]
        value = np.minimum(now, later) + b.q[None, :] - b.release_s
        counted = np.where(later < now, arg[self.k[None, :], j], j)
        return start + b.q[None, :], value, counted
