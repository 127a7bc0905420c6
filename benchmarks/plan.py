"""plan() latency: the call a serving stack makes in its control loop, ZigZag predictions included.

Run: .venv/bin/python benchmarks/plan.py   (BLITZPLAN_QUICK=1: fewer repeats)
Prints medians of wall-clock times measured on this machine; nothing is asserted.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import date

from blitzplan import ClusterState, load_topology
from blitzplan._table import format_table
from blitzplan.scale import ScaleRequest, plan

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
REPEATS = 5 if QUICK else 25


def paper() -> ClusterState:
    state = ClusterState(load_topology("paper-a800-32"), models=["mistral-small-24b"])
    for k, role in enumerate(["prefill", "prefill", "decode", "decode"]):
        queue = [(-0.05 * i, 512 + 256 * (i % 5)) for i in range(12)] if role == "prefill" else []
        state.add_instance(
            "mistral-small-24b",
            gpus=[f"h0/gpu{2 * k}", f"h0/gpu{2 * k + 1}"],
            role=role,
            queue=queue,
        )
    return state


def rail() -> ClusterState:
    state = ClusterState(load_topology("rail-leafspine-1024"), models=["llama-3-8b"])
    for g in range(8):
        role = "prefill" if g < 4 else "decode"
        queue = [(-0.05 * i, 512 + 256 * (i % 5)) for i in range(12)] if role == "prefill" else []
        state.add_instance("llama-3-8b", gpus=[f"h0/gpu{g}"], role=role, queue=queue)
    return state


def median_ms(call: Callable[[], object]) -> float:
    call()
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs) * 1e3


def main() -> None:
    print(
        f"blitzplan plan() latency, {date.today()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, median of {REPEATS}\n"
    )
    rows = []
    for name, state, model, count, tp, target in (
        ("paper-a800-32", paper(), "mistral-small-24b", 8, 2, "10"),
        ("rail-leafspine-1024", rail(), "llama-3-8b", 64, 1, "250"),
    ):
        request = ScaleRequest(model, prefill=count, tp=tp)
        result = plan(state, request, prescale_decode=False)
        for baselines in (False, True):
            ms = median_ms(
                lambda s=state, r=request, b=baselines: plan(
                    s, r, prescale_decode=False, compare_baselines=b
                )
            )
            rows.append(
                [
                    name,
                    count,
                    len(result.live_pairs),
                    "yes" if baselines else "no",
                    f"{ms:.1f}",
                    target if not baselines else "-",
                ]
            )
    print(
        format_table(
            [
                "topology",
                "new instances",
                "live pairs (ZigZag)",
                "baseline milestones",
                "plan ms",
                "target ms",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
