"""The least objective any schedule of a relaxed plan's splits and O order can have.

The exact search (:mod:`blitzplan.live.exact.bnb`) offers every relaxed plan it bounds,
repaired (:meth:`~blitzplan.live.exact.offers.Offers.repaired`): N list-scheduled against it,
re-timed, checked. Whatever order N runs its operations in, layer ``l`` of batch ``i`` starts
no earlier than its arrival and than the layer before it (its alone chain), and O runs the
plan's blocks in the plan's order, each no earlier than O is free, the batch's release and
its last N layer plus the hand-off. :func:`plan_floor` times every batch so, as
:func:`~blitzplan.live.schedule.timetable` does with N's waits left out: every step is the
same float operation on values no larger, so each completion is at most the schedule's and
the objective (non-decreasing in every completion) at most its value. A repaired plan whose
floor meets the incumbent cannot replace it (its tail re-ordered neither: that keeps the splits
and O's order), and is not built: on (80,8) free seed 5 of ``benchmarks/partition.py`` half
of the search's repaired plans.
"""

from __future__ import annotations

from blitzplan.live.bound.relaxation import RelaxedPlan
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import evaluate_objective

__all__ = ["plan_floor"]


def plan_floor(instance: LiveScalingInstance, plan: RelaxedPlan, objective: str) -> float:
    """At most the ``objective`` of every schedule with ``plan``'s splits and O order (see
    the module docstring)."""
    L, usable, release = instance.num_layers, instance.usable_s, instance.release_s
    completion = []
    for i, k in enumerate(plan.split):
        end, p = release[i], instance.new_layer_s[i]
        for layer in range(1, k + 1):
            end = max(usable[layer - 1], end) + p
        completion.append(end)
    free = instance.old_free_at_s
    for i in plan.old_sequence:
        k = plan.split[i]
        start = max(free, release[i], completion[i] + instance.handoff_s[i] * (k > 0))
        free = completion[i] = start + (L - k) * instance.old_layer_s[i]
    return evaluate_objective(instance, completion, objective)
