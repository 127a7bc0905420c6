"""The executor: a thin data plane that runs ScalePlan documents for real (the ``torch`` extra;
``nixl`` for the NIXL transport; importing it without torch raises SolverUnavailableError), in
parts :mod:`.program`, :mod:`.transports`, :mod:`.runtime`, :mod:`.serving`, :mod:`.smallmodel`."""

from __future__ import annotations

import importlib

from blitzplan.errors import SolverUnavailableError


def require_torch() -> None:
    """Raise SolverUnavailableError unless torch can be imported."""
    try:
        importlib.import_module("torch")
    except ImportError as exc:
        raise SolverUnavailableError(
            "blitzplan.executor needs torch: pip install 'blitzplan[torch]'"
        ) from exc


require_torch()

from blitzplan.executor.program.runner import ProgramRun, run_program  # noqa: E402
from blitzplan.executor.runtime.failures import InjectedFault, RankFailedError  # noqa: E402
from blitzplan.executor.runtime.pool import Workers  # noqa: E402
from blitzplan.executor.serving.serve import LiveRun, serve_live  # noqa: E402

__all__ = [
    "InjectedFault",
    "LiveRun",
    "ProgramRun",
    "RankFailedError",
    "Workers",
    "require_torch",
    "run_program",
    "serve_live",
]
