"""The ``torch`` transport: torch.distributed ``isend``/``irecv`` of each chunk, in lane order.

Messages match by order alone (one tag: NCCL has none). Under NCCL each direction of a pair has
its own communicator (made by every rank in one global order, destroyed at the end), so a pair
sending both ways never waits on itself. A receiver keeps ``WINDOW`` receives posted ahead.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from blitzplan.executor.transports import Chunk, Handle, Lane

if TYPE_CHECKING:
    from blitzplan.executor.runtime.worker import RankContext

TAG = 0
"""The torch.distributed tag of every chunk."""
WINDOW = 64
"""Receives a receiver keeps posted ahead on each lane: as many chunks as a sender keeps in
flight (``session.WINDOW`` writes of up to ``session.BATCH`` chunks), since gloo moves a chunk
only once its receive is posted."""


def pair_order(pair: tuple[int, int]) -> tuple[int, int, bool]:
    """The global order in which ranks make the communicators of directed pairs: by the pair's
    ranks, the lower rank's direction first."""
    return min(pair), max(pair), pair[0] > pair[1]


class TorchTransport:
    """One device's end: ``arena`` its buffers, ``out`` and ``into`` its lanes."""

    def __init__(
        self, ctx: RankContext, arena: torch.Tensor, *, out: Sequence[Lane], into: Sequence[Lane]
    ) -> None:
        self.ctx, self.arena = ctx, arena
        self.groups: dict[tuple[int, int], Any] = {}
        if ctx.backend == "nccl":
            pairs = {(ctx.rank, lane.peer) for lane in out}
            pairs |= {(lane.peer, ctx.rank) for lane in into}
            for pair in sorted(pairs, key=pair_order):
                ranks = sorted(pair)
                self.groups[pair] = dist.new_group(ranks, use_local_synchronization=True)

    def write(self, peer: int, chunks: tuple[Chunk, ...]) -> Handle:
        group = self.groups.get((self.ctx.rank, peer))
        works = []
        for chunk in chunks:
            data = self.arena[chunk.src : chunk.src + chunk.nbytes]
            wire = data if data.device == self.ctx.wire else data.to(self.ctx.wire)
            works.append(dist.isend(wire, dst=peer, tag=TAG, group=group))
        return works, peer, chunks

    def wait(self, handle: Handle) -> None:
        works, peer, chunks = handle
        for work, chunk in zip(works, chunks, strict=True):
            self.ctx.wait(work, f"sending a chunk to rank {peer}", chunk.failure(peer))

    def receivers(
        self, lanes: Sequence[Lane], landed: Callable[[Chunk], None]
    ) -> list[Callable[[], None]]:
        return [functools.partial(self._receive, lane, landed) for lane in lanes]

    def _receive(self, lane: Lane, landed: Callable[[Chunk], None]) -> None:
        group = self.groups.get((lane.peer, self.ctx.rank))
        pending: deque[tuple[Chunk, Any, torch.Tensor | None]] = deque()
        ahead = iter(lane.chunks)

        def post() -> None:
            chunk = next(ahead, None)
            if chunk is not None:
                view = self.arena[chunk.dst : chunk.dst + chunk.nbytes]
                on_wire = view.device == self.ctx.wire
                wire = None if on_wire else torch.empty_like(view, device=self.ctx.wire)
                into = view if wire is None else wire
                work = dist.irecv(into, src=lane.peer, tag=TAG, group=group)
                pending.append((chunk, work, wire))

        for _ in range(WINDOW):
            post()
        while pending:
            chunk, work, wire = pending.popleft()
            where = chunk.failure(lane.peer)
            self.ctx.wait(work, f"receiving a chunk from rank {lane.peer}", where)
            if wire is not None:
                self.arena[chunk.dst : chunk.dst + chunk.nbytes].copy_(wire)
                self.ctx.synchronize()
            landed(chunk)
            post()

    def close(self) -> None:
        """Destroy this run's NCCL communicators (the default group outlives the run)."""
        for group in self.groups.values():
            dist.destroy_process_group(group)
