"""Sweeps: a grid of systems x workloads x seeds, in local processes or on a Ray cluster."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from blitzplan._checks import check_count
from blitzplan.errors import InvalidInputError, SolverUnavailableError

__all__ = ["BACKENDS", "Cell", "grid", "run_cell", "sweep"]

BACKENDS = ("local", "ray")
"""local: a process pool on this machine; ray: one Ray task per cell (``pip install
blitzplan[ray]``; ``ray.init()`` joins the cluster in RAY_ADDRESS, else starts a local one)."""

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
    cells: Sequence[Cell], *, backend: str = "local", workers: int = 2
) -> list[dict[str, Any]]:
    """Run ``cells``; results come back in the cells' order whatever the backend."""
    if backend not in BACKENDS:
        raise InvalidInputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    workers = check_count("workers", workers, maximum=MAX_WORKERS)
    if backend == "ray":
        return _ray(cells)
    if workers == 1 or len(cells) <= 1:
        return [run_cell(cell) for cell in cells]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_cell, cells))


def _ray(cells: Sequence[Cell]) -> list[dict[str, Any]]:
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
        return list(ray.get([task.remote(cell) for cell in cells]))
    finally:
        if started:
            ray.shutdown()
