"""Sweeps: a grid of systems x workloads x seeds, in local processes or on a Ray cluster."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from typing import Any

from blitzplan._checks import check_count
from blitzplan._progress import counter
from blitzplan.errors import InvalidInputError, SolverUnavailableError

__all__ = ["BACKENDS", "Cell", "grid", "run_cell", "sweep"]

BACKENDS = ("local", "ray")
"""local: a process pool on this machine; ray: one Ray task per cell (``pip install
blitzplan[ray]``; ``ray.init()`` joins the cluster in RAY_ADDRESS, else starts a local one)."""

_LOG = logging.getLogger(__name__)

_Done = Callable[[int, dict[str, Any]], None]
"""Called with a cell's index and its result as each cell finishes."""

MAX_WORKERS = 1024
"""The most local worker processes a sweep starts."""


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    topology: str
    model: str
    tp: int
    system: str
    trace: str | None
    seed: int
    window_s: tuple[float, float] | None = None
    rate_scale: float | None = None


def grid(
    *,
    topology: str,
    model: str,
    tp: int,
    systems: Sequence[str],
    traces: Sequence[str | None],
    seeds: Sequence[int],
    window_s: tuple[float, float] | None = None,
    rate_scale: float | None = None,
) -> list[Cell]:
    """Every (system, trace, seed) combination, in that nesting order."""
    if not systems or not traces or not seeds:
        raise InvalidInputError("a sweep needs at least one system, one trace and one seed")
    return [
        Cell(topology, model, tp, system, trace, seed, window_s, rate_scale)
        for trace, system, seed in itertools.product(traces, systems, seeds)
    ]


def run_cell(cell: Cell) -> dict[str, Any]:
    """Simulate one cell; the summary plus the cell's coordinates."""
    from blitzplan.sim import simulate

    report = simulate(
        cell.topology,
        cell.model,
        cell.trace,
        system=cell.system,
        tp=cell.tp,
        window_s=cell.window_s,
        rate_scale=cell.rate_scale,
        seed=cell.seed,
    )
    return {**asdict(cell), **report.summary()}


def sweep(
    cells: Sequence[Cell], *, backend: str = "local", workers: int = 2, progress: bool = False
) -> list[dict[str, Any]]:
    """Run ``cells``; results come back in the cells' order whatever the backend.

    ``progress`` shows a bar of cells done on stderr (when it is a terminal)."""
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    workers = check_count("workers", workers, maximum=MAX_WORKERS)
    _LOG.info("sweep: %d cells, backend %s, %d local workers", len(cells), backend, workers)
    started = time.perf_counter()
    results: list[dict[str, Any] | None] = [None] * len(cells)
    with counter(f"sweep ({backend})", len(cells), "cells", enabled=progress) as tick:

        def done(index: int, result: dict[str, Any]) -> None:
            results[index] = result
            tick()
            _LOG.info("sweep: cell %d/%d done: %s", index + 1, len(cells), _coordinates(result))

        if backend == "ray":
            _ray(cells, done)
        elif workers == 1 or len(cells) <= 1:
            for index, cell in enumerate(cells):
                done(index, run_cell(cell))
        else:
            _processes(cells, workers, done)
    _LOG.info("sweep: %d cells in %.1f s", len(cells), time.perf_counter() - started)
    return [r for r in results if r is not None]


def _coordinates(result: dict[str, Any]) -> str:
    trace = result["trace"] or "synthetic"
    return f"system={result['system']} trace={trace} seed={result['seed']}"


def _processes(cells: Sequence[Cell], workers: int, done: _Done) -> None:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(run_cell, cell): index for index, cell in enumerate(cells)}
        try:
            for future in as_completed(futures):
                done(futures[future], future.result())
        except BaseException:
            pool.shutdown(cancel_futures=True)  # a failed cell stops the sweep: run no more
            raise


def _ray(cells: Sequence[Cell], done: _Done) -> None:
    try:
        import ray
    except ImportError:
        raise SolverUnavailableError(
            "backend 'ray' needs ray; pip install 'blitzplan[ray]'"
        ) from None
    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(run_cell)
        _gather(ray, [task.remote(cell) for cell in cells], done)
    finally:
        if started:
            ray.shutdown()


def _gather(ray: Any, refs: list[Any], done: _Done) -> None:
    """Hand each task's result to ``done`` as it finishes; on a failure cancel the rest."""
    index = {ref: k for k, ref in enumerate(refs)}
    pending = list(refs)
    try:
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                done(index[ref], ray.get(ref))
    except BaseException:
        for ref in pending:  # a failed cell stops the sweep on a shared cluster too
            ray.cancel(ref)
        raise
