"""Background flows: transfers (KV caches, an earlier plan's steps) occupying links while weights
move, with when each one that ends does."""

from __future__ import annotations

import math
from collections import Counter

from blitzplan.errors import InvalidInputError
from blitzplan.topologies import Flow, Topology

__all__ = ["BackgroundFlows"]


class BackgroundFlows:
    """The background flows of one cluster and their ends (seconds from now)."""

    def __init__(self, topology: Topology) -> None:
        self._topology = topology
        self._flows: list[Flow] = []
        self._ends: dict[Flow, float] = {}
        """When each flow that ends does (seconds from now); the others keep running."""

    def copy(self) -> BackgroundFlows:
        other = BackgroundFlows(self._topology)
        other._flows = list(self._flows)
        other._ends = dict(self._ends)
        return other

    def __eq__(self, other: object) -> bool:
        """The same flows (in any order) with the same ends."""
        if not isinstance(other, BackgroundFlows):
            return NotImplemented
        return Counter(self._flows) == Counter(other._flows) and self._ends == other._ends

    __hash__ = None  # type: ignore[assignment]  # mutable

    @property
    def flows(self) -> tuple[Flow, ...]:
        return tuple(self._flows)

    def add(self, src: str, dst: str, *, max_bytes_per_s: float = math.inf, name: str = "") -> Flow:
        """Route and record a transfer from ``src`` to ``dst`` that keeps running."""
        flow = self._topology.flow(src, dst, max_bytes_per_s=max_bytes_per_s, name=name)
        self._flows.append(flow)
        return flow

    def add_routed(self, flow: Flow, *, until_s: float = math.inf) -> Flow:
        """Record an already routed flow; its edges must be in the topology. ``until_s``: when
        it ends, seconds from now, else it keeps running."""
        for edge in flow.edges:
            self._topology.bytes_per_s(edge)
        if isinstance(until_s, bool) or not isinstance(until_s, int | float) or not until_s > 0:
            raise InvalidInputError(f"until_s must be a time > 0 or inf, got {until_s!r}")
        self._flows.append(flow)
        if until_s < math.inf:
            self._ends[flow] = float(until_s)
        return flow

    def end_s(self, flow: Flow) -> float:
        """When ``flow`` ends, seconds from now (inf: it keeps running)."""
        return self._ends.get(flow, math.inf)

    def clear(self) -> None:
        self._flows.clear()
        self._ends.clear()
