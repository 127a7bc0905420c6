"""plan() latency with its defaults, the call a serving stack makes in its control loop.

Busy fleets: every scenario serves prefill instances with queues (live pairs, ZigZag predicted)
and decode instances; plan() runs with its defaults (greedy, ZigZag, measured link efficiencies,
no baseline comparison, no decode pre-scaling), then with ``deadline_s``. Topologies are loaded
once (load_topology caches them); the first, cold load is timed apart.

Targets (issue 19) print beside the measurements: +64 within 50 ms, +512 within 200 ms, +1,000
within 1 s, a ``deadline_s`` within 10 % of itself; replan() of the +64 plan after a source fails
within 20 ms warm, importing no solver. Wall-clock and CPU medians are printed: on a shared
machine the wall-clock includes waiting for a core. ``met`` compares the wall-clock median with
the target; the other columns are of the median plan, ``ready s`` when all its instances are
loaded. The deadline table times +64, +512 and +1,000 under 0.001-1 s: a deadline plans only the
instances it affords on the CPU times the plans before recorded, at the wall-clock per CPU second
they met, and once the multicast has laid its problem out asks again at the load the call met so
far (``planned``: the least and the median over the timed calls, ``per call`` each timed call's
count in order; the rest are in ``missing``); it skips the multicast's refinements; one shorter
than any plan there returns a plan of nothing at once, and checkpoints in the greedy and the
transfer program stop a call whose time runs out with the plan found so far, which loads no new
instance (``stopped``: how many of the timed calls; ``none``: how many planned no new instance;
up to the program's first step a call too slow at its own pace plans afresh the share it affords
instead, at most twice, the last attempt going on until its clock stops it; after a stop the
next calls plan for twice the load, the smaller share it affords, halved back by each call that
fits). BLITZPLAN_DEADLINE_CPU=1 times the deadline table by the calling thread's CPU time, the
planner's deadline clock included: a quiet machine emulated on a loaded one. The last table
shows what the multicast's refinements gain and cost on the busy fleet and on small NVLink and
PCIe clusters: ``refine_budget`` 0, the default and None side by side.

Run: .venv/bin/python benchmarks/plan.py   (BLITZPLAN_QUICK=1: fewer repeats, +64 only, one
refinement case)
Prints medians of wall-clock times measured on this machine; nothing is asserted.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from datetime import date

from blitzplan import ClusterState, load_topology
from blitzplan._table import format_table
from blitzplan.scale import ScaleRequest, plan, replan
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
    """Median wall-clock milliseconds of ``call`` after one warm-up call."""
    return timed_ms(call)[0]


def timed_ms(call: Callable[[], object], repeats: int = REPEATS) -> tuple[float, float]:
    """Median wall-clock and CPU milliseconds of ``call`` after one warm-up call."""
    call()
    walls, cpus = [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3


def cold_load_ms(name: str) -> tuple[float, float]:
    catalog._LOADED.clear()
    start = time.perf_counter()
    load_topology(name)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    load_topology(name)
    return cold * 1e3, (time.perf_counter() - start) * 1e3


# (added, deadline_s, target ms): issue 19's targets on the busy fleet; a deadline's target is
# the deadline plus 10 %. +96, +128 and +256 (no target of their own) show the latency grows
# with the size, without a cliff: +96's greedy plan is 1.4 % (0.8 ms) above its bound, too
# little for its refinements to pay for themselves, so ``refine_budget`` skips them.
BUSY: list[tuple[int, float | None, float | None]] = [
    (64, None, 50.0),
    (96, None, None),
    (128, None, None),
    (256, None, None),
    (512, None, 200.0),
    (1000, None, 1000.0),
]
QUICK_BUSY = [(64, None, 50.0)]


def main() -> None:
    print(
        f"blitzplan plan() latency, {date.today()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, median of {REPEATS} (3 from +512 up), "
        f"load average {os.getloadavg()[0]:.1f} at the start\n"
    )
    cold, warm = cold_load_ms("rail-leafspine-1024")
    print(f"load_topology('rail-leafspine-1024'): {cold:.0f} ms cold, {warm:.2f} ms cached\n")
    rows = [_row("paper-a800-32", paper(), "mistral-small-24b", 8, 2, None, None)]
    busy = busy_rail()
    for count, deadline, target in QUICK_BUSY if QUICK else BUSY:
        name = "rail-leafspine-1024, busy"
        rows.append(_row(name, busy, "llama-3-8b", count, 1, deadline, target))
    print(
        format_table(
            [
                "cluster",
                "added",
                "deadline s",
                "planned",
                "live pairs",
                "steps",
                "ready s",
                "plan ms",
                "cpu ms",
                "target ms",
                "met",
                "notes",
            ],
            rows,
        )
    )
    print(f"\n{deadline_table(busy)}\n")
    print(replan_table(busy))
    print(f"\n{many_models_table()}")
    print(f"\n{refine_table(busy)}")


def _row(
    name: str,
    state: ClusterState,
    model: str,
    count: int,
    tp: int,
    deadline: float | None,
    target: float | None,
) -> list[object]:
    request = ScaleRequest(model, prefill=count, tp=tp)
    # what each call planned: no plan kept (a large heap slows the collector)
    results: list[tuple[int, int, int, float]] = []
    notes: list[tuple[str, ...]] = []

    def call() -> None:
        made = plan(state, request, deadline_s=deadline)
        full = made.milestones.full_capacity_s
        results.append((len(made.new_instances), len(made.live_pairs), len(made.steps), full))
        notes.append(made.notes)

    repeats = REPEATS if count < 512 else 3
    wall, cpu = timed_ms(call, repeats)
    timed = sorted(zip(results[1:], notes[1:], strict=True))
    (planned_n, pairs, steps, full), said = timed[len(timed) // 2]  # the median plan
    planned = sorted({r[0] for r, _ in timed})
    return [
        name,
        f"+{count}",
        "-" if deadline is None else f"{deadline:g}",
        "-".join(str(k) for k in (planned[0], planned[-1])[: 2 if len(planned) > 1 else 1]),
        pairs,
        steps,
        f"{full:.4f}" if planned_n else "-",
        f"{wall:.1f}",
        f"{cpu:.1f}",
        "-" if target is None else f"{target:g}",
        "-" if target is None else ("yes" if wall <= target else "no"),
        "; ".join(n[:60] for n in said) or "-",
    ]


def two_serving(name: str, model: str) -> ClusterState:
    """``name`` serving ``model`` on its first two GPUs: a prefill instance with 4 queued
    requests and a decode instance."""
    state = ClusterState(load_topology(name), models=[model])
    gpus = state.topology.gpus()
    state.add_instance(
        model, gpus=[gpus[0]], role="prefill", queue=[(-0.05 * i, 512) for i in range(4)]
    )
    state.add_instance(model, gpus=[gpus[1]], role="decode")
    return state


def refine_table(busy: ClusterState) -> str:
    """What the greedy multicast's refinements gain and cost: plan() without them
    (``refine_budget=0``), with the default budget (at most what they could gain, skipped when
    that is under the greedy's own time) and in full (``refine_budget=None``); ``ready s`` of
    the median call's plan, wall-clock medians of 3."""
    cases = [
        ("rail-leafspine-1024, busy", busy, "llama-3-8b", 96, 1),
        ("paper-a800-32", paper(), "mistral-small-24b", 8, 2),
        ("dgx-h100-64", two_serving("dgx-h100-64", "llama-3-8b"), "llama-3-8b", 32, 1),
        ("h200-8", two_serving("h200-8", "llama-3-8b"), "llama-3-8b", 4, 1),
        ("paper-a100-16 (PCIe)", two_serving("paper-a100-16", "llama-3-8b"), "llama-3-8b", 8, 1),
        ("paper-a100-16 (PCIe)", two_serving("paper-a100-16", "llama-3-8b"), "llama-3-8b", 12, 1),
    ]
    rows = []
    for name, state, model, count, tp in cases[3:4] if QUICK else cases:
        request = ScaleRequest(model, prefill=count, tp=tp)
        timed = [_refined(state, request, budget) for budget in (0, 1.0, None)]
        said = "; ".join(n[:70] for n in timed[1][2] if n.startswith("refine_budget")) or "-"
        rows.append([name, f"+{count}", *(f for t in timed for f in t[:2]), said])
    headers = [
        "cluster",
        "added",
        "greedy ready s",
        "ms",
        "default ready s",
        "ms",
        "full ready s",
        "ms",
        "default's note",
    ]
    title = f"refine_budget: 0 / the default (1) / None (load {os.getloadavg()[0]:.1f})\n"
    return title + format_table(headers, rows)


def _refined(
    state: ClusterState, request: ScaleRequest, budget: float | None
) -> tuple[str, str, tuple[str, ...]]:
    """``ready s`` of the median call's plan, the median wall-clock ms and the last notes of
    plan() under ``refine_budget=budget``."""
    made: list[tuple[float, tuple[str, ...]]] = []

    def call() -> None:
        scale = plan(state, request, refine_budget=budget)
        made.append((scale.milestones.full_capacity_s, scale.notes))

    wall, _ = timed_ms(call, 3)
    ready = sorted(m[0] for m in made[1:])[len(made[1:]) // 2]
    return f"{ready:.4f}", f"{wall:.1f}", made[-1][1]


DEADLINES = (0.001, 0.01, 0.05, 0.2, 1.0)
"""Each ``deadline_s`` timed at +64, +512 and +1,000 (0.05 s at +64 in quick mode)."""


def deadline_table(busy: ClusterState, counts: tuple[int, ...] = (64, 512, 1000)) -> str:
    """plan() under each deadline on the busy fleet, after the plans above recorded the
    cluster's planning times: the target is the deadline plus 10 % (issue 19), for the median
    and for ``max ms``, the slowest timed call; ``none``: the timed calls that planned no new
    instance; ``cpu ms`` is the median process CPU time and
    ``max's cpu ms`` the slowest call's (far below its wall-clock: the call waited for a core)."""
    rows = []
    sizes = [(64, 0.05)] if QUICK else [(n, d) for n in counts for d in DEADLINES]
    clock, cpu_clock = time.perf_counter, os.environ.get("BLITZPLAN_DEADLINE_CPU") == "1"
    if cpu_clock:  # the planner's deadline clock is the thread's CPU time too (module docstring)
        import types

        from blitzplan.scale import planning

        clock = time.thread_time
        planning.time = types.SimpleNamespace(monotonic=clock, thread_time=clock)
    for count, deadline in sizes:
        request = ScaleRequest("llama-3-8b", prefill=count, tp=1)
        counts, walls, cpus, stopped, notes = [], [], [], 0, ()
        for k in range(1 + (REPEATS if count < 512 else 5)):  # the first call is a warm-up
            start, cpu = clock(), time.process_time()
            made = plan(busy, request, deadline_s=deadline)
            walls.append(clock() - start)
            cpus.append(time.process_time() - cpu)
            counts.append(len(made.new_instances))
            stopped += k > 0 and any("ran out while planning" in n for n in made.notes)
            notes, made = made.notes, None  # keep no plan: a large heap slows the collector
        planned = sorted(counts[1:])
        median = statistics.median_low(planned)
        wall, worst = statistics.median(walls[1:]) * 1e3, max(walls[1:]) * 1e3
        target = deadline * 1.1e3
        rows.append(
            [
                f"+{count}",
                f"{deadline:g}",
                f"{planned[0]}/{median}",
                sum(1 for n in planned if n == 0),
                _runs(counts[1:]),
                f"{wall:.1f}",
                f"{worst:.1f}",
                f"{statistics.median(cpus[1:]) * 1e3:.1f}",
                f"{cpus[walls.index(max(walls[1:]))] * 1e3:.1f}",
                f"{target:g}",
                "yes" if wall <= target else "no",
                "yes" if worst <= target else "no",
                stopped,
                (notes or ("-",))[0][: int(os.environ.get("NOTE_W", "70"))],
            ]
        )
    headers = [
        "added",
        "deadline s",
        "planned min/med",
        "none",
        "per call",
        "median ms",
        "max ms",
        "cpu ms",
        "max's cpu ms",
        "target ms",
        "met",
        "max met",
        "stopped",
        "first note (last call)",
    ]
    timed = ", timed by CPU time (BLITZPLAN_DEADLINE_CPU=1)" if cpu_clock else ""
    if cpu_clock:
        from blitzplan.scale import planning

        planning.time = time
    title = f"plan(deadline_s=) on the busy fleet (load {os.getloadavg()[0]:.1f}{timed})\n"
    return title + format_table(headers, rows)


def _runs(counts: list[int]) -> str:
    """The timed calls' planned counts in order, a run of equal ones as ``count x times``."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return " ".join(f"{n}x{times}" if times > 1 else f"{n}" for n, times in runs)


def replan_table(busy: ClusterState) -> str:
    """replan() of the busy fleet's +64 plan after one of its sources fails halfway through the
    load: the first replan in this process (nothing imported for it before), then warm; then
    after the source's GPU fails instead (the first such replan derives the degraded topology,
    keeping the routes the failure leaves as they were, and fills the caches of the rest)."""
    base = plan(busy, ScaleRequest("llama-3-8b", prefill=64, tp=1))
    source = next(s.source for s in base.steps if s.holder == "instance")
    failed = next(i.id for i in busy.instances if source in i.gpus)
    at = base.milestones.full_capacity_s / 2
    before = set(sys.modules)
    start, cpu_start = time.perf_counter(), time.process_time()
    first = replan(base, busy, at_s=at, failed=[failed])
    first_ms = (time.perf_counter() - start) * 1e3
    first_cpu = (time.process_time() - cpu_start) * 1e3
    heavy = sorted(m for m in set(sys.modules) - before if m in HEAVY)
    wall, cpu = timed_ms(lambda: replan(base, busy, at_s=at, failed=[failed]))
    now = at + wall / 1e3
    ahead = replan(base, busy, at_s=at, now_s=now, failed=[failed])
    start, cpu_start = time.perf_counter(), time.process_time()
    replan(base, busy, at_s=at, failed=[source])  # the topology loses a GPU: derived anew
    gpu_first_ms = (time.perf_counter() - start) * 1e3
    gpu_first_cpu = (time.process_time() - cpu_start) * 1e3
    gpu_wall, gpu_cpu = timed_ms(lambda: replan(base, busy, at_s=at, failed=[source]))
    rows = [
        ["first replan ms, cpu ms", f"{first_ms:.1f}, {first_cpu:.1f}", "-"],
        ["modules it imported", ", ".join(heavy) or "none", "none"],
        ["warm replan ms (median), cpu ms", f"{wall:.1f}, {cpu:.1f}", "20"],
        [
            f"GPU {source} failed instead: first replan ms, cpu ms",
            f"{gpu_first_ms:.0f}, {gpu_first_cpu:.0f}",
            "-",
        ],
        ["  then warm ms (median), cpu ms", f"{gpu_wall:.1f}, {gpu_cpu:.1f}", "-"],
        [
            "plan ends s / replan ends s (from the plan's start)",
            f"{base.milestones.full_capacity_s:.4f} / {at + first.milestones.full_capacity_s:.4f}",
            "-",
        ],
        [
            f"now_s = at_s + {wall:.0f} ms: replan ends s",
            f"{now + ahead.milestones.full_capacity_s:.4f}",
            "-",
        ],
    ]
    title = (
        f"replan() of the busy +64 plan, source {failed} failed at {at:.4f} s "
        f"(load {os.getloadavg()[0]:.1f})\n"
    )
    return title + format_table(["measure", "measured", "target"], rows)


def many_models_table() -> str:
    """plan() of 8 simultaneous requests (+8 prefill instances each) on rail-leafspine-1024
    serving 8 models (the same 8B architecture under 8 identities), each with 16 prefill
    instances holding 8 queued requests and 16 decode instances: one MultiPlan, the requests'
    flows sharing the links in priority order."""
    from blitzplan.sim.workloads import tenant_model

    topology = load_topology("rail-leafspine-1024")
    models = [tenant_model("llama-3-8b", k) for k in range(8)]
    state, gpus = ClusterState(topology, models=models), iter(topology.gpus())
    for model in models:
        for k in range(32):
            queue = [(-0.05 * i, 512 + 256 * (i % 5)) for i in range(8)] if k < 16 else []
            role = "prefill" if k < 16 else "decode"
            state.add_instance(model, gpus=[next(gpus)], role=role, queue=queue)
    requests = [ScaleRequest(model, prefill=8) for model in models]
    many = plan(state, requests)
    wall, cpu = timed_ms(lambda: plan(state, requests), 1 if QUICK else 3)
    rows = [
        [
            f"{k}: {made.model}",
            f"+{made.request['prefill']}",
            len(made.new_instances),
            len(made.live_pairs),
            len(made.steps),
            f"{made.milestones.first_capacity_s:.4f}",
            f"{made.milestones.full_capacity_s:.4f}",
        ]
        for k, made in enumerate(many.plans)
    ]
    title = (
        f"plan() of 8 simultaneous requests, 8 models on rail-leafspine-1024 (256 busy GPUs): "
        f"{wall:.0f} ms (cpu {cpu:.0f} ms), median of {1 if QUICK else 3}; "
        f"{len(many.evictions)} evictions; all ready at {many.full_capacity_s:.4f} s\n"
    )
    headers = ["request", "added", "planned", "live", "steps", "first s", "full s"]
    return title + format_table(headers, rows)


HEAVY = ("scipy.optimize", "scipy.sparse.csgraph", "pulp", "ortools", "highspy")


if __name__ == "__main__":
    main()
