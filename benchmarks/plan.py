"""plan() latency with its defaults, the call a serving stack makes in its control loop.

Busy fleets: every scenario serves prefill instances with queues (live pairs, ZigZag predicted)
and decode instances; plan() runs with its defaults (greedy, ZigZag, measured link efficiencies,
no baseline comparison, no decode pre-scaling), then with ``deadline_s``. Topologies are loaded
once (load_topology caches them); the first, cold load is timed apart.

Run: .venv/bin/python benchmarks/plan.py   (BLITZPLAN_QUICK=1: fewer repeats, no +512)
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
from blitzplan.topologies import catalog

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
REPEATS = 3 if QUICK else 11


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


def busy_rail() -> ClusterState:
    """rail-leafspine-1024 serving llama-3-8b: 64 prefill instances with 8 queued requests each
    and 64 decode instances, one GPU each."""
    topology = load_topology("rail-leafspine-1024")
    state = ClusterState(topology, models=["llama-3-8b"])
    gpus = topology.gpus()
    for k in range(128):
        role = "prefill" if k < 64 else "decode"
        queue = [(-0.05 * i, 512 + 256 * (i % 5)) for i in range(8)] if role == "prefill" else []
        state.add_instance("llama-3-8b", gpus=[gpus[k]], role=role, queue=queue)
    return state


def median_ms(call: Callable[[], object]) -> float:
    call()
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs) * 1e3


def cold_load_ms(name: str) -> tuple[float, float]:
    catalog._LOADED.clear()
    start = time.perf_counter()
    load_topology(name)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    load_topology(name)
    return cold * 1e3, (time.perf_counter() - start) * 1e3


def main() -> None:
    print(
        f"blitzplan plan() latency, {date.today()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, median of {REPEATS}\n"
    )
    cold, warm = cold_load_ms("rail-leafspine-1024")
    print(f"load_topology('rail-leafspine-1024'): {cold:.0f} ms cold, {warm:.2f} ms cached\n")
    cases = [
        ("paper-a800-32", paper(), "mistral-small-24b", 8, 2, None, "-"),
        ("rail-leafspine-1024, busy", busy_rail(), "llama-3-8b", 64, 1, None, "100"),
        ("rail-leafspine-1024, busy", busy_rail(), "llama-3-8b", 64, 1, 0.1, "100"),
    ]
    if not QUICK:
        cases += [
            ("rail-leafspine-1024, busy", busy_rail(), "llama-3-8b", 512, 1, None, "500"),
            ("rail-leafspine-1024, busy", busy_rail(), "llama-3-8b", 512, 1, 0.5, "500"),
        ]
    rows = []
    for name, state, model, count, tp, deadline, target in cases:
        request = ScaleRequest(model, prefill=count, tp=tp)
        result = plan(state, request, deadline_s=deadline)
        ms = median_ms(lambda s=state, r=request, d=deadline: plan(s, r, deadline_s=d))
        rows.append(
            [
                name,
                f"+{count}",
                "-" if deadline is None else f"{deadline:g}",
                len(result.live_pairs),
                len(result.steps),
                f"{ms:.1f}",
                target,
                "; ".join(result.notes) or "-",
            ]
        )
    print(
        format_table(
            [
                "cluster",
                "added",
                "deadline s",
                "live pairs",
                "steps",
                "plan ms",
                "target ms",
                "notes",
            ],
            rows,
        )
    )


if __name__ == "__main__":
    main()
