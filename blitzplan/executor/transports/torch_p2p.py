"""The ``torch`` transport: one torch.distributed ``isend``/``irecv`` per write, in lane order.

A write's chunks go as one message (packed and unpacked through buffers made before the start
where they are not contiguous), matched by order alone (NCCL has no tags). Every lane has a thread
of its own, so that lanes move at once (gloo's ``isend`` copies into the socket on the calling
thread, and tells a transfer has completed only by a blocking ``wait``): a sender starts the
lane's writes in order as they are posted (a relay once the write that brings its bytes lands,
sent from where they landed) and waits for the oldest; a receiver keeps ``WINDOW`` receives
posted, waits for them in order, wakes the lanes that relay one and unpacks it. What completes is
queued, timed, for :meth:`poll`.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from blitzplan.executor.runtime.failures import Failure, TransferError
from blitzplan.executor.transports import Done, Lane, Write, relays, runs, writes

if TYPE_CHECKING:
    from blitzplan.executor.runtime.worker import RankContext

Moved = tuple[list[torch.Tensor], torch.Tensor]
"""A write's views of the arena and the tensor it is sent from or received into."""
WINDOW = 16
"""Receives posted ahead on each lane: more than a sender keeps in flight (``session.WINDOW``)."""


def pair_groups(ctx: RankContext, out: Sequence[Lane], into: Sequence[Lane]) -> dict[Any, Any]:
    """Under NCCL, a communicator per direction of each pair, made in one global order (by the
    pair's ranks, the lower rank's direction first) and destroyed at the end."""
    if ctx.backend != "nccl":
        return {}
    pairs = {(ctx.rank, o.peer) for o in out} | {(i.peer, ctx.rank) for i in into}
    return {
        pair: dist.new_group(sorted(pair), use_local_synchronization=True)
        for pair in sorted(pairs, key=lambda p: (min(p), max(p), p[0] > p[1]))
    }


class TorchTransport:
    """One device's end: ``arena`` its buffers, ``out`` and ``into`` its lanes."""

    poll_s = idle_s = 0.05
    """A poll wakes as soon as a waiter queues something: an idle one may wait long."""

    def __init__(
        self, ctx: RankContext, arena: torch.Tensor, *, out: Sequence[Lane], into: Sequence[Lane]
    ) -> None:
        self.ctx, self.arena = ctx, arena
        self.groups = pair_groups(ctx, out, into)
        self.staged = self._staging(out, "src") | self._staging(into, "dst")
        self.relayed = relays(out, into)
        self.landed: set[int] = {-1}
        """The writes received here (by id; -1 stands for the bytes of a write not relayed)."""
        self.feeds: dict[int, set[int]] = {}
        """Per write received (by id), the lanes (by peer) with a relay of it."""
        for peer, write in ((o.peer, w) for o in out for w in o.writes):
            self.feeds.setdefault(self.relayed.get(id(write), -1), set()).add(peer)
        self.posted = {o.peer: deque[Write]() for o in out}
        """Per lane, the writes posted, not started, in order; its sender waits on ``wake``."""
        self.wake, self.closing = {o.peer: threading.Condition() for o in out}, False
        self.done: queue.SimpleQueue[tuple[str, Done] | TransferError] = queue.SimpleQueue()
        bodies = [(self._sends, o) for o in out] + [(self._receives, i) for i in into]
        self.threads = [threading.Thread(target=self._waiting, args=b, daemon=True) for b in bodies]
        for thread in self.threads:
            thread.start()

    def _staging(self, lanes: Sequence[Lane], end: str) -> dict[tuple[str, int], Moved]:
        """Per write of ``lanes`` (by ``(end, id)``) its views of the arena at ``end`` and the
        tensor on the wire: its one view, else its part of one buffer made now."""
        views = {id(w): [self.arena[lo:hi] for _, lo, hi in runs(w, end)] for w in writes(lanes)}
        staged = [k for k, v in views.items() if self.arena.device != self.ctx.wire or len(v) > 1]
        sizes = [sum(v.numel() for v in views[k]) for k in staged]
        whole = torch.zeros(sum(sizes), dtype=torch.uint8, device=self.ctx.wire)
        wire = dict(zip(staged, torch.split(whole, sizes), strict=True))
        return {(end, k): (v, wire.get(k, v[0])) for k, v in views.items()}

    def _move(self, views: list[torch.Tensor], staged: torch.Tensor, *, pack: bool) -> None:
        """Copy the arena's ``views`` into ``staged`` one after the other (``pack``), or back."""
        parts = torch.split(staged, [view.numel() for view in views])
        for view, part in zip(views, parts, strict=True):
            (part if pack else view).copy_(view if pack else part)
        self.ctx.synchronize()

    def post(self, peer: int, write: Write) -> None:
        """Hand ``write`` to its lane's sender, after those posted before it."""
        with self.wake[peer]:
            self.posted[peer].append(write)
            self.wake[peer].notify()

    def _waiting(self, body: Any, *args: Any) -> None:
        """Run a thread's ``body``, queueing its failure for :meth:`poll` to raise."""
        try:
            body(*args)
        except TransferError as exc:
            self.done.put(exc)

    def _sends(self, lane: Lane) -> None:
        """The lane's sender (module docstring), until closed with nothing left."""
        peer, group = lane.peer, self.groups.get((self.ctx.rank, lane.peer))
        queued, flying, found = self.posted[peer], deque[tuple[Write, Any]](), list[Write]()
        while found or flying or not self.closing:
            with self.wake[peer]:
                found = []
                while queued and self.relayed.get(id(queued[0]), -1) in self.landed:
                    found.append(queued.popleft())
                if not found and not flying and not self.closing:
                    self.wake[peer].wait()
            for write in found:
                views, data = self.staged[("src", id(write))]
                if (relay := self.relayed.get(id(write))) is not None:
                    data = self.staged[("dst", relay)][1]
                elif data is not views[0]:
                    self._move(views, data, pack=True)
                try:
                    flying.append((write, dist.isend(data, peer, group)))
                except RuntimeError as exc:
                    message = f"sending a chunk to rank {peer} failed: {Failure.quote(exc)}"
                    raise TransferError(write[0].failure(peer, message)) from None
            if flying:
                write, work = flying.popleft()
                self.ctx.wait(work, f"sending a chunk to rank {peer}", write[0].failure(peer))
                self.done.put(("sent", (write, self.ctx.now())))

    def _receives(self, lane: Lane) -> None:
        """The lane's receiver (module docstring)."""
        group, ahead = self.groups.get((lane.peer, self.ctx.rank)), iter(lane.writes)
        posted: deque[tuple[Write, Any, list[torch.Tensor], torch.Tensor]] = deque()

        def post() -> None:
            if (write := next(ahead, None)) is not None:
                views, view = self.staged[("dst", id(write))]
                work = dist.irecv(view, src=lane.peer, group=group)
                posted.append((write, work, views, view))

        for _ in range(WINDOW):
            post()
        while posted:
            write, work, views, view = posted.popleft()
            where = write[0].failure(lane.peer)
            self.ctx.wait(work, f"receiving a chunk from rank {lane.peer}", where)
            self.landed.add(id(write))
            for peer in self.feeds.get(id(write), ()):
                with self.wake[peer]:
                    self.wake[peer].notify()
            if view is not views[0]:
                self._move(views, view, pack=False)
            self.done.put(("landed", (write, self.ctx.now())))
            post()

    def poll(self, wait_s: float) -> tuple[list[Done], list[Done]]:
        """What the threads queued, waiting up to ``wait_s`` for the first of it."""
        found: dict[str, list[Done]] = {"sent": [], "landed": []}
        try:
            item = self.done.get(timeout=wait_s) if wait_s > 0 else self.done.get_nowait()
            while True:
                if isinstance(item, TransferError):
                    raise item
                found[item[0]].append(item[1])
                item = self.done.get_nowait()
        except queue.Empty:
            return found["sent"], found["landed"]

    def stalled(self) -> TransferError:
        """A lane's thread names its stalled transfer when its own wait times out."""
        try:
            self.poll(self.ctx.timeout_s)  # raises the failure a thread queued
        except TransferError as exc:
            return exc
        return TransferError(Failure(f"no transfer ended in {2 * self.ctx.timeout_s:g} s"))

    def close(self) -> None:
        """End the lanes' threads; destroy this run's NCCL communicators."""
        self.closing = True
        for wake in self.wake.values():
            with wake:
                wake.notify()
        for thread in self.threads:
            thread.join()
        for group in self.groups.values():
            dist.destroy_process_group(group)
