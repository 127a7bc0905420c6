"""Foundation benchmark: catalog load, routing and max-min fair sharing times on this machine.

Run: .venv/bin/python benchmarks/foundation.py   (BLITZPLAN_QUICK=1 for fewer repeats)
Prints medians of wall-clock times; nothing is asserted, the README quotes the table.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from datetime import date

from blitzplan import list_models, list_topologies, load_model, load_topology
from blitzplan._table import format_table

REPEATS = 3 if os.environ.get("BLITZPLAN_QUICK") == "1" else 7


def median_s(func: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def catalog_rows() -> list[list[object]]:
    rows: list[list[object]] = []
    for name in list_topologies():
        topo = load_topology(name)
        rows.append(
            [
                name,
                len(topo.gpus()),
                topo.graph.number_of_edges(),
                f"{median_s(lambda n=name: load_topology(n)) * 1e3:.1f}",
            ]
        )
    return rows


def routing_and_sharing_rows(name: str, flow_counts: tuple[int, ...]) -> list[list[object]]:
    topo = load_topology(name)
    gpus = topo.gpus()
    rng = random.Random(0)
    rows: list[list[object]] = []
    for count in flow_counts:
        pairs = [tuple(rng.sample(gpus, 2)) for _ in range(count)]
        fresh = load_topology(name)
        start = time.perf_counter()
        flows = [fresh.flow(a, b) for a, b in pairs]
        cold_route = time.perf_counter() - start
        warm_route = median_s(lambda p=pairs, t=fresh: [t.flow(a, b) for a, b in p])
        share = median_s(lambda f=flows, t=fresh: t.fair_share(f))
        rates = fresh.fair_share(flows)
        rows.append(
            [
                name,
                count,
                f"{cold_route * 1e3:.1f}",
                f"{warm_route * 1e3:.2f}",
                f"{share * 1e3:.1f}",
                f"{min(rates) / 1e9:.2f}",
                f"{max(rates) / 1e9:.2f}",
            ]
        )
    return rows


def main() -> None:
    print(
        f"blitzplan foundation benchmark, {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, Python {platform.python_version()}, median of {REPEATS}\n"
    )
    print(format_table(["topology", "gpus", "edges", "load ms"], catalog_rows()), end="\n\n")
    rows = routing_and_sharing_rows("paper-a800-32", (8, 32))
    rows += routing_and_sharing_rows("rail-leafspine-1024", (16, 128, 1024))
    print(
        format_table(
            [
                "topology",
                "flows",
                "route cold ms",
                "route warm ms",
                "fair share ms",
                "min GB/s",
                "max GB/s",
            ],
            rows,
        ),
        end="\n\n",
    )
    model_s = median_s(lambda: [load_model(n).total_bytes for n in list_models()])
    print(f"load_model for all {len(list_models())} presets: {model_s * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
