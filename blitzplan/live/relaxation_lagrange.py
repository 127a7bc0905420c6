"""The Lagrangian bound: N's capacity per window of layers, priced into O's sequencing.

The N-capacity relaxation (:mod:`blitzplan.live.relaxation`) keeps O's non-preemptive order and
drops N's capacity. Here the capacity comes back as a family of valid inequalities, dualised.
Let batch ``i`` run ``k_i`` layers on N, its last one ending at ``h_i`` (for a batch that ends
on N, its completion). Layers ``l..k_i`` of every batch start on N no earlier than ``u_l`` (when
layer ``l`` is usable: arrivals are non-decreasing) and end by ``h_i``, and N runs one operation
at a time, so for every layer ``l`` and time ``t`` of a grid::

    sum over i of pN_i (c_i(t) - l + 1)^+  <=  (t - u_l)^+                      (l, t)

where ``c_i(t)`` counts the layers of batch ``i`` that end by ``t`` for sure: all ``k_i`` when
``h_i <= t``, else those ``m`` with ``h_i - (k_i - m) pN_i <= t`` (layer ``m`` ends at least
``k_i - m`` layer times before the last). With multipliers ``mu[l, t] >= 0`` each batch option
``(k, h)`` pays ``pN_i sum mu[l, t] (c(t) - l + 1)^+`` and the total gets ``- sum mu[l, t] (t -
u_l)^+``: for every ``mu`` the least priced value over the relaxed plans (N's capacity dropped,
every batch's layers on N as early as it could run them alone) is a lower bound on every
schedule (weak duality). The price only falls as ``h`` grows, so it is taken at the grid point
that closes ``h``'s interval (a lower price: still a bound), and a batch placed on O when O is
free at ``T`` may start later than it could (any start ``S >= max(T, rho_k)``, ``h = S - d_i``):
its priced value is nondecreasing in ``T``. The program over O's batch sequence keeps, per split
``k``, O's earliest next free time beside the least priced value over the starts (each a lower
bound of what that split can give), so the Pareto merge of (free time, value) stays a
relaxation.

It is written for ``old_order="fifo"``, where O's order is fixed and the program is linear in
the batches (per batch, the Pareto front of the states times the ``L + 1`` splits). Under
``"free"`` the same pricing would multiply the subset program's children by ``L``; a variant
with one child per batch (earliest free time and least price over the splits, taken apart),
priced by the FIFO program's multipliers, measured below the plain relaxation (0.62 and 0.76
against 0.74 and 0.83 of the best known schedule on two (32,16) instances) in 25-120 s. It
returns ``-inf`` there, and for an objective other than the mean latency.

The multipliers come from a subgradient method with Polyak steps aimed part way toward a known
schedule's value (:data:`AIM_SHARE`);
any multipliers give a valid bound, so stopping early only weakens it. A step's price tables
sum, per batch, only the (grid point, earlier grid point) pairs where some layer is counted
(1 ms against 19 ms on (80,16)); for a bound wanted quickly, the program may round O's free
time down to a grid (:func:`quick_free_step_s`), which merges states and stays a bound. Given a
:class:`~blitzplan.live.work_meter.WorkMeter`, the time limit is counted work (each step's
tables and each batch of its program priced by :data:`BATCH_S_FIXED`, :data:`LAYER_S` and
:data:`OPTION_S`), so the bound is the same on every run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.polyak import PolyakSteps
from blitzplan.live.relaxation import alone_chain_s
from blitzplan.live.work_meter import WALL_CLOCK, Clock

__all__ = [
    "GRID_POINTS",
    "LAGRANGE_ITERATIONS",
    "QUICK_FREE_STEP_SHARE",
    "QUICK_GRID_POINTS",
    "lagrangian_bound",
    "quick_free_step_s",
]

LAGRANGE_ITERATIONS = 200
"""The most subgradient steps (each solves the priced program once)."""

AIM_SHARE = 0.5
"""Each step aims this share of the way from the best bound to the known schedule's value (1
is Polyak's rule; a heuristic's value lies well above the optimum, and in 0.25 s on (80,16)
under FIFO 0.5 reaches 0.70 of the best schedule known where 1 reaches 0.67, worst 0.59 against
0.46: docs/benchmarks.md, sixth session, helper h9)."""

QUICK_FREE_STEP_SHARE = 2e-4
"""The share of O's whole work (every batch's every layer on O) that :func:`quick_free_step_s`
rounds O's free time to: about 2 ms on (80,16), where a priced program then takes a third to a
half of the time for 0.1-0.6% less (seed 0 of benchmarks/partition.py, sixth priced step)."""


BATCH_S_FIXED = 1.1e-4
"""A step's counted seconds per batch, whatever its states (with its price tables, its options
and its subgradient: a least-squares fit over (32,8) to (80,16) of benchmarks/partition.py)."""
LAYER_S = 3e-6
"""A step's counted seconds per batch and layer."""
OPTION_S = 8e-8
"""A step's counted seconds per option of the priced program (a state times a split)."""
PRICES_S_PER_CELL = 5e-9
"""The counted seconds of the first tables (once) per batch, layer and pair of grid points."""


def quick_free_step_s(instance: LiveScalingInstance) -> float:
    """The ``free_step_s`` of a bound wanted within a heuristic's time (what ``plan()`` prints):
    :data:`QUICK_FREE_STEP_SHARE` of O's whole work."""
    return QUICK_FREE_STEP_SHARE * instance.num_layers * float(sum(instance.old_layer_s))


_STEP_START = 1.0
"""The first Polyak step factor (halved after every few steps without a better bound)."""

_PATIENCE = 5
"""Steps without a better bound before the step factor is halved."""

GRID_POINTS = (40, 16)
"""The multipliers' grid: the most layer arrivals on it (evenly picked) and its points after
the last arrival, evenly up to the larger of the arrivals' span and half of the batches' whole
work on N. Any grid keeps the bound valid."""

QUICK_GRID_POINTS = (20, 36)
""":data:`GRID_POINTS` of the bound printed beside a heuristic (``solve._relaxation_value``):
as many points, more of them past the arrivals, where O's blocks of a crowded pair end. In its
counted budget, of the best known on ``benchmarks/partition.py`` (seeds 0-4), (80,16) 0.868 /
0.805 -> 0.881 / 0.829 (mean / worst), (32,16) 0.963 / 0.927 -> 0.967 / 0.936, the other
classes equal; (40, 48) gave 0.881 / 0.833 at 30-45% more CPU a counted second (a step's
tables grow with the grid; its counted price does not), (24, 32) 0.880, (16, 40) 0.882. Only
on pairs whose relaxation's bound is under ``relaxation_slots.QUICK_FAR`` of the heuristic's
value (0.45-0.58 on (80,16)): on the paper's 12 x 2,048-token pair (0.88) it printed 0.9192 ->
0.9077."""

_COUNT_TOL = 1e-9
"""Layers whose latest end is this close to a grid point are not counted by it (counting fewer
keeps the constraint valid)."""


_Plan = list[tuple[int, int, int]]
"""Per batch of a priced plan: (batch, split, grid point its N part is counted from)."""


@dataclass(frozen=True)
class _Batch:
    """One batch's options on O (``k = 0..L-1``) as arrays, and its data."""

    rho: np.ndarray
    """Earliest start on O per split ``k``."""
    q: np.ndarray
    """O's run of the layers left, per split ``k``."""
    p_new: float
    handoff_s: float
    release_s: float
    alone_end_s: float
    """When it ends on N alone (all ``L`` layers)."""


class _Prices:
    """The grid of times, the multipliers, and what each option pays under them."""

    def __init__(
        self, instance: LiveScalingInstance, grid_points: tuple[int, int] = GRID_POINTS
    ) -> None:
        L, (most, tail) = instance.num_layers, grid_points
        self.usable = np.asarray(instance.usable_s)
        work = L * float(np.sum(instance.new_layer_s))  # all of it on N: N is done by then
        span = max(self.usable[-1] - self.usable[0], work / 2, 1e-9)
        after = self.usable[-1] + span * np.arange(1, tail + 1) / tail
        arrivals = self.usable[np.linspace(0, L - 1, min(L, most)).astype(int)]
        self.grid = np.unique(np.concatenate([arrivals, after]))
        self.slack = np.maximum(self.grid[None, :] - self.usable[:, None], 0.0)  # (L, G)
        self.mu = np.zeros((L, self.grid.size))
        self.batches = [_batch(instance, i) for i in range(instance.num_batches)]
        self.early = [self._early(b.p_new) for b in self.batches]
        self.gathers = [self._gather(early) for early in self.early]
        self.pay: list[np.ndarray] = []
        self.set(self.mu)

    def _early(self, p: float) -> np.ndarray:
        """``[k, J, j]``: how many of ``k`` layers on N end by grid point ``j < J`` when the
        last ends at grid point ``J`` (layer ``m`` ends by ``h - (k - m) p``); 0 for ``j >= J``."""
        G, L = self.grid.size, self.mu.shape[0]
        behind = (self.grid[:, None] - self.grid[None, :]) / p  # [J, j]
        behind = np.where(np.arange(G)[None, :] < np.arange(G)[:, None], behind, np.inf)
        k = np.arange(L + 1, dtype=float)[:, None, None]
        done = np.floor(np.minimum(k - behind[None, :, :] - _COUNT_TOL, k))
        return np.asarray(np.clip(done, 0, L).astype(np.int16))

    def _gather(self, early: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where ``early`` counts anything (``j < J``, some layer): per such pair, sorted by
        ``J``, the flat index of ``own[early[k, J, j], j]`` for every ``k``; the first pair of
        each ``J``; those ``J``. :meth:`set` sums only these (half the pairs or fewer)."""
        G = self.grid.size
        J, j = np.nonzero(early[-1])  # row-major: sorted by J; early[-1] > 0 only for j < J
        index = early[:, J, j].astype(np.int64) * G + j[None, :]
        first = np.flatnonzero(np.r_[True, J[1:] != J[:-1]]) if J.size else J
        return index, first, J[first]

    def set(self, mu: np.ndarray) -> None:
        """Take multipliers ``mu`` (L x G) and tabulate, per batch, ``pay[k, J]``: what ``k``
        layers on N pay when the last ends by grid point ``J`` (``G``: past the grid, 0)."""
        self.mu = mu
        L, G = mu.shape
        own = np.zeros((L + 1, G))  # own[m, j]: m layers counted at j, per second of pN
        own[1:] = np.cumsum(np.cumsum(mu, axis=0), axis=0)
        suffix = np.zeros((L + 1, G + 1))
        suffix[:, :-1] = np.cumsum(own[:, ::-1], axis=1)[:, ::-1]
        self.pay = []
        flat = own.ravel()
        for b, (index, first, J) in zip(self.batches, self.gathers, strict=True):
            partial = np.zeros((L + 1, G + 1))
            if J.size:
                partial[:, J] = np.add.reduceat(flat[index], first, axis=1)
            self.pay.append(b.p_new * (suffix + partial))

    def used(self, i: int, k: int, last: int) -> np.ndarray:
        """(L x G) N work batch ``i`` puts in each constraint with ``k`` layers on N, the last
        ending by grid point ``last``."""
        L, G = self.mu.shape
        if last >= G:  # past the grid: it pays nothing, and counts nowhere
            return np.zeros((L, G))
        counted = np.full(G, k, dtype=np.int64)
        counted[:last] = self.early[i][k, last, :last]
        layers = np.arange(1, L + 1)[:, None]
        return np.asarray(self.batches[i].p_new * np.maximum(counted[None, :] - layers + 1, 0))

    def constant(self) -> float:
        return float(np.sum(self.mu * self.slack))

    def first(self, h: np.ndarray) -> np.ndarray:
        """The first grid point at or after ``h``."""
        return np.searchsorted(self.grid, h, side="left")

    def later(self, i: int, k: np.ndarray, d: float) -> tuple[np.ndarray, np.ndarray]:
        """Per split in ``k`` and first grid point ``J``: the least ``t_j + d + pay`` over
        starts just after ``t_j + d`` (``j >= J``: the last N layer ends in ``(t_j, t_j+1]``),
        and the grid point it is then counted by."""
        G, pay = self.grid.size, self.pay[i]
        value = np.full((k.size, G + 1), math.inf)
        value[:, :G] = self.grid[None, :] + d + pay[k][:, 1:]
        backwards = value[:, ::-1]
        best = np.minimum.accumulate(backwards, axis=1)
        at = np.where(backwards <= best, np.arange(G + 1)[None, :], 0)
        chosen = G - np.maximum.accumulate(at, axis=1)[:, ::-1]  # the least value's j, from J on
        arg = np.minimum(chosen + 1, G)  # its last N layer ends in (t_j, t_j+1]: counted from j+1
        best = best[:, ::-1]
        return best, arg


def _batch(instance: LiveScalingInstance, i: int) -> _Batch:
    L = instance.num_layers
    chain = alone_chain_s(instance, i)
    d, r = instance.handoff_s[i], instance.release_s[i]
    rho = np.asarray([r, *(chain[k] + d for k in range(1, L))])
    q = (L - np.arange(L)) * instance.old_layer_s[i]
    return _Batch(rho, q, instance.new_layer_s[i], d, r, chain[L])


class _Priced:
    """Every batch's priced options under the current multipliers."""

    def __init__(self, prices: _Prices) -> None:
        self.prices = prices
        L = prices.mu.shape[0]
        self.k = np.arange(L)
        n = len(prices.batches)
        self.later = [prices.later(i, self.k, prices.batches[i].handoff_s) for i in range(n)]
        self.on_new = [self._on_new(i, L) for i in range(n)]

    def _on_new(self, i: int, L: int) -> tuple[float, int]:
        """(least priced latency, grid point counted by) of batch ``i`` ending on N."""
        prices, b = self.prices, self.prices.batches[i]
        j = int(prices.first(np.asarray([b.alone_end_s]))[0])
        now = b.alone_end_s + prices.pay[i][L, j]
        best, arg = prices.later(i, np.asarray([L]), 0.0)
        if best[0, j] < now:
            return float(best[0, j]) - b.release_s, int(arg[0, j])
        return now - b.release_s, j

    def on_old(self, i: int, free: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(states x splits) for batch ``i`` placed next on O when O is free at ``free``:
        O's next free time, the least priced latency, and the grid point counted by."""
        b, prices = self.prices.batches[i], self.prices
        start = np.maximum(free[:, None], b.rho[None, :])
        j = prices.first(start - b.handoff_s)
        now = start + prices.pay[i][self.k[None, :], j]
        best, arg = self.later[i]
        later = best[self.k[None, :], j]
        value = np.minimum(now, later) + b.q[None, :] - b.release_s
        counted = np.where(later < now, arg[self.k[None, :], j], j)
        return start + b.q[None, :], value, counted


def _pareto(free: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Indices of the states no other beats on both O free time and cost."""
    order = np.argsort(free, kind="stable")  # equal free times: both may stay (harmless)
    running = np.minimum.accumulate(cost[order])
    keep = np.ones(order.size, dtype=bool)
    keep[1:] = cost[order][1:] < running[:-1]
    return order[keep]


def _fifo_program(
    priced: _Priced,
    order: tuple[int, ...],
    b_old: float,
    ceiling: float,
    deadline_s: float,
    free_step_s: float = 0.0,
    clock: Clock = WALL_CLOCK,
) -> tuple[float, _Plan | None]:
    """The least priced total latency with O serving its batches in ``order``'s order, or
    ``ceiling`` when that is less, and the (split, grid point counted by) of each batch in a plan
    that reaches it (None when none is below ``ceiling``). A state whose cost plus the least
    each later batch can add reaches ``ceiling`` is dropped. Past ``deadline_s`` (read before
    every batch; an instant on ``clock``) it gives up: (nan, None). With
    ``free_step_s`` O's free time after each batch is rounded down to a multiple of it (still a
    bound: what the batches after it pay never falls as O frees later), so that states close in
    time merge."""
    L = priced.prices.mu.shape[0]
    free, cost = np.asarray([b_old]), np.asarray([0.0])
    floors = [min(priced.on_new[i][0], float(priced.on_old(i, free)[1].min())) for i in order]
    rest = np.cumsum([0.0, *floors[::-1]])[::-1][1:]  # what the batches after each add, at least
    history = []
    for step, i in enumerate(order):
        if clock.passed(deadline_s):
            return math.nan, None
        clock.spend(BATCH_S_FIXED + LAYER_S * L + OPTION_S * free.size * (L + 1))
        ends, values, counted = priced.on_old(i, free)
        stay, stay_j = priced.on_new[i]
        all_free = np.concatenate([free, ends.ravel()])
        if free_step_s > 0:
            all_free = np.floor(all_free / free_step_s) * free_step_s
        all_cost = np.concatenate([cost + stay, (cost[:, None] + values).ravel()])
        parent = np.concatenate([np.arange(free.size), np.repeat(np.arange(free.size), L)])
        split = np.concatenate([np.full(free.size, L), np.tile(np.arange(L), free.size)])
        first = np.concatenate([np.full(free.size, stay_j), counted.ravel()])
        alive = np.flatnonzero(all_cost + rest[step] < ceiling)
        if not alive.size:
            return ceiling, None
        keep = alive[_pareto(all_free[alive], all_cost[alive])]
        free, cost = all_free[keep], all_cost[keep]
        history.append((i, parent[keep], split[keep], first[keep]))
    index = int(np.argmin(cost))
    best = float(cost[index])
    plan = []
    for i, parent, split, first in reversed(history):
        plan.append((i, int(split[index]), int(first[index])))
        index = int(parent[index])
    return best, plan


def _subgradient(prices: _Prices, plan: _Plan) -> np.ndarray:
    """Each constraint's left side minus its right side in ``plan``."""
    used = sum((prices.used(i, split, last) for i, split, last in plan), np.zeros(prices.mu.shape))
    return np.asarray(used - prices.slack)


def lagrangian_bound(
    instance: LiveScalingInstance,
    *,
    old_order: str,
    objective: str = "mean_latency",
    upper_bound: float = math.inf,
    time_limit_s: float | None = None,
    iterations: int = LAGRANGE_ITERATIONS,
    free_step_s: float = 0.0,
    clock: Clock = WALL_CLOCK,
    grid_points: tuple[int, int] = GRID_POINTS,
) -> float:
    """A lower bound on ``objective`` over every schedule that keeps ``old_order`` (see the
    module docstring); ``-inf`` unless the order is ``"fifo"`` and the objective the mean
    latency. ``upper_bound`` (a known schedule's value) steers the multipliers and caps the
    answer; with ``time_limit_s`` the step under way when it runs out is dropped (it returns
    ``-inf`` when even the first, the plain relaxation, does not finish). ``free_step_s`` > 0
    rounds O's free time down to its multiples in the priced program: a weaker bound in less
    time a step (:func:`quick_free_step_s`). On a meter ``clock``, ``time_limit_s`` is counted
    seconds (:mod:`~blitzplan.live.work_meter`; its wall clock only a safety net).
    ``grid_points``: the multipliers' grid (:data:`GRID_POINTS`)."""
    if objective != "mean_latency" or old_order != "fifo":
        return -math.inf
    deadline = math.inf if time_limit_s is None else clock.now_s() + time_limit_s
    n, prices = instance.num_batches, _Prices(instance, grid_points)
    clock.spend(PRICES_S_PER_CELL * instance.num_layers * n * prices.grid.size**2)
    target = upper_bound * n if math.isfinite(upper_bound) else math.inf
    ascent = PolyakSteps(target, AIM_SHARE, _PATIENCE, _STEP_START)
    for _ in range(iterations):
        value, g = _solve_priced(instance, prices, target, deadline, free_step_s, clock)
        ascent.seen(value)
        if g is None or value >= target or math.isnan(value):
            break
        prices.set(np.maximum(prices.mu + ascent.size(value, float(np.sum(g * g))) * g, 0.0))
    return ascent.best / n


def _solve_priced(
    instance: LiveScalingInstance,
    prices: _Prices,
    target: float,
    deadline_s: float,
    free_step_s: float,
    clock: Clock,
) -> tuple[float, np.ndarray | None]:
    """The priced program's value (at most ``target``; nan when ``deadline_s`` cut it) under the
    current multipliers, and a subgradient there (None when the value reached ``target``, the
    program was cut, or no constraint is violated or slack: the multipliers cannot move)."""
    constant = prices.constant()
    cost, plan = _fifo_program(
        _Priced(prices),
        instance.fifo_order,
        instance.old_free_at_s,
        target + constant,
        deadline_s,
        free_step_s,
        clock,
    )
    if plan is None:
        return cost - constant, None
    g = _subgradient(prices, plan)
    return cost - constant, g if float(np.sum(g * g)) > 0 else None
