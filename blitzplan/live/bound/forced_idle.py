"""N's forced idle time, in the pair bound (:mod:`blitzplan.live.bound.last_blocks`).

The pair bound, like the shared-work condition it lifts, counts N's work from ``a_1`` as if N
never waited: its last operation of a set of total work ``W`` ends at ``a_1 + W`` or later.
But early on N may have nothing to run: layer ``l`` of batch ``t`` cannot start before
``max(a_l, r_t)``, and on (40,12) seed 3 of ``benchmarks/partition.py`` the six batches queued
at 0 take 20.5 ms a layer while the layers land 44.5 ms apart.

*The idle.* Give N every layer of every batch (up to its most split), each released at
``max(a_l, r_t)`` (the chains dropped), and run them preemptively, never idle while one is
released: that schedule has done, by every time ``z``, at least the work any schedule's N has
done by ``z`` (no schedule runs more of these operations, nor any others). Let ``y_j`` be
``a_1`` plus its work when its ``j``-th idle stretch starts, and ``I_j`` its idle up to the
end of that stretch. An N that has done ``W`` of work by ``Z`` (from ``a_1``) with ``a_1 + W >
y_j`` has then done more than the greedy schedule had when that stretch started, so ``Z`` is
past the stretch and N idled at least ``I_j`` before it: ``Z >= a_1 + W + I_j``.

*In the pair bound.* There ``W >= rho (B - C_p) + k pN_i`` (the module docstring of
:mod:`.last_blocks`: ``X >= B - C_p``, ``k >= k_min``), so for ``C_p < C_j = B - (y_j - a_1
- k_min pN_i) / rho`` the claim ``h`` rises by ``I_j``; past ``C_j`` it stays as it was. The
lift is the least over ``C_p >= F`` of the larger of the two lines on each side (each side
convex piecewise linear: least at its ends or a crossing). It counts N's last operation of the
served batches and ``i`` only (not the batches left on N: the claim holds whatever else N
runs), and the larger of it and the pair bound's own lift counts (both are bounds of the same
lateness).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity
    from blitzplan.live.bound.relaxation import Relaxation

__all__ = ["FORCED_IDLE", "IDLE_STEPS", "batch_terms", "idle_extra_s", "idle_steps", "steps_of"]

FORCED_IDLE = True
"""Whether the pair bound counts N's forced idle time."""

IDLE_STEPS = 8
"""The most idle stretches counted (the last ones, the largest idle)."""


def idle_steps(relax: Relaxation) -> list[tuple[float, float]]:
    """``(y_j, I_j)`` per idle stretch of the greedy N schedule (module docstring): ``a_1``
    plus its work when the stretch starts, its idle up to the stretch's end; the last
    :data:`IDLE_STEPS` of them."""
    inst = relax.instance
    restriction = relax.restriction
    a1 = inst.usable_s[0]
    ops = sorted(
        (max(inst.usable_s[layer], inst.release_s[t]), inst.new_layer_s[t])
        for t in range(inst.num_batches)
        for layer in range(min(restriction.split_max[t], inst.num_layers))
    )
    at, work, idle = a1, 0.0, 0.0
    steps: list[tuple[float, float]] = []
    for release, length in ops:
        if release > at:
            idle += release - at
            steps.append((a1 + work, idle))
            at = release
        at += length
        work += length
    return steps[-IDLE_STEPS:]


def steps_of(cap: Capacity) -> list[tuple[float, float]]:
    """:func:`idle_steps` of ``cap``'s relaxation, taken once per program (none without
    :data:`FORCED_IDLE`)."""
    if not FORCED_IDLE:
        return []
    found = _STEPS.get(id(cap))
    if found is None or found[0] is not cap:
        found = (cap, idle_steps(cap.table.relax))
        _STEPS.clear()  # one program at a time: the last one's
        _STEPS[id(cap)] = found
    return found[1]


_STEPS: dict[int, tuple[Capacity, list[tuple[float, float]]]] = {}


def batch_terms(cap: Capacity, i: int | np.ndarray) -> tuple[np.ndarray, ...]:
    """Batch ``i``'s (or, per state, each batch of ``i``'s) ``pN``, ``pO``, hand-off, least
    split and most split under ``L`` in ``cap``'s relaxation, as the lifts read them."""
    restriction = cap.table.relax.restriction
    low = np.asarray(restriction.split_min)[i]
    high = np.minimum(np.asarray(restriction.split_max)[i], cap.layers - 1)
    return cap.p_new[i], cap.p_old[i], cap.handoff[i], low, high


def idle_extra_s(
    cap: Capacity,
    i: int | np.ndarray,
    steps: list[tuple[float, float]],
    free: np.ndarray,
    served: np.ndarray,
    ends: np.ndarray,
) -> np.ndarray:
    """Per parent state (O free at ``free``, having served ``served``:
    :meth:`~blitzplan.live.bound.conditions.Capacity.served`), the pair bound's lift with N's
    forced idle (module docstring) when ``i`` is served next and completes at ``ends`` in the
    program; 0 where O served none before."""
    L, (p_new, p_old, handoff, low, high) = cap.layers, batch_terms(cap, i)
    work, prior = served
    total = cap.b_old + work
    q = np.where(low == 0, prior + L * p_old, math.inf)
    first = np.maximum(low, 1)
    own = np.minimum(first * (p_new - p_old), high * (p_new - p_old))
    q = np.where(high >= first, np.minimum(q, np.minimum(handoff, prior) + L * p_old + own), q)
    rest = (L - high) * p_old
    rho = cap.ratio
    plain = cap.a1 + rho * total + q  # h(C) = plain - rho C while C < B (X > 0)

    def value(at: np.ndarray, base: np.ndarray | None) -> np.ndarray:
        h = -math.inf if base is None else base - rho * at
        return np.asarray(at + np.maximum(np.maximum(ends, at + rest), h))

    def least(lo: np.ndarray, hi: np.ndarray, base: np.ndarray) -> np.ndarray:
        """The least of ``value`` with the claim ``base`` over ``C`` in ``[lo, hi]`` (inf
        where ``hi <= lo``): the claim holds on ``[lo, hi)``, and the least over it is the
        least over the closed interval (the value is continuous)."""
        out = np.full(np.broadcast_shapes(lo.shape, hi.shape, base.shape), math.inf)
        for raw in (lo, hi, (base - ends) / rho, (base - rest) / (1 + rho)):
            at = np.clip(np.where(np.isfinite(raw), raw, lo), lo, np.maximum(lo, hi))
            out = np.minimum(out, value(at, base))
        return np.asarray(np.where(hi > lo, out, math.inf))

    if not steps:
        return np.zeros(free.shape)
    # every step at once, one row each (the same element-wise operations as one step at a time)
    y = np.asarray([step[0] for step in steps], dtype=float)[:, None]
    idle = np.asarray([step[1] for step in steps], dtype=float)[:, None]
    with np.errstate(invalid="ignore"):
        tail = value(np.maximum(total, free), None)  # C_p >= B: no claim
        # the claim with the idle while a_1 + rho (B - C) + k_min pN_i > y (and C < B)
        cut = total - (y - cap.a1 - low * p_new) / rho
        cut = np.minimum(np.where(low * p_new > y - cap.a1, total, cut), total)
        mid = np.maximum(cut, free)
        inside = least(free, mid, plain + idle)
        past = least(mid, np.maximum(total, mid), plain)
        got = np.minimum(np.minimum(inside, past), tail) - free - ends
        lift = np.maximum.reduce(np.where(np.isfinite(got), got, 0.0), axis=0, initial=0.0)
    lift = lift - 1e-9
    return np.asarray(np.where(np.isinf(prior), 0.0, np.maximum(lift, 0.0)))
