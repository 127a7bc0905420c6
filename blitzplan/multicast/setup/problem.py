"""Where the new instances go, who may send, and what each link has left for weights.

Sources (holders): decode and idle instances of the model's identity (prefill ones only with
``allow_prefill_sources``; loading ones with known arrival times by the role they will take,
holding each unit from its arrival), each with the spare GPUs of its NVLink group whose NICs it
may send through, and the cluster's host-DRAM copy, sending through its host's NICs that no
instance source already uses. A prefill instance's GPUs are never exits under the paper's rule
(the default); with ``allow_prefill_sources`` they are exits only when every decode instance of
the model sits in their NVLink group, so the instance's KV caches never leave through its NICs.
Targets: one node per NVLink group holding new instances, with the group's spare GPUs as relays.
Spare GPUs are GPUs no instance occupies, not reserved for a new instance, not excluded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from blitzplan.cluster import ClusterState, check_tp_fits
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec
from blitzplan.multicast.plan_types import NewInstance, PlanNode
from blitzplan.multicast.setup.sources import (
    blocked_nics,
    check_exclude,
    eligible_holders,
    source_nodes,
)
from blitzplan.multicast.setup.targets import place_targets, target_gpu_groups, target_nodes
from blitzplan.topologies import Edge, Topology, residual_after

__all__ = [
    "PLACEMENTS",
    "PrepareOptions",
    "Problem",
    "place_targets",
    "prepare",
    "residual_capacity",
]

PLACEMENTS = ("pack", "spread")
"""pack: fullest NVLink groups first (keeps groups whole); spread: one instance per group in
turn, so groups keep spare GPUs whose NICs relay stripes."""


@dataclass(frozen=True)
class Problem:
    """Everything a method needs: nodes to load, eligible sources, and link capacity left."""

    state: ClusterState
    model: ModelSpec
    tp: int
    unit_bytes: tuple[int, ...]
    chunk_bytes: int
    sources: tuple[PlanNode, ...]
    targets: tuple[PlanNode, ...]
    instances: tuple[NewInstance, ...]
    live: int
    allow_prefill_sources: bool
    delivered: Mapping[str, tuple[bool, ...]]
    residual: Mapping[Edge, float]
    live_names: tuple[str, ...] = ()
    """The new instances that must be the live ones (empty: the planner chooses ``live``)."""

    @property
    def topology(self) -> Topology:
        return self.state.topology

    def missing_units(self, node: PlanNode) -> tuple[bool, ...]:
        """Per unit, whether ``node``'s GPUs still need it."""
        return tuple(not node.has(u) for u in range(len(self.unit_bytes)))

    def below_root(self, memory: str) -> float:
        """What host ``memory`` can push below its root complexes (bytes/s): per root, the
        least of its DRAM link and the root's links down, as background flows leave them."""
        topo = self.topology
        total = 0.0
        for root in topo.graph.successors(memory):
            down = sum(
                self.residual[(root, v)]
                for v in topo.graph.successors(root)
                if topo.kind(v) not in ("host_mem", "ssd")
            )
            total += min(self.residual[(memory, root)], down)
        return total

    def node_bytes(self, node: PlanNode) -> float:
        """Bytes of distinct shards the node still needs (every rank once)."""
        need = self.missing_units(node)
        return float(self.tp * sum(b for b, m in zip(self.unit_bytes, need, strict=True) if m))


class PrepareOptions(TypedDict):
    """The keyword arguments of :func:`prepare` besides ``placement``."""

    count: int | None
    targets: Sequence[Sequence[str]] | None
    tp: int
    live: int | Sequence[str]
    chunk_bytes: int
    startup_s: float | Mapping[str, float]
    exclude: Iterable[str]
    allow_prefill_sources: bool
    names: Sequence[str] | None
    delivered: Mapping[str, Sequence[bool]] | None
    need_sources: bool


def prepare(
    state: ClusterState,
    model: ModelSpec,
    *,
    count: int | None,
    targets: Sequence[Sequence[str]] | None,
    tp: int,
    live: int | Sequence[str],
    chunk_bytes: int,
    startup_s: float | Mapping[str, float],
    exclude: Iterable[str],
    allow_prefill_sources: bool,
    names: Sequence[str] | None = None,
    delivered: Mapping[str, Sequence[bool]] | None = None,
    placement: str = "pack",
    need_sources: bool = True,
) -> Problem:
    """Validate the request and lay out source and target nodes (no plan yet).

    ``live`` is how many new instances are live (the planner picks them) or their names.
    ``need_sources=False`` (data planes that read copies on every host) plans without holders.
    """
    model.check_tp(tp)
    check_tp_fits(state.topology, tp)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
        raise InvalidInputError(f"chunk_bytes must be a positive integer, got {chunk_bytes!r}")
    if placement not in PLACEMENTS:
        raise InvalidInputError(
            f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}"
        )
    excluded = check_exclude(state, exclude)
    holders = (
        eligible_holders(state, model, tp, excluded, allow_prefill_sources) if need_sources else []
    )
    free = frozenset(state.free_gpus())  # read by the checks and both node builders
    groups = target_gpu_groups(state, model, tp, count, targets, holders, placement, free)
    reserved = {gpu for group in groups for gpu in group}
    names = _names(names, len(groups))
    live, live_names = _live(live, names)
    present = _delivered(delivered, names, model.num_units)
    blocked = blocked_nics(state, allow_prefill_sources)
    instances, nodes = target_nodes(
        state, groups, tp, startup_s, names, present, reserved | excluded, blocked, free
    )
    target_groups = {state.topology.nvlink_group_of(n.gpus[0]) for n in nodes}
    sources = source_nodes(
        state, holders, excluded | reserved, allow_prefill_sources, target_groups, blocked, free
    )
    return Problem(
        state=state,
        model=model,
        tp=tp,
        unit_bytes=model.shard(tp).unit_bytes,
        chunk_bytes=chunk_bytes,
        sources=sources,
        targets=nodes,
        instances=instances,
        live=live,
        allow_prefill_sources=allow_prefill_sources,
        delivered={n: p for n, p in present.items() if any(p)},
        residual=residual_capacity(state),
        live_names=live_names,
    )


def _live(live: int | Sequence[str], names: list[str]) -> tuple[int, tuple[str, ...]]:
    if isinstance(live, str) or not isinstance(live, int | Sequence) or isinstance(live, bool):
        raise InvalidInputError(
            f"live must be a count in 0..{len(names)} or a list of new instance names, got {live!r}"
        )
    if isinstance(live, int):
        if not 0 <= live <= len(names):
            raise InvalidInputError(
                f"live must be an integer in 0..{len(names)} (the number of new instances), "
                f"got {live!r}"
            )
        return live, ()
    chosen = tuple(str(n) for n in live)
    unknown = [n for n in chosen if n not in names]
    if unknown or len(set(chosen)) != len(chosen):
        raise InvalidInputError(f"live names {list(live)!r}; new instances: {names}")
    return len(chosen), chosen


def residual_capacity(state: ClusterState) -> dict[Edge, float]:
    """Each edge's capacity minus what the state's background flows use of it.

    Background flows (KV caches) take their max-min fair rates among themselves first: weights
    never slow serving traffic down; they use what is left. Without background flows, the
    topology's own capacity table (shared: read only)."""
    if not state.background_flows:
        return state.topology.capacity
    return residual_after(state.background_flows, state.topology.capacity)


def _names(names: Sequence[str] | None, count: int) -> list[str]:
    if names is None:
        return [f"new{i}" for i in range(count)]
    if isinstance(names, str):
        raise InvalidInputError(f"names must be a list of instance names, got the string {names!r}")
    result = [str(n) for n in names]
    if len(result) != count or len(set(result)) != count:
        raise InvalidInputError(
            f"names must give {count} distinct instance names, got {list(names)!r}"
        )
    return result


def _delivered(
    delivered: Mapping[str, Sequence[bool]] | None, names: list[str], units: int
) -> dict[str, tuple[bool, ...]]:
    given = dict(delivered or {})
    unknown = set(given) - set(names)
    if unknown:
        raise InvalidInputError(f"delivered names unknown instance(s) {sorted(unknown)!r}")
    result = {}
    for name in names:
        mask = tuple(map(bool, given.get(name, (False,) * units)))
        if len(mask) != units:
            raise InvalidInputError(f"delivered[{name!r}] must mark {units} units, got {len(mask)}")
        result[name] = mask
    return result
