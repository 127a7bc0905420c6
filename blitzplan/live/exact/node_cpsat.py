"""A node of the exact search (:mod:`blitzplan.live.exact.bnb`) solved whole on CP-SAT.

Deep in the search the nodes that hold the bound have relaxed plans that fit N with preemption
but in no order of N's layers (on (40,12) FIFO seeds 0 and 9 of ``benchmarks/partition.py``
CP-SAT proves that in 0.01 s where the sequencer gives up after 200,000 steps), and branching
on one pair of N's layers at a time leaves a child at the node's bound. There the node's own
problem is small: its restriction fixes most of each batch's split. The model of
:mod:`blitzplan.live.exact.cpsat` (floored data, which relaxes the problem) gets the node's
restriction (each batch's split range; each layer's start limit, floored, when the layer runs on
N) and a cap on the objective: no more than the incumbent. On (40,12) FIFO seed 0 it solved such
nodes in 0.35-0.44 s, to a schedule of 0.83065 where the incumbent was 0.83314.

What it proves, for every schedule that keeps the restriction (the floored starts and
completions of such a schedule are a solution of the floored model, at an objective no larger
than the schedule's, so a schedule at or under the cap is a solution of the capped model):

- INFEASIBLE: no such schedule is at or under the cap;
- OPTIMAL: none is below the model's optimum, scaled back;
- otherwise (out of time): none is below the least of the model's best bound and the cap.

CP-SAT runs without its LP (``linearization_level`` 0) and without looking for symmetries
(``symmetry_level`` 0; the node's model has no symmetry constraints either). Its LP bound lies
far below such nodes' values (0.54 at a node of 0.8305), and on the 19 nodes (40,12) FIFO seed
2 gave CP-SAT in a 20 s run, the default left the first two open after 2 s each where without
the LP all 19 closed (0.03 units of deterministic time for each of those two; 0.23 in all
against 0.52 for the default, which closed 17); without the symmetry search they took 3.3-3.8
s of CPU in all against 4.2-4.8 s (three runs each, loaded).
"""

from __future__ import annotations

import importlib
import math
import sys
import time
from dataclasses import dataclass
from typing import Any

from blitzplan.live.bound.relaxation import Restriction
from blitzplan.live.exact.common import OutOfTime, Start, decode
from blitzplan.live.exact.cpsat import _Model
from blitzplan.live.schedule import Schedule

__all__ = ["MIN_SOLVE_S", "NODE_CPSAT_OBJECTIVES", "NodeSolved", "node_cpsat"]

CP_MODEL = "ortools.sat.python.cp_model"
"""The module CP-SAT is used through."""

MIN_SOLVE_S = 0.05
"""CP-SAT is not started with less than this left after the model is made."""

NODE_CPSAT_OBJECTIVES = ("mean_latency", "makespan")
"""The objectives the node's cap is written for (the others keep the node's own bound)."""


@dataclass(frozen=True)
class NodeSolved:
    """What CP-SAT proved about one node: ``bound`` (objective units) holds for every schedule
    that keeps the node's restriction; ``closed`` when nothing below it is left to look for
    (the model was solved or shown empty under the cap); ``schedule``, one it found."""

    bound: float
    closed: bool
    schedule: Schedule | None


def node_cpsat(
    start: Start, restriction: Restriction, cap: float, time_limit_s: float
) -> NodeSolved | None:
    """The node of ``restriction`` on CP-SAT (one worker), its objective capped at ``cap`` (a
    known schedule's value), in at most about ``time_limit_s`` with the model's making; None
    when the objective has no cap here, the time is too short, OR-Tools is not at hand
    (:func:`_cp_model`), or CP-SAT gives no answer."""
    if start.objective not in NODE_CPSAT_OBJECTIVES or not math.isfinite(cap):
        return None
    began = time.perf_counter()
    cp_model = None if time_limit_s < MIN_SOLVE_S else _cp_model(start)
    if cp_model is None:
        return None

    try:
        model = _NodeModel(cp_model, start, use_cut=False)
    except OutOfTime:
        return None
    _restrict(model, restriction)
    inst, n = start.instance, start.instance.num_batches
    if start.objective == "mean_latency":
        cap_ticks = math.ceil((cap * n + sum(inst.release_s)) / model.tick) + n
    else:
        cap_ticks = math.ceil(cap / model.tick) + 1
    model.m.Add(model.goal <= cap_ticks)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.linearization_level = 0  # see the module docstring
    solver.parameters.symmetry_level = 0
    left = time_limit_s - (time.perf_counter() - began)
    if left < MIN_SOLVE_S:
        return None
    solver.parameters.max_time_in_seconds = left
    status = solver.Solve(model.m)
    if status == cp_model.INFEASIBLE:
        return NodeSolved(cap, True, None)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    split, new_order, old_order, _ = model.read(solver)
    found = decode(inst, split, new_order, old_order, start.objective, start.old_order, "bnb")
    proven = model.true_bound(solver.BestObjectiveBound())
    if status == cp_model.OPTIMAL:
        return NodeSolved(proven, True, found)
    return NodeSolved(min(proven, cap), False, found)


def _cp_model(start: Start) -> Any:
    """OR-Tools' CP-SAT module (it comes with the ``exact`` extra: without it a node keeps its
    bound), when imported already (:func:`~blitzplan.solvers.backends.load_backend` imports
    it before the clock of a solve whose limit pays for it) or when ``start``'s solve has no
    deadline; else None: a timed search never pays a first import (0.5 s on a quiet 2-core
    machine, 2.2-2.4 s at load 8)."""
    module = sys.modules.get(CP_MODEL)
    if module is not None or math.isfinite(start.deadline_s):
        return module
    try:
        return importlib.import_module(CP_MODEL)
    except ImportError:
        return None


class _NodeModel(_Model):
    """The model without its symmetry constraints: identical batches are not alike under a
    restriction that treats them differently, so swapping them may leave the node."""

    def _symmetry(self) -> None:
        return None


def _restrict(model: _Model, restriction: Restriction) -> None:
    """Each batch's split range, and each layer's start limit when it runs on N (floored)."""
    m, L = model.m, model.L
    for i in range(model.n):
        low, high = restriction.split_min[i], restriction.split_max[i]
        if low >= 1:
            m.Add(model.x[i, low] == 1)
        if high < L:
            m.Add(model.x[i, high + 1] == 0)
        for layer, after in enumerate(restriction.start_after_s[i], start=1):
            if after > 0:
                m.Add(model.s[i, layer] >= model._floor(after)).OnlyEnforceIf(model.x[i, layer])
