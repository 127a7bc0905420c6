"""Exact live schedules by branch and bound over the N-capacity relaxation (``backend="bnb"``).

A node is a :class:`~blitzplan.live.bound.relaxation.Restriction` of the problem. Its bound is the
N-capacity relaxation of the restricted problem, solved by the dynamic program over O's batch
sequence (:mod:`blitzplan.live.bound.dp`); it is valid for every schedule that keeps the
restriction. Its relaxed plan is then handed to N (:mod:`blitzplan.live.exact.nmachine`):

- if an order of N's operations meets every due time of the plan, the plan is a schedule whose
  value is the node's bound: the node is solved;
- otherwise the node branches. When even preemptive N cannot fit the plan, a set of operations
  released from ``s`` on needs ``W`` of work by ``t < s + W``; whatever the schedule, either one
  of their batches runs fewer layers on N (one child per batch: at most that many), or every
  operation runs and the last of them ends at ``s + W`` or later (one child per batch: its last
  layer in the set starts late enough). Otherwise two operations that overlap when each batch
  runs alone are ordered one way or the other, or one of them is not run.

Every child excludes the node's relaxed plan and together they cover every schedule of the
node, so the least bound over the open nodes is a proven lower bound; so are the root bounds
(:mod:`blitzplan.live.exact.root_bounds`: the work relaxation, the capacity bound, under a free
order the slot bound, in a short FIFO call the Lagrangian's first steps and the busy bound),
computed once when the root is not solved:
the search stops once the incumbent meets them. Nodes are explored best bound first. Each
relaxed plan, repaired, offers the incumbent a schedule (once per plan), and sequenced when
preemptive N can carry it out (:mod:`blitzplan.live.exact.offers`); a schedule is kept only
when the independent checker passes it.
When the root was quick to bound the search runs first for a share of the time (small
instances end there), then a local search and the root bounds get theirs and it starts again
from the root (:data:`RESTART`); a node taken after that share first gets the capacity bound of
its restriction (:data:`NODE_CAPACITY`) and, when its plan fits N only with preemption, CP-SAT
under the incumbent's value (:data:`NODE_CPSAT`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

from blitzplan.live.bound.dp import GREEDY_MAX_S, solve_relaxation
from blitzplan.live.bound.relaxation import (
    OptionsCache,
    Relaxation,
    RelaxedPlan,
    Restriction,
)
from blitzplan.live.bound.work import work_bound
from blitzplan.live.exact.branching import node_children
from blitzplan.live.exact.common import Start, finish, start_point
from blitzplan.live.exact.nmachine import NOp, Overload, overload, plan_ops
from blitzplan.live.exact.node_bound import node_capacity
from blitzplan.live.exact.node_cpsat import node_cpsat
from blitzplan.live.exact.offers import Offers
from blitzplan.live.exact.root_bounds import SHORT_NODE_CAPACITY, strengthen
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import Schedule
from blitzplan.solvers.backends import OPTIMALITY_REL_GAP

__all__ = [
    "EARLY_SEARCH_MAX_S",
    "EARLY_SEARCH_MIN_NODES",
    "EARLY_SEARCH_SHARE",
    "FIRST_OVERLOAD_EARLY",
    "NODE_CAPACITY",
    "NODE_CPSAT",
    "NODE_CPSAT_MAX_S",
    "NODE_DEADLINES_GAP",
    "RESTART",
    "TEARDOWN_S_PER_ENTRY",
    "WORST_OVERLOAD",
    "solve_bnb",
]

EARLY_SEARCH_SHARE = 0.1
"""The share of the time left after the root that the search gets before the local search and
the root bounds (which pay off only when the search alone does not end)."""

EARLY_SEARCH_MAX_S = 1.0
"""The most time that first share of the search gets (without a time limit, too)."""

EARLY_SEARCH_MIN_NODES = 10
"""The first share is skipped when it could not bound this many nodes, each taking as long as
the root did (on large instances the search alone does not end, and the bounds need the time)."""

WORST_OVERLOAD = True
"""After the early share of the search, branch on the overload of the operation that
preemptive N ends latest past its due time (:func:`~blitzplan.live.exact.nmachine.overload`),
not the first found: its "late" children shift a batch by the largest excess. On 47 crowded
tiny instances the searches branch 489 nodes against 1,319 (free order) and 394 against 1,280
(FIFO); on (40,12) FIFO seed 0 of ``benchmarks/partition.py``, branching on it throughout, the
search's own bound reached 0.8284 in 10 s against 0.8269 on the first overload."""

FIRST_OVERLOAD_EARLY = True
"""The early share of the search branches on the first overload found: those children shift
little, so their relaxed plans, repaired, stay close to good schedules (on (80,8) FIFO seed 9
they found 1.5168 there; branching on the worst overload from the start, 1.5753)."""

NODE_CAPACITY = True
"""After the early share of the search, a node taken to be branched first gets the capacity
bound of its restriction (:func:`~blitzplan.live.exact.node_bound.node_capacity`); lifted, it
goes back among the open nodes. Its children start from that bound."""

NODE_DEADLINES_GAP = 0.005
"""A node's capacity program counts the deadline bound
(:mod:`blitzplan.live.bound.deadlines`) while the search's gap (incumbent against its
proven bound) is at least this (relatively). Near a proof its cost per node did not pay: on
(80,8) FIFO seed 6 of ``benchmarks/partition.py`` (gap 0.01%) the search proved in 3.8 CPU s
without it and not in 10 s with it; on (80,16) FIFO (gaps 2-8%) the nodes' programs lifted the
bound with it (seed 1: 0.917 -> 0.946 of the incumbent in 10 CPU s)."""

NODE_CPSAT = True
"""After the early share of the search, a node taken whose relaxed plan fits N with preemption
but was not carried out (the sequencer found no order) is solved whole on CP-SAT under the
incumbent's value (:func:`~blitzplan.live.exact.node_cpsat.node_cpsat`): its schedule is
offered, and the node is set aside when CP-SAT solved it or showed it cannot beat the
incumbent, else it keeps CP-SAT's bound and branches."""

NODE_CPSAT_MAX_S = 1.0
"""The most time one node gets on CP-SAT, the model's making included (and at most half the
time left): on (40,12) FIFO seed 0 such nodes took 0.35-0.44 s."""

RESTART = True
"""When the root bounds pass the early share's own bound (on (80,8) and (40,12) FIFO by
0.5-11%), the search drops its open nodes, each of which would want its capacity program,
and starts again from the root at the root bounds: a node gets that program before it
branches, its children start from it (docs/benchmarks.md, s17-h1). An early share whose bound
meets the root bounds is kept ((80,8) FIFO seed 6 proves in 4 s so; restarted, not in 10).
Not where less time is left than bounding the root took: the search could not go on, and on
(32,16) free a call of a second ran 0.03-0.05 s past its limit re-bounding it."""

TEARDOWN_S_PER_ENTRY = 5e-6
"""What freeing one open node or one cached set of a batch's options takes when the search
returns (3.3-3.7 us of CPU on (80,16) and (40,12) FIFO: 27 ms after a 10 s search of (80,16)
FIFO seed 8, all of it past the last read of the clock). The search stops that much (times
the load's slowdown, :meth:`~blitzplan.live.exact.common.Start.slowdown`) before its
deadline."""

_PRUNE_GAP = OPTIMALITY_REL_GAP / 2
"""A node whose bound is this close (relatively) to the incumbent is not explored."""


@dataclass(order=True)
class _Node:
    bound: float
    """In cost units (a sum or a maximum of per-batch values)."""
    rank: int
    restriction: Restriction = field(compare=False)
    relax: Relaxation = field(compare=False)
    plan: RelaxedPlan = field(compare=False)
    ops: list[NOp] | None = field(default=None, compare=False)
    """N's operations in the node's relaxed plan, with their windows (set by ``settle``)."""
    found: Overload | None = field(default=None, compare=False)
    """What preemptive N cannot fit of them, if anything."""
    strong: bool = field(default=False, compare=False)
    """Whether ``bound`` counts the node's capacity bound (:mod:`.node_bound`)."""
    whole: bool = field(default=False, compare=False)
    """Whether the node has been given to CP-SAT whole (:mod:`.node_cpsat`)."""


class _Search:
    """The open nodes, the counters, and the lowest bound of every node set aside."""

    def __init__(self, start: Start) -> None:
        self.start = start
        self.obj = Relaxation(start.instance, start.objective).obj
        self.open: list[_Node] = []
        self.floor = math.inf
        """The least bound of the nodes dropped unexplored (pruned close to the incumbent, or
        left when the clock ran out)."""
        self.ranks = itertools.count()
        self.nodes = 0
        self.add_s = 0.0
        """The longest a child node has taken to bound: a child is not started with less left."""
        self.options: OptionsCache = {}
        """Each batch's relaxation options per restriction of that batch, shared by nodes."""
        self.offers = Offers(start)
        """The schedules the search offers the incumbent, and the incumbent's polish."""
        self.worst = WORST_OVERLOAD and not FIRST_OVERLOAD_EARLY
        """Whether nodes branch on the worst overload (see :data:`WORST_OVERLOAD`)."""
        self.strong = False
        """Whether a node taken gets its capacity bound first (after the early share)."""
        self.whole = False
        """Whether a node whose plan fits only with preemption goes to CP-SAT (likewise)."""

    def upper_cost(self) -> float:
        return self.obj.scaled(self.start.incumbent.objective)

    def prunable(self, bound: float) -> bool:
        upper = self.upper_cost()
        if math.isinf(upper):
            return math.isinf(bound)
        return bound >= upper - _PRUNE_GAP * abs(upper)

    def add(self, restriction: Restriction, parent: _Node | None = None) -> None:
        """Bound the node of ``restriction`` (no lower than its ``parent``'s: it restricts the
        parent, whose relaxed plan is its first candidate); solve it, set it aside, or keep it
        open."""
        if restriction.empty:
            return
        relax = Relaxation(
            self.start.instance, self.start.objective, restriction, cache=self.options
        )
        deadline = self.start.deadline_s
        bound, sequence_, complete = solve_relaxation(
            relax,
            old_order=self.start.old_order,
            upper_cost=self.upper_cost(),
            search_until_s=deadline,
            deadline_s=deadline,
            greedy_s=GREEDY_MAX_S if parent is None else 0.0,
            candidates=() if parent is None else (parent.plan.old_sequence,),
        )
        if parent is not None:
            bound = max(bound, parent.bound)
        plan = None if sequence_ is None else relax.plan(sequence_)
        if plan is not None:  # repaired, the relaxed plan is a schedule
            self.offers.repaired(plan)
        if plan is None or not complete or self.prunable(bound):
            self.floor = min(self.floor, bound)  # a valid bound of everything below it
            return
        node = _Node(bound, -next(self.ranks), restriction, relax, plan)
        if parent is None and self.settle(node):
            return
        heapq.heappush(self.open, node)

    def settle(self, node: _Node) -> bool:
        """Check the node's relaxed plan against N and, when preemptive N can carry it out,
        offer it as a schedule with the sequencer's order; True when the node is solved (the
        incumbent meets its bound; it is then set aside).

        Children are settled when taken to be branched, not when bounded: most bounded nodes
        are never taken, and on (40,12) FIFO the overload test took 40% of a child's time."""
        if node.ops is None:
            node.ops = plan_ops(node.relax, node.plan)
            node.found = overload(node.ops, worst=self.worst)
            if node.found is None:
                self.offers.sequenced(node.plan, node.ops)
        if self.upper_cost() <= node.bound * (1 + 1e-12) + 1e-15:
            self.floor = min(self.floor, node.bound)  # solved: the incumbent meets its bound
            return True
        return False

    def _lifted(self, node: _Node, until_s: float) -> bool:
        """Give ``node`` its capacity bound; True when that lifted it (it is then set aside
        when prunable, else back among the open nodes, to be taken in its new place)."""
        node.strong = True
        args = (self.start.old_order, self.upper_cost(), until_s, self.start.incumbent.split)
        upper = self.start.incumbent.objective
        wide = upper - self.start.bound >= NODE_DEADLINES_GAP * abs(upper)
        bound = node_capacity(node.relax, node.bound, *args, deadlines=wide)
        if bound <= node.bound:
            return False
        node.bound = bound
        if self.prunable(bound):
            self.floor = min(self.floor, bound)
        else:
            heapq.heappush(self.open, node)
        return True

    def _solved_whole(self, node: _Node, until_s: float) -> bool:
        """Give a node whose plan fits N only with preemption to CP-SAT; True when that settled
        it (set aside) or lifted it (back among the open nodes)."""
        node.whole = True
        if node.found is not None or node.ops is None:
            return False
        limit = min(NODE_CPSAT_MAX_S, 0.5 * (until_s - time.perf_counter()))
        cap = self.start.incumbent.objective
        solved = node_cpsat(self.start, node.restriction, cap, limit)
        if solved is None:
            return False
        if solved.schedule is not None:
            self.start.offer(solved.schedule)
        bound = max(node.bound, self.obj.scaled(solved.bound))
        if solved.closed or self.prunable(bound):
            self.floor = min(self.floor, bound)
            return True
        if bound <= node.bound:
            return False
        node.bound = bound
        heapq.heappush(self.open, node)
        return True

    def run(self) -> None:
        start = self.start
        began = time.perf_counter()
        self.add(Restriction.none(start.instance))
        root_s = time.perf_counter() - began
        if self.open or not self.prunable(self.floor):  # the root is not solved (or not even
            # bounded in time): when nodes are cheap the search gets a first share; if that
            # does not settle it, a local search may lower the incumbent and the capacity
            # bound may prove it
            early_s = min(EARLY_SEARCH_SHARE * start.left_s(), EARLY_SEARCH_MAX_S)
            if root_s * EARLY_SEARCH_MIN_NODES <= early_s:
                self._search(time.perf_counter() + early_s)
            self.worst, self.strong, self.whole = WORST_OVERLOAD, NODE_CAPACITY, NODE_CPSAT
            if (self.open or not self.prunable(self.floor)) and not start.proven():
                report = strengthen(start, self._lowest(), self.offers)
                self.offers.rooted()
                self.strong = self.strong and (SHORT_NODE_CAPACITY or not report.short)
                if RESTART and not start.proven() and self._lowest() < start.bound:
                    if start.left_s() <= root_s * start.slowdown():
                        return  # the root cannot be bounded again in time: the bounds stand
                    self.restart(report.ended)
        self._search(start.deadline_s)
        start.raise_bound(self._lowest())

    def _lowest(self) -> float:
        """The search's own bound: the least over the open and set-aside nodes (objective units)."""
        return self.obj.final(min([self.floor, *(node.bound for node in self.open)]))

    def restart(self, ended: bool = False) -> None:
        """Drop the open nodes and search again from the root, its bound raised to the whole
        problem's (valid for every schedule, so for every node): see :data:`RESTART`. When
        the root's capacity program ``ended`` (not cut short), the root is not given it again."""
        self.open, self.floor = [], math.inf
        self.add(Restriction.none(self.start.instance))
        for node in self.open:  # the root, unless bounding it settled it
            node.bound = max(node.bound, self.obj.scaled(self.start.bound))
            node.strong = node.strong or ended

    def _freeing_s(self) -> float:
        """What freeing the open nodes and the options cache will take on return (see
        :data:`TEARDOWN_S_PER_ENTRY`)."""
        entries = len(self.open) + len(self.options)
        return TEARDOWN_S_PER_ENTRY * entries * self.start.slowdown()

    def _search(self, until_s: float) -> None:
        """Explore the open nodes best bound first until ``until_s`` (a
        ``time.perf_counter()`` instant): nodes left open stay open."""
        while self.open:
            self.offers.repolish(until_s)
            freeing = self._freeing_s()  # what is built must be freed by the deadline too
            until = until_s - freeing
            if until - time.perf_counter() <= self.add_s or self.start.proven():
                break
            node = heapq.heappop(self.open)
            if self.prunable(node.bound):
                self.floor = min(self.floor, node.bound)
                continue
            if self.strong and not node.strong and self._lifted(node, until):
                continue
            if self.settle(node):
                continue
            if self.prunable(node.bound):  # the offer lowered the incumbent near its bound
                self.floor = min(self.floor, node.bound)
                continue
            if self.whole and not node.whole and self._solved_whole(node, until):
                continue
            self.nodes += 1
            children = node_children(
                node.restriction, node.found, node.ops or [], node.relax.instance.num_layers
            )
            if not children:  # nothing to branch on: keep its bound, leave it
                self.floor = min(self.floor, node.bound)
            for child in children:
                if self.start.left_s() - freeing <= self.add_s:  # the next child ends late
                    self.floor = min(self.floor, node.bound)  # the unbounded children
                    break
                began = time.perf_counter()
                self.add(child, node)
                self.add_s = max(self.add_s, time.perf_counter() - began)


def solve_bnb(
    instance: LiveScalingInstance,
    *,
    objective: str,
    old_order: str,
    time_limit_s: float | None,
    hint: Schedule | None,
    warm_start: bool = True,
) -> Schedule:
    """The optimum by branch and bound (see the module docstring), within ``time_limit_s``.

    ``hint`` (ZigZag's schedule) and, with ``warm_start``, the repaired relaxed plan polished
    by a short local search are the first incumbent. Unproven at the limit, the answer is
    FEASIBLE with the least bound over the open nodes.
    """
    start = start_point(
        instance,
        objective=objective,
        old_order=old_order,
        backend="bnb",
        time_limit_s=time_limit_s,
        hint=hint,
        relax=False,
        warm=warm_start,
    )
    start.raise_bound(work_bound(instance, objective))
    search = _Search(start)
    search.run()
    return finish(start, message=f"{search.nodes} node(s) branched, {len(search.open)} left open")
