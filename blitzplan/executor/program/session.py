"""One device's part of a run: fill its arena, stream its lanes over the transport, check.

Before the shared start the device fills its arena from the checkpoint and opens its end of the
transport. After it, receivers hand over chunks as they land, and one thread per outgoing lane
writes its chunks in order, each once its bytes are here, no faster than its step's pace (``chunk
/ pace`` seconds a chunk) and not before the step's gate (``not_before_s``, the ends of the steps
in ``after`` and, for store-and-forward, of every step feeding it), a write (its lane's chunks
that move as one message) once its last chunk may go; ``WINDOW`` writes stay in flight, and a
thread about to wait first sees its writes out. A device reports
``at`` (unit, step, chunk) as it starts each unit of a step, where an injected fault fires; a new
GPU then compares every unit with its rank buffer.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from blitzplan.executor.program.bytestore import ByteStore
from blitzplan.executor.program.devices import DeviceJob, SendStep
from blitzplan.executor.runtime.failures import Failure, TransferError
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.smallmodel.checkpoint import checkpoint_tensors
from blitzplan.executor.transports import Chunk, Handle, Lane, open_transport
from blitzplan.models.layout import Layout, layout

WINDOW = 4
"""Writes a lane keeps in flight."""


@dataclass
class DeviceReport:
    """What a device measured, times from the shared start: per sent step its first byte out and
    its end, per received step its last byte in and its bytes; per unit when it was complete
    (nan: never), per checked unit whether it is bit-exact; bytes that came twice; the CPU
    seconds of its process (every thread) from the start to its threads' end."""

    rank: int
    received_bytes: dict[int, int]
    sent_start_s: dict[int, float] = field(default_factory=dict)
    sent_end_s: dict[int, float] = field(default_factory=dict)
    received_end_s: dict[int, float] = field(default_factory=dict)
    complete_s: tuple[float, ...] = ()
    bit_exact: tuple[bool, ...] = ()
    duplicate_bytes: int = 0
    cpu_s: float = 0.0


class ProgramSession:
    """One device's arena, byte store, transport and threads for one run."""

    def __init__(self, ctx: RankContext, job: DeviceJob) -> None:
        self.ctx, self.job = ctx, job
        self.target = layout(job.spec, job.tp)
        self.arena = torch.zeros(job.arena_bytes, dtype=torch.uint8, device=ctx.device)
        self.store = ByteStore(job.sizes)
        self.measured = DeviceReport(job.rank, dict.fromkeys(job.received, 0))
        self._left = dict(job.received)
        self._unsent = {key: step.chunks for key, step in job.sends.items()}
        self._done = {key: threading.Event() for key in (*job.sends, *job.received)}
        self._seen: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._full: dict[int, dict[str, Any]] = {}
        self._fill()
        self.transport = open_transport(
            job.transport, ctx, self.arena, run=job.run, out=job.out, into=job.into
        )

    # --- before the start -------------------------------------------------------------------

    def buffer(self, unit: int) -> torch.Tensor:
        return self.arena[self.job.bases[unit] : self.job.bases[unit + 1]]

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
        for unit in range(len(job.sizes)):
            if job.holds is not None:
                own = layout(job.spec, job.holds[0])
                self._put(unit, 0, self.expected(unit, job.holds[1], own))
            elif job.every_rank:
                self._put(unit, 0, torch.cat([self.expected(unit, r) for r in range(job.tp)]))
        for unit, lo, hi in job.held:
            self._put(unit, lo, self.expected(unit, self._gpu_rank())[lo:hi])
        for unit, src, at, n in job.packs:
            self.arena[at : at + n] = self.buffer(unit)[src : src + n]

    def _gpu_rank(self) -> int:
        if self.job.gpu_rank is None:
            raise TransferError(Failure(f"{self.job.label} holds bytes but has no TP rank"))
        return self.job.gpu_rank

    # --- after the start --------------------------------------------------------------------

    @property
    def wait_s(self) -> float:
        """How long a thread waits on this device's own bytes or steps: twice the transfer
        timeout, so that a stalled peer is named by the transfer that times out first."""
        return 2 * self.ctx.timeout_s

    def start(self) -> None:
        """Start the receivers and a thread per outgoing lane (units complete before the start
        are reported first)."""
        self.measured.cpu_s = -time.process_time()
        for unit in range(len(self.job.sizes)):
            if self.job.check and self.store.coverage[unit].complete_s is not None:
                self.ctx.emit("unit", (unit, 0.0))
        for k, body in enumerate(self.transport.receivers(self.job.into, self._landed)):
            self.spawn(body, f"receive-{k}")
        for lane in self.job.out:
            self.spawn(functools.partial(self._send, lane), f"send-rank{lane.peer}")

    def spawn(self, body: Callable[[], None], name: str) -> None:
        """Run ``body`` in a daemon thread of this device; its failure stops the device."""

        def run() -> None:
            try:
                body()
            except TransferError as exc:
                self.store.fail(exc)
            except Exception as exc:
                self.store.fail(TransferError(Failure(f"{type(exc).__name__}: {exc}")))

        self._threads.append(threading.Thread(target=run, name=name, daemon=True))
        self._threads[-1].start()

    def _at(self, chunk: Chunk) -> None:
        """Report the first chunk of each unit of each step, and fire a fault there."""
        if (chunk.step, chunk.unit) not in self._seen:
            self._seen.add((chunk.step, chunk.unit))
            self.ctx.emit("at", (chunk.unit, chunk.step, (chunk.lo, chunk.hi)))
            self.ctx.maybe_fail(chunk.unit)

    def _landed(self, chunk: Chunk) -> None:
        now, key = self.ctx.now(), chunk.step
        with self._lock:
            self._at(chunk)
            if self.store.arrived(chunk.unit, chunk.lo, chunk.hi, now) and self.job.check:
                self.ctx.emit("unit", (chunk.unit, self.store.complete_s(chunk.unit)))
            self.measured.received_bytes[key] += chunk.nbytes
            self._count(self._left, key, 1, self.measured.received_end_s)

    def _gate_s(self, step: SendStep) -> float:
        """When the step may start (module docstring); every step it waits for is here."""
        gate = step.not_before_s
        for prior in (*step.after, *step.waits_for):
            if not self._done[prior].wait(self.wait_s):
                raise TransferError(Failure(f"a step waited too long for step {prior}"))
            ends = self.measured.sent_end_s if prior in step.after else self.measured.received_end_s
            gate = max(gate, ends[prior])
        self.ctx.sleep_until(gate)
        return gate

    def _send(self, lane: Lane) -> None:
        ctx, sends = self.ctx, self.job.sends
        flying: deque[Handle] = deque()
        free_s: dict[int, float] = {}
        for write in lane.writes:
            key = write[0].step
            step = sends[key]
            if key not in free_s:
                self._settle(flying, 0)
                free_s[key] = self._gate_s(step)
            for chunk in write:
                self._at(chunk)
                at_s = max(free_s[key], self._ready_s(chunk, flying))
                self.measured.sent_start_s.setdefault(key, max(at_s, ctx.now()))
                if step.pace_bytes_per_s is not None:
                    at_s += chunk.nbytes / step.pace_bytes_per_s
                    if at_s > ctx.now():
                        self._settle(flying, 0)
                        ctx.sleep_until(at_s)
                free_s[key] = at_s
            flying.append(self.transport.write(lane.peer, write))
            self._settle(flying, WINDOW)
        self._settle(flying, 0)

    def _ready_s(self, chunk: Chunk, flying: deque[Handle]) -> float:
        """When the chunk's bytes were here (0: packed before the start); waits for them, first
        seeing this lane's writes out."""
        if chunk.held is None:
            return 0.0
        span = (chunk.unit, chunk.held, chunk.held + chunk.nbytes)
        if (ready_s := self.store.since(*span)) is None:
            self._settle(flying, 0)
            ready_s = self.store.wait_range(*span, self.wait_s)
        return ready_s

    def _settle(self, flying: deque[Handle], keep: int) -> None:
        """See writes out until ``keep`` are in flight; a step's end is its last write's."""
        while len(flying) > keep:
            handle = flying.popleft()
            self.transport.wait(handle)
            chunks = handle[2]
            self._count(self._unsent, chunks[0].step, len(chunks), self.measured.sent_end_s)

    def _count(self, left: dict[int, int], key: int, done: int, ends: dict[int, float]) -> None:
        """``done`` more chunks of step ``key``: at its last, its end is now."""
        left[key] -= done
        if left[key] == 0:
            ends[key] = self.ctx.now()
            self._done[key].set()

    def join(self) -> None:
        """Wait for every thread; raise the first failure of this device."""
        try:
            for thread in self._threads:
                while thread.is_alive() and self.store.error is None:
                    thread.join(0.05)
            if self.store.error is not None:
                raise self.store.error
            self.measured.cpu_s += time.process_time()
        finally:
            if self.store.error is None:
                self.transport.close()

    def report(self) -> DeviceReport:
        """The measured times and, on a checked GPU, every unit compared with its buffer."""
        units, found = range(len(self.job.sizes)), self.measured
        if self.job.check:
            rank = self._gpu_rank()
            equal = [torch.equal(self.buffer(u).cpu(), self.expected(u, rank)) for u in units]
            found.bit_exact = tuple(bool(e) for e in equal)
        found.complete_s = tuple(self.store.complete_s(u) for u in units)
        found.duplicate_bytes = self.store.duplicate_bytes
        return found


def program_job(ctx: RankContext, job: DeviceJob) -> DeviceReport:
    """A worker's part of a run: fill, wait for the shared start, stream, check."""
    session = ProgramSession(ctx, job)
    ctx.ready()
    session.start()
    session.join()
    return session.report()
