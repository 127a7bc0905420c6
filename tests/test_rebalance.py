"""Rebalance in place: a request that changes roles moves no weights when a mutation does it."""

from __future__ import annotations

from collections import Counter

from blitzplan import ClusterState, apply_plan, load_topology
from blitzplan.scale import ScaleRequest, plan

MODEL = "llama-3-8b"


def _fleet(prefill: int = 3, decode: int = 1) -> ClusterState:
    """``prefill`` prefill instances (i0 holds the fewest KV bytes, i2 the most queued tokens)
    and ``decode`` decode instances of MODEL, TP1, on h0."""
    state = ClusterState(load_topology("paper-a100-16"), models=[MODEL])
    for k in range(prefill):
        queue = [(0.0, 1000 * (k + 1))] * 2
        state.add_instance(
            MODEL, gpus=[f"h0/gpu{k}"], role="prefill", queue=queue, kv_bytes_used=k * 10**8
        )
    for k in range(decode):
        state.add_instance(MODEL, gpus=[f"h0/gpu{prefill + k}"], role="decode")
    return state


def _roles(state: ClusterState) -> Counter[str]:
    return Counter(i.role.value for i in state.instances)


def test_prefill_minus_one_decode_plus_one_moves_no_weights() -> None:
    """The issue's reproducer: 3 prefill + 1 decode, ``prefill=-1, decode=1``: one prefill
    instance (the fewest KV bytes in use) becomes a decode instance in place; nothing is
    released, nothing loads, no byte moves; its queue moves to the least loaded prefill."""
    state = _fleet()
    made = plan(state, ScaleRequest(MODEL, prefill=-1, decode=1))
    assert made.steps == () and made.multicast is None and made.new_instances == ()
    assert sum(step.bytes for step in made.steps) == 0
    assert made.releases == () and made.missing == ()
    (mutation,) = made.mutations
    assert (mutation.instance, mutation.from_role, mutation.to_role) == ("i0", "prefill", "decode")
    assert mutation.replaced_by is None
    assert [where for _, where in mutation.moved] == ["i1", "i1"]
    after = apply_plan(state, made, at_s=10.0)
    assert _roles(after) == Counter(prefill=2, decode=2)
    assert after.instance("i0").role.value == "decode"


def test_what_is_left_of_the_request_releases_or_loads() -> None:
    """``prefill=-2, decode=1``: one role change, one release; ``prefill=-1, decode=2``: one
    role change, one decode by mutation replaced by a new prefill instance."""
    made = plan(_fleet(), ScaleRequest(MODEL, prefill=-2, decode=1))
    assert [m.instance for m in made.mutations] == ["i0"] and made.new_instances == ()
    assert [r.instance for r in made.releases] == ["i1"]  # the fewest queued tokens left
    state = _fleet()
    made = plan(state, ScaleRequest(MODEL, prefill=-1, decode=2))
    replaced = {m.instance: m.replaced_by for m in made.mutations}
    assert replaced == {"i1": "new0", "i0": None}
    assert [(i.name, i.role) for i in made.new_instances] == [("new0", "prefill")]
    assert made.releases == ()
    after = apply_plan(state, made, at_s=1e3)
    assert _roles(after) == Counter(prefill=2, decode=3)


def test_the_last_prefill_instance_never_changes_role() -> None:
    """Removing every prefill instance and adding as many decode ones: all but the last change
    role; the last is released (it finishes its queue) and one decode instance loads."""
    made = plan(_fleet(prefill=2, decode=0), ScaleRequest(MODEL, prefill=-2, decode=2))
    assert [m.instance for m in made.mutations] == ["i0"]
    assert [r.instance for r in made.releases] == ["i1"]
    assert [i.role for i in made.new_instances] == ["decode"]


def test_without_mutations_a_rebalance_releases_and_loads() -> None:
    made = plan(_fleet(), ScaleRequest(MODEL, prefill=-1, decode=1), mutate_decode=False)
    assert made.mutations == () and len(made.releases) == 1
    assert [i.role for i in made.new_instances] == ["decode"] and made.steps
