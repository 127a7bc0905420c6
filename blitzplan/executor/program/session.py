"""One device's part of a run: fill its arena, stream its steps over the transport, check.

Before the shared start the device fills its arena from the checkpoint
(:meth:`~blitzplan.models.layout.Layout.rank_buffer`: a serving GPU its own buffer, host memory
every rank's, a new GPU the bytes ``held`` says), packs what its resharding steps send
(:meth:`~blitzplan.models.layout.Layout.reshard`; vocabulary padding stays zero) and opens its
end of the transport. After it, one thread per received step takes its chunks in order, and one
thread per sent step streams its units in order, each chunk as soon as those bytes are here
(held, or landed over any step), no faster than the step's pace (the link it stands for is busy
``chunk / pace`` seconds a chunk), not before ``not_before_s``, the end of the steps in ``after``
and, for ``store_and_forward``, the end of every step feeding it. A device reports its position
(``at``: unit, step, chunk) as it starts each unit of a step; an injected fault fires there, or
once the unit's first chunk has landed. A new GPU then compares every unit with its rank buffer.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from blitzplan.executor.program.bytestore import ByteStore, equal_chunks
from blitzplan.executor.program.jobs import DeviceJob, RecvPlan, SendPlan, arena_bases
from blitzplan.executor.runtime.failures import Failure, TransferError, join_threads, start_thread
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.smallmodel.checkpoint import checkpoint_tensors
from blitzplan.executor.transports import Chunk, open_transport
from blitzplan.models.layout import Layout, layout


@dataclass(frozen=True)
class DeviceReport:
    """What a device measured, times from the shared start: per unit when it was complete (nan:
    never), per checked unit whether it is bit-exact, per sent step its first byte out and its
    end, per received step its last byte in and its bytes, and bytes that came twice."""

    rank: int
    complete_s: tuple[float, ...]
    bit_exact: tuple[bool, ...]
    sent_start_s: dict[int, float]
    sent_end_s: dict[int, float]
    received_end_s: dict[int, float]
    received_bytes: dict[int, int]
    duplicate_bytes: int


class ProgramSession:
    """One device's arena, byte store, transport and threads for one run."""

    def __init__(self, ctx: RankContext, job: DeviceJob) -> None:
        self.ctx, self.job = ctx, job
        program = job.program
        self.target = layout(program.spec, program.tp)
        self.own = layout(program.spec, job.holds[0]) if job.holds else self.target
        sizes = job.unit_sizes()
        packed = sum(n for s in job.sends if s.reshard for _, _, _, n in s.pieces)
        self.bases = arena_bases(sizes)
        self.arena = torch.zeros(self.bases[-1] + packed, dtype=torch.uint8, device=ctx.device)
        self.store = ByteStore(sizes)
        self.packed: dict[tuple[int, int, int], int] = {}
        """Where a resharding step's bytes (step, unit, offset) sit in the arena."""
        self.sent_start_s: dict[int, float] = {}
        self.sent_end_s: dict[int, float] = {}
        self.received_end_s: dict[int, float] = {}
        self.received_bytes: dict[int, int] = {}
        steps = [p.step for p in job.sends] + [p.step for p in job.recvs]
        self._done = {step: threading.Event() for step in steps}
        self._threads: list[threading.Thread] = []
        self._full: dict[int, dict[str, Any]] = {}
        self._fill()
        peers = {p.peer for p in job.sends} | {p.peer for p in job.recvs}
        self.transport = open_transport(
            job.transport,
            ctx,
            self.arena,
            run=job.run,
            writes_to=tuple(sorted(job.peer_bases)),
            peers=tuple(sorted(peers)),
        )

    # --- before the start -------------------------------------------------------------------

    def buffer(self, unit: int) -> torch.Tensor:
        return self.arena[self.bases[unit] : self.bases[unit + 1]]

    def expected(self, unit: int, rank: int, lay: Layout | None = None) -> torch.Tensor:
        """Rank ``rank``'s buffer of ``unit`` under ``lay`` (default: the target layout)."""
        if unit not in self._full:
            self._full[unit] = checkpoint_tensors(self.job.checkpoint, unit)
        data = (lay or self.target).rank_buffer(unit, rank, self._full[unit])
        return torch.from_numpy(np.ascontiguousarray(data))

    def _put(self, unit: int, lo: int, data: torch.Tensor) -> None:
        self.buffer(unit)[lo : lo + data.numel()].copy_(data)
        self.store.arrived(unit, lo, lo + data.numel(), 0.0)

    def _fill(self) -> None:
        job = self.job
        for unit in range(len(self.target.units)):
            if job.holds is not None:
                self._put(unit, 0, self.expected(unit, job.holds[1], self.own))
            elif job.every_rank:
                ranks = range(job.program.tp)
                self._put(unit, 0, torch.cat([self.expected(unit, r) for r in ranks]))
        for unit, lo, hi in job.held:
            self._put(unit, lo, self.expected(unit, self._gpu_rank())[lo:hi])
        at = self.bases[-1]
        for send in job.sends:
            if send.reshard is not None:
                at = self._pack(send, at)

    def _gpu_rank(self) -> int:
        if self.job.gpu_rank is None:
            raise TransferError(Failure(f"{self.job.label} holds bytes but has no TP rank"))
        return self.job.gpu_rank

    def _pack(self, send: SendPlan, at: int) -> int:
        """A resharding step's bytes, packed from this device's own buffer from ``at`` on."""
        _, source_rank, rank = send.reshard or (0, 0, 0)
        for unit, offset, _, length in send.pieces:
            size = self.target.unit_bytes[unit]
            lo, hi = Fraction(offset, size), Fraction(offset + length, size)
            copies = self.target.reshard(unit, self.own, source_rank, rank, lo, hi)
            for src, dst, n in copies:
                start = at + dst - offset
                self.arena[start : start + n] = self.buffer(unit)[src : src + n]
            self.packed[(send.step, unit, offset)] = at
            at += length
        return at

    # --- after the start --------------------------------------------------------------------

    @property
    def wait_s(self) -> float:
        """How long a thread waits on this device's own bytes or steps: twice the transfer
        timeout, so that a stalled peer is named by the transfer that times out first."""
        return 2 * self.ctx.timeout_s

    def start(self) -> None:
        """Start every step's thread (units complete before the start are reported first)."""
        for unit in range(len(self.target.units)):
            if self.job.check and self.store.coverage[unit].complete_s is not None:
                self.ctx.emit("unit", (unit, 0.0))
        for recv in self.job.recvs:
            self.spawn(functools.partial(self._receive, recv), f"receive-step{recv.step}")
        for send in self.job.sends:
            self.spawn(functools.partial(self._send, send), f"send-step{send.step}")

    def spawn(self, body: Callable[[], None], name: str) -> None:
        """Run ``body`` in a thread of this device; its failure stops the device (see join)."""
        start_thread(self._threads, body, name, self.store.fail)

    def _receive(self, recv: RecvPlan) -> None:
        ctx, store, moved = self.ctx, self.store, 0
        for unit, _, dst, length in recv.pieces:
            for k, (a, b) in enumerate(
                equal_chunks(dst, dst + length, self.job.program.chunk_bytes)
            ):
                chunk = Chunk(recv.step, unit, recv.peer, 0, self.bases[unit] + a, a, b)
                self.transport.landed(chunk)
                moved += b - a
                if k == 0:
                    ctx.emit("at", (unit, recv.step, (a, b)))
                    ctx.maybe_fail(unit)
                if store.arrived(unit, a, b, ctx.now()) and self.job.check:
                    ctx.emit("unit", (unit, store.complete_s(unit)))
        self.received_end_s[recv.step] = ctx.now()
        self.received_bytes[recv.step] = moved
        self._done[recv.step].set()

    def _gate_s(self, send: SendPlan) -> float:
        """When the step may start: ``not_before_s``, the steps in ``after`` ended, and for
        store-and-forward every feeding step ended (all of these are on this device)."""
        gate = send.not_before_s
        waits = [*send.after, *(send.feeds if send.store_and_forward else ())]
        for prior in waits:
            if not self._done[prior].wait(self.wait_s):
                raise TransferError(Failure(f"step {send.step} waited too long for step {prior}"))
            ends = self.sent_end_s if prior in send.after else self.received_end_s
            gate = max(gate, ends[prior])
        self.ctx.sleep_until(gate)
        return gate

    def _send(self, send: SendPlan) -> None:
        ctx, store, bases = self.ctx, self.store, self.job.peer_bases[send.peer]
        free_s = self._gate_s(send)
        for unit, src, dst, length in send.pieces:
            packed = self.packed.get((send.step, unit, src))
            for k, (a, b) in enumerate(equal_chunks(0, length, self.job.program.chunk_bytes)):
                if packed is None:
                    ready_s = store.wait_range(unit, src + a, src + b, self.wait_s)
                    origin = self.bases[unit] + src + a
                else:
                    ready_s, origin = 0.0, packed + a
                free_s = max(free_s, ready_s)
                self.sent_start_s.setdefault(send.step, max(free_s, ctx.now()))
                chunk = Chunk(
                    send.step, unit, send.peer, origin, bases[unit] + dst + a, dst + a, dst + b
                )
                if k == 0:
                    ctx.emit("at", (unit, send.step, (chunk.lo, chunk.hi)))
                    ctx.maybe_fail(unit)
                if send.pace_bytes_per_s is not None:
                    free_s += (b - a) / send.pace_bytes_per_s
                    ctx.sleep_until(free_s)
                self.transport.write(chunk)
                if send.pace_bytes_per_s is None:
                    free_s = ctx.now()
        self.sent_end_s[send.step] = max(free_s, ctx.now())
        self._done[send.step].set()

    def join(self) -> None:
        """Wait for every thread; raise the first failure of this device."""
        try:
            join_threads(self._threads, lambda: self.store.error)
        finally:
            if self.store.error is None:
                self.transport.close()

    def report(self) -> DeviceReport:
        """The measured times and, on a checked GPU, every unit compared with its buffer."""
        units = range(len(self.target.units))
        exact: tuple[bool, ...] = ()
        if self.job.check:
            rank = self._gpu_rank()
            exact = tuple(
                bool(torch.equal(self.buffer(u).cpu(), self.expected(u, rank))) for u in units
            )
        return DeviceReport(
            rank=self.job.rank,
            complete_s=tuple(self.store.complete_s(u) for u in units),
            bit_exact=exact,
            sent_start_s=dict(self.sent_start_s),
            sent_end_s=dict(self.sent_end_s),
            received_end_s=dict(self.received_end_s),
            received_bytes=dict(self.received_bytes),
            duplicate_bytes=self.store.duplicate_bytes,
        )


def program_job(ctx: RankContext, job: DeviceJob) -> DeviceReport:
    """A worker's part of a run: fill, wait for the shared start, stream, check."""
    session = ProgramSession(ctx, job)
    ctx.ready()
    session.start()
    session.join()
    return session.report()
