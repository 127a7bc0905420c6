"""The exact live-scaling MILP as a PuLP model, built once and grown between solves (see
:mod:`blitzplan.live.exact.milp` for the solve loop).

Model (times in units of ``unit_s``, a typical layer time, so that the numbers stay near 1):

Variables
  z[i,k]    binary   batch i runs layers 1..k on N and k+1..L on O (exactly one k per batch)
  s[i,l]    cont.    start of layer l of batch i on N (meaningful when k_i >= l)
  S[i]      cont.    start of batch i's block on O (meaningful when k_i < L)
  C[i]      cont.    completion of batch i
  w[i,j]    binary   O runs i's block before j's (free O order only; i < j in release order)
  y[.]      binary   on N, layer l of i runs before layer m of j — added lazily, see below
  Z, v[i]            the objective's helpers: the largest latency or completion; "i misses its SLO"

Constraints
  one split:       sum_k z[i,k] = 1                        each batch is split exactly once
  chain:           s[i,l+1] >= s[i,l] + pN_i              layers of a batch run in order on N
  arrivals:        bounds s[i,l] >= f_i(l) - pN_i         no layer before its arrival, release and
                                                          its predecessors (the alone chain f_i)
  hand-off:        S_i >= s[i,k] + pN_i + d_i  if z[i,k]  O starts after the last N layer + d_i
  hand-off cut:    S_i >= sum_k z[i,k] (f_i(k) + d_i)     the same, read off the alone chain (valid,
                                                          and strong in the LP relaxation)
  O block:         P_i = sum_k z[i,k] (L - k) pO_i        the block's length
  completion:      C_i >= S_i + P_i unless k_i = L;  C_i >= s[i,L] + pN_i if k_i = L
  completion cut:  C_i >= sum_k z[i,k] alone_i(k)         each batch alone (valid)
  symmetry:        C_i <= C_j, identical batches i < j   relabelling them keeps any schedule
  work cut:        C_(r-th of a group) >= when N and O    the group has run r*L layers by then
                   together can run r*L of its layers
  O one at a time: S_j >= S_i + P_i or the reverse (w)    both on O; fifo fixes the order
  N one at a time: s[j,m] >= s[i,l] + pN_i or reverse(y)  both layers run on N
  bound cut:       objective >= the best proven bound (first the N-capacity relaxation's
                   optimum, then each round's optimum)

N's disjunctions are lazy: the model starts without them, and after each solve the pairs of
layers that overlap in the solver's answer get theirs (with a band of neighbouring layers). A
round whose answer has no overlap is optimal for the full problem, because every round's model
is a relaxation of it; every round's bound is a valid bound. The big-M is the horizon: the latest
release, O's availability and the head's arrival, plus all the work and hand-offs there are.
The incumbent (ZigZag or the repaired relaxed plan) is the warm start of every round.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from blitzplan.live.bound.relaxation import alone_chain_s
from blitzplan.live.exact.common import OutOfTime, Start
from blitzplan.live.exact.symmetry import canonical, identical_groups, work_cut_s
from blitzplan.live.schedule import Schedule
from blitzplan.solvers.pulp_run import set_initial

__all__ = ["BAND", "MAX_SEEDED", "LiveMilpModel", "OutOfTime", "planned_overlaps"]

BAND = 2
"""Layers either side of an overlapping pair that get N disjunctions with it."""

MAX_SEEDED = 3000
"""Disjunctions seeded from the relaxed plan's overlaps before the first solve, at most (a
congested plan overlaps everywhere, and a huge first model costs more than it saves)."""

_OVERLAP_TOL = 1e-6
"""Overlap on N, in model units, above which a pair of layers gets its disjunction."""


class LiveMilpModel:
    """The PuLP model: built once, then grown by N disjunctions between solves."""

    def __init__(self, pulp: Any, start: Start, cut: float) -> None:
        inst = start.instance
        self.pulp, self.inst, self.start = pulp, inst, start
        self.deadline_s = start.deadline_s
        L, n = inst.num_layers, inst.num_batches
        self.L, self.n = L, n
        self.unit = (sum(inst.new_layer_s) + sum(inst.old_layer_s)) / (2 * n)
        u = self.unit
        self.p_new = [p / u for p in inst.new_layer_s]
        self.p_old = [p / u for p in inst.old_layer_s]
        self.hand = [d / u for d in inst.handoff_s]
        self.chain = [[t / u for t in alone_chain_s(inst, i)] for i in range(n)]
        work = sum(
            L * max(a, b) + d for a, b, d in zip(self.p_new, self.p_old, self.hand, strict=True)
        )
        last = max(max(inst.release_s), inst.old_free_at_s, inst.head_ready_s) / u
        self.top = last + work + L * max(self.p_new)
        self.big = self.top + max(self.p_new) + max(self.p_old) * L + max(self.hand)
        self.prob = pulp.LpProblem("live_scaling", pulp.LpMinimize)
        self.y: dict[tuple[int, int, int, int], Any] = {}
        self._variables()
        self._batches()
        self._symmetry()
        self._old_machine()
        self._objective(cut)

    def check_time(self) -> None:
        """Raise :class:`~blitzplan.live.exact.common.OutOfTime` past the deadline."""
        self.start.check_time()

    def _var(
        self, name: str, low: float | None = None, up: float | None = None, cat: str = "Continuous"
    ) -> Any:
        """A model variable (PuLP 3.3 wants add_variable; older PuLP has only LpVariable)."""
        if hasattr(self.prob, "add_variable"):
            return self.prob.add_variable(name, low, up, cat=cat)
        return self.pulp.LpVariable(name, low, up, cat=cat)

    def _variables(self) -> None:
        lp, L, n, top = self.pulp, self.L, self.n, self.top
        release = [r / self.unit for r in self.inst.release_s]
        old_free = self.inst.old_free_at_s / self.unit
        self.z = {
            (i, k): self._var(f"z_{i}_{k}", cat="Binary") for i in range(n) for k in range(L + 1)
        }
        self.s = {
            (i, li): self._var(f"s_{i}_{li}", self.chain[i][li] - self.p_new[i], top)
            for i in range(n)
            for li in range(1, L + 1)
        }
        self.S = {i: self._var(f"S_{i}", max(old_free, release[i]), top) for i in range(n)}
        self.C = {i: self._var(f"C_{i}", release[i], top) for i in range(n)}
        self.runs_cache: dict[tuple[int, int], Any] = {}
        self.block = {}
        for i in range(n):
            self.check_time()
            self.block[i] = lp.lpSum((L - k) * self.p_old[i] * self.z[i, k] for k in range(L))

    def runs(self, i: int, li: int) -> Any:
        """1 when batch ``i`` runs layer ``li`` on N: the sum of z[i, k] for k >= li (built
        when a disjunction first needs it)."""
        if (i, li) not in self.runs_cache:
            terms = (self.z[i, k] for k in range(li, self.L + 1))
            self.runs_cache[i, li] = self.pulp.lpSum(terms)
        return self.runs_cache[i, li]

    def _batches(self) -> None:
        lp, prob, L, big = self.pulp, self.prob, self.L, self.big
        old_free = self.inst.old_free_at_s / self.unit
        for i in range(self.n):
            self.check_time()
            z, s, S, C, p, d = self.z, self.s, self.S[i], self.C[i], self.p_new[i], self.hand[i]
            earliest_old = max(old_free, self.inst.release_s[i] / self.unit)
            prob += lp.lpSum(z[i, k] for k in range(L + 1)) == 1, f"one_split_{i}"
            for li in range(1, L):
                prob += s[i, li + 1] >= s[i, li] + p, f"chain_{i}_{li}"
                prob += s[i, li] + p + d - big * (1 - z[i, li]) <= S, f"handoff_{i}_{li}"
            alone = self._alone(i, earliest_old)
            prob += (
                lp.lpSum(z[i, k] * (self.chain[i][k] + d) for k in range(1, L))
                + earliest_old * (z[i, 0] + z[i, L])
                <= S,
                f"handoff_cut_{i}",
            )
            prob += S + self.block[i] - big * z[i, L] <= C, f"complete_old_{i}"
            prob += s[i, L] + p - big * (1 - z[i, L]) <= C, f"complete_new_{i}"
            prob += lp.lpSum(alone[k] * z[i, k] for k in range(L + 1)) <= C, f"complete_cut_{i}"

    def _symmetry(self) -> None:
        """Identical batches complete in index order, each no earlier than the work cut."""
        for group in identical_groups(self.inst):
            for i, cut in zip(group, work_cut_s(self.inst, group), strict=True):
                self.C[i].lowBound = max(self.C[i].lowBound, cut / self.unit)
            for a, b in itertools.pairwise(group):
                self.prob += self.C[a] <= self.C[b], f"symmetry_{a}_{b}"

    def _alone(self, i: int, earliest_old: float) -> list[float]:
        L, chain, p_old, d = self.L, self.chain[i], self.p_old[i], self.hand[i]
        out = [earliest_old + L * p_old]
        out += [max(earliest_old, chain[k] + d) + (L - k) * p_old for k in range(1, L)]
        return [*out, chain[L]]

    def _old_machine(self) -> None:
        prob, big, S, P, z, L = self.prob, self.big, self.S, self.block, self.z, self.L
        order = self.inst.fifo_order
        self.w: dict[tuple[int, int], Any] = {}
        for a, i in enumerate(order):
            self.check_time()
            for j in order[a + 1 :]:
                off = big * (z[i, L] + z[j, L])
                if self.start.old_order == "fifo":
                    prob += S[j] >= S[i] + P[i] - off, f"fifo_{i}_{j}"
                    continue
                w = self.w[i, j] = self._var(f"w_{i}_{j}", cat="Binary")
                prob += S[j] >= S[i] + P[i] - big * (1 - w) - off, f"old_{i}_before_{j}"
                prob += S[i] >= S[j] + P[j] - big * w - off, f"old_{j}_before_{i}"

    def _objective(self, cut: float) -> None:
        lp, prob, name, n = self.pulp, self.prob, self.start.objective, self.n
        release = [r / self.unit for r in self.inst.release_s]
        if name in ("mean_latency", "hard_slo"):
            self.goal = lp.lpSum(self.C.values())
            if name == "hard_slo":
                slo = self.inst.slo_s or ()
                for i in range(n):
                    prob += self.C[i] <= release[i] + slo[i] / self.unit, f"slo_{i}"
        elif name == "slo_violations":
            slo = self.inst.slo_s or ()
            self.v = {i: self._var(f"v_{i}", cat="Binary") for i in range(n)}
            for i in range(n):
                prob += (
                    self.C[i] <= release[i] + slo[i] / self.unit + self.big * self.v[i],
                    f"slo_{i}",
                )
            self.goal = lp.lpSum(self.v.values())
        else:
            self.Z = self._var("Z")
            for i in range(n):
                shift = release[i] if name == "max_latency" else 0.0
                prob += self.C[i] - shift <= self.Z, f"worst_{i}"
            self.goal = self.Z
        prob += self.goal
        self.cut: Any = None
        self.set_cut(cut)

    def set_cut(self, bound: float) -> None:
        """objective >= ``bound`` (a proven lower bound, in objective units); 0 when none."""
        rhs = self.to_model(bound) if math.isfinite(bound) else 0.0
        rhs -= 1e-9 * max(1.0, abs(rhs))
        if self.cut is None:
            self.cut = self.goal >= rhs
            self.prob += self.cut, "bound_cut"
        else:
            self.cut.changeRHS(rhs)

    def to_model(self, value: float) -> float:
        """An objective value in model units."""
        name = self.start.objective
        if name in ("mean_latency", "hard_slo"):
            return (value * self.n + sum(self.inst.release_s)) / self.unit
        return value if name == "slo_violations" else value / self.unit

    def from_model(self, value: float) -> float:
        name = self.start.objective
        if name in ("mean_latency", "hard_slo"):
            return (value * self.unit - sum(self.inst.release_s)) / self.n
        return value if name == "slo_violations" else value * self.unit

    def add_disjunctions(self, pairs: Sequence[tuple[int, int, int, int]]) -> int:
        """Disjunctions for the layer pairs (i, li, j, lj) and their band; how many were new."""
        added = 0
        for i, li, j, lj in pairs:
            self.check_time()
            for a in range(max(1, li - BAND), min(self.L, li + BAND) + 1):
                for b in range(max(1, lj - BAND), min(self.L, lj + BAND) + 1):
                    added += (
                        self._disjunction(i, a, j, b) if i < j else self._disjunction(j, b, i, a)
                    )
        return added

    def _disjunction(self, i: int, li: int, j: int, lj: int) -> int:
        if (i, li, j, lj) in self.y:
            return 0
        y = self.y[i, li, j, lj] = self._var(f"y_{i}_{li}_{j}_{lj}", cat="Binary")
        off = self.big * (2 - self.runs(i, li) - self.runs(j, lj))
        s = self.s
        self.prob += (
            s[j, lj] >= s[i, li] + self.p_new[i] - self.big * (1 - y) - off,
            f"n_{i}_{li}_{j}_{lj}_a",
        )
        self.prob += (
            s[i, li] >= s[j, lj] + self.p_new[j] - self.big * y - off,
            f"n_{i}_{li}_{j}_{lj}_b",
        )
        return 1

    def set_start(self, schedule: Schedule) -> None:
        """The schedule as initial values of every variable (the warm start), its identical
        batches relabelled to complete in index order as the symmetry constraints want."""
        schedule = canonical(self.inst, schedule)
        u, L = self.unit, self.L
        starts = {(op.batch, op.layer): op.start_s / u for op in schedule.new_ops}
        blocks = {op.batch: op.start_s / u for op in schedule.old_ops}
        for i, k in enumerate(schedule.split):
            for kk in range(L + 1):
                set_initial(self.z[i, kk], 1 if kk == k else 0)
            previous = -math.inf
            for li in range(1, L + 1):
                value = starts.get((i, li), max(self.s[i, li].lowBound, previous + self.p_new[i]))
                set_initial(self.s[i, li], value)
                previous = value
            set_initial(self.S[i], blocks.get(i, self.S[i].lowBound))
            set_initial(self.C[i], schedule.completion_s[i] / u)
        for (i, j), w in self.w.items():
            set_initial(w, 1 if blocks.get(i, 0.0) <= blocks.get(j, 0.0) else 0)
        for (i, li, j, lj), y in self.y.items():
            set_initial(y, 1 if starts.get((i, li), 0.0) <= starts.get((j, lj), 0.0) else 0)
        self._set_objective_start(schedule)

    def _set_objective_start(self, schedule: Schedule) -> None:
        name = self.start.objective
        if name == "slo_violations":
            slo = self.inst.slo_s or ()
            for i, (c, r) in enumerate(
                zip(schedule.completion_s, self.inst.release_s, strict=True)
            ):
                set_initial(self.v[i], 1 if c - r > slo[i] else 0)
        elif name in ("max_latency", "makespan"):
            set_initial(self.Z, schedule.objective / self.unit)

    def _split_of(self, i: int) -> int:
        values = [self.z[i, k].value() or 0.0 for k in range(self.L + 1)]
        return values.index(max(values))

    def read(
        self,
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], list[tuple[int, int, int, int]]]:
        """(split, N order, O order, overlapping layer pairs) of the solver's current answer."""
        L = self.L
        split = tuple(self._split_of(i) for i in range(self.n))
        ops = sorted(
            (self.s[i, li].value() or 0.0, i, li)
            for i in range(self.n)
            for li in range(1, split[i] + 1)
        )
        old = sorted((self.S[i].value() or 0.0, i) for i in range(self.n) if split[i] < L)
        overlaps = []
        for a, (start_a, i, li) in enumerate(ops):
            end_a = start_a + self.p_new[i]
            for start_b, j, lj in ops[a + 1 :]:
                if start_b >= end_a - _OVERLAP_TOL:
                    break
                if j != i:
                    overlaps.append((i, li, j, lj))
        self.planned_old_start_s = tuple(
            (self.S[i].value() or 0.0) * self.unit if split[i] < L else math.inf
            for i in range(self.n)
        )
        return split, tuple(op[1] for op in ops), tuple(b for _, b in old), overlaps


def planned_overlaps(model: LiveMilpModel, split: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Pairs of layers that overlap when every batch runs its planned split alone on N."""
    ops = sorted(
        (model.chain[i][li] - model.p_new[i], model.chain[i][li], i, li)
        for i, k in enumerate(split)
        for li in range(1, k + 1)
    )
    pairs = []
    for a, (_, end_a, i, li) in enumerate(ops):
        for start_b, _, j, lj in ops[a + 1 :]:
            if start_b >= end_a - _OVERLAP_TOL:
                break
            if j != i:
                pairs.append((i, li, j, lj))
    return pairs
