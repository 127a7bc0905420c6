"""O's idle time in the pair bound (:mod:`blitzplan.live.bound.last_blocks`): a block that waits
for its batch leaves N more of the served work.

The pair bound counts O's work on the batches it served up to ``p`` as ``C_p >= B - X`` (``X``
the part of it N ran), as if O never waited. But a block cannot start before its batch's
earliest start ``s_u`` (its release, or under a restriction the earliest its least split lets
it: ``rho_u(0)`` of :mod:`blitzplan.live.bound.relaxation`): if O ends the block before it at
``C' < s_u``, O idles ``s_u - C'``, and then ``C_p >= B - X + idle``: N must have run that
much more of the served work, which delays the last block the pair bound charges. On (32,8)
free seed 1 of ``benchmarks/partition.py`` the best schedule ends O's first two blocks at
0.411 s, then O waits for the short batch 7 released at 0.419 s: the program's best state, in
that order, bounds the last block 10.5 ms early, 8.3 ms of it that wait.

*The credit.* O's blocks may end later than the program's states say, but each unit a block
ends later is a unit of latency the state's ``cost - free`` does not count (the hidden
lateness, ``H``). Along a state's path, with ``F'`` the free time of the state it grew from and
``s_u`` the block's earliest start, ``iota = sum max(0, s_u - F')``; then every schedule the
state stands for has ``H + I >= iota`` (``I`` O's idle up to the state's last block): a block
that ends ``delta`` later than its state waits ``delta`` less, and ``delta + max(0, a - delta)
>= max(0, a)``. The merge keeps it: a state ``d`` dropped for a kept ``a`` (no later, ``cost -
free`` no higher) stands for schedules in which ``a`` hides ``(cost_d - free_d) - (cost_a -
free_a)`` more lateness than ``d``, so ``a`` keeps the least of its credit and ``iota_d`` plus
that difference (:func:`carry`).

*In the pair bound.* With ``y = C_p - I``, ``X >= B - y``, and ``H + (C_p - F) + (C_i - E_i)``
is at least ``iota + (y - F) + max(E_i, max(y, F) + (L - k_max) pO_i, h(y)) - E_i`` over ``y
>= F - iota`` (the idle taken as small as ``C_p >= F`` allows, the rest of the credit hidden
lateness): the pair bound's least, over a range reaching ``iota`` lower, plus ``iota``. With
``iota = 0`` it is the pair bound; it is never lower.

*The block that ends them.* When N's last operation (at ``Z``) is a served batch ``t``'s, the
pair bound has O's blocks before ``i`` end at least ``d_t + pO_t`` after it, the least over the
served batches: on that seed the short batch 7 (0.44 ms) where the last batch's own hand-off
is 2.68 ms. But ``t``'s block (at least ``(L - k_max_t) pO_t``) then ends O's served blocks
only if it is the last of them; otherwise a block of another served batch ``u`` follows it
(at least ``(L - k_max_u) pO_u``). A state carries the batches that may end its blocks (its
own last, and those of the states the merge dropped for it, :func:`carry_lasts`), and the
pair bound takes the least of ``d_t`` plus ``t``'s least block over those, and of ``d_t`` plus
``t``'s and another served batch's least blocks over every served ``t``
(:func:`ready_after`).

Mean latency, free order, with the capacity conditions (where the merge is on ``cost -
free``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity
    from blitzplan.live.bound.relaxation import Relaxation

__all__ = [
    "LAST_READY",
    "OLD_IDLE",
    "carry",
    "carry_lasts",
    "earliest_starts",
    "ready_after",
    "ready_matters",
    "step",
]

OLD_IDLE = True
"""Whether the pair bound counts the credit of O's waits (the module docstring)."""

LAST_READY = True
"""Whether the pair bound tells the served batch that may end O's served blocks from the
others (the module docstring)."""


def earliest_starts(relax: Relaxation) -> np.ndarray:
    """Per batch, the earliest its block on O may start (inf where it may not be served)."""
    return np.asarray([o.rho[0] if o.rho else math.inf for o in relax.options])


def step(starts: np.ndarray, i: int | np.ndarray, free: np.ndarray) -> np.ndarray:
    """What serving batch ``i`` (or ``i[s]`` for state ``s``) next, O free at ``free``, adds
    to a state's credit."""
    return np.asarray(np.maximum(starts[i] - free, 0.0))


def carry(merged: dict[str, np.ndarray], keep: np.ndarray) -> None:
    """In a merge (``merged`` sorted by set, then O free time; ``keep`` its front), each
    dropped state's credit passed to the kept state before it in its set, in place: the
    dropped credit plus what the kept state's ``cost - free`` is lower (lateness it hides
    more), the least counts."""
    idle = merged["idle"].copy()
    rank = merged["cost"] - merged["free"]
    index = np.arange(keep.size)
    kept_before = np.maximum.accumulate(np.where(keep, index, -1))
    dropped = np.flatnonzero(~keep)
    to = kept_before[dropped]
    np.minimum.at(idle, to, idle[dropped] + np.maximum(rank[dropped] - rank[to], 0.0))
    merged["idle"] = idle


def carry_lasts(merged: dict[str, np.ndarray], keep: np.ndarray) -> None:
    """In a merge (as :func:`carry`), each dropped state's possible last blocks added to those
    of the kept state before it in its set, in place."""
    lasts = merged["lasts"].copy()
    index = np.arange(keep.size)
    kept_before = np.maximum.accumulate(np.where(keep, index, -1))
    dropped = np.flatnonzero(~keep)
    np.bitwise_or.at(lasts, kept_before[dropped], lasts[dropped])
    merged["lasts"] = lasts


def ready_after(cap: Capacity, mask: np.ndarray, lasts: np.ndarray) -> np.ndarray:
    """Per state (O served the set ``mask``, ending with one of the blocks ``lasts``), the
    least time from N's last operation, if a served batch's, to the end of O's last served
    block (inf where O served none; see the module docstring)."""
    table = cap.table
    block = cap.whole - cap.most_share  # each batch's least block on O
    after = cap.handoff + block
    by_block = np.argsort(block, kind="stable")
    placed = ~table.unplaced(mask)
    own = np.asarray((lasts[:, None] & table.bits[None, :]) != 0) & placed
    as_last = np.where(own, after[None, :], math.inf).min(axis=1)
    rows = np.arange(mask.size)
    ranked = placed[:, by_block]  # the served batches, least block first
    first = by_block[ranked.argmax(axis=1)]  # (meaningless where none is served)
    ranked[rows, ranked.argmax(axis=1)] = False
    some_other = ranked.any(axis=1)
    second = np.where(some_other, block[by_block[ranked.argmax(axis=1)]], math.inf)
    others = placed.copy()
    others[rows, first] = False
    before_other = np.where(others, after[None, :], math.inf).min(axis=1) + block[first]
    before_first = after[first] + second
    before_last = np.where(placed.any(axis=1), np.minimum(before_other, before_first), math.inf)
    return np.asarray(np.minimum(as_last, before_last))


def ready_matters(cap: Capacity, i: int) -> float:
    """The least served batches' ``d_t + pO_t`` (:meth:`Capacity.served`) at which the pair
    bound with batch ``i`` served next no longer reads it: its case where N's last operation
    is ``i``'s costs ``min(d_i, ready) + k (pN_i - pO_i)`` past the claim, so a ready time at
    least ``d_i`` plus that (for its least such ``k``) changes nothing (inf where ``i`` runs
    no layer on N)."""
    inst, restriction = cap.table.relax.instance, cap.table.relax.restriction
    L = inst.num_layers
    low, high = restriction.split_min[i], min(restriction.split_max[i], L - 1)
    if high < max(low, 1):
        return math.inf
    slope = inst.new_layer_s[i] - inst.old_layer_s[i]
    own = min(max(low, 1) * slope, high * slope)
    return float(inst.handoff_s[i] + max(own, 0.0))
