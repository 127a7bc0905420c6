"""One device's part of a run: fill its arena, run its one loop over the transport, check.

The loop polls the transport for writes that have left and landed, then posts on each lane every
write that may go, in lane order, up to ``WINDOW`` in flight: once the writes that bring its bytes
have landed (an unpaced relay the transport forwards: before), at its step's pace, after the
step's ``not_before_s`` and the steps in its ``after``. Idle, the loop backs off from the
transport's ``poll_s`` to its ``idle_s``; with nothing heard for the transfer timeout, the
transport names the oldest open transfer.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from blitzplan.executor.program.devices import DeviceJob
from blitzplan.executor.runtime.failures import Failure, TransferError
from blitzplan.executor.runtime.worker import RankContext
from blitzplan.executor.smallmodel.llama import hf_arrays, init_unit, model_dims
from blitzplan.executor.transports import Write, open_transport, runs, writes

WINDOW = 8
"""Writes a lane keeps in flight."""
ASK_S = 1e-3
"""How often a device asks the group's store whether another device's step it waits for ended."""


@dataclass
class DeviceReport:
    """What a device measured (times from the shared start): per step its first byte out, ends
    and bytes; per unit when it was complete (nan: never) and, checked, whether bit-exact."""

    received_bytes: dict[int, int]
    sent_start_s: dict[int, float] = field(default_factory=dict)
    sent_end_s: dict[int, float] = field(default_factory=dict)
    received_end_s: dict[int, float] = field(default_factory=dict)
    complete_s: list[float] = field(default_factory=list)
    bit_exact: tuple[bool, ...] = ()


class ProgramSession:
    """One device's arena and transport for one run; ``live``: each unit complete is a ``unit``
    event for live serving's coordinator, and the loop may run on a thread (:meth:`start`)."""

    def __init__(self, ctx: RankContext, job: DeviceJob, *, live: bool = False) -> None:
        self.ctx, self.job, self.live = ctx, job, live
        self.arena = torch.zeros(job.arena_bytes, dtype=torch.uint8, device=ctx.device)
        self._left = Counter(c.step for lane in job.into for c in lane.chunks)
        self._unsent = Counter(c.step for lane in job.out for c in lane.chunks)
        self.measured = DeviceReport(dict.fromkeys(self._left, 0))
        self.measured.complete_s = [math.nan] * len(job.sizes)
        self.whole = [threading.Event() for _ in job.sizes]
        self.loop: Future[None] | None = None
        self._seen: set[tuple[int, int]] = set()
        self._free_s: dict[int, float] = {}  # per step begun: when its last write was due
        self._peer = {c.step: lane.peer for lane in job.out for c in lane.chunks}
        self._flying = {lane.peer: 0 for lane in job.out}
        self._next = {lane.peer: 0 for lane in job.out}
        self._full: dict[int, dict[str, Any]] = {}
        self._needs = {id(w): need for w, need in zip(writes(job.out), job.needs, strict=True)}
        self._index = {id(w): k for k, w in enumerate(writes(job.into))}
        self._runs = {id(w): runs(w, "lo") for w in writes(job.into)}
        self._told: dict[int, float] = {}  # per step of two other devices waited for: its end
        self._asked_s: dict[int, float] = {}  # per such step waited for: when to ask again
        self._landed_s: dict[int, float] = {}  # per write received (by index): when it landed
        self._missing = Counter(u for w in writes(job.into) for u, _, _ in self._runs[id(w)])
        self._fill()
        checked = range(len(job.sizes)) if job.check else ()  # compared after the run (report)
        self._wanted = [self.own(u).numpy() for u in checked]
        self.transport = open_transport(
            job.transport, ctx, self.arena, run=job.run, out=job.out, into=job.into
        )

    def buffer(self, unit: int) -> torch.Tensor:
        return self.arena[self.job.bases[unit] : self.job.bases[unit + 1]]

    def own(self, unit: int) -> torch.Tensor:
        """This device's buffer of ``unit`` (its job's ``buffer``) of the seeded weights."""
        if unit not in self._full:
            dims = model_dims(self.job.spec)
            self._full[unit] = hf_arrays(dims, unit, init_unit(dims, unit))
        held, ranks = self.job.ranks
        data = [held.rank_buffer(unit, rank, self._full[unit]) for rank in ranks]
        return torch.from_numpy(np.concatenate(data))

    def _fill(self) -> None:
        """What the device has at the start; then the packs of resharding steps."""
        job = self.job
        for unit, spans in job.have.items():
            for lo, hi in spans:
                self.buffer(unit)[lo:hi] = self.own(unit)[lo:hi]
        for unit, src, at, n in job.packs:
            self.arena[at : at + n] = self.buffer(unit)[src : src + n]
        for unit, whole in enumerate(job.whole):
            if whole and not self._missing[unit]:
                self._complete(unit, 0.0)

    def _complete(self, unit: int, at_s: float) -> None:
        self.measured.complete_s[unit] = at_s
        self.whole[unit].set()
        if self.live:
            self.ctx.emit("unit", (unit, at_s))

    def wait_unit(self, unit: int, timeout_s: float) -> None:
        """Wait until every byte of ``unit`` is here; raise the loop's failure or a timeout."""
        deadline = time.monotonic() + timeout_s
        while not self.whole[unit].wait(0.05):
            self.check()
            if time.monotonic() > deadline:
                raise TransferError(Failure(f"timed out waiting for unit {unit}", unit))

    def run(self) -> None:
        """The device's loop (after the shared start), until every write has left and every
        chunk has landed."""
        heard, pause = time.monotonic(), 0.0
        while any(self._left.values()) or any(self._unsent.values()):
            sent, landed = self.transport.poll(pause)
            for write, at_s in sent:
                self._sent(write, at_s)
            for write, at_s in landed:
                self._landed(write, at_s)
            posted, due_s = self._post_ready()
            if sent or landed or posted:
                heard, pause = time.monotonic(), 0.0
                continue
            if due_s < math.inf:
                heard = time.monotonic()
            elif time.monotonic() - heard > self.ctx.timeout_s:
                raise self.transport.stalled()
            asking = ASK_S if len(self._asked_s) > len(self._told) else math.inf
            longest = min(self.transport.idle_s, due_s - self.ctx.now(), asking)
            pause = max(0.0, min(max(2 * pause, self.transport.poll_s), longest))

    def _post_ready(self) -> tuple[bool, float]:
        """Post every write that may go now; whether one did, when the next is due (inf: none)."""
        posted, due_s = False, math.inf
        for lane in self.job.out:
            while self._flying[lane.peer] < WINDOW and self._next[lane.peer] < len(lane.writes):
                write = lane.writes[self._next[lane.peer]]
                at_s = self._due_s(write)
                if at_s > self.ctx.now():
                    due_s = min(due_s, at_s)
                    break
                self._at(write)
                self._free_s[write[0].step] = at_s
                self.transport.post(lane.peer, write)
                self._flying[lane.peer] += 1
                self._next[lane.peer] += 1
                posted = True
        return posted, due_s

    def _due_s(self, write: Write) -> float:
        """When the write may go (inf: not known yet); the step's first write starts it."""
        key = write[0].step
        step = self.job.sends[key]
        at_s = self._free_s.get(key)
        if at_s is None:  # the step's gate: inf until the steps it waits for end
            at_s = max([step.not_before_s, *(self._end_s(p) for p in step.after)])
        if step.pace_bytes_per_s is not None or id(write) not in self.transport.relayed:
            landed = self._landed_s.get
            at_s = max([at_s, *(landed(k, math.inf) for k in self._needs[id(write)])])
        if at_s < math.inf:
            self.measured.sent_start_s.setdefault(key, max(at_s, self.ctx.now()))
        if step.pace_bytes_per_s is not None:
            at_s += sum(chunk.nbytes for chunk in write) / step.pace_bytes_per_s
        return at_s

    def _end_s(self, step: int) -> float:
        """When a step in ``after`` ended (inf: not yet): its last write out or in here, else as
        its destination told the store (asked every ``ASK_S``)."""
        if step in self._peer:
            return self.measured.sent_end_s.get(step, math.inf)
        if step in self._left:
            return self.measured.received_end_s.get(step, math.inf)
        key, now = f"after/{self.job.run}/{step}", self.ctx.now()
        if step not in self._told and self._asked_s.get(step, -math.inf) <= now:
            self._asked_s[step] = now + ASK_S
            if self.ctx.store.check([key]):
                self._told[step] = float(self.ctx.store.get(key))
        return self._told.get(step, math.inf)

    def _at(self, write: Write) -> None:
        """Report the first chunk of each unit of each step, and fire a fault there."""
        for chunk in write:
            if (chunk.step, chunk.unit) not in self._seen:
                self._seen.add((chunk.step, chunk.unit))
                self.ctx.at(chunk.unit, chunk.step, (chunk.lo, chunk.hi))

    def _sent(self, write: Write, at_s: float) -> None:
        step = write[0].step
        self._flying[self._peer[step]] -= 1
        self._unsent[step] -= len(write)
        if not self._unsent[step]:
            self.measured.sent_end_s[step] = at_s

    def _landed(self, write: Write, at_s: float) -> None:
        """``write`` landed at ``at_s``; its step's end goes to the store for a third device."""
        step = write[0].step
        self._at(write)
        self._landed_s[self._index[id(write)]] = at_s
        for unit, lo, hi in self._runs[id(write)]:
            self._missing[unit] -= 1
            if not self._missing[unit] and self.job.whole[unit]:
                self._complete(unit, at_s)
            self.measured.received_bytes[step] += hi - lo
        self._left[step] -= len(write)
        if not self._left[step]:
            self.measured.received_end_s[step] = at_s
            if step in self.job.tells:
                self.ctx.store.set(f"after/{self.job.run}/{step}", repr(at_s))

    def start(self) -> Future[None]:
        """Run the loop on a thread of its own (live serving computes beside it)."""
        threads = ThreadPoolExecutor(1, thread_name_prefix="program")
        self.loop = threads.submit(self.run)
        threads.shutdown(wait=False)  # its thread ends with the loop
        return self.loop

    def check(self) -> None:
        """Raise the loop's failure, if it has failed."""
        if self.loop is not None and self.loop.done():
            self.loop.result()

    def report(self) -> DeviceReport:
        """Close the transport; the times and, on a checked GPU, whether each unit is bit-exact."""
        self.transport.close()
        self.measured.bit_exact = tuple(
            np.array_equal(self.buffer(u).cpu().numpy(), w) for u, w in enumerate(self._wanted)
        )
        return self.measured


def program_job(ctx: RankContext, job: DeviceJob) -> DeviceReport:
    """A worker's part of a run: fill, wait for the shared start, stream, check."""
    session = ProgramSession(ctx, job)
    ctx.ready()
    session.run()
    return session.report()
