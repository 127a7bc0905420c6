"""The pair bound: under a free O order, O's last two blocks share the served batches' N work.

The capacity program (:mod:`blitzplan.live.bound.subsets`) bounds each served batch's completion
with the work N may take of the batches O served before it
(:meth:`~blitzplan.live.bound.conditions.Capacity.shared`): each block picks the share that suits
it. But O's blocks are one schedule's: if the block before ``i`` ends early, N must have run
the rest of that work, and ``i`` then waits for it. On (32,16) free of
``benchmarks/partition.py`` the program's best state ends O's next-to-last block early, as if
N had run 0.84 s of the earlier batches' layers, and its last block early, as if N had run only
0.61 s.

*The bound.* Let O serve ``p`` right before ``i``, ``S`` the batches it serves up to ``p``,
``B = b_O + sum L pO`` over ``S``. O ran the rest of ``S``'s work from ``b_O``: ``C_p >= B -
X`` with ``X = sum k_t pO_t`` over ``S``. N ran at least ``rho X`` of those batches' layers and
``k pN_i`` of ``i``'s, all from ``a_1``, one at a time; when that is work at all, its last
operation ends at ``a_1 + rho X + k pN_i`` or later, and is ``i``'s (then ``d_i`` and ``i``'s
block of ``(L - k) pO_i`` follow) or a batch ``t`` of ``S``'s (then ``d_t``, at least one layer
of ``t``'s block, and ``i``'s block after it). So for ``C_p < B`` (then ``X > 0``)::

    C_i >= h(C_p) = a_1 + rho (B - C_p) + Q_i,
    Q_i = min over i's splits k of ready_k + L pO_i + k (pN_i - pO_i),

``ready_k`` the least of ``d_t + pO_t`` over ``S`` and, for ``k >= 1``, ``d_i``. With the
program's own bounds ``C_p >= F`` (O's free time in the state ``i`` grew from), ``C_i >= E_i``
(its completion there) and ``C_i >= C_p + (L - k_max) pO_i``, the two together pay at least the
least over ``C_p >= F`` of ``C_p + max(E_i, C_p + (L - k_max) pO_i, h(C_p))`` (without ``h``
for ``C_p >= B``): a convex piecewise linear function, least at ``F``, ``B`` or where two of its
lines cross. What that least passes ``F + E_i`` is the pair bound's lift.

*Batches left on N.* When the state is completed with a set ``G`` of batches left on N (all
their layers on N after ``a_1``: ``W_G``), N's last operation above is one of theirs or a
served one's, and the work counts ``W_G`` too (so the claim holds for every ``C_p``): either
it is a served batch's, ``C_i >= h(C_p) + W_G`` (as above), or a batch of ``G``'s, whose
completion, the last of ``G``'s, is then at least ``Z = a_1 + rho X + k pN_i + W_G``, above
the program's bound ``c`` on it (the largest of its order statistics, which raising it keeps
valid), while ``i``'s block still follows ``p``'s: the lift is at least the least over ``C_p
>= F`` of ``(C_p - F) + max(0, A1, A2, A3)`` with ``A1 = C_p + (L - k_max) pO_i - E_i``,
``A2 = Z(k_min) - c`` and ``A3`` their sum at any split (``k`` cancels up to ``k (pN_i -
pO_i)``: the least of it counts), again least at ``F``, ``B`` or a crossing. The lift is the
lesser of the two cases. On (32,16) seed 5 the program's best state leaves one batch of 32
layers on N and ends O's last block 0.38 s before the best known schedule does: this case is
what sees it.

*In the program.* The lift charges ``C_p``'s lateness, which a state's ``cost - free`` hides
(the merge compares ``free`` and ``cost - free``): it is not carried into a child's cost. It is
computed when the state is grown (from its own parent) and counted only when the state is
completed (every unplaced batch left on N), as the larger of it and the crowding term
(:meth:`~blitzplan.live.bound.conditions.Capacity.extra_s`), both lifts over the same total.
The merge keeps it sound: a state ``d`` dropped for a kept ``a`` (``free_a <= free_d``,
``cost_a - free_a <= cost_d - free_d``) passes ``a`` its lift as ``free_d + lift_d - free_a``
(``a`` keeps the least), so that ``a``'s completed value is no more than ``d``'s would have
been. Mean latency, free order, with the capacity conditions only (where the merge is on
``cost - free``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from blitzplan.live.bound import forced_idle, pair_history

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity

__all__ = [
    "LAZY_PAIRS",
    "PAIRS",
    "PAIRS_SLACK_S",
    "carry_pairs",
    "fill_pairs",
    "lift_s",
    "pair_extra_s",
]

PAIRS = True
"""Whether the free-order capacity program counts the pair bound."""

LAZY_PAIRS = True
"""Whether the lifts are taken in the merge (:func:`fill_pairs`), per level and batch in one
call, for the states it keeps and the dropped ones whose carry can lower a kept state's lift,
not per chunk for every child grown: the same program (the lifts left out are ones the carry
never reads: few, 1% of the children on (32,16) seed 8 of ``benchmarks/partition.py``), 5-12%
less CPU there (seeds 2, 7, 8; docs/benchmarks.md, s23-h2)."""

PAIRS_SLACK_S = 1e-9
"""Taken off every lift (cost units): the crossings' rounding."""


def pair_extra_s(
    cap: Capacity,
    i: int | np.ndarray,
    free: np.ndarray,
    served: np.ndarray,
    ends: np.ndarray,
    left_on_new: tuple[np.ndarray, np.ndarray] | None = None,
    idle: np.ndarray | None = None,
) -> np.ndarray:
    """Per parent state (O free at ``free``, having served work ``served``:
    :meth:`Capacity.served`), the pair bound's lift when batch ``i`` is served next and
    completes at ``ends`` in the program (module docstring); 0 where O served none before.
    ``left_on_new``: per state, the N work of the batches then left on N (all their layers)
    and the program's bound on the last of their completions (-inf where none is left).
    ``idle``: per parent state, the credit of O's waits (:mod:`.pair_history`; none: 0)."""
    L, (p_new, p_old, handoff, low, high) = cap.layers, forced_idle.batch_terms(cap, i)
    work, prior = served
    total = cap.b_old + work  # B over the parent's set
    if left_on_new is None:
        w_left, last = np.zeros(free.shape), np.full(free.shape, -math.inf)
    else:
        w_left, last = left_on_new
    some = np.isfinite(last) & (w_left > 0)  # batches left on N, with work after a_1
    w_left = np.where(some, w_left, 0.0)
    # no layer of i on N (low 0): N's last operation is an earlier batch's
    q = np.where(low == 0, prior + L * p_old, math.inf)
    first = np.maximum(low, 1)
    own = np.minimum(first * (p_new - p_old), high * (p_new - p_old))  # k (pN_i - pO_i)
    q = np.where(high >= first, np.minimum(q, np.minimum(handoff, prior) + L * p_old + own), q)
    rest = (L - high) * p_old  # i's least block after p's
    rho = cap.ratio
    base = cap.a1 + rho * total + w_left + q  # h(C) = base - rho C for C < B
    low_at = free if idle is None else free - idle  # C_p less O's idle: y >= F - iota

    def served_last(at: np.ndarray, claim: np.ndarray) -> np.ndarray:
        h = base - rho * np.minimum(at, total)
        h = np.where(claim, h, -math.inf)
        block = np.maximum(ends, np.maximum(at, free) + rest)
        return np.asarray(at + np.maximum(block, h))

    with np.errstate(invalid="ignore"):
        top = np.maximum(total, low_at)
        least = served_last(top, some)  # C_p >= B: a claim only with work left on N
        open_ = low_at < total  # C_p in [F, B): the claim holds
        candidates = [low_at, free, total, (base - ends) / rho, (base - rest) / (1 + rho)]
        candidates.append((base - free - rest) / rho)
        for raw in candidates:
            at = np.where(np.isfinite(raw), np.clip(raw, low_at, top), low_at)
            least = np.where(open_, np.minimum(least, served_last(at, open_ | some)), least)
        lift = least - low_at - ends
        if some.any():
            lift = np.where(
                some, np.minimum(lift, _new_last(cap, i, free, total, ends, w_left, last)), lift
            )
    lift = lift - PAIRS_SLACK_S
    lift = np.where(np.isfinite(lift), lift, 0.0)
    return np.asarray(np.where(np.isinf(prior), 0.0, np.maximum(lift, 0.0)))


def _new_last(
    cap: Capacity,
    i: int | np.ndarray,
    free: np.ndarray,
    total: np.ndarray,
    ends: np.ndarray,
    w_left: np.ndarray,
    last: np.ndarray,
) -> np.ndarray:
    """The lift where N's last operation is a batch left on N's (module docstring): the least
    over ``C_p >= F`` of ``(C_p - F) + max(0, A1, A2, A3)``, ``A1`` ``i``'s block after ``p``'s,
    ``A2`` the last completion on N, ``A3`` both (the split ``k`` of ``i`` on both sides)."""
    L, (p_new, p_old, _, low, high) = cap.layers, forced_idle.batch_terms(cap, i)
    rho = cap.ratio
    own = np.minimum(low * (p_new - p_old), high * (p_new - p_old))
    lines = [  # (slope, intercept) in C_p for C_p < B
        (1.0, (L - high) * p_old - ends),
        (-rho, cap.a1 + rho * total + low * p_new + w_left - last),
        (1.0 - rho, L * p_old + own + cap.a1 + rho * total + w_left - ends - last),
        (0.0, np.zeros(free.shape)),
    ]

    def lift(at: np.ndarray) -> np.ndarray:
        x = rho * np.maximum(total - np.minimum(at, total), 0.0)  # rho X, X >= (B - C_p)^+
        block = at + (L - high) * p_old - ends
        on_new = cap.a1 + x + low * p_new + w_left - last
        both = at + L * p_old + own + cap.a1 + x + w_left - ends - last
        return np.asarray(
            (at - free) + np.maximum(np.maximum(block, on_new), np.maximum(both, 0.0))
        )

    top = np.maximum(total, free)
    least = lift(top)  # past B every term only grows
    candidates = [free, total]
    for j, (s1, b1) in enumerate(lines):
        for s2, b2 in lines[j + 1 :]:
            if s1 != s2:
                candidates.append((b2 - b1) / (s1 - s2))
    for raw in candidates:
        at = np.where(np.isfinite(raw), np.clip(raw, free, top), free)
        least = np.minimum(least, lift(at))
    return np.asarray(least)


def carry_pairs(merged: dict[str, np.ndarray], keep: np.ndarray, free: np.ndarray) -> None:
    """In a merge (``merged`` sorted by set, then O free time ``free``; ``keep`` its front),
    each dropped state's lift passed to the kept state before it in its set (module
    docstring), in place."""
    pair = merged["pair"].copy()
    index = np.arange(keep.size)
    kept_before = np.maximum.accumulate(np.where(keep, index, -1))
    dropped = np.flatnonzero(~keep)
    to = kept_before[dropped]
    np.minimum.at(pair, to, free[dropped] + pair[dropped] - free[to])
    merged["pair"] = np.maximum(pair, 0.0)


def fill_pairs(
    cap: Capacity,
    parent_free: np.ndarray,
    merged: dict[str, np.ndarray],
    keep: np.ndarray,
    history: tuple[np.ndarray | None, np.ndarray | None] = (None, None),
) -> None:
    """In a merge (``merged`` sorted as :func:`carry_pairs` reads it, ``keep`` its front;
    ``parent_free`` O's free time in the level the states grew from, which their ``parent``
    indexes), each state's lift (:func:`pair_extra_s`), in place, where :func:`carry_pairs`
    reads it: every kept state's, and a dropped state's only where its carry could lower its
    kept dominator's (its free time under the dominator's free time plus lift: a lift is never
    negative, so elsewhere the carry is at least the dominator's own). The others stay 0.
    ``history``: the parent level's credits of O's waits and batches that may end its blocks
    (:mod:`.pair_history`), each None where not counted."""
    pair = np.zeros(keep.size)
    kept = np.flatnonzero(keep)
    with np.errstate(invalid="ignore"):
        _lifts(cap, (parent_free, *history), merged, kept, pair)
        index = np.arange(keep.size)
        kept_before = np.maximum.accumulate(np.where(keep, index, -1))
        dropped = np.flatnonzero(~keep)
        to = kept_before[dropped]
        free = merged["free"]
        near = dropped[free[dropped] < free[to] + pair[to]]
        _lifts(cap, (parent_free, *history), merged, near, pair)
    merged["pair"] = pair


def _lifts(
    cap: Capacity,
    parents: tuple[np.ndarray, np.ndarray | None, np.ndarray | None],
    merged: dict[str, np.ndarray],
    rows: np.ndarray,
    out: np.ndarray,
) -> None:
    """:func:`pair_extra_s` of the states ``rows`` of ``merged`` into ``out``, per batch each
    grew by (its parent's set, free time and credit of O's waits, its own end, the batches it
    leaves on N); ``parents``: the parent level's free times, credits and batches that may
    end its blocks (:mod:`.pair_history`)."""
    table = cap.table
    parent_free, parent_idle, parent_lasts = parents
    last, mask = merged["last"][rows], merged["mask"][rows]
    served = cap.served(mask & ~table.bits[last])
    if parent_lasts is not None:  # where it can change the lift (pair_history.ready_matters)
        lasts = parent_lasts[merged["parent"][rows]]
        cuts = np.asarray([pair_history.ready_matters(cap, b) for b in range(table.n)])
        need = np.flatnonzero(served[1] < cuts[last])
        served[1, need] = pair_history.ready_after(
            cap, mask[need] & ~table.bits[last[need]], lasts[need]
        )
    left = table.unplaced(mask)
    works, ends_new = left @ (cap.layers * cap.p_new), cap.last_on_new(left)
    free, ends = parent_free[merged["parent"][rows]], merged["free"][rows]
    idle = None if parent_idle is None else parent_idle[merged["parent"][rows]]
    out[rows] = lift_s(cap, last, free, served, ends, (works, ends_new), idle)  # all at once


def lift_s(
    cap: Capacity,
    i: int | np.ndarray,
    free: np.ndarray,
    served: np.ndarray,
    ends: np.ndarray,
    left_on_new: tuple[np.ndarray, np.ndarray],
    idle: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`pair_extra_s` (with ``idle``, the parents' credits of O's waits), and the larger
    of it and the lift with N's forced idle
    (:func:`~blitzplan.live.bound.forced_idle.idle_extra_s`) where N must idle."""
    lift = pair_extra_s(cap, i, free, served, ends, left_on_new, idle)
    steps = forced_idle.steps_of(cap)
    if not steps:
        return lift
    return np.asarray(np.maximum(lift, forced_idle.idle_extra_s(cap, i, steps, free, served, ends)))
