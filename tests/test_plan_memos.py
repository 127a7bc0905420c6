"""What plan() keeps between calls so a tight deadline is not spent on fixed costs: free slots
(per topology and busy set), solo drain times (per roofline and queue) and preset model specs.
Each is a pure function of its key: a change of the state gives a fresh answer, equal to the
answer computed with nothing kept."""

from __future__ import annotations

import copy

from blitzplan import ClusterState, load_topology
from blitzplan.cluster import QueuedRequest, clusterstate
from blitzplan.models import load_model
from blitzplan.scale import milestones


def _state() -> ClusterState:
    topology = copy.copy(load_topology("dgx-h100-64"))
    topology.memo = {}
    state = ClusterState(topology, models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h0/gpu0"], role="prefill", queue=[(0.0, 1024)])
    return state


def _uncached(state: ClusterState, tp: int) -> list[tuple[str, ...]]:
    spec = load_model("llama-3-8b")
    return clusterstate._free_slots(state.topology, state.busy_gpus(), tp, spec, "pack", set())


def test_free_slots_follow_every_change_of_the_busy_gpus() -> None:
    state = _state()
    spec = load_model("llama-3-8b")
    before = state.free_slots(2, model=spec)
    assert before == _uncached(state, 2) and ("h0/gpu0", "h0/gpu1") not in before
    assert state.free_slots(2, model=spec) == before  # kept: the same answer
    added = state.add_instance("llama-3-8b", gpus=["h3/gpu2", "h3/gpu3"], role="decode")
    after = state.free_slots(2, model=spec)
    assert ("h3/gpu2", "h3/gpu3") in before and ("h3/gpu2", "h3/gpu3") not in after
    assert after == _uncached(state, 2)
    state.remove_instance(added.id)
    assert state.free_slots(2, model=spec) == before
    other = ClusterState(state.topology, models=["llama-3-8b"])  # same topology, all free
    assert ("h0/gpu0", "h0/gpu1") in other.free_slots(2, model=spec)
    slots = state.free_slots(2, model=spec)
    slots.clear()  # a caller's list is its own
    assert state.free_slots(2, model=spec) == before


def test_solo_drain_times_follow_the_queue() -> None:
    state = _state()
    spec = load_model("llama-3-8b")
    old = state.instances[0]
    short = milestones.solo_drain_s(state, spec, old, list(old.queue), None)
    longer_queue = [*old.queue, QueuedRequest(0.0, 4096, "extra")]
    longer = milestones.solo_drain_s(state, spec, old, longer_queue, None)
    assert longer > short > 0
    milestones._DRAINS.clear()
    assert milestones.solo_drain_s(state, spec, old, list(old.queue), None) == short
    assert milestones.solo_drain_s(state, spec, old, longer_queue, None) == longer


def test_a_preset_spec_is_built_once_per_revision_and_dtype() -> None:
    assert load_model("llama-3-8b") is load_model("llama-3-8b")
    half = load_model("llama-3-8b", dtype_bytes=1)
    assert half.total_bytes * 2 == load_model("llama-3-8b").total_bytes
    assert load_model("llama-3-8b", revision="other").revision == "other"
