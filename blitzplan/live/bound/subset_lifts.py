"""Subset-aware lifts for the deadline bound (:mod:`blitzplan.live.bound.deadlines`): which
``m`` batches complete first decides both their work and when it can run.

The deadline bound lifts the ``m``-th completion ``c_m`` of the batches left on N (the set
``F``) to ``s + P_m + W_t`` (``P_m``: the ``m`` smallest works of ``F``; ``W_t``: the served
work N ran, after ``s = a_1``, before O's block ``t``), or moves that block. ``P_m`` takes the
smallest works whatever their batches' releases and layers' arrivals: on (80,16) FIFO seed 8 of
``benchmarks/partition.py`` the root program's cheapest states leave on N early long batches
and a late short one, and the ``m`` smallest works then mix a batch released at 1.9 s with the
early ones, whose last layers only arrive at 2.9 s.

*The lift.* Let ``S`` be the ``m`` batches that complete first. Either ``c_m >= D_t`` (then
N ran ``S``'s work and ``W_t`` in ``[s, c_m]``), or ``c_m < D_t`` (then in ``[s, D_t]``). In
both cases N, one operation at a time, ran all of it in ``[s, Z]`` with ``Z = max(c_m,
D_t)``, so ``Z >= s + W_t + P(S)``, and for every capacity point ``tau > s``
(:attr:`~blitzplan.live.bound.conditions.Capacity.points`: layer arrivals and releases, with
the work each batch's alone chain cannot start before ``tau``) where ``S`` has such work
``w_tau(S) > 0``, ``Z >= tau + w_tau(S)`` (``W_t`` may run before ``tau``: not counted
there). ``S`` is not known: ``Z >= M_m(W_t) = min over |S| = m of max(s + W_t + P(S), R(S))``
with ``R(S) = max_tau (tau + w_tau(S))``. The deadline bound's two cases then read ``c_m >=
M_m(W_t)`` or ``C_t >= M_m(W_t) + r_t``, with ``M_m(W) >= s + P_m + W`` (its own lift).

``M_m`` is a minimum of functions of ``W`` (not convex): the deadline bound's least over its
candidate shares is exact only at their kinks, so here the shares run over a grid, and on each
interval between two grid values every term that grows with the share is taken at its lower
end and every one that falls (O's lead ``B_t - X``) at its upper end (a relaxation of the
interval: still a bound). Subsets are enumerated: states leaving more than
:data:`SUBSET_MAX_LEFT` batches on N get the plain lift.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from blitzplan.live.bound.conditions import Capacity

__all__ = ["SUBSET_GRID", "SUBSET_LIFTS", "SUBSET_MAX_LEFT", "subset_lifts"]

SUBSET_LIFTS = True
"""Whether the deadline bound also takes the subset-aware lifts (at its first point)."""

SUBSET_MAX_LEFT = 8
"""States leaving more batches on N get the plain lift (``2^|F|`` subsets a state)."""

SUBSET_GRID = 96
"""Shares (evenly from 0 to the largest lead) added to the deadline bound's candidates."""

_MASKS = {
    f: ((np.arange(1 << f)[:, None] >> np.arange(f)[None, :]) & 1).astype(float)
    for f in range(1, SUBSET_MAX_LEFT + 1)
}
"""Per ``|F|``, every subset as a 0/1 row."""


def subset_lifts(
    cap: Capacity, left: np.ndarray, at: float, works: np.ndarray, ranks: int
) -> np.ndarray:
    """(states x shares x ranks + 1): ``M_m(W)`` (module docstring) at every ``W`` of
    ``works`` (states x shares, N's served work after ``at``), ``-inf`` where not taken (rank
    0, ranks past ``|F|``, states leaving too many)."""
    states, shares = works.shape
    out = np.full((states, shares, ranks + 1), -math.inf)
    whole = cap.layers * cap.p_new
    later = [(t, whole - under) for t, under in cap.points if t > at]
    taus = np.asarray([t for t, _ in later], dtype=float)
    after = np.zeros((len(later), whole.size))  # points x batches: work from each on
    for k, (_, w) in enumerate(later):
        after[k] = w
    for row in range(states):
        members = np.flatnonzero(left[row])
        f = members.size
        if not f or f > SUBSET_MAX_LEFT:
            continue
        masks = _MASKS[f]
        size = masks.sum(axis=1).astype(int)
        alpha = at + masks @ whole[members]
        late = masks @ after[:, members].T  # subsets x points
        beta = np.where(late > 0, taus[None, :] + late, -math.inf).max(axis=1, initial=-math.inf)
        w = works[row][:, None]
        for m in range(1, min(f, ranks) + 1):
            pick = size == m
            out[row, :, m] = np.maximum(w + alpha[pick][None, :], beta[pick][None, :]).min(axis=1)
    return out
