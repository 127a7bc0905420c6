"""N's chains in the slot bound's priced problem (:mod:`blitzplan.live.bound.slot_prices`): each
batch's grid and what a layer run from one of its steps is charged.

A batch's layers run on N in order, each ``pN`` long: ``s_l+1 >= s_l + pN``. Counted as
``u_l = s_l - (l - 1) pN`` the chain is any non-decreasing sequence, with no gap to keep, so
the program's state is the next layer and the step of ``u`` the chain may go on from (a grid of
step ``delta`` from the batch's first possible start, ``t_b = t0 + b delta``), and a layer run
from step ``b`` leaves the chain in step ``b``: nothing is rounded away, however short the
layer. (A grid over ``s`` itself advanced the chain by a layer's whole steps, rounded down: a
chain of layers shorter than a step ran inside one step, in no time.) Layer ``l`` run from
``u`` in step ``b`` starts in ``[t_b + (l - 1) pN, t_b + (l - 1) pN + delta]`` and is charged the
least price of a start there, read over the cells of a finer grid (``delta /``
:data:`CELLS_PER_STEP`) that cover that window (one cell more when it is not aligned with
them: the least over more starts, never more than the window's); the chain after ``k`` layers
ends no earlier than ``t_b + k pN``, where its hand-off to O and its latency are counted from.
Every schedule's chain is such a sequence, each of its layers pays at least its charge, and
each of its ends is at least the one counted, so the program's value stays at most every
schedule's priced cost, at any prices.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["CELLS_PER_STEP", "ChainGrid", "grid_steps", "least_in_step"]

CELLS_PER_STEP = 2
"""A step's window is read over this many cells (one more when not aligned with them). On
(80,16) at 160 slots, two steps a slot, after 12 steps: 2 cells 0.833 of the best known, 1 cell
0.824 at about the same CPU."""


def grid_steps(p_new: np.ndarray, target_s: float) -> np.ndarray:
    """Each batch's step: ``target_s``, or a layer over its whole number of such steps when a
    layer is longer (so that its offsets ``(l - 1) pN`` are whole steps, every window aligned
    with the cells; with ``target_s`` for every batch a crowded pair of 1 s layers on 20 slots
    lost 0.7% of its master bound)."""
    whole = np.maximum(np.floor(p_new / target_s), 1.0)
    return np.asarray(np.where(p_new >= target_s, p_new / whole, target_s))


class ChainGrid:
    """Every batch's grid over ``u`` (``times[i, b]``, step ``delta_s``, ``size`` steps, from
    ``t0[i]`` to past N's last slot edge) and the price-free indices the program reads per
    layer: :attr:`charge_at`, where each layer's charge from each step is in :meth:`charges`
    (a step before the layer may run reads an infinite charge), and :attr:`done_s`, how far
    past ``t_b`` the chain ends after ``k`` layers."""

    def __init__(
        self,
        t0: np.ndarray,
        delta_s: np.ndarray,
        p_new: np.ndarray,
        usable_s: np.ndarray,
        new_edges: np.ndarray,
    ) -> None:
        L, n, end = usable_s.size, t0.size, float(new_edges[-1])
        self.t0, self.delta_s, self.p_new, self.usable_s = t0, delta_s, p_new, usable_s
        # (a batch released past the horizon: its grid still has steps, none priced)
        size = self.size = int(max(np.max(np.ceil((end - t0) / delta_s)), 0)) + 2
        self.times = t0[:, None] + delta_s[:, None] * np.arange(size)[None, :]
        offset_s = self.offset_s = np.arange(L)[None, :] * p_new[:, None]  # [i, l - 1]
        self.first = self.step_of(slice(None), usable_s[None, :] - offset_s)  # [i, l - 1]
        self.done_s = np.arange(L + 1)[None, :] * p_new[:, None]  # [i, k]: k pN
        cell_s = self.cell_s = delta_s / CELLS_PER_STEP
        cells = offset_s / cell_s[:, None]
        whole = np.floor(cells + 1e-9)
        wide = (cells - whole > 1e-9).astype(np.int64)  # [i, l - 1]: not aligned
        # every cell from the last on starts past N's last edge, where nothing is priced
        count = self.cell_count = int(max(np.max(np.ceil((end - t0) / cell_s)), 0)) + 1
        self.cell_starts = t0[:, None] + cell_s[:, None] * np.arange(count + CELLS_PER_STEP + 1)
        steps = np.arange(size)[None, None, :]
        first_cell = steps * CELLS_PER_STEP + whole.T.astype(np.int64)[:, :, None]
        index = (np.arange(n)[None, :, None] * 2 + wide.T[:, :, None]) * count
        index = index + np.minimum(first_cell, count - 1)
        # [l - 1, i, b]: where layer l's charge from step b is (2 n count: infinite)
        charge_at = np.where(steps < self.first.T[:, :, None], 2 * n * count, index)
        self.charge_at = np.ascontiguousarray(charge_at)

    def least_u(self) -> np.ndarray:
        """``[i, k]``: the least ``u`` of batch ``i``'s chain with ``k`` layers done (``k =
        0..L``): its first possible start, and each of those layers' arrival less its offset
        (``u_l >= a_l - (l - 1) pN``, ``u`` non-decreasing)."""
        arrived = np.maximum.accumulate(self.usable_s[None, :] - self.offset_s, axis=1)
        return np.concatenate([self.t0[:, None], np.maximum(arrived, self.t0[:, None])], axis=1)

    def step_of(self, rows: int | slice, time_s: np.ndarray) -> np.ndarray:
        """The step of ``u`` each ``time_s`` falls in (rows ``rows`` of the batches, which
        broadcast against it), clipped to the grid."""
        t0, delta = self.t0[rows], self.delta_s[rows]
        if np.ndim(t0):
            t0, delta = t0[:, None], delta[:, None]
        at = np.floor((time_s - t0) / delta + 1e-9)
        return np.asarray(np.clip(at, 0, self.size - 1), dtype=np.int64)

    def charges(self, edges: np.ndarray, cum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(charges, the starts that pay them), flat as :attr:`charge_at` reads them, under the
        cumulative prices ``cum`` at N's slot edges ``edges``: per batch and cell the least
        price of a start in the cell, then the least over ``CELLS_PER_STEP`` cells from each,
        and over one more."""
        price, start = least_in_step(
            edges, cum, self.cell_starts, self.cell_s[:, None], self.p_new[:, None]
        )
        count = self.cell_count
        narrow = _window(price, start, count, CELLS_PER_STEP)
        wide = _window(price, start, count, CELLS_PER_STEP + 1)
        values = np.concatenate([np.stack([narrow[0], wide[0]], 1).ravel(), [math.inf]])
        starts = np.concatenate([np.stack([narrow[1], wide[1]], 1).ravel(), [math.nan]])
        return values, starts


def _window(
    price: np.ndarray, start: np.ndarray, count: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the least of ``width`` cells from each of the first ``count``, and its start."""
    best, at = price[:, :count].copy(), start[:, :count].copy()
    for j in range(1, width):
        later, later_at = price[:, j : j + count], start[:, j : j + count]
        better = later < best
        np.copyto(best, later, where=better)
        np.copyto(at, later_at, where=better)
    return best, at


def least_in_step(
    edges: np.ndarray, cum: np.ndarray, start: np.ndarray, step: np.ndarray, length: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(least price, a start that pays it) of an operation of ``length`` started anywhere in
    ``[start, start + step]`` (arrays that broadcast), on slots of equal width (edges
    ``edges``, cumulative prices ``cum`` there): the price is piecewise linear in the start,
    with kinks where the start or the end crosses an edge; every step is at most a slot wide,
    so it holds at most one kink of each kind."""
    w, base = float(edges[1] - edges[0]), float(edges[0])
    up = base + (np.floor((start - base) / w) + 1) * w  # the next edge after the start
    up_end = base + (np.floor((start + length - base) / w) + 1) * w - length
    stop = start + step
    best = np.full(np.broadcast(start, length).shape, math.inf)
    at = np.zeros_like(best)
    for s in (start, stop, np.minimum(up, stop), np.minimum(np.maximum(up_end, start), stop)):
        price = np.interp(s + length, edges, cum) - np.interp(s, edges, cum)
        better = price < best
        best, at = np.where(better, price, best), np.where(better, s, at)
    return best, at
