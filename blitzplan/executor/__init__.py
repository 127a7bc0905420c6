"""The executor: a thin data plane that runs ScalePlan documents for real (the ``torch`` extra;
``nixl`` for the NIXL transport; importing it without torch raises SolverUnavailableError), in
parts :mod:`.program`, :mod:`.transports`, :mod:`.runtime`, :mod:`.serving`, :mod:`.smallmodel`."""

from __future__ import annotations

from blitzplan.errors import SolverUnavailableError

try:
    import torch  # noqa: F401
except ImportError as exc:
    raise SolverUnavailableError(
        "blitzplan.executor needs torch: pip install 'blitzplan[torch]'"
    ) from exc

from blitzplan.executor.program.runner import ProgramRun, run_program
from blitzplan.executor.runtime.failures import InjectedFault, RankFailedError
from blitzplan.executor.runtime.pool import Workers
from blitzplan.executor.serving.serve import LiveRun, serve_live

__all__ = [
    "InjectedFault",
    "LiveRun",
    "ProgramRun",
    "RankFailedError",
    "Workers",
    "run_program",
    "serve_live",
]
