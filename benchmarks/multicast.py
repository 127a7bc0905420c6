"""Multicast benchmark: the paper scenario, greedy vs exact vs bound, and planning time at scale.

Run: .venv/bin/python benchmarks/multicast.py   (BLITZPLAN_QUICK=1: 20 random cases, no 8k fabric)
Prints what it measured on this machine; nothing is asserted, the README quotes the tables.
"""

from __future__ import annotations

import os
import platform
import random
import statistics
import time
from datetime import date

from blitzplan import ClusterState, load_model, load_topology
from blitzplan._table import format_table
from blitzplan.multicast import plan_multicast
from blitzplan.solvers import SolveStatus
from blitzplan.topologies import Topology, build_cluster, nvswitch_host, pcie_host
from blitzplan.units import GBPS, GIB

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
CASES = 20 if QUICK else 200
EXACT_LIMIT_S = 20.0
MODEL = "mistral-small-24b"


def paper_state(*, decode: int = 2, prefill: int = 2) -> ClusterState:
    """Host 0 of paper-a800-32 serves mistral-small-24b as TP2 prefill and decode instances."""
    state = ClusterState(load_topology("paper-a800-32"), models=[MODEL])
    roles = ["prefill"] * prefill + ["decode"] * decode
    for i, role in enumerate(roles):
        state.add_instance(MODEL, gpus=[f"h0/gpu{2 * i}", f"h0/gpu{2 * i + 1}"], role=role)
    return state


def paper_rows() -> list[list[object]]:
    rows: list[list[object]] = []
    variants = [
        ("greedy", {}),
        ("greedy, prefill NICs allowed", {"allow_prefill_sources": True}),
        ("exact", {"method": "exact", "time_limit_s": 60.0}),
        ("allcache", {"method": "allcache"}),
        ("serverlessllm (miss)", {"method": "serverlessllm"}),
        ("one_by_one", {"method": "one_by_one"}),
        ("binomial", {"method": "binomial"}),
        ("ring", {"method": "ring"}),
    ]
    for label, options in variants:
        state = paper_state()
        plan = plan_multicast(state, MODEL, count=6, tp=2, live=2, **options)  # type: ignore[arg-type]
        first = min(plan.live, key=lambda name: plan.ready_at_s[name]) if plan.live else None
        chains = "+".join(
            str(sum(len(plan.nodes[n].gpus) // 2 for n in c.nodes)) for c in plan.chains
        )
        rows.append(
            [
                label,
                f"{plan.objective_s:.3f}",
                f"{plan.ready_at_s[first]:.3f}" if first else "-",
                f"{plan.layer_ready_s[first][1]:.3f}" if first else "-",
                chains or "-",
                f"{plan.lower_bound_s:.3f}",
                plan.status.value,
                f"{plan.solve_s * 1e3:.1f}",
            ]
        )
    return rows


def random_case(rng: random.Random) -> tuple[ClusterState, dict[str, object]]:
    gpus = rng.choice([2, 4, 8])
    gbps = lambda: rng.choice([100, 200, 400]) * GBPS  # noqa: E731
    common = {
        "gpus": gpus,
        "nic_bytes_per_s": gbps(),
        "host_to_gpu_bytes_per_s": rng.choice([128, 256]) * GBPS,
        "dram_bytes": 512 * GIB,
    }
    if rng.random() < 0.6:
        host = nvswitch_host("a800", **common)
    else:
        host = pcie_host("a100-pcie", gpus_per_pcie_switch=2 if gpus > 2 else 1, **common)
    hosts = rng.randint(2, 6)
    topo = build_cluster(
        host,
        hosts=hosts,
        hosts_per_leaf=rng.randint(1, hosts),
        oversubscription=rng.choice([1.0, 2.0, 4.0]),
    )
    model = load_model("llama-3-8b")
    state = ClusterState(topo, models=[model])
    order = list(topo.gpus())
    rng.shuffle(order)
    sources = rng.choice([0, 1, 2, 2, 3, 3])
    for gpu in order[:sources]:
        state.add_instance(
            model, gpus=[gpu], role=rng.choice(["decode", "decode", "idle", "prefill"])
        )
    count = rng.randint(1, min(6, len(order) - sources))
    targets = [[gpu] for gpu in order[sources : sources + count]]
    return state, {"targets": targets, "live": rng.randint(0, count)}


def greedy_vs_exact() -> tuple[list[list[object]], str]:
    rng = random.Random(2025)
    ratios, bound_ratios, exact_s, optimal, proven = [], [], [], 0, 0
    nodes = []
    for _ in range(CASES):
        state, options = random_case(rng)
        greedy = plan_multicast(state, "llama-3-8b", **options)  # type: ignore[arg-type]
        exact = plan_multicast(
            state,
            "llama-3-8b",
            method="exact",
            time_limit_s=EXACT_LIMIT_S,
            **options,  # type: ignore[arg-type]
        )
        nodes.append(len(exact.chains) and sum(len(c.nodes) for c in exact.chains))
        ratios.append(greedy.objective_s / exact.objective_s)
        bound_ratios.append(exact.objective_s / exact.lower_bound_s)
        exact_s.append(exact.solve_s)
        optimal += greedy.objective_s <= exact.objective_s * (1 + 1e-9)
        proven += exact.status is SolveStatus.OPTIMAL
    rows = [
        ["greedy / exact", f"{statistics.mean(ratios):.4f}", f"{max(ratios):.4f}"],
        ["exact / lower bound", f"{statistics.mean(bound_ratios):.4f}", f"{max(bound_ratios):.4f}"],
        ["exact solve s", f"{statistics.mean(exact_s):.3f}", f"{max(exact_s):.3f}"],
    ]
    note = (
        f"{CASES} cases, 1-6 new TP1 llama-3-8b instances on random free GPUs "
        f"({statistics.mean(nodes):.1f} target nodes on average), 0-3 source instances "
        f"(else the host copy): greedy optimal in "
        f"{optimal}/{CASES}; exact proven optimal in {proven}/{CASES} (limit {EXACT_LIMIT_S:.0f} s)"
    )
    return rows, note


def fabric_8192() -> Topology:
    host = nvswitch_host("h100", nic_bytes_per_s=400 * GBPS, host_to_gpu_bytes_per_s=400 * GBPS)
    return build_cluster(
        host,
        hosts=1024,
        hosts_per_leaf=64,
        oversubscription=2,
        rail_optimized=True,
        name="rail-leafspine-8192",
    )


def timing_rows() -> list[list[object]]:
    rows: list[list[object]] = []
    state = paper_state()
    plan_multicast(state, MODEL, count=8, tp=2)
    runs = []
    for _ in range(20):
        start = time.perf_counter()
        plan_multicast(state, MODEL, count=8, tp=2)
        runs.append(time.perf_counter() - start)
    rows.append(["paper-a800-32", 8, f"{statistics.median(runs) * 1e3:.1f}", "5"])
    cases = [("rail-leafspine-1024", load_topology("rail-leafspine-1024"), (1, 8, 64, 512))]
    if not QUICK:
        cases.append(("8192-GPU rail fabric", fabric_8192(), (2048,)))
    for name, topo, counts in cases:
        state = ClusterState(topo, models=["llama-3-8b"])
        for g in range(8):
            state.add_instance("llama-3-8b", gpus=[f"h0/gpu{g}"], role="decode")
        plan_multicast(state, "llama-3-8b", count=1)
        for count in counts:
            runs = []
            for _ in range(3 if count >= 512 else 7):
                start = time.perf_counter()
                plan_multicast(state, "llama-3-8b", count=count)
                runs.append(time.perf_counter() - start)
            target = "200" if (name, count) == ("rail-leafspine-1024", 512) else "-"
            rows.append([name, count, f"{statistics.median(runs) * 1e3:.1f}", target])
    return rows


def main() -> None:
    print(
        f"blitzplan multicast benchmark, {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, Python {platform.python_version()}\n"
    )
    print(
        "a. paper scenario: paper-a800-32, host 0 serves mistral-small-24b as 2 prefill + 2 "
        "decode TP2 instances; six new TP2 instances, live=2"
    )
    print(
        format_table(
            [
                "method",
                "all ready s",
                "first live ready s",
                "its layer 1 s",
                "chains (instances)",
                "lower bound s",
                "status",
                "plan ms",
            ],
            paper_rows(),
        ),
        end="\n\n",
    )
    rows, note = greedy_vs_exact()
    print("b. greedy vs exact vs certified lower bound (all_ready)")
    print(format_table(["ratio", "mean", "worst"], rows))
    print(note, end="\n\n")
    print("c. greedy planning time (median wall clock, warm topology)")
    print(format_table(["topology", "new instances", "plan ms", "target ms"], timing_rows()))


if __name__ == "__main__":
    main()
