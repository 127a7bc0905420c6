"""One rank's part of a chain multicast: receive units chunk by chunk, forward them, paced.

A rank holds every unit as one flat byte buffer (:class:`UnitStore`). A *source* loads them from
a checkpoint before the start; a *target* receives them from its predecessor, chunk by chunk,
while its sender threads forward every chunk it already has to their successors: chunk ``c + 1``
arrives while chunk ``c`` leaves. A sender may be paced to ``bytes_per_s``: the link it stands
for is busy ``chunk / rate`` seconds per chunk, from when the chunk is available and the link is
free, and the chunk is handed to torch.distributed when that time is up. Every wait has the run's
timeout; a failure anywhere stops the rank's threads and surfaces in :meth:`TransferSession.join`.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from blitzplan.executor.checkpoint import Checkpoint, load_unit, unit_digest
from blitzplan.executor.faults import Failure, TransferError
from blitzplan.executor.model import flatten_unit, model_dims
from blitzplan.executor.worker import RankContext

__all__ = [
    "WEIGHTS_TAG",
    "SendPlan",
    "TransferPlan",
    "TransferReport",
    "TransferSession",
    "UnitStore",
]

WEIGHTS_TAG = 1
"""torch.distributed tag of weight chunks (activations use their own)."""


@dataclass(frozen=True)
class SendPlan:
    """One outgoing hop: every unit to rank ``dst``, paced to ``bytes_per_s`` (None: unpaced).

    ``pipelined`` hops forward each chunk as soon as it is here; others wait for the whole
    model. The hop starts no earlier than ``start_s`` and the end of the hops in ``after``
    (earlier hops of the same sender)."""

    hop: int
    dst: int
    bytes_per_s: float | None
    pipelined: bool = True
    after: tuple[int, ...] = ()
    start_s: float = 0.0


@dataclass(frozen=True)
class TransferPlan:
    """What one rank does in a multicast: load (a source) or receive from ``recv_from``, and send.

    ``digests`` are the checkpoint's per-unit SHA-256, against which every received unit is
    checked. With ``hold_report`` the rank checks and reports only once told ``("end",)``, so
    that hashing does not take CPU from a live run it is part of."""

    rank: int
    label: str
    unit_bytes: tuple[int, ...]
    chunk_bytes: int
    digests: tuple[str, ...]
    recv_from: int | None = None
    sends: tuple[SendPlan, ...] = ()
    checkpoint: Checkpoint | None = None
    hold_report: bool = False

    @property
    def is_source(self) -> bool:
        return self.recv_from is None


@dataclass(frozen=True)
class TransferReport:
    """What a rank measured: when each unit was complete here, and whether it is bit-exact."""

    rank: int
    arrival_s: tuple[float, ...]
    bit_exact: tuple[bool, ...]
    hop_end_s: dict[int, float]


class UnitStore:
    """Every unit's flat bytes on one rank and when each chunk of it was here."""

    def __init__(self, plan: TransferPlan, device: torch.device) -> None:
        self.unit_bytes, self.chunk_bytes = plan.unit_bytes, plan.chunk_bytes
        self.buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in plan.unit_bytes]
        self.chunk_s: list[list[float]] = [[] for _ in plan.unit_bytes]
        self.error: TransferError | None = None
        self._cond = threading.Condition()

    def chunks(self, unit: int) -> list[tuple[int, int]]:
        """The unit cut into ``ceil(bytes / chunk_bytes)`` chunks of equal size (to a byte).

        Equal, not full chunks and a remainder: a tiny last chunk right behind a full one waits
        on TCP's small-segment rule (Nagle's algorithm, which gloo leaves on) for the previous
        one's acknowledgement, milliseconds on loopback."""
        size = self.unit_bytes[unit]
        count = -(-size // self.chunk_bytes)
        edges = [size * k // count for k in range(count + 1)]
        return list(itertools.pairwise(edges))

    def fill(self, unit: int, flat: torch.Tensor, at_s: float) -> None:
        """A unit loaded whole (a source): every chunk is here at ``at_s``."""
        self.buffers[unit].copy_(flat)
        with self._cond:
            self.chunk_s[unit] = [at_s] * len(self.chunks(unit))
            self._cond.notify_all()

    def arrived(self, unit: int, chunk: int, at_s: float) -> None:
        with self._cond:
            self.chunk_s[unit].append(at_s)
            if len(self.chunk_s[unit]) != chunk + 1:
                raise TransferError(Failure(f"chunk {chunk} of unit {unit} arrived out of order"))
            self._cond.notify_all()

    def fail(self, error: TransferError) -> None:
        with self._cond:
            if self.error is None:
                self.error = error
            self._cond.notify_all()

    def wait_chunk(self, unit: int, chunk: int, timeout_s: float) -> float:
        """When chunk ``chunk`` of ``unit`` was here; waits for it (or raises the rank's error)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while len(self.chunk_s[unit]) <= chunk:
                if self.error is not None:
                    raise self.error
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TransferError(Failure(f"timed out waiting for unit {unit}", unit))
                self._cond.wait(left)
            return self.chunk_s[unit][chunk]

    def wait_unit(self, unit: int, timeout_s: float) -> float:
        """When every chunk of ``unit`` was here."""
        return self.wait_chunk(unit, len(self.chunks(unit)) - 1, timeout_s)

    def arrival_s(self, unit: int) -> float:
        return self.chunk_s[unit][-1]


class TransferSession:
    """One rank's receive and send threads for one multicast run.

    ``on_unit(unit)`` runs in the receiving thread once a unit is complete, before the parent
    hears of it (the new instance unpacks the layer's tensors there)."""

    def __init__(
        self,
        ctx: RankContext,
        plan: TransferPlan,
        *,
        on_unit: Callable[[int], None] | None = None,
    ) -> None:
        self.ctx, self.plan, self.on_unit = ctx, plan, on_unit
        self.store = UnitStore(plan, ctx.transport)
        self.hop_end_s: dict[int, float] = {}
        self._hop_done = {send.hop: threading.Event() for send in plan.sends}
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
        if self.plan.recv_from is not None:
            self.spawn(self._receive, "receive")
        for send in self.plan.sends:
            self.spawn(functools.partial(self._send, send), f"send-hop{send.hop}")

    def spawn(self, body: Callable[[], None], name: str) -> threading.Thread:
        """Run ``body`` in a thread of this rank; its failure stops the rank (see join)."""

        def run() -> None:
            try:
                body()
            except TransferError as exc:
                self.store.fail(exc)
            except Exception as exc:
                self.store.fail(TransferError(Failure(f"{type(exc).__name__}: {exc}")))

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _receive(self) -> None:
        src, ctx, store = self.plan.recv_from, self.ctx, self.store
        if src is None:
            return
        for unit in range(len(self.plan.unit_bytes)):
            for chunk, (lo, hi) in enumerate(store.chunks(unit)):
                ctx.recv(store.buffers[unit][lo:hi], src, layer=unit, tag=WEIGHTS_TAG)
                store.arrived(unit, chunk, ctx.now())
                if chunk == 0:
                    ctx.maybe_fail(unit)
            if self.on_unit is not None:
                self.on_unit(unit)
            ctx.emit("unit", (unit, store.arrival_s(unit)))

    def _send(self, send: SendPlan) -> None:
        ctx, store = self.ctx, self.store
        for prior in send.after:
            if prior not in self._hop_done or not self._hop_done[prior].wait(self.wait_s):
                raise TransferError(Failure(f"hop {send.hop} waited too long for hop {prior}"))
        free_s = max([send.start_s, *(self.hop_end_s[p] for p in send.after)])
        last = len(self.plan.unit_bytes) - 1
        whole_s = None if send.pipelined else store.wait_unit(last, self.wait_s)
        for unit in range(last + 1):
            if self.plan.is_source:
                ctx.emit("at", unit)
            for chunk, (lo, hi) in enumerate(store.chunks(unit)):
                ready_s = store.wait_chunk(unit, chunk, self.wait_s) if whole_s is None else whole_s
                free_s = max(free_s, ready_s)
                if send.bytes_per_s is not None:
                    free_s += (hi - lo) / send.bytes_per_s
                    ctx.sleep_until(free_s)
                ctx.send(store.buffers[unit][lo:hi], send.dst, layer=unit, tag=WEIGHTS_TAG)
                if send.bytes_per_s is None:
                    free_s = ctx.now()
                if self.plan.is_source and chunk == 0:
                    ctx.maybe_fail(unit)
        self.hop_end_s[send.hop] = free_s
        self._hop_done[send.hop].set()

    def join(self) -> None:
        """Wait for every thread; raise the first failure of this rank."""
        for thread in self._threads:
            while thread.is_alive():
                thread.join(0.05)
                if self.store.error is not None:
                    raise self.store.error
        if self.store.error is not None:
            raise self.store.error

    def report(self) -> TransferReport:
        """Arrival times and the bit-exact check of every unit (hashing after the transfer)."""
        plan = self.plan
        arrival = tuple(self.store.arrival_s(u) for u in range(len(plan.unit_bytes)))
        exact = tuple(
            unit_digest(buffer) == digest
            for buffer, digest in zip(self.store.buffers, plan.digests, strict=True)
        )
        return TransferReport(plan.rank, arrival, exact, dict(self.hop_end_s))
