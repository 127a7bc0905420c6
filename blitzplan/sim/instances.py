"""Requests and instances, and the instance lifecycle: loading, serving, draining, released.

An instance is created *loading* (its weights arrive until ``ready_s``), then *serves*; a
scale-down marks it *draining* (no new work) and it is *released* once its work is done, or at
once when its host fails. The registry records the GPUs allocated over time (GPU time).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from blitzplan.errors import BlitzplanError

__all__ = ["Instances", "SimInstance", "SimRequest", "finish"]

NO_WORKER = -1
"""An instance that is not a worker of the prefill relay."""


@dataclass(eq=False, slots=True)
class SimRequest:
    """A request's progress: prefill (``stage="prefill"``), KV migration (``"kv"``), decode, done.

    ``split`` is the number of layers its last prefill ran on a loading instance (0: none) and
    ``prefilled_on`` the instances of that prefill; ``kv_parts`` the KV transfers still in flight
    and ``kv_sources`` where its KV cache waits when no decode instance has room. On a colocated
    replica (``replica``): ``computed_tokens`` of its prompt and output are in the KV cache, in
    ``kv_blocks`` blocks; ``preemptions`` counts the times it was preempted (by recompute).
    """

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float = math.nan
    finish_s: float = math.nan
    tokens_done: int = 0
    restarts: int = 0
    dropped: str = ""
    stage: str = "prefill"
    split: int = 0
    prefilled_on: tuple[str, ...] = ()
    kv_parts: int = 0
    kv_sources: tuple[tuple[SimInstance, float], ...] = ()
    decode: SimInstance | None = None
    replica: SimInstance | None = None
    computed_tokens: int = 0
    kv_blocks: int = 0
    preemptions: int = 0


@dataclass(eq=False, slots=True)
class SimInstance:
    """One instance. ``new_worker`` / ``old_worker``: its index in the prefill relay while it
    runs layers as a loading live instance / whole blocks as a serving prefill instance."""

    id: str
    role: str
    gpus: tuple[str, ...]
    host: str
    created_s: float
    ready_s: float
    live: bool = False
    state: str = "loading"
    released_s: float = math.nan
    running: list[SimRequest] = field(default_factory=list)
    stepping: bool = False
    kv_used: float = 0.0
    kv_capacity: float = 0.0
    idle_since_s: float = 0.0
    draining: bool = False
    new_worker: int = NO_WORKER
    old_worker: int = NO_WORKER

    @property
    def alive(self) -> bool:
        return self.state != "released"


def finish(request: SimRequest, now_s: float) -> None:
    """``request`` produced its last token at ``now_s`` (an internal error if it had before)."""
    if request.stage == "done":
        raise BlitzplanError(f"internal error: request {request.id} finished twice")
    request.stage = "done"
    request.finish_s = now_s


class Instances:
    """Every instance of a run, by id, with the GPUs allocated over time."""

    def __init__(self, kv_capacity_bytes: float) -> None:
        self.kv_capacity_bytes = kv_capacity_bytes
        self.by_id: dict[str, SimInstance] = {}
        self._alive: dict[str, SimInstance] = {}
        self.gpu_timeline: list[tuple[float, int]] = [(0.0, 0)]
        self.loading_gpu_s = 0.0
        """GPU-seconds of instances loading (from launch to loaded or released)."""
        self._next = 0
        self._lists: dict[tuple[bool, str], list[SimInstance]] = {}

    def changed(self) -> None:
        """An instance's state, role or draining changed (the lists by role are found again;
        :meth:`add`, :meth:`loaded` and :meth:`release` say so themselves)."""
        self._lists.clear()

    def __iter__(self) -> Iterator[SimInstance]:
        return iter(self.by_id.values())

    def add(
        self, role: str, gpus: Sequence[str], host: str, *, now_s: float, ready_s: float
    ) -> SimInstance:
        inst = SimInstance(
            f"s{self._next}",
            role,
            tuple(gpus),
            host,
            now_s,
            ready_s,
            kv_capacity=self.kv_capacity_bytes,
        )
        self._next += 1
        self.by_id[inst.id] = self._alive[inst.id] = inst
        self._lists.clear()
        self._gpus_changed(now_s)
        return inst

    def loaded(self, inst: SimInstance, now_s: float) -> None:
        """``inst`` has all its weights: it serves."""
        self.loading_gpu_s += len(inst.gpus) * (now_s - inst.created_s)
        inst.state = "serving"
        self._lists.clear()

    def release(self, inst: SimInstance, now_s: float) -> None:
        if inst.state == "loading":
            self.loading_gpu_s += len(inst.gpus) * (now_s - inst.created_s)
        inst.state = "released"
        inst.released_s = now_s
        del self._alive[inst.id]
        self._lists.clear()
        self._gpus_changed(now_s)

    def _gpus_changed(self, now_s: float) -> None:
        allocated = sum(len(i.gpus) for i in self._alive.values())
        self.gpu_timeline.append((now_s, allocated))

    def serving(self, role: str) -> list[SimInstance]:
        """Serving and not draining (a list kept until an instance changes: not to be
        changed)."""
        return self._list(False, role)

    def active(self, role: str) -> list[SimInstance]:
        """Serving or loading, not draining (the autoscaler counts both; a list kept until an
        instance changes: not to be changed)."""
        return self._list(True, role)

    def _list(self, loading: bool, role: str) -> list[SimInstance]:
        found = self._lists.get((loading, role))
        if found is None:
            states = ("serving", "loading") if loading else ("serving",)
            found = self._lists[loading, role] = [
                i
                for i in self._alive.values()
                if i.role == role and i.state in states and not i.draining
            ]
        return found

    def alive(self) -> list[SimInstance]:
        return list(self._alive.values())

    def on_host(self, host: str) -> list[SimInstance]:
        return [i for i in self._alive.values() if i.host == host]
