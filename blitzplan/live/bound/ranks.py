"""The rank bound: the served batches' N work delays every batch left on N, not only the last.

The capacity conditions (:class:`~blitzplan.live.bound.conditions.Capacity`) bound the
batches left on N (the set ``F``) by order statistics of their own work (the ``m``-th to
complete has, with the ``m - 1`` before it, run its layers from ``l`` on after ``a_l``), and
charge the served batches' N work to the last completion only (:meth:`Capacity.extra_s`). On
(80,16) FIFO of ``benchmarks/partition.py`` N is busy from ``a_1`` to its last operation, the
batches O serves hand off within the first half of that, and the batches left on N complete
one after the other once the head has arrived: each of them, not only the last, completes
after all the served work N ran.

*The bound.* Let N run ``x`` (in O's time, ``sum k pO``) of the served batches. O ran the rest
of the served work before each served ``t`` completes: ``C_t >= B_t - x``
(:func:`~.served_blocks.leads`, ``B_t = b_O + sum L pO`` over ``t`` and the served batches
before it, under FIFO), and O's last
completion ``T >= max(free, B - x)``. Fix a point ``s`` (:attr:`Capacity.points`): the served
batches' N work after ``s`` is at least ``W = max(0, rho x - below)`` and ends by ``D <= T -
ready`` (each served batch hands off before its block, which runs a layer; ``ready`` the least
``pO`` plus the least hand-off). The ``m`` batches of ``F`` to complete first run at least
``P_m`` after ``s``, the sum of the ``m`` smallest works after ``s`` in ``F``. If ``s + P_m + W >
D``, the ``m``-th completion ``c_m`` is not before ``D`` (else those batches and the served work
fit before ``D``), so all of that work is done by it: ``c_m >= lift_m = s + P_m + W``; it holds
when ``c_m' = lift_m + ready > T`` and ``P_m + W > 0`` (without work after ``s`` the batches may
complete before it). With the program's order statistics ``e_m`` (valid alone),
``c_m >= max(e_m, lift_m)``. So a complete state of the program (its cost counts O's blocks at
``E_t``, the last at ``free``, and the batches left on N at ``e_m``) completes at least

    ``min over x >= 0, T >= max(free, B - x) of  sum_{t not last} (B_t - E_t - x)^+ + (T - free)
    + sum_{m: c_m' > T} (lift_m - e_m)^+``

above the program's total. For a given ``x`` the least ``T`` is ``max(free, B - x)`` or a
``c_m'`` (which drops the lifts up to ``m``); in ``x`` each such choice is piecewise linear, so
the least is at ``0``, a lead, where ``W`` starts, where ``B - x`` passes ``free``, where a lift
passes its ``e_m``, or where a ``c_m'`` passes ``free`` or ``B - x``: all are tried.
:data:`RANKS_SLACK_S` is taken off (rounding at a crossing).

O in FIFO order only: there the capacity program keeps one state per set (the set fixes O's
sequence and each step's completion), so a state's blocks are those :func:`~.served_blocks.leads`
replays. (Under a free order, without the leads, only ``T >= max(free, B - x)`` would count:
that lifted none of (80,16) free seeds 0-3's root capacity bounds.)
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from blitzplan.live.bound import served_blocks

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity, Crowding

__all__ = ["RANKS", "RANKS_POINTS", "RANKS_SLACK_S", "rank_extra_s"]

RANKS = True
"""Whether the capacity program (:mod:`blitzplan.live.bound.subsets`) counts the rank
bound (O in FIFO order)."""

RANKS_SLACK_S = 1e-7
"""Taken off every state's rank bound (cost units): a lift switches off at a crossing that
rounding may put on either side."""

RANKS_POINTS = 1
"""The capacity conditions' points the bound is taken at: the first (``a_1``, where every layer
counts). On (80,16) FIFO seeds 0, 2 and 5 of ``benchmarks/partition.py`` no other of the 33
gave more on any of the 1,130 states the term lifted; the 33 took 80% of the capacity bound's
time (4 of 5 s on seed 2)."""

_CHUNK = 500
"""States evaluated together (the arrays are states x candidates x batches)."""


def rank_extra_s(cap: Capacity, crowd: Crowding, rows: np.ndarray) -> np.ndarray:
    """Per state of ``rows`` (indices into ``crowd``, complete states of the program), the
    least the real completions add to the program's total by the rank bound (module
    docstring), the largest over the capacity conditions' points; 0 where O served none."""
    out = np.zeros(rows.size)
    for begin in range(0, rows.size, _CHUNK):
        part = rows[begin : begin + _CHUNK]
        out[begin : begin + part.size] = _extra(cap, crowd, part)
    return out


def _extra(cap: Capacity, crowd: Crowding, rows: np.ndarray) -> np.ndarray:
    layer = crowd.layer
    free, total, ready = layer.free[rows], layer.total[rows], layer.ready[rows]
    mask, placed = crowd.mask[rows], crowd.placed[rows]
    left = crowd.left[rows] > 0
    rank = cap.table.fifo_rank
    if rank is None:
        raise ValueError("the rank bound needs O in FIFO order")
    leads = served_blocks.leads(cap, mask, placed, free, total)  # every served block but the last
    last = np.where(placed > 0, rank[None, :], -1).argmax(axis=1)  # its excess is T - free
    leads[np.arange(rows.size), last] = -math.inf
    ends = _rank_ends(cap, left)  # e_m, +inf past |F|
    best = np.zeros(rows.size)
    full = cap.layers * cap.p_new
    for at, under in cap.points[:RANKS_POINTS]:
        works = np.sort(np.where(left, full - under, math.inf), axis=1)
        own = np.cumsum(works, axis=1)  # P_m (inf past |F|)
        terms = _Terms(free, total, ready, placed @ under, (at, own), ends, leads, cap.ratio)
        best = np.maximum(best, terms.least())
    return np.where(mask == 0, 0.0, np.maximum(0.0, best - RANKS_SLACK_S))


def _rank_ends(cap: Capacity, left: np.ndarray) -> np.ndarray:
    """The program's order statistics of the completions of the batches left on N (as
    :meth:`Capacity.left_on_new`), ascending, in the first columns; +inf after them."""
    pos = left[:, cap.by_new]
    prefix = np.cumsum(np.where(pos, cap.sorted_new, 0.0), axis=1)
    floor = np.max([at + layers * prefix for at, layers in cap.thresholds], axis=0)
    floor = np.sort(np.where(pos, floor, math.inf), axis=1)
    alone = np.sort(np.where(left, cap.alone_end, math.inf), axis=1)
    return np.asarray(np.maximum(floor, alone))


class _Terms:
    """One point's terms, per state: ``free``, ``B``, ``ready``, ``below``, ``s + P_m``,
    ``e_m`` and the leads (-inf: not counted)."""

    def __init__(
        self,
        free: np.ndarray,
        total: np.ndarray,
        ready: np.ndarray,
        below: np.ndarray,
        point: tuple[float, np.ndarray],
        ends: np.ndarray,
        leads: np.ndarray,
        rho: float,
    ) -> None:
        self.free, self.total, self.ready, self.below = free, total, ready, below
        at, own = point
        prefix = at + own
        self.valid = np.isfinite(prefix) & np.isfinite(ends)
        self.some = own > 0  # the first m hold work after s (else they may end before it)
        self.raw = prefix
        self.prefix = np.where(self.valid, prefix, 0.0)
        self.ends = np.where(self.valid, ends, 0.0)
        self.leads, self.rho = leads, rho

    def candidates(self) -> np.ndarray:
        """(states x candidates): every ``x`` where a term has a kink or a lift switches."""
        f, b, r, w = (v[:, None] for v in (self.free, self.total, self.ready, self.below))
        rho = self.rho
        p, e = self.prefix, self.ends
        xs = [
            np.zeros(f.shape),
            self.leads,
            w / rho,  # W starts
            b - f,  # B - x passes free
            (e - p + w) / rho,  # a lift passes e_m
            (f - p + w - r) / rho,  # c_m' passes free
            (b - p + w - r) / (1 + rho),  # c_m' passes B - x
        ]
        x = np.concatenate([np.broadcast_to(v, (f.shape[0], v.shape[1])) for v in xs], axis=1)
        return np.asarray(np.where(np.isfinite(x), np.maximum(x, 0.0), 0.0))

    def least(self) -> np.ndarray:
        """The least of the bound's expression over ``x`` and ``T`` (module docstring)."""
        x = self.candidates()  # (R x X)
        rho = self.rho
        on_old = np.maximum(self.leads[:, None, :] - x[:, :, None], 0.0).sum(axis=2)
        work = np.maximum(0.0, rho * x - self.below[:, None])
        lift = self.prefix[:, None, :] + work[:, :, None]  # (R x X x n)
        switch = lift + self.ready[:, None, None]  # c_m': the lift holds while T < it
        holds = self.valid[:, None, :] & (self.some[:, None, :] | (work > 0)[:, :, None])
        gain = np.where(holds, np.maximum(0.0, lift - self.ends[:, None, :]), 0.0)
        low = np.maximum(self.free[:, None], self.total[:, None] - x)  # T's least
        held = np.where(switch > low[:, :, None], gain, 0.0).sum(axis=2)
        best = low - self.free[:, None] + held
        # T = c_m': the lifts of every m' with P_m' > P_m still hold
        p = self.raw  # +inf past |F|: never counted
        count = (p[:, None, :] <= p[:, :, None]).sum(axis=2)  # (R x n): first m' still held
        suffix = np.concatenate(
            [np.cumsum(gain[:, :, ::-1], axis=2)[:, :, ::-1], np.zeros((*gain.shape[:2], 1))],
            axis=2,
        )
        rest = np.take_along_axis(suffix, np.broadcast_to(count[:, None, :], gain.shape), axis=2)
        at_switch = switch - self.free[:, None, None] + rest
        fits = holds & (switch >= low[:, :, None])
        best = np.minimum(best, np.where(fits, at_switch, math.inf).min(axis=2))
        return np.asarray((on_old + best).min(axis=1))
