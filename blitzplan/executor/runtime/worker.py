"""Inside a worker process: joining the group, the rank's context, serving jobs.

A worker is spawned by :class:`~blitzplan.executor.runtime.pool.Workers`, sets one torch thread,
joins the process group over the parent's TCPStore and then runs jobs until told to stop. A job
is a module-level function ``job(ctx, payload) -> result``; :class:`RankContext` gives it the
rank, its devices, the shared clock, messages to and from the parent, and point-to-point
transfers that each have a timeout. Messages travel over one pipe per direction, written by the
thread that has them (no feeder threads), so an event reaches the parent as soon as it happens.
A heartbeat thread tells the parent every :func:`heartbeat_s` that the process still runs: a
stopped (frozen) process is the one whose heartbeat stops. A worker whose job failed waits to be
ended by the parent; it never exits on its own.
"""

from __future__ import annotations

import contextlib
import os
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
from blitzplan.executor.runtime.failures import (
    Event,
    Failure,
    InjectedFault,
    TransferError,
    unit_name,
)
from blitzplan.executor.smallmodel.checkpoint import CorruptCheckpointError

__all__ = [
    "ALIVE",
    "BACKENDS",
    "DEVICES",
    "HEARTBEAT_MAX_S",
    "STARTUP_TIMEOUT_S",
    "STOP",
    "Boot",
    "Job",
    "RankContext",
    "TCPStore",
    "check_device",
    "heartbeat_s",
    "worker_main",
]

DEVICES: dict[str, str] = {
    "cpu": "CPU tensors, gloo point-to-point",
    "cuda": "GPU compute; NCCL point-to-point when every rank has its own GPU, else gloo through "
    "host memory",
}
"""The closed table of devices the executor runs on (default ``cpu``)."""
BACKENDS = ("gloo", "nccl")
"""The torch.distributed backends a run may ask for."""

STARTUP_TIMEOUT_S = 180.0
"""Spawning a process imports torch: seconds allowed for every rank to join the group."""
SWITCH_INTERVAL_S = 1e-4
"""GIL switch interval in the workers (Python's default is 5 ms): a worker's message and
transfer threads must not wait for its compute thread to let go of the interpreter."""
PARENT_CHECK_S = 0.5
"""How often a worker waiting for a command checks that its parent is still there."""
STOP = None
"""The message that ends a worker."""
ALIVE = "alive"
"""The kind of a worker's heartbeat event."""
HEARTBEAT_MAX_S = 1.0
"""The longest interval between two heartbeats of a worker."""
TCPStore: Any = dist.TCPStore  # type: ignore[attr-defined]  # public, but not re-exported


def check_device(device: str, world_size: int, *, backend: str | None = None) -> str:
    """The torch.distributed backend for ``device``; a clear error when it cannot run here.

    ``backend`` (``gloo`` or ``nccl``) overrides the choice: gloo runs on any device (through
    host memory from a GPU), NCCL needs ``device='cuda'``."""
    if device not in DEVICES:
        raise InvalidInputError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    if backend is not None and backend not in BACKENDS:
        raise InvalidInputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if device == "cpu":
        if backend == "nccl":
            raise InvalidInputError("backend='nccl' needs device='cuda'")
        return "gloo"
    if not torch.cuda.is_available():
        raise InvalidInputError(
            "device='cuda' needs a GPU, but torch.cuda.is_available() is False on this machine "
            "(no GPU or a CPU-only torch build); use device='cpu'"
        )
    if backend is not None:
        return backend
    return "nccl" if torch.cuda.device_count() >= max(2, world_size) else "gloo"


def heartbeat_s(timeout_s: float) -> float:
    """How often a worker of a run with ``timeout_s`` says it is alive (a quarter of the timeout,
    at most HEARTBEAT_MAX_S)."""
    return min(HEARTBEAT_MAX_S, timeout_s / 4)


def _loopback_interface() -> str | None:
    with contextlib.suppress(OSError):
        for _, name in socket.if_nameindex():
            if name.startswith("lo"):
                return name
    return None


@dataclass(frozen=True)
class Boot:
    """What a spawned worker needs to join the group (pickled to it)."""

    rank: int
    world_size: int
    store_port: int
    device: str
    backend: str
    timeout_s: float


class RankContext:
    """A worker's view of the run: its rank, its devices, the clock, messages and transfers."""

    def __init__(self, boot: Boot, commands: Connection, events: Connection) -> None:
        self.rank, self.world_size = boot.rank, boot.world_size
        self.backend, self.timeout_s = boot.backend, boot.timeout_s
        cuda = boot.device == "cuda"
        count = torch.cuda.device_count() if cuda else 0
        self.device = torch.device(f"cuda:{boot.rank % count}") if cuda else torch.device("cpu")
        self.wire = self.device if boot.backend == "nccl" else torch.device("cpu")
        """Where torch.distributed's tensors live (host memory for gloo)."""
        self.store: Any = None
        """The group's TCPStore (a transport's rendezvous)."""
        self.fault: InjectedFault | None = None
        self.num_layers: int | None = None
        self.t0 = time.monotonic()
        self._commands, self._events = commands, events
        self._emit_lock = threading.Lock()

    def emit(self, kind: str, data: Any = None) -> None:
        _send(self._events, Event(self.rank, kind, data), self._emit_lock)

    def command(self, timeout_s: float | None = None) -> Any:
        """The next message from the parent (None: wait as long as the parent lives).

        The stop message ends the job (SystemExit); so does the parent's death."""
        message = _next_command(self._commands, timeout_s)
        if message is STOP:
            raise SystemExit(0)
        return message

    def ready(self) -> float:
        """Report ready, wait for the shared start time, sleep until it; returns it."""
        self.emit("ready")
        kind, t0 = self.command()
        if kind != "go":
            raise TransferError(Failure(f"expected the start signal, got {kind!r}"))
        self.t0 = float(t0)
        self.sleep_until(0.0)
        return self.t0

    def now(self) -> float:
        """Seconds since the shared start time."""
        return time.monotonic() - self.t0

    def sleep_until(self, at_s: float) -> None:
        delay = at_s - self.now()
        if delay > 0:
            time.sleep(delay)

    def synchronize(self) -> None:
        """Wait for queued GPU work (no-op on the CPU), so times are real."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def maybe_fail(self, layer: int) -> None:
        """Apply this job's injected fault when it is for this layer.

        The signal is sent to the calling thread: a signal sent to the process may be taken by
        another thread, and this one would run on (and report progress) until the stop or the
        kill reaches it; either signal still stops or ends the whole process."""
        fault = self.fault
        if fault is None or fault.rank != self.rank or fault.layer != layer:
            return
        kind = signal.SIGKILL if fault.kind == "die" else signal.SIGSTOP
        signal.pthread_kill(threading.get_ident(), kind)

    def recv(
        self, tensor: torch.Tensor, src: int, *, layer: int | None, tag: int, **where: Any
    ) -> None:
        """Receive ``tensor`` from ``src`` (torch.distributed, within the timeout); ``where``
        (``step``, ``chunk``) goes into the failure."""
        work = dist.irecv(tensor, src=src, tag=tag, group=where.pop("group", None))
        what = f"receiving {unit_name(layer, self.num_layers)} from rank {src}"
        self._wait(work, what, Failure("", layer, src, **where))

    def send(
        self, tensor: torch.Tensor, dst: int, *, layer: int | None, tag: int, **where: Any
    ) -> None:
        work = dist.isend(tensor, dst=dst, tag=tag, group=where.pop("group", None))
        what = f"sending {unit_name(layer, self.num_layers)} to rank {dst}"
        self._wait(work, what, Failure("", layer, dst, **where))

    def _wait(self, work: Any, what: str, where: Failure) -> None:
        if work is None:
            return
        try:
            if self.backend == "nccl":
                deadline = time.monotonic() + self.timeout_s
                while not work.is_completed():
                    if time.monotonic() > deadline:
                        raise RuntimeError("Timed out")
                    time.sleep(1e-4)
                work.wait()
                self.synchronize()
            else:
                work.wait(timeout=timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:
            text = str(exc)
            if "Timed out" in text:
                message = f"timed out after {self.timeout_s:g} s {what}"
            elif "closed" in text or "reset" in text.lower():
                message = f"lost the connection {what}"
            else:
                message = f"{what} failed: {text.splitlines()[0][:200]}"
            raise TransferError(replace(where, message=message)) from None


def _send(conn: Connection, event: Event, lock: threading.Lock) -> None:
    """Write an event to the parent now, from whichever thread has it (no feeder thread)."""
    with lock:
        try:
            conn.send(event)
        except (BrokenPipeError, EOFError, OSError):
            os._exit(1)  # the parent has gone


def worker_main(boot: Boot, commands: Connection, events: Connection) -> None:
    """A worker process: join the group, then run jobs until told to stop."""
    if boot.backend == "gloo":
        loopback = _loopback_interface()
        if loopback:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    torch.set_num_threads(1)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    ctx = RankContext(boot, commands, events)
    timeout = timedelta(seconds=STARTUP_TIMEOUT_S)
    try:
        if ctx.device.type == "cuda":
            torch.cuda.set_device(ctx.device)
        store = ctx.store = TCPStore("127.0.0.1", boot.store_port, is_master=False, timeout=timeout)
        dist.init_process_group(
            boot.backend, store=store, rank=boot.rank, world_size=boot.world_size, timeout=timeout
        )
    except Exception as exc:
        ctx.emit("error", Failure(f"could not join the group: {exc}"))
        return
    ctx.emit("up", os.getpid())
    beat = threading.Thread(
        target=_heartbeat, args=(ctx, heartbeat_s(boot.timeout_s)), name="heartbeat", daemon=True
    )
    beat.start()
    _serve(ctx, commands)
    events.close()
    os._exit(0)  # skip torch's slow interpreter teardown; every event has been written


def _heartbeat(ctx: RankContext, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        ctx.emit(ALIVE)


def _next_command(commands: Connection, timeout_s: float | None) -> Any:
    """The next command; waits in slices, ending the process if the parent has gone."""
    parent = os.getppid()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        try:
            if commands.poll(PARENT_CHECK_S):
                return commands.recv()
        except (EOFError, OSError):
            os._exit(1)  # the parent closed its end: it has gone
        if os.getppid() != parent:
            os._exit(1)
        if deadline is not None and time.monotonic() > deadline:
            raise TransferError(Failure(f"got no command from the coordinator for {timeout_s:g} s"))


def _serve(ctx: RankContext, commands: Connection) -> None:
    while True:
        message = _next_command(commands, None)
        if message is STOP:
            return
        job, payload, fault, num_layers = message
        ctx.fault, ctx.num_layers = fault, num_layers
        try:
            result = job(ctx, payload)
        except SystemExit:
            return
        except TransferError as exc:
            ctx.emit("error", exc.failure)
            break
        except CorruptCheckpointError as exc:
            ctx.emit("error", Failure(f"{type(exc).__name__}: {exc}", exc.unit))
            break
        except Exception as exc:
            ctx.emit("error", Failure(f"{type(exc).__name__}: {exc}"))
            break
        ctx.emit("result", result)
    _await_stop(commands)


def _await_stop(commands: Connection) -> None:
    """The group is broken: wait until the parent ends this process. Commands sent before the
    parent heard of the failure (such as the end of a run) are read and dropped: only STOP ends
    the wait."""
    command = _next_command(commands, None)
    while command is not STOP:
        command = _next_command(commands, None)


Job = Callable[[RankContext, Any], Any]
"""A module-level function run in a worker: ``job(ctx, payload) -> result``."""
