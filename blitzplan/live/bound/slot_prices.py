"""The slot bound's priced problem (:mod:`blitzplan.live.bound.slots`): its slots, the
prices on them and each batch's least priced choice under them.

Each batch's problem is solved from below by a dynamic program over its own time grid (about
half a slot a step): the state is the next layer and the step of the chain's position counted
without its layers' own time, so that a layer leaves the chain where it was (exact however
short the layer; :mod:`.slot_chains`); a layer is charged the least price a start
in its window pays (the price is piecewise linear in the start: its least value in a window is
at an end or where the operation's start or end crosses a slot boundary). O's block started in
a slot is charged the least, over its starts in the slot, of its price plus its completion, no
earlier than its batch could hand it over (:mod:`blitzplan.live.bound.slot_blocks`); in the O slot
the chain hands it over in, no earlier than the chain's counted end and the hand-off either
(``handover``: its completion at least that plus its run, its price at least the slot's least;
on (80,16) of ``benchmarks/partition.py`` the block could start up to a slot before its hand-off).
A chain's counted end is also no earlier than its layers' arrivals allow (the least ``u`` after
``k`` layers, :meth:`~blitzplan.live.bound.slot_chains.ChainGrid.least_u`). Every rounding
lowers the cost, so the program's value is at most the batch's priced optimum; past the last
slot nothing is priced, and at the grid's end a batch still needs its unpriced remaining time.
The prices come from subgradient steps toward a known schedule's value; any prices give a valid
bound, so stopping early only weakens it.

With ``latency_floor`` (the printed bound's grid) every state's value is also held at least
the batch's unpriced latency from there (the step's time, less its release, plus the least time
the rest of it takes: the prices are >= 0, so that is a lower bound on every continuation too).
It counts the time a chain loses to the grid when its layers wait (a start within a step);
the program is then no longer a least of costs linear in the
prices, so a choice's ``value`` may exceed its priced cost (no column for
``benchmarks/slot_dual.py``) and its slot time is a subgradient only where the floor is loose.

A :class:`~blitzplan.live.bound.relaxation.Restriction` (split ranges, starts after given times)
narrows each batch's problem: with the whole problem's prices :meth:`SlotPrices.bound` holds
for every schedule that keeps it (pricing the exact search's nodes so changed no final bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from blitzplan.live.bound.relaxation import Restriction
from blitzplan.live.bound.slot_blocks import BlockTable, earliest_starts, least_start
from blitzplan.live.bound.slot_chains import ChainGrid, grid_steps
from blitzplan.live.instance import LiveScalingInstance

__all__ = ["SLOTS", "SlotPath", "SlotPrices", "slot_usage", "solve_batches"]

SLOTS = 250
"""Slots per machine up to the horizon (on (32,16), 60 steps with 150 / 250 / 400 slots: 0.883
/ 0.893 / 0.896 of a known schedule's value in 0.5 / 0.7 / 1.3 s of CPU)."""

STEPS_PER_SLOT = 2
"""The steps of every batch's grid (:mod:`blitzplan.live.bound.slot_chains`) to a slot. On (80,16)
of ``benchmarks/partition.py`` with the printed bound's 160 slots, after 12 / 24 steps, of the
best known: 2 (a step 13 ms) 0.833 / 0.877, 1 (10.4 ms) 0.811 / 0.857, 4 (17.5 ms) 0.843 after
12; on (32,16) 0.903 / 0.934 (5.8 ms), 0.895 / 0.923 (4.4 ms), 0.907 after 12 (7.4 ms)."""


@dataclass(frozen=True)
class _Slots:
    """One machine's slots: boundaries ``edges`` (ascending), all ``width`` apart."""

    edges: np.ndarray
    width: float

    @property
    def count(self) -> int:
        return self.edges.size - 1


@dataclass(frozen=True)
class SlotPath:
    """A batch's priced choice: its split, its layers' starts on N, its block's start on O,
    and what the program charges for it (its latency, rounded down, plus its prices)."""

    split: int
    new_starts: tuple[float, ...]
    old_start: float | None
    value: float


class SlotPrices:
    """An instance's grids (``slots`` per machine up to ``horizon_s``, default
    :data:`SLOTS`), the current prices and what they charge; :meth:`bound`. With
    ``latency_floor`` the program holds every state at least its unpriced latency, with
    ``handover`` a block in the O slot its batch is handed over in starts no earlier than the
    hand-off (see the module docstring; the master LP's columns are priced without it)."""

    def __init__(
        self,
        instance: LiveScalingInstance,
        horizon_s: float,
        slots: int | None = None,
        *,
        latency_floor: bool = False,
        handover: bool = True,
    ) -> None:
        inst, L, n = instance, instance.num_layers, instance.num_batches
        self.instance = inst
        p_new, p_old = np.asarray(inst.new_layer_s), np.asarray(inst.old_layer_s)
        a1, b_old = inst.usable_s[0], inst.old_free_at_s
        horizon = max(horizon_s, a1, b_old) + 1e-9
        width = (horizon - min(a1, b_old)) / (SLOTS if slots is None else slots)
        self.new, self.old = _slots(a1, horizon, width), _slots(b_old, horizon, width)
        self.release = np.asarray(inst.release_s)
        self.p_new, self.handoff = p_new, np.asarray(inst.handoff_s)
        self.t0 = np.maximum(self.release, a1)
        step_s = grid_steps(p_new, width / STEPS_PER_SLOT)
        chains = self.chains = ChainGrid(
            self.t0, step_s, p_new, np.asarray(inst.usable_s), self.new.edges
        )
        self.size, self.times = chains.size, chains.times
        rows = np.arange(n)[:, None]
        self.q = (L - np.arange(L))[None, :] * p_old[:, None]  # (n, k): O's run per split
        self.tail = _tail(p_new, p_old, self.handoff, L)
        stride = self.old.count + 1
        # [k, i, b]: the least u with k layers done in step b (its arrivals' or the step's)
        at = np.maximum(self.times[None, :, :], chains.least_u().T[:, :, None])
        # [k, i, b]: the O slot (flat, in ``old_suffix``) batch i hands split k over from
        ends = at[:L] + chains.done_s.T[:L, :, None] + self.handoff[None, :, None]
        handed = np.clip(np.floor((ends - b_old) / width), 0, self.old.count).astype(np.int64)
        self.handed = handed + (rows * L + np.arange(L)[:, None, None]) * stride
        # [k, i, b]: the least completion of a block handed over so, less the release
        done = ends + self.q.T[:, :, None] - self.release[None, :, None]
        self.handed_done = np.ascontiguousarray(done)
        self.handover = handover
        self._stop_space = np.empty((2, *self.handed.shape)) if handover else None
        slot0 = np.floor((np.maximum(self.release, b_old) - b_old) / width)
        self.slot0 = np.clip(slot0, 0, self.old.count).astype(np.int64)  # k = 0: O from here
        # [l, i, b]: batch i's least unpriced latency with l layers done from step b
        latency = at - self.release[None, :, None] + (chains.done_s + self.tail).T[:, :, None]
        self.end_tail = latency[:, :, -1].T  # [i, l]: the same at the grid's last step
        self.done = latency[-1]  # [i, b]: all L layers done
        self.floor = latency if latency_floor else None
        self.earliest = earliest_starts(inst)  # [i, k]: no block of split k starts before
        self.blocks = BlockTable(self.old.edges, self.q, self.earliest)
        self._tables: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        self.set(np.zeros(self.new.count), np.zeros(self.old.count))

    def set(self, lam: np.ndarray, mu: np.ndarray) -> None:
        """Take prices ``lam`` (N's slots) and ``mu`` (O's) and tabulate what they charge."""
        self.lam, self.mu = lam, mu
        self.cum_new = np.concatenate([[0.0], np.cumsum(lam) * self.new.width])
        self.cum_old = np.concatenate([[0.0], np.cumsum(mu) * self.old.width])
        self.run_price, self.run_at = self.chains.charges(self.new.edges, self.cum_new)
        self.old_value, self.old_price = self.blocks.values(self.cum_old)
        suffix = np.minimum.accumulate(self.old_value[:, :, ::-1], axis=2)[:, :, ::-1]
        # the least completion from each O slot on, less the batch's release (flat)
        self.old_suffix = np.subtract(suffix, self.release[:, None, None]).ravel()
        self.stop_table = self._stops(suffix) if self.handover else None

    def _stops(self, suffix: np.ndarray) -> np.ndarray:
        """``[k, i, b]``: the least priced completion, less the release, of batch ``i``'s block
        of split ``k`` handed over after its chain from step ``b``: from a later O slot, or from
        the slot it is handed over in, where it starts no earlier than the hand-off (its price
        at least the slot's least, its completion at least the hand-off plus its run)."""
        if self._stop_space is None:  # set with the hand-over, before the stops are taken
            raise RuntimeError("the hand-over's stop space is not set")
        release, (here, other) = self.release[:, None, None], self._stop_space
        later = np.empty_like(suffix)
        later[..., :-1], later[..., -1] = suffix[..., 1:], math.inf
        # (mode="clip": the indices are in range, and "raise" copies through a buffer)
        np.subtract(self.old_value, release).take(self.handed, out=here, mode="clip")
        self.old_price.take(self.handed, out=other, mode="clip")
        np.maximum(here, np.add(other, self.handed_done, out=other), out=here)
        np.subtract(later, release).take(self.handed, out=other, mode="clip")
        stops: np.ndarray = np.minimum(here, other, out=here)
        return stops

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The program's work space, kept between calls: per layer its runs, their suffix
        least and its stops, and two rows of costs."""
        if self._tables is None:
            L, n = self.instance.num_layers, self.instance.num_batches
            space = np.empty((3 * L + 2, n, self.size))
            self._tables = (space[:L], space[L : 2 * L], space[2 * L : 3 * L], space[3 * L :])
        return self._tables

    def constant(self) -> float:
        """What the prices give back: each slot's price times its width."""
        return float(self.lam.sum() * self.new.width + self.mu.sum() * self.old.width)

    def bound(self, restriction: Restriction | None = None) -> float:
        """The mean latency bound under the current prices (of every schedule that keeps
        ``restriction``)."""
        total, _ = solve_batches(self, restriction, paths=False)
        return (total - self.constant()) / self.instance.num_batches


def _slots(start: float, end: float, width: float) -> _Slots:
    count = max(1, math.ceil((end - start) / width))
    return _Slots(start + width * np.arange(count + 1), width)


def _tail(p_new: np.ndarray, p_old: np.ndarray, handoff: np.ndarray, L: int) -> np.ndarray:
    """``[i, l]``: unpriced, the least time batch ``i`` still needs with ``l`` layers done
    (all left on N, all on O after the hand-off, or all but one on N: the cost is linear in
    the split, so one of the ends)."""
    done = np.arange(L + 1)[None, :]
    left = L - done
    hand = np.where(done >= 1, handoff[:, None], 0.0)
    on_old = hand + left * p_old[:, None]
    last_on_old = (left - 1) * p_new[:, None] + handoff[:, None] + p_old[:, None]
    least = np.minimum(np.minimum(left * p_new[:, None], on_old), last_on_old)
    return np.asarray(np.where(left > 0, least, 0.0))


def solve_batches(
    prices: SlotPrices, restriction: Restriction | None, *, paths: bool
) -> tuple[float, list[SlotPath]]:
    """The least priced total latency (before :meth:`SlotPrices.constant`) and, with ``paths``,
    each batch's choice: per batch, a dynamic program from the last layer down over the step
    the chain may start from (see the module docstring), all batches at once. Every layer's
    charges and stops are read in one take before it, so that a layer costs the program three
    or four calls on ``(batches, steps)`` rows (the suffix least the dearest)."""
    inst = prices.instance
    L, n = inst.num_layers, inst.num_batches
    runs, bests, stops, costs = prices.tables()
    # [l - 1]: layer l's charges (mode="clip": the indices are in range, "raise" buffers)
    prices.run_price.take(prices.chains.charge_at, out=runs, mode="clip")
    if prices.stop_table is None:  # [k]: stop after k layers (k >= 1)
        prices.old_suffix.take(prices.handed, out=stops, mode="clip")
    else:
        np.copyto(stops, prices.stop_table)
    cost = costs[0]
    cost[...] = prices.done  # L layers done
    zero = prices.old_suffix[np.arange(n) * (L * (prices.old.count + 1)) + prices.slot0]
    if restriction is not None and _restricts(restriction, L):
        zero = _restrict(prices, restriction, (runs, stops, cost), zero)
    floor = prices.floor
    for layer in range(L, 0, -1):  # cost: the least from here on with ``layer`` layers done
        if floor is None:  # (with the floor every state is held at least that already)
            # at the grid's end nothing is priced: what is left takes at least its unpriced time
            np.maximum(cost[:, -1], prices.end_tail[:, layer], out=cost[:, -1])
        run = runs[layer - 1]
        run += cost  # (a step before the layer may start is charged inf)
        best = bests[layer - 1]
        np.minimum.accumulate(run[:, ::-1], axis=1, out=best[:, ::-1])
        k = layer - 1  # or stop after k layers
        cost = np.minimum(best, stops[k], out=costs[layer % 2]) if k >= 1 else best
        if floor is not None:
            cost = np.maximum(cost, floor[k], out=costs[layer % 2])
    totals = np.minimum(zero, cost[:, 0])
    total = float(totals.sum())
    if not paths or not math.isfinite(total):
        return total, []
    return total, _paths(prices, zero <= cost[:, 0], totals, (runs, bests, stops))


def _restricts(restriction: Restriction, L: int) -> bool:
    """Whether ``restriction`` narrows anything."""
    return (
        any(restriction.split_min)
        or any(high < L for high in restriction.split_max)
        or any(restriction.start_after_s)
    )


def _restrict(
    prices: SlotPrices,
    restriction: Restriction,
    tables: tuple[np.ndarray, np.ndarray, np.ndarray],
    zero: np.ndarray,
) -> np.ndarray:
    """Charge ``inf`` for what ``restriction`` forbids, in the program's tables (every layer's
    runs and stops, the cost with all layers done); the cost of no layer on N, ``zero``, so
    charged."""
    runs, stops, cost = tables
    L, size = prices.instance.num_layers, prices.size
    low, high = np.asarray(restriction.split_min), np.asarray(restriction.split_max)
    layers = np.arange(L + 1)[:, None]  # [l]: l layers done, l from 1 run as the l-th
    first = _first_after(prices, restriction).T[:, :, None]  # [l - 1, i, 1]
    limit = (np.arange(size) < first) | (high[None, :] < layers[1:])[:, :, None]
    np.copyto(runs, math.inf, where=limit)
    stops[(low[None, :] > layers[:L]) | (high[None, :] < layers[:L])] = math.inf
    cost[high < L] = math.inf
    return np.asarray(np.where(low > 0, math.inf, zero))


def _first_after(prices: SlotPrices, restriction: Restriction) -> np.ndarray:
    """The step each layer may start from, per batch, with ``restriction``'s start limits."""
    first: np.ndarray = prices.chains.first.copy()
    offset_s = np.arange(prices.instance.num_layers) * prices.p_new[:, None]
    for i, after in enumerate(restriction.start_after_s):
        if after:
            later = prices.chains.step_of(i, np.asarray(after) - offset_s[i])
            first[i] = np.maximum(first[i], later)
    return first


def _paths(
    prices: SlotPrices,
    on_old: np.ndarray,
    totals: np.ndarray,
    tables: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> list[SlotPath]:
    """Every batch's choice, traced through the program's tables layer by layer (all batches
    at once): from the step its chain may start from, it stops when stopping there is no
    dearer than running on, else its layer runs at the first step that pays the least from
    there (the first step on whose run the suffix least is met: the cells where it is are
    listed once, flat, and each layer's step is found by one search in that list)."""
    L, size = prices.instance.num_layers, prices.size
    n = on_old.size
    runs, bests, stops = tables  # [layer - 1]: that layer's runs, their suffix least, stops
    block = n * size  # one layer's cells, flat
    least = _least_cells(runs, bests)
    picked = np.empty((L, n), dtype=np.int64)  # [l - 1]: the flat cell layer l runs from
    here = np.arange(n) * size  # the cell the chain may start from (step 0)
    for layer in range(L):
        chosen = _first_least(least, here)
        picked[layer] = chosen
        here = chosen + block  # the chain goes on from the same step of ``u``
    # [k, i]: whether batch i stops after k layers (stopping no dearer than running on)
    reached = np.concatenate([np.arange(n)[None, :] * size, picked[:-1] + block])
    stop_flat, best_flat = stops.ravel(), bests.ravel()
    stopping = stop_flat.take(reached) <= best_flat.take(reached)
    stopping[0] = False  # (no layer on N: ``on_old``, decided before)
    stops_at = np.where(stopping.any(0), stopping.argmax(0), L)
    split = np.where(on_old, 0, stops_at)
    rows = np.arange(n)
    stopped_at = reached[np.minimum(stops_at, L - 1), rows] % size
    starts = prices.run_at.take(prices.chains.charge_at.ravel().take(picked)).T
    return _choices(prices, split, stopped_at, starts, totals)


def _least_cells(run: np.ndarray, best: np.ndarray) -> np.ndarray:
    """The flat cells, ascending, whose ``run`` meets ``best``, its row's suffix least (every
    row's last: its suffix least is its run)."""
    met = run == best
    met[..., -1] = True
    return np.flatnonzero(met)


def _first_least(least: np.ndarray, here: np.ndarray) -> np.ndarray:
    """Per flat cell of ``here``, the first step from it on, in its row, that pays the row's
    least from there (a flat cell): the first of :func:`_least_cells` ``least`` at or after it
    (on such a step the suffix least is its run and stays what it was at ``here``, as the
    steps between pay more)."""
    return np.asarray(least.take(least.searchsorted(here)))


def _choices(
    prices: SlotPrices,
    split: np.ndarray,
    stopped_at: np.ndarray,
    starts: np.ndarray,
    totals: np.ndarray,
) -> list[SlotPath]:
    """The batches' :class:`SlotPath` from their traced splits, the steps their chains
    stopped at and their layers' starts."""
    L = prices.instance.num_layers
    stride = prices.old.count + 1
    out = []
    for i in range(split.size):
        k = int(split[i])
        if k == L:
            out.append(SlotPath(L, tuple(starts[i].tolist()), None, float(totals[i])))
            continue
        ready_s = None
        if k == 0:
            slot = int(prices.slot0[i])
        else:
            b = int(stopped_at[i])
            slot = int(prices.handed[k, i, b] - (i * L + k) * stride)
            if prices.handover:
                ready_s = float(prices.handed_done[k, i, b] + prices.release[i] - prices.q[i, k])
        old = _old_start(prices, i, k, slot, ready_s)
        out.append(SlotPath(k, tuple(starts[i, :k].tolist()), old, float(totals[i])))
    return out


def _old_start(prices: SlotPrices, i: int, k: int, slot: int, ready_s: float | None) -> float:
    """Where batch ``i``'s block (split ``k``) starts in the least priced choice from
    ``slot`` on: the best slot from the table, then where in it its value was found; handed
    over at ``ready_s`` (in ``slot``), no earlier in that slot (:meth:`SlotPrices._stops`)."""
    values, q = prices.old_value[i, k], float(prices.q[i, k])
    edges, cum, floor_s = prices.old.edges, prices.cum_old, float(prices.earliest[i, k])
    if ready_s is None:
        c = slot + int(np.argmin(values[slot:]))
    else:
        here = max(values[slot], prices.old_price[i, k, slot] + ready_s + q)
        c = slot + 1 + int(np.argmin(values[slot + 1 :])) if slot + 1 < values.size else slot
        if c == slot or here <= values[c]:
            c, floor_s = slot, max(floor_s, ready_s)
    return least_start(edges, cum, q, floor_s, c)


def slot_usage(slots: _Slots, starts: list[float], lengths: list[float]) -> np.ndarray:
    """Per slot, its width less how long the operations ``[start, start + length]`` use."""
    edges, s, p = slots.edges[None, :], np.asarray(starts)[:, None], np.asarray(lengths)[:, None]
    return np.asarray(np.diff(np.clip(edges - s, 0.0, p).sum(axis=0)) - slots.width)
