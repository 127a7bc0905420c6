"""The fault campaign: replan after random single and double failures, checked independently.

A *case* is a scenario (topology, model, serving instances, a scale request and plan options),
one or two failures of any kind (a source instance, a new instance, a GPU, a NIC, a PCIe switch, a
root complex, host DRAM, an NVSwitch, a host, a leaf, the spine, a link) and a time before, during
or after the load. :func:`run_case` replans it and :func:`check` judges the outcome with its own
code: a clear InfeasibleError, or a plan that validates on what survives, never touches a failed
part, sends nothing a survivor already has, keeps every survivor's role and live status and the
plan's options, completes or names every survivor, holds only bytes the old plan's steps had
delivered (:func:`~blitzplan.scale.byte_checks.validate_replan`), and claims OPTIMAL only on its
bound.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from blitzplan import ClusterState, InfeasibleError, InvalidInputError, load_topology
from blitzplan.scale import ScalePlan, ScaleRequest, plan, replan, validate_plan
from blitzplan.scale.byte_checks import validate_replan
from blitzplan.scale.replan import recover
from blitzplan.solvers import SolveStatus
from tests.program_check import check_program

KINDS = (
    "source",
    "new",
    "gpu",
    "nic",
    "pcie",
    "rc",
    "dram",
    "nvswitch",
    "host",
    "leaf",
    "spine",
    "link",
)


@dataclass(frozen=True)
class Scenario:
    name: str
    build: Callable[[], ClusterState]
    request: ScaleRequest
    options: dict[str, object]


def _paper() -> ClusterState:
    state = ClusterState(load_topology("paper-a800-32"), models=["mistral-small-24b"])
    for i, role in enumerate(["prefill", "prefill", "decode", "decode"]):
        queue = [(0.0, 1024 + 128 * k) for k in range(6)] if role == "prefill" else []
        state.add_instance(
            "mistral-small-24b",
            gpus=[f"h0/gpu{2 * i}", f"h0/gpu{2 * i + 1}"],
            role=role,
            queue=queue,
        )
    return state


def _dgx() -> ClusterState:
    state = ClusterState(load_topology("dgx-h100-64"), models=["llama-3-8b"])
    for g, role in enumerate(["decode", "decode", "prefill", "prefill"]):
        queue = [(0.0, 2048)] * 4 if role == "prefill" else []
        state.add_instance("llama-3-8b", gpus=[f"h0/gpu{g}"], role=role, queue=queue)
    return state


def _pcie() -> ClusterState:
    state = ClusterState(load_topology("paper-a100-16"), models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")
    state.add_instance("llama-3-8b", gpus=["h0/gpu1"], role="prefill", queue=[(0.0, 1024)] * 4)
    return state


def _h200() -> ClusterState:
    state = ClusterState(load_topology("h200-8"), models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="decode")
    state.add_instance("llama-3-8b", gpus=["h0/gpu1"], role="prefill", queue=[(0.0, 512)] * 3)
    return state


def _host_copy_only() -> ClusterState:
    state = ClusterState(load_topology("dgx-h100-64"), models=["qwen2.5-7b"])
    state.add_instance(
        "qwen2.5-7b", gpus=["h3/gpu0", "h3/gpu1"], role="prefill", queue=[(0.0, 1024)] * 3
    )
    return state


_BASELINES: dict[str, object] = {"compare_baselines": True}
"""Replans must also keep the baseline comparison working (or leave out what cannot run)."""

SCENARIOS = (
    Scenario(
        "paper a800 24B tp2", _paper, ScaleRequest("mistral-small-24b", prefill=6, tp=2), _BASELINES
    ),
    Scenario(
        "paper a800 24B tp2, prefill sources, startup 2 s",
        _paper,
        ScaleRequest("mistral-small-24b", prefill=4, tp=2),
        {"allow_prefill_sources": True, "startup_s": 2.0, **_BASELINES},
    ),
    Scenario("dgx h100 8B tp1", _dgx, ScaleRequest("llama-3-8b", prefill=10, tp=1), _BASELINES),
    Scenario("a100 pcie 8B tp1", _pcie, ScaleRequest("llama-3-8b", prefill=4, tp=1), _BASELINES),
    Scenario("h200 one host 8B", _h200, ScaleRequest("llama-3-8b", prefill=3, tp=1), _BASELINES),
    Scenario(
        "dgx host copy only 7B tp2",
        _host_copy_only,
        ScaleRequest("qwen2.5-7b", prefill=4, tp=2),
        {"compare_baselines": False},
    ),
)

_BASES: dict[str, ScalePlan] = {}


def base_plan(scenario: Scenario) -> ScalePlan:
    """The plan every case of a scenario replans (made once)."""
    if scenario.name not in _BASES:
        _BASES[scenario.name] = plan(scenario.build(), scenario.request, **scenario.options)  # type: ignore[arg-type]
    return _BASES[scenario.name]


def pick_failure(state: ClusterState, base: ScalePlan, kind: str, rng: random.Random) -> object:
    """One failure of ``kind`` (a name or a link), or None when the cluster has none such."""
    topo = state.topology
    nodes = list(topo.graph.nodes)

    def of(test: Callable[[str], bool]) -> str | None:
        found = [n for n in nodes if test(n)]
        return rng.choice(found) if found else None

    def switch(name: str) -> Callable[[str], bool]:
        return lambda n: topo.graph.nodes[n].get("switch") == name

    if kind == "source":
        mine = [i.id for i in state.instances]
        return rng.choice(mine) if mine else None
    if kind == "new":
        return rng.choice([i.name for i in base.new_instances]) if base.new_instances else None
    if kind == "gpu":
        return rng.choice(topo.gpus())
    if kind == "nic":
        return of(lambda n: topo.kind(n) == "nic")
    if kind == "pcie":
        return of(lambda n: switch("pcie")(n) and not n.endswith("/rc"))
    if kind == "rc":
        return of(lambda n: n.endswith("/rc"))
    if kind == "dram":
        return of(lambda n: topo.kind(n) == "host_mem")
    if kind in ("nvswitch", "leaf", "spine"):
        return of(switch(kind))
    if kind == "host":
        return rng.choice(topo.hosts())
    edge = rng.choice(list(topo.graph.edges))
    return (edge[0], edge[1])


@dataclass(frozen=True)
class Outcome:
    """What one case gave: a plan, a clear error, or a crash; and what the checker found."""

    scenario: str
    failures: tuple[object, ...]
    at_s: float
    kind: str  # "plan", "error" or "crash"
    problems: tuple[str, ...] = ()
    message: str = ""
    replan_s: float = 0.0
    fresh_s: float = 0.0


def run_case(
    scenario: Scenario, failures: list[object], fraction: float, *, time_fresh: bool = True
) -> Outcome:
    base = base_plan(scenario)
    state = scenario.build()
    at = fraction * max(base.milestones.full_capacity_s, 1e-9)
    started = time.perf_counter()
    try:
        after = replan(base, state, at_s=at, failed=failures)  # type: ignore[arg-type]
    except (InfeasibleError, InvalidInputError) as exc:
        problems = () if _clear(str(exc), base, failures) else (f"unclear message: {exc}",)
        return Outcome(scenario.name, tuple(failures), at, "error", problems, str(exc))
    except Exception as exc:
        return Outcome(
            scenario.name, tuple(failures), at, "crash", (f"{type(exc).__name__}: {exc}",)
        )
    replan_s = time.perf_counter() - started
    problems = check(base, state, failures, at, after)
    return Outcome(
        scenario.name,
        tuple(failures),
        at,
        "plan",
        tuple(problems),
        replan_s=replan_s,
        fresh_s=_fresh_s(scenario, base, state, failures, at) if time_fresh else 0.0,
    )


def _clear(message: str, base: ScalePlan, failures: list[object]) -> bool:
    """A clear error names what it is about: a new instance, a failed part, a node or the model."""
    names = [i.name for i in base.new_instances] + [str(f) for f in failures if isinstance(f, str)]
    return bool(message.strip()) and (
        any(name in message for name in names)
        or re.search(r"\bh\d+/", message) is not None
        or base.model.name in message
    )


def _fresh_s(
    scenario: Scenario, base: ScalePlan, state: ClusterState, failures: list[object], at: float
) -> float:
    """Seconds a fresh plan() of the same request takes on the state after the failures."""
    current = recover(base, state, at_s=at, failed=failures).state  # type: ignore[arg-type]
    started = time.perf_counter()
    with contextlib.suppress(InfeasibleError, InvalidInputError):
        plan(current, scenario.request, **scenario.options)  # type: ignore[arg-type]
    return time.perf_counter() - started


def check(
    base: ScalePlan, state: ClusterState, failures: list[object], at: float, after: ScalePlan
) -> list[str]:
    """Every rule the replan breaks (empty: it keeps them all)."""
    out: list[str] = []
    recovery = recover(base, state, at_s=at, failed=failures)  # type: ignore[arg-type]
    dead_nodes, dead_links = _dead(state, failures)
    mc = after.multicast
    if mc is not None:
        out += [f"invalid: {p}" for p in validate_plan(recovery.state, after)]
        for flow in mc.flows:
            touched = {u for edge in flow.edges for u in edge}
            if touched & dead_nodes or set(flow.edges) & dead_links:
                out.append(f"flow {flow.name} crosses a failed part")
        memories = {f for f in failures if isinstance(f, str) and _is_memory(state, f)}
        gone = {f for f in failures if isinstance(f, str) and f in {i.id for i in state.instances}}
        for lane in mc.lanes:
            sender = mc.nodes[lane.sender]
            if lane.holder in memories:
                out.append(f"lane {lane.flow} reads the failed memory {lane.holder}")
            if sender.instance_id in gone:
                out.append(f"lane {lane.flow} sends from the failed instance {sender.instance_id}")
        out += [f"program: {p}" for p in check_program(after)[:3]]
        out += [f"across documents: {p}" for p in validate_replan(base, after, at)[:3]]
        if mc.lower_bound_s > mc.objective_s * (1 + 1e-9):
            out.append("bound above the objective")
        if mc.status is SolveStatus.OPTIMAL and mc.objective_s > mc.lower_bound_s * (1 + 1e-9):
            out.append("OPTIMAL above its bound")
    before = {i.name: i for i in base.new_instances}
    names = {i.name for i in after.new_instances}
    for survivor in recovery.survivors:
        if survivor.name not in names and not any(survivor.name in m for m in after.missing):
            out.append(f"{survivor.name} neither planned nor named in missing")
    for info in after.new_instances:
        old = before[info.name]
        if info.role != old.role:
            out.append(f"{info.name} changed role {old.role} -> {info.role}")
        if old.live and not info.live:
            out.append(f"{info.name} is no longer live")
        for unit, t in enumerate(info.layer_ready_s):
            if (old.layer_ready_s[unit] <= at) != (t == 0.0) or not math.isfinite(t):
                out.append(f"{info.name} unit {unit}: delivered before, sent again (or never)")
                break
    if after.options != base.options:
        out.append("the plan's options did not carry over")
    return out


def _is_memory(state: ClusterState, name: str) -> bool:
    topo = state.topology
    return name in topo.graph and topo.kind(name) in ("host_mem", "ssd")


def _dead(state: ClusterState, failures: list[object]) -> tuple[set[str], set[tuple[str, str]]]:
    topo = state.topology
    nodes: set[str] = set()
    links: set[tuple[str, str]] = set()
    for item in failures:
        if isinstance(item, tuple):
            links |= {(item[0], item[1]), (item[1], item[0])}
        elif item in topo.hosts():
            nodes |= set(topo.nodes_of_host(item))
        elif (
            isinstance(item, str)
            and item in topo.graph
            and topo.kind(item)
            not in (
                "host_mem",
                "ssd",
            )
        ):
            nodes.add(item)
    return nodes, links


def random_case(rng: random.Random) -> tuple[Scenario, list[object], float]:
    scenario = rng.choice(SCENARIOS)
    state = scenario.build()
    base = base_plan(scenario)
    failures: list[object] = []
    for _ in range(1 if rng.random() < 0.7 else 2):
        kind = rng.choice(KINDS)
        failure = pick_failure(state, base, kind, rng)
        if failure is not None and failure not in failures:
            failures.append(failure)
    fraction = rng.choice([0.0, rng.random(), rng.random(), 1.5])
    return scenario, failures, fraction
