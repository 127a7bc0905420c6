"""Worker processes joined in one torch.distributed group, run from the parent.

:class:`Workers` is the executor's stateful object (one pool serves runs of both transports). It
spawns one process per rank (``spawn`` context, one torch thread each, see
:mod:`~blitzplan.executor.runtime.worker`), joins them over a TCPStore on 127.0.0.1 that it owns
(the port is the store's own, never guessed), runs jobs on them and relays their events. Every job
reports ``ready``, then waits for one shared start time ``t0`` so that all ranks measure times from
the same instant (``time.monotonic`` is one clock for every process of the machine).

Every receive and send has a timeout. A worker whose transfer fails reports the peer and the unit
it was moving; a process that dies is seen by its exit code; a process that is stopped (frozen)
is seen by its heartbeat stopping. Either way :meth:`Workers.next_event` ends every process and
raises :class:`~blitzplan.executor.runtime.failures.RankFailedError` naming the culprit rank, the
unit it was at (always a unit of the model) and, where known, the step and chunk: the dead rank,
else the frozen one, else the peer a report names.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from blitzplan._checks import MAX_SECONDS, is_number
from blitzplan.errors import InvalidInputError
from blitzplan.executor.runtime.failures import (
    Event,
    Failure,
    InjectedFault,
    RankFailedError,
    chunk_name,
    unit_name,
)
from blitzplan.executor.runtime.worker import (
    ALIVE,
    STARTUP_TIMEOUT_S,
    STOP,
    Boot,
    Job,
    TCPStore,
    check_device,
    heartbeat_s,
    worker_main,
)

__all__ = ["GRACE_S", "POLITE_S", "POLL_S", "WATCHDOG_FACTOR", "Workers"]

POLL_S = 0.02
"""How often the parent looks at its children's exit codes while it waits for events."""
GRACE_S = 0.3
"""After a worker reports a failed transfer, how long the parent waits to see its peer die."""
WATCHDOG_FACTOR = 2.0
"""A run with no event at all for this many receive timeouts has stalled (a worker's own
timeouts fire first and name the peer; this catches the rest), and so has a worker that sent
not even a heartbeat for as long."""
MISSED_BEATS = 3
"""A worker that missed this many heartbeats is frozen (when a failure needs a culprit)."""
POLITE_S = 2.0
"""How long a polite close waits for the workers to exit before killing them."""


class Workers:
    """``len(labels)`` spawned processes in one process group; use as a context manager.

    ``labels`` name the ranks in messages (``relabel`` renames them once a plan is known).
    ``timeout_s`` bounds every receive, send and wait of a run. ``backend`` overrides the
    torch.distributed backend chosen for ``device`` (:func:`~blitzplan.executor.runtime.
    worker.check_device`).
    """

    def __init__(
        self,
        labels: Sequence[str],
        *,
        device: str = "cpu",
        timeout_s: float = 30.0,
        backend: str | None = None,
    ) -> None:
        if not (is_number(timeout_s) and 0 < timeout_s <= MAX_SECONDS):
            raise InvalidInputError(
                f"timeout_s must be a number > 0 (at most {MAX_SECONDS:g} s), got {timeout_s!r}"
            )
        if len(labels) < 2:
            raise InvalidInputError(f"labels must name at least 2 ranks, got {list(labels)!r}")
        self.backend = check_device(device, len(labels), backend=backend)
        self.device, self.timeout_s = device, float(timeout_s)
        self.labels = list(labels)
        self.num_layers: int | None = None
        self._progress: dict[int, int | None] = dict.fromkeys(range(len(labels)))
        self._at: dict[int, tuple[int, tuple[int, int]]] = {}
        """Each rank's last step and chunk (from its ``at`` events)."""
        self._heard_s: dict[int, float] = {}
        """When each rank that is up last sent anything (a heartbeat at least)."""
        self._pending: deque[Event] = deque()
        self._results: dict[int, Any] = {}
        self._closed = False
        context = mp.get_context("spawn")
        self._store = TCPStore(
            "127.0.0.1",
            0,
            None,
            True,
            timeout=timedelta(seconds=STARTUP_TIMEOUT_S),
            wait_for_workers=False,
        )
        self._events: list[Connection] = []
        self._commands: list[Connection] = []
        self._procs: list[BaseProcess] = []
        try:
            for rank in range(len(labels)):
                boot = Boot(rank, len(labels), self._store.port, device, self.backend, timeout_s)
                events_r, events_w = context.Pipe(duplex=False)
                commands_r, commands_w = context.Pipe(duplex=False)
                proc = context.Process(
                    target=worker_main,
                    args=(boot, commands_r, events_w),
                    name=f"blitzplan-rank{rank}",
                    daemon=True,
                )
                proc.start()
                events_w.close()  # the worker holds the writing end: EOF when it exits
                commands_r.close()
                self._procs.append(proc)
                self._events.append(events_r)
                self._commands.append(commands_w)
            self._wait_for("up", range(len(labels)), STARTUP_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    @property
    def world_size(self) -> int:
        return len(self.labels)

    @property
    def pids(self) -> tuple[int | None, ...]:
        return tuple(proc.pid for proc in self._procs)

    def relabel(self, labels: Mapping[int, str]) -> None:
        """Rename ranks (for messages)."""
        for rank, label in labels.items():
            self.labels[rank] = label

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- jobs ---------------------------------------------------------------------------------

    def launch(
        self,
        jobs: Mapping[int, tuple[Job, Any]],
        *,
        num_layers: int | None = None,
        fault: InjectedFault | None = None,
        start_delay_s: float = 0.05,
    ) -> float:
        """Submit one job per rank, wait until each is ready, start them together; returns t0."""
        if fault is not None:
            _check_fault(fault, jobs, num_layers)
        self.num_layers = num_layers
        self._progress = dict.fromkeys(range(self.world_size), 0)
        self._at = {}
        for rank in jobs:
            self._results.pop(rank, None)
        for rank, (job, payload) in jobs.items():
            self.tell(rank, (job, payload, fault, num_layers))
        self._wait_for("ready", jobs, STARTUP_TIMEOUT_S)
        t0 = time.monotonic() + start_delay_s
        for rank in jobs:
            self.tell(rank, ("go", t0))
        return t0

    def tell(self, rank: int, message: Any) -> None:
        """Send a message to the job running on ``rank``."""
        with contextlib.suppress(OSError):  # a worker that has gone is seen by its exit code
            self._commands[rank].send(message)

    def collect(self, ranks: Sequence[int]) -> dict[int, Any]:
        """The results of the jobs on ``ranks``, waiting for those not in yet (a result seen by
        :meth:`next_event` earlier counts); no event at all for WATCHDOG_FACTOR receive timeouts
        is a stall."""
        while any(rank not in self._results for rank in ranks):
            if self.next_event(WATCHDOG_FACTOR * self.timeout_s) is None:
                self.fail_stalled([r for r in ranks if r not in self._results])
        return {rank: self._results.pop(rank) for rank in ranks}

    def next_event(self, timeout_s: float) -> Event | None:
        """The next event within ``timeout_s`` (None if none; heartbeats are not events);
        raises RankFailedError."""
        deadline = time.monotonic() + timeout_s
        while True:
            event = self._pop(min(POLL_S, max(0.0, deadline - time.monotonic())))
            if event is not None:
                self._heard_s[event.rank] = time.monotonic()
                if event.kind != ALIVE:
                    return self._handle(event)
            dead = self._dead()
            if dead:
                self._fail(dead[0], None)
            frozen = self._frozen(WATCHDOG_FACTOR * self.timeout_s)
            if frozen:
                self.fail_stalled(frozen)
            if time.monotonic() >= deadline:
                return None

    def _pop(self, timeout_s: float) -> Event | None:
        if self._pending:
            return self._pending.popleft()
        self._receive(timeout_s)
        return self._pending.popleft() if self._pending else None

    def _receive(self, timeout_s: float) -> None:
        """Read every event the workers have written, waiting up to ``timeout_s`` for one."""
        open_ends = [conn for conn in self._events if not conn.closed]
        ready = wait(open_ends, timeout_s)
        for conn in open_ends:
            if conn not in ready:
                continue
            try:
                while conn.poll():
                    self._pending.append(conn.recv())
            except (EOFError, OSError):
                conn.close()  # the worker exited

    def _handle(self, event: Event) -> Event:
        if event.kind == "error":
            self._fail(None, event)
        if event.kind == "result":
            self._results[event.rank] = event.data
        elif event.kind == "unit":
            self._progress[event.rank] = int(event.data[0]) + 1
        elif event.kind == "at":  # a unit, or (unit, step, (lo, hi)) of a chunk
            unit, *where = event.data if isinstance(event.data, tuple) else (event.data,)
            self._progress[event.rank] = int(unit)
            if where:
                self._at[event.rank] = (where[0], where[1])
        return event

    def _wait_for(
        self, kind: str, ranks: Sequence[int] | Mapping[int, Any], timeout_s: float
    ) -> None:
        waiting = set(ranks)
        deadline = time.monotonic() + timeout_s
        stash: list[Event] = []
        while waiting:
            event = self.next_event(max(0.0, deadline - time.monotonic()))
            if event is None:
                self.fail_stalled(sorted(waiting))
            elif event.kind == kind and event.rank in waiting:
                waiting.discard(event.rank)
            else:
                stash.append(event)
        self._pending.extend(stash)

    # --- failures -----------------------------------------------------------------------------

    def _dead(self) -> list[int]:
        return [rank for rank, proc in enumerate(self._procs) if proc.exitcode is not None]

    def _frozen(self, silent_s: float) -> list[int]:
        """Ranks that are up and sent nothing, not even a heartbeat, for ``silent_s``; the most
        silent first."""
        now = time.monotonic()
        silent = [(heard, rank) for rank, heard in self._heard_s.items() if now - heard > silent_s]
        return [rank for _, rank in sorted(silent)]

    def _fail(self, dead_rank: int | None, report: Event | None) -> None:
        if dead_rank is None:
            deadline = time.monotonic() + GRACE_S
            while not self._dead() and time.monotonic() < deadline:
                self._receive(POLL_S)  # heartbeats keep the others off the frozen list
                self._note_heartbeats()
            dead = self._dead()
            dead_rank = dead[0] if dead else None
        failure: Failure | None = report.data if report is not None else None
        frozen = self._frozen(MISSED_BEATS * heartbeat_s(self.timeout_s))
        if dead_rank is None and frozen:
            peer = failure.peer if failure is not None else None
            error = self._frozen_error(peer if peer in frozen else frozen[0], report, failure)
        else:
            error = self._explain(dead_rank, report, failure)
        self.close(polite=False)
        raise error

    def _note_heartbeats(self) -> None:
        """Take the heartbeats out of the pending events, noting when each rank sent one."""
        now, kept = time.monotonic(), deque[Event]()
        for event in self._pending:
            self._heard_s[event.rank] = now
            if event.kind != ALIVE:
                kept.append(event)
        self._pending = kept

    def _frozen_error(
        self, rank: int, report: Event | None, failure: Failure | None
    ) -> RankFailedError:
        said = ""
        if report is not None and failure is not None:
            said = f"; rank {report.rank} ({self.labels[report.rank]}) reported: {failure.message}"
        silent_s = time.monotonic() - self._heard_s[rank]
        said += f"; no sign of life from rank {rank} for {silent_s:.1f} s"
        return self._error(rank, self._layer_of(rank, failure), "stalled", said, failure)

    def _explain(
        self, dead_rank: int | None, report: Event | None, failure: Failure | None
    ) -> RankFailedError:
        said = ""
        if report is not None and failure is not None:
            said = f"; rank {report.rank} ({self.labels[report.rank]}) reported: {failure.message}"
        if dead_rank is not None:
            code = self._procs[dead_rank].exitcode
            layer = self._layer_of(dead_rank, failure)
            what = (
                f"died (exit code {code})" if code else "exited (exit code 0) before its job ended"
            )
            return self._error(dead_rank, layer, what, said, failure)
        if report is None or failure is None:
            return self._error(0, None, "failed", "; no rank reported why")
        if failure.peer is not None:
            layer = self._layer_of(failure.peer, failure)
            return self._error(failure.peer, layer, "stalled", said, failure)
        return self._error(report.rank, failure.layer, "failed", said, failure)

    def _layer_of(self, culprit: int, failure: Failure | None) -> int | None:
        """The unit the culprit itself was at (from its events; once it has every unit, the
        last), else the one its peer reported."""
        own = self._progress.get(culprit)
        if own is not None:
            return own if self.num_layers is None else min(own, self.num_layers + 1)
        return failure.layer if failure is not None and failure.peer == culprit else None

    def _error(
        self, rank: int, layer: int | None, what: str, said: str, failure: Failure | None = None
    ) -> RankFailedError:
        """The error naming ``rank``, its unit and its step and chunk: its own last ones, else
        those of the report about it."""
        step, chunk = self._at.get(rank, (None, None))
        if step is None and failure is not None and failure.peer in (rank, None):
            step, chunk = failure.step, failure.chunk
        where = unit_name(layer, self.num_layers) + chunk_name(step, chunk, layer)
        message = f"rank {rank} ({self.labels[rank]}) {what} at {where}{said}"
        label = self.labels[rank]
        return RankFailedError(message, rank=rank, label=label, layer=layer, step=step, chunk=chunk)

    def fail_stalled(self, ranks: Sequence[int]) -> None:
        """End every process and raise: ``ranks`` sent nothing for timeout_s. The culprit is a
        frozen rank (one whose heartbeat stopped) if there is one, else the one of ``ranks``
        that got least far."""
        self._note_heartbeats()
        frozen = self._frozen(MISSED_BEATS * heartbeat_s(self.timeout_s))
        if frozen:
            error = self._frozen_error(frozen[0], None, None)
            self.close(polite=False)
            raise error
        slowest = min(ranks, key=lambda r: (self._progress.get(r) or 0, r))
        names = ", ".join(str(r) for r in ranks)
        said = f"; no event from rank(s) {names} for {self.timeout_s:g} s"
        error = self._error(slowest, self._progress.get(slowest), "stalled", said)
        self.close(polite=False)
        raise error

    # --- shutdown -----------------------------------------------------------------------------

    def close(self, *, polite: bool = True) -> None:
        """End every process and release the queues and the store.

        ``polite``: ask each process to stop and give it a moment; otherwise (after a failure)
        kill them at once. Either way no process outlives this call."""
        if self._closed:
            return
        self._closed = True
        if polite:
            for rank, proc in enumerate(self._procs):
                if proc.exitcode is None:
                    self.tell(rank, STOP)
        deadline = time.monotonic() + (POLITE_S if polite else 0.0)
        while any(p.exitcode is None for p in self._procs) and time.monotonic() < deadline:
            self._drain()  # a worker flushes its last events before it exits
            time.sleep(POLL_S)
        for proc in self._procs:
            if proc.exitcode is None:
                proc.kill()  # a stopped process ignores SIGTERM; SIGKILL ends it anyway
        for proc in self._procs:
            proc.join(5.0)
            with contextlib.suppress(ValueError):
                proc.close()
        for conn in (*self._commands, *self._events):
            conn.close()
        del self._store

    def _drain(self) -> None:
        self._receive(0.0)
        self._pending.clear()


def _check_fault(
    fault: InjectedFault, jobs: Mapping[int, tuple[Job, Any]], num_layers: int | None
) -> None:
    """A fault that could never fire is refused before the run starts."""
    if fault.rank not in jobs:
        raise InvalidInputError(f"fault names rank {fault.rank}, which runs no job")
    if num_layers is None:
        raise InvalidInputError("a fault needs the run's num_layers (its layer must exist)")
    if fault.layer > num_layers + 1:
        raise InvalidInputError(
            f"fault layer {fault.layer} does not exist: the model's units are 0 (the embedding), "
            f"1..{num_layers} (its layers) and {num_layers + 1} (the head)"
        )
