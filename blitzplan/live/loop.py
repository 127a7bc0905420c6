"""The offline driver of the relay state machine: an online policy over a known queue.

Events are releases, layer arrivals and the ends of operations, all at booked times. At each event
time the :class:`~blitzplan.live.relay.RelayState` applies what is due and asks the policy for
every idle old and then every idle new instance (in index order, so runs are deterministic).
Several new and several old instances may share the queue (a
:class:`~blitzplan.live.instance.Fleet`).
"""

from __future__ import annotations

import heapq
import time

from blitzplan.errors import BlitzplanError, InvalidInputError
from blitzplan.live.instance import Fleet, LiveScalingInstance
from blitzplan.live.policies import Policy
from blitzplan.live.relay import RelayState
from blitzplan.live.schedule import (
    Schedule,
    batch_lower_bounds,
    check_objective,
    evaluate_objective,
    relative_gap,
)
from blitzplan.solvers.backends import SolveStatus

__all__ = ["OLD_ORDERS", "drive", "simulate"]

OLD_ORDERS = ("free", "fifo")
"""How O may order its blocks: any order (default), or release order (the paper's assumption)."""


def drive(policy: Policy, state: RelayState) -> None:
    """Run ``policy`` on ``state`` until every batch is done, with booked times."""
    wakeups = list(state.old_free_at_s)  # an old instance busy with earlier work becomes free
    heapq.heapify(wakeups)
    now = 0.0
    while True:
        state.advance(now)
        if state.finished == state.num_batches:
            return
        for op in state.decide(policy):
            heapq.heappush(wakeups, op.end_s)
        due = state.next_due_s()
        if due is not None:
            heapq.heappush(wakeups, due)
        while wakeups and wakeups[0] <= now:
            heapq.heappop(wakeups)
        if not wakeups:
            raise BlitzplanError(f"{policy.name} stopped with batches unfinished")
        now = wakeups[0]


def simulate(
    policy: Policy,
    instance: LiveScalingInstance,
    *,
    fleet: Fleet | None = None,
    objective: str = "mean_latency",
    old_order: str = "free",
) -> Schedule:
    """Run ``policy`` over the instance's queue; a FEASIBLE Schedule with a cheap lower bound.

    ``fleet`` puts several new and old instances on the same relay queue (operations carry their
    instance index in ``worker``). The bound is every batch alone on the best pair of instances.
    """
    if old_order not in OLD_ORDERS:
        raise InvalidInputError(
            f"old_order must be one of {', '.join(OLD_ORDERS)}, got {old_order!r}"
        )
    check_objective(objective, instance)
    fleet = instance.fleet() if fleet is None else fleet
    fleet.check_matches(instance)
    started = time.perf_counter()
    state = RelayState.from_instance(instance, fleet, old_order)
    drive(policy, state)
    value = evaluate_objective(instance, state.completion_s, objective)
    bound = evaluate_objective(instance, batch_lower_bounds(instance, fleet=fleet), objective)
    return Schedule(
        split=tuple(state.split),
        new_ops=tuple(state.new_ops),
        old_ops=tuple(state.old_ops),
        completion_s=tuple(state.completion_s),
        objective=value,
        status=SolveStatus.FEASIBLE,
        solve_s=time.perf_counter() - started,
        method=policy.name,
        objective_name=objective,
        old_order=old_order,
        bound=bound,
        gap=relative_gap(value, bound),
    )
