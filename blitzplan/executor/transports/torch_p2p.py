"""The ``torch`` transport: torch.distributed point-to-point send and receive of each chunk.

gloo (on the CPU, or through host memory from a GPU) matches messages by tag: a chunk of step
``k`` travels with tag ``TAG + k``. NCCL has no tags: every pair of ranks that exchanges chunks
gets a communicator of its own (``new_group`` with local synchronization, created in the same
order on both ranks), and the runner refuses a program whose pair carries two steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from blitzplan.executor.transports import Chunk

if TYPE_CHECKING:
    from blitzplan.executor.runtime.worker import RankContext

TAG = 1
"""torch.distributed tag of step ``k``'s chunks: ``TAG + k``."""


class TorchTransport:
    """One device's end: ``arena`` its buffers, ``peers`` the ranks it exchanges chunks with."""

    def __init__(self, ctx: RankContext, arena: torch.Tensor, *, peers: tuple[int, ...]) -> None:
        self.ctx, self.arena = ctx, arena
        self.groups: dict[int, Any] = {}
        if ctx.backend == "nccl":
            for peer in sorted(peers):
                pair = sorted((ctx.rank, peer))
                self.groups[peer] = dist.new_group(pair, use_local_synchronization=True)

    def _where(self, chunk: Chunk) -> dict[str, Any]:
        group = self.groups.get(chunk.peer)
        where: dict[str, Any] = {"step": chunk.step, "chunk": (chunk.lo, chunk.hi)}
        return {**where, "group": group} if group is not None else where

    def write(self, chunk: Chunk) -> None:
        data = self.arena[chunk.src : chunk.src + chunk.nbytes]
        wire = data if data.device == self.ctx.wire else data.to(self.ctx.wire)
        tag = TAG + chunk.step
        self.ctx.send(wire, chunk.peer, layer=chunk.unit, tag=tag, **self._where(chunk))

    def landed(self, chunk: Chunk) -> None:
        view = self.arena[chunk.dst : chunk.dst + chunk.nbytes]
        tag = TAG + chunk.step
        if view.device == self.ctx.wire:
            self.ctx.recv(view, chunk.peer, layer=chunk.unit, tag=tag, **self._where(chunk))
            return
        staging = torch.empty(chunk.nbytes, dtype=torch.uint8, device=self.ctx.wire)
        self.ctx.recv(staging, chunk.peer, layer=chunk.unit, tag=tag, **self._where(chunk))
        view.copy_(staging)
        self.ctx.synchronize()

    def close(self) -> None:
        """Nothing to release: the process group outlives the run."""
