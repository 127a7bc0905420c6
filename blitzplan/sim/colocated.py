"""Colocated replicas: instances that prefill and decode in one engine, iteration by iteration.

A serving replica runs iterations back to back while it has work. Before each, its scheduler
(:mod:`.schedulers`: ``prefill-first`` or ``chunked``) picks the batch under the token budget,
the sequence cap and its KV blocks; the iteration lasts what the compute model prices for that
mixed batch (:func:`blitzplan.compute.iteration.iteration_s`). When it ends, every request that
computed all its tokens samples one (the first ends its time to first token), and one with all
its output tokens finishes and frees its blocks. Requests that arrive during an iteration wait
for the next, as in vLLM's engine loop. The router (:data:`~.serving.ROUTERS`) gives each arriving
request to a serving replica; while none serves it waits in the tier's backlog.

A request whose prompt and output exceed ``max_model_len`` is dropped on arrival, as vLLM's
server refuses it; one ``prefill-first`` can never schedule is dropped with the reason. A lost
replica (its host failed) restarts its requests on the others: each counts one restart and
still finishes once. Live loading replicas and the replicas they help are :mod:`.pairs`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from blitzplan.compute import ComputeModel
from blitzplan.compute.iteration import iteration_s
from blitzplan.models import ModelSpec
from blitzplan.sim.instances import SimInstance, SimRequest, finish
from blitzplan.sim.notes import Notes
from blitzplan.sim.schedulers import SCHEDULERS, Batch, ReplicaQueues, known_tokens
from blitzplan.sim.serving import ServingOptions

__all__ = ["ColocatedTier", "IterationRecord", "Replica"]


@dataclass(frozen=True)
class IterationRecord:
    """One iteration of one replica (``simulate(record_iterations=True)``), to hold against an
    engine's logs: when it ran, the prefill tokens (chunks) and decode tokens it computed, the
    requests in its batch and those preempted to make room."""

    instance: str
    start_s: float
    end_s: float
    prefill_tokens: int
    decode_tokens: int
    batch_size: int
    preempted: int = 0


@dataclass(eq=False)
class Replica:
    """A serving replica: its queues and blocks, the batch in flight (iteration ``number``),
    the requests routed to it and not settled, and until when a relay block keeps it busy."""

    inst: SimInstance
    queues: ReplicaQueues
    batch: Batch | None = None
    number: int = 0
    outstanding: int = 0
    accepting: bool = True
    block_until_s: float = -math.inf
    pending: set[int] = field(default_factory=set)
    """Requests whose KV cache is still on its way to this replica (live pairs)."""

    def idle(self, now_s: float) -> bool:
        return self.batch is None and self.block_until_s <= now_s and self.inst.alive


class LiveGroups(Protocol):
    """What the tier asks of the live pairs (:class:`~.pairs.LivePairs`)."""

    def takes(self, replica: Replica, request: SimRequest, now_s: float) -> bool: ...

    def boundary(self, replica: Replica, now_s: float) -> bool: ...

    def holds(self, replica: Replica) -> bool: ...

    def queued_tokens(self) -> int: ...

    def lost(self, inst: SimInstance, now_s: float) -> None: ...

    def kv_landed(self, request: SimRequest, now_s: float) -> None: ...


class ColocatedTier:
    """The replicas, the router, the iterations (see the module docstring)."""

    def __init__(
        self,
        model: ModelSpec,
        compute: ComputeModel,
        options: ServingOptions,
        total_blocks: int,
        *,
        notes: Notes,
        schedule: Callable[[float, SimInstance, int], object],
        settled: Callable[[SimRequest], None],
    ) -> None:
        self.model, self.compute, self.options = model, compute, options
        self.total_blocks = total_blocks
        self.limits = options.limits(total_blocks)
        self.notes, self.schedule, self.settled = notes, schedule, settled
        self.scheduler = SCHEDULERS[options.scheduler]
        self.replicas: dict[str, Replica] = {}
        self.backlog: deque[SimRequest] = deque()
        self.records: list[IterationRecord] | None = None
        self.pairs: LiveGroups | None = None
        self._turn = 0

    # --- the request path ---------------------------------------------------------------------

    def arrive(self, request: SimRequest, now_s: float) -> None:
        self.notes.request(now_s, request, "arrive")
        limit = self.options.max_model_len or math.inf
        if request.prompt_tokens + request.output_tokens > limit:
            why = f"prompt and output ({request.prompt_tokens} + {request.output_tokens} tokens)"
            self._drop(None, request, f"{why} exceed max_model_len {limit}", now_s)
            return
        self.route(request, now_s)

    def route(self, request: SimRequest, now_s: float) -> None:
        """Give ``request`` to a replica (the router's choice), or to the backlog."""
        replica = self._pick()
        if replica is None:
            self.backlog.append(request)
            return
        replica.outstanding += 1
        request.replica, request.stage = replica.inst, "prefill"
        if self.pairs is not None and self.pairs.takes(replica, request, now_s):
            return
        replica.queues.waiting.append(request)
        self.kick(replica, now_s)

    def _pick(self) -> Replica | None:
        open_ = [r for r in self.replicas.values() if r.accepting and r.inst.alive]
        if not open_:
            return None
        if self.options.router == "round-robin":
            self._turn += 1
            return open_[(self._turn - 1) % len(open_)]
        return min(open_, key=lambda r: r.outstanding)

    def restart(self, request: SimRequest, now_s: float, reason: str) -> None:
        """``request`` lost its KV cache (a transfer or its replica failed): start over."""
        if request.stage == "done" or request.dropped:
            return
        self.unassign(request)
        request.restarts += 1
        request.tokens_done = request.computed_tokens = request.kv_blocks = 0
        request.kv_parts = 0
        self.notes.request(now_s, request, "restart", reason)
        self.route(request, now_s)

    def kv_landed(self, request: SimRequest, now_s: float) -> None:
        """A KV part of a relayed prefill reached its replica (:mod:`.pairs`)."""
        if self.pairs is not None:
            self.pairs.kv_landed(request, now_s)

    def unassign(self, request: SimRequest) -> None:
        """``request`` no longer counts on its replica."""
        replica = self.replicas.get(request.replica.id) if request.replica else None
        if replica is not None:
            replica.outstanding -= 1
            replica.pending.discard(request.id)
        request.replica = None

    def _drop(self, replica: Replica | None, request: SimRequest, why: str, now_s: float) -> None:
        if replica is not None:
            replica.outstanding -= 1
            replica.queues.free_blocks += request.kv_blocks
            request.kv_blocks = 0
        request.dropped = why
        self.notes.request(now_s, request, "dropped", why)
        self.settled(request)

    # --- the tier interface -------------------------------------------------------------------

    def join(self, inst: SimInstance, now_s: float) -> None:
        """A loaded replica serves: it takes the backlog, then the router's share."""
        replica = Replica(inst, ReplicaQueues(self.total_blocks, self.total_blocks))
        self.replicas[inst.id] = replica
        inst.idle_since_s = now_s
        while self.backlog:
            self.route(self.backlog.popleft(), now_s)

    def leave(self, inst: SimInstance) -> None:
        """``inst`` takes no new request; what it holds still finishes."""
        replica = self.replicas.get(inst.id)
        if replica is not None:
            replica.accepting = False

    def busy(self, inst: SimInstance) -> bool:
        replica = self.replicas.get(inst.id)
        if replica is None:
            return inst.new_worker >= 0
        held = self.pairs is not None and self.pairs.holds(replica)
        return held or replica.outstanding > 0 or replica.batch is not None

    def fail(self, inst: SimInstance, now_s: float) -> list[SimRequest]:
        """``inst`` is gone: its requests start over on the other replicas (returns [])."""
        if self.pairs is not None:
            self.pairs.lost(inst, now_s)
        replica = self.replicas.pop(inst.id, None)
        if replica is None:
            return []
        queues = replica.queues
        lost = [*queues.running, *queues.waiting]
        queues.running, queues.waiting, replica.batch = [], deque(), None
        for request in lost:
            self.restart(request, now_s, f"{inst.id} was lost")
        return []

    # --- iterations ---------------------------------------------------------------------------

    def kick(self, replica: Replica, now_s: float) -> None:
        """An idle replica starts its next iteration (a paired one asks its relay first)."""
        if not replica.idle(now_s):
            return
        if self.pairs is not None and self.pairs.boundary(replica, now_s):
            return
        self.start(replica, now_s)

    def start(self, replica: Replica, now_s: float) -> float | None:
        """Schedule and start an iteration; its end, or None when there is nothing to run."""
        batch = self.scheduler(replica.queues, self.limits)
        for request, why in batch.dropped:
            self._drop(replica, request, why, now_s)
        for request in batch.preempted:
            self.notes.request(now_s, request, "preempted", replica.inst.id)
        if not batch.work:
            replica.inst.idle_since_s = now_s
            return None
        chunks, contexts = [], []
        for request, tokens in batch.work:
            if tokens == 1 and request.computed_tokens:
                contexts.append(request.computed_tokens)
            else:
                chunks.append((tokens, request.computed_tokens))
        end = now_s + iteration_s(self.compute, self.model.num_layers, chunks, contexts)
        replica.batch, replica.number = batch, replica.number + 1
        self.schedule(end, replica.inst, replica.number)
        if self.records is not None:
            prefill = sum(c for c, _ in chunks)
            record = IterationRecord(
                replica.inst.id, now_s, end, prefill, len(contexts), len(batch.work)
            )
            self.records.append(replace(record, preempted=len(batch.preempted)))
        return end

    def iteration_done(self, inst: SimInstance, number: int, now_s: float) -> None:
        replica = self.replicas.get(inst.id)
        if replica is None or replica.number != number or replica.batch is None:
            return  # the replica was lost since
        batch, replica.batch = replica.batch, None
        finished = False
        for request, tokens in batch.work:
            request.computed_tokens += tokens
            if request.computed_tokens == request.prompt_tokens + request.tokens_done:
                finished |= self._sampled(replica, request, now_s)
        if finished:
            replica.queues.running = [r for r in replica.queues.running if r.stage != "done"]
        self.kick(replica, now_s)

    def _sampled(self, replica: Replica, request: SimRequest, now_s: float) -> bool:
        """``request`` computed every token it had: it samples the next one; whether that was
        its last."""
        request.tokens_done += 1
        if request.stage != "decode":
            if math.isnan(request.first_token_s):
                request.first_token_s = now_s
                request.prefilled_on = (replica.inst.id,)
            self.notes.request(now_s, request, "prefilled", replica.inst.id)
            request.stage = "decode"
        if request.tokens_done < request.output_tokens:
            return False
        self.complete(replica, request, now_s)
        return True

    def complete(self, replica: Replica | None, request: SimRequest, now_s: float) -> None:
        """``request`` has all its tokens: it frees its blocks and settles."""
        if replica is not None:
            replica.queues.free_blocks += request.kv_blocks
            replica.outstanding -= 1
        request.kv_blocks = 0
        finish(request, now_s)
        self.notes.request(now_s, request, "finish")
        self.settled(request)

    # --- what the autoscaler reads ------------------------------------------------------------

    def queued_tokens(self) -> int:
        """Tokens of requests still to prefill: waiting on replicas, in relays, in the backlog."""
        waiting = sum(
            known_tokens(r) - r.computed_tokens
            for replica in self.replicas.values()
            for r in replica.queues.waiting
        )
        backlog = sum(r.prompt_tokens for r in self.backlog)
        return waiting + backlog + (self.pairs.queued_tokens() if self.pairs else 0)

    def kv_used_fraction(self) -> float:
        """Blocks in use over blocks, over the serving replicas (0 with none)."""
        serving = [r for r in self.replicas.values() if r.inst.alive]
        if not serving:
            return 0.0
        free = sum(r.queues.free_blocks for r in serving)
        return 1 - free / (len(serving) * self.total_blocks)
