"""The exact live-scaling model on OR-Tools CP-SAT: optional intervals and two NoOverlaps.

CP-SAT needs integers: every time is counted in ticks of ``tick_s`` (a millionth of the shortest
layer time) and *rounded down*. Flooring each datum relaxes the problem (the floored start times
of any real schedule are feasible for the floored data), so CP-SAT's bound, scaled back, is a
valid bound for the real problem; its answers are decoded into orders and re-timed in floating
point, where they lose at most about one tick per layer.

Variables
  x[i,l]      bool      batch i runs layer l on N (x[i,l] implies x[i,l-1]: a prefix)
  s[i,l]      int       start of that layer on N, from its alone-chain earliest start
  n[i,l]      interval  s[i,l] .. + pN_i, present iff x[i,l]
  S[i], P[i]  int       start and length of batch i's block on O, P_i = pO_i (L - sum_l x[i,l])
  o[i]        interval  S[i] .. + P[i], present iff not x[i,L]
  C[i]        int       completion of batch i
  Z, v[i]               the largest latency or completion; "i misses its SLO"

Constraints
  chain:          s[i,l] >= s[i,l-1] + pN_i            layers of a batch in order on N
  N one at a time: NoOverlap(n)                         one layer at a time on N
  hand-off:       S_i >= s[i,l] + pN_i + d_i  if x[i,l] and o[i] present
  O one at a time: NoOverlap(o); fifo: S_j >= S_i + P_i for i released first
  completion:     C_i >= S_i + P_i if on O, C_i >= s[i,L] + pN_i if it finishes on N
  symmetry:       C_i <= C_j for identical batches i < j, and the work cut on the r-th of them
  bound cut:      objective >= the N-capacity relaxation's bound, less the rounding slack
The horizon is the latest release, O's availability and the head's arrival plus all the work and
hand-offs. The incumbent (ZigZag or the repaired relaxed plan) is the hint.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from blitzplan.live.bound.relaxation import RelaxedPlan, alone_chain_s, repair
from blitzplan.live.exact.common import (
    MIN_ROUND_S,
    OutOfTime,
    Start,
    decode,
    finish,
    start_point,
)
from blitzplan.live.exact.symmetry import canonical, identical_groups, work_cut
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import SLO_TOL_S, Schedule

__all__ = ["READ_BACK_S_PER_LAYER", "TICKS_PER_SHORTEST_LAYER", "solve_cpsat"]

READ_BACK_S_PER_LAYER = 1e-4
"""Time kept, per layer and batch, for reading CP-SAT's answer back, re-timing it and checking
it (two decoded schedules), out of what is left when the solver starts."""

TICKS_PER_SHORTEST_LAYER = 1_000_000
"""Resolution of CP-SAT's integer time: the shortest layer time is this many ticks."""


class _Model:
    def __init__(self, cp_model: Any, start: Start, use_cut: bool) -> None:
        inst = start.instance
        self.inst, self.start = inst, start
        self.L, self.n = inst.num_layers, inst.num_batches
        shortest = min(*inst.new_layer_s, *inst.old_layer_s)
        self.tick = shortest / TICKS_PER_SHORTEST_LAYER
        self.m = cp_model.CpModel()
        self.p_new = [self._floor(p) for p in inst.new_layer_s]
        self.p_old = [self._floor(p) for p in inst.old_layer_s]
        self.hand = [self._floor(d) for d in inst.handoff_s]
        work = sum(
            self.L * max(a, b) + d
            for a, b, d in zip(self.p_new, self.p_old, self.hand, strict=True)
        )
        last = self._floor(max(max(inst.release_s), inst.old_free_at_s, inst.head_ready_s))
        self.top = last + work + self.L * max(self.p_new) + 1
        self._new_machine()
        self._old_machine()
        self._symmetry()
        self._objective(use_cut)

    def _floor(self, seconds: float) -> int:
        return math.floor(seconds / self.tick)

    def _ceil(self, seconds: float) -> int:
        return math.ceil(seconds / self.tick)

    def _new_machine(self) -> None:
        m, L, top = self.m, self.L, self.top
        self.x: dict[tuple[int, int], Any] = {}
        self.s: dict[tuple[int, int], Any] = {}
        intervals = []
        for i in range(self.n):
            self.start.check_time()
            chain = alone_chain_s(self.inst, i)
            for li in range(1, L + 1):
                x = self.x[i, li] = m.NewBoolVar(f"x_{i}_{li}")
                earliest = min(self._floor(max(chain[li - 1], self.inst.usable_s[li - 1])), top)
                s = self.s[i, li] = m.NewIntVar(earliest, top, f"s_{i}_{li}")
                intervals.append(
                    m.NewOptionalFixedSizeIntervalVar(s, self.p_new[i], x, f"n_{i}_{li}")
                )
                if li > 1:
                    m.AddImplication(x, self.x[i, li - 1])
                    m.Add(s >= self.s[i, li - 1] + self.p_new[i])
        m.AddNoOverlap(intervals)

    def _old_machine(self) -> None:
        m, L, top, inst = self.m, self.L, self.top, self.inst
        self.S, self.P, self.C, self.on_old = {}, {}, {}, {}
        blocks = []
        for i in range(self.n):
            self.start.check_time()
            earliest = max(self._floor(inst.old_free_at_s), self._floor(inst.release_s[i]))
            S = self.S[i] = m.NewIntVar(earliest, top, f"S_{i}")
            P = self.P[i] = m.NewIntVar(0, L * self.p_old[i], f"P_{i}")
            on_old = self.on_old[i] = self.x[i, L].Not()
            m.Add(self.p_old[i] * (L - sum(self.x[i, li] for li in range(1, L + 1))) == P)
            end = m.NewIntVar(0, top + L * self.p_old[i], f"E_{i}")
            blocks.append(m.NewOptionalIntervalVar(S, P, end, on_old, f"o_{i}"))
            for li in range(1, L):
                m.Add(self.s[i, li] + self.p_new[i] + self.hand[i] <= S).OnlyEnforceIf(
                    [self.x[i, li], on_old]
                )
            C = self.C[i] = m.NewIntVar(self._floor(inst.release_s[i]), 2 * top, f"C_{i}")
            m.Add(end <= C).OnlyEnforceIf(on_old)
            m.Add(self.s[i, L] + self.p_new[i] <= C).OnlyEnforceIf(self.x[i, L])
        m.AddNoOverlap(blocks)
        if self.start.old_order == "fifo":
            order = inst.fifo_order
            for a, i in enumerate(order):
                for j in order[a + 1 :]:
                    m.Add(self.S[j] >= self.S[i] + self.P[i]).OnlyEnforceIf(
                        [self.on_old[i], self.on_old[j]]
                    )

    def _symmetry(self) -> None:
        """Identical batches complete in index order; the work cut, on the floored data."""
        inst = self.inst
        for group in identical_groups(inst):
            i, release = group[0], inst.release_s[group[0]]
            cuts = work_cut(
                self.L,
                len(group),
                self._floor(max(release, inst.usable_s[0])),
                self._floor(max(release, inst.old_free_at_s)),
                self.p_new[i],
                self.p_old[i],
            )
            for batch, cut in zip(group, cuts, strict=True):
                self.m.Add(self.C[batch] >= math.floor(cut))
            for a, b in itertools.pairwise(group):
                self.m.Add(self.C[a] <= self.C[b])

    def _objective(self, use_cut: bool) -> None:
        m, name, inst = self.m, self.start.objective, self.inst
        release_up = [self._ceil(r) for r in inst.release_s]
        slo = [self._ceil(s + SLO_TOL_S) for s in inst.slo_s or ()]
        if name in ("mean_latency", "hard_slo"):
            self.goal = sum(self.C.values())
            for i, limit in enumerate(slo if name == "hard_slo" else ()):
                m.Add(self.C[i] - release_up[i] <= limit)
        elif name == "slo_violations":
            v = [m.NewBoolVar(f"v_{i}") for i in range(self.n)]
            for i, limit in enumerate(slo):
                m.Add(self.C[i] - release_up[i] <= limit).OnlyEnforceIf(v[i].Not())
            self.goal = sum(v)
        else:
            self.goal = m.NewIntVar(-2 * self.top, 2 * self.top, "Z")
            for i in range(self.n):
                m.Add(self.goal >= self.C[i] - (release_up[i] if name == "max_latency" else 0))
        m.Minimize(self.goal)
        bound = self.start.bound
        if use_cut and math.isfinite(bound) and name != "slo_violations":
            m.Add(self.goal >= self._cut(bound))

    def _cut(self, bound: float) -> int:
        """The bound in ticks, less the slack of flooring (one tick per layer and batch)."""
        slack = self.L + 3
        if self.start.objective in ("mean_latency", "hard_slo"):
            total = bound * self.n + sum(self.inst.release_s)
            return self._floor(total) - self.n * slack
        return self._floor(bound) - slack

    def true_bound(self, ticks: float) -> float:
        """A bound of the floored model as a bound of the real objective."""
        name = self.start.objective
        if name in ("mean_latency", "hard_slo"):
            return (ticks * self.tick - sum(self.inst.release_s)) / self.n
        return ticks if name == "slo_violations" else ticks * self.tick

    def hint(self, schedule: Schedule) -> None:
        starts = {(op.batch, op.layer): op.start_s for op in schedule.new_ops}
        blocks = {op.batch: op.start_s for op in schedule.old_ops}
        for i, k in enumerate(schedule.split):
            for li in range(1, self.L + 1):
                self.m.AddHint(self.x[i, li], li <= k)
                if (i, li) in starts:
                    self.m.AddHint(self.s[i, li], self._floor(starts[i, li]))
            if i in blocks:
                self.m.AddHint(self.S[i], self._floor(blocks[i]))

    def read(
        self, solver: Any
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], RelaxedPlan]:
        L = self.L
        split = tuple(
            sum(solver.Value(self.x[i, li]) for li in range(1, L + 1)) for i in range(self.n)
        )
        ops = sorted(
            (solver.Value(self.s[i, li]), i, li)
            for i in range(self.n)
            for li in range(1, split[i] + 1)
        )
        old = sorted((solver.Value(self.S[i]), i) for i in range(self.n) if split[i] < L)
        planned = tuple(
            solver.Value(self.S[i]) * self.tick if split[i] < L else math.inf for i in range(self.n)
        )
        plan = RelaxedPlan(tuple(b for _, b in old), split, math.nan, planned)
        return split, tuple(op[1] for op in ops), plan.old_sequence, plan


def solve_cpsat(
    instance: LiveScalingInstance,
    *,
    objective: str,
    old_order: str,
    time_limit_s: float | None,
    hint: Schedule | None,
    use_relaxation: bool = True,
    warm_start: bool = True,
    seed: int = 0,
) -> Schedule:
    """The optimum on CP-SAT with one worker; see the module docstring.

    ``use_relaxation=False`` drops the relaxation (bound, cut, plan, local search): the model
    alone, hinted with ``hint``. ``warm_start=False``: no hint.
    """
    from ortools.sat.python import cp_model

    start = start_point(
        instance,
        objective=objective,
        old_order=old_order,
        backend="cpsat",
        time_limit_s=time_limit_s,
        hint=hint,
        relax=use_relaxation,
        warm=warm_start,
    )
    if start.proven():
        return finish(start, message="proven by the N-capacity relaxation")
    if start.left_s() < MIN_ROUND_S:
        return finish(start, message="no time left for CP-SAT")
    try:
        model = _Model(cp_model, start, use_relaxation)
    except OutOfTime:
        return finish(start, message="no time left to build the CP-SAT model")
    if math.isfinite(start.incumbent.objective):
        model.hint(canonical(instance, start.incumbent))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    reserve = READ_BACK_S_PER_LAYER * instance.num_layers * instance.num_batches
    if math.isfinite(start.left_s()):
        if start.left_s() - reserve < MIN_ROUND_S:
            return finish(start, message="no time left to solve the CP-SAT model")
        solver.parameters.max_time_in_seconds = start.left_s() - reserve
    status = solver.Solve(model.m)
    if status == cp_model.MODEL_INVALID:
        return finish(start, message="CP-SAT: model invalid", failed=True)
    if status == cp_model.INFEASIBLE:
        refused = start.infeasible_round("CP-SAT")
        if refused:
            return finish(start, message=f"CP-SAT INFEASIBLE; {refused}", failed=True)
    elif status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        split, new_order, old_found, plan = model.read(solver)
        start.offer(decode(instance, split, new_order, old_found, objective, old_order, "cpsat"))
        start.offer(decode(instance, *repair(instance, plan), objective, old_order, "cpsat"))
        start.raise_bound(model.true_bound(solver.BestObjectiveBound()))
    return finish(start, message=f"CP-SAT {solver.StatusName(status)}")
