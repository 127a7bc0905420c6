"""The data of a multicast plan: nodes, hops and their lanes, chains, and the timeline.

A *node* is a set of GPUs that acts as one sender or receiver: a source instance (plus the spare
GPUs of its NVLink group whose NICs it stripes over), the host-DRAM copy, or a group of new
instances inside one NVLink group. A *hop* moves every unit of the model from one node to another
over *lanes*, one flow per receiving GPU; a receiving GPU of a node holding ``m`` new instances
gets ``1/m`` of its shard over the network and the rest from its ``m - 1`` peers over NVLink (the
node's *all-gather*, a ring: one lane per GPU). Plans are frozen; :func:`validate_multicast` checks
any of them against the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from blitzplan.models import ModelIdentity
from blitzplan.solvers import SolveStatus
from blitzplan.topologies import Flow

__all__ = [
    "AllGather",
    "Chain",
    "Hop",
    "Lane",
    "MulticastPlan",
    "NewInstance",
    "NodeKind",
    "PlanNode",
]


class NodeKind(StrEnum):
    """What a plan node is."""

    INSTANCE = "instance"
    """A serving instance of the same model identity (a source)."""
    HOST = "host"
    """The cluster's one host-DRAM copy (a source)."""
    CACHE = "cache"
    """A copy the AllCache / ServerlessLLM baselines assume on every host (DRAM or SSD)."""
    STAGE = "stage"
    """Host DRAM a baseline stages the model in before copying it to GPUs."""
    TARGET = "target"
    """New instances inside one NVLink group."""


@dataclass(frozen=True)
class PlanNode:
    """One sender or receiver.

    ``gpus`` are the node's GPUs (targets: the new instances' GPUs in instance order; instance
    sources: the instance's GPUs). ``memory`` is the host-memory or SSD node of memory kinds.
    ``egress`` lists ``(holder, exit)`` pairs the node sends through: ``holder`` has the bytes,
    ``exit`` is the GPU (its NIC) or host NIC they leave by; ``holder == exit`` when no relay.
    ``stripes`` is how many new instances share the node (each GPU receives ``1/stripes`` of its
    shard over the network); ``tp`` the instances' TP degree.
    """

    id: int
    kind: NodeKind
    label: str
    gpus: tuple[str, ...] = ()
    memory: str | None = None
    egress: tuple[tuple[str, str], ...] = ()
    instance_id: str | None = None
    stripes: int = 1
    tp: int = 1
    present: tuple[bool, ...] = ()
    """Units already complete on every GPU of the node before this plan (a replan reuses them);
    empty when none are."""

    def has(self, unit: int) -> bool:
        return bool(self.present) and self.present[unit]

    @property
    def host_local_nodes(self) -> tuple[str, ...]:
        return self.gpus if self.gpus else ((self.memory,) if self.memory else ())


@dataclass(frozen=True)
class NewInstance:
    """A new instance the plan loads: its GPUs (TP ranks in order) and its node."""

    name: str
    gpus: tuple[str, ...]
    node: int
    startup_s: float = 0.0


@dataclass(frozen=True)
class Lane:
    """One flow of a hop or all-gather: ``fraction`` of the receiver's per-unit bytes."""

    flow: int
    holder: str
    exit: str
    dst: str
    fraction: float
    stripe: int = 0


@dataclass(frozen=True)
class Hop:
    """Every unit moving from node ``sender`` to node ``receiver`` over ``lanes``.

    Hops of one ``phase`` run at once and share links; ``pipelined`` hops forward each unit as it
    arrives (chains), others only once the sender holds the whole model (store and forward).
    ``after`` lists hops that must finish before this one starts (a sender sending in turn).
    """

    sender: int
    receiver: int
    lanes: tuple[Lane, ...]
    phase: int = 0
    pipelined: bool = True
    after: tuple[int, ...] = ()


@dataclass(frozen=True)
class AllGather:
    """The NVLink ring that completes the shards of a striped target node."""

    node: int
    lanes: tuple[Lane, ...]
    phase: int = 0


@dataclass(frozen=True)
class Chain:
    """A source node and the target nodes it feeds, in forwarding order."""

    source: int
    nodes: tuple[int, ...]


@dataclass(frozen=True)
class MulticastPlan:
    """Where a model's weights come from, how they flow, and when each unit lands.

    ``unit_bytes`` are one GPU's shard bytes per unit (embedding, layers 1..L, head).
    ``flows`` are the plan's flows (lanes of hops, then of all-gathers), ``flow_phase`` their
    phases and ``rates`` their max-min fair rates given the phase's flows and ``background``.
    ``arrival_s[h][u]`` is when unit ``u`` has fully arrived over hop ``h``;
    ``layer_ready_s[name][u]`` when it is complete on every GPU of new instance ``name``.
    ``objective_s`` is the value of ``objective``; ``lower_bound_s`` a certified lower bound on it
    for any plan under the same model; ``gap`` is ``(objective_s - lower_bound_s) / objective_s``
    for heuristics and exact-search gaps alike. ``status`` is OPTIMAL only when proven.
    """

    model: ModelIdentity
    method: str
    objective: str
    status: SolveStatus
    objective_s: float
    lower_bound_s: float
    solve_s: float
    unit_bytes: tuple[int, ...]
    chunk_bytes: int
    nodes: tuple[PlanNode, ...]
    instances: tuple[NewInstance, ...]
    chains: tuple[Chain, ...]
    hops: tuple[Hop, ...]
    allgathers: tuple[AllGather, ...]
    flows: tuple[Flow, ...]
    flow_phase: tuple[int, ...]
    rates: tuple[float, ...]
    background: tuple[Flow, ...]
    arrival_s: tuple[tuple[float, ...], ...]
    layer_ready_s: Mapping[str, tuple[float, ...]]
    ready_at_s: Mapping[str, float]
    live: tuple[str, ...] = ()
    allow_prefill_sources: bool = False
    delivered: Mapping[str, tuple[bool, ...]] = field(default_factory=dict)
    """Per new instance, the units an earlier plan already delivered (ready at time 0 here)."""

    @property
    def gap(self) -> float:
        if self.objective_s <= 0:
            return 0.0
        return max(0.0, (self.objective_s - self.lower_bound_s) / self.objective_s)

    @property
    def all_ready_s(self) -> float:
        return max(self.ready_at_s.values())

    def instance(self, name: str) -> NewInstance:
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise KeyError(name)
