"""One rank's part of a striped multicast: lanes in, lanes out, chunk by chunk, paced.

A rank stands for one GPU (or host memory) of a plan and holds every unit as one flat byte buffer
(:class:`UnitStore`). A *holder* loads every unit from a checkpoint before the start. Every lane
of the plan moves the stripe ``[lo, hi)`` of every unit it carries, as the byte range
``[floor(lo * n), floor(hi * n))`` of the unit's ``n`` bytes (equal TP degrees everywhere: the
executor runs TP1 plans), from the rank of its holder to the rank of its destination, in chunks
of at most ``chunk_bytes``. The receiving rank runs one thread per incoming lane; the sending rank
one thread per outgoing lane, which sends each chunk as soon as that byte range is here (a
forwarding lane passes chunk ``c`` on while ``c + 1`` arrives) and, when paced, keeps to the
lane's rate: the link it stands for is busy ``chunk / rate`` seconds per chunk. A unit is
complete on a rank when its whole byte range has arrived. Every wait has the run's timeout; a
failure anywhere stops the rank's threads and surfaces in :meth:`TransferSession.join`.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch

from blitzplan.executor.checkpoint import Checkpoint, load_unit, unit_digest
from blitzplan.executor.faults import Failure, TransferError, join_threads, start_thread
from blitzplan.executor.model import flatten_unit, model_dims
from blitzplan.executor.waiting import WaitingStore, equal_chunks
from blitzplan.executor.worker import RankContext

__all__ = [
    "WEIGHTS_TAG",
    "LanePlan",
    "TransferPlan",
    "TransferReport",
    "TransferSession",
    "UnitStore",
    "byte_span",
]

WEIGHTS_TAG = 1
"""torch.distributed tag of weight chunks: lane ``k`` uses ``WEIGHTS_TAG + k`` (activations use
tags of their own above :data:`~blitzplan.executor.model` ``ACTIVATION_TAG``)."""


def byte_span(lo: float, hi: float, size: int) -> tuple[int, int]:
    """The bytes of stripe ``[lo, hi)`` of a unit of ``size`` bytes (neighbours share a cut)."""
    return min(size, math.floor(lo * size)), size if hi >= 1.0 else min(size, math.floor(hi * size))


@dataclass(frozen=True)
class LanePlan:
    """One lane as one of its two ranks sees it: stripe ``[lo, hi)`` of the units it carries
    (``units``: a mask, empty for all), to or from rank ``peer``.

    Sending side: paced to ``bytes_per_s`` (None: unpaced); ``pipelined`` lanes send each chunk
    as soon as it is here, others wait for every unit they carry; the lane starts no earlier
    than ``start_s`` and the end of the lanes in ``after`` (lanes of the same rank)."""

    lane: int
    peer: int
    lo: float = 0.0
    hi: float = 1.0
    bytes_per_s: float | None = None
    pipelined: bool = True
    after: tuple[int, ...] = ()
    start_s: float = 0.0
    units: tuple[bool, ...] = ()

    def carries(self, unit: int) -> bool:
        return not self.units or self.units[unit]


@dataclass(frozen=True)
class TransferPlan:
    """What one rank does in a multicast: load every unit (a holder) or receive its ``recvs``,
    and run its ``sends``.

    ``digests`` are the checkpoint's per-unit SHA-256; a rank with ``check`` (a new instance's
    GPU, which must end with every byte) checks every unit against them; relays hold only the
    stripes they pass on. With ``hold_report`` the rank checks and reports only once told
    ``("end",)``, so that hashing does not take CPU from a live run it is part of."""

    rank: int
    label: str
    unit_bytes: tuple[int, ...]
    chunk_bytes: int
    digests: tuple[str, ...]
    recvs: tuple[LanePlan, ...] = ()
    sends: tuple[LanePlan, ...] = ()
    checkpoint: Checkpoint | None = None
    check: bool = True
    hold_report: bool = False

    @property
    def is_source(self) -> bool:
        return self.checkpoint is not None


@dataclass(frozen=True)
class TransferReport:
    """What a rank measured: when each unit was complete here (nan where it never was), whether
    it is bit-exact (checked ranks), and when each of its sending lanes ended."""

    rank: int
    arrival_s: tuple[float, ...]
    bit_exact: tuple[bool, ...]
    lane_end_s: dict[int, float]


class UnitStore(WaitingStore):
    """Every unit's flat bytes on one rank and when which byte ranges of it were here."""

    def __init__(self, plan: TransferPlan, device: torch.device) -> None:
        super().__init__()
        self.unit_bytes, self.chunk_bytes = plan.unit_bytes, plan.chunk_bytes
        self.buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in plan.unit_bytes]
        self.pieces: list[list[tuple[int, int, float]]] = [[] for _ in plan.unit_bytes]
        self.complete_s: list[float | None] = [None for _ in plan.unit_bytes]

    def chunks(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """``[lo, hi)`` in this store's chunks (:func:`~.waiting.equal_chunks`)."""
        return equal_chunks(lo, hi, self.chunk_bytes)

    def fill(self, unit: int, flat: torch.Tensor, at_s: float) -> None:
        """A unit loaded whole (a holder): every byte is here at ``at_s``."""
        self.buffers[unit].copy_(flat)
        with self._cond:
            self.pieces[unit] = [(0, self.unit_bytes[unit], at_s)]
            self.complete_s[unit] = at_s
            self._cond.notify_all()

    def arrived(self, unit: int, lo: int, hi: int, at_s: float) -> bool:
        """Bytes ``[lo, hi)`` of ``unit`` are here; True when that completes the unit."""
        with self._cond:
            self.pieces[unit].append((lo, hi, at_s))
            done = self.complete_s[unit] is None and self._covered(unit, 0, self.unit_bytes[unit])
            if done:
                self.complete_s[unit] = at_s
            self._cond.notify_all()
            return done

    def _covered(self, unit: int, lo: int, hi: int) -> bool:
        at = lo
        for a, b, _ in sorted(self.pieces[unit]):
            if a > at:
                break
            at = max(at, b)
            if at >= hi:
                return True
        return at >= hi

    def wait_range(self, unit: int, lo: int, hi: int, timeout_s: float) -> float:
        """When bytes ``[lo, hi)`` of ``unit`` were all here; waits for them (or raises)."""

        def since() -> float | None:
            if not self._covered(unit, lo, hi):
                return None
            return max((t for a, b, t in self.pieces[unit] if a < hi and b > lo), default=0.0)

        return self._wait(since, timeout_s, Failure(f"timed out waiting for unit {unit}", unit))

    def wait_unit(self, unit: int, timeout_s: float) -> float:
        """When every byte of ``unit`` was here."""
        return self.wait_range(unit, 0, self.unit_bytes[unit], timeout_s)

    def arrival_s(self, unit: int) -> float:
        done = self.complete_s[unit]
        return math.nan if done is None else done


class TransferSession:
    """One rank's receiving and sending threads for one multicast run.

    ``on_unit(unit)`` runs in the receiving thread that completes a unit, before the parent hears
    of it (the new instance unpacks the layer's tensors there)."""

    def __init__(
        self,
        ctx: RankContext,
        plan: TransferPlan,
        *,
        on_unit: Callable[[int], None] | None = None,
    ) -> None:
        self.ctx, self.plan, self.on_unit = ctx, plan, on_unit
        self.store = UnitStore(plan, ctx.transport)
        self.lane_end_s: dict[int, float] = {}
        self._lane_done = {send.lane: threading.Event() for send in plan.sends}
        self._threads: list[threading.Thread] = []
        if plan.checkpoint is not None:
            dims = model_dims(plan.checkpoint.spec())
            for unit in range(len(plan.unit_bytes)):
                weights = load_unit(plan.checkpoint, unit, dims=dims)
                self.store.fill(unit, flatten_unit(dims, unit, weights), 0.0)

    @property
    def wait_s(self) -> float:
        """How long a thread waits on this rank's own store: twice the transfer timeout, so a
        peer's stall is reported by the receive that times out first, naming that peer."""
        return 2 * self.ctx.timeout_s

    def start(self) -> None:
        for recv in self.plan.recvs:
            self.spawn(functools.partial(self._receive, recv), f"receive-lane{recv.lane}")
        for send in self.plan.sends:
            self.spawn(functools.partial(self._send, send), f"send-lane{send.lane}")

    def spawn(self, body: Callable[[], None], name: str) -> threading.Thread:
        """Run ``body`` in a thread of this rank; its failure stops the rank (see join)."""
        return start_thread(self._threads, body, name, self.store.fail)

    def _receive(self, recv: LanePlan) -> None:
        ctx, store = self.ctx, self.store
        for unit, size in enumerate(self.plan.unit_bytes):
            if not recv.carries(unit):
                continue
            lo, hi = byte_span(recv.lo, recv.hi, size)
            for k, (a, b) in enumerate(store.chunks(lo, hi)):
                ctx.recv(
                    store.buffers[unit][a:b], recv.peer, layer=unit, tag=WEIGHTS_TAG + recv.lane
                )
                if store.arrived(unit, a, b, ctx.now()):
                    if self.on_unit is not None:
                        self.on_unit(unit)
                    ctx.emit("unit", (unit, store.arrival_s(unit)))
                if k == 0:
                    ctx.maybe_fail(unit)

    def _send(self, send: LanePlan) -> None:
        ctx, store = self.ctx, self.store
        for prior in send.after:
            if prior not in self._lane_done or not self._lane_done[prior].wait(self.wait_s):
                raise TransferError(Failure(f"lane {send.lane} waited too long for lane {prior}"))
        free_s = max([send.start_s, *(self.lane_end_s[p] for p in send.after)])
        units = [u for u in range(len(self.plan.unit_bytes)) if send.carries(u)]
        whole_s = None
        if not send.pipelined:
            whole_s = max((store.wait_unit(u, self.wait_s) for u in units), default=0.0)
        for unit in units:
            if self.plan.is_source:
                ctx.emit("at", unit)
            lo, hi = byte_span(send.lo, send.hi, self.plan.unit_bytes[unit])
            for k, (a, b) in enumerate(store.chunks(lo, hi)):
                ready_s = store.wait_range(unit, a, b, self.wait_s) if whole_s is None else whole_s
                free_s = max(free_s, ready_s)
                if send.bytes_per_s is not None:
                    free_s += (b - a) / send.bytes_per_s
                    ctx.sleep_until(free_s)
                ctx.send(
                    store.buffers[unit][a:b], send.peer, layer=unit, tag=WEIGHTS_TAG + send.lane
                )
                if send.bytes_per_s is None:
                    free_s = ctx.now()
                if self.plan.is_source and k == 0:
                    ctx.maybe_fail(unit)
        self.lane_end_s[send.lane] = free_s
        self._lane_done[send.lane].set()

    def join(self) -> None:
        """Wait for every thread; raise the first failure of this rank."""
        join_threads(self._threads, lambda: self.store.error)

    def report(self) -> TransferReport:
        """Arrival times and the bit-exact check of every unit (hashing after the transfer)."""
        plan = self.plan
        arrival = tuple(self.store.arrival_s(u) for u in range(len(plan.unit_bytes)))
        exact = tuple(
            plan.check and unit_digest(buffer) == digest
            for buffer, digest in zip(self.store.buffers, plan.digests, strict=True)
        )
        return TransferReport(plan.rank, arrival, exact, dict(self.lane_end_s))
