"""The overlay program's bound, the tree packing built on it, and the plan-space rules the bound
relies on (routes named by holder, exit and destination; phases apart on shared links)."""

from __future__ import annotations

import dataclasses
import itertools
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blitzplan import ClusterState, InfeasibleError, load_model
from blitzplan.multicast import plan_multicast, validate_multicast
from blitzplan.multicast.bound import overlay_lp, overlay_solve
from blitzplan.multicast.bound.lower_bound import lower_bound
from blitzplan.multicast.bound.overlay_lp import overlay_bound
from blitzplan.multicast.bound.overlay_solve import COVER_LPS, live_covers
from blitzplan.multicast.exact.tree_packing import pack_trees
from blitzplan.multicast.validation.route_check import check_phases
from blitzplan.solvers import SolveStatus
from blitzplan.topologies import Flow, build_cluster, nvswitch_host
from blitzplan.units import GBPS, GIB, MIB
from tests.multicast_random import finished, random_plan, tiny_problem
from tests.test_multicast import PROPERTY_MODEL, multicast_case, tiny_cases

NIC = 100 * GBPS


def _plan(problem, built, bound):
    return finished(problem, built, min(bound, max(built.ready_at_s.values())), method="exact")


def one_slow_rank_case():
    """A TP4 source on h0 and a TP4 new instance filling h1 (no spare GPU relays): rank 2's
    bytes may land only on h1/gpu2, and a lane from another host enters by its destination's
    own NIC, so they all cross h1/nic2, which a background flow halves."""
    spec = load_model(PROPERTY_MODEL)
    host = nvswitch_host(
        "h100", gpus=4, nic_bytes_per_s=NIC, host_to_gpu_bytes_per_s=NIC, dram_bytes=64 * GIB
    )
    state = ClusterState(build_cluster(host, hosts=3), models=[spec])
    state.add_instance(spec, gpus=[f"h0/gpu{g}" for g in range(4)], role="decode")
    state.add_background_flow("h2/gpu2", "h1/gpu2", max_bytes_per_s=NIC / 2)
    return state, spec, [[f"h1/gpu{g}" for g in range(4)]]


def test_overlay_bound_by_hand_one_slow_nic() -> None:
    """Hand oracle: every plan needs shard / (NIC / 2) seconds; the cut bounds see only the
    host's four NICs together (4 * shard over 3.5 NICs), the overlay program the exact value,
    and the exact method's plan is within 1% of it."""
    state, spec, targets = one_slow_rank_case()
    problem = tiny_problem(state, spec, targets=targets, tp=4, live=1)
    shard = sum(problem.unit_bytes)
    by_hand = shard / (NIC / 2)
    strong = overlay_bound(problem)
    assert strong is not None
    assert strong.bound_s == pytest.approx(by_hand, rel=1e-5)
    assert strong.bound_s <= by_hand
    assert lower_bound(problem, "all_ready") < 0.6 * by_hand
    exact = plan_multicast(state, spec, targets=targets, tp=4, live=1, method="exact")
    assert validate_multicast(state, exact) == ()
    assert exact.lower_bound_s == pytest.approx(by_hand, rel=1e-5)
    assert exact.gap < 0.01


@pytest.mark.parametrize("index", range(0, len(tiny_cases()), 2))
def test_overlay_bound_holds_against_random_plans_on_tiny_graphs(index: int) -> None:
    """100 random plans per tiny case, anywhere in the plan space: none beats the overlay
    bound; the tree packing's plan is valid and does not beat it either."""
    state, spec, options = tiny_cases()[index]
    problem = tiny_problem(state, spec, **options)
    strong = overlay_bound(problem)
    assert strong is not None
    rng = random.Random(index)
    for _ in range(100):
        built = random_plan(problem, rng)
        if built is not None:
            assert max(built.ready_at_s.values()) >= strong.bound_s * (1 - 1e-9)
    packed = pack_trees(problem, strong.live_nodes, time_limit_s=5.0)
    assert packed is not None
    plan = _plan(problem, packed, strong.bound_s)
    assert validate_multicast(state, plan) == ()
    assert plan.objective_s >= strong.bound_s * (1 - 1e-9)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(multicast_case(max_targets=3), st.integers(0, 2**32 - 1))
def test_property_no_random_plan_beats_the_overlay_bound(case, seed: int) -> None:
    """Property: on random clusters, sources, background flows and live counts, random valid
    plans never beat the overlay bound, and the tree packing's plan validates."""
    state, spec, options = case
    try:
        problem = tiny_problem(state, spec, **options)
    except InfeasibleError:
        return
    strong = overlay_bound(problem)
    if strong is None:
        return
    rng = random.Random(seed)
    for _ in range(8):
        built = random_plan(problem, rng)
        if built is not None:
            plan = _plan(problem, built, strong.bound_s)
            assert validate_multicast(state, plan) == ()
            assert plan.objective_s >= strong.bound_s * (1 - 1e-9)
    packed = pack_trees(problem, strong.live_nodes, time_limit_s=5.0)
    if packed is not None:
        plan = _plan(problem, packed, strong.bound_s)
        assert validate_multicast(state, plan) == ()
        assert plan.objective_s >= strong.bound_s * (1 - 1e-9)


def test_exact_never_worse_than_greedy_and_its_bound_only_grows() -> None:
    """The exact method keeps the better of the tree packing and the search, and its bound is
    at least the cut and max-flow bound."""
    state, spec, targets = one_slow_rank_case()
    greedy = plan_multicast(state, spec, targets=targets, tp=4, live=1)
    exact = plan_multicast(state, spec, targets=targets, tp=4, live=1, method="exact")
    assert exact.objective_s <= greedy.objective_s * (1 + 1e-9)
    assert exact.lower_bound_s >= greedy.lower_bound_s * (1 - 1e-9)
    assert (exact.status is SolveStatus.OPTIMAL) == (
        exact.objective_s <= exact.lower_bound_s * (1 + 1e-9)
    )


def test_validator_rejects_a_lane_off_its_named_route() -> None:
    """A lane whose flow enters its destination's host by another NIC than the route its
    holder, exit and destination name is refused (the bounds assume the named route)."""
    state, spec, targets = one_slow_rank_case()
    plan = plan_multicast(state, spec, targets=targets, tp=4, live=1)
    topo = state.topology
    k, lane = next((k, x) for k, x in enumerate(plan.lanes) if x.dst == "h1/gpu2")
    detour = topo.path_edges(lane.exit, "h1/gpu0") + topo.path_edges("h1/gpu0", lane.dst)
    flows = list(plan.flows)
    flows[lane.flow] = Flow(detour, flows[lane.flow].max_bytes_per_s, flows[lane.flow].name)
    bad = dataclasses.replace(plan, flows=tuple(flows))
    problems = validate_multicast(state, bad)
    assert any("leaves the route" in p for p in problems), (k, problems)


def test_phase_check_refuses_two_phases_on_one_link_at_once() -> None:
    """Two lanes that stream over one edge at the same time in different phases are refused
    (each phase's fair shares assume it has its links to itself); a store-and-forward baseline
    whose phases follow each other passes."""
    state, spec, targets = one_slow_rank_case()
    plan = plan_multicast(state, spec, targets=targets, tp=4, live=1)
    assert check_phases(plan) == []
    first, second = plan.lanes[0].flow, plan.lanes[1].flow
    flows, phases = list(plan.flows), list(plan.flow_phase)
    flows[second] = flows[first]  # both stream over the same links, from the start
    phases[second] = 1
    problems = check_phases(dataclasses.replace(plan, flows=tuple(flows), flow_phase=tuple(phases)))
    assert problems and "at the same time" in problems[0]
    staged = plan_multicast(state, spec, targets=targets, tp=4, method="one_by_one")
    assert validate_multicast(state, staged) == ()


def test_every_width_packing_is_never_worse_than_the_greedy_widths() -> None:
    """The exact method's packing tries every tree count per rank, ranked two ways; the greedy's
    tries a few counts of one ranking. Without a clock both price the same trees, so the former
    is never slower."""
    state, spec, targets = one_slow_rank_case()
    problem = tiny_problem(state, spec, targets=targets, tp=4, live=1)
    strong = overlay_bound(problem)
    assert strong is not None
    few = pack_trees(problem, strong.live_nodes, max_rounds=40)
    every = pack_trees(problem, strong.live_nodes, max_rounds=40, widths=None)
    assert few is not None and every is not None
    value = lambda built: max(built.ready_at_s.values())  # noqa: E731
    assert value(every) <= value(few) * (1 + 1e-12)
    plan = _plan(problem, every, strong.bound_s)
    assert validate_multicast(state, plan) == ()
    assert plan.objective_s >= strong.bound_s * (1 - 1e-9)


@pytest.mark.parametrize("index", range(1, len(tiny_cases()), 2))
def test_every_optimal_exact_plan_meets_an_independent_check(index: int) -> None:
    """An OPTIMAL exact plan sits on its reported bound; that bound is checked against what
    nothing in the exact method computes: 150 random plans anywhere in the plan space (none is
    faster than the OPTIMAL plan) and the cut bounds (never above the plan). A FEASIBLE one
    reports a bound below its objective."""
    state, spec, options = tiny_cases()[index]
    exact = plan_multicast(state, spec, method="exact", chunk_bytes=4 * MIB, **options)
    assert validate_multicast(state, exact) == ()
    problem = tiny_problem(state, spec, **options)
    assert exact.objective_s >= lower_bound(problem, "all_ready") * (1 - 1e-9)
    if exact.status is not SolveStatus.OPTIMAL:
        assert exact.lower_bound_s < exact.objective_s
        return
    assert exact.objective_s <= exact.lower_bound_s * (1 + 1e-9)
    rng = random.Random(1000 + index)
    for _ in range(150):
        built = random_plan(problem, rng)
        if built is not None:
            assert max(built.ready_at_s.values()) >= exact.objective_s * (1 - 1e-9)


def test_a_packing_tree_may_start_at_several_holders() -> None:
    """Two hosts, each with its own decode source and one new GPU: the stripes reach each new
    GPU from the source of its own host over NVLink (a forest), but for at most 5% of the shard
    over a NIC (the lag choice adds a NIC tree's 12.5 GB/s to NVLink's), within 5% of the
    overlay bound (one tree from one holder would cross a 12.5 GB/s NIC)."""
    spec = load_model(PROPERTY_MODEL)
    host = nvswitch_host(
        "h100", gpus=2, nic_bytes_per_s=NIC, host_to_gpu_bytes_per_s=NIC, dram_bytes=64 * GIB
    )
    state = ClusterState(build_cluster(host, hosts=2), models=[spec])
    for h in range(2):
        state.add_instance(spec, gpus=[f"h{h}/gpu1"], role="decode")
    targets = [["h0/gpu0"], ["h1/gpu0"]]
    problem = tiny_problem(state, spec, targets=targets, tp=1, live=0)
    strong = overlay_bound(problem)
    assert strong is not None
    packed = pack_trees(problem, strong.live_nodes, max_rounds=40, widths=None)
    assert packed is not None
    plan = _plan(problem, packed, strong.bound_s)
    assert validate_multicast(state, plan) == ()
    for gpu in ("h0/gpu0", "h1/gpu0"):  # holders: GPUs and host memory, named by their host
        own = [lane for lane in plan.lanes if lane.dst == gpu]
        inside = sum(lane.fraction for lane in own if lane.holder.split("/")[0] == gpu[:2])
        assert inside >= 0.95
    assert strong.bound_s <= plan.objective_s <= strong.bound_s * 1.05


def _cover_cases():
    """The tiny cases and random three-target clusters with live choices to make."""
    out = [(s, spec, o) for s, spec, o in tiny_cases() if o["live"]]
    rng = random.Random(23)
    spec = load_model(PROPERTY_MODEL)
    for _ in range(6):
        host = nvswitch_host(
            "h100", gpus=2, nic_bytes_per_s=NIC, host_to_gpu_bytes_per_s=NIC, dram_bytes=64 * GIB
        )
        state = ClusterState(build_cluster(host, hosts=4, hosts_per_leaf=2), models=[spec])
        state.add_instance(spec, gpus=["h0/gpu0"], role="decode")
        a, b = rng.sample([f"h{h}/gpu{g}" for h in range(4) for g in range(2)], 2)
        if a.split("/")[0] != b.split("/")[0]:
            state.add_background_flow(a, b, max_bytes_per_s=rng.choice([2, 5, 8]) * GBPS)
        targets = [["h1/gpu0"], ["h1/gpu1"], ["h2/gpu0"], ["h3/gpu1"]]
        out.append((state, spec, {"targets": targets, "tp": 1, "live": rng.randint(1, 3)}))
    return out


@pytest.mark.parametrize("index", range(len(_cover_cases())))
def test_overlay_programs_per_live_choice_equal_the_mixed_integer_program(index: int) -> None:
    """Independent check of the per-choice solve: the largest ``lam`` over the minimal live
    choices, each a linear program, equals the mixed-integer program's optimum (both with the
    same margin), with and without the linear relaxation first, and the live choice it reports
    is a minimal one that reaches it."""
    state, spec, options = _cover_cases()[index]
    problem = tiny_problem(state, spec, **options)
    built = overlay_lp._build(problem)
    assert built is not None
    program, lam, binaries = built
    need = overlay_lp._need(problem, binaries)
    assert need.covers
    mixed = overlay_solve._solve(program, lam, 30.0)
    assert mixed is not None
    for few in (0, len(need.covers)):  # the relaxation first, or every choice straight away
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(overlay_solve, "FEW_COVERS", few)
            each = overlay_solve.solve(program, lam, binaries, need, time.perf_counter() + 30)
        assert each is not None
        assert each.upper == pytest.approx(mixed[0], rel=1e-6)
        assert each.chosen in need.covers
        assert each.values.get(each.chosen, each.upper) == pytest.approx(each.upper, rel=1e-6)


def test_live_covers_are_the_minimal_sets_found_by_brute_force() -> None:
    """Against every subset: the minimal sets of target nodes holding ``live`` instances; None
    when there are more than COVER_LPS of them."""
    state, spec, options = _cover_cases()[-1]
    for live in range(1, 5):
        problem = tiny_problem(state, spec, **(options | {"live": live}))
        nodes = range(len(problem.targets))
        count = [sum(1 for i in problem.instances if i.node == j) for j in nodes]
        holds = [
            frozenset(s)
            for k in range(1, len(count) + 1)
            for s in itertools.combinations(nodes, k)
            if sum(count[j] for j in s) >= live
        ]
        minimal = [s for s in holds if not any(o < s for o in holds)]
        got = live_covers(problem, dict.fromkeys(nodes, 0))
        if len(minimal) > COVER_LPS:
            assert got is None
        else:
            assert got is not None and sorted(map(sorted, got)) == sorted(map(sorted, minimal))
