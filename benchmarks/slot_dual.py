"""How far the slot bound's subgradient steps are from its Lagrangian dual (issue 23 items 1-2).

The slot bound (:mod:`blitzplan.live.relaxation_slots`) prices per-slot capacity on both
instances and maximises the priced total by subgradient steps; a plateau is no proof that the
dual's maximum is reached. Here the dual is computed exactly by column generation on its
Dantzig-Wolfe master LP (HiGHS): per batch a convexity row, per slot an N-capacity and an
O-capacity row; a column is one batch's priced choice from the dynamic program
(:func:`~blitzplan.live.slot_prices.solve_batches`), its cost what the program charges for it
less its prices (its latency rounded down as the program rounds it), its use of each slot the
time its N operations and its O block spend there. The master's duals are the next prices
(smoothed toward the best prices so far, Wentges' rule); at every step the priced total at the
prices tried is a valid lower bound, and the master LP over the columns found is at least the
dual's maximum, so the two bracket it; they meet when it is reached.

Per pair of ``benchmarks/partition.py``: ``bnb``'s 10 s objective and bound (free order), then
per slot count the subgradient's bound after its steps and the bracket column generation ends
with, with their CPU seconds. Nothing is asserted.

Run: .venv/bin/python benchmarks/slot_dual.py [--pairs 32x16x1 80x16x0] [--slots 250 1000]
[--cg-limit 120] (needs the ``exact`` extra: highspy; ``BLITZPLAN_QUICK=1``: one small pair).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from partition import instance

from blitzplan import LiveScalingInstance, schedule_live
from blitzplan._table import format_table
from blitzplan.live import slot_prices
from blitzplan.live.relaxation_slots import (
    HORIZON_PAST_LAST,
    _first_prices,
    slot_bound,
)
from blitzplan.live.slot_prices import SlotPath, SlotPrices, solve_batches

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
PAIRS = ["32x8x0"] if QUICK else ["32x16x1", "32x16x2", "32x16x3", "80x16x0", "80x16x1"]
PAIRS += [] if QUICK else ["80x16x2", "40x12x0", "40x12x1", "80x8x0", "80x8x1"]
SMOOTHING = 0.8
"""Wentges' rule: the prices tried are this share of the best so far, the rest the master's."""


def _use(prices: SlotPrices, i: int, path: SlotPath) -> tuple[np.ndarray, np.ndarray]:
    """The time batch ``i``'s choice spends in each N slot and each O slot."""
    inst, L = prices.instance, prices.instance.num_layers

    def use(edges: np.ndarray, starts: list[float], length: float) -> np.ndarray:
        if not starts:
            return np.zeros(edges.size - 1)
        clipped = np.clip(edges[None, :] - np.asarray(starts)[:, None], 0.0, length)
        return np.diff(clipped.sum(axis=0))

    new = use(prices.new.edges, list(path.new_starts), inst.new_layer_s[i])
    old_starts = [] if path.old_start is None else [path.old_start]
    return new, use(prices.old.edges, old_starts, (L - path.split) * inst.old_layer_s[i])


def dual_by_columns(
    inst: LiveScalingInstance, completion_s: Sequence[float], upper: float, limit_s: float
) -> tuple[float, float, int, float]:
    """(the best priced bound, the master LP's value, steps, CPU seconds), means per batch."""
    import highspy

    began = time.process_time()
    n = inst.num_batches
    prices = SlotPrices(inst, HORIZON_PAST_LAST * max(completion_s))
    _first_prices(prices, completion_s)
    cn, co = prices.new.count, prices.old.count
    lp = highspy.Highs()
    for option, value in (("output_flag", False), ("threads", 1), ("presolve", "off")):
        lp.setOptionValue(option, value)
    inf = highspy.kHighsInf
    lower = np.concatenate([np.ones(n), np.full(cn + co, -inf)])
    upper_rows = np.concatenate([np.ones(n), np.full(cn, prices.new.width)])
    upper_rows = np.concatenate([upper_rows, np.full(co, prices.old.width)])
    none = np.zeros(0, dtype=np.int32)
    lp.addRows(n + cn + co, lower, upper_rows, 0, np.zeros(1, dtype=np.int32), none, np.zeros(0))
    for i in range(n):  # an expensive artificial choice per batch keeps the master feasible
        lp.addCol(10 * n * upper, 0.0, inf, 1, np.array([i], dtype=np.int32), np.ones(1))
    best, center = -math.inf, (prices.lam, prices.mu)
    duals: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    master, share, step = math.inf, SMOOTHING, 0
    while True:
        step += 1
        total, paths = solve_batches(prices, None, paths=True)
        if (total - prices.constant()) / n > best:
            best, center = (total - prices.constant()) / n, (prices.lam, prices.mu)
        added = 0
        for i, path in enumerate(paths):
            new, old = _use(prices, i, path)
            cost = path.value - float(prices.lam @ new + prices.mu @ old)
            if duals is not None:
                pi, lam, mu = duals
                if cost + float(lam @ new + mu @ old) >= pi[i] - 1e-9 * max(1.0, abs(pi[i])):
                    continue
            added += 1
            rows_n, rows_o = np.nonzero(new > 1e-12)[0], np.nonzero(old > 1e-12)[0]
            rows = np.concatenate([[i], n + rows_n, n + cn + rows_o]).astype(np.int32)
            values = np.concatenate([[1.0], new[rows_n], old[rows_o]])
            lp.addCol(cost, 0.0, inf, rows.size, rows, values)
        if best * n >= master - 1e-7 * abs(master) or time.process_time() - began > limit_s:
            break
        if duals is not None and added == 0:
            if share == 0.0:
                break  # nothing prices below the master's own duals: it is the dual's maximum
            share = 0.0  # a mispricing: the master's duals themselves next
        else:
            share = SMOOTHING
            lp.run()
            master = lp.getInfo().objective_function_value
            row = np.asarray(lp.getSolution().row_dual)
            duals = (row[:n], np.maximum(-row[n : n + cn], 0.0), np.maximum(-row[n + cn :], 0.0))
        _, lam, mu = duals
        prices.set(share * center[0] + (1 - share) * lam, share * center[1] + (1 - share) * mu)
    return best, master / n, step, time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=PAIRS, help="LxNxSEED, e.g. 32x16x1")
    parser.add_argument("--slots", nargs="+", type=int, default=[100] if QUICK else [250, 1000])
    parser.add_argument("--limit", type=float, default=1.0 if QUICK else 10.0, help="bnb's s")
    parser.add_argument("--steps", type=int, default=30 if QUICK else 400, help="subgradient")
    parser.add_argument("--cg-limit", type=float, default=5.0 if QUICK else 120.0, help="CPU s")
    args = parser.parse_args()
    rows, default_slots = [], slot_prices.SLOTS
    for pair in args.pairs:
        layers, batches, seed = (int(x) for x in pair.split("x"))
        inst = instance(layers, batches, seed)
        best = schedule_live(inst, method="exact", backend="bnb", time_limit_s=args.limit)
        upper = best.objective
        for slots in args.slots:
            slot_prices.SLOTS = slots  # the grid SlotPrices builds (a module constant)
            began = time.process_time()
            sub, _ = slot_bound(
                inst,
                upper_bound=upper,
                completion_s=best.completion_s,
                iterations=args.steps,
                time_limit_s=args.cg_limit,
            )
            sub_s = time.process_time() - began
            low, high, steps, cg_s = dual_by_columns(inst, best.completion_s, upper, args.cg_limit)
            rows.append(
                [
                    pair,
                    f"{upper:.4f} / {best.bound:.4f}",
                    str(slots),
                    f"{sub:.4f} ({sub / upper:.3f}) {sub_s:.1f}s",
                    f"{low:.5f} - {high:.5f} ({low / upper:.3f}-{high / upper:.3f})",
                    f"{steps} steps {cg_s:.1f}s",
                ]
            )
            print(" | ".join(rows[-1]), flush=True)
            slot_prices.SLOTS = default_slots
    head = ["pair", "bnb obj / bound", "slots", "subgradient (/obj) CPU", "CG bracket", "CG"]
    print(format_table(head, rows))


if __name__ == "__main__":
    main()
