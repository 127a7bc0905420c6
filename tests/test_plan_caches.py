"""The planner's hot-path caches answer as a fresh computation would: per topology (a failure
makes a new, degraded one), per call, or of a pure function; never an earlier call's answer."""

from __future__ import annotations

import itertools

from blitzplan import ClusterState, load_topology
from blitzplan.multicast.allocation.stripes import _routable
from blitzplan.multicast.setup.holdings import held_interval, holder_segments
from blitzplan.scale import ScaleRequest, plan, replan
from blitzplan.scale.delivered import held_bytes, union


def test_routable_is_kept_per_topology_and_a_failure_sees_its_own() -> None:
    topo = load_topology("paper-a800-32")
    gpu, dst = "h0/gpu0", "h1/gpu0"
    nic = topo.nic_of(gpu)
    assert _routable(topo, gpu, nic, dst)  # cached on the healthy topology
    degraded = topo.without(links=[(nic, topo.leaf_of_nic(nic))])
    assert not _routable(degraded, gpu, nic, dst)  # the NIC lost its leaf: no route by it
    assert _routable(topo, gpu, nic, dst)  # the healthy topology's answer is unchanged


def test_holder_segments_cached_equal_a_fresh_computation() -> None:
    for source_tp, target_tp in itertools.product((1, 2, 3, 4, 8), repeat=2):
        for rank in range(target_tp):
            fresh = sorted(
                (*held, q)
                for q in range(source_tp)
                if (held := held_interval(q, source_tp, rank, target_tp)) is not None
            )
            cached = holder_segments(source_tp, rank, target_tp)
            assert isinstance(cached, tuple)  # immutable: no caller can change the cached one
            assert list(cached) == fresh == list(holder_segments(source_tp, rank, target_tp))


def test_held_bytes_shares_no_list_between_gpus() -> None:
    stripes = ((0.0, 0.25), (0.5, 0.75))
    got = held_bytes({"a": {0: stripes}, "b": {0: stripes}}, [1000])
    assert got["a"][0] == got["b"][0] == union([(0, 250), (500, 750)])
    got["a"][0].append((900, 1000))  # a caller extending one GPU's ranges
    assert got["b"][0] == [(0, 250), (500, 750)]
    assert held_bytes({"c": {0: stripes}}, [1000])["c"][0] == [(0, 250), (500, 750)]


def test_steps_name_the_nic_of_their_route_after_a_nic_fails() -> None:
    """The program keeps each route's sending NIC on the topology: after a NIC failure the
    replan runs on a degraded topology, and every step still names the first NIC of its own
    route (recomputed here), never the dead one."""
    topo = load_topology("paper-a800-32")
    state = ClusterState(topo, models=["llama-3-8b"])
    for gpu in ("h0/gpu0", "h1/gpu0"):
        state.add_instance("llama-3-8b", gpus=[gpu], role="decode")
    first = plan(state, ScaleRequest("llama-3-8b", prefill=4, tp=1))
    dead = next(s.nic for s in first.steps if s.nic is not None)
    again = replan(first, state, at_s=0.0, failed=[dead])
    assert again.multicast is not None and again.steps
    for step in again.steps:
        edges = again.multicast.flows[step.id].edges
        route = [edges[0][0], *(v for _, v in edges)]
        assert dead not in route
        assert step.nic == next((n for n in route if topo.kind(n) == "nic"), None)
