"""The ``validate`` command: a ScalePlan document run for real by the executor (loaded only when
the command runs) beside its predictions."""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from blitzplan._table import format_table
from blitzplan.errors import InvalidInputError

if TYPE_CHECKING:
    from blitzplan.executor.program.runner import ProgramRun

__all__ = ["add_validate_command", "format_program_run", "program_summary"]


_VALIDATE_HELP = "run a ScalePlan document for real (the executor) beside its predictions"
_VALIDATE_EPILOG = """\
Runs a document's transfer program from its JSON alone: one process per device, over torch
(gloo on the CPU, NCCL on GPUs) or nixl (one-sided WRITEs), moving seeded weights of the
document's model (each process makes them alike), every new GPU checked bit-exact, each step's
measured first byte out and last byte in beside the document's. --replan with --at makes the
replan take the running program over at that time. --program NAME (small, large, live) writes a
built-in scenario's document, then runs the file it wrote; live also serves its live pair
(layer times measured on the workers first). Exits 1 when a byte (or a logit) differs.

example:
  blitzplan validate --program small --transport nixl"""


def add_validate_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("validate", help=_VALIDATE_HELP, epilog=_VALIDATE_EPILOG)
    cmd.description = _VALIDATE_HELP[0].upper() + _VALIDATE_HELP[1:] + "."
    cmd.set_defaults(func=_cmd_validate)
    cmd.add_argument("--plan", default=None, help="a ScalePlan JSON document to run")
    cmd.add_argument("--program", default=None, metavar="SCENARIO", help="small, large or live")
    cmd.add_argument("--plan-out", default=None, help="where --program writes its document")
    cmd.add_argument("--replan", default=None, help="a replan document taking over at --at")
    cmd.add_argument("--at", type=float, default=None, help="seconds into the run (--replan)")
    cmd.add_argument("--transport", default="torch", help="torch (default) or nixl")
    cmd.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    cmd.add_argument("--timeout", type=float, default=30.0, help="seconds any transfer may wait")
    cmd.add_argument("--unpaced", action="store_true", help="run every step as fast as it goes")
    cmd.add_argument("--json", action="store_true", help="print the summary as JSON")


def _cmd_validate(args: argparse.Namespace) -> int:
    import tempfile

    import blitzplan.executor  # noqa: F401  (SolverUnavailableError without torch)
    from blitzplan.scale.export import program_json
    from blitzplan.scale.scenarios import scenario_plan

    if bool(args.plan) == bool(args.program):
        raise InvalidInputError("give one of --plan FILE and --program SCENARIO")
    if args.program == "live":
        return _serve_live(args)
    with tempfile.TemporaryDirectory(prefix="blitzplan-") as tmp:
        path = Path(args.plan) if args.plan else Path(args.plan_out or Path(tmp) / "plan.json")
        if args.program:
            _, made = scenario_plan(args.program)
            path.write_text(program_json(made))
        return _run_document(args, path)


def _run_document(args: argparse.Namespace, path: Path) -> int:
    import json

    from blitzplan.executor.program.runner import run_program

    run = run_program(
        path,
        replan=args.replan,
        at_s=args.at,
        transport=args.transport,
        device=args.device,
        timeout_s=args.timeout,
        paced=not args.unpaced,
    )
    if args.json:
        print(json.dumps({"document": str(path), **program_summary(run)}, indent=2))
    else:
        print(f"transfer program of {path} (plan_id {run.plan_id[:12]})\n")
        print(format_program_run(run))
    return 0 if run.bit_exact else 1


def _serve_live(args: argparse.Namespace) -> int:
    """The live scenario: layer times measured on the workers, a plan made with them, its
    program run and its live pair served on the same processes."""
    import json
    import statistics

    from blitzplan.executor.program.runner import prepare
    from blitzplan.executor.runtime.pool import Workers
    from blitzplan.executor.serving.pair_jobs import measured_compute
    from blitzplan.executor.serving.serve import serve_live
    from blitzplan.live.schedule_checks import measured_violations
    from blitzplan.scale.scenarios import scenario_plan

    state, made = scenario_plan("live")
    _, jobs = prepare(made.to_json(), transport=args.transport)
    names = [f"rank{k}" for k in range(len(jobs) + 1)]
    with Workers(names, device=args.device, timeout_s=args.timeout) as pool:
        compute = measured_compute(pool, made.spec, (0, len(jobs)))
        state, made = scenario_plan("live", compute=compute)
        requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}
        run = serve_live(
            made.to_json(),
            requests=requests,
            compute=compute,
            transport=args.transport,
            workers=pool,
        )
    summary = {
        "bit_exact": run.transfer.bit_exact,
        "max_abs_logit_diff": run.max_abs_logit_diff,
        "median_latency_error": statistics.median(run.latency_errors),
        "violations": list(measured_violations(run)),
    }
    if args.json:
        print(json.dumps({**program_summary(run.transfer), "live": summary}, indent=2))
    else:
        print(format_program_run(run.transfer), "\n", summary)
    return 0 if run.transfer.bit_exact and run.logits_match else 1


def _finite(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _spread(errors: Iterable[float]) -> dict[str, float | None]:
    """Median and worst absolute error (None when a time never came)."""
    values = [abs(e) for e in errors]
    if not values or not all(math.isfinite(v) for v in values):
        return {"median": None, "worst": None}
    return {"median": statistics.median(values), "worst": max(values)}


def program_summary(run: ProgramRun) -> dict[str, Any]:
    """A run in plain types for JSON (a time that never came is None)."""
    ready = [m - p for i in run.instances for m, p in zip(i.ready_s, i.predicted_s, strict=True)]
    return {
        "plan_id": run.plan_id,
        "transport": run.transport,
        "plan_s": run.plan_s,
        "wall_s": run.wall_s,
        "processes": len(run.devices),
        "bit_exact": run.bit_exact,
        "moved_bytes": run.moved_bytes,
        "duplicate_bytes": run.duplicate_bytes,
        "errors_s": {
            "start": _spread(run.errors_s("start")),
            "end": _spread(run.errors_s("end")),
            "ready": _spread(ready),
        },
        "steps": [{k: _finite(v) for k, v in vars(s).items()} for s in run.steps],
        "bit_exact_by_gpu": {
            g: list(b) for inst in run.instances for g, b in inst.bit_exact.items()
        },
    }


def _ms(value: float | None) -> str:
    return f"{value * 1e3:.1f}" if value is not None and math.isfinite(value) else "-"


def format_program_run(run: ProgramRun) -> str:
    """Per step predicted vs measured start and end (ms; a replan's steps marked '), per new
    instance its ready time and bit-exactness, then the median and worst errors."""
    times = ("predicted_start_s", "start_s", "predicted_end_s", "end_s")
    rows = [
        [f"{s.id}" + "'" * s.program, s.kind, f"{s.source} -> {s.destination}", s.moved_bytes]
        + [_ms(getattr(s, t)) for t in times]
        for s in run.steps
    ]
    ready = [
        [i.name, " ".join(i.gpus), _ms(max(i.predicted_s)), _ms(max(i.ready_s)), exact]
        for i in run.instances
        for exact in [all(all(b) for b in i.bit_exact.values())]
    ]
    headers = ["step", "kind", "route", "bytes", "start ms", "measured", "end ms", "measured"]
    errors = [
        f"{what:>5} error: median {_ms(e['median'])} ms, worst {_ms(e['worst'])} ms "
        f"(plan {run.plan_s * 1e3:.1f} ms)"
        for what, e in program_summary(run)["errors_s"].items()
    ]
    return "\n".join(
        [
            format_table(headers, rows),
            format_table(["instance", "gpus", "ready ms", "measured", "bit-exact"], ready),
            *errors,
            f"{len(run.devices)} processes over {run.transport}, {run.moved_bytes} bytes moved, "
            f"{run.duplicate_bytes} received twice, bit-exact: {run.bit_exact}",
        ]
    )
