"""The Lagrangian bound: N's capacity per window of layers, priced into O's sequencing.

The N-capacity relaxation (:mod:`.relaxation`) keeps O's non-preemptive order and
drops N's capacity. Here the capacity comes back as a family of valid inequalities, dualised.
Let batch ``i`` run ``k_i`` layers on N, its last one ending at ``h_i`` (for a batch that ends
on N, its completion). Layers ``l..k_i`` of every batch start on N no earlier than ``u_l`` (when
layer ``l`` is usable: arrivals are non-decreasing), and so do layers ``f_i(l)..l-1`` where
``f_i(l) <= l`` is the first layer of batch ``i`` that cannot start before ``u_l`` even alone
(its alone chain: a batch released after layer ``l`` arrived, or running behind the arrivals);
none of these starts before ``o_l >= u_l``, the least such earliest start over the batches. They
end by ``h_i`` and N runs one operation at a time, so for every layer ``l`` and time ``t`` of a
grid::

    sum over i of pN_i (c_i(t) - f_i(l) + 1)^+  <=  (t - o_l)^+                 (l, t)

where ``c_i(t)`` counts the layers of batch ``i`` that end by ``t`` for sure: all ``k_i`` when
``h_i <= t``, else those ``m`` with ``h_i - (k_i - m) pN_i <= t`` (layer ``m`` ends at least
``k_i - m`` layer times before the last). With multipliers ``mu[l, t] >= 0`` each batch option
``(k, h)`` pays ``pN_i sum mu[l, t] (c(t) - f_i(l) + 1)^+`` and the total gets ``- sum mu[l, t]
(t - o_l)^+``: for every ``mu`` the least priced value over the relaxed plans (N's capacity dropped,
every batch's layers on N as early as it could run them alone) is a lower bound on every
schedule (weak duality). The price only falls as ``h`` grows, so it is taken at the grid point
that closes ``h``'s interval (a lower price: still a bound), and a batch placed on O when O is
free at ``T`` may start later than it could (any start ``S >= max(T, rho_k)``, ``h = S - d_i``):
its priced value is nondecreasing in ``T``. The program over O's batch sequence keeps, per split
``k``, O's earliest next free time beside the least priced value over the starts (each a lower
bound of what that split can give), so the Pareto merge of (free time, value) stays a
relaxation; so does dropping a state that one freeing O later beats by more than the delay
can cost the batches after it (:func:`_pareto`: on (80,16) 35-70% fewer states a step), O's
free times rounded or not.

It is written for ``old_order="fifo"``, where O's order is fixed and the program is linear in
the batches (per batch, the Pareto front of the states times the ``L + 1`` splits); under
``"free"`` (a variant measured below the plain relaxation, docs/benchmarks.md) and for an
objective other than the mean latency it returns ``-inf``.

The multipliers come from a subgradient method with Polyak steps aimed part way toward a known
schedule's value (:data:`AIM_SHARE`); any multipliers give a valid bound, so stopping early
only weakens it. A step's price tables sum, per batch, only the (grid point, earlier grid
point) pairs where some layer is counted (1 ms against 19 ms on (80,16)); for a bound wanted
quickly, the program may round O's free time down to a grid (:func:`quick_free_step_s`),
which merges states and stays a bound. Given a :class:`~blitzplan.live.work_meter.WorkMeter`,
the time limit is counted work (each step's tables and each batch of its program priced by
:data:`BATCH_S_FIXED`, :data:`LAYER_S` and :data:`OPTION_S`): the same bound on every run.
"""

from __future__ import annotations

import math

import numpy as np

from blitzplan.live.bound.fronts import staircase
from blitzplan.live.bound.lagrange_prices import Priced, Prices
from blitzplan.live.bound.polyak import PolyakSteps
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.work_meter import WALL_CLOCK, Clock

__all__ = [
    "FAR_RELAXED",
    "GRID_POINTS",
    "LAGRANGE_ITERATIONS",
    "QUICK_FAR_AIM_SHARE",
    "QUICK_FAR_FREE_STEP_SHARE",
    "QUICK_FREE_STEP_SHARE",
    "QUICK_GRID_POINTS",
    "far_from",
    "lagrangian_bound",
    "quick_free_step_s",
]

LAGRANGE_ITERATIONS = 200
"""The most subgradient steps (each solves the priced program once)."""

AIM_SHARE = 0.5
"""Each step aims this share of the way from the best bound to the known schedule's value (1
is Polyak's rule; on (80,16) under FIFO 0.5 did better: docs/benchmarks.md, sixth session)."""

QUICK_FREE_STEP_SHARE = 1e-4
"""The share of O's whole work (every batch's every layer on O) that :func:`quick_free_step_s`
rounds O's free time to: about 1 ms on (80,16). It was 2e-4; with the states :func:`_pareto`
drops, the finer rounding pays: the printed bound on (80,16), of the best known, 0.886 / 0.829
-> 0.895 / 0.849 (mean / worst; without that merge 0.881 / 0.829 -> 0.878 / 0.830)."""

QUICK_FAR_FREE_STEP_SHARE = 1e-3
""":data:`QUICK_FREE_STEP_SHARE` on a pair far from its heuristic (``far``, as for
:data:`QUICK_GRID_POINTS`): about 10 ms on (80,16). Since :func:`_pareto` charges the rounding
no slack, the coarser rounding merges more states there and 16-27 steps fit in the count
instead of 6-16 ((80,16) 0.900 / 0.850 -> 0.910 / 0.866 of the best known, mean / worst, with
:data:`QUICK_FAR_AIM_SHARE`; 3e-4 and 5e-4 0.908; docs/benchmarks.md, s17-h2)."""

QUICK_FAR_AIM_SHARE = 1.0
""":data:`AIM_SHARE` of the printed bound on a pair far from its heuristic: Polyak's rule (with
the coarser rounding's extra steps, longer steps did better there: (80,16) mean of s16-h2's
best known, aim 0.5 / 0.75 / 1 0.906 / 0.907 / 0.909)."""

BATCH_S_FIXED = 1.1e-4
"""A step's counted seconds per batch, whatever its states (with its price tables, its options
and its subgradient: a least-squares fit over (32,8) to (80,16) of benchmarks/partition.py)."""
LAYER_S = 3e-6
"""A step's counted seconds per batch and layer."""
OPTION_S = 8e-8
"""A step's counted seconds per option of the priced program (a state times a split)."""
OWN_TABLE_S = 3e-5
"""A step's counted seconds per batch whose price tables are its own (one released after its
first layers arrive: :class:`~blitzplan.live.bound.lagrange_prices.Prices` ``own_tables``), beside
:data:`OWN_TABLE_S_PER_CELL` per cell of them (measured: 0.13 ms a table on (80,16), 0.06 ms
on (32,16))."""
OWN_TABLE_S_PER_CELL = 2.2e-8
"""A step's counted seconds per cell (layer times grid point) of a batch's own price tables."""
PRICES_S_PER_CELL = 5e-9
"""The counted seconds of the first tables (once) per batch, layer and pair of grid points."""


def quick_free_step_s(instance: LiveScalingInstance, *, far: bool = False) -> float:
    """The ``free_step_s`` of a bound wanted within a heuristic's time (what ``plan()`` prints):
    :data:`QUICK_FREE_STEP_SHARE` of O's whole work (``far``: :data:`QUICK_FAR_FREE_STEP_SHARE`)."""
    share = QUICK_FAR_FREE_STEP_SHARE if far else QUICK_FREE_STEP_SHARE
    return share * instance.num_layers * float(sum(instance.old_layer_s))


_STEP_START = 1.0
"""The first Polyak step factor (halved after every few steps without a better bound)."""

_PATIENCE = 5
"""Steps without a better bound before the step factor is halved."""

GRID_POINTS = (40, 16)
"""The multipliers' grid: the most layer arrivals on it (evenly picked) and its points after
the last arrival, evenly up to the larger of the arrivals' span and half of the batches' whole
work on N. Any grid keeps the bound valid."""

QUICK_GRID_POINTS = (20, 36)
""":data:`GRID_POINTS` of the bound printed beside a heuristic (``printed.relaxation_value``):
more points past the arrivals, where O's blocks of a crowded pair end ((80,16) 0.868 -> 0.881
of the best known, mean; docs/benchmarks.md, s15-h3). Only on pairs whose relaxation's bound
is under ``slots.QUICK_FAR`` of the heuristic's value (on the paper's 12 x
2,048-token pair it printed 0.9192 -> 0.9077)."""

FAR_RELAXED = 0.9
"""Given the plain relaxation's bound (``relaxed``) under this share of the known schedule's
value, :func:`lagrangian_bound` takes by default the settings of the printed bound on a pair far
from its heuristic (:data:`QUICK_GRID_POINTS`, :data:`QUICK_FAR_FREE_STEP_SHARE`,
:data:`QUICK_FAR_AIM_SHARE`): at the exact search's root on (80,16) FIFO (relaxation 0.64-0.79
of the best known) in 1 s they reach 0.946 / 0.923 / 0.924 of the best known on seeds 0-2
against 0.918 / 0.906 / 0.897 with :data:`GRID_POINTS` and :data:`AIM_SHARE` unrounded; where
the relaxation is near the best known ((80,8), (40,12): 0.97-1.0) the rounding costs up to 0.9%
and the defaults stay (docs/benchmarks.md, s19-h2)."""


def far_from(relaxed: float, upper_bound: float) -> bool:
    """Whether the plain relaxation's bound ``relaxed`` is under :data:`FAR_RELAXED` of a known
    schedule's value (False when either is not finite)."""
    known = math.isfinite(relaxed) and math.isfinite(upper_bound)
    return known and relaxed < FAR_RELAXED * upper_bound


_Plan = list[tuple[int, int, int]]
"""Per batch of a priced plan: (batch, split, grid point its N part is counted from)."""


def _pareto(free: np.ndarray, cost: np.ndarray, later: int) -> np.ndarray:
    """Indices of the states no other beats on both O free time and cost, less those one
    freeing O ``Delta`` later beats by more than ``later Delta``: in the unrounded program a
    batch's priced value and O's next free time grow by at most what O's free time does (the
    price only falls as the start grows), so from O free ``Delta`` later the ``later`` batches
    cost at most ``later Delta`` more. The merge keeps, at every batch, a state whose cost plus
    the unrounded program's least cost of the rest from its free time is at most the unrounded
    program's value (true at the start; an option's successor keeps it, its free time rounded
    down only lowers the rest; a dropped state's beater keeps it by the bound above), so the
    value stays at most the unrounded program's, with O's free time rounded or not (no slack
    for the rounding: the argument never uses the rounded program's own rest)."""
    order = np.argsort(free, kind="stable")  # equal free times: both may stay (harmless)
    order = order[staircase(cost[order])]
    if order.size < 2 or later == 0:
        return order
    reach = cost[order] + later * free[order]  # cost plus what its delay may cost the rest
    beaten = np.empty(order.size)
    beaten[-1] = math.inf
    beaten[:-1] = np.minimum.accumulate(reach[::-1])[::-1][1:]  # the least of later states
    kept: np.ndarray = order[reach < beaten + 1e-9 * (1.0 + np.abs(reach))]
    return kept


def _fifo_program(
    priced: Priced,
    order: tuple[int, ...],
    b_old: float,
    ceiling: float,
    deadline_s: float,
    free_step_s: float = 0.0,
    clock: Clock = WALL_CLOCK,
) -> tuple[float, _Plan | None]:
    """The least priced total latency with O serving its batches in ``order``'s order, or
    ``ceiling`` when that is less, and the (split, grid point counted by) of each batch in a plan
    that reaches it (None when none is below ``ceiling``); a state whose cost plus the least
    each later batch can add reaches ``ceiling`` is dropped. Past ``deadline_s`` (an instant on
    ``clock``) it gives up: (nan, None). With ``free_step_s`` O's free time is rounded down to
    its multiples (still a bound), so that states close in time merge."""
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
        later = len(order) - step - 1  # batches after this one
        keep = alive[_pareto(all_free[alive], all_cost[alive], later)]
        free, cost = all_free[keep], all_cost[keep]
        history.append((i, parent[keep], split[keep], first[keep]))
    index = int(np.argmin(cost))
    best = float(cost[index])
    plan = []
    for i, parent, split, first in reversed(history):
        plan.append((i, int(split[index]), int(first[index])))
        index = int(parent[index])
    return best, plan


def _subgradient(prices: Prices, plan: _Plan) -> np.ndarray:
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
    free_step_s: float | None = None,
    clock: Clock = WALL_CLOCK,
    grid_points: tuple[int, int] | None = None,
    aim_share: float | None = None,
    relaxed: float = -math.inf,
) -> float:
    """A lower bound on ``objective`` over every schedule that keeps ``old_order`` (see the
    module docstring); ``-inf`` unless the order is ``"fifo"`` and the objective the mean
    latency. ``upper_bound`` (a known schedule's value) steers the multipliers and caps the
    answer; with ``time_limit_s`` the step under way when it runs out is dropped (it returns
    ``-inf`` when even the first, the plain relaxation, does not finish). ``free_step_s`` > 0
    rounds O's free time down to its multiples in the priced program: a weaker bound in less
    time a step (:func:`quick_free_step_s`). On a meter ``clock``, ``time_limit_s`` is counted
    seconds (:mod:`~blitzplan.live.work_meter`; its wall clock only a safety net).
    ``grid_points``: the multipliers' grid (None: :data:`GRID_POINTS`); ``aim_share``: how far
    each step aims toward ``upper_bound`` (None: :data:`AIM_SHARE`). With ``relaxed``, the
    plain relaxation's bound, under :data:`FAR_RELAXED` of ``upper_bound``, those left None and
    ``free_step_s`` take the far settings instead (the printed bound's far ones)."""
    if objective != "mean_latency" or old_order != "fifo":
        return -math.inf
    far = far_from(relaxed, upper_bound)
    if free_step_s is None:
        free_step_s = quick_free_step_s(instance, far=True) if far else 0.0
    if grid_points is None:
        grid_points = QUICK_GRID_POINTS if far else GRID_POINTS
    if aim_share is None and far:
        aim_share = QUICK_FAR_AIM_SHARE
    deadline = math.inf if time_limit_s is None else clock.now_s() + time_limit_s
    n, prices = instance.num_batches, Prices(instance, grid_points)
    clock.spend(PRICES_S_PER_CELL * instance.num_layers * n * prices.grid.size**2)
    target = upper_bound * n if math.isfinite(upper_bound) else math.inf
    aim = AIM_SHARE if aim_share is None else aim_share
    ascent = PolyakSteps(target, aim, _PATIENCE, _STEP_START)
    for _ in range(iterations):
        value, g = _solve_priced(instance, prices, target, deadline, free_step_s, clock)
        ascent.seen(value)
        if g is None or value >= target or math.isnan(value):
            break
        prices.set(np.maximum(prices.mu + ascent.size(value, float(np.sum(g * g))) * g, 0.0))
    return ascent.best / n


def _solve_priced(
    instance: LiveScalingInstance,
    prices: Prices,
    target: float,
    deadline_s: float,
    free_step_s: float,
    clock: Clock,
) -> tuple[float, np.ndarray | None]:
    """The priced program's value (at most ``target``; nan when ``deadline_s`` cut it) under the
    current multipliers, and a subgradient there (None when the value reached ``target``, the
    program was cut, or no constraint is violated or slack: the multipliers cannot move)."""
    constant = prices.constant()
    cells = prices.mu.size
    clock.spend(prices.own_tables * (OWN_TABLE_S + OWN_TABLE_S_PER_CELL * cells))
    cost, plan = _fifo_program(
        Priced(prices),
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
