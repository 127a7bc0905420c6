"""Worker processes in one torch.distributed group: one forkserver process per rank, one duplex
pipe each, a TCPStore the parent owns. A failure ends every process and raises RankFailedError
naming the rank, its unit, step and chunk."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, NoReturn

from blitzplan._checks import MAX_SECONDS, check_bounded
from blitzplan.errors import InvalidInputError
from blitzplan.executor.runtime.failures import Event, Failure, InjectedFault, RankFailedError
from blitzplan.executor.runtime.worker import (
    STARTUP_TIMEOUT_S,
    Boot,
    Job,
    TCPStore,
    check_device,
    worker_main,
)

POLL_S = 0.02
"""How often the parent looks at its children's exit codes while it waits for events."""
GRACE_S = 0.3
"""After a worker reports a failed transfer, how long the parent waits to see its peer die."""
WATCHDOG_FACTOR = 2.0
"""A run with no event for this many transfer timeouts has stalled."""


class Workers:
    """``len(labels)`` ranks (``labels`` name them in messages); ``timeout_s`` bounds every
    transfer and wait. Use as a context manager."""

    def __init__(self, labels: Sequence[str], *, device: str = "cpu", timeout_s: float = 30.0):
        self.timeout_s = check_bounded("timeout_s", timeout_s, 0.0, MAX_SECONDS, "s")
        if len(labels) < 2:
            raise InvalidInputError(f"labels must name at least 2 ranks, got {list(labels)!r}")
        self.backend = check_device(device, len(labels))
        self.labels = list(labels)
        self.closed = False
        """Whether the pool has been ended (by :meth:`close` or a failure)."""
        self._heard: dict[tuple[str, int], Any] = {}
        """The data of ``up``, ``ready`` and ``result`` events not waited for yet."""
        timeout = timedelta(seconds=STARTUP_TIMEOUT_S)
        self._store = TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["__main__", worker_main.__module__])
        self._where: Any = context.Array("q", [-1] * (4 * len(labels)), lock=False)
        """Per rank its last unit, step and chunk ``[lo, hi)`` (-1: none), kept when it dies."""
        try:
            for rank in range(len(labels)):
                boot = Boot(rank, len(labels), self._store.port, device, self.backend, timeout_s)
                ours, theirs = context.Pipe()
                proc = context.Process(
                    target=worker_main, args=(boot, theirs, self._where), daemon=True
                )
                proc.start()
                theirs.close()  # only the worker holds its end: EOF when it exits
                self._procs.append(proc)
                self._conns.append(ours)
            self._wait_for("up", range(len(labels)), STARTUP_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def launch(
        self,
        jobs: Mapping[int, tuple[Job, Any]],
        *,
        labels: Sequence[str] = (),
        fault: InjectedFault | None = None,
    ) -> float:
        """Submit one job per rank (``labels`` renames the first ranks), start them together
        once all are ready; returns t0."""
        if len(labels) > len(self.labels):
            raise InvalidInputError(
                f"workers must have at least {len(labels)} ranks, got {len(self.labels)}"
            )
        self.labels[: len(labels)] = labels
        self._where[:] = [-1] * len(self._where)
        for rank, (job, payload) in jobs.items():
            self._heard.pop(("result", rank), None)
            self.tell(rank, (job, payload, fault))
        self._wait_for("ready", list(jobs), STARTUP_TIMEOUT_S)
        t0 = time.monotonic() + 0.05
        for rank in jobs:
            self.tell(rank, ("go", t0))
        return t0

    def tell(self, rank: int, message: Any) -> None:
        """Send a message to the job running on ``rank``."""
        with contextlib.suppress(OSError):  # a worker that has gone is seen by its exit code
            self._conns[rank].send(message)

    def collect(self, ranks: Sequence[int]) -> dict[int, Any]:
        """The results of the jobs on ``ranks``, waiting for those not in yet."""
        return self._wait_for("result", ranks, WATCHDOG_FACTOR * self.timeout_s)

    def next_event(self, timeout_s: float) -> Event | None:
        """The next event within ``timeout_s`` (None if none); raises RankFailedError."""
        deadline = time.monotonic() + timeout_s
        while True:
            open_ends = [conn for conn in self._conns if not conn.closed]
            ready = wait(open_ends, min(POLL_S, max(0.0, deadline - time.monotonic())))
            for conn in (conn for conn in open_ends if conn in ready):
                try:
                    event: Event = conn.recv()
                except (EOFError, OSError):
                    conn.close()  # the worker exited
                    continue
                if event.kind == "error":
                    self._fail(event)
                if event.kind in ("up", "ready", "result"):
                    self._heard[(event.kind, event.rank)] = event.data
                return event
            if self._dead():
                self._fail(None)
            if time.monotonic() >= deadline:
                return None

    def _wait_for(self, kind: str, ranks: Sequence[int], timeout_s: float) -> dict[int, Any]:
        """The data of a ``kind`` event from each of ``ranks``, ``timeout_s`` after one another."""
        while missing := [rank for rank in ranks if (kind, rank) not in self._heard]:
            if self.next_event(timeout_s) is None:
                self.fail_stalled(missing)
        return {rank: self._heard.pop((kind, rank)) for rank in ranks}

    def _dead(self) -> list[int]:
        return [rank for rank, proc in enumerate(self._procs) if proc.exitcode is not None]

    def _fail(self, report: Event | None) -> None:
        """Raise for the culprit: a dead process (after a failed transfer, waiting a moment for
        one), else the peer the ``report`` names, else the rank that failed."""
        failure: Failure | None = None if report is None else report.data
        deadline = time.monotonic() + GRACE_S
        while not self._dead() and time.monotonic() < deadline:
            time.sleep(POLL_S)
        dead = next(iter(self._dead()), None)
        said = ""
        if report is not None and failure is not None:
            said = f"; rank {report.rank} ({self.labels[report.rank]}) reported: {failure.message}"
        if dead is not None:
            code = self._procs[dead].exitcode
            what = f"died (exit code {code})" if code else "exited before its job ended"
            self._raise(dead, what, said, failure)
        if failure is not None and failure.peer is not None:
            self._raise(failure.peer, "stalled", said, failure)
        self._raise(report.rank if report else 0, "failed", said, failure)

    def fail_stalled(self, ranks: Sequence[int]) -> None:
        """Raise for the one of ``ranks`` (silent) that got least far."""
        slowest = min(ranks, key=lambda r: (self._where[4 * r], r))
        names = ", ".join(str(r) for r in ranks)
        said = f"; no event from rank(s) {names} for {WATCHDOG_FACTOR * self.timeout_s:g} s"
        self._raise(slowest, "stalled", said, None)

    def _raise(self, rank: int, what: str, said: str, failure: Failure | None) -> NoReturn:
        """End every process; raise RankFailedError naming ``rank`` and its last unit, step and
        chunk (in shared memory: -1 none), else the failure's."""
        self.close()
        unit, step, lo, hi = self._where[4 * rank : 4 * rank + 4]
        unit, step = (None if v < 0 else v for v in (unit, step))
        at = Failure("", unit, rank, step, None if lo < 0 else (lo, hi))
        if failure is not None and failure.peer in (rank, None) and None in (step, unit):
            at = failure
        where = "an unknown unit" if at.layer is None else f"unit {at.layer}"
        if at.step is not None:  # ``unit 2 (step 4, chunk [0, 32768))``
            span = f", chunk [{at.chunk[0]}, {at.chunk[1]})" if at.chunk else ""
            where += f" (step {at.step}{span})"
        message = f"rank {rank} ({self.labels[rank]}) {what} at {where}{said}"
        raise RankFailedError(message, rank=rank, label=self.labels[rank], at=at)

    def close(self) -> None:
        """End every process at once (SIGKILL: an idle worker holds nothing to save)."""
        if self.closed:
            return
        self.closed = True
        for proc in self._procs:
            if proc.exitcode is None:
                proc.kill()
            proc.join(5.0)
            with contextlib.suppress(ValueError):
                proc.close()
        for conn in self._conns:
            conn.close()
        del self._store


def run_jobs(
    jobs: Mapping[int, tuple[Job, Any]],
    labels: Sequence[str],
    *,
    workers: Workers | None,
    device: str,
    timeout_s: float,
    fault: InjectedFault | None = None,
    drive: Callable[[Workers, float], None] | None = None,
) -> dict[int, Any]:
    """Run ``jobs`` on ``workers`` (else on a pool of ``labels`` started on ``device``), calling
    ``drive(pool, t0)`` while they run (live serving's coordinator); their results by rank."""
    pool = workers or Workers(labels, device=device, timeout_s=timeout_s)
    try:
        t0 = pool.launch(jobs, labels=labels, fault=fault)
        if drive is not None:
            drive(pool, t0)
        return pool.collect(list(jobs))
    finally:
        if workers is None:
            pool.close()
