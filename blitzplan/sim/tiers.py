"""The one small interface of the serving tiers, and of the request paths that join them.

Tiers: the prefill relay (:class:`~.prefill.PrefillTier`) and the decode instances
(:class:`~.decode.DecodeTier`) of a disaggregated fleet, or the colocated replicas
(:class:`~.colocated.ColocatedTier`). The engine keeps one per role and asks only this of each.
A request path (:class:`~.router.Router`, or the colocated tier itself) takes requests in.
"""

from __future__ import annotations

from typing import Protocol

from blitzplan.sim.instances import SimInstance, SimRequest

__all__ = ["RequestPath", "Tier"]


class Tier(Protocol):
    """What the engine asks of a serving tier about one of its instances."""

    def join(self, inst: SimInstance, now_s: float) -> None:
        """``inst`` is loaded (or took this role) and serves from ``now_s``."""
        ...

    def leave(self, inst: SimInstance) -> None:
        """``inst`` takes no new work (drained or mutated); what it holds still ends."""
        ...

    def busy(self, inst: SimInstance) -> bool:
        """Whether ``inst`` still runs or holds work."""
        ...

    def fail(self, inst: SimInstance, now_s: float) -> list[SimRequest]:
        """``inst`` is gone: the requests whose progress it held that the request path must
        start over (a tier that requeues them itself returns [])."""
        ...


class RequestPath(Protocol):
    """Where requests enter, restart and get their KV caches."""

    def arrive(self, request: SimRequest, now_s: float) -> None: ...

    def restart(self, request: SimRequest, now_s: float, reason: str) -> None:
        """``request`` lost its progress (a transfer or an instance failed): start over."""
        ...

    def kv_landed(self, request: SimRequest, now_s: float) -> None:
        """One KV transfer of ``request`` completed."""
        ...
