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

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity

__all__ = ["PAIRS", "PAIRS_SLACK_S", "carry_pairs", "pair_extra_s"]

PAIRS = True
"""Whether the free-order capacity program counts the pair bound."""

PAIRS_SLACK_S = 1e-9
"""Taken off every lift (cost units): the crossings' rounding."""


def pair_extra_s(
    cap: Capacity,
    i: int,
    free: np.ndarray,
    served: np.ndarray,
    ends: np.ndarray,
) -> np.ndarray:
    """Per parent state (O free at ``free``, having served work ``served``:
    :meth:`Capacity.served`), the pair bound's lift when batch ``i`` is served next and
    completes at ``ends`` in the program (module docstring); 0 where O served none before."""
    inst = cap.table.relax.instance
    restriction = cap.table.relax.restriction
    L = inst.num_layers
    p_new, p_old, handoff = inst.new_layer_s[i], inst.old_layer_s[i], inst.handoff_s[i]
    low = restriction.split_min[i]
    high = min(restriction.split_max[i], L - 1)
    work, prior = served
    total = cap.b_old + work  # B over the parent's set
    q = np.full(free.shape, math.inf)
    if low == 0:  # no layer of i on N: N's last operation is an earlier batch's
        q = np.minimum(q, prior + L * p_old)
    if high >= max(low, 1):
        first = max(low, 1)
        own = min(first * (p_new - p_old), high * (p_new - p_old))  # k (pN_i - pO_i)
        q = np.minimum(q, np.minimum(handoff, prior) + L * p_old + own)
    left = (L - high) * p_old  # i's least block after p's
    rho = cap.ratio
    base = cap.a1 + rho * total + q  # h(C) = base - rho C

    def value(at: np.ndarray, claim: bool) -> np.ndarray:
        h = base - rho * at if claim else np.full(at.shape, -math.inf)
        return np.asarray(at + np.maximum(np.maximum(ends, at + left), h))

    with np.errstate(invalid="ignore"):
        top = np.maximum(total, free)
        least = value(top, claim=False)  # C_p >= B: no claim
        open_ = free < total  # C_p in [F, B): the claim holds
        candidates = [free, total, (base - ends) / rho, (base - left) / (1 + rho)]
        for raw in candidates:
            at = np.where(np.isfinite(raw), np.clip(raw, free, top), free)
            least = np.where(open_, np.minimum(least, value(at, claim=True)), least)
    lift = least - free - ends - PAIRS_SLACK_S
    lift = np.where(np.isfinite(lift), lift, 0.0)
    return np.asarray(np.where(np.isinf(prior), 0.0, np.maximum(lift, 0.0)))


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
