"""How far the slot bound's subgradient steps are from its Lagrangian dual (issue 23 items 1-2).

The slot bound (:mod:`blitzplan.live.bound.slots`) prices per-slot capacity on both
instances and maximises the priced total by subgradient steps; a plateau is no proof that the
dual's maximum is reached. Here the dual is computed exactly by column generation on its
Dantzig-Wolfe master LP (:func:`~blitzplan.live.bound.master.master_bound`, HiGHS): at
every step the priced total at the prices tried is a valid lower bound, and the master LP over
the columns found is at least the dual's maximum, so the two bracket it; they meet when it is
reached. With ``--strengthened`` the same master also with clique cuts on O's blocks (the
module's docstring).

Per pair of ``benchmarks/partition.py``: ``bnb``'s 10 s objective and bound (free order), then
per slot count the subgradient's bound after its steps (CPU seconds) and the bracket each
master's column generation ends with (wall seconds). Nothing is asserted.

Run: .venv/bin/python benchmarks/slot_dual.py [--pairs 32x16x1 80x16x0] [--slots 250 1000]
[--cg-limit 120] [--strengthened] (needs the ``exact`` extra: highspy; ``BLITZPLAN_QUICK=1``:
one small pair).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from partition import instance

from blitzplan import schedule_live
from blitzplan._table import format_table
from blitzplan.live.bound import slot_prices
from blitzplan.live.bound.master import master_bound
from blitzplan.live.bound.slots import slot_bound

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
PAIRS = ["32x8x0"] if QUICK else ["32x16x1", "32x16x2", "32x16x3", "80x16x0", "80x16x1"]
PAIRS += [] if QUICK else ["80x16x2", "40x12x0", "40x12x1", "80x8x0", "80x8x1"]
MASTERS = {"CG": {"cuts": False}, "CG + cuts": {"cuts": True}}
"""The master LPs of :func:`~blitzplan.live.bound.master.master_bound` each pair gets: the
slot relaxation's own (its dual), and with clique cuts."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=PAIRS, help="LxNxSEED, e.g. 32x16x1")
    parser.add_argument("--slots", nargs="+", type=int, default=[100] if QUICK else [250, 1000])
    parser.add_argument("--limit", type=float, default=1.0 if QUICK else 10.0, help="bnb's s")
    parser.add_argument("--steps", type=int, default=30 if QUICK else 400, help="subgradient")
    parser.add_argument("--cg-limit", type=float, default=5.0 if QUICK else 120.0, help="wall s")
    parser.add_argument("--strengthened", action="store_true", help="also with clique cuts")
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
            for name, strengthening in MASTERS.items():
                if name != "CG" and not args.strengthened:
                    continue
                found = master_bound(
                    inst,
                    completion_s=best.completion_s,
                    upper_bound=upper,
                    time_limit_s=args.cg_limit,
                    slots=slots,
                    **strengthening,
                )
                low, high = found.bound, found.master
                rows.append(
                    [
                        pair,
                        f"{upper:.4f} / {best.bound:.4f}",
                        str(slots),
                        f"{sub:.4f} ({sub / upper:.3f}) {sub_s:.1f}s",
                        name,
                        f"{low:.5f} - {high:.5f} ({low / upper:.3f}-{high / upper:.3f})",
                        f"{found.steps} steps {found.cuts} cuts {found.seconds:.1f}s",
                    ]
                )
                print(" | ".join(rows[-1]), flush=True)
            slot_prices.SLOTS = default_slots
    head = ["pair", "bnb obj / bound", "slots", "subgradient (/obj) CPU", "master", "bracket"]
    head += ["steps, cuts, wall"]
    print(format_table(head, rows))


if __name__ == "__main__":
    main()
