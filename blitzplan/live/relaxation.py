"""The N-capacity relaxation: a strong lower bound, and a good starting schedule.

Relax one rule of DESIGN.md section 4 — N runs one operation at a time — and every batch's
layers on N run as if it had N to itself: layer ``k`` of batch ``i`` ends at ``f_i(k)`` (its
*alone chain*). What is left is O's sequencing, where a batch placed on O when O is free at ``T``
completes at ``g_i(T) = min over k of max(T, rho_i(k)) + (L - k) p^O_i`` (``rho_i(0) = r_i``,
``rho_i(k) = f_i(k) + d_i``), or finishes on N alone at ``f_i(L)``. Picking the best ``k`` for a
given start is optimal because it also frees O earliest. A dynamic program over the sets of
batches already on O (Pareto fronts of (O free time, cost)) solves the relaxation exactly; its
value bounds every objective from below, and on the presets it is usually the optimum itself.
Under ``old_order="fifo"`` O's order is fixed and the program is linear in the batches.

The relaxed optimum, repaired (N's operations list-scheduled earliest-deadline-first against the
relaxed plan), is a feasible schedule: the warm start of the exact models and a move of
``improve``.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import SLO_TOL_S

__all__ = [
    "RelaxedPlan",
    "alone_chain_s",
    "relaxation_bound",
    "relaxed_greedy",
    "repair",
]


@dataclass(frozen=True)
class _Options:
    """One batch's choices on O: starts ``rho`` (ascending), remaining work ``q``, splits ``k``."""

    rho: tuple[float, ...]
    q: tuple[float, ...]
    k: tuple[int, ...]
    suffix_best: tuple[float, ...]
    suffix_arg: tuple[int, ...]
    chain_end: tuple[float, ...]
    """``chain_end[k]``: end of layer ``k`` on N alone (``[0]`` is the release)."""

    def place(self, free_s: float) -> tuple[float, int]:
        """(completion, split) of the batch placed on O when O is free at ``free_s``."""
        j = bisect.bisect_right(self.rho, free_s) - 1
        best, arg = self.suffix_best[j + 1], self.suffix_arg[j + 1]
        if j >= 0 and free_s + self.q[j] <= best:
            best, arg = free_s + self.q[j], self.k[j]
        return best, arg


def alone_chain_s(instance: LiveScalingInstance, i: int) -> tuple[float, ...]:
    """``[k]``: when layer ``k`` of batch ``i`` ends on N alone (``[0]`` is its release)."""
    chain = [instance.release_s[i]]
    for k in range(1, instance.num_layers + 1):
        chain.append(max(chain[-1], instance.usable_s[k - 1]) + instance.new_layer_s[i])
    return tuple(chain)


def _options(instance: LiveScalingInstance, i: int) -> _Options:
    L, p_old = instance.num_layers, instance.old_layer_s[i]
    chain = alone_chain_s(instance, i)
    raw = [(instance.release_s[i], L * p_old, 0)]
    raw += [(chain[k] + instance.handoff_s[i], (L - k) * p_old, k) for k in range(1, L)]
    raw.sort()
    kept: list[tuple[float, float, int]] = []
    for rho, q, k in raw:
        if not kept or q < kept[-1][1]:
            kept.append((rho, q, k))
    best, arg = [math.inf] * (len(kept) + 1), [-1] * (len(kept) + 1)
    for j in range(len(kept) - 1, -1, -1):
        rho, q, k = kept[j]
        best[j], arg[j] = (rho + q, k) if rho + q <= best[j + 1] else (best[j + 1], arg[j + 1])
    return _Options(
        rho=tuple(o[0] for o in kept),
        q=tuple(o[1] for o in kept),
        k=tuple(o[2] for o in kept),
        suffix_best=tuple(best),
        suffix_arg=tuple(arg),
        chain_end=chain,
    )


class _Objective:
    """Per-batch value of a completion time and how values aggregate, for each objective."""

    def __init__(self, instance: LiveScalingInstance, name: str) -> None:
        self.name, self.release = name, instance.release_s
        self.slo = instance.slo_s or (math.inf,) * instance.num_batches
        self.n = instance.num_batches
        self.use_max = name in ("max_latency", "makespan")

    def value(self, i: int, completion_s: float) -> float:
        latency = completion_s - self.release[i]
        if self.name == "makespan":
            return completion_s
        if self.name == "slo_violations":
            return 1.0 if latency > self.slo[i] + SLO_TOL_S else 0.0
        if self.name == "hard_slo" and latency > self.slo[i] + SLO_TOL_S:
            return math.inf
        return latency

    def combine(self, cost: float, value: float) -> float:
        return max(cost, value) if self.use_max else cost + value

    @property
    def empty(self) -> float:
        return -math.inf if self.use_max else 0.0

    def final(self, cost: float) -> float:
        return cost / self.n if self.name in ("mean_latency", "hard_slo") else cost


@dataclass(frozen=True)
class RelaxedPlan:
    """A solution of the relaxation: O's order, every batch's split, and its relaxed value."""

    old_sequence: tuple[int, ...]
    split: tuple[int, ...]
    value: float
    planned_old_start_s: tuple[float, ...]


class _Relaxation:
    def __init__(self, instance: LiveScalingInstance, objective: str) -> None:
        self.instance = instance
        self.options = [_options(instance, i) for i in range(instance.num_batches)]
        self.obj = _Objective(instance, objective)
        self.on_new = [self.obj.value(i, o.chain_end[-1]) for i, o in enumerate(self.options)]

    def evaluate(self, old_sequence: Sequence[int]) -> float:
        """Relaxed value: batches in ``old_sequence`` on O in that order, the rest on N alone."""
        free, cost = self.instance.old_free_at_s, self.obj.empty
        placed = set(old_sequence)
        for i in old_sequence:
            free, _ = self.options[i].place(free)
            cost = self.obj.combine(cost, self.obj.value(i, free))
        for i in range(self.instance.num_batches):
            if i not in placed:
                cost = self.obj.combine(cost, self.on_new[i])
        return cost

    def plan(self, old_sequence: Sequence[int]) -> RelaxedPlan:
        L, free = self.instance.num_layers, self.instance.old_free_at_s
        split, starts = [L] * self.instance.num_batches, [math.inf] * self.instance.num_batches
        for i in old_sequence:
            end, split[i] = self.options[i].place(free)
            starts[i], free = end - (L - split[i]) * self.instance.old_layer_s[i], end
        value = self.obj.final(self.evaluate(old_sequence))
        return RelaxedPlan(tuple(old_sequence), tuple(split), value, tuple(starts))

    def remaining_bound(self, free_s: float, rest: Sequence[int]) -> float:
        cost = self.obj.empty
        for i in rest:
            on_old = self.obj.value(i, self.options[i].place(free_s)[0])
            cost = self.obj.combine(cost, min(on_old, self.on_new[i]))
        return cost


def relaxed_greedy(
    instance: LiveScalingInstance,
    *,
    objective: str = "mean_latency",
    old_order: str = "free",
    time_limit_s: float = 0.05,
) -> RelaxedPlan:
    """A good relaxed plan: earliest completion first on O, then swaps and moves while they help."""
    relax = _Relaxation(instance, objective)
    if old_order == "fifo":
        return relax.plan(_fifo_best(relax))
    deadline = time.perf_counter() + time_limit_s
    sequence = _earliest_completion_first(relax)
    best = relax.evaluate(sequence)
    improved = True
    while improved:
        improved = False
        for candidate in _neighbours(sequence, instance.num_batches):
            if time.perf_counter() > deadline:
                return relax.plan(sequence)
            value = relax.evaluate(candidate)
            if value < best - 1e-12:
                sequence, best, improved = candidate, value, True
                break
    return relax.plan(sequence)


def _earliest_completion_first(relax: _Relaxation) -> list[int]:
    free, rest, sequence = relax.instance.old_free_at_s, set(range(relax.instance.num_batches)), []
    while rest:
        placed = {i: relax.options[i].place(free)[0] for i in rest}
        for i in [i for i in rest if relax.on_new[i] <= relax.obj.value(i, placed[i])]:
            rest.discard(i)
        if not rest:
            break
        pick = min(rest, key=lambda i: (placed[i], i))
        sequence.append(pick)
        rest.discard(pick)
        free = placed[pick]
    return sequence


def _neighbours(sequence: list[int], n: int) -> Iterator[list[int]]:
    """Swap two, move one, drop one to N, add one from N at every position (lazily)."""
    for a in range(len(sequence)):
        for b in range(a + 1, len(sequence)):
            swapped = list(sequence)
            swapped[a], swapped[b] = swapped[b], swapped[a]
            yield swapped
        rest = sequence[:a] + sequence[a + 1 :]
        yield rest
        yield from ([*rest[:b], sequence[a], *rest[b:]] for b in range(len(rest) + 1) if b != a)
    for i in sorted(set(range(n)) - set(sequence)):
        yield from ([*sequence[:b], i, *sequence[b:]] for b in range(len(sequence) + 1))


def _fifo_best(relax: _Relaxation) -> list[int]:
    """Exact under a fixed O order: each batch goes on O (in release order) or stays on N."""
    front: list[tuple[float, float, tuple[int, ...]]] = [
        (relax.instance.old_free_at_s, relax.obj.empty, ())
    ]
    for i in relax.instance.fifo_order:
        grown = []
        for free, cost, seq in front:
            grown.append((free, relax.obj.combine(cost, relax.on_new[i]), seq))
            end = relax.options[i].place(free)[0]
            grown.append((end, relax.obj.combine(cost, relax.obj.value(i, end)), (*seq, i)))
        front = _pareto(grown)
    return list(min(front, key=lambda s: (s[1], s[0]))[2])


def _pareto(
    states: list[tuple[float, float, tuple[int, ...]]],
) -> list[tuple[float, float, tuple[int, ...]]]:
    states.sort(key=lambda s: (s[0], s[1]))
    kept: list[tuple[float, float, tuple[int, ...]]] = []
    for state in states:
        if not kept or state[1] < kept[-1][1]:
            kept.append(state)
    return kept


def relaxation_bound(
    instance: LiveScalingInstance,
    *,
    objective: str = "mean_latency",
    old_order: str = "free",
    upper_bound: float = math.inf,
    time_limit_s: float | None = None,
) -> tuple[float, RelaxedPlan, bool]:
    """(lower bound, best relaxed plan, whether the relaxation was solved to optimality).

    ``upper_bound`` (the value of any known schedule, in objective units) prunes the search;
    with ``time_limit_s`` the search stops early (after ``SEARCH_SHARE`` of it) and the bound is
    the least over the states it had not expanded (still valid, weaker). The call returns
    within about ``time_limit_s`` plus one greedy pass and one Pareto merge.
    """
    started = time.perf_counter()
    relax = _Relaxation(instance, objective)
    greedy_s = GREEDY_MAX_S if time_limit_s is None else min(GREEDY_MAX_S, time_limit_s / 4)
    greedy = relaxed_greedy(
        instance, objective=objective, old_order=old_order, time_limit_s=greedy_s
    )
    if old_order == "fifo":
        return greedy.value, greedy, True
    scale = instance.num_batches if objective in ("mean_latency", "hard_slo") else 1
    best_cost = min(relax.evaluate(greedy.old_sequence), upper_bound * scale)
    best_seq: tuple[int, ...] = greedy.old_sequence
    deadline = math.inf if time_limit_s is None else started + time_limit_s
    search_until = math.inf if time_limit_s is None else started + SEARCH_SHARE * time_limit_s
    cost, sequence, complete = _subset_search(relax, best_cost, search_until, deadline)
    if sequence is not None and relax.evaluate(sequence) <= relax.evaluate(best_seq):
        best_seq = sequence
    plan = relax.plan(best_seq)
    return relax.obj.final(min(cost, relax.evaluate(best_seq))), plan, complete


_State = tuple[float, float, tuple[int, ...]]

SEARCH_SHARE = 0.8
"""The share of ``relaxation_bound``'s time limit the subset search may use; the rest bounds
the states it left open."""

GREEDY_MAX_S = 0.05
"""The most time the greedy start of ``relaxation_bound`` gets (a quarter of a shorter limit)."""


def _subset_search(
    relax: _Relaxation, best_cost: float, search_until: float, deadline: float
) -> tuple[float, tuple[int, ...] | None, bool]:
    """Breadth-first over subsets placed on O until ``search_until``; returns (bound, best
    sequence found, finished). Bounding the open states takes until ``deadline`` at most."""
    n = relax.instance.num_batches
    level: dict[int, list[_State]] = {0: [(relax.instance.old_free_at_s, relax.obj.empty, ())]}
    best_seq: tuple[int, ...] | None = None
    combine = relax.obj.combine
    for _ in range(n + 1):
        grown: dict[int, list[_State]] = {}
        items = list(level.items())
        for index, (placed, states) in enumerate(items):
            if time.perf_counter() > search_until:
                bound = _open_bound(relax, [*items[index:], *grown.items()], best_cost, deadline)
                return bound, best_seq, False
            rest = [i for i in range(n) if not placed >> i & 1]
            for free, cost, seq in states:
                done = cost
                for i in rest:
                    done = combine(done, relax.on_new[i])
                if done < best_cost:
                    best_cost, best_seq = done, seq
                _expand(relax, placed, rest, (free, cost, seq), best_cost, grown)
        level = {placed: _pareto(states) for placed, states in grown.items()}
        if not level:
            break
    return best_cost, best_seq, True


def _expand(
    relax: _Relaxation,
    placed: int,
    rest: list[int],
    state: _State,
    best_cost: float,
    grown: dict[int, list[_State]],
) -> None:
    free, cost, seq = state
    combine, value = relax.obj.combine, relax.obj.value
    ends = {i: relax.options[i].place(free)[0] for i in rest}
    floor_each = {i: min(value(i, ends[i]), relax.on_new[i]) for i in rest}
    floor = relax.obj.empty
    for i in rest:
        floor = combine(floor, floor_each[i])
    if combine(cost, floor) >= best_cost:
        return
    for i in rest:
        new_cost = combine(cost, value(i, ends[i]))
        others = relax.obj.empty
        if relax.obj.use_max:
            for j in rest:
                if j != i:
                    others = combine(others, floor_each[j])
        else:
            others = floor - floor_each[i]
        if combine(new_cost, others) < best_cost:
            grown.setdefault(placed | 1 << i, []).append((ends[i], new_cost, (*seq, i)))


def _open_bound(
    relax: _Relaxation,
    groups: list[tuple[int, list[_State]]],
    best_cost: float,
    deadline: float,
) -> float:
    """The least value any completion of an open state could reach (a valid lower bound).

    Each state's own bound until ``deadline``; after it, one per group of states with the same
    batches placed: their least cost with O free at their earliest time (weaker, still valid,
    because a batch's best completion never gets earlier when O is free later).
    """
    n, bound = relax.instance.num_batches, best_cost
    for placed, states in groups:
        if not states:
            continue
        rest = [i for i in range(n) if not placed >> i & 1]
        if time.perf_counter() > deadline:
            free, cost = min(s[0] for s in states), min(s[1] for s in states)
            bound = min(bound, relax.obj.combine(cost, relax.remaining_bound(free, rest)))
            continue
        for free, cost, _ in _pareto(states):  # a dominated state bounds no lower
            bound = min(bound, relax.obj.combine(cost, relax.remaining_bound(free, rest)))
    return bound


def repair(
    instance: LiveScalingInstance, plan: RelaxedPlan
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A feasible (split, N order, O order) from a relaxed plan.

    N's operations are list-scheduled: whenever N is free, it runs the ready operation with the
    earliest deadline, the latest start that keeps the plan (the planned O start minus the
    hand-off and the batch's remaining N layers; for a batch finishing on N, its alone chain).
    """
    L, split, p = instance.num_layers, plan.split, instance.new_layer_s
    usable = instance.usable_s
    due = [
        plan.planned_old_start_s[i] - instance.handoff_s[i]
        if split[i] < L
        else alone_chain_s(instance, i)[L]
        for i in range(instance.num_batches)
    ]
    done = [0] * instance.num_batches
    waiting = [(max(usable[0], instance.release_s[i]), i) for i in range(len(split)) if split[i]]
    heapq.heapify(waiting)
    ready: list[tuple[float, int]] = []
    clock, sequence = 0.0, []
    while waiting or ready:
        if not ready and waiting[0][0] > clock:
            clock = waiting[0][0]
        while waiting and waiting[0][0] <= clock:
            _, i = heapq.heappop(waiting)
            heapq.heappush(ready, (due[i] - (split[i] - done[i]) * p[i], i))
        _, pick = heapq.heappop(ready)
        clock += p[pick]
        done[pick] += 1
        sequence.append(pick)
        if done[pick] < split[pick]:
            heapq.heappush(waiting, (max(usable[done[pick]], clock), pick))
    return split, tuple(sequence), plan.old_sequence
