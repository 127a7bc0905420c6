"""The crowding term under FIFO with every served block counted
(:meth:`~blitzplan.live.bound.conditions.Capacity.refined`, ``every_block``): each served
batch's lead (:func:`leads`), O's last served block with its own share of N apart
(:func:`last_block`), and the least the real completions add over N's share of the served work
(:func:`served_extra_s`), for the capacity conditions
(:class:`~blitzplan.live.bound.conditions.Capacity`) of a set of states.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity, Layer

__all__ = ["kinks", "last_block", "leads", "served_extra_s"]

_Paid = tuple[np.ndarray, np.ndarray, np.ndarray]
"""The leads (:func:`leads`), and at each lead's kink the share ``x`` and ``O(x)``."""

_Tail = tuple[np.ndarray, np.ndarray, np.ndarray]
"""O's last served block (:func:`last_block`): its base, its most share, its lead."""


def last_block(cap: Capacity, placed: np.ndarray, free: np.ndarray, total: np.ndarray) -> _Tail:
    """Per state under FIFO, of O's last served batch ``m``: ``L pO_m + ready*`` (with
    ``ready*`` the least of ``d_m`` and ``d_t + pO_t`` over the served ``t`` before it)
    less ``(1 - rho)^+`` times its most share ``x_m``; that share; and its lead ``B -
    free`` (:meth:`Capacity.extra_s`)."""
    order = cap.table.fifo_rank
    if order is None:
        raise ValueError("last_block needs O in FIFO order")
    rank = np.where(placed > 0, order[None, :], -1)
    m = rank.argmax(axis=1)
    rows = np.arange(m.size)
    after = np.where(placed > 0, cap.handoff + cap.p_old, math.inf)
    after[rows, m] = cap.handoff[m]
    share = cap.most_share[m]
    base = cap.whole[m] + after.min(axis=1) - max(0.0, 1.0 - cap.ratio) * share
    return np.asarray(base), np.asarray(share), np.asarray(total - free)


def leads(
    cap: Capacity, mask: np.ndarray, placed: np.ndarray, free: np.ndarray, total: np.ndarray
) -> np.ndarray:
    """(states x columns): ``B_t - E_t`` per served batch ``t`` whose completion the
    program charges ``E_t`` and whose O block ends at least ``B_t - x`` when N runs ``x``
    (in O's time) of the served batches: ``B_t = b_O + sum L pO`` over ``t`` and the
    batches O serves before it. Under FIFO only (where a state's sequence is its set in
    release order): ``E_t`` replayed as the program placed them. Unserved: -inf. (Under
    the free order only the last block counts, ``B - free``: :meth:`Capacity.crowded`.)"""
    out = np.full(placed.shape, -math.inf)
    at = np.full(free.shape, cap.b_old)
    served = np.stack([np.zeros(free.shape), np.full(free.shape, math.inf)])
    for i in cap.table.relax.instance.fifo_order:
        rows = placed[:, i] > 0
        end = cap.table.end(i, at, served)
        at = np.where(rows, end, at)
        served[0] += np.where(rows, cap.whole[i], 0.0)
        served[1] = np.where(rows, np.minimum(served[1], cap.after[i]), served[1])
        out[:, i] = np.where(rows, cap.b_old + served[0] - end, -math.inf)
    return out


def kinks(leads: np.ndarray) -> _Paid:
    """The leads, and at each lead's kink the share ``x`` and ``O(x)`` (the same at every
    point: taken once a part of states)."""
    return leads, _at(leads), _on_old(leads, _at(leads))


def served_extra_s(cap: Capacity, layer: Layer, paid: _Paid, tail: _Tail) -> np.ndarray:
    """:meth:`Capacity.extra_s` under FIFO with every served block counted (arrays, one entry per
    state): the least the real completions add to the program's over the work ``x = sum
    k pO`` N runs of the served batches (in O's time). (With the last block alone, ``x =
    B - T``, this is :meth:`Capacity.extra_s`, which is cheaper and runs first on every state.)

    *O's side.* O ran the rest of the served work before each served batch ``t``
    completes, so ``C_t >= B_t - x`` (:func:`leads`) and the served batches add at least
    ``O(x) = sum_t (B_t - E_t - x)^+``; the last, ``T >= max(free, B - x)`` with ``B =
    total``. *N's side.* After a point ``s`` N runs the N-only batches' layers that cannot start
    before it (``work`` is ``s`` plus them) and at least ``rho x - below`` of the served
    batches' (``below``, their work that may run before ``s``), so its last operation ends at
    ``Z(x) = work + max(0, rho x - below)`` or later when that is work at all. That operation is
    an N-only batch's (it completes at ``c >= Z``: ``+ (Z - last)^+``), or a served batch's,
    whose block and every block after it on O come later (``T >= Z + ready``, ``ready`` the
    least ``pO`` plus the least hand-off among them: ``+ (Z + ready - max(B - x, free))^+``),
    or, without N-only batches (``none_left``) and ``rho x <= below``, there may be none (``+
    0``). The served-batch case is also bounded by :func:`_last_share` (the larger counts). Each
    case is piecewise linear in ``x``, growing past its kinks, so its least over ``x >= 0`` is
    at ``0`` or a kink: the leads, the
    kink of ``Z``, ``B - free``, and where a ``(.)^+`` term turns 0. ``paid`` is the
    leads, and at each lead's kink ``x`` and ``O(x)`` (the same at every layer).
    """
    free, last, total, below, work, ready, none_left = layer
    rho = cap.ratio
    kink = below / rho  # where N's share of the served work starts to count
    fixed = [
        np.zeros(free.shape),
        kink,
        total - free,
        (last - work + below) / rho,  # Z(x) = last, sloped part
        total - work - ready,  # Z(x) + ready = B - x, flat part
        (total - work + below - ready) / (1 + rho),  # the same, sloped part
        (free - ready - work + below) / rho,  # Z(x) + ready = free, sloped part
    ]
    leads, at_leads, on_leads = paid
    at_fixed = _at(np.stack(fixed, axis=1))
    at = np.concatenate([at_fixed, at_leads], axis=1)
    on_old = np.concatenate([_on_old(leads, at_fixed), on_leads], axis=1)
    busy = work[:, None] + np.maximum(0.0, rho * at - below[:, None])
    on_new = np.maximum(0.0, busy - last[:, None])
    late = np.maximum(total[:, None] - at, free[:, None])
    served_last = np.maximum(0.0, busy + ready[:, None] - late)
    n_only = (on_old + on_new).min(axis=1)  # N's last operation an N-only batch's
    served = (on_old + served_last).min(axis=1)  # a served batch's: two valid bounds
    served = np.maximum(served, _last_share(cap, layer, paid, tail))
    idle = np.maximum(leads - kink[:, None], 0.0).sum(axis=1)  # no N work after u_l
    least = np.minimum(n_only, np.where(none_left, np.minimum(served, idle), served))
    return np.asarray(np.maximum(least, 0.0))


def _last_share(cap: Capacity, layer: Layer, paid: _Paid, tail: _Tail) -> np.ndarray:
    """The served-batch case of :meth:`Capacity.extra_s` under FIFO, with O's last block's own share
    ``x_m`` apart: ``w = x - x_m`` is what N runs of the earlier ones, so ``C_t >= B_t -
    w`` for ``t < m``. N's last operation, a served batch's, ends at ``Z >= work + rho (w
    + x_m) - below``; the block of its batch (``m``, after ``d_m``, or an earlier one,
    after ``d_t + pO_t``) and then ``m``'s, ``L pO_m - x_m``, follow: ``T >= Z + ready* +
    L pO_m - x_m >= work - below + rho w + base`` (``tail[0]``, ``x_m`` at most its most
    share ``tail[1]``), and ``T >= B - w - x_m``. Convex in ``w``: least at a kink."""
    free, total, below, work = layer.free, layer.total, layer.below, layer.work
    rho = cap.ratio
    base, share, lead_m = tail
    leads, at_leads, on_leads = paid
    g = work - below + base
    fixed = [np.zeros(free.shape), (total - share - g) / (1 + rho), total - share - free]
    at_fixed = _at(np.stack([*fixed, (free - g) / rho], axis=1))
    at = np.concatenate([at_fixed, at_leads], axis=1)
    on_old = np.concatenate([_on_old(leads, at_fixed), on_leads], axis=1)
    earlier = on_old - np.maximum(lead_m[:, None] - at, 0.0)  # the blocks before m
    late = np.maximum(total[:, None] - share[:, None] - at, g[:, None] + rho * at)
    return np.asarray((np.maximum(late - free[:, None], 0.0) + earlier).min(axis=1))


def _at(x: np.ndarray) -> np.ndarray:
    """Candidate shares ``x``: at least 0, 0 where not finite (unserved columns)."""
    return np.asarray(np.where(np.isfinite(x), np.maximum(x, 0.0), 0.0))


def _on_old(leads: np.ndarray, at: np.ndarray) -> np.ndarray:
    """(states x candidates): ``O(x) = sum_t (lead_t - x)^+`` at every candidate ``x``."""
    return np.asarray(np.maximum(leads[:, None, :] - at[:, :, None], 0.0).sum(axis=2))
