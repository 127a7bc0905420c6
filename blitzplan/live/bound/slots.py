"""The slot bound: both instances' capacity per time slot, priced; each batch then alone.

The N-capacity relaxation (:mod:`blitzplan.live.bound.relaxation`) keeps O's order and drops N's
capacity; on congested pairs that loses 10-35%. Here both machines' capacity comes back as one
family of valid inequalities per machine: cut time into slots ``[T_j, T_j+1)``; in every
schedule the operations N runs overlap each slot for at most its width, and so do O's blocks::

    sum over batches of |N's operations of i  in  [T_j, T_j+1)|  <=  T_j+1 - T_j    (N, j)
    sum over batches of |O's block of i       in  [T_j, T_j+1)|  <=  T_j+1 - T_j    (O, j)

Dualised with prices ``lam_j, mu_j >= 0``, what is left is one problem per batch: its split
``k`` (a cut point), its layers' starts on N (in order, each after its arrival and the one
before it) and its block's start on O, at the cost of its latency plus the prices of the slot
time it occupies. For every set of prices the least priced total, less the prices times the
slot widths, is a lower bound on every schedule's total latency (weak duality), whatever O's
order. It pays under the free order on congested pairs (docs/benchmarks.md, sixth session);
under FIFO, whose optimum lies well above the free one, the FIFO bounds do better.

The priced problem and its dynamic program are in :mod:`blitzplan.live.bound.slot_prices`; here the
subgradient steps that choose the prices: :func:`slot_bound` (``bnb``'s, 250 slots, steps aimed
at a known schedule's value) and :func:`quick_slot_bound` (the bound printed beside a heuristic:
40 slots, the program's latency floor, steps aimed a little above the best bound so far).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from blitzplan.live.bound.polyak import PolyakSteps
from blitzplan.live.bound.relaxation import RelaxedPlan, repair
from blitzplan.live.bound.slot_prices import SLOTS, SlotPath, SlotPrices, slot_usage, solve_batches
from blitzplan.live.instance import LiveScalingInstance

__all__ = [
    "SLOT_ITERATIONS",
    "SlotPrices",
    "priced_orders",
    "quick_slot_bound",
    "quick_step_count",
    "quick_steps_s",
    "slot_bound",
    "slot_setup_s",
]

SLOT_ITERATIONS = 300
"""The most subgradient steps of :func:`slot_bound`."""

MIN_STEPS = 20
"""With a time limit, no step follows the first when fewer than this many would fit."""

SETUP_S_PER_CELL = 4e-7
"""The CPU seconds of :func:`slot_bound`'s set-up from a known schedule (its grids and first
prices, :func:`slot_setup_s`) per layer, batch and slot: measured 80-160 ns per layer, batch
and chain step (about two steps a slot) on seeds 0-2 of ``benchmarks/partition.py``'s (32,8)
to (80,24) at load 7, so up to 320 ns a slot, raised 1.3x. Under load its wall time
stretched to 0.86 s on (80,16), where a 2 s limit had left it 0.26 s."""

HORIZON_PAST_LAST = 1.02
"""With a known schedule, the slots end this far past its last completion (relatively)."""

FIRST_PRICES = ((0.3, 0.5), (0.2, 0.4), (0.4, 0.4))
"""(N's share, scale) of the first prices tried from a known schedule (on (32,16) the best
starts at 0.70 of the schedule's value, zero prices at 0.30)."""

AIM_SHARE = 0.3
"""Each step aims this share of the way from the best bound to the known schedule's value (1
is Polyak's rule; against ZigZag's value on (32,16), 0.25-0.5 climb faster)."""

_STEP_START = 1.0
_PATIENCE = 6

QUICK_SLOTS = 40
"""Slots per machine of :func:`quick_slot_bound`'s grid. With N's chains counted from their
layers (:mod:`blitzplan.live.bound.slot_chains`) a coarse grid loses little and its steps are cheap:
in the steps :func:`quick_step_count` gives 0.15 s, from the relaxation's plan (0.5 s), mean
of the best known on seeds 0-4 of ``benchmarks/partition.py``, 30 / 40 / 60 / 160 slots:
(80,16) 0.830 / 0.830 / 0.812 / 0.778 (10 / 9 / 7 / 3 steps), (32,16) 0.924 / 0.927 / 0.924
/ 0.920, (40,12) 0.963 / 0.965 / 0.964 / 0.963. (Before, a chain of layers shorter than a
step ran in no time and 130-250 slots did best: 60 slots 0.88-0.92 on (32,16), (80,16) no
higher than the relaxation.)"""

QUICK_STEPS = 16
"""The steps :func:`quick_slot_bound` needs to pay (about: on (32,16) 0.91-0.95 of the best
known in 20-35 steps); see :func:`quick_steps_s`."""

STEP_S_PER_CELL = 6.7e-8
"""A step's CPU seconds per layer, batch and slot beyond :data:`STEP_S_PER_ROW`: 6e-8 until the
hand-over slot was counted (:meth:`~blitzplan.live.bound.slot_prices.SlotPrices._stops`, 5-9 ns a
cell measured on the five classes at 40 slots, load 9; raised by 7 ns). This and the
next two were least-squares fitted to the thread CPU time of 16 steps (the program, its
choices, the next prices) on seeds 0-2 of ``benchmarks/partition.py``'s (32,8) to (40,24) at 40
and 80 slots (2-core x86_64, load 5-6.5: measured / fitted 0.87-1.09), then raised 1.2x, the
median measured / fitted over a wider set at 40 slots (those classes and nine paper pairs of
8-16 equal or mixed queued batches, load 6.5: 1.02-1.33, mixed queues and one (80,16) seed up to
1.7-2.3)."""

COUNTED_SHARE = 1.0
"""The share of its budget :func:`quick_step_count` counts steps for. It was 0.6, a margin
that kept the count, not the wall clock, the one that stopped the steps; the printed bound's
clocks are now only far safety nets (``printed.BOUND_SAFETY``), so the steps take the
share the budget gives them: clock-free, of the best known, (80,16) 0.830 -> 0.856 (9 -> 16
steps), (32,16) 0.927 -> 0.938, (40,12) 0.965 -> 0.969."""

STEP_S_FIXED = 5e-4
"""A step's CPU seconds on any grid."""

STEP_S_PER_ROW = 6e-7
"""A step's CPU seconds per layer and batch, whatever the slots (the program's calls per layer,
the trace's search per layer, O's blocks per split). Each layer's charges read in one take and
the trace's step found by one search made a step on (80,16) at 40 slots 5.6 -> 3.5-4.0 ms;
before, this was 3e-6 (with 1e-3 fixed and 7e-8 a cell: 8.4 ms estimated there)."""

QUICK_SETUP_STEPS = 2.5
"""What :func:`quick_slot_bound` does before its steps (its grids and its first prices' trial),
in steps (measured 2.2-2.8 steps at 40 slots, 2.1-3.2 at 80)."""

QUICK_RISE = 0.1
""":func:`quick_slot_bound`'s steps aim this share above the best bound so far (halved after
:data:`QUICK_PATIENCE` steps without a better one): a heuristic's value, the other aim, lies
far above the optimum on crowded pairs (ZigZag 1.5-2x the best known on (32,16) and (80,16))."""

QUICK_PATIENCE = 4
"""Steps without a better bound after which :func:`quick_slot_bound` halves its rise (see
:data:`QUICK_FAR_PATIENCE`)."""

QUICK_HORIZONS = (HORIZON_PAST_LAST, 0.85, 0.72, 0.6)
"""Where :func:`quick_slot_bound`'s slots may end, as shares of the known schedule's last
completion, tried in turn (:func:`_quick_grid`). Any horizon gives a bound; a nearer one gives
the crowded start finer slots and leaves the tail unpriced. The known schedule (ZigZag's or
the relaxation's repaired) ends late on crowded pairs: on (80,16) of
``benchmarks/partition.py`` one horizon for all, 1.02 / 0.85 / 0.7 / 0.6 / 0.5 / 0.4, gave 0.893
/ 0.896 / 0.899 / 0.904 / 0.902 / 0.872 of the best known (mean, seeds 0-4, the counted steps),
but 0.7 / 0.6 cost (32,16)'s seed 0 0.970 -> 0.950 / 0.911; the first prices' bound falls there
too, so it chooses (only when the known schedule is far, :data:`QUICK_FAR`)."""

QUICK_FAR = 0.65
""":func:`quick_slot_bound` tries nearer horizons (:data:`QUICK_HORIZONS`) and halves its rise
sooner (:data:`QUICK_FAR_PATIENCE`) when its ``floor`` is below this share of the known
schedule's value: that schedule is then far from the optimum and ends late (on (80,16) of
``benchmarks/partition.py`` the relaxation's bound is 0.43-0.60 of it, on (32,16) 0.57-0.85).
On the paper's pairs (mistral-small-24b TP2 on paper-a800-32, 8-16 queued batches of 512-4,096
tokens; 0.78-0.87 there) both lowered the printed bound: 12 x 2,048 tokens 0.935 -> 0.915 with
the horizons, 0.911 with patience 2; 16 x 2,048 1.124 -> 1.084."""

QUICK_FAR_PATIENCE = 2
""":data:`QUICK_PATIENCE` when the known schedule is far (:data:`QUICK_FAR`): on (80,16), with
the horizons, of the best known 0.900 -> 0.903 (mean), (32,16) and (40,12) within 0.001."""

QUICK_HORIZON_GAIN = 0.02
""":func:`_quick_grid` goes on to the next horizon while its first prices bound this share more
than the last kept (0.01 / 0.02 / 0.04: (32,16) 0.952 / 0.956 / 0.955, (80,16) 0.903 all)."""

QUICK_FIRST_PRICES = ((0.3, 0.5),)
""":func:`quick_slot_bound`'s first prices: one trial, as two more steps did better than the
other two trials of :data:`FIRST_PRICES` on (32,16) of ``benchmarks/partition.py`` (seeds 0-2:
0.905 / 0.884 / 0.906 -> 0.919 / 0.900 / 0.913 of the best known in the same time)."""


def _subgradient(prices: SlotPrices, paths: list[SlotPath]) -> tuple[np.ndarray, np.ndarray]:
    inst, L = prices.instance, prices.instance.num_layers
    new_s, new_len, old_s, old_len = list[float](), list[float](), list[float](), list[float]()
    for i, path in enumerate(paths):
        new_s += path.new_starts
        new_len += [inst.new_layer_s[i]] * len(path.new_starts)
        if path.old_start is not None:
            old_s.append(path.old_start)
            old_len.append((L - path.split) * inst.old_layer_s[i])
    return slot_usage(prices.new, new_s, new_len), slot_usage(prices.old, old_s, old_len)


def _move(prices: SlotPrices, paths: list[SlotPath], ascent: PolyakSteps, value: float) -> bool:
    """One subgradient step from the prices that gave ``value`` and ``paths`` (projected on
    the prices >= 0); False when the subgradient is zero there (nothing to move along)."""
    g_new, g_old = _subgradient(prices, paths)
    g_new = np.where((prices.lam <= 0) & (g_new < 0), 0.0, g_new)
    g_old = np.where((prices.mu <= 0) & (g_old < 0), 0.0, g_old)
    norm = float(np.sum(g_new * g_new) + np.sum(g_old * g_old))
    if norm <= 0:
        return False
    t = ascent.size(value, norm)
    prices.set(np.maximum(prices.lam + t * g_new, 0.0), np.maximum(prices.mu + t * g_old, 0.0))
    return True


def default_horizon_s(instance: LiveScalingInstance) -> float:
    """Where the slots end when no schedule is known (any horizon keeps the bound valid): all
    the work, each layer on its faster machine, after the head, O and the releases."""
    L = instance.num_layers
    pairs = zip(instance.new_layer_s, instance.old_layer_s, strict=True)
    work = sum(L * min(a, b) for a, b in pairs)
    return max(instance.head_ready_s, instance.old_free_at_s, max(instance.release_s)) + work


def _first_prices(
    prices: SlotPrices,
    completion_s: Sequence[float],
    trials: Sequence[tuple[float, float]] = FIRST_PRICES,
    deadline_s: float = math.inf,
) -> float:
    """Start from the prices a known schedule suggests: a unit of delay at ``t`` costs about
    the number of batches not yet complete then, shared between the two machines (``trials``,
    each a share of N's and a scale, :data:`FIRST_PRICES`; the best of them is kept, each
    costs a step's program; none is started past ``deadline_s``, a ``time.perf_counter()``
    instant)."""
    done = np.asarray(completion_s)
    waiting_new = (done[None, :] > prices.new.edges[:-1, None]).sum(axis=1).astype(float)
    waiting_old = (done[None, :] > prices.old.edges[:-1, None]).sum(axis=1).astype(float)
    best, chosen = -math.inf, (prices.lam, prices.mu)
    for share, scale in trials:
        if time.perf_counter() > deadline_s:
            return best  # (the prices stay a trial's: its caller stops too)
        lam, mu = share * scale * waiting_new, (1 - share) * scale * waiting_old
        prices.set(lam, mu)
        total, _ = solve_batches(prices, None, paths=False)
        if total - prices.constant() > best:
            best, chosen = total - prices.constant(), (lam, mu)
    prices.set(*chosen)
    return best


def slot_bound(
    instance: LiveScalingInstance,
    *,
    objective: str = "mean_latency",
    upper_bound: float = math.inf,
    time_limit_s: float | None = None,
    iterations: int = SLOT_ITERATIONS,
    completion_s: Sequence[float] | None = None,
    on_paths: Callable[[list[SlotPath]], float] | None = None,
    slots: int | None = None,
    latency_floor: bool = False,
) -> tuple[float, SlotPrices | None]:
    """(a lower bound on the mean latency, the prices that gave it) by subgradient steps (see
    the module docstring); ``(-inf, None)`` for another objective. ``upper_bound`` (a known
    schedule's value) steers the steps and caps the answer. ``completion_s``, a known
    schedule's completions, sets where the slots end (a little past its last; without,
    :func:`default_horizon_s`) and the first prices (:func:`_first_prices`). With
    ``time_limit_s`` it stops after the step under way (the first runs unless the grids and
    first prices took the time: then the answer is ``(-inf, None)``), and after the first when
    fewer than :data:`MIN_STEPS` would fit. ``on_paths``, given every step's choices,
    answers the best schedule value known then (it may turn them into schedules,
    :func:`priced_orders`): the steps aim at it from then on. ``slots`` and ``latency_floor``:
    the grid (default :data:`~blitzplan.live.bound.slot_prices.SLOTS` slots) and the
    program's latency floor (see :class:`SlotPrices`)."""
    if objective != "mean_latency":
        return -math.inf, None
    deadline = math.inf if time_limit_s is None else time.perf_counter() + time_limit_s
    floor = latency_floor
    if completion_s is None:
        prices = SlotPrices(instance, default_horizon_s(instance), slots, latency_floor=floor)
    else:
        horizon = HORIZON_PAST_LAST * max(completion_s)
        prices = SlotPrices(instance, horizon, slots, latency_floor=floor)
        _first_prices(prices, completion_s, deadline_s=deadline)
    if time.perf_counter() > deadline:  # the set-up took the time: no step, no bound
        return -math.inf, None
    n = instance.num_batches
    target = upper_bound * n if math.isfinite(upper_bound) else math.inf
    ascent = PolyakSteps(target, AIM_SHARE, _PATIENCE, _STEP_START)
    best_prices = (prices.lam, prices.mu)
    began = time.perf_counter()
    for iteration in range(iterations):
        total, paths = solve_batches(prices, None, paths=True)
        value = total - prices.constant()
        if on_paths is not None and paths:
            ascent.target = target = min(target, on_paths(paths) * n)
        if ascent.seen(value):
            best_prices = (prices.lam, prices.mu)
        now = time.perf_counter()
        if value >= target or not paths or now > deadline:
            break
        if iteration == 0 and began + MIN_STEPS * (now - began) > deadline:
            break
        if not _move(prices, paths, ascent, value):
            break
    prices.set(*best_prices)
    return min(ascent.best, target) / n, prices


def quick_slot_bound(
    instance: LiveScalingInstance,
    *,
    upper_bound: float,
    completion_s: Sequence[float],
    time_limit_s: float,
    floor: float = -math.inf,
    steps: int | None = None,
) -> float:
    """A lower bound on the mean latency from slot prices found within about ``time_limit_s``
    (wall clock; the first step always runs): from the prices a known schedule suggests
    (``completion_s``, value ``upper_bound``; :func:`_first_prices`, one trial per horizon of
    :func:`_quick_grid`, more than one when that schedule is far, :data:`QUICK_FAR`),
    subgradient steps on :data:`QUICK_SLOTS` slots with the program's latency floor (after 10
    steps, of the best known on ``benchmarks/partition.py``'s seeds 0-4: (80,16) +0 to +11
    points, (32,16) -1 to +4), each aimed :data:`QUICK_RISE` above the best of its bounds and
    ``floor`` (another bound known). Every step's value is a bound (its program is solved
    exactly, from below); the answer is the best, capped at ``upper_bound``. ``steps``: the
    most steps, the horizons' trials included (a test's clock-free run)."""
    deadline = time.perf_counter() + time_limit_s
    n = instance.num_batches
    far = floor < QUICK_FAR * upper_bound
    horizons = QUICK_HORIZONS if far else QUICK_HORIZONS[:1]
    patience = QUICK_FAR_PATIENCE if far else QUICK_PATIENCE
    prices, steps = _quick_grid(instance, completion_s, steps, horizons)
    target = upper_bound * n
    ascent = PolyakSteps(target, AIM_SHARE, patience, rise=QUICK_RISE, floor=floor * n)
    for _ in itertools.count() if steps is None else range(steps):
        total, paths = solve_batches(prices, None, paths=True)
        value = total - prices.constant()
        ascent.seen(value)
        if value >= target or not paths or time.perf_counter() > deadline:
            break
        if not _move(prices, paths, ascent, value):
            break
    return min(ascent.best, target) / n


def _quick_grid(
    instance: LiveScalingInstance,
    completion_s: Sequence[float],
    steps: int | None,
    horizons: Sequence[float],
) -> tuple[SlotPrices, int | None]:
    """The grid and first prices of :func:`quick_slot_bound` and the steps left after them: the
    horizons :data:`QUICK_HORIZONS` tried in turn while each one's first prices bound
    :data:`QUICK_HORIZON_GAIN` more than the last kept (each trial after the first costs
    :data:`QUICK_SETUP_STEPS` of ``steps``; none when fewer than :data:`MIN_STEPS` are left)."""
    last = max(completion_s)
    kept, best = None, -math.inf
    for trial, share in enumerate(horizons):
        if trial and steps is not None:
            if steps - QUICK_SETUP_STEPS < MIN_STEPS:
                break
            steps = int(steps - QUICK_SETUP_STEPS)
        prices = SlotPrices(instance, share * last, QUICK_SLOTS, latency_floor=True)
        value = _first_prices(prices, completion_s, QUICK_FIRST_PRICES)
        if kept is not None and value - best <= QUICK_HORIZON_GAIN * abs(best):
            break
        kept, best = prices, value
    if kept is None:  # the loop above prices at least one horizon
        raise RuntimeError("no slot horizon was priced")
    return kept, steps


def quick_steps_s(instance: LiveScalingInstance) -> float:
    """About how long :data:`QUICK_STEPS` steps of :func:`quick_slot_bound` take."""
    return QUICK_STEPS * _step_s(instance)


def quick_step_count(instance: LiveScalingInstance, budget_s: float) -> int:
    """How many steps of :func:`quick_slot_bound` about ``budget_s`` holds by the estimate, not
    the clock (at least one), so that its bound, and a plan that prints it, is the same on
    every run where the steps take no longer than estimated; a slower machine is stopped by the
    time limit instead."""
    return max(1, int(COUNTED_SHARE * budget_s / _step_s(instance) - QUICK_SETUP_STEPS))


def slot_setup_s(instance: LiveScalingInstance) -> float:
    """About the CPU seconds :func:`slot_bound` takes from a known schedule before its first
    step (:data:`SETUP_S_PER_CELL`): nothing cuts it short."""
    return SETUP_S_PER_CELL * instance.num_layers * instance.num_batches * SLOTS


def _step_s(instance: LiveScalingInstance) -> float:
    rows = instance.num_layers * instance.num_batches
    return STEP_S_FIXED + STEP_S_PER_ROW * rows + STEP_S_PER_CELL * rows * QUICK_SLOTS


def priced_orders(
    instance: LiveScalingInstance, paths: Sequence[SlotPath]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A feasible (split, N order, O order) from one step's priced choices (a Lagrangian
    heuristic): every batch keeps its priced split, O serves the batches with a block in the
    order of their priced starts, and N's operations are list-scheduled against those starts
    (:func:`~blitzplan.live.bound.relaxation.repair`). The prices spread the batches' claims on both
    instances over time, where the N-capacity relaxation's plan lets them all crowd N: on
    (80,16) under a free O order it gave schedules 4-5% better than ``bnb``'s in 10 s."""
    L, n = instance.num_layers, len(paths)
    split = tuple(L if p.old_start is None else p.split for p in paths)
    starts = tuple(math.inf if p.old_start is None else p.old_start for p in paths)
    on_old = sorted((i for i in range(n) if split[i] < L), key=lambda i: (starts[i], i))
    return repair(instance, RelaxedPlan(tuple(on_old), split, math.inf, starts))
