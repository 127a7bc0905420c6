"""``blitzplan validate --plan / --program / --plan-scenario``: transfer programs from JSON.

* ``--plan PLAN.json --checkpoint DIR`` runs that document's program with those weights;
* ``--plan-scenario NAME --plan-out OUT.json [--checkpoint DIR]`` writes a built-in scenario's
  document (:mod:`~blitzplan.executor.program_scenario`), and seeded weights of its model to
  DIR, without running anything;
* ``--program NAME`` does both and runs the document it wrote, from the file (temporary files
  unless ``--plan-out`` and ``--checkpoint`` say where).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from blitzplan.errors import InvalidInputError

__all__ = ["run_program_command"]

EXIT_OK, EXIT_MISMATCH = 0, 1


def _write(args: argparse.Namespace, name: str, tmp: Path) -> tuple[Path, Path]:
    """Write scenario ``name``'s document and, unless the checkpoint directory already holds
    weights, seeded weights of its model; returns both paths."""
    from blitzplan import load_model
    from blitzplan.executor.checkpoint import MANIFEST, save_checkpoint
    from blitzplan.executor.program_scenario import PROGRAM_SCENARIOS, write_scenario

    path = write_scenario(name, args.plan_out or tmp / f"{name}.json")
    weights = Path(args.checkpoint or tmp / "weights")
    if not (weights / MANIFEST).is_file():
        save_checkpoint(load_model(dict(PROGRAM_SCENARIOS[name].config)), weights, seed=args.seed)
    return path, weights


def run_program_command(args: argparse.Namespace) -> int:
    """The command (module docstring): 0 when every new GPU is bit-exact, 1 otherwise."""
    chosen = [k for k in ("plan", "program", "plan_scenario") if getattr(args, k)]
    if len(chosen) > 1:
        raise InvalidInputError(
            "give one of --plan, --program and --plan-scenario, got " + ", ".join(chosen)
        )
    if args.plan_scenario and args.plan_out is None:
        raise InvalidInputError("--plan-scenario needs --plan-out (where to write the document)")
    if args.plan and args.checkpoint is None:
        raise InvalidInputError("--plan needs --checkpoint (the weights to send)")
    with tempfile.TemporaryDirectory(prefix="blitzplan-") as name:
        tmp = Path(name)
        if args.plan_scenario:
            path, weights = _write(args, args.plan_scenario, tmp)
            print(f"wrote {path}" + (f" and weights to {weights}" if args.checkpoint else ""))
            return EXIT_OK
        if args.program:
            path, weights = _write(args, args.program, tmp)
        else:
            path, weights = Path(args.plan), Path(args.checkpoint)
        return _run(path, weights, args)


def _run(path: Path, weights: Path, args: argparse.Namespace) -> int:
    from blitzplan.executor.program import run_program
    from blitzplan.executor.program_result import format_program_run

    run = run_program(
        path, weights, device=args.device, timeout_s=args.timeout, paced=not args.unpaced
    )
    if args.json:
        print(json.dumps({"document": str(path), **run.to_dict()}, indent=2))
    else:
        print(f"transfer program of {path} (plan_id {run.plan_id[:12]})\n")
        print(format_program_run(run))
    return EXIT_OK if run.bit_exact else EXIT_MISMATCH
