"""A node's capacity bound in the exact search (:mod:`blitzplan.live.exact.bnb`).

A node's own bound is the N-capacity relaxation of its restriction: it sees the restriction
(split ranges, start limits on N) but not N's capacity. The capacity bound
(:func:`~blitzplan.live.bound.dp.capacity_bound`) sees N's capacity; computed once at the
root, it is a bound of every node, but does not rise as the search restricts. Here the two
meet: the subset program with the capacity conditions
(:class:`~blitzplan.live.bound.conditions.Capacity`) runs on the node's restricted
relaxation, so each batch's options on O (its split range, its starts after the node's start
limits on N) and its alone chain are the node's. The capacity conditions hold for every
schedule, the restricted options for every schedule that keeps the restriction, so the
program's value is a bound of the node. (The capacity conditions themselves could take the
node's split range: ``x = sum k pO`` of the shared-work condition kept within the ranges, and
the N work the least splits force in the crowding condition. Both were tried and lifted no
node of (40,12) and (80,8) above the program without them: not kept.)

The program runs against one target, the incumbent's cost: a search that ends without reaching
it proves the node cannot beat the incumbent (it is pruned), one that reaches it has found the
program's optimum, and one cut short by the clock still bounds its open states.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from blitzplan.live.bound.busy import busy_bound, busy_point
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.subsets import subset_search

__all__ = ["NODE_BUSY_GAP", "NODE_CAPACITY_GAP", "NODE_CAPACITY_MAX_S", "node_capacity"]

NODE_CAPACITY_MAX_S = 0.5
"""The most time one node's capacity program gets (cut short, its bound is weaker but valid)."""

NODE_CAPACITY_GAP = 0.03
"""A node whose bound lies more than this (relatively) below the incumbent keeps it: the
capacity program lifted nodes 0.3-0.7% on (40,12) FIFO and 0.5-2.6% under the free order
(10th-90th percentiles, seeds 0 and 8 of ``benchmarks/partition.py``), at 10-20 times the cost
of the node's own bound, so it could not prune them."""


NODE_BUSY_GAP = 0.01
"""Under FIFO (mean latency) a node whose capacity program leaves it below the incumbent but
by less than this (relatively) also gets the busy bound
(:func:`~blitzplan.live.bound.busy.busy_bound`), counted from the point the incumbent's
splits keep N busiest: on (32,16) FIFO seed 4 of ``benchmarks/partition.py``, 10 s, it lifted
21 of 23 nodes and pruned 16 (gap 0.076 -> 0.041%)."""


def node_capacity(
    relax: Relaxation,
    bound: float,
    old_order: str,
    upper_cost: float,
    until_s: float,
    split: Sequence[int] | None = None,
    *,
    deadlines: bool = False,
) -> float:
    """A bound, in cost units, on every schedule that keeps ``relax``'s restriction: the subset
    program with the capacity conditions on it (see the module docstring), at most
    ``upper_cost`` (a known schedule's cost), by ``until_s`` (a ``time.perf_counter()``
    instant) or :data:`NODE_CAPACITY_MAX_S` from now; ``bound`` (the node's bound so far) when
    that lies more than :data:`NODE_CAPACITY_GAP` below ``upper_cost``; with ``split`` (the
    incumbent's), the busy bound too where :data:`NODE_BUSY_GAP` says; with ``deadlines``
    (under FIFO) the program counts the deadline bound
    (:mod:`blitzplan.live.bound.deadlines`)."""
    if math.isfinite(upper_cost) and bound < upper_cost - NODE_CAPACITY_GAP * abs(upper_cost):
        return bound
    until = min(until_s, time.perf_counter() + NODE_CAPACITY_MAX_S)
    fifo = old_order == "fifo"
    cost, _, _ = subset_search(
        relax, upper_cost, until, until, capacity=True, fifo=fifo, deadlines=deadlines
    )
    cost = cost if not math.isnan(cost) else -math.inf
    near = 0 < upper_cost - cost < NODE_BUSY_GAP * abs(upper_cost)
    if split is None or old_order != "fifo" or not near or not math.isfinite(upper_cost):
        return cost
    until = min(until_s, time.perf_counter() + NODE_CAPACITY_MAX_S)
    return max(cost, busy_bound(relax, upper_cost, busy_point(relax, split), until))
