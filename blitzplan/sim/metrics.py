"""What the autoscaler sees: prompt tokens and KV bytes over a sliding window, the
:class:`~blitzplan.sim.autoscaler.Load` it decides on, and when the prefill bound first ran hot
(the detection delay of the next scale-up runs from there)."""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from blitzplan.sim.autoscaler import Load

if TYPE_CHECKING:
    from blitzplan.sim.engine import Simulator

__all__ = ["WINDOW_S", "LoadMeter", "autoscaler_load", "prefill_capacity", "watch_prefill_bound"]

WINDOW_S = 2.0
"""The autoscaler's load window."""


class LoadMeter:
    """Prompt tokens arriving and KV bytes sent in the last :data:`WINDOW_S` seconds."""

    def __init__(self) -> None:
        self._prompts: deque[tuple[float, int]] = deque()
        self._prompt_tokens = 0
        self._kv: deque[tuple[float, float]] = deque()
        self._kv_bytes = 0.0
        self.hot_since_s: float | None = None

    def prompt(self, now_s: float, tokens: int) -> None:
        self._prompts.append((now_s, tokens))
        self._prompt_tokens += tokens

    def kv(self, now_s: float, size_bytes: float) -> None:
        self._kv.append((now_s, size_bytes))
        self._kv_bytes += size_bytes

    def prompt_tokens(self, now_s: float) -> int:
        """Prompt tokens that arrived in the window ending at ``now_s``."""
        horizon = now_s - WINDOW_S
        while self._prompts and self._prompts[0][0] < horizon:
            self._prompt_tokens -= self._prompts.popleft()[1]
        return self._prompt_tokens

    def kv_bytes(self, now_s: float) -> float:
        """KV bytes sent toward decode in the window ending at ``now_s``."""
        horizon = now_s - WINDOW_S
        while self._kv and self._kv[0][0] < horizon:
            self._kv_bytes -= self._kv.popleft()[1]
        return max(0.0, self._kv_bytes)

    def hot(self, now_s: float) -> None:
        """A bound is above its high mark now (kept if it already was)."""
        if self.hot_since_s is None:
            self.hot_since_s = now_s

    def cool(self, now_s: float) -> None:
        """No scale-up asked: a spike that passed more than a window ago is forgotten."""
        if self.hot_since_s is not None and now_s - self.hot_since_s > WINDOW_S:
            self.hot_since_s = None

    def detected_s(self, now_s: float) -> float:
        """When the scale-up decided now was first called for; resets."""
        detected = now_s if self.hot_since_s is None else self.hot_since_s
        self.hot_since_s = None
        return detected


def autoscaler_load(sim: Simulator) -> Load:
    """The autoscaler's view of ``sim`` now."""
    now, meter = sim.now_s, sim.meter
    decode = sim.instances.active("decode")
    demand = (meter.prompt_tokens(now) + sim.prefill.queued_tokens) / WINDOW_S
    backlog = sum(sim.decode.need_bytes(r) for r in sim.decode.backlog)
    return Load(
        now_s=now,
        prefill_instances=sim.count("prefill"),
        decode_instances=len(decode),
        prefill_demand_tokens_per_s=demand,
        prefill_capacity_tokens_per_s=prefill_capacity(sim),
        kv_used_bytes=sum(i.kv_used for i in decode) + backlog,
        kv_capacity_bytes=sim.instances.kv_capacity_bytes,
        kv_arrival_bytes_per_s=meter.kv_bytes(now) / WINDOW_S,
        kv_ingress_bytes_per_s=_nic_ingress(sim),
    )


def prefill_capacity(sim: Simulator) -> float:
    """Prompt tokens per second one prefill instance processes at a full token budget."""
    budget = sim.token_budget
    return budget / sim.prefill.batch_s(budget, max(1, budget // 1024))


def _nic_ingress(sim: Simulator) -> float:
    """KV bytes per second a decode instance's NICs take in."""
    topo = sim.topology_now
    nic = topo.nic_of(topo.gpus()[0])
    leaf = topo.leaf_of_nic(nic)
    return (topo.bytes_per_s((leaf, nic)) if leaf else math.inf) * sim.tp


def watch_prefill_bound(sim: Simulator) -> None:
    """Note when prefill demand first passes the autoscaler's high mark."""
    high = getattr(sim.autoscaler, "high", None)
    if high is None or sim.meter.hot_since_s is not None:
        return
    demand = sim.meter.prompt_tokens(sim.now_s) + sim.prefill.queued_tokens
    capacity = sim.count("prefill") * prefill_capacity(sim)
    if capacity <= 0 or demand / WINDOW_S > high * capacity:
        sim.meter.hot(sim.now_s)
