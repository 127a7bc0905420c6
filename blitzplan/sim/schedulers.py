"""Iteration schedulers of a colocated replica: vLLM's two policies, as vLLM defines them.

A replica keeps ``waiting`` (first come, first served; a preempted request goes back to the
front) and ``running`` (in the order admitted), and its KV cache in blocks of ``block_size``
tokens. Before each iteration its scheduler decides which requests run and how many of their
tokens each computes (:class:`Batch`); a request whose every known token is then computed
samples one more (the first ends its prefill). A request holds ``ceil(computed / block_size)``
blocks: the tokens it will have computed after the iteration must fit them.

* ``prefill-first``: vLLM's original (V0) policy, ``Scheduler._schedule_default`` in
  ``vllm/core/scheduler.py``. Waiting prompts are admitted first come, first served and whole,
  while their tokens fit the token budget, the running and new requests fit ``max_num_seqs``,
  and their blocks leave the watermark free (1% of the cache, V0's ``can_allocate``); a prompt
  longer than the budget or the cache can never run and is dropped (vLLM ignores it). An
  iteration that admits prompts runs only them. Otherwise every running request decodes one
  token, in order; one that needs a block when none is free preempts the last running request
  (itself when it is the last).
* ``chunked``: vLLM's current (V1) scheduler, ``Scheduler.schedule`` in
  ``vllm/v1/core/sched/scheduler.py``; chunked prefill as Sarathi-Serve defines it. The running
  requests first, in order, each up to its uncomputed tokens within what is left of the token
  budget (a decode one token, a partly prefilled prompt its next chunk), preempting from the
  back of ``running`` when blocks run out; then, if nothing was preempted, waiting requests
  while budget is left and ``running`` is under ``max_num_seqs``, the last one chunked to the
  budget left; a request whose blocks do not fit stops admission. ``long_prefill_tokens`` (V1's
  ``long_prefill_token_threshold``, 0: none) caps any one request's share of an iteration.

Preemption is by recompute, as both define it for single-sequence requests: the request's
blocks are freed and it goes back to the front of ``waiting`` keeping the tokens it generated;
its recompute prefills prompt and generated tokens together (V1's ``num_tokens``), then samples
the next one. It finishes once. The functions change the replica's queues and blocks, as vLLM's
schedulers do, and return the batch they decided; the caller runs it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from blitzplan.sim.instances import SimRequest

__all__ = ["SCHEDULERS", "Batch", "ReplicaLimits", "ReplicaQueues", "known_tokens"]


@dataclass(frozen=True)
class ReplicaLimits:
    """A replica's resolved limits: token budget and sequence cap per iteration, the per-request
    chunk cap (0: none), the block size, the watermark's blocks, the longest prompt (``prompt
    limit``: prefill-first drops longer ones)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    long_prefill_tokens: int
    block_size: int
    watermark_blocks: int
    prompt_limit: int


@dataclass(eq=False)
class ReplicaQueues:
    """What a scheduler reads and changes: the queues and the free blocks of one replica."""

    total_blocks: int
    free_blocks: int
    waiting: deque[SimRequest] = field(default_factory=deque)
    running: list[SimRequest] = field(default_factory=list)


@dataclass(frozen=True)
class Batch:
    """One iteration: ``work`` (request, tokens it computes) in order, the requests preempted to
    make room, and those dropped because they can never run (with why)."""

    work: tuple[tuple[SimRequest, int], ...] = ()
    preempted: tuple[SimRequest, ...] = ()
    dropped: tuple[tuple[SimRequest, str], ...] = ()

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.work)


def known_tokens(request: SimRequest) -> int:
    """Tokens a request has: its prompt and every token generated so far."""
    return request.prompt_tokens + request.tokens_done


def _blocks_needed(request: SimRequest, tokens: int, block_size: int) -> int:
    """More blocks ``request`` needs to compute ``tokens`` more tokens."""
    return max(0, math.ceil((request.computed_tokens + tokens) / block_size) - request.kv_blocks)


def _allocate(
    queues: ReplicaQueues, request: SimRequest, tokens: int, limits: ReplicaLimits
) -> bool:
    need = _blocks_needed(request, tokens, limits.block_size)
    if need > queues.free_blocks:
        return False
    queues.free_blocks -= need
    request.kv_blocks += need
    return True


def _preempt(queues: ReplicaQueues, request: SimRequest) -> None:
    """By recompute: free its blocks, forget its computed tokens, back to the front."""
    queues.free_blocks += request.kv_blocks
    request.kv_blocks = request.computed_tokens = 0
    request.preemptions += 1
    queues.waiting.appendleft(request)


def prefill_first(queues: ReplicaQueues, limits: ReplicaLimits) -> Batch:
    """vLLM V0's default policy (see the module docstring)."""
    work: list[tuple[SimRequest, int]] = []
    dropped: list[tuple[SimRequest, str]] = []
    budget, seqs = limits.max_num_batched_tokens, len(queues.running)
    while queues.waiting:
        request = queues.waiting[0]
        tokens = known_tokens(request)
        need = math.ceil(tokens / limits.block_size)
        why = _never(tokens, need, queues, limits)
        if why:
            dropped.append((queues.waiting.popleft(), why))
            continue
        if queues.free_blocks - need < limits.watermark_blocks:
            break
        if tokens > budget or seqs + 1 > limits.max_num_seqs:
            break
        queues.waiting.popleft()
        _allocate(queues, request, tokens, limits)
        queues.running.append(request)
        work.append((request, tokens))
        budget, seqs = budget - tokens, seqs + 1
    if work:
        return Batch(tuple(work), (), tuple(dropped))
    decodes = _decode_all(queues, limits)
    return Batch(decodes.work, decodes.preempted, tuple(dropped))


def _never(tokens: int, need: int, queues: ReplicaQueues, limits: ReplicaLimits) -> str:
    if tokens > limits.prompt_limit:
        return f"prompt of {tokens} tokens is over the limit of {limits.prompt_limit}"
    if queues.total_blocks - need < limits.watermark_blocks:
        return f"prompt of {tokens} tokens needs more KV blocks than the replica has"
    return ""


def _decode_all(queues: ReplicaQueues, limits: ReplicaLimits) -> Batch:
    """Every running request decodes one token; preempt from the back when blocks run out."""
    queue, work, preempted = deque(queues.running), [], []
    queues.running = []
    while queue:
        request = queue.popleft()
        while not _allocate(queues, request, 1, limits):
            victim = queue.pop() if queue else request
            _preempt(queues, victim)
            preempted.append(victim)
            if victim is request:
                break
        else:
            queues.running.append(request)
            work.append((request, 1))
    return Batch(tuple(work), tuple(preempted))


def chunked(queues: ReplicaQueues, limits: ReplicaLimits) -> Batch:
    """vLLM V1's scheduler (see the module docstring)."""
    budget = limits.max_num_batched_tokens
    work: list[tuple[SimRequest, int]] = []
    preempted: list[SimRequest] = []
    index = 0
    while index < len(queues.running) and budget > 0:
        request = queues.running[index]
        tokens = _chunk(request, budget, limits)
        while not _allocate(queues, request, tokens, limits):
            victim = queues.running.pop()
            _preempt(queues, victim)
            preempted.append(victim)
            if victim is request:
                break
        if preempted and preempted[-1] is request:
            break
        work.append((request, tokens))
        budget -= tokens
        index += 1
    if not preempted:
        budget = _admit(queues, limits, budget, work)
    return Batch(tuple(work), tuple(preempted))


def _admit(
    queues: ReplicaQueues, limits: ReplicaLimits, budget: int, work: list[tuple[SimRequest, int]]
) -> int:
    """Waiting requests while budget and sequences last (V1's second loop); the budget left."""
    while queues.waiting and budget > 0 and len(queues.running) < limits.max_num_seqs:
        request = queues.waiting[0]
        tokens = _chunk(request, budget, limits)
        if not _allocate(queues, request, tokens, limits):
            break
        queues.running.append(queues.waiting.popleft())
        work.append((request, tokens))
        budget -= tokens
    return budget


def _chunk(request: SimRequest, budget: int, limits: ReplicaLimits) -> int:
    tokens = known_tokens(request) - request.computed_tokens
    if 0 < limits.long_prefill_tokens < tokens:
        tokens = limits.long_prefill_tokens
    return min(tokens, budget)


SCHEDULERS: dict[str, Callable[[ReplicaQueues, ReplicaLimits], Batch]] = {
    "prefill-first": prefill_first,
    "chunked": chunked,
}
"""The iteration schedulers by name (see the module docstring)."""
