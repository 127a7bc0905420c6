"""The ``validate`` subcommand: run the executor end to end and print predicted vs measured.

:func:`add_validate_command` registers it on the ``blitzplan`` parser's subparsers; importing
this module imports no torch (the command loads the executor when it runs). ``main`` runs the
command alone: ``python -m blitzplan.executor.cli validate --json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from blitzplan.errors import BlitzplanError

__all__ = ["EXIT_MISMATCH", "add_validate_command", "main"]

EXIT_MISMATCH = 1
"""Exit status when the executor's outputs differ from the monolithic model (or bits differ)."""

_DEFAULT_POLICIES = ("stop_the_world", "best_effort", "zigzag")
_DESCRIPTION = """\
Run a plan for real on this machine and compare it with the planner's predictions.

Starts one process per weight source, per new instance and for the old instance (torch.distributed:
gloo on the CPU, NCCL on GPUs), calibrates per-layer compute and the links, plans the multicast
with plan_multicast on a topology paced to the measured link rate, runs the chain (every layer
checked bit-exact on every target), then serves a queue live under each policy, predicted with
schedule_live. Prints predicted vs measured tables and writes a PNG. Exits 1 when any output
differs from the monolithic model's (logits beyond 1e-5 or a layer not bit-exact).

With --plan (or --program) it instead runs the transfer program of a ScalePlan document from its
JSON alone: one process per device, every new GPU's buffers checked bit-exact, each step's
measured first byte out and last byte in beside the document's predictions:
  blitzplan validate --plan-scenario small --plan-out plan.json --checkpoint weights
  blitzplan validate --plan plan.json --checkpoint weights
or both at once: blitzplan validate --program small"""


def add_validate_command(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register ``validate`` on ``subparsers`` (the ``blitzplan`` parser's)."""
    cmd = subparsers.add_parser(
        "validate",
        help="run a plan for real (torch executor) and compare it with the predictions",
        description=_DESCRIPTION,
        epilog="example:\n  blitzplan validate --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmd.add_argument("--device", default="cpu", help="cpu (default) or cuda (needs a GPU)")
    cmd.add_argument(
        "--scenario", default="default", help="default (8 layers, 12 requests) or quick"
    )
    cmd.add_argument(
        "--policies",
        default=",".join(_DEFAULT_POLICIES),
        help="comma-separated live policies (stop_the_world, best_effort, zigzag)",
    )
    cmd.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint directory (--program and --plan-scenario write seeded weights there "
        "when it has none)",
    )
    cmd.add_argument("--timeout", type=float, default=30.0, help="seconds any receive may wait")
    cmd.add_argument("--seed", type=int, default=0, help="seed of the weights and prompts")
    cmd.add_argument(
        "--png", default="blitzplan-validate.png", help="where to write the figure ('' for none)"
    )
    cmd.add_argument("--json", action="store_true", help="print the summary as JSON")
    program = cmd.add_argument_group(
        "transfer program",
        "run a ScalePlan document's transfer program alone (its JSON, no planner objects)",
    )
    program.add_argument(
        "--plan", default=None, help="a ScalePlan JSON document to run (with --checkpoint)"
    )
    program.add_argument(
        "--program",
        default=None,
        metavar="SCENARIO",
        help="plan a built-in scenario (small, large), write its JSON, run it from the JSON",
    )
    program.add_argument(
        "--plan-scenario",
        default=None,
        metavar="SCENARIO",
        help="only write a built-in scenario's document (to --plan-out; weights to --checkpoint)",
    )
    program.add_argument("--plan-out", default=None, help="where to write the document")
    program.add_argument("--unpaced", action="store_true", help="run every step as fast as it goes")
    cmd.set_defaults(func=run_validate)


def run_validate(args: argparse.Namespace) -> int:
    """The command: 0 when outputs match the monolithic model, EXIT_MISMATCH otherwise."""
    from blitzplan.executor import require_torch

    require_torch()
    if args.plan or args.program or args.plan_scenario:
        from blitzplan.executor.program_cli import run_program_command

        return run_program_command(args)
    from blitzplan.executor.report import format_report, write_png
    from blitzplan.executor.validate import validate

    result = validate(
        args.scenario,
        device=args.device,
        policies=[p.strip() for p in args.policies.split(",") if p.strip()],
        checkpoint=args.checkpoint,
        timeout_s=args.timeout,
        seed=args.seed,
    )
    png = write_png(result, args.png) if args.png else None
    if args.json:
        print(json.dumps({**result.to_json(), "png": str(png) if png else None}, indent=2))
    else:
        print(format_report(result))
        if png is not None:
            print(f"\nfigure written to {png}")
    return 0 if result.ok else EXIT_MISMATCH


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m blitzplan.executor.cli validate ...`` (the ``validate`` command alone)."""
    parser = argparse.ArgumentParser(prog="blitzplan")
    add_validate_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        result: int = args.func(args)
    except BlitzplanError as exc:
        print(f"blitzplan: error: {exc}", file=sys.stderr)
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
