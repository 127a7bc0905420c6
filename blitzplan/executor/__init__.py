"""The executor: a thin data plane that runs ScalePlan documents for real.

Needs the ``torch`` extra (the ``nixl`` extra for the NIXL transport); importing this package
imports neither: each name in ``__all__`` loads its module on first use. Its parts:

- :mod:`~blitzplan.executor.program`: a document's transfer program run from its JSON alone
  (reader, device jobs, the per-device session, results, the built-in scenarios), a replan
  taking a running program over;
- :mod:`~blitzplan.executor.transports`: ``torch`` (gloo, NCCL) and ``nixl`` (one-sided WRITE);
- :mod:`~blitzplan.executor.runtime`: the worker processes, their failures, injected faults;
- :mod:`~blitzplan.executor.serving`: a document's live pair served for real by the relay state
  machine the planner and the simulator drive;
- :mod:`~blitzplan.executor.smallmodel`: the small Llama-style model and its checkpoints.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from blitzplan.errors import SolverUnavailableError

if TYPE_CHECKING:
    from blitzplan.executor.program.outcome import ProgramRun
    from blitzplan.executor.program.runner import run_program
    from blitzplan.executor.runtime.failures import InjectedFault, RankFailedError
    from blitzplan.executor.runtime.pool import Workers
    from blitzplan.executor.serving.serve import LiveRun, serve_live
    from blitzplan.executor.smallmodel.checkpoint import Checkpoint, save_checkpoint

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

_MODULES = {
    "Checkpoint": "smallmodel.checkpoint",
    "save_checkpoint": "smallmodel.checkpoint",
    "InjectedFault": "runtime.failures",
    "RankFailedError": "runtime.failures",
    "Workers": "runtime.pool",
    "ProgramRun": "program.outcome",
    "run_program": "program.runner",
    "LiveRun": "serving.serve",
    "serve_live": "serving.serve",
}


def require_torch() -> None:
    """Raise SolverUnavailableError unless torch and safetensors can be imported."""
    for name in ("torch", "safetensors"):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise SolverUnavailableError(
                f"blitzplan.executor needs {name}: pip install 'blitzplan[torch]'"
            ) from exc


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module 'blitzplan.executor' has no attribute {name!r}")
    require_torch()
    module = importlib.import_module(f"blitzplan.executor.{_MODULES[name]}")
    return getattr(module, name)
