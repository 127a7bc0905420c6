"""What the autoscaler sees: prompt tokens and KV bytes over a sliding window, the
:class:`~blitzplan.sim.autoscaler.Load` it decides on (read through a narrow
:class:`LoadView` of the run), and when the prefill bound first ran hot (the detection delay
of the next scale-up runs from there)."""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol

from blitzplan.sim.autoscaler import Load
from blitzplan.topologies import Topology

__all__ = [
    "WINDOW_S",
    "LoadMeter",
    "LoadView",
    "autoscaler_load",
    "nic_ingress_bytes_per_s",
    "prefill_hot",
    "watch_prefill_bound",
]

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


class LoadView(Protocol):
    """What the autoscaler's signals read of a running simulation."""

    @property
    def now_s(self) -> float: ...

    @property
    def meter(self) -> LoadMeter: ...

    @property
    def serves_colocated(self) -> bool: ...

    def count(self, role: str) -> int: ...

    def queued_tokens(self) -> int:
        """Prompt tokens waiting to be prefilled."""
        ...

    def prefill_capacity_tokens_per_s(self) -> float:
        """Prompt tokens per second one instance that prefills processes at a full budget."""
        ...

    def kv_bytes(self) -> tuple[float, float]:
        """KV bytes in use (and waiting for room) and the KV capacity of one instance, over the
        instances that hold KV caches (decode or colocated)."""
        ...

    def kv_ingress_bytes_per_s(self) -> float:
        """KV bytes per second one decode instance's NICs take in (inf when colocated)."""
        ...


def autoscaler_load(view: LoadView) -> Load:
    """The autoscaler's view of the run now."""
    now, meter = view.now_s, view.meter
    used, capacity = view.kv_bytes()
    return Load(
        now_s=now,
        prefill_instances=view.count("prefill"),
        decode_instances=view.count("decode"),
        prefill_demand_tokens_per_s=(meter.prompt_tokens(now) + view.queued_tokens()) / WINDOW_S,
        prefill_capacity_tokens_per_s=view.prefill_capacity_tokens_per_s(),
        kv_used_bytes=used,
        kv_capacity_bytes=capacity,
        kv_arrival_bytes_per_s=meter.kv_bytes(now) / WINDOW_S,
        kv_ingress_bytes_per_s=view.kv_ingress_bytes_per_s(),
        colocated_instances=view.count("colocated"),
        colocated=view.serves_colocated,
    )


def nic_ingress_bytes_per_s(topology: Topology, tp: int) -> float:
    """KV bytes per second an instance's NICs take in (``tp`` GPUs, one NIC each)."""
    nic = topology.nic_of(topology.gpus()[0])
    leaf = topology.leaf_of_nic(nic)
    return (topology.bytes_per_s((leaf, nic)) if leaf else math.inf) * tp


def watch_prefill_bound(view: LoadView, high: float | None) -> None:
    """Note when prefill demand first passes the autoscaler's ``high`` mark."""
    if high is None or view.meter.hot_since_s is not None:
        return
    if prefill_hot(view, view.meter.prompt_tokens(view.now_s) + view.queued_tokens(), high):
        view.meter.hot(view.now_s)


def prefill_hot(view: LoadView, tokens: int, high: float | None) -> bool:
    """Whether ``tokens`` prompt tokens in the window and queued put prefill demand past the
    autoscaler's ``high`` mark (never without one)."""
    if high is None:
        return False
    prefilling = view.count("prefill") + view.count("colocated")
    capacity = prefilling * view.prefill_capacity_tokens_per_s()
    return capacity <= 0 or tokens / WINDOW_S > high * capacity
