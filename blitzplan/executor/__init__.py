"""The torch executor: run a chosen plan for real and check it against the planner's predictions.

Needs the ``torch`` extra (torch and safetensors); nothing else in blitzplan imports it, and
importing this package imports no torch either: each name in ``__all__`` loads its module on
first use, so the ``validate`` command can be registered in the CLI without torch. The functions
named like their modules are imported from them: ``from blitzplan.executor.validate import
validate`` (likewise ``calibrate`` and ``replay``).

- :mod:`~blitzplan.executor.model`: a small Llama-style decoder in plain torch, by units;
- :mod:`~blitzplan.executor.checkpoint`: seeded weights, one safetensors file per unit;
- :mod:`~blitzplan.executor.processes`, :mod:`~blitzplan.executor.worker`: the worker processes;
- :mod:`~blitzplan.executor.faults`: failures that name a rank and a layer, injected faults;
- :mod:`~blitzplan.executor.multicast`, :mod:`~blitzplan.executor.transfer`: a MulticastPlan's
  chains over torch.distributed, paced, chunk by chunk;
- :mod:`~blitzplan.executor.program` (:mod:`~blitzplan.executor.program_doc`,
  :mod:`~blitzplan.executor.program_checks`, :mod:`~blitzplan.executor.program_worker`,
  :mod:`~blitzplan.executor.program_result`, :mod:`~blitzplan.executor.program_timeline`): a
  ScalePlan document's transfer program run from its JSON alone, bit-exact per GPU, with
  built-in documents in :mod:`~blitzplan.executor.program_scenario`;
- :mod:`~blitzplan.executor.live`, :mod:`~blitzplan.executor.instances`,
  :mod:`~blitzplan.executor.coordinator`: live cooperative execution driven by the policies;
- :mod:`~blitzplan.executor.calibrate`, :mod:`~blitzplan.executor.probes`: measured compute
  and links, fitted models;
- :mod:`~blitzplan.executor.replay`: a prediction fed a run's own measurements;
- :mod:`~blitzplan.executor.validate` (:mod:`~blitzplan.executor.scenarios`,
  :mod:`~blitzplan.executor.results`, :mod:`~blitzplan.executor.report`): all of it end to end,
  predicted beside measured.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from blitzplan.errors import SolverUnavailableError

if TYPE_CHECKING:
    from blitzplan.executor.calibrate import Calibration, paced_topology
    from blitzplan.executor.checkpoint import (
        Checkpoint,
        CorruptCheckpointError,
        check_identity,
        load_checkpoint,
        save_checkpoint,
    )
    from blitzplan.executor.faults import InjectedFault, RankFailedError
    from blitzplan.executor.live import LiveRun, live_violations, run_live
    from blitzplan.executor.multicast import MulticastRun, run_multicast
    from blitzplan.executor.processes import Workers
    from blitzplan.executor.program import run_program
    from blitzplan.executor.program_result import ProgramRun
    from blitzplan.executor.report import format_report, write_png
    from blitzplan.executor.results import ValidationResult
    from blitzplan.executor.scenarios import SCENARIOS, Scenario

__all__ = [
    "SCENARIOS",
    "Calibration",
    "Checkpoint",
    "CorruptCheckpointError",
    "InjectedFault",
    "LiveRun",
    "MulticastRun",
    "ProgramRun",
    "RankFailedError",
    "Scenario",
    "ValidationResult",
    "Workers",
    "check_identity",
    "format_report",
    "live_violations",
    "load_checkpoint",
    "paced_topology",
    "require_torch",
    "run_live",
    "run_multicast",
    "run_program",
    "save_checkpoint",
    "write_png",
]

_MODULES = {
    "Calibration": "calibrate",
    "paced_topology": "calibrate",
    "Checkpoint": "checkpoint",
    "CorruptCheckpointError": "checkpoint",
    "check_identity": "checkpoint",
    "load_checkpoint": "checkpoint",
    "save_checkpoint": "checkpoint",
    "LiveRun": "live",
    "live_violations": "live",
    "run_live": "live",
    "MulticastRun": "multicast",
    "run_multicast": "multicast",
    "InjectedFault": "faults",
    "RankFailedError": "faults",
    "Workers": "processes",
    "run_program": "program",
    "ProgramRun": "program_result",
    "format_report": "report",
    "write_png": "report",
    "SCENARIOS": "scenarios",
    "Scenario": "scenarios",
    "ValidationResult": "results",
}
_REQUIRED = ("torch", "safetensors")


def require_torch() -> None:
    """Raise SolverUnavailableError unless torch and safetensors can be imported."""
    for name in _REQUIRED:
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
