"""The closed table of exact backends, what each needs installed, and the statuses they map to."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from blitzplan.errors import InvalidInputError, SolverUnavailableError

__all__ = [
    "BACKENDS",
    "Backend",
    "SolveStatus",
    "available_backends",
    "check_backend",
    "load_backend",
]


class SolveStatus(Enum):
    """Outcome of a solve. OPTIMAL only when proven; FEASIBLE carries a bound and a gap.

    UNKNOWN: no answer meeting every hard constraint was found and none was proven impossible
    (a time limit, or a heuristic that missed a hard SLO).
    """

    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    INFEASIBLE = "infeasible"
    ERROR = "error"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Backend:
    """One exact backend: its name, the package it needs, what it is, the modules a solve
    imports and those it uses when installed (:func:`load_backend` imports both, once per
    process, before the solve's own clock starts: under load a first import of OR-Tools took
    seconds, and a solve that met it mid-search ran that far past its limit)."""

    name: str
    module: str | None
    description: str
    imports: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            "bnb",
            None,
            "branch and bound over the N-capacity relaxation (no extra; CP-SAT on deep nodes "
            "when OR-Tools is installed)",
            optional=("ortools.sat.python.cp_model",),
        ),
        Backend("highs", "highspy", "MILP through PuLP on HiGHS (highspy)", ("pulp", "highspy")),
        Backend("cbc", "pulp", "MILP through PuLP on its bundled CBC", ("pulp",)),
        Backend(
            "cpsat", "ortools", "OR-Tools CP-SAT interval model", ("ortools.sat.python.cp_model",)
        ),
        Backend("enumerate", None, "exhaustive search, tiny cases only (the test oracle)"),
    )
}


def _installed(module: str | None) -> bool:
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or half-removed install counts as missing
        return False


def available_backends() -> list[str]:
    """Backends whose libraries are installed (checked without importing them)."""
    return [name for name, b in BACKENDS.items() if _installed(b.module)]


def check_backend(name: str) -> Backend:
    """The Backend called ``name``; raises if the name is unknown or its library is missing."""
    if name not in BACKENDS:
        raise InvalidInputError(f"backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    backend = BACKENDS[name]
    if backend.name == "highs" and not _installed("pulp"):
        raise SolverUnavailableError(
            "backend 'highs' needs pulp and highspy: pip install 'blitzplan[exact]'"
        )
    if not _installed(backend.module):
        raise SolverUnavailableError(
            f"backend {name!r} needs the {backend.module!r} package: pip install 'blitzplan[exact]'"
        )
    return backend


def load_backend(name: str, *, time_limit_s: float | None = None) -> Backend:
    """:func:`check_backend`, then import the backend's libraries, and those of its optional
    ones that are installed when ``time_limit_s`` is None or at least
    :data:`OPTIONAL_IMPORT_MIN_S` (so that the solve's own clock, which starts afterwards,
    does not pay for a first import in a process)."""
    backend = check_backend(name)
    for module in backend.imports:
        importlib.import_module(module)
    if time_limit_s is not None and time_limit_s < OPTIONAL_IMPORT_MIN_S:
        return backend
    for module in backend.optional:
        with contextlib.suppress(ImportError):  # missing or broken: the solve does without
            importlib.import_module(module)
    return backend


OPTIONAL_IMPORT_MIN_S = 4.0
"""A time limit shorter than this does not pay for a backend's optional imports (OR-Tools for
``bnb``'s nodes: 0.5 s on a quiet 2-core machine, 2.2-2.4 s at load 8, more than a 2 s limit
there); the solve does without them, unless an earlier call imported them."""

OPTIMALITY_REL_GAP = 1e-5
"""OPTIMAL means the objective is proven within this relative gap of the best possible."""


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Silence file descriptor 1 (HiGHS prints a banner there even with output off)."""
    try:
        fd = os.dup(1)
    except OSError:  # no real stdout: nothing to silence
        yield
        return
    sys.stdout.flush()
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(fd, 1)
        os.close(fd)
