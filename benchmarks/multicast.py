"""Multicast benchmark: the paper scenario, greedy and exact against the certified bound on random
cases, packing vs spreading, the prefill rule, and planning time at scale.

Run: .venv/bin/python benchmarks/multicast.py   (BLITZPLAN_QUICK=1: 8 random cases, no 8k fabric)
Prints what it measured on this machine; nothing is asserted, the README quotes the tables.

Flags: ``--sections b`` (any of a, b, c, d; default all), ``--cases 27,60`` (part b on these case
numbers only: every case is still drawn, so the numbers are the full run's), ``--json out.json``
(part b's per-case values: objectives, bounds, status, times).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from dataclasses import dataclass
from datetime import date

from blitzplan import ClusterState, InfeasibleError, load_model, load_topology
from blitzplan._table import format_table
from blitzplan.multicast import MulticastPlan, plan_multicast, validate_multicast
from blitzplan.solvers import SolveStatus
from blitzplan.topologies import Topology, build_cluster, nvswitch_host, pcie_host
from blitzplan.units import GBPS, GIB

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
CASES = 8 if QUICK else 200
EXACT_LIMIT_S = 10.0
MODEL = "mistral-small-24b"
PAPER = {"blitzscale": 1.2, "allcache": 2.0, "first tokens": 0.5}
"""The paper's Fig. 21 (about): six 24B instances ready, and tokens flowing, in seconds."""


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
    allcache = plan_multicast(paper_state(), MODEL, count=6, tp=2, method="allcache")
    for label, options in variants:
        state = paper_state()
        plan = plan_multicast(state, MODEL, count=6, tp=2, live=2, **options)  # type: ignore[arg-type]
        first = min(plan.live, key=lambda name: plan.ready_at_s[name]) if plan.live else None
        rows.append(
            [
                label,
                f"{plan.objective_s:.3f}",
                f"{allcache.objective_s / plan.objective_s:.2f}x",
                f"{plan.ready_at_s[first]:.3f}" if first else "-",
                f"{max(plan.layer_ready_s[first][:2]):.3f}" if first else "-",
                len(plan.lanes),
                f"{plan.lower_bound_s:.3f}",
                f"{plan.objective_s / plan.lower_bound_s:.4f}",
                plan.status.value,
                f"{plan.solve_s * 1e3:.1f}",
            ]
        )
    return rows


def paper_routes() -> str:
    plan = plan_multicast(paper_state(), MODEL, count=6, tp=2, live=2)
    return f"greedy routes: {plan.describe_routes()}; live: {', '.join(plan.live)}"


def random_case(rng: random.Random) -> tuple[ClusterState, dict[str, object]]:
    """1-8 new instances of TP 1/2/4 on 2-6 hosts, 0-4 source instances (else the host copy),
    0-3 background KV flows between random GPUs of different hosts."""
    tp = rng.choice([1, 2, 4])
    gpus = rng.choice([4, 8])
    gbps = lambda: rng.choice([100, 200, 400]) * GBPS  # noqa: E731
    common = {
        "gpus": gpus,
        "nic_bytes_per_s": gbps(),
        "host_to_gpu_bytes_per_s": rng.choice([128, 256]) * GBPS,
        "dram_bytes": 512 * GIB,
    }
    if tp > 1 or rng.random() < 0.7:
        host = nvswitch_host("a800", **common)
    else:
        host = pcie_host("a100-pcie", gpus_per_pcie_switch=2, **common)
    hosts = rng.randint(2, 6)
    topo = build_cluster(
        host,
        hosts=hosts,
        hosts_per_leaf=rng.randint(1, hosts),
        oversubscription=rng.choice([1.0, 2.0, 4.0]),
        rail_optimized=rng.random() < 0.3,
    )
    model = load_model("llama-3-8b")
    state = ClusterState(topo, models=[model])
    slots = [tuple(topo.gpus()[i : i + tp]) for i in range(0, len(topo.gpus()), tp)]
    rng.shuffle(slots)
    sources = rng.randint(0, min(4, len(slots) - 1))
    for slot in slots[:sources]:
        state.add_instance(model, gpus=list(slot), role=rng.choice(["decode", "idle", "prefill"]))
    for _ in range(rng.randint(0, 3)):
        a, b = rng.sample(topo.gpus(), 2)
        if topo.host_of(a) != topo.host_of(b):
            state.add_background_flow(a, b, max_bytes_per_s=rng.choice([10, 25, 50]) * GBPS)
    free = slots[sources:]
    count = rng.randint(1, min(8, len(free)))
    options: dict[str, object] = {"tp": tp, "live": rng.randint(0, count)}
    if rng.random() < 0.5:
        options["targets"] = [list(s) for s in free[:count]]
    else:
        options["count"] = count
    return state, options


@dataclass(frozen=True)
class Case:
    """One random case: both plans and the best of their bounds."""

    index: int
    greedy: MulticastPlan
    exact: MulticastPlan
    bound: float
    options: dict[str, object]
    invalid: tuple[str, ...] = ()
    """Rules either plan breaks (:func:`validate_multicast`; empty: both valid)."""


def bound_rows(
    only: set[int] | None = None,
) -> tuple[list[list[object]], str, list[Case]]:
    """Greedy and exact on the random cases (``only``: these case numbers), each against its
    own bound and against the best bound of the two (the exact method's overlay program, when
    it applies)."""
    rng = random.Random(2026)
    cases: list[Case] = []
    refused = 0
    for k in range(CASES):
        state, options = random_case(rng)
        if only is not None and k not in only:
            continue
        try:
            greedy = plan_multicast(state, "llama-3-8b", **options)  # type: ignore[arg-type]
        except InfeasibleError:
            refused += 1
            continue
        exact = plan_multicast(
            state,
            "llama-3-8b",
            method="exact",
            time_limit_s=EXACT_LIMIT_S,
            **options,  # type: ignore[arg-type]
        )
        best = max(greedy.lower_bound_s, exact.lower_bound_s)
        broken = validate_multicast(state, greedy) + validate_multicast(state, exact)
        cases.append(Case(k, greedy, exact, best, options, broken))
    rows = []
    for name in ("greedy", "exact"):
        plans = [c.greedy if name == "greedy" else c.exact for c in cases]
        own = [p.objective_s / p.lower_bound_s for p in plans]
        best = [p.objective_s / c.bound for p, c in zip(plans, cases, strict=True)]
        n = len(plans)
        rows.append(
            [
                f"{name} / its bound",
                f"{statistics.mean(own):.4f}",
                f"{max(own):.4f}",
                f"{sum(p.status is SolveStatus.OPTIMAL for p in plans)}/{n}",
                f"{sum(r <= 1.01 for r in own)}/{n}",
                f"{statistics.median(p.solve_s for p in plans) * 1e3:.1f}",
                f"{max(p.solve_s for p in plans):.2f}",
            ]
        )
        rows.append(
            [
                f"{name} / best bound",
                f"{statistics.mean(best):.4f}",
                f"{max(best):.4f}",
                "-",
                f"{sum(r <= 1.01 for r in best)}/{n}",
                "-",
                "-",
            ]
        )
    note = (
        f"{CASES if only is None else len(only)} cases: 1-8 new llama-3-8b instances of TP "
        f"1/2/4 on 2-6 random hosts, 0-4 "
        f"sources (decode, idle or prefill; else the host copy), 0-3 background KV flows; "
        f"{refused} refused as infeasible (only prefill sources); exact limit "
        f"{EXACT_LIMIT_S:.0f} s; {sum(bool(c.invalid) for c in cases)} cases with a plan "
        f"failing validation; exact plans in time slices (several phases): "
        f"{sum(_phases(c.exact) > 1 for c in cases)}"
    )
    return rows, note, cases


def _phases(plan: MulticastPlan) -> int:
    return len(set(plan.flow_phase))


def worst_rows(cases: list[Case], count: int = 12, *, sort: bool = True) -> list[list[object]]:
    """The cases where greedy is furthest above the best bound: whose gap it is. The exact
    plan is a valid plan, so greedy / exact > 1 is the greedy's own loss; exact / bound is
    what no plan found closes (no valid bound charges a hop its chunk: a plan sent in
    time slices pays less, see ``multicast.bound.lower_bound``)."""
    rows: list[list[object]] = []
    ranked = sorted(cases, key=lambda c: -c.greedy.objective_s / c.bound) if sort else cases
    for c in ranked[:count]:
        g, e = c.greedy, c.exact
        rows.append(
            [
                c.index,
                f"tp{c.options['tp']} n{len(g.instances)} live{len(g.live)}",
                f"{g.objective_s:.3f}",
                f"{e.objective_s:.3f}",
                f"{c.bound:.3f}",
                f"{g.lower_bound_s:.3f}",
                f"{g.objective_s / c.bound:.3f}",
                f"{g.objective_s / e.objective_s:.3f}",
                f"{e.objective_s / c.bound:.3f}",
                e.status.value,
                _blame(g.objective_s, e.objective_s, c.bound),
            ]
        )
    return rows


def case_records(cases: list[Case]) -> list[dict[str, object]]:
    """Part b per case, for ``--json``."""
    return [
        {
            "case": c.index,
            "tp": c.options["tp"],
            "instances": len(c.greedy.instances),
            "live": len(c.greedy.live),
            "greedy_s": c.greedy.objective_s,
            "exact_s": c.exact.objective_s,
            "best_bound_s": c.bound,
            "greedy_bound_s": c.greedy.lower_bound_s,
            "exact_bound_s": c.exact.lower_bound_s,
            "exact_bound_kind": c.exact.bound_kind,
            "exact_status": c.exact.status.value,
            "greedy_plan_s": c.greedy.solve_s,
            "exact_plan_s": c.exact.solve_s,
            "exact_phases": _phases(c.exact),
            "invalid": list(c.invalid),
        }
        for c in cases
    ]


def _blame(greedy: float, exact: float, bound: float) -> str:
    """Whose gap greedy's is: the greedy's (a plan found is more than 1% faster), open (no
    plan found beats the greedy, so the bound or every method may be loose), or both."""
    own, loose = greedy / exact - 1, exact / bound - 1
    if own <= 0.01:
        return "open: no faster plan" if loose > 0.01 else "none (within 1%)"
    return "greedy" if loose <= 0.01 or own >= 2 * loose else "both"


def placement_rows() -> list[list[object]]:
    rows: list[list[object]] = []
    cases = [
        ("paper, 4 new TP2, prefill NICs allowed", paper_state, 4, 2, True),
        ("paper, 6 new TP2", paper_state, 6, 2, False),
        ("paper, 3 new TP2, prefill NICs allowed", paper_state, 3, 2, True),
    ]
    for label, make, count, tp, allow in cases:
        values = []
        for placement in ("pack", "spread", "auto"):
            plan = plan_multicast(
                make(), MODEL, count=count, tp=tp, allow_prefill_sources=allow, placement=placement
            )
            values.append(f"{plan.objective_s:.3f}")
            values.append(str(len({i.node for i in plan.instances})))
        rows.append([label, *values])
    return rows


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
    targets = {("rail-leafspine-1024", 512): "200", ("8192-GPU rail fabric", 2048): "2000"}
    for name, topo, counts in cases:
        state = ClusterState(topo, models=["llama-3-8b"])
        for g in range(8):
            state.add_instance("llama-3-8b", gpus=[f"h0/gpu{g}"], role="decode")
        for count in counts:
            plan_multicast(state, "llama-3-8b", count=count)  # warm the route cache
            runs = []
            for _ in range(3 if count >= 512 else 7):
                start = time.perf_counter()
                plan_multicast(state, "llama-3-8b", count=count)
                runs.append(time.perf_counter() - start)
            rows.append(
                [
                    name,
                    count,
                    f"{statistics.median(runs) * 1e3:.1f}",
                    targets.get((name, count), "-"),
                ]
            )
    return rows


def section_a() -> None:
    print(
        "a. paper scenario: paper-a800-32, host 0 serves mistral-small-24b as 2 prefill + 2 "
        "decode TP2 instances; six new TP2 instances, live=2 (line-rate links)"
    )
    print(
        format_table(
            [
                "method",
                "all ready s",
                "vs allcache",
                "first live ready s",
                "its first layer s",
                "lanes",
                "lower bound s",
                "/ bound",
                "status",
                "plan ms",
            ],
            paper_rows(),
        )
    )
    print(paper_routes())
    print(
        f"paper (Fig. 21, about): BlitzScale {PAPER['blitzscale']} s, AllCache "
        f"{PAPER['allcache']} s, tokens flowing from {PAPER['first tokens']} s\n"
    )


def section_b(only: set[int] | None, json_path: str | None) -> None:
    rows, note, cases = bound_rows(only)
    if json_path:
        with open(json_path, "w") as out:
            json.dump(case_records(cases), out, indent=1)
    print("b. greedy and exact against the certified lower bound (all_ready)")
    print(
        format_table(
            [
                "ratio",
                "mean",
                "worst",
                "meets bound (OPTIMAL)",
                "within 1%",
                "median plan ms",
                "max plan s",
            ],
            rows,
        )
    )
    print(note, end="\n\n")
    heads = [
        "case",
        "shape",
        "greedy s",
        "exact s",
        "best bound s",
        "greedy's bound s",
        "greedy/bound",
        "greedy/exact",
        "exact/bound",
        "exact status",
        "gap is",
    ]
    print("b2. the 12 cases where greedy is furthest above the best bound: whose gap")
    print(format_table(heads, worst_rows(cases)), end="\n\n")
    print("b3. the 12 cases where exact is furthest above the best bound")
    exact_worst = sorted(cases, key=lambda c: -c.exact.objective_s / c.bound)
    print(format_table(heads, worst_rows(exact_worst, sort=False)), end="\n\n")


def section_c() -> None:
    print("c. placement with count=: pack fills NVLink groups, spread leaves spare NICs to relay")
    print(
        format_table(
            ["case", "pack s", "nodes", "spread s", "nodes", "auto s", "nodes"], placement_rows()
        ),
        end="\n\n",
    )


def section_d() -> None:
    print("d. greedy planning time (median wall clock, warm topology)")
    print(format_table(["topology", "new instances", "plan ms", "target ms"], timing_rows()))


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="abcd", help="parts to run (a, b, c, d)")
    parser.add_argument("--cases", default=None, help="part b on these case numbers (27,60)")
    parser.add_argument("--json", default=None, help="write part b's per-case values here")
    return parser.parse_args()


def main() -> None:
    args = options()
    only = None if args.cases is None else {int(x) for x in args.cases.split(",") if x.strip()}
    print(
        f"blitzplan multicast benchmark, {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, Python {platform.python_version()}\n"
    )
    if "a" in args.sections:
        section_a()
    if "b" in args.sections:
        section_b(only, args.json)
    if "c" in args.sections:
        section_c()
    if "d" in args.sections:
        section_d()


if __name__ == "__main__":
    main()
