"""The cluster as ``plan()`` sees it at a moment of a run: instances, their queues and KV use.

Loading instances hold their GPUs but are no sources. A disaggregated run deals the prefill
relay's queued requests round-robin to the serving prefill instances (at most
:data:`SNAPSHOT_QUEUE` each; ``plan()`` reads them to pair live instances, the relay ignores its
pairs). A colocated replica's queue is its waiting prompts (and, while paired, its relay's):
``plan()`` sees colocated replicas as they are, weight sources whose NICs carry no KV cache,
and pairs each live new replica with the most loaded one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from blitzplan.cluster import ClusterState, QueuedRequest, Role
from blitzplan.models import ModelSpec
from blitzplan.sim.instances import NO_WORKER, SimInstance
from blitzplan.sim.prefill import PrefillTier
from blitzplan.topologies import Topology

__all__ = ["SNAPSHOT_QUEUE", "cluster_state", "dealt_queues"]

SNAPSHOT_QUEUE = 32
"""The most queued requests a snapshot shows per instance."""


def cluster_state(
    topology: Topology,
    model: ModelSpec,
    instances: Iterable[SimInstance],
    queues: Mapping[str, list[QueuedRequest]],
    *,
    host_copy: bool,
) -> ClusterState:
    """A ClusterState of ``instances`` (with ``queues`` by instance id) on ``topology``;
    ``host_copy`` False drops the model's host copy (it was lost)."""
    state = ClusterState(topology, models=[model])
    if not host_copy:
        state.pool.drop(model.identity)
    for inst in instances:
        role = Role.LOADING if inst.state == "loading" else Role(inst.role)
        state.add_instance(
            model,
            gpus=list(inst.gpus),
            role=role,
            queue=queues.get(inst.id, [])[:SNAPSHOT_QUEUE],
            kv_bytes_used=int(inst.kv_used),
            instance_id=inst.id,
        )
    return state


def dealt_queues(
    prefill: PrefillTier, serving: list[SimInstance], now_s: float
) -> dict[str, list[QueuedRequest]]:
    """The prefill relay's queued requests dealt round-robin to the serving prefill instances
    that are not loading live ones."""
    serving = [i for i in serving if i.new_worker == NO_WORKER]
    queues: dict[str, list[QueuedRequest]] = {i.id: [] for i in serving}
    relay, cap = prefill.relay, SNAPSHOT_QUEUE * len(serving)
    waiting = [r for b in list(relay.waiting)[:cap] for r in prefill.batches[b]]
    for k, request in enumerate(waiting[:cap]):
        queues[serving[k % len(serving)].id].append(
            QueuedRequest(request.arrival_s - now_s, request.prompt_tokens)
        )
    return queues
