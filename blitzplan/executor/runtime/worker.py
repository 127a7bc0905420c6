"""Inside a worker process: joining the group, the rank's context, serving jobs until the parent
ends it (a worker whose job failed waits for that too)."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.distributed as dist

from blitzplan.errors import InvalidInputError
from blitzplan.executor.runtime.failures import Event, Failure, InjectedFault, TransferError

DEVICES = ("cpu", "cuda")
"""Where a run's buffers live (default ``cpu``)."""
STARTUP_TIMEOUT_S = 180.0
"""Seconds allowed for every rank to join the group, and to get ready for a job."""
SWITCH_INTERVAL_S = 1e-4
"""GIL switch interval in the workers: transfer threads must not wait for a compute thread."""
TCPStore: Any = dist.TCPStore  # type: ignore[attr-defined]  # public, but not re-exported
Job = Callable[["RankContext", Any], Any]
"""A module-level function run in a worker: ``job(ctx, payload) -> result``."""


def check_device(device: str, world_size: int) -> str:
    """gloo on the CPU; on GPUs NCCL when every rank has its own GPU, else gloo."""
    if device not in DEVICES:
        raise InvalidInputError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cpu":
        return "gloo"
    if not torch.cuda.is_available():
        raise InvalidInputError(
            "device='cuda' needs a GPU, but torch.cuda.is_available() is False on this machine "
            "(no GPU or a CPU-only torch build); use device='cpu'"
        )
    return "nccl" if torch.cuda.device_count() >= max(2, world_size) else "gloo"


@dataclass(frozen=True)
class Boot:
    """What a worker needs to join the group."""

    rank: int
    world_size: int
    store_port: int
    device: str
    backend: str
    timeout_s: float


class RankContext:
    """A worker's view of the run: its rank, its devices, the clock, messages and transfers."""

    def __init__(self, boot: Boot, conn: Connection, where: Any) -> None:
        self.rank, self.backend, self.timeout_s = boot.rank, boot.backend, boot.timeout_s
        count = torch.cuda.device_count() if boot.device == "cuda" else 0
        self.device = torch.device(f"cuda:{boot.rank % count}" if count else "cpu")
        self.wire = self.device if boot.backend == "nccl" else torch.device("cpu")
        """Where torch.distributed's tensors live (host memory for gloo)."""
        self.store: Any = None
        """The group's TCPStore (a transport's rendezvous)."""
        self.fault: InjectedFault | None = None
        self.t0 = time.monotonic()
        self._conn, self._lock, self._where = conn, threading.Lock(), where

    def emit(self, kind: str, data: Any = None) -> None:
        """Tell the parent now, from whichever thread has it."""
        with self._lock:
            try:
                # plain pickle: Connection.send makes a ForkingPickler per message (slow)
                self._conn.send_bytes(pickle.dumps(Event(self.rank, kind, data)))
            except OSError:
                os._exit(1)  # the parent has gone

    def at(self, unit: int, step: int = -1, chunk: tuple[int, int] = (-1, -1)) -> None:
        """Where this rank is (``unit``, ``step``, ``chunk``), in the parent's shared memory (no
        message, no syscall); the job's injected fault for ``unit`` fires here."""
        self._where[4 * self.rank : 4 * self.rank + 4] = [unit, step, *chunk]
        fault = self.fault
        if fault is not None and fault.rank == self.rank and fault.layer == unit:
            signal.pthread_kill(threading.get_ident(), signal.SIGKILL)

    def command(self, timeout_s: float | None = None) -> Any:
        """The next message from the parent (None after ``timeout_s``, if given); the parent's
        death (or close) ends the process."""
        parent = os.getppid()
        while True:
            try:
                if self._conn.poll(0.5 if timeout_s is None else timeout_s):
                    return self._conn.recv()
            except (EOFError, OSError):
                os._exit(1)
            if os.getppid() != parent:
                os._exit(1)
            if timeout_s is not None:
                return None

    def ready(self) -> None:
        """Report ready, wait for the shared start time ``t0`` and sleep until it."""
        self.emit("ready")
        _, self.t0 = self.command()
        time.sleep(max(0.0, -self.now()))

    def now(self) -> float:
        """Seconds since the shared start time (``time.monotonic`` is one clock per machine)."""
        return time.monotonic() - self.t0

    def synchronize(self) -> None:
        """Wait for queued GPU work (no-op on the CPU), so times are real."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def wait(self, work: Any, what: str, where: Failure) -> None:
        """Wait for a posted transfer within the timeout, else raise TransferError at ``where``."""
        try:
            if self.backend == "nccl":  # NCCL's wait has no timeout of its own
                deadline = time.monotonic() + self.timeout_s
                while not work.is_completed():
                    if time.monotonic() > deadline:
                        raise RuntimeError("Timed out")
                    time.sleep(1e-4)
                self.synchronize()
            else:
                work.wait(timeout=timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:  # ``what``: ``sending ... to rank 3``
            text = str(exc)
            message = f"{what} failed: {Failure.quote(exc)}"
            if "Timed out" in text:
                message = f"timed out after {self.timeout_s:g} s {what}"
            elif "closed" in text or "reset" in text.lower():
                message = f"lost the connection {what}"
            raise TransferError(replace(where, message=message)) from None


def worker_main(boot: Boot, conn: Connection, where: Any) -> None:
    """A worker process: join the group, then run jobs until told to stop."""
    with contextlib.suppress(OSError):  # gloo on the loopback interface: this host only
        names = [name for _, name in socket.if_nameindex() if name.startswith("lo")]
        if names and boot.backend == "gloo":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", names[0])
    torch.set_num_threads(1)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    ctx = RankContext(boot, conn, where)
    timeout = timedelta(seconds=STARTUP_TIMEOUT_S)
    try:
        if ctx.device.type == "cuda":
            torch.cuda.set_device(ctx.device)
        ctx.store = TCPStore("127.0.0.1", boot.store_port, is_master=False, timeout=timeout)
        dist.init_process_group(
            boot.backend, store=ctx.store, rank=boot.rank, world_size=boot.world_size
        )
    except Exception as exc:
        ctx.emit("error", Failure(f"could not join the group: {exc}"))
        return
    ctx.emit("up", os.getpid())
    _serve(ctx)


def _serve(ctx: RankContext) -> None:
    """Run jobs until one fails, then wait to be ended (the group is broken)."""
    while True:
        job, payload, ctx.fault = ctx.command()
        try:
            ctx.emit("result", job(ctx, payload))
        except Exception as exc:
            failure = Failure(f"{type(exc).__name__}: {exc}")
            ctx.emit("error", exc.failure if isinstance(exc, TransferError) else failure)
            break
    while True:
        ctx.command()
