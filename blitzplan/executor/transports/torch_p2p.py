"""The ``torch`` transport: one torch.distributed ``isend``/``irecv`` per write, in lane order.

A write's chunks go as one message (packed when they are not contiguous in the arena, unpacked
at the receiver). Messages match by order alone (one tag: NCCL has none). Under NCCL each
direction of a pair has its own communicator (made by every rank in one global order, destroyed
at the end), so a pair sending both ways never waits on itself. A receiver keeps ``WINDOW``
receives posted ahead.
"""

from __future__ import annotations

import functools
import itertools
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
WINDOW = 16
"""Receives a receiver keeps posted ahead on each lane: more writes than a sender keeps in flight
(``session.WINDOW``), since gloo moves a message only once its receive is posted."""


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
        data = self._span(chunks, "src")
        if data is None:
            data = torch.cat([self.arena[c.src : c.src + c.nbytes] for c in chunks])
        wire = data if data.device == self.ctx.wire else data.to(self.ctx.wire)
        group = self.groups.get((self.ctx.rank, peer))
        return dist.isend(wire, dst=peer, tag=TAG, group=group), peer, chunks

    def wait(self, handle: Handle) -> None:
        work, peer, chunks = handle
        self.ctx.wait(work, f"sending a chunk to rank {peer}", chunks[0].failure(peer))

    def _span(self, chunks: tuple[Chunk, ...], end: str) -> torch.Tensor | None:
        """The arena's bytes of ``chunks`` at their ``src`` or ``dst`` when contiguous there."""
        at = [getattr(c, end) for c in chunks]
        if any(a + c.nbytes != b for a, c, b in zip(at, chunks, at[1:], strict=False)):
            return None
        return self.arena[at[0] : at[-1] + chunks[-1].nbytes]

    def receivers(
        self, lanes: Sequence[Lane], landed: Callable[[Chunk], None]
    ) -> list[Callable[[], None]]:
        return [functools.partial(self._receive, lane, landed) for lane in lanes]

    def _receive(self, lane: Lane, landed: Callable[[Chunk], None]) -> None:
        group = self.groups.get((lane.peer, self.ctx.rank))
        pending: deque[tuple[tuple[Chunk, ...], Any, torch.Tensor | None]] = deque()
        ahead = iter(lane.writes)

        def post() -> None:
            if (chunks := next(ahead, None)) is not None:
                view = self._span(chunks, "dst")
                if view is None or view.device != self.ctx.wire:
                    size = sum(c.nbytes for c in chunks)
                    staged = torch.empty(size, dtype=torch.uint8, device=self.ctx.wire)
                    work = dist.irecv(staged, src=lane.peer, tag=TAG, group=group)
                    pending.append((chunks, work, staged))
                else:
                    pending.append(
                        (chunks, dist.irecv(view, src=lane.peer, tag=TAG, group=group), None)
                    )

        for _ in range(WINDOW):
            post()
        while pending:
            chunks, work, staged = pending.popleft()
            where = chunks[0].failure(lane.peer)
            self.ctx.wait(work, f"receiving a chunk from rank {lane.peer}", where)
            if staged is not None:  # unpack the message into each chunk's place
                at = itertools.accumulate((c.nbytes for c in chunks), initial=0)
                for chunk, lo in zip(chunks, at, strict=False):
                    self.arena[chunk.dst : chunk.dst + chunk.nbytes].copy_(
                        staged[lo : lo + chunk.nbytes]
                    )
                self.ctx.synchronize()
            for chunk in chunks:
                landed(chunk)
            post()

    def close(self) -> None:
        """Destroy this run's NCCL communicators (the default group outlives the run)."""
        for group in self.groups.values():
            dist.destroy_process_group(group)
