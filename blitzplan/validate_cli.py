"""The ``validate`` command: a ScalePlan document run for real by the executor (loaded only when
the command runs) beside its predictions."""

from __future__ import annotations

import argparse
from pathlib import Path

from blitzplan.errors import InvalidInputError

__all__ = ["add_validate_command"]


_VALIDATE_HELP = "run a ScalePlan document for real (the executor) beside its predictions"
_VALIDATE_EPILOG = """\
Runs a document's transfer program from its JSON alone: one process per device, over torch
(gloo on the CPU, NCCL on GPUs) or nixl (one-sided WRITEs), every new GPU checked bit-exact,
each step's measured first byte out and last byte in beside the document's. --replan with --at
makes the replan take the running program over at that time. --program NAME (small, large,
live) writes a built-in scenario's document and weights, then runs the file it wrote; live also
serves its live pair (layer times measured on the workers first). Exits 1 when a byte (or a
logit) differs.

example:
  blitzplan validate --program small --transport nixl"""


def add_validate_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("validate", help=_VALIDATE_HELP, epilog=_VALIDATE_EPILOG)
    cmd.description = _VALIDATE_HELP[0].upper() + _VALIDATE_HELP[1:] + "."
    cmd.set_defaults(func=_cmd_validate)
    cmd.add_argument("--plan", default=None, help="a ScalePlan JSON document to run")
    cmd.add_argument("--program", default=None, metavar="SCENARIO", help="small, large or live")
    cmd.add_argument("--plan-out", default=None, help="where --program writes its document")
    cmd.add_argument("--checkpoint", default=None, help="the weights (--program writes them)")
    cmd.add_argument("--replan", default=None, help="a replan document taking over at --at")
    cmd.add_argument("--at", type=float, default=None, help="seconds into the run (--replan)")
    cmd.add_argument("--transport", default="torch", help="torch (default) or nixl")
    cmd.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    cmd.add_argument("--timeout", type=float, default=30.0, help="seconds any transfer may wait")
    cmd.add_argument("--unpaced", action="store_true", help="run every step as fast as it goes")
    cmd.add_argument("--json", action="store_true", help="print the summary as JSON")


def _cmd_validate(args: argparse.Namespace) -> int:
    from blitzplan.executor import require_torch

    require_torch()
    import tempfile

    from blitzplan.executor.program.scenarios import write_scenario

    if bool(args.plan) == bool(args.program):
        raise InvalidInputError("give one of --plan FILE and --program SCENARIO")
    if args.plan and args.checkpoint is None:
        raise InvalidInputError("--plan needs --checkpoint (the weights to send)")
    with tempfile.TemporaryDirectory(prefix="blitzplan-") as tmp:
        weights = Path(args.checkpoint or Path(tmp) / "weights")
        if args.program == "live":
            return _serve_live(args, weights)
        path = Path(args.plan) if args.plan else Path(args.plan_out or Path(tmp) / "plan.json")
        if args.program:
            write_scenario(args.program, path, checkpoint=weights)
        return _run_document(args, path, weights)


def _run_document(args: argparse.Namespace, path: Path, weights: Path) -> int:
    import json

    from blitzplan.executor.program.outcome import format_program_run
    from blitzplan.executor.program.runner import run_program

    run = run_program(
        path,
        weights,
        replan=args.replan,
        at_s=args.at,
        transport=args.transport,
        device=args.device,
        timeout_s=args.timeout,
        paced=not args.unpaced,
    )
    if args.json:
        print(json.dumps({"document": str(path), **run.to_dict()}, indent=2))
    else:
        print(f"transfer program of {path} (plan_id {run.plan_id[:12]})\n")
        print(format_program_run(run))
    return 0 if run.bit_exact else 1


def _serve_live(args: argparse.Namespace, weights: Path) -> int:
    """The live scenario: layer times measured on the workers, a plan made with them, its
    program run and its live pair served on the same processes."""
    import json
    import statistics

    from blitzplan.executor.program.outcome import format_program_run
    from blitzplan.executor.program.runner import prepare
    from blitzplan.executor.program.scenarios import scenario_plan
    from blitzplan.executor.runtime.pool import Workers
    from blitzplan.executor.serving.probe import measured_compute
    from blitzplan.executor.serving.serve import live_violations, serve_live
    from blitzplan.executor.smallmodel.checkpoint import MANIFEST, load_checkpoint, save_checkpoint

    state, made = scenario_plan("live")
    if not (weights / MANIFEST).is_file():
        save_checkpoint(made.spec, weights, seed=0)
    _, jobs = prepare(made.to_json(), weights, transport=args.transport)
    names = [f"rank{k}" for k in range(len(jobs) + 1)]
    with Workers(names, device=args.device, timeout_s=args.timeout) as pool:
        compute = measured_compute(pool, made.spec, (0, len(jobs)))
        state, made = scenario_plan("live", compute=compute)
        requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}
        run = serve_live(
            made.to_json(),
            load_checkpoint(weights),
            requests=requests,
            compute=compute,
            transport=args.transport,
            workers=pool,
        )
    summary = {
        "bit_exact": run.transfer.bit_exact,
        "max_abs_logit_diff": run.max_abs_logit_diff,
        "median_latency_error": statistics.median(run.latency_errors),
        "violations": list(live_violations(run)),
    }
    if args.json:
        print(json.dumps({**run.transfer.to_dict(), "live": summary}, indent=2))
    else:
        print(format_program_run(run.transfer), "\n", summary)
    return 0 if run.transfer.bit_exact and run.logits_match else 1
