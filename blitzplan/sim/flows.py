"""Transfers on the topology: KV caches moving to decode, beside the weights of loads.

Each KV transfer is a flow between two GPUs; all KV flows and the weight flows of the loads in
progress share links max-min fairly (:meth:`Topology.fair_share`, the planner's own function).
Rates change whenever a flow starts or ends, so every estimate of a transfer's end carries a
version and only the newest counts; the event of the estimate it replaces is cancelled (an
estimate that would change nothing is never handled). The fair share is a function of the
flows' edges and caps alone, so the rates of a set of flows seen before (the same paths, the
same loads in progress) are looked up rather than solved again, per topology.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from blitzplan.topologies import Flow, Topology

__all__ = ["Flows"]


@dataclass(slots=True)
class _Transfer:
    flow: Flow
    tag: object
    remaining_bytes: float
    rate: float = 0.0
    version: int = 0
    event: int = -1
    """The number of the event booked at its current estimate (-1: none yet)."""


_REMEMBERED = 4096
"""At most this many sets of flows keep their rates (the memory starts over beyond)."""


class Flows:
    """KV transfers in flight and the weight flows of loads, on one topology."""

    def __init__(
        self,
        topology: Topology,
        schedule: Callable[[float, int, int], int],
        cancel: Callable[[int], None],
    ) -> None:
        """``schedule(time_s, transfer, version)`` books an estimate's event and returns its
        number; ``cancel(number)`` withdraws one."""
        self.topology = topology
        self.schedule, self.unbook = schedule, cancel
        self.transfers: dict[int, _Transfer] = {}
        self.weights: dict[int, tuple[float, float, tuple[Flow, ...]]] = {}
        self._next = 0
        self._last_s = 0.0

    @property
    def topology(self) -> Topology:
        return self._topology

    @topology.setter
    def topology(self, topology: Topology) -> None:
        """New transfers use ``topology`` (what failed is gone): paths and rates found again."""
        self._topology = topology
        self._paths: dict[tuple[str, str], Flow] = {}
        self._rates: dict[tuple[tuple[object, ...], ...], tuple[float, ...]] = {}

    def start(self, now_s: float, src: str, dst: str, size_bytes: float, tag: object) -> bool:
        """Move ``size_bytes`` from GPU ``src`` to GPU ``dst``; False when nothing moves (same
        GPU or no bytes)."""
        if src == dst or size_bytes <= 0:
            return False
        self._advance(now_s)
        flow = self._paths.get((src, dst))
        if flow is None:
            flow = self._paths[src, dst] = self.topology.flow(src, dst, name=f"kv {src}->{dst}")
        self.transfers[self._next] = _Transfer(flow, tag, size_bytes)
        self._next += 1
        self._reshare(now_s)
        return True

    def done(self, now_s: float, transfer: int, version: int) -> object | None:
        """The tag of the transfer that ended, or None for a stale estimate."""
        current = self.transfers.get(transfer)
        if current is None or current.version != version:
            return None
        self._advance(now_s)
        del self.transfers[transfer]
        self._reshare(now_s)
        return current.tag

    def cancel(self, now_s: float, hit: Callable[[_Transfer], bool]) -> list[object]:
        """Stop every transfer ``hit`` selects; their tags."""
        self._advance(now_s)
        gone = [tid for tid, t in self.transfers.items() if hit(t)]
        for tid in gone:
            self.unbook(self.transfers[tid].event)
        tags = [self.transfers.pop(tid).tag for tid in gone]
        if gone:
            self._reshare(now_s)
        return tags

    def cancel_tagged(self, now_s: float, tag: object) -> None:
        self.cancel(now_s, lambda t: t.tag is tag)

    def crossing(self, nodes: set[str]) -> Callable[[_Transfer], bool]:
        """A selector of transfers whose path touches any of ``nodes``."""
        return lambda t: any(a in nodes or b in nodes for a, b in t.flow.edges)

    def set_weights(self, load: int, start_s: float, end_s: float, flows: Sequence[Flow]) -> None:
        """The weight flows of load ``load`` run from ``start_s`` to ``end_s`` (replacing any)."""
        self.weights[load] = (start_s, end_s, tuple(flows))

    def drop_weights(self, loads: Iterable[int]) -> None:
        for load in loads:
            self.weights.pop(load, None)

    def _advance(self, now_s: float) -> None:
        elapsed = now_s - self._last_s
        for t in self.transfers.values():
            t.remaining_bytes = max(0.0, t.remaining_bytes - t.rate * elapsed)
        self._last_s = now_s

    def _reshare(self, now_s: float) -> None:
        if not self.transfers:
            return
        for load in [k for k, (_, end, _) in self.weights.items() if end <= now_s]:
            del self.weights[load]
        capacity = self.topology.capacity
        background = [  # weight flows of loads still running, on links that still exist
            f
            for start, _, flows in self.weights.values()
            if start <= now_s
            for f in flows
            if all(edge in capacity for edge in f.edges)
        ]
        ids = list(self.transfers)
        rates = self._fair_share([self.transfers[i].flow for i in ids] + background)
        for tid, rate in zip(ids, rates, strict=False):
            t = self.transfers[tid]
            if t.event >= 0:
                self.unbook(t.event)
            t.rate, t.version = rate, t.version + 1
            t.event = self.schedule(now_s + t.remaining_bytes / rate, tid, t.version)

    def _fair_share(self, flows: list[Flow]) -> tuple[float, ...]:
        key = tuple((f.edges, f.max_bytes_per_s) for f in flows)
        rates = self._rates.get(key)
        if rates is None:
            if len(self._rates) >= _REMEMBERED:
                self._rates.clear()
            rates = self._rates[key] = self.topology.fair_share(flows)
        return rates
