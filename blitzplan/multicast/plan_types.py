"""The data of a multicast plan: nodes, lanes grouped into hops and all-gathers, and the timeline.

The plan space (DESIGN.md sections 1.2-1.4):

* A new instance of tensor-parallel degree ``tp`` needs, for every unit (embedding, layers 1..L,
  head), the shard of each of its ``tp`` ranks. Bytes are named by **stripe coordinates**: for
  rank ``r``, the interval ``[lo, hi)`` of ``[0, 1)`` is that fraction of the rank's shard of
  *every* unit the lane carries, cut along each tensor's TP split dimension (heads, KV heads,
  intermediate columns, vocabulary rows; replicated tensors such as norms by rows), so a source of
  another TP degree holds a contiguous interval of it (see
  :mod:`blitzplan.multicast.setup.holdings`).
* A *node* is a set of GPUs that sends or receives together: a source instance (plus the spare GPUs
  of its NVLink group whose NICs it may send through), the host-DRAM copy, or all new instances
  inside one NVLink group (plus that group's spare GPUs, which may receive and forward as relays;
  on a host without NVLink, where each new GPU is a node, the host's spare GPUs are dealt to its
  nodes as relays that forward over PCIe).
* A *lane* moves one stripe interval of one rank, for every unit it carries, from a *holder* (a GPU
  or memory that has those bytes) out through an *exit* (a GPU whose NIC is used, a host NIC, or the
  holder itself when the route stays inside a host) to a destination GPU of the receiving node
  (an instance GPU of that rank, or a relay). Lanes into one node may come from different senders
  over different NICs, and a node may forward different intervals to different nodes: the stripes
  of a plan follow their own routes. A chain is the special case where every interval takes one
  route. Each rank's instance GPUs then get what landed elsewhere in the node over NVLink
  (*gather lanes*). Lanes stream unit by unit and forward each unit as it arrives (pipelined).
* Every instance GPU receives every byte of its shard exactly once; every lane's holder holds what
  it sends when it sends it; live instances send nothing over the network (their egress carries KV
  caches); flows run at max-min fair rates on what the state's background flows leave of each link,
  each capped at the rate the plan paces it to.

Plans are frozen; :func:`~blitzplan.multicast.validate_multicast` checks any of them against these
rules and recomputes the timeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any, TypeVar

from blitzplan.models import ModelIdentity
from blitzplan.solvers import SolveStatus
from blitzplan.topologies import Flow

__all__ = [
    "ALL_RANKS",
    "AllGather",
    "Hop",
    "Lane",
    "MulticastPlan",
    "NewInstance",
    "NodeKind",
    "PlanNode",
    "Route",
    "built",
]

ALL_RANKS = -1
"""``Lane.rank`` of a lane that carries every rank's shard (a baseline's DRAM staging copy)."""


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

    ``gpus`` are the node's GPUs (targets: the new instances' GPUs in instance order, rank by rank;
    instance sources: the instance's GPUs in rank order). ``memory`` is the host-memory or SSD node
    of memory kinds. ``exits`` are what the node may send through: GPUs (their NICs, or the GPU
    itself inside a host) and, for memory, host NICs. ``relays`` are spare GPUs of a target node's
    NVLink group that may receive stripes and forward them. ``tp`` is the TP degree of the node's
    instances; ``present`` marks units already complete on every GPU of the node before this plan
    (a replan reuses them), empty when none are.
    """

    id: int
    kind: NodeKind
    label: str
    gpus: tuple[str, ...] = ()
    memory: str | None = None
    exits: tuple[str, ...] = ()
    relays: tuple[str, ...] = ()
    instance_id: str | None = None
    tp: int = 1
    present: tuple[bool, ...] = ()
    ready_s: tuple[float, ...] = ()
    """For an instance source still loading under an earlier plan: per unit, when it holds it
    (seconds from now; lanes from it stream each unit no earlier). Empty: everything now."""

    def has(self, unit: int) -> bool:
        return bool(self.present) and self.present[unit]

    @property
    def host_local_nodes(self) -> tuple[str, ...]:
        return self.gpus if self.gpus else ((self.memory,) if self.memory else ())

    def rank_of(self, gpu: str) -> int | None:
        """The TP rank ``gpu`` serves in this node, ``None`` for relays and non-members."""
        if gpu not in self.gpus:
            return None
        return self.gpus.index(gpu) % self.tp


@dataclass(frozen=True)
class NewInstance:
    """A new instance the plan loads: its GPUs (TP ranks in order) and its node."""

    name: str
    gpus: tuple[str, ...]
    node: int
    startup_s: float = 0.0


@dataclass(frozen=True)
class Lane:
    """One flow of a plan: stripe ``[lo, hi)`` of ``rank``'s shard, for every carried unit.

    ``holder`` has the bytes; they leave the sender by ``exit`` (the holder itself, another GPU of
    the sender relayed over NVLink, or a host NIC) and land on ``dst``. ``gather`` lanes copy bytes
    that landed on one GPU of a node to another GPU of the same node over NVLink.
    """

    flow: int
    sender: int
    receiver: int
    holder: str
    exit: str
    dst: str
    rank: int
    lo: float
    hi: float
    gather: bool = False

    @property
    def fraction(self) -> float:
        return self.hi - self.lo


@dataclass(frozen=True)
class Hop:
    """Every lane from node ``sender`` to node ``receiver``.

    Hops of one ``phase`` run at once and share links; ``pipelined`` hops forward each unit as it
    arrives, others only once the sender holds the whole model (store and forward). ``after``
    lists hops that must finish before this one starts (a sender sending in turn).
    """

    sender: int
    receiver: int
    lanes: tuple[Lane, ...]
    phase: int = 0
    pipelined: bool = True
    after: tuple[int, ...] = ()


@dataclass(frozen=True)
class AllGather:
    """The NVLink copies that complete every instance GPU of a striped target node."""

    node: int
    lanes: tuple[Lane, ...]
    phase: int = 0


@dataclass(frozen=True)
class Route:
    """How much of target node ``receiver``'s bytes comes from node ``sender`` (a summary)."""

    sender: int
    receiver: int
    share: float


@dataclass(frozen=True)
class MulticastPlan:
    """Where a model's weights come from, how they flow, and when each unit lands.

    ``unit_bytes`` are one GPU's shard bytes per unit (embedding, layers 1..L, head) at the new
    instances' TP degree. ``flows`` are the plan's flows (one per lane, in lane-id order),
    ``flow_phase`` their phases and ``rates`` their rates: max-min fair on the capacity the
    ``background`` flows leave, each at most its flow's ``max_bytes_per_s`` (the pace the plan
    sets). ``lane_arrival_s[f][u]`` is when unit ``u`` has fully arrived over the lane of flow
    ``f`` (``nan`` for units it does not carry); ``arrival_s[h][u]`` the same for hop ``h`` (its
    last lane). ``layer_ready_s[name][u]`` is when unit ``u`` is complete on every GPU of new
    instance ``name``. ``objective_s`` is the value of ``objective``; ``lower_bound_s`` a certified
    lower bound on it for any plan under the same cost model; ``status`` is OPTIMAL only when the
    plan meets that bound (or a search proved it).
    """

    model: ModelIdentity
    method: str
    objective: str
    status: SolveStatus
    objective_s: float
    lower_bound_s: float
    solve_s: float = field(compare=False)  # wall time: not part of what equality sees
    unit_bytes: tuple[int, ...]
    chunk_bytes: int
    nodes: tuple[PlanNode, ...]
    instances: tuple[NewInstance, ...]
    hops: tuple[Hop, ...]
    allgathers: tuple[AllGather, ...]
    flows: tuple[Flow, ...]
    flow_phase: tuple[int, ...]
    rates: tuple[float, ...]
    background: tuple[Flow, ...]
    arrival_s: tuple[tuple[float, ...], ...]
    lane_arrival_s: tuple[tuple[float, ...], ...]
    layer_ready_s: Mapping[str, tuple[float, ...]]
    ready_at_s: Mapping[str, float]
    live: tuple[str, ...] = ()
    allow_prefill_sources: bool = False
    delivered: Mapping[str, tuple[bool, ...]] = field(default_factory=dict)
    """Per new instance, the units an earlier plan already delivered (ready at time 0 here)."""
    bound_kind: str = ""
    """Which cut gave ``lower_bound_s`` (e.g. ``max-flow into new3``)."""
    lane_start_s: tuple[float, ...] = ()
    """Per lane: when it may send its first byte (its holder's first chunk, its receiver's
    startup and the hops it waits for)."""
    lane_feeds: tuple[tuple[int, ...], ...] = ()
    """Per lane: the lanes that bring its stripe to its holder (it streams what they deliver)."""

    @property
    def gap(self) -> float:
        if self.objective_s <= 0:
            return 0.0
        return max(0.0, (self.objective_s - self.lower_bound_s) / self.objective_s)

    @property
    def all_ready_s(self) -> float:
        return max(self.ready_at_s.values())

    @property
    def lanes(self) -> tuple[Lane, ...]:
        """Every lane: hops' lanes then all-gathers' lanes."""
        return tuple(lane for hop in self.hops for lane in hop.lanes) + tuple(
            lane for gather in self.allgathers for lane in gather.lanes
        )

    def instance(self, name: str) -> NewInstance:
        for inst in self.instances:
            if inst.name == name:
                return inst
        raise KeyError(name)

    def feeds(self) -> list[tuple[str, list[tuple[str, float]]]]:
        """Per target node in order: its label and, per sender label, the share it sends."""
        by_node: dict[int, list[tuple[str, float]]] = {}
        for route in self.routes():
            by_node.setdefault(route.receiver, []).append(
                (self.nodes[route.sender].label, route.share)
            )
        return [(self.nodes[n].label, senders) for n, senders in sorted(by_node.items())]

    def describe_routes(self) -> str:
        """One line: ``sender share, ... -> node`` per target node, ``;`` between nodes."""
        return "; ".join(
            ", ".join(f"{s} {share:.0%}" for s, share in senders) + f" -> {node}"
            for node, senders in self.feeds()
        )

    def routes(self) -> tuple[Route, ...]:
        """Per (sender, target node): the share of the node's network bytes it sends."""
        totals: dict[int, float] = {}
        by_pair: dict[tuple[int, int], float] = {}
        for hop in self.hops:
            weight = sum(lane.fraction for lane in hop.lanes)
            by_pair[(hop.sender, hop.receiver)] = by_pair.get((hop.sender, hop.receiver), 0.0) + (
                weight
            )
            totals[hop.receiver] = totals.get(hop.receiver, 0.0) + weight
        return tuple(
            Route(sender, receiver, share / totals[receiver] if totals[receiver] else 0.0)
            for (sender, receiver), share in by_pair.items()
        )


_T = TypeVar("_T")


def built(cls: type[_T], **values: Any) -> _T:
    """An instance of the frozen dataclass ``cls`` (one without ``__post_init__``) holding
    ``values``, every field given in field order, without its generated ``__init__``: that sets
    the fields one by one through ``object.__setattr__``, which dominated building the plans'
    lanes and steps (thousands at +512). The object is the one ``cls(**values)`` gives."""
    names = _field_names(cls)
    if tuple(values) != names:
        raise TypeError(f"{cls.__name__} takes the fields {names} in order, got {tuple(values)}")
    instance = object.__new__(cls)
    instance.__dict__.update(values)
    return instance


_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    found = _FIELDS.get(cls)
    if found is None:
        found = _FIELDS[cls] = tuple(f.name for f in fields(cls))
    return found
