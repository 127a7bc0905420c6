"""Plans cut into time slices (several phases): why the certified bound has no per-hop chunk
term, and that the bound holds against such plans too."""

from __future__ import annotations

import pytest

from blitzplan import ClusterState, InvalidInputError, load_model
from blitzplan.multicast import validate_multicast
from blitzplan.multicast.bound.lower_bound import lower_bound
from blitzplan.multicast.bound.overlay_lp import OverlayBound, overlay_bound
from blitzplan.multicast.exact.phase_slices import phases_apart, slice_phases
from blitzplan.multicast.exact.slice_search import sliced_refinement
from blitzplan.multicast.exact.tree_packing import pack_trees
from blitzplan.multicast.planners.baselines import BASELINES
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built
from blitzplan.topologies import build_cluster, pcie_host
from blitzplan.units import GBPS, GIB, MIB
from tests.multicast_random import tiny_problem
from tests.test_multicast import PROPERTY_MODEL, tiny_cases
from tests.test_multicast_overlay import _plan

LINK = 25 * GBPS
CHUNK = 4 * MIB


def one_gpu_hosts(hosts: int):
    """``hosts`` one-GPU PCIe hosts, every NIC at ``LINK``, a decode source on h0."""
    spec = load_model(PROPERTY_MODEL)
    host = pcie_host(
        "a100-pcie",
        gpus=1,
        nic_bytes_per_s=LINK,
        host_to_gpu_bytes_per_s=LINK / 2,
        dram_bytes=64 * GIB,
        gpus_per_pcie_switch=1,
    )
    state = ClusterState(build_cluster(host, hosts=hosts), models=[spec])
    state.add_instance(spec, gpus=["h0/gpu0"], role="decode")
    return state, spec


def chain_case():
    """Three one-GPU hosts: a decode source on h0 (its NIC the only way out), new instances on
    h1 and h2, every NIC at ``LINK``. Any plan ready by ``S / LINK`` sends each byte out of h0
    once, so h1 forwards to h2 (or h2 to h1): a forced hop."""
    state, spec = one_gpu_hosts(3)
    problem = tiny_problem(
        state, spec, targets=[["h1/gpu0"], ["h2/gpu0"]], tp=1, live=0, chunk_bytes=CHUNK
    )
    return state, problem


def test_time_slices_beat_one_chunk_per_forced_hop() -> None:
    """The witness: a bound adding one chunk at the link rate per forced hop (the fill or drain
    of a pipeline) would not be a bound. The chain in one phase pays it; the same chain sent in
    64 slices, one phase each, is valid and ends within half a chunk time of the fluid bound,
    which every bound of the library stays under."""
    state, problem = chain_case()
    shard = sum(problem.unit_bytes)
    fluid = shard / LINK
    hop = CHUNK / LINK
    strong = overlay_bound(problem)
    assert strong is not None
    assert strong.bound_s == pytest.approx(fluid, rel=1e-4)
    assert lower_bound(problem, "all_ready") == pytest.approx(fluid, rel=1e-4)
    chain = BASELINES["ring"](problem)
    one = _plan(problem, chain, strong.bound_s)
    assert validate_multicast(state, one) == ()
    assert one.objective_s >= fluid + hop * (1 - 1e-6)
    sliced = _plan(problem, slice_phases(problem, chain, 64), strong.bound_s)
    assert validate_multicast(state, sliced) == ()
    assert len(set(sliced.flow_phase)) == 64
    assert sliced.objective_s >= max(strong.bound_s, lower_bound(problem, "all_ready"))
    assert sliced.objective_s < fluid + 0.5 * hop


def test_one_slice_is_the_plan_itself_and_bad_counts_are_refused() -> None:
    _, problem = chain_case()
    chain = BASELINES["ring"](problem)
    same = slice_phases(problem, chain, 1)
    assert same.ready_at_s == pytest.approx(chain.ready_at_s, rel=1e-12)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(InvalidInputError, match="phases"):
            slice_phases(problem, chain, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="one phase"):
        slice_phases(problem, slice_phases(problem, chain, 2), 2)


def _packed_case(index: int) -> tuple[ClusterState, Problem, OverlayBound, Built]:
    """Tiny case ``index``: its state, problem, overlay bound and the tree packing on the
    bound's live choice."""
    state, spec, options = tiny_cases()[index]
    problem = tiny_problem(state, spec, **options)
    strong = overlay_bound(problem)
    assert strong is not None
    packed = pack_trees(problem, strong.live_nodes, max_rounds=20)
    assert packed is not None
    return state, problem, strong, packed


def test_staggered_slices_follow_the_hop_depth() -> None:
    """Staggered, the chain's second hop (its sender one hop from the source) sends slice ``k``
    in phase ``k + 1``: ``m + 1`` phases, valid, and as fast as the plain slicing (its hops
    share no link, so neither waits for the other)."""
    state, problem = chain_case()
    chain = BASELINES["ring"](problem)
    plain = slice_phases(problem, chain, 8)
    staggered = slice_phases(problem, chain, 8, staggered=True)
    b = staggered.builder
    assert sorted(set(b.flow_phase)) == list(range(9))
    by_receiver: dict[int, set[int]] = {}
    for lane, phase in zip(b.lanes, b.flow_phase, strict=True):
        by_receiver.setdefault(lane.receiver, set()).add(phase)
    assert sorted(map(sorted, by_receiver.values())) == [list(range(8)), list(range(1, 9))]
    assert validate_multicast(state, _plan(problem, staggered, 0.0)) == ()
    assert max(staggered.ready_at_s.values()) == pytest.approx(
        max(plain.ready_at_s.values()), rel=1e-9
    )


@pytest.mark.parametrize("index", range(0, len(tiny_cases()), 2))
@pytest.mark.parametrize(("phases", "staggered"), [(2, False), (5, False), (3, True), (5, True)])
def test_sliced_packings_never_beat_the_bounds(index: int, phases: int, staggered: bool) -> None:
    """Every tiny case's tree packing cut into slices (plain or staggered by depth): the slices
    carry every byte once (the stripe and holdings checks pass), and a sliced plan that
    validates never beats the overlay bound or the cut bounds."""
    state, problem, strong, packed = _packed_case(index)
    bound = max(strong.bound_s, lower_bound(problem, "all_ready"))
    sliced = slice_phases(problem, packed, phases, staggered=staggered)
    plan = _plan(problem, sliced, bound)
    problems = validate_multicast(state, plan)
    assert all("at the same time" in p for p in problems), problems
    if not problems:
        assert plan.objective_s >= bound * (1 - 1e-9)


@pytest.mark.parametrize("index", range(1, len(tiny_cases()), 2))
def test_phases_apart_agrees_with_the_validator_and_refinement_never_loses(index: int) -> None:
    """The exact method's own check of the phase rule says apart exactly when the validator
    finds no phases meeting on a link (slicings of 2-9 phases, plain or staggered, with gathers
    that may meet); the refinement keeps a plan that validates and is never slower than the
    packing."""
    state, problem, strong, packed = _packed_case(index)
    for phases, staggered in ((2, False), (3, False), (9, False), (3, True), (9, True)):
        sliced = slice_phases(problem, packed, phases, staggered=staggered)
        meets = [p for p in validate_multicast(state, _plan(problem, sliced, 0.0)) if p]
        assert phases_apart(problem, sliced) == (not meets), meets
    best = sliced_refinement(problem, [packed], "all_ready", None)
    assert max(best.ready_at_s.values()) <= max(packed.ready_at_s.values())
    assert validate_multicast(state, _plan(problem, best, strong.bound_s)) == ()
    again = sliced_refinement(problem, [slice_phases(problem, packed, 2)], "all_ready", None)
    assert len(set(again.builder.flow_phase)) == 2  # several phases: returned as they are


def test_refinement_slices_every_candidate() -> None:
    """Given the chain's ring cut into 16 slices (the fastest plan given, but of several
    phases, so it is not cut further) and the ring itself, the refinement answers the ring's
    finer slicing: it slices every candidate, not only the fastest (which fails it), keeps the
    fastest, and its answer validates and never beats the bounds."""
    state, problem = chain_case()
    strong = overlay_bound(problem)
    assert strong is not None
    ring = BASELINES["ring"](problem)
    coarse = slice_phases(problem, ring, 16)
    assert max(coarse.ready_at_s.values()) < max(ring.ready_at_s.values())
    both = sliced_refinement(problem, [coarse, ring], "all_ready", None)
    alone = sliced_refinement(problem, [ring], "all_ready", None)
    value = max(both.ready_at_s.values())
    assert value < max(coarse.ready_at_s.values())
    assert value == pytest.approx(max(alone.ready_at_s.values()), rel=1e-12)
    assert sliced_refinement(problem, [coarse], "all_ready", None) is coarse
    bound = max(strong.bound_s, lower_bound(problem, "all_ready"))
    assert validate_multicast(state, _plan(problem, both, bound)) == ()
    assert value >= bound * (1 - 1e-9)
