"""The deadline bound: the rank bound (:mod:`blitzplan.live.bound.ranks`) at every served
block, with N's share of the served work counted per prefix of O's FIFO sequence.

The rank bound lets N run ``x`` (in O's time) of the served batches and charges, against the
batches left on N (the set ``F``), only the deadline O's *last* block sets for that work; every
served block's lead ``B_t - x`` uses the whole ``x``. But the work N runs of the served batches
up to ``t`` (``X_t``, a prefix: ``X_1 <= X_2 <= ...`` in FIFO order) is what lets O's block
``t`` end early, and it must end before that block: on (80,16) FIFO of
``benchmarks/partition.py`` the program's cheap states end O's early blocks early by a large
``x`` that N would have to run before them, while the batches N finishes complete as if N ran it
after them.

*The bound.* For each served ``t`` (in FIFO order), with O's completion ``C_t``: O ran the rest
of the served work up to ``t``, so ``C_t >= B_t - X_t`` (``B_t``:
:func:`~.served_blocks.leads`), and ``C_t >= E_t`` (the program's completion). N ran
``W_t >= rho X_t`` of those batches after the
first layer arrival ``s = a_1`` (it runs nothing before), all of it before ``D_t = C_t - r_t``
(the last such operation's batch ``t'`` is handed off and runs a layer on O before block ``t``
ends: ``r_t``, the least ``d + pO`` over the served batches up to ``t``); so ``C_t >= s +
rho X_t + r_t`` when ``X_t > 0``. The ``m``-th completion ``c_m`` of ``F`` (``P_m``: the ``m``
smallest works of ``F``, all after ``s``): either ``c_m >= D_t`` (then the ``m`` batches and
``W_t`` ran in ``[s, c_m]``: ``c_m >= s + P_m + rho X_t``), or they ran with ``W_t`` before
``D_t``: ``C_t >= s + P_m + rho X_t + r_t``. With the program's order statistics ``e_m``
(``c_m >= e_m``), a complete state pays at least the least over ``X`` and those choices of

    ``sum_t (C_t - E_t) + sum_m (c_m - e_m)``

above the program's total. Per ``t`` the ranks ``m`` the second case covers are the first
``mu_t`` (the condition grows with ``P_m``); the rest get ``c_m >= s + P_m + rho X_t``, which
grows with ``t``, so only the last ``t`` that leaves ``m`` uncovered counts. Going through the
served blocks from the last, a state is (``X_t``, ``nu``: the ranks still open), and a
block's choice ``mu <= nu`` fixes ranks ``mu < m <= nu``: a dynamic program over ``t`` with
``X`` on candidate values. For fixed choices the problem is separable convex piecewise linear
in ``X`` on a chain ``X_1 <= ... <= X_k``, so some optimum has every ``X_t`` at 0 or a kink of
some block's terms (a tied run sits at a kink of its sum): the leads ``B_t - E_t``, where
``s + P_mu + rho X + r_t`` meets ``E_t`` or ``B_t - X``, and where ``s + P_m + rho X`` meets
``e_m``; the program takes exactly those (above the largest lead every term only grows).
:data:`DEADLINES_SLACK_S` is taken off (rounding at a kink).

At a later point ``s`` of the capacity conditions (:data:`DEADLINES_POINTS`) ``P_m`` counts the
works after ``s`` and ``W_t = max(0, rho X_t - below_t)`` (``below_t``: the served work up to
``t`` that may run before ``s``); the claims need ``P_m + W_t > 0``. ``c_m``'s claim then need
not grow with ``t``: charging the last uncovered block's alone is weaker, still valid. The
kinks add where ``W_t`` starts and the flat cover meets ``B_t - X``. On (80,16) and (32,16)
FIFO seeds 1, 2, 3, 5, 8 of ``benchmarks/partition.py`` no later point raised a root capacity
bound (all twelve arrivals: up to 6 times the time), so only ``a_1`` is taken.

O in FIFO order only (as the rank bound): a state's blocks are those :func:`~.served_blocks.leads`
replays.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from blitzplan.live.bound import served_blocks
from blitzplan.live.bound import subset_lifts as subset_module
from blitzplan.live.bound.ranks import _rank_ends

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity, Crowding

__all__ = [
    "DEADLINES",
    "DEADLINES_POINTS",
    "DEADLINES_SLACK_S",
    "deadline_extra_s",
    "subset_deadline_extra_s",
]

DEADLINES = True
"""Whether the capacity program (:mod:`blitzplan.live.bound.subsets`) counts the deadline
bound (O in FIFO order)."""

DEADLINES_SLACK_S = 1e-7
"""Taken off every state's deadline bound (cost units): a kink rounding may put on either
side."""

DEADLINES_POINTS = (0,)
"""The capacity conditions' points (:attr:`Capacity.points`) the bound is taken at: the first
(``a_1``)."""

_CHUNK = 250
"""States evaluated together (the arrays are states x candidates x ranks)."""


def subset_deadline_extra_s(cap: Capacity, crowd: Crowding, rows: np.ndarray) -> np.ndarray:
    """:func:`deadline_extra_s` with the subset-aware lifts at the first point
    (:mod:`blitzplan.live.bound.subset_lifts`; dearer: the program asks for it only on states
    the plain bound leaves under the best known)."""
    return _chunks(cap, crowd, rows, subsets=True)


def deadline_extra_s(cap: Capacity, crowd: Crowding, rows: np.ndarray) -> np.ndarray:
    """Per state of ``rows`` (indices into ``crowd``, complete states of the program), the
    least the real completions add to the program's total by the deadline bound (module
    docstring); 0 where O served none."""
    return _chunks(cap, crowd, rows, subsets=False)


def _chunks(cap: Capacity, crowd: Crowding, rows: np.ndarray, *, subsets: bool) -> np.ndarray:
    if cap.table.fifo_rank is None:
        raise ValueError("the deadline bound needs O in FIFO order")
    out = np.zeros(rows.size)
    for begin in range(0, rows.size, _CHUNK):
        part = rows[begin : begin + _CHUNK]
        with np.errstate(invalid="ignore"):  # inf - inf past the batches left on N
            out[begin : begin + part.size] = _extra(cap, crowd, part, subsets)
    return out


def _extra(cap: Capacity, crowd: Crowding, rows: np.ndarray, subsets: bool) -> np.ndarray:
    layer = crowd.layer
    free, total = layer.free[rows], layer.total[rows]
    mask, placed = crowd.mask[rows], crowd.placed[rows] > 0
    left = crowd.left[rows] > 0
    order = list(cap.table.relax.instance.fifo_order)
    leads = served_blocks.leads(cap, mask, placed.astype(float), free, total)[:, order]  # B_t - E_t
    served = placed[:, order]
    before = np.cumsum(np.where(served, cap.whole[order], 0.0), axis=1)
    highs = cap.b_old + before  # B_t
    lows = highs - np.where(served, leads, 0.0)  # E_t
    last = np.where(served, np.arange(len(order))[None, :], -1).argmax(axis=1)
    lows[np.arange(rows.size), last] = free  # the program's last block: O free at ``free``
    blocks = _Blocks(served, highs, lows, np.where(served, highs - lows, -math.inf))
    reach = np.minimum.accumulate(np.where(served, cap.after[order], math.inf), axis=1)  # r_t
    count = left.sum(axis=1)
    ranks = max(1, int(count.max()))
    ends = _rank_ends(cap, left)[:, :ranks]
    best = np.zeros(rows.size)
    for at, under in (cap.points[k] for k in DEADLINES_POINTS if k < len(cap.points)):
        works = np.sort(np.where(left, cap.layers * cap.p_new - under, math.inf), axis=1)
        own = np.concatenate(
            [np.zeros((rows.size, 1)), np.cumsum(works[:, :ranks], axis=1)], axis=1
        )
        below = np.cumsum(np.where(served, under[order], 0.0), axis=1)  # may run before s
        ranked = _Ranks(at, own, ends, count, below, reach)
        xs = _candidates(blocks, ranked, cap.ratio)
        if subsets and not under.any():  # every work after s: the first point
            best = np.maximum(best, _subset_least(cap, left, xs, blocks, ranked))
        else:
            best = np.maximum(best, _least(xs, blocks, ranked, cap.ratio))
    return np.where(mask == 0, 0.0, np.maximum(0.0, best - DEADLINES_SLACK_S))


class _Blocks(NamedTuple):
    """Per state, per column (O's FIFO order): served, ``B_t``, ``E_t``, ``B_t - E_t``."""

    served: np.ndarray
    highs: np.ndarray
    lows: np.ndarray
    leads: np.ndarray


class _Ranks(NamedTuple):
    """One point ``s``: ``P_0..P_f`` (the smallest works after ``s``), ``e_m``, ``|F|``
    (``size``), per column the served work up to it that may run before ``s``, and ``r_t``."""

    at: float
    own: np.ndarray
    ends: np.ndarray
    size: np.ndarray
    below: np.ndarray
    reach: np.ndarray


def _candidates(blocks: _Blocks, ranked: _Ranks, rho: float) -> np.ndarray:
    """(states x candidates), sorted: 0 and every kink (module docstring) in ``[0, top]``,
    ``top`` the largest lead."""
    served = blocks.served
    top = np.maximum(np.where(served, blocks.leads, 0.0).max(axis=1), 0.0)
    h, lo = blocks.highs[:, :, None], blocks.lows[:, :, None]
    w, r = ranked.below[:, :, None], ranked.reach[:, :, None]
    base = ranked.at + ranked.own[:, None, :] + r  # s + P_mu + r_t: the cover without W
    m = ranked.at + ranked.own[:, None, 1:] - ranked.ends[:, None, :]  # s + P_m - e_m
    size = top.size
    parts = [
        np.zeros((size, 1)),
        np.where(served, blocks.leads, 0.0),
        ((lo - base + w) / rho).reshape(size, -1),  # the cover meets E_t
        ((h - base + w) / (1 + rho)).reshape(size, -1),  # ... B_t - X, W sloped
    ]
    if ranked.below.any():  # W_t flat up to below_t / rho: its kinks per block
        parts += [
            ranked.below / rho,
            (h - base).reshape(size, -1),
            ((w - m) / rho).reshape(size, -1),
        ]
    else:
        parts.append(-m[:, 0, :] / rho)  # a lift meets e_m
    x = np.concatenate(parts, axis=1)
    x = np.where(np.isfinite(x), np.clip(x, 0.0, top[:, None]), 0.0)
    return np.sort(x, axis=1)


def _subset_least(
    cap: Capacity, left: np.ndarray, xs: np.ndarray, blocks: _Blocks, ranked: _Ranks
) -> np.ndarray:
    """:func:`_least` with the subset-aware lifts
    (:mod:`blitzplan.live.bound.subset_lifts`) on the candidates and an even grid, each share
    standing for the interval up to the next (its relaxation there)."""
    top = xs[:, -1:]
    grid = top * np.linspace(0.0, 1.0, subset_module.SUBSET_GRID)[None, :]
    xs = np.sort(np.concatenate([xs, grid], axis=1), axis=1)
    ranks = ranked.ends.shape[1]
    sub = subset_module.subset_lifts(cap, left, ranked.at, cap.ratio * xs, ranks)
    upper = np.concatenate([xs[:, 1:], xs[:, -1:]], axis=1)
    return _least(xs, blocks, ranked, cap.ratio, (sub, upper))


def _least(
    xs: np.ndarray,
    blocks: _Blocks,
    ranked: _Ranks,
    rho: float,
    relaxed: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """The dynamic program over the served blocks from the last (module docstring): per state
    the least of ``sum (C_t - E_t) + sum (c_m - e_m)^+``. With ``relaxed`` (the lifts at each
    share, and each share's interval's upper end) the lifts are at least those, and O's lead
    is taken at the upper end."""
    states, ranks = ranked.ends.shape
    nus = np.arange(ranks + 1)
    real = nus[None, :] <= ranked.size[:, None]  # ranks that exist (0..|F|)
    value = np.where((nus[None, :] == ranked.size[:, None])[:, None, :], 0.0, math.inf)
    value = np.broadcast_to(value, (states, xs.shape[1], ranks + 1)).copy()
    own = ranked.own[:, None, :]
    for t in range(blocks.served.shape[1] - 1, -1, -1):
        on = blocks.served[:, t]
        if not on.any():
            continue
        x, p, real_on = xs[on][:, :, None], own[on], real[on][:, None, :]
        work = np.maximum(0.0, rho * x - ranked.below[on, t][:, None, None])  # W_t
        lift = ranked.at + p + work  # s + P_m + W_t
        if relaxed is not None:
            lift = np.maximum(lift, relaxed[0][on])
        holds = real_on & ((p > 0) | (work > 0))  # without work after s: no claim
        gain = np.where(holds, np.maximum(lift - _ends(ranked.ends[on]), 0.0), 0.0)
        gain[:, :, 0] = 0.0
        fixed = np.cumsum(gain, axis=2)  # S_t(nu): ranks 1..nu fixed at this block
        cover = np.where(holds, lift + ranked.reach[on, t][:, None, None], -math.inf)
        cover = np.where(real_on, cover, math.inf)  # mu past |F|: never chosen
        v = value[on]
        after = np.minimum.accumulate(v[:, ::-1], axis=1)[:, ::-1]  # X_{t+1} >= X_t
        best = np.minimum.accumulate((fixed + after)[:, :, ::-1], axis=2)[:, :, ::-1]  # nu >= mu
        high, low = blocks.highs[on, t][:, None, None], blocks.lows[on, t][:, None, None]
        ahead = x if relaxed is None else relaxed[1][on][:, :, None]  # O's lead falls in X
        late = np.maximum(np.maximum(low, high - ahead), cover)
        value[on] = late - low - fixed + best
    return np.asarray(np.where(np.isfinite(value), value, math.inf).min(axis=(1, 2)))


def _ends(ends: np.ndarray) -> np.ndarray:
    """``e_m`` in columns ``1..f`` (rank ``m`` in column ``m``; column 0, no rank, +inf)."""
    return np.concatenate([np.full((ends.shape[0], 1), math.inf), ends], axis=1)[:, None, :]
