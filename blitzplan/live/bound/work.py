"""The work relaxation: a lower bound that counts N's capacity, which the N-capacity relaxation
(:mod:`blitzplan.live.bound.relaxation`) drops.

Every schedule of DESIGN.md section 4 processes each layer of batch ``i`` once, on N in
``pN_i`` or on O in ``pO_i``, so at least ``w_i = L min(pN_i, pO_i)`` of work, none of it before
``r_i``. O runs one operation at a time from ``b_O`` on, N one at a time from ``a_1`` (no layer is
usable earlier). Merging the two into one preemptive machine whose speed is the number of them
available (0, 1 or 2) keeps every schedule feasible and drops every other rule (splits as
prefixes, hand-offs, layer arrivals, one machine per batch at a time).

On one preemptive machine with release dates, shortest remaining work first (SRPT) makes the
``k``-th completion as early as any schedule can, for every ``k`` (a speed that varies over time
is a change of the time axis, which keeps completions in order). So in every schedule the ``k``-th
smallest completion is at least SRPT's ``k``-th, and at least the ``k``-th smallest of the
batches' own earliest completions (each batch with both instances to itself). The sum of the
larger of the two, less the releases, bounds the total latency; the last of them bounds the
makespan. It is a bound for a congested new instance, where the N-capacity relaxation is loose;
it costs ``O(n^2)`` arithmetic.
"""

from __future__ import annotations

import math

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import batch_lower_bounds

__all__ = ["WORK_OBJECTIVES", "work_bound"]

WORK_OBJECTIVES = ("mean_latency", "makespan")
"""The objectives the work relaxation bounds (for the others it returns -inf)."""


def work_bound(instance: LiveScalingInstance, objective: str) -> float:
    """A lower bound on ``objective`` over every schedule of ``instance`` (see the module
    docstring); ``-inf`` for an objective it does not bound."""
    if objective not in WORK_OBJECTIVES:
        return -math.inf
    srpt = sorted(_srpt_completions(instance))
    alone = sorted(batch_lower_bounds(instance))
    ordered = [max(a, b) for a, b in zip(srpt, alone, strict=True)]
    if objective == "makespan":
        return ordered[-1]
    return (math.fsum(ordered) - math.fsum(instance.release_s)) / instance.num_batches


def _speed(instance: LiveScalingInstance, at_s: float) -> int:
    return int(at_s >= instance.old_free_at_s) + int(at_s >= instance.usable_s[0])


def _srpt_completions(instance: LiveScalingInstance) -> list[float]:
    """Completions under SRPT on the merged machine (speed :func:`_speed`)."""
    n, layers = instance.num_batches, instance.num_layers
    left = [
        layers * min(p_new, p_old)
        for p_new, p_old in zip(instance.new_layer_s, instance.old_layer_s, strict=True)
    ]
    release = instance.release_s
    changes = sorted({instance.old_free_at_s, instance.usable_s[0], *release})
    done: list[float] = []
    clock, finished = min(changes), [False] * n
    while len(done) < n:
        later = [t for t in changes if t > clock]
        change = later[0] if later else math.inf
        ready = [i for i in range(n) if not finished[i] and release[i] <= clock]
        speed = _speed(instance, clock)
        if not ready or speed == 0:
            clock = change
            continue
        pick = min(ready, key=lambda i: left[i])
        end = clock + left[pick] / speed
        if end <= change:
            clock, left[pick], finished[pick] = end, 0.0, True
            done.append(end)
        else:
            left[pick] -= (change - clock) * speed
            clock = change
    return done
