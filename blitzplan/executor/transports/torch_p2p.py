"""The ``torch`` transport: one torch.distributed ``isend``/``irecv`` per write, in lane order.

A write's chunks go as one message: the arena's bytes when they are contiguous there (and on the
wire's device), else a buffer of the write's own, made before the start (a run allocates
nothing), packed by the sender and unpacked by the receiver. Messages match by order alone (one
tag: NCCL has none). Under NCCL each direction of a pair has its own communicator (made by every
rank in one global order, destroyed at the end), so a pair sending both ways never waits on
itself. A receiver keeps ``WINDOW`` receives posted ahead.
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
Message = tuple[torch.Tensor, bool]
"""A write's bytes as sent or received, and whether they are staged (packed)."""
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
        self.messages = {**self._places(out, "src"), **self._places(into, "dst")}

    def _places(self, lanes: Sequence[Lane], end: str) -> dict[tuple[str, int, int], Message]:
        """Per write of ``lanes`` (by ``end`` and its first chunk's step and offset there), its
        message: the arena's bytes at ``end`` when contiguous and on the wire's device, else
        (``staged``) a buffer of its own."""
        places, staged = {}, []
        for write in (write for lane in lanes for write in lane.writes):
            view = self._span(write, end)
            if view is not None and view.device == self.ctx.wire:
                places[_key(write, end)] = (view, False)
            else:
                staged.append(write)
        sizes = [sum(c.nbytes for c in write) for write in staged]
        room = torch.zeros(sum(sizes), dtype=torch.uint8, device=self.ctx.wire)
        for write, lo, n in zip(
            staged, itertools.accumulate(sizes, initial=0), sizes, strict=False
        ):
            places[_key(write, end)] = (room[lo : lo + n], True)
        return places

    def _copy(self, chunks: tuple[Chunk, ...], staged: torch.Tensor, end: str) -> None:
        """Pack a write's chunks into its message (``end`` ``src``) or unpack it (``dst``)."""
        lo = 0
        for chunk in chunks:
            at = getattr(chunk, end)
            arena, part = self.arena[at : at + chunk.nbytes], staged[lo : lo + chunk.nbytes]
            (part if end == "src" else arena).copy_(arena if end == "src" else part)
            lo += chunk.nbytes
        self.ctx.synchronize()

    def write(self, peer: int, chunks: tuple[Chunk, ...]) -> Handle:
        data, staged = self.messages[_key(chunks, "src")]
        if staged:
            self._copy(chunks, data, "src")
        group = self.groups.get((self.ctx.rank, peer))
        return dist.isend(data, dst=peer, tag=TAG, group=group), peer, chunks

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
        pending: deque[tuple[tuple[Chunk, ...], Any]] = deque()
        ahead = iter(lane.writes)

        def post() -> None:
            if (chunks := next(ahead, None)) is not None:
                into, _ = self.messages[_key(chunks, "dst")]
                pending.append((chunks, dist.irecv(into, src=lane.peer, tag=TAG, group=group)))

        for _ in range(WINDOW):
            post()
        while pending:
            chunks, work = pending.popleft()
            where = chunks[0].failure(lane.peer)
            self.ctx.wait(work, f"receiving a chunk from rank {lane.peer}", where)
            into, staged = self.messages[_key(chunks, "dst")]
            if staged:
                self._copy(chunks, into, "dst")
            for chunk in chunks:
                landed(chunk)
            post()

    def close(self) -> None:
        """Destroy this run's NCCL communicators (the default group outlives the run)."""
        for group in self.groups.values():
            dist.destroy_process_group(group)


def _key(chunks: tuple[Chunk, ...], end: str) -> tuple[str, int, int]:
    return end, chunks[0].step, getattr(chunks[0], end)
