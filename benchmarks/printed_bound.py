"""The bound printed beside ZigZag (issue 23 item 2): printed bound / best schedule known, per
class and O order, and the CPU of a cold ZigZag call, for one or more source trees alternated.

A cold call is ``schedule_live(inst, method="zigzag", old_order=order)`` with the solve module's
caches cleared (what ``plan()`` pays once per distinct live pair, the bound included). The best
schedule known per instance is the better of ``exact`` (``bnb``, ``--limit`` s) and ``improve``
(1 s), under the free order also the FIFO ones (a FIFO schedule is a free one); it is computed
once per run, or kept in and read back from ``--best-known`` (JSON). Few are proven, so most
ratios are against a schedule, not the optimum: a conservative ratio. Nothing is asserted.

Run: .venv/bin/python benchmarks/printed_bound.py [--trees /path/base /path/branch]
[--classes 32x16 80x16] [--orders free fifo] [--seeds 0 1 2 3 4] [--rounds 2]
[--best-known /tmp/best_known.json] [--detail] [--cpu-clock] (``BLITZPLAN_QUICK=1``: one class,
two seeds, 1 s runs). Each tree runs in its own process (``PYTHONPATH``), alternated class by
class and round by round; the CPU column is the median over the calls of each row (seeds and
rounds). ``--cpu-clock``: the cold calls read the thread's CPU time where they read the wall
clock (``time.perf_counter``), a quiet machine emulated on a loaded one (a tree whose bound is
limited by the clock then gets the CPU time it would get quiet).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from blitzplan._table import format_table

HERE = Path(__file__).resolve().parent
QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
CLASSES = ["32x8"] if QUICK else ["32x8", "32x16", "40x12", "80x8", "80x16"]
SEEDS = [0, 1] if QUICK else [0, 1, 2, 3, 4]


def _instance(key: str):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(HERE))
    from partition import instance

    layers, batches, seed = (int(x) for x in key.split("x"))
    return instance(layers, batches, seed)


def best_known(keys: list[str], limit_s: float) -> dict[str, dict[str, float]]:
    """Per ``LxNxSEED``: the best objective found per order (free: the better of both)."""
    from blitzplan import schedule_live

    out = {}
    for key in keys:
        inst, found = _instance(key), {}
        for order in ("fifo", "free"):
            exact = schedule_live(
                inst, method="exact", backend="bnb", time_limit_s=limit_s, old_order=order
            )
            better = schedule_live(inst, method="improve", time_limit_s=1.0, old_order=order)
            found[order] = min(exact.objective, better.objective)
            found[order + "_proven"] = float(exact.status.value == "optimal")
        found["free"] = min(found["free"], found["fifo"])
        out[key] = found
        print(f"best known {key}: {found}", file=sys.stderr, flush=True)
    return out


def cold_calls(keys: list[str], orders: list[str]) -> list[dict[str, object]]:
    """One cold ZigZag call per instance and order: its bound, objective and CPU seconds."""
    from blitzplan import schedule_live
    from blitzplan.live import solve
    from blitzplan.live.bound import printed as printed_bound

    rows = []
    for key in keys:
        inst = _instance(key)
        for order in orders:
            for cached in (solve._heuristic, solve._policy, printed_bound.relaxation_value):
                cached.cache_clear()
            began = time.process_time()
            result = schedule_live(inst, method="zigzag", old_order=order)
            cpu = time.process_time() - began
            rows.append({"key": key, "order": order, "bound": result.bound, "cpu_s": cpu})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=[str(HERE.parent)])
    parser.add_argument("--classes", nargs="+", default=CLASSES, help="LxN, e.g. 32x16")
    parser.add_argument("--orders", nargs="+", default=["free", "fifo"])
    parser.add_argument("--seeds", nargs="+", type=int, default=SEEDS)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--limit", type=float, default=1.0 if QUICK else 8.0, help="bnb's s")
    parser.add_argument("--best-known", help="a JSON file keeping the best known (reused)")
    parser.add_argument("--detail", action="store_true", help="each instance's ratios too")
    parser.add_argument("--cpu-clock", action="store_true", help="emulate a quiet machine")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # a tree's process: cold calls on the keys given, JSON rows out
        if args.cpu_clock:
            time.perf_counter = time.thread_time
        print(json.dumps(cold_calls(args.worker, args.orders)))
        return
    keys = [f"{c}x{s}" for c in args.classes for s in args.seeds]
    path = Path(args.best_known) if args.best_known else None
    known = json.loads(path.read_text()) if path is not None and path.is_file() else {}
    missing = [k for k in keys if k not in known]
    if missing:
        known |= best_known(missing, args.limit)
        if path is not None:
            path.write_text(json.dumps(known, indent=1))
    results: dict[str, list[dict[str, object]]] = {tree: [] for tree in args.trees}
    for round_ in range(args.rounds):
        for c in args.classes:
            trees = args.trees if round_ % 2 == 0 else args.trees[::-1]
            for tree in trees:
                env = os.environ | {"PYTHONPATH": tree}
                command = [sys.executable, __file__, "--orders", *args.orders]
                command += ["--cpu-clock"] * args.cpu_clock + ["--worker"]
                command += [f"{c}x{s}" for s in args.seeds]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                results[tree] += json.loads(out.stdout)
    head = ["class", "order", *(f"{Path(t).name}: mean / worst / cpu ms" for t in args.trees)]
    rows = []
    for c in args.classes:
        for order in args.orders:
            cells = [f"({c.replace('x', ',')})", order]
            for tree in args.trees:
                runs = [r for r in results[tree] if r["order"] == order]
                runs = [r for r in runs if str(r["key"]).startswith(c + "x")]
                ratios = [float(r["bound"]) / known[str(r["key"])][order] for r in runs]  # type: ignore[arg-type]
                cpu = statistics.median(1e3 * float(r["cpu_s"]) for r in runs)  # type: ignore[arg-type]
                cells.append(f"{statistics.fmean(ratios):.3f} / {min(ratios):.3f} / {cpu:.0f}")
                if args.detail:
                    each = " ".join(f"{r:.3f}" for r in ratios)
                    print(f"{c} {order} {Path(tree).name}: {each}")
            rows.append(cells)
    print(format_table(head, rows))


if __name__ == "__main__":
    main()
