"""The executor: a thin data plane that runs ScalePlan documents for real (the ``torch`` extra;
``nixl`` for the NIXL transport; importing it without torch raises SolverUnavailableError), in
parts :mod:`.program`, :mod:`.transports`, :mod:`.runtime`, :mod:`.serving`, :mod:`.smallmodel`."""

from __future__ import annotations

import importlib

from blitzplan.errors import SolverUnavailableError


def require_torch() -> None:
    """Raise SolverUnavailableError unless torch and safetensors can be imported."""
    for name in ("torch", "safetensors"):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise SolverUnavailableError(
                f"blitzplan.executor needs {name}: pip install 'blitzplan[torch]'"
            ) from exc


require_torch()

from blitzplan.executor.program.runner import ProgramRun, run_program  # noqa: E402
from blitzplan.executor.runtime.failures import InjectedFault, RankFailedError  # noqa: E402
from blitzplan.executor.runtime.pool import Workers  # noqa: E402
from blitzplan.executor.serving.serve import LiveRun, serve_live  # noqa: E402
from blitzplan.executor.smallmodel.checkpoint import Checkpoint, save_checkpoint  # noqa: E402

__all__ = [
    "Checkpoint",
    "InjectedFault",
    "LiveRun",
    "ProgramRun",
    "RankFailedError",
    "Workers",
    "require_torch",
    "run_program",
    "save_checkpoint",
    "serve_live",
]
