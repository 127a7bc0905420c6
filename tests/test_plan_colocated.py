"""plan() with colocated instances (vLLM / SGLang replicas): weight sources, live partners,
released and added as asked, kept by replan, and seen by the simulator as they are."""

from __future__ import annotations

from blitzplan import ClusterState, Role, apply_plan, load_topology, replan
from blitzplan.scale import ScalePlan, ScaleRequest, plan, validate_plan
from blitzplan.sim.systems import make_system
from tests.program_check import check_program

MODEL = "llama-3-8b"


def _replicas(tokens: tuple[int, ...] = (1000, 3000, 2000)) -> ClusterState:
    """Colocated llama-3-8b replicas on h0, queues of 4 prompts of ``tokens`` each; no host
    copy: the replicas are the only holders."""
    state = ClusterState(load_topology("paper-a100-16"), models=[MODEL])
    for k, n in enumerate(tokens):
        state.add_instance(MODEL, gpus=[f"h0/gpu{k}"], role="colocated", queue=[(0.0, n)] * 4)
    state.pool.drop(state.instances[0].identity)
    return state


def test_colocated_replicas_are_sources_and_live_partners() -> None:
    """Replicas send weights without ``allow_prefill_sources`` (no KV leaves them for a decode
    instance); each live new replica pairs with an old one, the earliest live tail with the
    most loaded (i1, 3,000-token prompts); the program is byte-exact."""
    state = _replicas()
    made = plan(state, ScaleRequest(MODEL, colocated=4))
    assert made.missing == () and validate_plan(state, made) == ()
    assert check_program(made) == []
    assert {i.role for i in made.new_instances} == {"colocated"}
    assert {s.source for s in made.steps} <= {"h0/gpu0", "h0/gpu1", "h0/gpu2"} | {
        g for i in made.new_instances for g in i.gpus
    }
    assert {p.old for p in made.live_pairs} == {"i0", "i1", "i2"}
    assert sum(i.live for i in made.new_instances) == 3
    ready = made.multicast.layer_ready_s  # type: ignore[union-attr]
    first = min(made.live_pairs, key=lambda p: (ready[p.new][1], p.new))
    assert first.old == "i1"
    assert made.request["colocated"] == 4
    assert made.milestones.first_capacity_s == min(max(ready[p.new][:2]) for p in made.live_pairs)
    assert ScalePlan.from_json(made.to_json()) == made
    after = apply_plan(state, made, at_s=1e3)
    assert sum(i.role is Role.COLOCATED for i in after.instances) == 7


def test_removing_replicas_drains_the_least_loaded() -> None:
    made = plan(_replicas(), ScaleRequest(MODEL, colocated=-1))
    assert [(r.instance, r.role) for r in made.releases] == [("i0", "colocated")]
    assert made.new_instances == () and made.mutations == ()


def test_new_instances_pair_with_old_ones_of_their_role() -> None:
    """One model served both ways: a new prefill instance helps the prefill instance, a new
    colocated replica helps the colocated one (never across roles)."""
    state = ClusterState(load_topology("paper-a100-16"), models=[MODEL])
    state.add_instance(MODEL, gpus=["h0/gpu0"], role="prefill", queue=[(0.0, 1000)] * 4)
    state.add_instance(MODEL, gpus=["h0/gpu1"], role="decode")
    state.add_instance(MODEL, gpus=["h0/gpu2"], role="colocated", queue=[(0.0, 4000)] * 4)
    made = plan(state, ScaleRequest(MODEL, prefill=1, colocated=1))
    role = {i.name: i.role for i in made.new_instances}
    assert sorted(role.values()) == ["colocated", "prefill"]
    assert {(role[p.new], p.old) for p in made.live_pairs} == {
        ("prefill", "i0"),
        ("colocated", "i2"),
    }
    assert validate_plan(state, made) == ()


def test_replan_keeps_colocated_pairs() -> None:
    state = _replicas()
    made = plan(state, ScaleRequest(MODEL, colocated=4))
    unpaired = next(i.name for i in made.new_instances if not i.live)
    after = replan(made, state, at_s=0.01, failed=[unpaired])
    assert {(p.new, p.old) for p in after.live_pairs} == {(p.new, p.old) for p in made.live_pairs}
    assert {i.role for i in after.new_instances} == {"colocated"}


class _View:
    """The few things a system reads of a run (sim.systems.ClusterView), over a fixed state."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self.now_s = 0.0
        self.model = state.instances[0].model
        self.tp = 1
        self.topology_now = state.topology

    def snapshot(self, *, exclude: frozenset[str] = frozenset()) -> ClusterState:
        return self._state.copy()


def test_the_simulator_plans_colocated_replicas_as_they_are() -> None:
    """A colocated BlitzScale system asks plan() for colocated replicas on a snapshot whose
    replicas keep their role; each live launch carries the replica plan() paired it with."""
    system = make_system("blitzscale", colocated=True)
    action = system._blitz(_View(_replicas()), 2, 0)  # type: ignore[arg-type]
    assert action.plan is not None and action.plan.request["colocated"] == 2
    assert {launch.role for launch in action.launches} == {"colocated"}
    pairs = {p.new: p.old for p in action.plan.live_pairs}
    assert pairs and {la.name: la.pair for la in action.launches if la.live} == pairs


def test_a_mixed_fleet_plans_each_model_by_its_own_roles() -> None:
    """Two models on one cluster, llama-3-8b colocated and qwen2.5-7b disaggregated: planning
    the colocated model streams from its replicas only and pairs with them; planning the
    disaggregated one pairs with its prefill instance and never touches the replicas."""
    other = "qwen2.5-7b"
    state = _replicas()
    state.add_instance(other, gpus=["h1/gpu0"], role="prefill", queue=[(0.0, 2000)] * 4)
    state.add_instance(other, gpus=["h1/gpu1"], role="decode")
    made = plan(state, ScaleRequest(MODEL, colocated=2))
    replicas = {"h0/gpu0", "h0/gpu1", "h0/gpu2"}
    assert {p.old for p in made.live_pairs} <= {"i0", "i1", "i2"}
    assert {s.source for s in made.steps} - {g for i in made.new_instances for g in i.gpus} <= (
        replicas
    )
    assert validate_plan(state, made) == ()
    theirs = plan(state, ScaleRequest(other, prefill=1))
    assert [(p.old, theirs.new_instances[0].role) for p in theirs.live_pairs] == [("i3", "prefill")]
    assert not {s.source for s in theirs.steps} & replicas
