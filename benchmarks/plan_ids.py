"""Whether plans repeat: ``plan_id`` and the bounds printed beside live pairs' schedules, and the
bound beside ZigZag on the partition benchmark's instances, one line each, for two runs to diff.

Plans: the demo's cluster (mistral-small-24b TP2 on paper-a800-32, two queued prefill
instances) asked for 1-6 more prefill instances with 12, 24 and 32 queued requests each, and
qwen2.5-72b (TP4, 80 layers) on the same cluster; each line is the plan's ``plan_id`` and its
live pairs' bounds. Bounds: ZigZag on ``benchmarks/partition.py``'s classes (32,8) to (80,16),
seeds 0-1, both O orders, mean latency, and under the free order the maximum latency too; each
line is ``schedule_live(...).bound`` and its objective, from a cold cache. A bound limited by
counted work, not the clock, prints the same rows on every run, loaded or not (unless a real
clock's safety net stops it: blitzplan.live.bound.printed.BOUND_SAFETY).

Run: .venv/bin/python benchmarks/plan_ids.py > run1.txt; again > run2.txt; diff run1.txt run2.txt
(``BLITZPLAN_QUICK=1``: two plans, one class). Nothing is asserted.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from blitzplan import ClusterState, load_topology
from blitzplan._table import format_table
from blitzplan.live import solve
from blitzplan.live.bound import printed as printed_bound
from blitzplan.scale import ScaleRequest, plan

sys.path.insert(0, str(Path(__file__).resolve().parent))
from partition import instance

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
PROMPTS = (1020, 310, 2480, 770, 1530, 95, 3100, 640, 1210, 420, 1880, 260)
"""The demo's prompt lengths (blitzplan.scale.demo), cycled."""


def cluster(model: str, tp: int, queued: int) -> ClusterState:
    """Host 0 of paper-a800-32 serving ``model`` as two queued prefill and two decode
    instances of ``tp`` GPUs each."""
    state = ClusterState(load_topology("paper-a800-32"), models=[model])
    for k in range(4):
        role = "prefill" if k < 2 else "decode"
        queue = [(-0.6 + 0.05 * i, PROMPTS[(i + 5 * k) % 12]) for i in range(queued)]
        gpus = [f"h0/gpu{tp * k + g}" for g in range(tp)] if tp * (k + 1) <= 8 else None
        if gpus is None:
            gpus = [f"h1/gpu{tp * (k - 2) + g}" for g in range(tp)]
        state.add_instance(model, gpus=gpus, role=role, queue=queue if role == "prefill" else [])
    return state


def plan_lines() -> list[list[str]]:
    """One row per plan: its name, plan_id and live pairs' bound/objective."""
    cases = [("mistral-small-24b", 2, q, k) for q in (12, 24, 32) for k in range(1, 7)]
    cases += [("qwen2.5-72b", 4, q, k) for q in (12, 24) for k in (1, 2, 4)]
    lines = []
    for model, tp, queued, added in cases[:2] if QUICK else cases:
        scale = plan(cluster(model, tp, queued), ScaleRequest(model, prefill=added, tp=tp))
        pairs = " ".join(f"{p.schedule.bound!r}/{p.schedule.objective!r}" for p in scale.live_pairs)
        lines.append([f"plan {model} tp{tp} queued {queued} +{added}", scale.plan_id, pairs])
    return lines


def bound_lines() -> list[list[str]]:
    """One row per instance, order and objective: ZigZag's bound/objective, cold."""
    classes = [(32, 8)] if QUICK else [(32, 8), (32, 16), (40, 12), (80, 8), (80, 16)]
    runs = [("free", "mean_latency"), ("fifo", "mean_latency"), ("free", "max_latency")]
    lines = []
    for layers, batches in classes:
        for seed in (0, 1):
            inst = instance(layers, batches, seed)
            for order, objective in runs:
                for cached in (solve._heuristic, solve._policy, printed_bound.relaxation_value):
                    cached.cache_clear()
                result = solve.schedule_live(
                    inst, method="zigzag", old_order=order, objective=objective
                )
                case = f"zigzag ({layers},{batches}) seed {seed} {order} {objective}"
                lines.append([case, "", f"{result.bound!r}/{result.objective!r}"])
    return lines


def main() -> None:
    began = time.perf_counter()
    rows = plan_lines() + bound_lines()
    print(format_table(["case", "plan_id", "printed bounds / objectives"], rows))
    print(f"# {time.perf_counter() - began:.1f} s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)


if __name__ == "__main__":
    main()
