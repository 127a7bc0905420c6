"""One device's part of a transfer program: fill its buffers, stream its steps, check its bytes.

A :class:`DeviceJob` says what a device is (a GPU that holds one rank buffer per unit, or host
memory that holds every rank's), what it holds before the start (a serving instance's buffer of
its own TP degree, every rank's buffer, or the byte ranges ``held`` says) and which steps it
sends and receives. The buffers are filled from the checkpoint with
:meth:`blitzplan.models.layout.Layout.rank_buffer` before the shared start, and a resharding
sender packs each of its steps' bytes then with :meth:`~blitzplan.models.layout.Layout.reshard`
(vocabulary padding stays zero). After the start one thread per received step takes its chunks
in order, and one thread per sent step streams its units in order, each chunk as soon as those
bytes are here (held, or arrived over any step), no faster than the step's pace (the link it
stands for is busy ``chunk / pace`` seconds a chunk), not before ``not_before_s``, the end of
the steps in ``after`` and, for ``store_and_forward``, the end of every step feeding it. A new
GPU then compares every unit with its rank buffer built from the checkpoint.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from blitzplan.executor.checkpoint import Checkpoint, load_unit
from blitzplan.executor.faults import Failure, TransferError, join_threads, start_thread
from blitzplan.executor.model import model_dims
from blitzplan.executor.program_store import DeviceStore
from blitzplan.executor.waiting import equal_chunks
from blitzplan.executor.worker import RankContext
from blitzplan.models import ModelSpec
from blitzplan.models.layout import Layout, layout

__all__ = ["PROGRAM_TAG", "DeviceJob", "DeviceReport", "RecvPlan", "SendPlan", "program_job"]

PROGRAM_TAG = 1
"""torch.distributed tag of step ``k``'s chunks: ``PROGRAM_TAG + k``."""

Piece = tuple[int, int, int]
"""``(unit, offset, length)``: bytes of a unit's buffer on the device, in sending order."""


@dataclass(frozen=True)
class SendPlan:
    """A step as its sender runs it: ``pieces`` at offsets of the sender's buffer, to ``peer``.

    ``reshard = (source_tp, source_rank, rank)``: the sender holds another TP degree's buffer and
    packs rank ``rank``'s bytes (``pieces`` then are offsets of that target rank buffer)."""

    step: int
    peer: int
    pieces: tuple[Piece, ...]
    pace_bytes_per_s: float | None
    not_before_s: float = 0.0
    after: tuple[int, ...] = ()
    store_and_forward: bool = False
    feeds: tuple[int, ...] = ()
    reshard: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class RecvPlan:
    """A step as its receiver runs it: ``pieces`` at offsets of the receiver's buffer."""

    step: int
    peer: int
    pieces: tuple[Piece, ...]


@dataclass(frozen=True)
class DeviceJob:
    """Everything one device does in a program run (see the module docstring).

    ``holds``: ``(tp, rank)`` of a serving instance's buffer; ``every_rank``: host memory with
    every rank's buffer of the target TP filled; ``held`` byte ranges of rank ``gpu_rank``'s
    buffer; ``check``: compare every unit with rank ``gpu_rank``'s buffer at the end."""

    rank: int
    label: str
    spec: ModelSpec = field(repr=False)
    tp: int
    checkpoint: Checkpoint
    chunk_bytes: int
    memory: bool = False
    holds: tuple[int, int] | None = None
    every_rank: bool = False
    held: tuple[tuple[int, int, int], ...] = ()
    gpu_rank: int | None = None
    check: bool = False
    sends: tuple[SendPlan, ...] = ()
    recvs: tuple[RecvPlan, ...] = ()


@dataclass(frozen=True)
class DeviceReport:
    """What a device measured, times from the shared start: per unit when it was complete
    (nan: never), per checked unit whether it is bit-exact, per sent step its first byte out and
    its end, per received step its last byte in and its bytes, and bytes that came twice."""

    rank: int
    complete_s: tuple[float, ...]
    bit_exact: tuple[bool, ...]
    sent_start_s: dict[int, float]
    sent_end_s: dict[int, float]
    received_end_s: dict[int, float]
    received_bytes: dict[int, int]
    duplicate_bytes: int


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def checkpoint_tensors(checkpoint: Checkpoint, unit: int, num_layers: int) -> dict[str, Any]:
    """A unit of the executor's checkpoint as full tensors under their Hugging Face names
    (numpy integers of the element width: the layout moves bytes)."""
    weights = load_unit(checkpoint, unit, dims=model_dims(checkpoint.spec()))
    prefix = f"model.layers.{unit - 1}." if 0 < unit <= num_layers else "model."
    out = {}
    for name, tensor in weights.items():
        full = name if name.startswith("lm_head") else prefix + name
        out[full] = tensor.view(_INT_OF_WIDTH[tensor.element_size()]).numpy()
    return out


class ProgramSession:
    """One device's buffers and threads for one program run."""

    def __init__(self, ctx: RankContext, job: DeviceJob) -> None:
        self.ctx, self.job = ctx, job
        self.target = layout(job.spec, job.tp)
        self.own = layout(job.spec, job.holds[0]) if job.holds is not None else self.target
        """The layout of this device's buffers (a serving GPU's own TP degree)."""
        sizes = [n * (job.tp if job.memory else 1) for n in self.own.unit_bytes]
        self.store = DeviceStore(sizes, ctx.device)
        self.packed: dict[tuple[int, int, int], torch.Tensor] = {}
        """A resharding step's bytes by (step, unit, offset), packed before the start."""
        self.sent_start_s: dict[int, float] = {}
        self.sent_end_s: dict[int, float] = {}
        self.received_end_s: dict[int, float] = {}
        self.received_bytes: dict[int, int] = {}
        steps = [p.step for p in job.sends] + [p.step for p in job.recvs]
        self._done = {step: threading.Event() for step in steps}
        self._threads: list[threading.Thread] = []
        self._full: dict[int, dict[str, Any]] = {}
        self._fill()

    # --- before the start -------------------------------------------------------------------

    def tensors(self, unit: int) -> dict[str, Any]:
        if unit not in self._full:
            self._full[unit] = checkpoint_tensors(
                self.job.checkpoint, unit, self.job.spec.num_layers
            )
        return self._full[unit]

    def expected(self, unit: int, rank: int, lay: Layout | None = None) -> torch.Tensor:
        """Rank ``rank``'s buffer of ``unit`` under ``lay`` (default: the target layout)."""
        buffer = (lay or self.target).rank_buffer(unit, rank, self.tensors(unit))
        return torch.from_numpy(np.ascontiguousarray(buffer))

    def _fill(self) -> None:
        job, store = self.job, self.store
        for unit in range(len(self.target.units)):
            if job.holds is not None:
                store.fill(unit, 0, self.expected(unit, job.holds[1], self.own))
            elif job.every_rank:
                store.fill(unit, 0, torch.cat([self.expected(unit, r) for r in range(job.tp)]))
        for unit, lo, hi in job.held:
            store.fill(unit, lo, self.expected(unit, self._gpu_rank())[lo:hi])
        for send in job.sends:
            if send.reshard is not None:
                self._pack(send)

    def _gpu_rank(self) -> int:
        if self.job.gpu_rank is None:
            raise TransferError(Failure(f"{self.job.label} holds bytes but has no TP rank"))
        return self.job.gpu_rank

    def _pack(self, send: SendPlan) -> None:
        """A resharding step's bytes, packed from this device's own buffer (padding zero)."""
        _, source_rank, rank = send.reshard or (0, 0, 0)
        for unit, offset, length in send.pieces:
            size = self.target.unit_bytes[unit]
            lo, hi = Fraction(offset, size), Fraction(offset + length, size)
            out = torch.zeros(length, dtype=torch.uint8, device=self.ctx.device)
            copies = self.target.reshard(unit, self.own, source_rank, rank, lo, hi)
            for src, dst, n in copies:
                out[dst - offset : dst - offset + n] = self.store.buffers[unit][src : src + n]
            self.packed[(send.step, unit, offset)] = out

    # --- after the start --------------------------------------------------------------------

    @property
    def wait_s(self) -> float:
        """How long a thread waits on this device's own bytes or steps: twice the transfer
        timeout, so that a stalled peer is named by the receive that times out first."""
        return 2 * self.ctx.timeout_s

    def start(self) -> None:
        for recv in self.job.recvs:
            self._spawn(functools.partial(self._receive, recv), f"receive-step{recv.step}")
        for send in self.job.sends:
            self._spawn(functools.partial(self._send, send), f"send-step{send.step}")

    def _spawn(self, body: Callable[[], None], name: str) -> None:
        start_thread(self._threads, body, name, self.store.fail)

    def _receive(self, recv: RecvPlan) -> None:
        ctx, store, moved = self.ctx, self.store, 0
        for unit, offset, length in recv.pieces:
            for a, b in equal_chunks(offset, offset + length, self.job.chunk_bytes):
                self._recv_into(store.buffers[unit][a:b], recv, unit)
                moved += b - a
                if store.arrived(unit, a, b, ctx.now()) and self.job.check:
                    ctx.emit("unit", (unit, store.complete_s(unit)))
        self.received_end_s[recv.step] = ctx.now()
        self.received_bytes[recv.step] = moved
        self._done[recv.step].set()

    def _recv_into(self, view: torch.Tensor, recv: RecvPlan, unit: int) -> None:
        ctx = self.ctx
        if view.device == ctx.transport:
            ctx.recv(view, recv.peer, layer=unit, tag=PROGRAM_TAG + recv.step)
            return
        staging = torch.empty(view.numel(), dtype=torch.uint8, device=ctx.transport)
        ctx.recv(staging, recv.peer, layer=unit, tag=PROGRAM_TAG + recv.step)
        view.copy_(staging)
        ctx.synchronize()

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
        ctx, store = self.ctx, self.store
        free_s = self._gate_s(send)
        for unit, offset, length in send.pieces:
            packed = self.packed.get((send.step, unit, offset))
            if self.job.holds is not None or self.job.every_rank:
                ctx.emit("at", unit)  # where a source is, should it fail
            ctx.maybe_fail(unit)
            for a, b in equal_chunks(offset, offset + length, self.job.chunk_bytes):
                if packed is None:
                    ready_s = store.wait_range(unit, a, b, self.wait_s)
                    data = store.buffers[unit][a:b]
                else:
                    ready_s, data = 0.0, packed[a - offset : b - offset]
                free_s = max(free_s, ready_s)
                self.sent_start_s.setdefault(send.step, max(free_s, ctx.now()))
                if send.pace_bytes_per_s is not None:
                    free_s += (b - a) / send.pace_bytes_per_s
                    ctx.sleep_until(free_s)
                wire = data if data.device == ctx.transport else data.to(ctx.transport)
                ctx.send(wire, send.peer, layer=unit, tag=PROGRAM_TAG + send.step)
                if send.pace_bytes_per_s is None:
                    free_s = ctx.now()
        self.sent_end_s[send.step] = max(free_s, ctx.now())
        self._done[send.step].set()

    def join(self) -> None:
        """Wait for every thread; raise the first failure of this device."""
        join_threads(self._threads, lambda: self.store.error)

    def report(self) -> DeviceReport:
        """The measured times and, on a checked GPU, every unit compared with its buffer."""
        units = range(len(self.target.units))
        exact: tuple[bool, ...] = ()
        if self.job.check:
            rank = self._gpu_rank()
            exact = tuple(
                bool(torch.equal(self.store.buffers[u].cpu(), self.expected(u, rank)))
                for u in units
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
    """A worker's part of a program run: fill, wait for the shared start, stream, check."""
    session = ProgramSession(ctx, job)
    ctx.ready()
    session.start()
    session.join()
    return session.report()
