"""Failures: what replan() does with each kind, the fault campaign, and bounds on replans."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blitzplan import ClusterState, InfeasibleError, InvalidInputError, load_topology
from blitzplan.multicast import plan_multicast, validate_multicast
from blitzplan.multicast.bound.lower_bound import lower_bound
from blitzplan.scale import ScaleRequest, plan, replan
from blitzplan.scale.recovery import degrade, recover
from blitzplan.solvers import SolveStatus
from blitzplan.units import MIB
from tests.fault_campaign import SCENARIOS, base_plan, check, random_case, run_case
from tests.multicast_random import finished, random_plan, tiny_problem
from tests.test_multicast import tiny_cases


def scenario(prefix: str):
    return next(s for s in SCENARIOS if s.name.startswith(prefix))


def replan_case(prefix: str, failed: list[object], fraction: float):
    """Replan a campaign scenario's plan after ``failed`` at ``fraction`` of its load; the
    independent checker must find nothing wrong."""
    sc = scenario(prefix)
    base, state = base_plan(sc), sc.build()
    at = fraction * base.milestones.full_capacity_s
    after = replan(base, state, at_s=at, failed=failed)  # type: ignore[arg-type]
    assert check(base, state, failed, at, after) == []
    return base, state, at, after


# --- the semantics, one failure kind at a time ----------------------------------------------


def test_a_failed_instance_is_its_process_its_gpus_stay_free() -> None:
    base, state, at, _after = replan_case("dgx h100 8B", ["new6"], 0.34)
    recovery = recover(base, state, at_s=at, failed=["new6"])
    assert "new6" not in {s.name for s in recovery.survivors}
    assert any("new6's process failed" in line for line in recovery.lost)
    assert "h1/gpu6" in recovery.state.topology.gpus()  # the GPU survives: it may relay again
    assert "h1/gpu6" in recovery.state.free_gpus()


def test_a_failed_gpu_takes_its_instance_and_is_gone() -> None:
    base, state, at, after = replan_case("dgx h100 8B", ["h1/gpu6"], 0.5)
    recovery = recover(base, state, at_s=at, failed=["h1/gpu6"])
    assert "h1/gpu6" not in recovery.state.topology.gpus()
    assert any("new6 lost with its GPUs ['h1/gpu6']" in line for line in recovery.lost)
    assert "new6" not in {i.name for i in after.new_instances}


def test_a_dead_nvswitch_loses_tensor_parallel_instances_only() -> None:
    sc = scenario("paper a800 24B tp2,")
    base, state = base_plan(sc), sc.build()
    recovery = recover(base, state, at_s=0.0, failed=["h0/nvswitch"])
    ids = {i.id for i in recovery.state.instances}
    assert not ids & {i.id for i in state.instances}  # every source was TP2 on host 0
    assert sum("lost their NVSwitch" in line for line in recovery.removed) == len(state.instances)
    assert all(
        recovery.state.topology.graph.nodes[g].get("nvlink_group") is None
        for g in recovery.state.topology.gpus()
        if g.startswith("h0/")
    )
    one = scenario("h200 one host")
    recovery = recover(base_plan(one), one.build(), at_s=0.0, failed=["h0/nvswitch"])
    assert {i.id for i in recovery.state.instances} == {i.id for i in one.build().instances}


def test_host_memory_failure_drops_the_host_copy_only() -> None:
    sc = scenario("dgx host copy only")
    base, state = base_plan(sc), sc.build()
    copies = {c.node for c in state.pool.host_copies}
    memory = next(iter(copies))
    recovery = recover(base, state, at_s=0.0, failed=[memory])
    assert memory in recovery.state.topology.graph  # the node stays (it is no transit anyway)
    assert memory not in {c.node for c in recovery.state.pool.host_copies}
    with pytest.raises(InfeasibleError, match="held only by prefill instances"):
        replan(base, state, at_s=0.0, failed=[memory])  # what is left may not send


def test_a_nic_failure_reroutes_through_another_nic_of_the_host() -> None:
    topology = load_topology("dgx-h100-64")
    degraded, lost = degrade(topology, {"h1/nic3"}, set())
    assert lost == set()
    assert degraded.nic_of("h1/gpu3") != "h1/nic3"
    assert degraded.nic_of("h1/gpu3").startswith("h1/nic")
    replan_case("dgx h100 8B", ["h1/nic3"], 0.2)


def test_a_leaf_failure_on_one_host_finishes_over_nvlink() -> None:
    """Regression: the fill's time ceiling ignored what a local sender can send in all, so three
    targets fed only over NVLink were declared unreachable."""
    _, _, _, after = replan_case("h200 one host", ["leaf0"], 0.0)
    assert after.missing == ()
    assert {i.name for i in after.new_instances} == {"new0", "new1", "new2"}


def test_a_dead_spine_splits_rails_and_the_plan_stays_on_them() -> None:
    replan_case("dgx h100 8B", ["spine", ("h3/pcie4", "h3/gpu4")], 0.0)


def test_stranded_survivors_are_named_and_strict_refuses() -> None:
    sc = scenario("paper a800 24B tp2,")
    base, state = base_plan(sc), sc.build()
    with pytest.raises(InfeasibleError, match="no holder of the weights reaches new0"):
        replan(base, state, at_s=0.1, failed=["leaf0"])  # every survivor stranded: an error
    six = scenario("paper a800 24B tp2")
    base, state = base_plan(six), six.build()
    assert {i.name for i in base.new_instances if i.gpus[0].startswith("h2/")} == {"new4", "new5"}
    topo = state.topology
    cut = [(nic, "leaf0") for nic in topo.nics_of_host("h1")]  # host 1 loses the fabric
    after = replan(base, state, at_s=0.0, failed=cut)
    assert {i.name for i in after.new_instances} == {"new4", "new5"}
    assert [m.split(" cannot be finished: ")[0] for m in after.missing] == [
        "new0",
        "new1",
        "new2",
        "new3",
    ]
    assert all("no holder of the weights reaches" in m for m in after.missing)
    strict = dataclasses.replace(base.options, strict=True)
    with pytest.raises(InfeasibleError, match="new0 cannot be finished"):
        replan(base, state, at_s=0.0, failed=cut, options=strict)


def test_roles_live_status_and_options_carry_over() -> None:
    sc = scenario("paper a800 24B tp2,")
    base, state = base_plan(sc), sc.build()
    assert base.options.startup_s == 2.0 and base.options.allow_prefill_sources
    at = 0.5 * base.milestones.full_capacity_s
    after = replan(base, state, at_s=at, failed=["h1/gpu7"])
    assert after.options == base.options
    before = {i.name: i for i in base.new_instances}
    for info in after.new_instances:
        assert info.role == before[info.name].role
        assert info.live == before[info.name].live
    kept = {p.new: p.old for p in base.live_pairs}
    for pair in after.live_pairs:
        if pair.new in kept:
            assert pair.old == kept[pair.new]  # an unrelated failure moves no pair


def test_failures_are_validated() -> None:
    sc = scenario("h200 one host")
    base, state = base_plan(sc), sc.build()
    with pytest.raises(InvalidInputError, match="failed must be a collection"):
        replan(base, state, at_s=0.0, failed="h0")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="failed names 3"):
        replan(base, state, at_s=0.0, failed=[3])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="not in the topology"):
        replan(base, state, at_s=0.0, failed=[("h0/gpu0", "h0/gpu1")])
    with pytest.raises(InvalidInputError, match="at_s must be a finite time"):
        replan(base, state, at_s=float("nan"))


def test_a_baseline_that_cannot_run_is_left_out_of_the_milestones() -> None:
    _, _, _, after = replan_case("h200 one host", ["h0/rc"], 0.0)
    assert "allcache" not in after.milestones.baselines  # DRAM cannot reach the GPUs any more


# --- the campaign -----------------------------------------------------------------------------


@settings(max_examples=150)
@given(st.integers(0, 2**32 - 1))
def test_property_every_failure_replans_validly_or_says_why(seed: int) -> None:
    """Property: for random scenarios, one or two failures of any kind and any time (before,
    during, after the load), replan() never crashes; it either names what is stranded in a
    clear error or returns a plan the independent checker accepts (valid on what survives, no
    failed part touched, nothing resent, roles, live status and options kept, every survivor
    planned or named, OPTIMAL only on its bound)."""
    sc, failures, fraction = random_case(random.Random(seed))
    outcome = run_case(sc, failures, fraction, time_fresh=False)
    assert outcome.kind != "crash", outcome.problems
    assert outcome.problems == (), (sc.name, failures, fraction, outcome.problems)


# --- bounds on replans --------------------------------------------------------------------------


def delivered_cases() -> list[tuple[ClusterState, object, dict]]:
    """The tiny cases with units already delivered to some targets (what a replan plans)."""
    rng = random.Random(11)
    out = []
    for state, spec, options in tiny_cases():
        units = spec.num_units  # type: ignore[attr-defined]
        delivered = {
            f"t{k}": tuple(rng.random() < 0.5 for _ in range(units))
            for k in range(len(options["targets"]))
            if rng.random() < 0.7
        }
        names = [f"t{k}" for k in range(len(options["targets"]))]
        out.append((state, spec, {**options, "names": names, "delivered": delivered}))
    return out


@pytest.mark.parametrize("index", range(0, len(tiny_cases()), 2))
def test_bound_holds_on_replans_with_units_delivered(index: int) -> None:
    """Replans start with units already on some new instances, which may forward them: 100
    random plans per tiny case with such units are valid and none beats the bound; exact is
    OPTIMAL only on it."""
    state, spec, options = delivered_cases()[index]
    problem = tiny_problem(state, spec, **options)
    bound = lower_bound(problem, "all_ready")
    rng = random.Random(index)
    for _ in range(100):
        built = random_plan(problem, rng)
        if built is None:
            continue
        made = finished(problem, built, bound)
        assert validate_multicast(state, made) == ()
        assert made.objective_s >= bound * (1 - 1e-9)
    exact = plan_multicast(state, spec, method="exact", chunk_bytes=4 * MIB, **options)  # type: ignore[arg-type]
    assert exact.lower_bound_s <= exact.objective_s * (1 + 1e-9)
    met = exact.objective_s <= exact.lower_bound_s * (1 + 1e-9)
    assert (exact.status is SolveStatus.OPTIMAL) == met


def test_plan_with_prefill_sources_and_baselines_on() -> None:
    sc = scenario("paper a800 24B tp2,")
    made = plan(
        sc.build(),
        ScaleRequest("mistral-small-24b", prefill=4, tp=2),
        allow_prefill_sources=True,
        compare_baselines=True,
    )
    assert set(made.milestones.baselines) == {"allcache", "serverlessllm"}
