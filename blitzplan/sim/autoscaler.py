"""The autoscaling policy: the paper's three bounds, each with low and high utilisation marks.

* prefill token throughput: prompt tokens arriving (and queued) per second over what the
  prefill instances process per second;
* decode KV memory: KV bytes in use over the decode instances' KV capacity;
* KV-migration bandwidth: KV bytes per second arriving at decode instances over their NICs'
  ingress.

Colocated replicas (``colocated``) are scaled on two of them: prompt tokens
arriving and waiting over what the replicas prefill, and KV memory in use (blocks, with the
requests waiting for them) over the replicas' KV capacity; the larger want wins, and one fewer
only when both are low.

A bound above its high mark asks for enough instances to bring it to the midpoint of its marks;
below its low mark it allows one fewer (at most one scale-down per step, and only of an
instance idle for ``idle_timeout_s``). Decisions are values; the simulator applies them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from blitzplan.errors import InvalidInputError

__all__ = ["Autoscaler", "Load", "PaperAutoscaler", "ScaleDecision"]


@dataclass(frozen=True)
class Load:
    """What the autoscaler sees at a decision point."""

    now_s: float
    prefill_instances: int
    decode_instances: int
    prefill_demand_tokens_per_s: float
    prefill_capacity_tokens_per_s: float
    """Per prefill instance."""
    kv_used_bytes: float
    kv_capacity_bytes: float
    """Per decode instance."""
    kv_arrival_bytes_per_s: float
    kv_ingress_bytes_per_s: float
    """Per decode instance."""
    colocated_instances: int = 0
    """Colocated replicas (then prefill capacity and KV capacity are per replica)."""
    colocated: bool = False
    """Whether the fleet is colocated (it scales colocated replicas, not prefill and decode)."""


@dataclass(frozen=True)
class ScaleDecision:
    """Instances to add (negative: remove) and which bound asked, for the scale-event log."""

    prefill: int
    decode: int
    reason: str
    colocated: int = 0

    @property
    def any(self) -> bool:
        return bool(self.prefill or self.decode or self.colocated)

    @property
    def up(self) -> bool:
        return self.prefill > 0 or self.decode > 0 or self.colocated > 0


class Autoscaler(Protocol):
    """Anything that turns a Load into a ScaleDecision every ``interval_s``. The simulator
    skips the ticks it can show would decide nothing (:mod:`.ticks`), so a decision must depend
    on the load alone (not on ``now_s`` nor on earlier decisions), and a load that decides
    nothing at two values of its demand, KV bytes in use and KV bytes arriving must decide
    nothing at every value between them (the paper's marks do: each bound decides nothing
    between its low and high mark)."""

    @property
    def interval_s(self) -> float: ...

    def decide(self, load: Load) -> ScaleDecision: ...


@dataclass(frozen=True)
class PaperAutoscaler:
    """The paper's policy (see the module docstring); every mark is configurable."""

    low: float = 0.3
    high: float = 0.8
    interval_s: float = 0.5
    idle_timeout_s: float = 0.5
    min_prefill: int = 1
    min_decode: int = 1
    min_colocated: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.low < self.high <= 1:
            raise InvalidInputError(
                f"marks must satisfy 0 <= low < high <= 1, got low={self.low}, high={self.high}"
            )
        for key in ("interval_s", "idle_timeout_s"):
            if not 0 < getattr(self, key) < math.inf:
                raise InvalidInputError(f"{key} must be finite and > 0, got {getattr(self, key)!r}")

    @property
    def midpoint(self) -> float:
        return (self.low + self.high) / 2

    def _wanted(self, current: int, utilisation: float, floor: int) -> tuple[int, bool]:
        """Instances wanted by one bound, and whether it is above its high mark."""
        if current < floor:  # lost instances (a failure): back to the floor at least
            return floor, True
        if utilisation > self.high:
            if not math.isfinite(utilisation):
                return current + 1, True
            return max(current + 1, math.ceil(current * utilisation / self.midpoint)), True
        if utilisation < self.low and current > floor:
            return current - 1, False
        return current, False

    def decide(self, load: Load) -> ScaleDecision:
        if load.colocated:
            return self._decide_colocated(load)
        p, d = load.prefill_instances, load.decode_instances
        prefill_u = _ratio(load.prefill_demand_tokens_per_s, p * load.prefill_capacity_tokens_per_s)
        kv_u = _ratio(load.kv_used_bytes, d * load.kv_capacity_bytes)
        bw_u = _ratio(load.kv_arrival_bytes_per_s, d * load.kv_ingress_bytes_per_s)
        want_p, hot_p = self._wanted(p, prefill_u, self.min_prefill)
        want_kv, hot_kv = self._wanted(d, kv_u, self.min_decode)
        want_bw, hot_bw = self._wanted(d, bw_u, self.min_decode)
        want_d = max(want_kv, want_bw)  # fewer only when both decode bounds are low
        delta_p, delta_d = want_p - p, want_d - d
        if delta_p < 0 and delta_d < 0:
            delta_d = 0  # at most one scale-down per step: prefill goes first
        reasons = [
            name
            for name, hot in (
                ("prefill tokens", hot_p),
                ("decode KV memory", hot_kv),
                ("KV bandwidth", hot_bw),
            )
            if hot
        ]
        return ScaleDecision(
            max(delta_p, -1), max(delta_d, -1), ", ".join(reasons) or "below low mark"
        )

    def _decide_colocated(self, load: Load) -> ScaleDecision:
        c = load.colocated_instances
        prefill_u = _ratio(load.prefill_demand_tokens_per_s, c * load.prefill_capacity_tokens_per_s)
        kv_u = _ratio(load.kv_used_bytes, c * load.kv_capacity_bytes)
        want_p, hot_p = self._wanted(c, prefill_u, self.min_colocated)
        want_kv, hot_kv = self._wanted(c, kv_u, self.min_colocated)
        named = (("prefill tokens", hot_p), ("KV memory", hot_kv))
        reasons = [name for name, hot in named if hot]
        delta = max(want_p, want_kv) - c
        return ScaleDecision(0, 0, ", ".join(reasons) or "below low mark", max(delta, -1))


def _ratio(used: float, capacity: float) -> float:
    if capacity <= 0:
        return math.inf if used > 0 else 0.0
    return used / capacity
