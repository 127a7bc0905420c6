"""The fault campaign: replan after random single and double failures, checked independently.

A *case* is a scenario (topology, model, serving instances, a scale request and plan options;
off-grid models served at another TP degree included), none, one or two failures of any kind (a
source instance, a new instance, a GPU, a NIC, a PCIe switch, a root complex, host DRAM, an
NVSwitch, a host, a leaf, the spine, a link) and a time before, during or after the load.
:func:`run_case` replans it and :func:`check` judges the outcome with its own code: a clear
InfeasibleError, or a plan that validates on what survives, never touches a failed part, sends
nothing a survivor already has, keeps every survivor's role and live status and the plan's
options, completes or names every survivor, holds only bytes the old plan's steps had delivered
(:func:`~blitzplan.scale.byte_checks.validate_replan`), sends from instances of another TP degree
only bytes their ranks hold, and claims OPTIMAL only on its bound.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from blitzplan import ClusterState, InfeasibleError, InvalidInputError, load_model, load_topology
from blitzplan.scale import ScalePlan, ScaleRequest, plan, replan, validate_plan
from blitzplan.scale.byte_checks import validate_replan
from blitzplan.scale.recovery import recover
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


def _config(**fields: object) -> dict[str, object]:
    return {
        "model_type": "llama",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        **fields,
    }


OFF_GRID = {
    "mistral-7b-32002": load_model(
        _config(
            model_type="mistral",
            _name_or_path="mistral-7b-32002",
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=32002,
        )
    ),
    "small-kv2-v130": load_model(
        _config(
            _name_or_path="small-kv2-v130",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=130,
        )
    ),
}
"""Models whose layout grid is small (a 32,002 or 130-token vocabulary): most TP pairs are not
:meth:`~blitzplan.models.layout.Layout.exact_for` one another."""


def _served(
    key: str, topology: str, source_tp: int, *, host_copy: bool = True
) -> Callable[[], ClusterState]:
    """Two decode instances and a queued prefill instance of an off-grid model at ``source_tp``
    on host 0 (and its host copy)."""
    spec = OFF_GRID[key]

    def build() -> ClusterState:
        state = ClusterState(load_topology(topology), models=[spec] if host_copy else [])
        gpus = load_topology(topology).gpus_of_host("h0")
        for k, role in enumerate(["decode", "decode", "prefill"]):
            group = gpus[k * source_tp : (k + 1) * source_tp]
            if len(group) == source_tp:
                queue = [(0.0, 96)] * 3 if role == "prefill" else []
                state.add_instance(spec, gpus=group, role=role, queue=queue)
        return state

    return build


OFF_GRID_SCENARIOS = tuple(
    Scenario(
        f"off-grid {key} tp{a} -> tp{b}{'' if copy else ', no host copy'}",
        _served(key, topology, a, host_copy=copy),
        ScaleRequest(OFF_GRID[key], prefill=3, tp=b),
        {},
    )
    for key, topology, a, b, copy in (
        ("mistral-7b-32002", "dgx-h100-64", 2, 4, True),
        ("mistral-7b-32002", "dgx-h100-64", 4, 2, True),
        ("mistral-7b-32002", "dgx-h100-64", 8, 1, True),
        ("mistral-7b-32002", "dgx-h100-64", 1, 4, False),
        ("small-kv2-v130", "dgx-h100-64", 4, 1, True),
        ("small-kv2-v130", "paper-a800-32", 2, 4, True),
        ("small-kv2-v130", "h200-8", 1, 2, False),
    )
)
"""TP mismatches on off-grid models: sources of another degree are holders only where the layout
is exact (the no-host-copy ones are; the others plan from the host copy, or fail clearly)."""

ALL_SCENARIOS = SCENARIOS + OFF_GRID_SCENARIOS

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
    group: str = "one plan"
    """``one plan``, ``off-grid`` (a model served at another TP degree, off the layout grid) or
    ``overlap`` (a second plan made while the first loads: tests.overlap_campaign)."""


def run_case(
    scenario: Scenario, failures: list[object], fraction: float, *, time_fresh: bool = True
) -> Outcome:
    base = base_plan(scenario)
    state = scenario.build()
    at = fraction * max(base.milestones.full_capacity_s, 1e-9)
    group = "off-grid" if scenario in OFF_GRID_SCENARIOS else "one plan"
    started = time.perf_counter()
    try:
        after = replan(base, state, at_s=at, failed=failures)  # type: ignore[arg-type]
    except (InfeasibleError, InvalidInputError) as exc:
        problems = () if clear(str(exc), base, failures) else (f"unclear message: {exc}",)
        return Outcome(scenario.name, tuple(failures), at, "error", problems, str(exc), group=group)
    except Exception as exc:
        crash = (f"{type(exc).__name__}: {exc}",)
        return Outcome(scenario.name, tuple(failures), at, "crash", crash, group=group)
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
        group=group,
    )


def clear(message: str, base: ScalePlan, failures: list[object]) -> bool:
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


def random_failures(state: ClusterState, base: ScalePlan, rng: random.Random) -> list[object]:
    """None (one case in ten: a replan with nothing failed), one or two failures of any kind."""
    failures: list[object] = []
    count = rng.choices([0, 1, 2], weights=[1, 6, 3])[0]
    for _ in range(count):
        failure = pick_failure(state, base, rng.choice(KINDS), rng)
        if failure is not None and failure not in failures:
            failures.append(failure)
    return failures


def random_case(rng: random.Random) -> tuple[Scenario, list[object], float]:
    """A scenario (off-grid ones included), its failures and a time as a fraction of the load."""
    scenario = rng.choice(ALL_SCENARIOS)
    failures = random_failures(scenario.build(), base_plan(scenario), rng)
    fraction = rng.choice([0.0, rng.random(), rng.random(), 1.5])
    return scenario, failures, fraction
