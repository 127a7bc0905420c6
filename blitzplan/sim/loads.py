"""Loads in flight: the BlitzScale plans whose weights are still moving, and their replans.

A load remembers its :class:`~blitzplan.scale.ScalePlan`, when it started, and when each unit
lands on each of its new instances (seconds into the run). When a host fails, every load whose
flows or instances touch it is replanned with :func:`blitzplan.scale.replan` from what survives:
units already delivered stay, the rest come at the new plan's times; an
:class:`~blitzplan.errors.InfeasibleError` loses the load's unfinished instances, with its
message as the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from blitzplan.cluster import ClusterState
from blitzplan.errors import InfeasibleError
from blitzplan.scale import ScalePlan, replan
from blitzplan.sim.instances import SimInstance
from blitzplan.topologies import Topology

__all__ = ["Replanned", "WeightLoad", "replan_load"]


@dataclass
class WeightLoad:
    """One plan's load: ``instances`` and ``units`` by the plan's instance names."""

    id: int
    start_s: float
    plan: ScalePlan
    instances: dict[str, SimInstance]
    units: dict[str, tuple[float, ...]]
    hosts: frozenset[str]

    def in_flight(self, now_s: float) -> bool:
        return any(max(u) > now_s for u in self.units.values())


@dataclass(frozen=True)
class Replanned:
    """The outcome of replanning a load: new unit times of the survivors (seconds into the
    run), the instances lost, the new plan (None when the load is lost) and why."""

    units: dict[str, tuple[float, ...]]
    lost: tuple[str, ...]
    plan: ScalePlan | None
    reason: str


def load_hosts(topology: Topology, plan: ScalePlan) -> frozenset[str]:
    """Every host the plan's flows cross or its new instances sit on."""
    nodes = (
        {node for flow in plan.multicast.flows for edge in flow.edges for node in edge}
        if (plan.multicast)
        else set()
    )
    nodes |= {gpu for info in plan.new_instances for gpu in info.gpus}
    data = topology.graph.nodes
    return frozenset(str(data[n]["host"]) for n in nodes if n in data and data[n].get("host"))


def replan_load(load: WeightLoad, state: ClusterState, now_s: float, host: str) -> Replanned:
    """Replan ``load`` after ``host`` failed, on ``state`` (the cluster just before the failure,
    without the load's own instances)."""
    complete = {name for name, units in load.units.items() if max(units) <= now_s}
    try:
        new = replan(load.plan, state, at_s=now_s - load.start_s, failed=[host])
    except InfeasibleError as exc:
        lost = tuple(name for name in load.units if name not in complete)
        return Replanned({}, lost, None, str(exc))
    units = {}
    for info in new.new_instances:
        old = load.units[info.name]
        units[info.name] = tuple(
            was if was <= now_s else now_s + t
            for was, t in zip(old, info.layer_ready_s, strict=True)
        )
    lost = tuple(name for name in load.units if name not in units and name not in complete)
    return Replanned(units, lost, new, "; ".join(new.missing))
