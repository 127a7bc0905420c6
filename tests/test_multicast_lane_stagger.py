"""Staggered slices offset by each lane's depth, not its sender's: a node fed both by the holder
and by a relay forwards each part in the phases its bytes arrive in."""

from __future__ import annotations

import pytest

import blitzplan.multicast.exact.slice_layout as layout_module
import blitzplan.multicast.exact.slice_search as slice_search
from blitzplan import ClusterState
from blitzplan.multicast import validate_multicast
from blitzplan.multicast.bound.lower_bound import lower_bound
from blitzplan.multicast.exact import slice_fit
from blitzplan.multicast.exact.phase_slices import phases_apart, slice_phases
from blitzplan.multicast.exact.slice_fit import FINE_SLICES
from blitzplan.multicast.exact.slice_layout import (
    BY_LANE,
    BY_SENDER,
    _atom_cuts,
    slice_layout,
    staggering,
)
from blitzplan.multicast.exact.slice_search import SliceSearch, sliced_refinement
from blitzplan.multicast.exact.slice_timing import sliced_ready
from blitzplan.multicast.planners.baselines import BASELINES
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, base_builder, run, score
from tests.multicast_random import tiny_problem
from tests.test_multicast_overlay import _plan
from tests.test_multicast_phase_slices import CHUNK, LINK, chain_case, one_gpu_hosts

SLICES = 16


def mixed_case() -> tuple[ClusterState, Problem, Built]:
    """Five one-GPU hosts, every NIC at ``LINK``; a decode source on h0, new instances on
    h1-h4. The plan (one phase, every lane at ``LINK / 2``, no NIC over ``LINK`` either way, so
    its fluid time is ``S / LINK``): the first half goes h0 -> h1 -> h4 -> h2 -> h3, the second
    h0 -> h2 -> h3 -> h1 -> h4. h2 holds the second half straight from the holder and the first
    three lanes from it, so its lanes to h3 are of two depths (as the relays of case 193 of
    the benchmark), and h1 forwards both halves, at depths 1 and 3."""
    state, spec = one_gpu_hosts(5)
    problem = tiny_problem(
        state,
        spec,
        targets=[["h1/gpu0"], ["h2/gpu0"], ["h3/gpu0"], ["h4/gpu0"]],
        tp=1,
        live=0,
        chunk_bytes=CHUNK,
    )
    builder = base_builder(problem)
    node = {"h0": 0}
    for j, target in enumerate(problem.targets):
        node[target.gpus[0].split("/")[0]] = len(problem.sources) + j
    for a, b, lo, hi in (
        ("h0", "h1", 0.0, 0.5),
        ("h1", "h4", 0.0, 0.5),
        ("h4", "h2", 0.0, 0.5),
        ("h2", "h3", 0.0, 0.5),
        ("h0", "h2", 0.5, 1.0),
        ("h2", "h3", 0.5, 1.0),
        ("h3", "h1", 0.5, 1.0),
        ("h1", "h4", 0.5, 1.0),
    ):
        hop = builder.hop(node[a], node[b])
        gpu, dst = f"{a}/gpu0", f"{b}/gpu0"
        builder.add_lane(hop, gpu, gpu, dst, 0, lo, hi, pace_bytes_per_s=LINK / 2)
    return state, problem, run(problem, builder, ())


def _value(built: Built) -> float:
    return score("all_ready", built.ready_at_s, built.live)


def test_a_relay_fed_at_two_depths_forwards_each_part_when_it_arrives() -> None:
    """The mixed case sliced 16 times, staggered by lane depth: faster than the plan in one
    phase, than its plain slicing and than the staggering by sender (the one before it; timed
    from its pattern), its pattern's times are the built plan's, its phases stay apart, it
    validates and it stays above the certified bound."""
    state, problem, one = mixed_case()
    shard = sum(problem.unit_bytes)
    fluid = shard / LINK
    bound = lower_bound(problem, "all_ready")
    assert bound == pytest.approx(fluid, rel=1e-3)
    assert _value(one) > fluid * 1.1  # the last unit's stripe per forwarding hop
    groups, group_of, offsets, sharing = slice_layout(one, BY_LANE)
    lanes = one.builder.lanes
    into_h3 = [group_of[lane.flow] for lane in lanes if lane.dst == "h3/gpu0"]
    assert sorted(offsets[g] for g in into_h3) == [1, 3]  # one group per depth of h2 -> h3
    assert slice_layout(one, BY_SENDER)[2] == [0, 1, 2, 1, 0, 2]  # one group per hop
    assert groups[into_h3[0]] == groups[into_h3[1]]
    assert sharing[into_h3[0]] == sharing[into_h3[1]]  # they wait for the same hops
    assert offsets[group_of[lanes[-1].flow]] == 3  # h1 -> h4: what h0 -> h2 -> h3 -> h1 did
    staggered = slice_phases(problem, one, SLICES, staggered=True)
    plain = slice_phases(problem, one, SLICES)
    cuts = _atom_cuts(lanes, problem.tp)
    old = sliced_ready(problem, one, SLICES, slice_layout(one, BY_SENDER), cuts)
    pattern = sliced_ready(problem, one, SLICES, slice_layout(one, BY_LANE), cuts)
    assert pattern is not None and old is not None
    for name, at in staggered.ready_at_s.items():
        assert pattern.ready_at_s[name] == pytest.approx(at, rel=1e-9)
    value = _value(staggered)
    assert value < _value(one) and value < _value(plain)
    assert value < max(old.ready_at_s.values()) / 1.3  # 1.48x measured
    assert phases_apart(problem, staggered)
    plan = _plan(problem, staggered, bound)
    assert validate_multicast(state, plan) == ()
    assert plan.objective_s >= bound
    assert len(set(plan.flow_phase)) == SLICES + 3  # slices, then three more offsets


def test_the_slice_search_picks_the_lane_staggered_slicing_on_the_mixed_case() -> None:
    """Without a clock the slice search times every slicing of the mixed case (both
    staggerings) and keeps the fastest: never slower than the staggered 16 above."""
    _, problem, one = mixed_case()
    best = sliced_refinement(problem, [one], "all_ready", None)
    assert _value(best) <= _value(slice_phases(problem, one, SLICES, staggered=True)) * (1 + 1e-9)
    assert len(set(best.builder.flow_phase)) > 1


def test_staggering_by_sender_is_kept_where_no_lane_precedes_its_feeder() -> None:
    """The slice search staggers by lane depth only where a lane would be in an earlier phase
    than one of its feeders by sender: the mixed case (h2 -> h3 carries bytes three lanes
    deep), not the chain, whose offsets are equal either way."""
    _, _, one = mixed_case()
    assert staggering(one) == BY_LANE
    _, problem = chain_case()
    ring = BASELINES["ring"](problem)
    assert staggering(ring) == BY_SENDER
    assert slice_layout(ring, BY_SENDER)[2] == slice_layout(ring, BY_LANE)[2]


def test_the_staggering_past_the_smallest_count_is_the_faster_timed(monkeypatch) -> None:
    """With the chooser's pick made the slower one (by sender, 1.48x slower on the mixed
    case), the search still times both staggerings at 64 slices and slices the plan past 64
    (and at 512: two atoms a lane) only by the faster, lane depth; so its answer is as fast as
    that staggering's 16 slices. A plan whose 512 slices have more lanes than
    ``FINE_MAX_LANES`` gets no 512."""
    _, problem, one = mixed_case()
    monkeypatch.setattr(layout_module, "staggering", lambda built: BY_SENDER)
    search = SliceSearch(problem, "all_ready")
    search.time([one], None)
    at = {(m, by): v for v, m, by, _ in search.timed}
    assert at[64, BY_LANE] < at[64, BY_SENDER]
    past = {(m, by) for m, by in at if m > 64}
    assert past == {(128, BY_LANE), (256, BY_LANE), (FINE_SLICES, BY_LANE)}
    best = search.best([one], None)
    assert _value(best) <= _value(slice_phases(problem, one, SLICES, staggered=True)) * (1 + 1e-9)
    monkeypatch.setattr(slice_search, "FINE_MAX_LANES", 0)
    few = SliceSearch(problem, "all_ready")
    few.time([one], None)
    assert all(m < FINE_SLICES for _, m, _, _ in few.timed)


def test_fine_slices_are_timed_only_while_no_slicing_is_within_fine_above_of_the_bound() -> None:
    """``SliceSearch(bound_s=)``: 512 slices (:data:`FINE_SLICES`) only while the fastest plan
    or slicing timed is more than ``FINE_ABOVE`` above the bound: with a bound just under the
    plan's 256-slice time (0.5% under) no 512 is timed, with one 2% under (and none, as
    before) it is, and its 512 slicing is faster than its 256 (so the gate costs time for
    something: the mixed case's lane depths slice finer)."""
    _, problem, one = mixed_case()
    free = SliceSearch(problem, "all_ready")
    free.time([one], None)
    at = {(m, by): v for v, m, by, _ in free.timed}
    assert (FINE_SLICES, BY_LANE) in at
    assert at[FINE_SLICES, BY_LANE] < at[256, BY_LANE]
    fastest_at_256 = min(v for (m, _), v in at.items() if m <= 256)
    assert slice_fit.FINE_ABOVE == 0.01
    for below, fine in ((1.005, False), (1.02, True)):
        search = SliceSearch(problem, "all_ready", bound_s=fastest_at_256 / below)
        search.time([one], None)
        assert any(m > 256 for _, m, _, _ in search.timed) is fine
        assert {k: v for k, v in at.items() if k[0] <= 256} == {
            (m, by): v for v, m, by, _ in search.timed if m <= 256
        }


def test_the_fine_count_is_the_fewest_its_coarse_slicings_predict_near_the_bound() -> None:
    """With a bound given, a plan's fine slices are the fewest (a multiple of FINE_STEP) that
    its 128 and 256 slices predict within FINE_AIM of it (``v(m) = F + E / m``), not always
    FINE_SLICES: a bound that the fit puts at 400 slices gets 416, and the slicing timed there
    lies between the 256 and the 512 (case 193: 352 slices for 512, 230 k lanes for 335 k)."""
    _, problem, one = mixed_case()
    free = SliceSearch(problem, "all_ready")
    free.time([one], None)
    at = {(m, by): v for v, m, by, _ in free.timed}
    excess = (at[128, BY_LANE] - at[256, BY_LANE]) * 256
    flow = at[256, BY_LANE] - excess / 256
    bound = (flow + excess / 400) / (1 + slice_fit.FINE_AIM)
    assert bound < at[256, BY_LANE] / (1 + slice_fit.FINE_ABOVE)  # fine slices wanted
    search = SliceSearch(problem, "all_ready", bound_s=bound)
    search.time([one], None)
    fine = {m: v for v, m, by, _ in search.timed if m > 256}
    assert set(fine) == {416}
    assert at[FINE_SLICES, BY_LANE] <= fine[416] <= at[256, BY_LANE]
